#!/usr/bin/env python3
"""Run mlx_lm command lines (generate, chat, cache_prompt) in one process, as `python -m mlx_lm
<command> <argv>` runs them (each command's own main() with sys.argv set), and record what they did.

  python mlx_lm_cli.py CASES.json
  CASES.json: [{"command": "generate" | "chat" | "cache_prompt", "argv": [...], "stdin": "...",
                "quantize_full_only": false}]

For each case, prints (one JSON list): {"stdout", "error", "runs": [{"prompt": [ids], "tokens":
[ids], "text": "..."}]}: every stream_generate call (the prompt ids it got, the tokens it yielded
and their text), captured by wrapping mlx_lm.generate.stream_generate; nothing else is changed.

quantize_full_only: mlx_lm's maybe_quantize_kv_cache converts every cache with to_quantized, and
RotatingKVCache.to_quantized raises NotImplementedError, so --kv-bits fails on Gemma 4 once
--quantized-kv-start is reached. With this set, the RotatingKVCache layers are skipped (they stay
bf16) and the KVCache layers convert as mlx_lm converts them: the reference for mlx-bun's --kv-bits.
"""

import contextlib
import importlib
import io
import json
import sys
import traceback


def main() -> int:
    cases = json.load(open(sys.argv[1]))
    # (mlx_lm's package exports a function named generate: reach the modules through importlib.)
    gen = importlib.import_module("mlx_lm.generate")
    chat_mod = importlib.import_module("mlx_lm.chat")
    from mlx_lm.models.cache import RotatingKVCache

    original_stream = gen.stream_generate
    original_quantize = gen.maybe_quantize_kv_cache
    runs = []

    def recording_stream(model, tokenizer, prompt, *args, **kwargs):
        ids = prompt.tolist() if hasattr(prompt, "tolist") else list(prompt)
        run = {"prompt": [int(x) for x in ids], "tokens": [], "text": ""}
        runs.append(run)
        for r in original_stream(model, tokenizer, prompt, *args, **kwargs):
            run["tokens"].append(int(r.token))
            run["text"] += r.text
            yield r

    def quantize_full_only(prompt_cache, quantized_kv_start, kv_group_size, kv_bits):
        if kv_bits is None:
            return
        for e, c in enumerate(prompt_cache):
            if isinstance(c, RotatingKVCache):
                continue
            if hasattr(c, "to_quantized") and c.offset >= quantized_kv_start:
                prompt_cache[e] = c.to_quantized(group_size=kv_group_size, bits=kv_bits)

    gen.stream_generate = recording_stream
    chat_mod.stream_generate = recording_stream
    out = []
    for c in cases:
        runs.clear()
        gen.maybe_quantize_kv_cache = quantize_full_only if c.get("quantize_full_only") else original_quantize
        module = importlib.import_module(f"mlx_lm.{c['command']}")
        sys.argv = [f"mlx_lm.{c['command']}", *c["argv"]]
        stdout = io.StringIO()
        old_stdin = sys.stdin
        sys.stdin = io.StringIO(c.get("stdin", ""))
        error = None
        try:
            with contextlib.redirect_stdout(stdout):
                module.main()
        except SystemExit as e:
            if e.code not in (0, None):
                error = f"SystemExit({e.code})"
        except BaseException as e:  # noqa: BLE001 - the case's error is the result
            error = f"{type(e).__name__}: {e}"
            if c.get("traceback"):
                error += "\n" + traceback.format_exc()
        finally:
            sys.stdin = old_stdin
        out.append({"stdout": stdout.getvalue(), "error": error, "runs": [dict(r) for r in runs]})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

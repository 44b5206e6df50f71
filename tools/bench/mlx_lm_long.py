"""mlx-lm side of tools/bench/long-context.ts: long prompts with the bf16 KV cache, in one process.

Driven over stdin/stdout, one JSON object per line each way (as mlx_lm_bench.py --serve): the
first line printed is {"ready": true, ...}; each command gets one line {"ok": true, ...} or
{"ok": false, "error": "..."}. Token ids come from long-context.ts, so both sides run the same prompt.

  python mlx_lm_long.py --serve              # driven by long-context.ts
  python mlx_lm_long.py --model DIR [--n 4096] [--decode 8]   # standalone smoke test

Commands:
  load {model}            mlx_lm.load; answers load seconds and active memory (the weights)
  run  {prompt, n}        MLX peak reset, then generate_step (greedy, prefill_step_size 2048 as
                          mlx-lm's default) for n tokens: ttft_s (prompt in, first token read),
                          decode_s (first token to last), tokens, peak_bytes (MLX peak of the run)
  quit
"""
from __future__ import annotations

import json
import sys
import time
import traceback

import mlx.core as mx

state: dict = {}


def _load(model: str) -> dict:
    from mlx_lm import load

    t = time.perf_counter()
    m, tok = load(model)
    mx.eval(m.parameters())
    state.update(model=m, tokenizer=tok)
    return {"load_s": time.perf_counter() - t, "active_bytes": mx.get_active_memory(), "device": str(mx.default_device()),
            "mlx": mx.__version__}


def _run(prompt: list[int], n: int) -> dict:
    from mlx_lm.generate import generate_step

    mx.clear_cache()
    mx.reset_peak_memory()
    t0 = time.perf_counter()
    t_first = None
    toks = []
    for y, _ in generate_step(mx.array(prompt), state["model"], max_tokens=n):
        toks.append(int(y))
        if t_first is None:
            t_first = time.perf_counter()
    t_end = time.perf_counter()
    peak = mx.get_peak_memory()
    mx.clear_cache()
    return {"ttft_s": t_first - t0, "decode_s": t_end - t_first, "tokens": toks, "peak_bytes": peak,
            "active_bytes": mx.get_active_memory()}


def serve() -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # mlx-lm's own prints stay off the protocol channel
    out.write(json.dumps({"ready": True, "mlx": mx.__version__, "device": str(mx.default_device())}) + "\n")
    out.flush()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        req = json.loads(line)
        if req.get("cmd") == "quit":
            break
        try:
            if req["cmd"] == "load":
                res = _load(req["model"])
            elif req["cmd"] == "run":
                res = _run(req["prompt"], int(req["n"]))
            else:
                raise ValueError(f"unknown command {req['cmd']!r}")
            res = {"ok": True, **res}
        except Exception as e:  # noqa: BLE001 - reported to the driver
            res = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        out.write(json.dumps(res) + "\n")
        out.flush()


def main() -> None:
    if "--serve" in sys.argv:
        serve()
        return
    a = sys.argv
    model = a[a.index("--model") + 1]
    n = int(a[a.index("--n") + 1]) if "--n" in a else 4096
    d = int(a[a.index("--decode") + 1]) if "--decode" in a else 8
    print(_load(model))
    r = _run([2] + [280 + (i * 37) % 1000 for i in range(n - 1)], d)
    print({k: v for k, v in r.items() if k != "tokens"}, "tokens", r["tokens"])


if __name__ == "__main__":
    main()

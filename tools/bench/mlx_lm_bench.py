"""Python twin of tools/bench/compare.ts (and of the other benches through twin.ts: speculative.ts,
long-context.ts, device/qmv-decode.ts): the mlx-lm side of each measurement, in one process.

Driven over stdin/stdout, one JSON object per line each way (like op_overhead.py --serve):
the bench sends {"cmd": ..., ...}; the twin answers one line {"ok": true, ...} or
{"ok": false, "error": "..."}. The first line it prints is {"ready": true, ...}.

  python mlx_lm_bench.py --serve            # driven by a bench (twin.ts)
  python mlx_lm_bench.py --model DIR        # standalone smoke test: decode 16 tokens

Commands (token ids always come from the driving bench, so both sides run the same prompts):
  load      {model}                     mlx_lm.load: load_s, active_bytes (the weights), device, mlx
  decode    {prompt, n}                 generate_step, greedy: ttft, decode seconds, tokens
  load_draft {model}                    mlx_lm.load of a draft model for spec_decode
  spec_decode {prompt, n, k}            speculative_generate_step, greedy, k draft tokens per round:
                                        ttft, decode seconds, tokens, from_draft flags
  long      {prompt, n}                 long-context.ts's mlx-lm row: MLX peak reset, then generate_step
                                        (greedy, prefill_step_size mlx-lm's default 2048) for n tokens:
                                        ttft_s (prompt in, first token read), decode_s (first token to
                                        last), tokens, peak_bytes (MLX peak of the run), active_bytes
  prefill   {prompt}                    generate_step with max_tokens=1: seconds to the first token
  steps     {prompt, n}                 unpipelined decode: graph-build and eval seconds per step
  kv        {n}                         KV bytes held after prefilling n tokens, per cache mode
  bandwidth {mb, reps}                  GB/s of x + 1 over an mb-MiB float32 array (read + write)
  peak      {reset}                     MLX peak / active memory of this process
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
    state.update(model=m, tokenizer=tok, path=model)
    return {"load_s": time.perf_counter() - t, "active_bytes": mx.get_active_memory(), "device": str(mx.default_device()),
            "mlx": mx.__version__}


def _decode(prompt: list[int], n: int) -> dict:
    from mlx_lm.generate import generate_step

    m = state["model"]
    t0 = time.perf_counter()
    t_first = None
    toks = []
    for y, _ in generate_step(mx.array(prompt), m, max_tokens=n):
        toks.append(int(y))
        if t_first is None:
            t_first = time.perf_counter()
    t_end = time.perf_counter()
    return {"ttft_s": t_first - t0, "decode_s": t_end - t_first, "tokens": toks}


def _long(prompt: list[int], n: int) -> dict:
    """A long prompt with the bf16 cache: _decode's loop with the MLX peak of the run around it."""
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


def _load_draft(model: str) -> dict:
    from mlx_lm import load

    m, _ = load(model)
    mx.eval(m.parameters())
    state.update(draft=m)
    return {"active_bytes": mx.get_active_memory()}


def _spec_decode(prompt: list[int], n: int, k: int) -> dict:
    from mlx_lm.generate import speculative_generate_step

    t0 = time.perf_counter()
    t_first = None
    toks, from_draft = [], []
    for y, _, fd in speculative_generate_step(mx.array(prompt), state["model"], state["draft"], num_draft_tokens=k, max_tokens=n):
        toks.append(int(y))
        from_draft.append(bool(fd))
        if t_first is None:
            t_first = time.perf_counter()
    t_end = time.perf_counter()
    return {"ttft_s": t_first - t0, "decode_s": t_end - t_first, "tokens": toks, "from_draft": from_draft}


def _prefill(prompt: list[int]) -> dict:
    from mlx_lm.generate import generate_step

    m = state["model"]
    t0 = time.perf_counter()
    gen = generate_step(mx.array(prompt), m, max_tokens=1)
    y, _ = next(gen)
    t = time.perf_counter() - t0
    gen.close()
    return {"seconds": t, "token": int(y)}


def _steps(prompt: list[int], n: int) -> dict:
    """Unpipelined decode: time to build each step's graph (host) and to evaluate it."""
    from mlx_lm.models.cache import make_prompt_cache

    m = state["model"]
    cache = make_prompt_cache(m)
    logits = m(mx.array(prompt)[None], cache=cache)
    y = mx.argmax(logits[:, -1, :], axis=-1)
    mx.eval(y)
    build = 0.0
    ev = 0.0
    for _ in range(n):
        t0 = time.perf_counter()
        logits = m(y[None], cache=cache)
        lg = logits[:, -1, :]
        lp = lg - mx.logsumexp(lg, keepdims=True)
        y = mx.argmax(lp, axis=-1)
        t1 = time.perf_counter()
        mx.eval(y, lp)
        t2 = time.perf_counter()
        build += t1 - t0
        ev += t2 - t1
    del cache
    return {"build_s": build / n, "eval_s": ev / n}


def _cache_bytes(cache) -> int:
    total = 0
    for c in cache:
        try:
            total += int(c.nbytes)
        except Exception:  # noqa: BLE001 - a cache class without nbytes
            pass
    return total


def _kv(n: int) -> dict:
    """Bytes the caches hold after prefilling n tokens (chunks of 2048 as generate_step)."""
    from mlx_lm.models.cache import make_prompt_cache

    m = state["model"]
    ids = mx.array(state.get("kv_prompt") or [2] + [280 + (i * 37) % 232 for i in range(n - 1)])
    out = {}
    cache = make_prompt_cache(m)
    for i in range(0, n, 2048):
        m(ids[i : i + 2048][None], cache=cache)
        mx.eval([c.state for c in cache])
    out["bf16"] = {"bytes": _cache_bytes(cache), "tokens": n, "caches": [type(c).__name__ for c in cache]}
    for bits in (8, 4):
        try:
            q = [c.to_quantized(group_size=64, bits=bits) for c in cache]
            mx.eval([c.state for c in q])
            out[f"q{bits}"] = {"bytes": _cache_bytes(q), "tokens": n}
        except Exception as e:  # noqa: BLE001 - mlx-lm has no quantized rotating cache
            out[f"q{bits}"] = {"error": f"{type(e).__name__}: {e}"}
    del cache
    return out


def _bandwidth(mb: int, reps: int) -> dict:
    x = mx.random.uniform(shape=(mb * 1024 * 1024 // 4,))
    mx.eval(x)
    mx.eval(x + 1)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        mx.eval(x + 1)
        ts.append(time.perf_counter() - t)
    del x
    mx.clear_cache()
    b = 2 * mb * 1024 * 1024
    return {"gbps": [b / t / 1e9 for t in ts]}


def _peak(reset: bool) -> dict:
    r = {"peak_bytes": mx.get_peak_memory(), "active_bytes": mx.get_active_memory()}
    if reset:
        mx.reset_peak_memory()
    return r


def handle(req: dict) -> dict:
    cmd = req["cmd"]
    if cmd == "load":
        return _load(req["model"])
    if cmd == "decode":
        return _decode(req["prompt"], int(req["n"]))
    if cmd == "long":
        return _long(req["prompt"], int(req["n"]))
    if cmd == "load_draft":
        return _load_draft(req["model"])
    if cmd == "spec_decode":
        return _spec_decode(req["prompt"], int(req["n"]), int(req["k"]))
    if cmd == "prefill":
        return _prefill(req["prompt"])
    if cmd == "steps":
        return _steps(req["prompt"], int(req["n"]))
    if cmd == "kv":
        state["kv_prompt"] = req.get("prompt")
        return _kv(int(req["n"]))
    if cmd == "bandwidth":
        return _bandwidth(int(req["mb"]), int(req.get("reps", 5)))
    if cmd == "peak":
        return _peak(bool(req.get("reset")))
    if cmd == "clear":
        mx.clear_cache()
        return {}
    raise ValueError(f"unknown command {cmd!r}")


def serve() -> None:
    out = sys.stdout
    # Keep mlx-lm's own prints off the protocol channel.
    sys.stdout = sys.stderr
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
            res = {"ok": True, **handle(req)}
        except Exception as e:  # noqa: BLE001 - reported to the driver
            res = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        out.write(json.dumps(res) + "\n")
        out.flush()


def main() -> None:
    if "--serve" in sys.argv:
        serve()
        return
    model = sys.argv[sys.argv.index("--model") + 1]
    print(_load(model))
    print(_decode([2, 5, 351, 349, 412, 280], 16))
    print(_peak(False))


if __name__ == "__main__":
    main()

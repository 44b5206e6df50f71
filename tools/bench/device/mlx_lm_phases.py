"""mlx-lm's decode loop (generate_step's pipelining, on its generation stream) timed per phase, the
twin of the per-phase line of tools/bench/decode-profile.ts: graph build, the mx.async_eval call
itself, and the wait in y.item(). Milliseconds per token.
   python tools/bench/device/mlx_lm_phases.py MODEL_DIR [TOKENS]"""
import sys
import time

import mlx.core as mx
from mlx_lm.utils import load_model

model, _ = load_model(__import__("pathlib").Path(sys.argv[1]))
n = int(sys.argv[2]) if len(sys.argv) > 2 else 128
prompt = mx.array([[5 + (i * 37) % 200 for i in range(65)]])
for use_stream in (True, False):
    for rep in range(2):
        cache = model.make_cache()
        stream = mx.new_stream(mx.default_device()) if use_stream else mx.default_stream(mx.default_device())

        def step(y):
            with mx.stream(stream):
                logits = model(y, cache=cache)[:, -1, :]
                logprobs = logits - mx.logsumexp(logits, keepdims=True)
                return mx.argmax(logprobs, axis=-1), logprobs

        y, lp = step(prompt)
        mx.async_eval(y, lp)
        b = a = w = 0.0
        t_all = time.perf_counter()
        for _ in range(n):
            t0 = time.perf_counter()
            ny, nlp = step(y[None])
            t1 = time.perf_counter()
            mx.async_eval(ny, nlp)
            t2 = time.perf_counter()
            y.item()
            t3 = time.perf_counter()
            b, a, w = b + t1 - t0, a + t2 - t1, w + t3 - t2
            y, lp = ny, nlp
        y.item()
        total = (time.perf_counter() - t_all) * 1000 / n
        if rep == 1:
            print(f"mlx-lm loop ({'generation stream' if use_stream else 'default stream'}): {total:.2f} ms/token; "
                  f"build {b * 1000 / n:.2f}, async_eval call {a * 1000 / n:.2f}, wait in item() {w * 1000 / n:.2f}")

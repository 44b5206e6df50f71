"""Reference logits and greedy tokens of mlx-lm's Gemma 4 on a checkpoint, for the model tests.

Usage: python gemma4_logits.py DIR OUT.safetensors --ids 1,2,3 [--steps 50] [--kv bf16|q8|q4] [--chunk N]

Prefills the prompt ids (in chunks of --chunk tokens, default all at once) with the caches of
model.make_cache() (q8/q4: full-attention KVCache replaced by QuantizedKVCache(64, bits) from the
start), then decodes --steps tokens greedily. Saves "logits" [steps + 1, vocab] (the model's
output dtype: the last prompt position, then one row per decode step) and "tokens" [steps].
"""
import argparse

import mlx.core as mx
from mlx_lm.models.cache import KVCache, QuantizedKVCache
from mlx_lm.utils import load_model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("out")
    p.add_argument("--ids", required=True)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--kv", default="bf16")
    p.add_argument("--chunk", type=int, default=0)
    a = p.parse_args()
    from pathlib import Path

    model, _ = load_model(Path(a.dir))
    ids = [int(x) for x in a.ids.split(",")]
    cache = model.make_cache()
    if a.kv in ("q8", "q4"):
        bits = 8 if a.kv == "q8" else 4
        cache = [QuantizedKVCache(group_size=64, bits=bits) if type(c) is KVCache else c for c in cache]
    chunk = a.chunk or len(ids)
    rows = []
    logits = None
    for s in range(0, len(ids), chunk):
        logits = model(mx.array([ids[s : s + chunk]]), cache=cache)
        mx.eval(logits)
    rows.append(logits[0, -1])
    tokens = []
    for _ in range(a.steps):
        tok = mx.argmax(logits[0, -1], axis=-1).item()
        tokens.append(tok)
        logits = model(mx.array([[tok]]), cache=cache)
        mx.eval(logits)
        rows.append(logits[0, -1])
    out = {"logits": mx.stack(rows[: a.steps + 1]), "tokens": mx.array(tokens, dtype=mx.int32)}
    mx.eval(out)
    mx.save_safetensors(a.out, out)


if __name__ == "__main__":
    main()

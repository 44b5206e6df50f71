"""Reference side of the KV-cache tests: replays a script of cache operations on mlx-lm's caches.

Usage: python cache_oracle.py SCRIPT.json INPUTS.safetensors OUT.safetensors

SCRIPT: {"kind": "KVCache" | "RotatingKVCache" | "QuantizedKVCache", "args": {...},
         "scale": float, "steps": [{"k": name, "v": name, "q": name?, "window": int?} | {"trim": n}]}
For update step i the mask is made first (as a model does, before the update),
then update_and_fetch, then attention if "q" is given. Outputs per step:
"<i>.k"/"<i>.v" (quantized: "<i>.k.0".."<i>.k.2"), "<i>.mask" when it is an
array, "<i>.attn"; metadata "<i>.offset", "<i>.mask" (none | causal | array),
"<i>.trimmed".
"""
import json
import sys

import mlx.core as mx
from mlx_lm.models import cache as C
from mlx_lm.models.base import scaled_dot_product_attention


def main() -> None:
    script_path, inputs_path, out_path = sys.argv[1:4]
    with open(script_path) as f:
        script = json.load(f)
    inputs = mx.load(inputs_path)
    cache = getattr(C, script["kind"])(**script.get("args", {}))
    scale = script.get("scale", 1.0)
    out, meta = {}, {}
    for i, step in enumerate(script["steps"]):
        if "trim" in step:
            meta[f"{i}.trimmed"] = str(cache.trim(step["trim"]))
            meta[f"{i}.offset"] = str(cache.offset)
            continue
        k, v = inputs[step["k"]], inputs[step["v"]]
        n = k.shape[2]
        if script["kind"] == "RotatingKVCache":
            mask = cache.make_mask(n, window_size=step.get("window"))
        else:
            mask = cache.make_mask(n, window_size=step.get("window"), return_array=False)
        keys, values = cache.update_and_fetch(k, v)
        # Later writes (`self.keys[...] = x`) overwrite the returned array objects in place:
        # record copies, evaluated now.
        copy = lambda t: mx.contiguous(t)  # noqa: E731
        keys = tuple(map(copy, keys)) if isinstance(keys, (tuple, list)) else copy(keys)
        values = tuple(map(copy, values)) if isinstance(values, (tuple, list)) else copy(values)
        mx.eval(keys, values)
        if isinstance(mask, str):
            meta[f"{i}.mask"] = mask
        elif mask is None:
            meta[f"{i}.mask"] = "none"
        else:
            meta[f"{i}.mask"] = "array"
            out[f"{i}.mask"] = mask
        if isinstance(keys, (tuple, list)):
            for j, t in enumerate(keys):
                out[f"{i}.k.{j}"] = t
            for j, t in enumerate(values):
                out[f"{i}.v.{j}"] = t
        else:
            out[f"{i}.k"] = keys
            out[f"{i}.v"] = values
        if "q" in step:
            out[f"{i}.attn"] = scaled_dot_product_attention(inputs[step["q"]], keys, values, cache, scale=scale, mask=mask)
        meta[f"{i}.offset"] = str(cache.offset)
    mx.eval(list(out.values()))
    mx.save_safetensors(out_path, {k: mx.contiguous(v) for k, v in out.items()}, metadata=meta)


if __name__ == "__main__":
    main()

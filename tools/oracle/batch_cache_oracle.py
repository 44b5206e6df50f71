"""Reference side of the batched KV-cache tests: replays scripts on mlx-lm's BatchKVCache / BatchRotatingKVCache.

Usage: python batch_cache_oracle.py SCRIPT.json INPUTS.safetensors OUT.safetensors

SCRIPT: {"scale": float,
         "scenarios": {NAME: {
             "kind": "BatchKVCache" | "BatchRotatingKVCache",
             "args": {"left_padding": [...], "max_size": n?},
             "quantize": {"bits": b, "group_size": g}?,
             "caches": {CNAME: {"kind": "KVCache" | "RotatingKVCache" | "BatchKVCache" | "BatchRotatingKVCache",
                                "args": {...}, "steps": [...]}},
             "steps": [STEP, ...]}}}

STEP (main cache):
  {"k": name, "v": name, "q": name?, "window": int?}   make_mask(n, window_size=window), update_and_fetch, attention
  {"trim": n}                                           trim; records "<i>.trimmed"
  {"prepare": {"left_padding"?, "lengths"?, "right_padding"?}}
  {"finalize": true}
  {"filter": [rows]}
  {"extend": CNAME}                                     extend with a batch cache built from "caches"
  {"merge": [CNAME, ...]}                               replace the main cache by Kind.merge(single caches)
  {"extract": row}                                      records "<i>.x.k"/"<i>.x.v" (quantized: ".x.k.0".."), "<i>.x.offset"
Aux caches in "caches" replay only updates, trims, prepare and finalize.

Recorded per step i of scenario NAME (keys "NAME/<i>..."): fetched planes "<i>.k", "<i>.v" (with
"quantize": mx.quantize of mlx-lm's fetched K/V, "<i>.k.0".."<i>.v.2", with zero-filled tokens
(padding zeros, growth zeros) stored as zero planes, which is what a layout over a codec stores),
"<i>.mask" (always an array here), "<i>.attn" (fast SDPA, or mlx-lm's quantized SDPA), and after
every step "<i>.offsets" (int32 [B]), "<i>.lp" (left padding), metadata "<i>.idx", "<i>.offset"
(BatchRotatingKVCache: _offset; BatchKVCache: _idx), "<i>.rotated".

Later writes (`self.keys[...] = x`) overwrite returned arrays in place: everything is recorded as
evaluated mx.contiguous copies at the step.
"""
import json
import sys

import mlx.core as mx
from mlx_lm.models import cache as C
from mlx_lm.models.base import quantized_scaled_dot_product_attention


def snap(t):
    t = mx.contiguous(t)
    mx.eval(t)
    return t


def quantize_planes(t, q):
    """mx.quantize per token; tokens that are all zeros (padding / growth fill) become zero planes."""
    zero = mx.all(t == 0, axis=-1, keepdims=True)
    w, s, b = mx.quantize(t, group_size=q["group_size"], bits=q["bits"])
    return [snap(mx.where(zero, mx.zeros_like(p), p)) for p in (w, s, b)]


def make(kind, args):
    return getattr(C, kind)(**args)


def replay_aux(spec, inputs):
    c = make(spec["kind"], spec.get("args", {}))
    for step in spec.get("steps", []):
        if "trim" in step:
            c.trim(step["trim"])
        elif "prepare" in step:
            c.prepare(**step["prepare"])
        elif "finalize" in step:
            c.finalize()
        else:
            c.update_and_fetch(inputs[step["k"]], inputs[step["v"]])
    return c


def run(name, sc, inputs, scale, out, meta):
    kind = sc["kind"]
    cls = getattr(C, kind)
    q = sc.get("quantize")
    aux = {n: replay_aux(s, inputs) for n, s in sc.get("caches", {}).items()}
    cache = cls(**sc.get("args", {})) if "args" in sc else None
    pre = f"{name}/"
    for i, step in enumerate(sc["steps"]):
        p = f"{pre}{i}."
        if "trim" in step:
            meta[p + "trimmed"] = str(cache.trim(step["trim"]))
        elif "prepare" in step:
            cache.prepare(**step["prepare"])
        elif "finalize" in step:
            cache.finalize()
        elif "filter" in step:
            cache.filter(step["filter"])
        elif "extend" in step:
            cache.extend(aux[step["extend"]])
        elif "merge" in step:
            cache = cls.merge([aux[n] for n in step["merge"]])
        elif "extract" in step:
            x = cache.extract(step["extract"])
            if x.keys is not None:
                if q:
                    for j, t in enumerate(quantize_planes(x.keys, q)):
                        out[p + f"x.k.{j}"] = t
                    for j, t in enumerate(quantize_planes(x.values, q)):
                        out[p + f"x.v.{j}"] = t
                else:
                    out[p + "x.k"] = snap(x.keys)
                    out[p + "x.v"] = snap(x.values)
            meta[p + "x.offset"] = str(x.offset)
            meta[p + "x.idx"] = str(getattr(x, "_idx", x.offset))
        else:
            k, v = inputs[step["k"]], inputs[step["v"]]
            n = k.shape[2]
            mask = cache.make_mask(n, window_size=step.get("window"))
            keys, values = cache.update_and_fetch(k, v)
            keys, values = snap(keys), snap(values)
            if mask is None:
                meta[p + "mask"] = "none"
            elif isinstance(mask, str):
                meta[p + "mask"] = mask
            else:
                meta[p + "mask"] = "array"
                out[p + "mask"] = snap(mask)
            if q:
                qk, qv = quantize_planes(keys, q), quantize_planes(values, q)
                for j, t in enumerate(qk):
                    out[p + f"k.{j}"] = t
                for j, t in enumerate(qv):
                    out[p + f"v.{j}"] = t
                if "q" in step:
                    out[p + "attn"] = snap(
                        quantized_scaled_dot_product_attention(
                            # it scales its queries in place (`queries *= scale`): hand it a copy
                            mx.array(inputs[step["q"]]), qk, qv, scale=scale, mask=mask, group_size=q["group_size"], bits=q["bits"]
                        )
                    )
            else:
                out[p + "k"] = keys
                out[p + "v"] = values
                if "q" in step:
                    out[p + "attn"] = snap(mx.fast.scaled_dot_product_attention(inputs[step["q"]], keys, values, scale=scale, mask=mask))
        out[p + "offsets"] = snap(cache.offset.astype(mx.int32))
        out[p + "lp"] = snap(cache.left_padding.astype(mx.int32))
        meta[p + "idx"] = str(cache._idx)
        meta[p + "offset"] = str(cache._offset if kind == "BatchRotatingKVCache" else cache._idx)
        meta[p + "rotated"] = str(int(getattr(cache, "rotated", False)))


def main() -> None:
    script_path, inputs_path, out_path = sys.argv[1:4]
    with open(script_path) as f:
        script = json.load(f)
    inputs = mx.load(inputs_path)
    scale = script.get("scale", 1.0)
    out, meta = {}, {}
    for name, sc in script["scenarios"].items():
        run(name, sc, inputs, scale, out, meta)
    mx.save_safetensors(out_path, out, metadata=meta)


if __name__ == "__main__":
    main()

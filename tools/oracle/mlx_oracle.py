"""Reference side of the op tests: evaluates Python MLX expressions on given inputs.

Usage: python mlx_oracle.py CASES.json INPUTS.safetensors OUT.safetensors

CASES.json maps a case id to a Python expression over `mx` (mlx.core), `np`
(numpy) and the input arrays by name. An expression that yields a tuple or
list stores each element as "<id>.<i>". An expression that raises stores its
message under the metadata key "error:<id>". float64 results travel as uint64
bits with the metadata key "dtype:<id>" = "float64".
"""
import json
import sys

import mlx.core as mx
import numpy as np


def main() -> None:
    cases_path, inputs_path, out_path = sys.argv[1:4]
    with open(cases_path) as f:
        cases = json.load(f)
    inputs = mx.load(inputs_path) if inputs_path != "-" else {}
    env = {"mx": mx, "np": np, **inputs}
    out, meta = {}, {}
    for cid, expr in cases.items():
        try:
            value = eval(expr, env)  # noqa: S307 - test oracle, expressions come from our tests
        except Exception as e:  # noqa: BLE001
            meta[f"error:{cid}"] = f"{type(e).__name__}: {e}"
            continue
        if isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                out[f"{cid}.{i}"] = mx.array(v)
        else:
            out[cid] = mx.array(value)
    # safetensors has no float64 in MLX: ship the bits as uint64 and say so.
    for k in list(out):
        if out[k].dtype == mx.float64:
            out[k] = out[k].view(mx.uint64)
            meta[f"dtype:{k}"] = "float64"
    mx.eval(list(out.values()))
    mx.save_safetensors(out_path, out, metadata=meta)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Derive a speculative-decoding draft from a Gemma 4 benchmark checkpoint: its first N layers.

The draft keeps the target's embedding, tied lm_head, final norm and tokenizer, and layers
0..N-1 with their weights unchanged (N at most the number of layers that own a KV cache, so no
kept layer shares KV); the per-layer-input tables (embed_tokens_per_layer, columns laid out
layer-major, and per_layer_model_projection, rows layer-major) keep the first N layers' slices.
Both models then read the same residual stream for N layers, which is what makes the draft
agree with the target often enough to show the mechanism on random weights
(tools/bench/speculative.ts reports the acceptance rate it gets).

Quantized tensors are sliced in packed form: a per-layer slice is whole quantization groups as
long as hidden_size_per_layer_input is a multiple of the group size (checked).

  python make_draft_model.py --target .native/bench-models/gemma4-mini-4bit --layers 5 \
      --out .native/bench-models/gemma4-mini-4bit-draft5
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx


def make(target: Path, out: Path, layers: int) -> Path:
    cfg = json.loads((target / "config.json").read_text())
    tc = cfg.get("text_config", cfg)
    L = tc["num_hidden_layers"]
    owning = L - (tc.get("num_kv_shared_layers") or 0)
    if not 1 <= layers <= owning:
        raise SystemExit(f"make_draft_model: --layers must be in 1..{owning} (the target's layers that own a KV cache), got {layers}")
    types = tc.get("layer_types") or []
    if types and types[layers - 1] != "full_attention":
        # mlx-lm forces a model's last layer to full attention; a kept sliding layer would then
        # differ between the two loaders (and its weights have the sliding head size).
        fulls = [i + 1 for i, t in enumerate(types[:owning]) if t == "full_attention"]
        raise SystemExit(f"make_draft_model: the draft's last layer must be a full-attention layer: --layers one of {fulls}")
    hpl = tc.get("hidden_size_per_layer_input") or 0
    q = cfg.get("quantization") or {}
    if hpl and q and hpl % q["group_size"]:
        raise SystemExit(f"make_draft_model: hidden_size_per_layer_input {hpl} is not a multiple of the quantization group {q['group_size']}")

    files = sorted({*json.loads((target / "model.safetensors.index.json").read_text())["weight_map"].values()}) \
        if (target / "model.safetensors.index.json").exists() else ["model.safetensors"]
    weights: dict[str, mx.array] = {}
    for f in files:
        weights.update(mx.load(str(target / f)))
    kept: dict[str, mx.array] = {}
    for k, v in weights.items():
        if ".layers." in k:
            i = int(k.split(".layers.")[1].split(".")[0])
            if i >= layers:
                continue
        elif "embed_tokens_per_layer." in k:
            v = v[:, : v.shape[1] * layers // L]  # [vocab, L * hpl] (packed or groups), layer-major
        elif "per_layer_model_projection." in k:
            v = v[: v.shape[0] * layers // L]  # rows [L * hpl], layer-major
        kept[k] = v
    mx.eval(list(kept.values()))

    tc["num_hidden_layers"] = layers
    tc["num_kv_shared_layers"] = 0
    if tc.get("layer_types"):
        tc["layer_types"] = tc["layer_types"][:layers]

    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for p in target.iterdir():
        if p.is_file() and not p.name.startswith("model.safetensors") and p.name not in ("config.json", ".mlxb-stamp"):
            shutil.copy(p, tmp / p.name)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=4) + "\n")
    mx.save_safetensors(str(tmp / "model.safetensors"), kept, metadata={"format": "mlx"})
    total = sum(v.nbytes for v in kept.values())
    (tmp / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": {k: "model.safetensors" for k in sorted(kept)}}, indent=4) + "\n")
    (tmp / "draft-model.json").write_text(json.dumps({"target": str(target), "layers": layers}, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=5, help="layers kept (default 5: up to the first full-attention layer of the bench models)")
    a = ap.parse_args(argv)
    print(make(a.target, a.out, a.layers))
    return 0


if __name__ == "__main__":
    sys.exit(main())

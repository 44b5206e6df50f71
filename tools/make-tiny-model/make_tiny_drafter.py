#!/usr/bin/env python3
"""Write a seeded, random-weight Gemma 4 MTP drafter ("assistant", model_type gemma4_assistant) for a
tiny target checkpoint, built with mlx-vlm 0.7.10's own modules (Gemma4AssistantDraftModel), in the
layout mlx-vlm's load_drafter reads: config.json (model_type, backbone_hidden_size, block_size,
use_ordered_embeddings, text_config, quantization when --quant) and model.safetensors.

The drafter's text_config copies what its attention must match from the target: head_dim,
global_head_dim, KV heads, sliding_window, rope_parameters, vocab_size; its own width is small.

  --ordered    the centroid-routed head of the E2B/E4B drafters (masked_embedding.*)
  --untied     its own lm_head
  --echo       weights that make every draft the target's own prediction at the drafter's position
               (pre_projection = [0 | I], zero attention/MLP outputs, post_projection = I, the
               target's embeddings): random targets fall into repeats, so its drafts get accepted
               (full-acceptance rounds), unlike a random drafter's
  --quant 4bit mlx.nn.quantize (group 32) of the drafter's linear layers, as mlx-vlm's convert
  --dtype      the weights' dtype (float32 default; bfloat16 for benchmarks)
  --no-vlm     write the same tensors (names, shapes) with plain MLX instead of mlx-vlm's modules
               (other random values): what happens anyway when mlx_vlm does not import (the GPU
               machine has mlx and mlx-lm only; tools/bench/device/mtp-h200.sh); not with --ordered

  python tools/make-tiny-model/make_tiny_drafter.py --target /tmp/tiny --out /tmp/tiny-mtp [--ordered] [--echo]
"""
import argparse
import json
import shutil
import sys
from pathlib import Path

import math

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten


def plain_params(cfg: dict, dtype) -> dict:
    """The parameters of mlx-vlm's Gemma4AssistantDraftModel (not the centroid head) by name, drawn
    as its modules draw them (Linear uniform ±1/sqrt(in), Embedding normal·sqrt(1/dim), norms and
    layer scalars 1), without mlx-vlm."""
    t = cfg["text_config"]
    H, H_t, V, inter = t["hidden_size"], cfg["backbone_hidden_size"], t["vocab_size"], t["intermediate_size"]

    def lin(o, i):
        s = 1 / math.sqrt(i)
        return mx.random.uniform(-s, s, (o, i), dtype=dtype)

    p = {"model.embed_tokens.weight": mx.random.normal((V, H), dtype=dtype) * math.sqrt(1 / H), "model.norm.weight": mx.ones((H,), dtype)}
    for i, ty in enumerate(t["layer_types"]):
        hd = t["global_head_dim"] if ty == "full_attention" and t.get("global_head_dim") else t["head_dim"]
        q = t["num_attention_heads"] * hd
        L = f"model.layers.{i}."
        p |= {
            L + "self_attn.q_proj.weight": lin(q, H),
            L + "self_attn.o_proj.weight": lin(H, q),
            L + "self_attn.q_norm.weight": mx.ones((hd,), dtype),
            L + "mlp.gate_proj.weight": lin(inter, H),
            L + "mlp.up_proj.weight": lin(inter, H),
            L + "mlp.down_proj.weight": lin(H, inter),
            L + "layer_scalar": mx.ones((1,), dtype),
        }
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"):
            p[L + n + ".weight"] = mx.ones((H,), dtype)
    p["pre_projection.weight"] = lin(H, 2 * H_t)
    p["post_projection.weight"] = lin(H_t, H)
    if not cfg["tie_word_embeddings"]:
        p["lm_head.weight"] = lin(V, H)
    return p


def target_embed(target: Path):
    from mlx_lm.utils import load_model

    model, _ = load_model(target)
    lm = getattr(model, "language_model", model)
    e = lm.model.embed_tokens
    # A lookup of every id: the rows dequantized when the target is quantized.
    return e(mx.arange(e.weight.shape[0]))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--ordered", action="store_true")
    ap.add_argument("--centroids", type=int, default=8)
    ap.add_argument("--centroid-top-k", type=int, default=2)
    ap.add_argument("--untied", action="store_true")
    ap.add_argument("--echo", action="store_true")
    ap.add_argument("--quant", choices=["none", "4bit"], default="none")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--no-vlm", action="store_true")
    a = ap.parse_args(argv)
    vlm = None
    if not a.no_vlm:
        try:
            from mlx_vlm.speculative.drafters import gemma4_assistant as vlm
        except ImportError:
            print("make_tiny_drafter: mlx_vlm does not import; writing the tensors with plain MLX", file=sys.stderr)
    if vlm is None and a.ordered:
        ap.error("--ordered needs mlx_vlm")

    tcfg = json.loads((a.target / "config.json").read_text())
    tc = tcfg.get("text_config", tcfg)
    vocab = tcfg.get("vocab_size", tc.get("vocab_size")) if "text_config" in tcfg else tc["vocab_size"]
    H_t = tc["hidden_size"]
    hidden = H_t if a.echo else a.hidden
    types = (["sliding_attention", "full_attention"] * a.layers)[: a.layers]
    text = {
        "model_type": "gemma4_text",
        "hidden_size": hidden,
        "num_hidden_layers": a.layers,
        "intermediate_size": 2 * hidden,
        "num_attention_heads": a.heads,
        "head_dim": tc.get("head_dim", 256),
        "global_head_dim": tc.get("global_head_dim", 512),
        "num_key_value_heads": tc.get("num_key_value_heads", 1),
        "num_global_key_value_heads": tc.get("num_global_key_value_heads"),
        "attention_k_eq_v": tc.get("attention_k_eq_v", False),
        "rms_norm_eps": tc.get("rms_norm_eps", 1e-6),
        "vocab_size": vocab,
        "vocab_size_per_layer_input": vocab,
        "hidden_size_per_layer_input": 0,
        "num_kv_shared_layers": a.layers,
        "sliding_window": tc.get("sliding_window", 512),
        "rope_parameters": tc.get("rope_parameters"),
        "layer_types": types,
        "final_logit_softcapping": None,
        "tie_word_embeddings": not a.untied,
    }
    cfg = {
        "model_type": "gemma4_assistant",
        "backbone_hidden_size": H_t,
        "use_ordered_embeddings": a.ordered,
        "num_centroids": a.centroids,
        "centroid_intermediate_top_k": a.centroid_top_k,
        "tie_word_embeddings": not a.untied,
        "block_size": a.block_size,
        "text_config": text,
    }
    mx.random.seed(a.seed)
    dtype = getattr(mx, a.dtype)
    if vlm is not None:
        model = vlm.Gemma4AssistantDraftModel(vlm.ModelConfig.from_dict(cfg))
        if a.ordered:
            perm = mx.random.permutation(vocab).astype(mx.int32)
            model.masked_embedding.token_ordering = perm
        params = dict(tree_flatten(model.parameters()))
    else:
        params = plain_params(cfg, dtype)
    # Norm weights and layer scalars get random values too, so a wrong scale or offset shows.
    for k, v in params.items():
        if k.endswith("norm.weight") or k.endswith("layer_scalar"):
            params[k] = (1.0 + 0.1 * mx.random.normal(v.shape)).astype(v.dtype)
    if a.echo:
        edt = mx.float32 if vlm is not None else dtype
        params["model.embed_tokens.weight"] = target_embed(a.target).astype(edt)
        params["pre_projection.weight"] = mx.concatenate([mx.zeros((hidden, H_t), edt), mx.eye(H_t, dtype=edt)], axis=1)
        params["post_projection.weight"] = mx.eye(H_t, dtype=edt)
        params["model.norm.weight"] = mx.ones((hidden,), edt)
        for k in list(params):
            if k.endswith("o_proj.weight") or k.endswith("down_proj.weight"):
                params[k] = mx.zeros_like(params[k])
    if vlm is not None:
        model.load_weights(list(params.items()))
        if a.dtype != "float32":
            model.set_dtype(dtype)
    if a.quant == "4bit":
        q = {"group_size": 32, "bits": 4, "mode": "affine"}
        if vlm is not None:
            nn.quantize(model, group_size=32, bits=4, class_predicate=lambda p, m: isinstance(m, nn.Linear) and m.weight.shape[-1] % 32 == 0)
        else:  # the same: every Linear weight (2-D, not the embedding) whose input is a multiple of 32
            for k in [k for k, v in params.items() if v.ndim == 2 and k != "model.embed_tokens.weight" and v.shape[-1] % 32 == 0]:
                w, sc, b = mx.quantize(params[k], group_size=32, bits=4)
                params[k], params[k[: -len("weight")] + "scales"], params[k[: -len("weight")] + "biases"] = w, sc, b
        cfg["quantization"] = q
        cfg["quantization_config"] = q
    weights = dict(tree_flatten(model.parameters())) if vlm is not None else params
    if not a.untied:
        weights.pop("lm_head.weight", None)
    a.out.mkdir(parents=True, exist_ok=True)
    mx.eval(list(weights.values()))
    mx.save_safetensors(str(a.out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (a.out / "config.json").write_text(json.dumps(cfg, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (a.target / name).exists():
            shutil.copy(a.target / name, a.out / name)


if __name__ == "__main__":
    main()

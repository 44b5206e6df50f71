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

  python tools/make-tiny-model/make_tiny_drafter.py --target /tmp/tiny --out /tmp/tiny-mtp [--ordered] [--echo]
"""
import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_vlm.speculative.drafters.gemma4_assistant import Gemma4AssistantDraftModel, ModelConfig


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
    a = ap.parse_args(argv)

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
    model = Gemma4AssistantDraftModel(ModelConfig.from_dict(cfg))
    if a.ordered:
        perm = mx.random.permutation(vocab).astype(mx.int32)
        model.masked_embedding.token_ordering = perm
    # Norm weights and layer scalars get random values too, so a wrong scale or offset shows.
    params = dict(tree_flatten(model.parameters()))
    for k, v in params.items():
        if k.endswith("norm.weight") or k.endswith("layer_scalar"):
            params[k] = 1.0 + 0.1 * mx.random.normal(v.shape)
    if a.echo:
        params["model.embed_tokens.weight"] = target_embed(a.target).astype(mx.float32)
        params["pre_projection.weight"] = mx.concatenate([mx.zeros((hidden, H_t)), mx.eye(H_t)], axis=1)
        params["post_projection.weight"] = mx.eye(H_t)
        params["model.norm.weight"] = mx.ones((hidden,))
        for k in list(params):
            if k.endswith("o_proj.weight") or k.endswith("down_proj.weight"):
                params[k] = mx.zeros_like(params[k])
    model.load_weights(list(params.items()))
    if a.dtype != "float32":
        model.set_dtype(getattr(mx, a.dtype))
    if a.quant == "4bit":
        q = {"group_size": 32, "bits": 4, "mode": "affine"}
        nn.quantize(model, group_size=32, bits=4, class_predicate=lambda p, m: isinstance(m, nn.Linear) and m.weight.shape[-1] % 32 == 0)
        cfg["quantization"] = q
        cfg["quantization_config"] = q
    weights = dict(tree_flatten(model.parameters()))
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

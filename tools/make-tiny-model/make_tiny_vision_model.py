#!/usr/bin/env python3
"""Tiny random-weight Gemma 4 checkpoints WITH the vision tower, in mlx-vlm's layout.

The text side is tools/make-tiny-model's "small" variant (per-layer embeddings, KV sharing,
sliding window 8); the vision side is a reduced-depth vision_config run through mlx-vlm 0.7.10's
own modules (mlx_vlm/models/gemma4: VisionModel, MultimodalEmbedder). Every parameter name and
shape comes from instantiating mlx-vlm's `Model(ModelConfig)`; the values are seeded
(make_tiny_model.init_value), so the same seed gives the same bytes. The weights are saved as
mlx-vlm saves a converted model (`language_model.model.*`, `vision_tower.*`, `embed_vision.*`).

processor_config.json is the file mlx-vlm's processing_gemma4.py reads (its "image_processor"
block): the published values (patch 16, pooling 3, rescale 1/255, no normalize) with a smaller
`max_soft_tokens` budget, so prompts stay short.

Variants:
  u   gemma4_unified (the 12B, encoder-free): the 12B's text side as make_gemma4_published.py
      scales it (k_eq_v, 5 sliding + 1 full, "vision" bidirectional setting), and mlx-vlm's
      VisionEmbedder (patch LayerNorm -> Linear -> LayerNorm, 2-D position table, pos_norm) with
      model patches of 48 = 16 x 3, embed dim 64, a 280-entry position table; processor_config.json
      for Gemma4UnifiedImageProcessor with the published budget (max_soft_tokens 280): mlx-vlm
      0.7.10's `load` replaces the processor's image processor by `Gemma4UnifiedImageProcessor()`
      (its defaults, whatever processor_config.json says), so only the defaults are comparable.
  e   E2B/E4B-style: clipped linears in the vision tower (use_clipped_linears), no standardize,
      causal text attention (text_config.use_bidirectional_attention null).
  l   26B/31B-style: plain linears, standardize (std_bias/std_scale), and
      use_bidirectional_attention "vision" (mlx-vlm's blockwise bidirectional image attention).

    python tools/make-tiny-model/make_tiny_vision_model.py --variant e --out DIR [--check]
    python tools/make-tiny-model/make_tiny_vision_model.py --suite DIR      # vision-e and vision-l
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_model as mtm  # noqa: E402

MAX_SOFT_TOKENS = 70  # one of the published budgets (70, 140, 280, 560, 1120)
UNIFIED_SOFT_TOKENS = 280  # Gemma4UnifiedImageProcessor's default, which mlx-vlm's load always uses


def vision_config(variant: str) -> dict:
    return {
        "model_type": "gemma4_vision",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "global_head_dim": 64,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 131072,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_bidirectional_attention": "vision",
        "rope_parameters": {"rope_theta": 100.0, "rope_type": "default"},
        "default_output_length": MAX_SOFT_TOKENS,
        "patch_size": 16,
        "position_embedding_size": 64,
        "pooling_kernel_size": 3,
        "use_clipped_linears": variant == "e",
        "standardize": variant == "l",
    }


def model_config(variant: str, dtype: str) -> dict:
    overrides = {"use_bidirectional_attention": "vision" if variant == "l" else None}
    cfg = mtm.model_config("small", "wrapper", dtype, overrides)
    tok = mtm.SPECIAL_TOKENS
    cfg["vision_config"] = vision_config(variant)
    cfg["audio_config"] = None
    cfg["audio_token_id"] = tok.index("<|audio|>")
    cfg["boa_token_id"] = tok.index("<|audio>")
    cfg["eoa_token_id"] = tok.index("<audio|>")
    cfg["vision_soft_tokens_per_image"] = MAX_SOFT_TOKENS
    return dict(sorted(cfg.items()))


def processor_config() -> dict:
    return {
        "image_processor": {
            "do_convert_rgb": True,
            "do_normalize": False,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": [0.0, 0.0, 0.0],
            "image_processor_type": "Gemma4ImageProcessor",
            "image_std": [1.0, 1.0, 1.0],
            "max_soft_tokens": MAX_SOFT_TOKENS,
            "patch_size": 16,
            "pooling_kernel_size": 3,
            "resample": 3,
            "rescale_factor": 1 / 255,
        },
        "image_seq_length": MAX_SOFT_TOKENS,
        "processor_class": "Gemma4Processor",
    }


def unified_config() -> dict:
    import make_gemma4_published as mgp

    c = mgp.tiny_config("12b")
    c["vision_config"] = {
        "model_type": "gemma4_unified_vision",
        "patch_size": 16,
        "pooling_kernel_size": 3,
        "model_patch_size": 48,
        "mm_embed_dim": 64,
        "mm_posemb_size": UNIFIED_SOFT_TOKENS,
        "num_soft_tokens": UNIFIED_SOFT_TOKENS,
        "output_proj_dims": 64,
        "rms_norm_eps": 1e-6,
    }
    c["audio_config"] = None
    c["vision_soft_tokens_per_image"] = UNIFIED_SOFT_TOKENS
    return dict(sorted(c.items()))


def unified_processor_config() -> dict:
    p = processor_config()
    ip = p["image_processor"]
    ip.update(
        image_processor_type="Gemma4UnifiedImageProcessor",
        max_soft_tokens=UNIFIED_SOFT_TOKENS,
        model_patch_size=48,
        mm_posemb_size=UNIFIED_SOFT_TOKENS,
    )
    p["image_seq_length"] = UNIFIED_SOFT_TOKENS
    p["processor_class"] = "Gemma4UnifiedProcessor"
    return p


def build_unified_weights(config: dict, seed: int) -> dict:
    """mlx-vlm's gemma4_unified parameter tree (language model, vision_embedder, embed_vision), seeded."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    import make_gemma4_published as mgp

    dtype = getattr(mx, config["text_config"]["dtype"])
    model = mgp.vlm_model(config)
    if model.vision_embedder is None:
        raise SystemExit("mlx-vlm built no vision_embedder for this config")
    out = {n: mx.array(mtm.init_value(n, tuple(p.shape), seed)).astype(dtype) for n, p in tree_flatten(model.parameters())}
    mx.eval(out)
    return dict(sorted(out.items()))


def build_weights(config: dict, seed: int, dtype: str) -> dict:
    """mlx-vlm's parameter tree for this config, filled with seeded values."""
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten
    from mlx_vlm.models.gemma4 import Model, ModelConfig
    from mlx_vlm.models.gemma4.config import TextConfig, VisionConfig

    mc = ModelConfig.from_dict(copy.deepcopy(config))
    mc.text_config = TextConfig.from_dict(config["text_config"])
    mc.vision_config = VisionConfig.from_dict(config["vision_config"])
    model = Model(mc)
    out = {}
    for name, p in tree_flatten(model.parameters()):
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("input_min", "output_min", "input_max", "output_max"):
            # Clip bounds that do clip: |x| beyond ~2 sigma of the layer's activations.
            rng = np.random.default_rng([seed, len(name)])
            b = float(rng.uniform(1.5, 3.0))
            v = np.array(-b if leaf.endswith("min") else b, dtype=np.float32)
        elif leaf == "std_bias":
            v = 0.1 * np.random.default_rng([seed, 7]).standard_normal(p.shape).astype(np.float32)
        elif leaf == "std_scale":
            v = (1.0 + 0.1 * np.random.default_rng([seed, 8]).standard_normal(p.shape)).astype(np.float32)
        else:
            v = mtm.init_value(name, tuple(p.shape), seed)
        out[name] = mx.array(v).astype(getattr(mx, dtype))
    mx.eval(out)
    return dict(sorted(out.items()))


def make(variant: str, out: Path, seed: int = 0, dtype: str = "bfloat16") -> Path:
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    if variant == "u":
        config = unified_config()
        mtm.write_common(out, config, template_in_config=False)
        gen = json.loads((out / "generation_config.json").read_text())
        gen["eos_token_id"] = config["eos_token_id"]
        (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
        (out / "processor_config.json").write_text(json.dumps(unified_processor_config(), indent=2) + "\n")
        mtm.write_weights(out, build_unified_weights(config, seed), 1)
        return out
    config = model_config(variant, dtype)
    mtm.write_common(out, config, template_in_config=False)
    (out / "processor_config.json").write_text(json.dumps(processor_config(), indent=2) + "\n")
    mtm.write_weights(out, build_weights(config, seed, dtype), 1)
    return out


def check(path: Path) -> dict:
    """Load with mlx-vlm and run one image through the processor and the model."""
    import mlx.core as mx
    import numpy as np
    from mlx_vlm.utils import load
    from PIL import Image

    model, processor = load(str(path))
    img = Image.fromarray((np.arange(100 * 130 * 3) % 251).astype(np.uint8).reshape(100, 130, 3))
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}],
        add_generation_prompt=True,
    )
    inputs = processor(images=[img], text=prompt, return_tensors="mlx")
    extra = {"image_position_ids": inputs["image_position_ids"]} if "image_position_ids" in inputs else {}
    logits = model(inputs["input_ids"], pixel_values=inputs["pixel_values"], **extra)
    logits = getattr(logits, "logits", logits)
    mx.eval(logits)
    ids = inputs["input_ids"][0].tolist()
    return {"prompt_tokens": len(ids), "image_tokens": ids.count(config_image_token(path)), "argmax": int(mx.argmax(logits[0, -1]).item())}


def config_image_token(path: Path) -> int:
    return json.loads((Path(path) / "config.json").read_text())["image_token_id"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", choices=["e", "l", "u"], default="e")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--suite", type=Path, help="write vision-e and vision-l into this folder")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=mtm.DTYPES, default="bfloat16")
    ap.add_argument("--check", action="store_true", help="load the result with mlx-vlm and run one image")
    a = ap.parse_args(argv)
    targets = [(v, a.suite / f"vision-{v}") for v in ("e", "l")] if a.suite else [(a.variant, a.out)]
    if not targets[0][1]:
        ap.error("--out or --suite is required")
    for v, d in targets:
        make(v, d, a.seed, a.dtype)
        print(json.dumps({"variant": v, "out": str(d), **(check(d) if a.check else {})}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

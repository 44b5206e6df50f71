#!/usr/bin/env python3
"""Tiny random-weight checkpoints of every published Gemma 4 size, in every layout people download.

The published config.json values (packages/models/test/data/gemma4-published-configs.json) are
scaled down: the depth is cut to the first 10 (E2B), 12 (E4B) or 6 (12B, 26B-A4B, 31B) entries of
the published layer_types (so the sliding/full pattern is the published one: E2B 4 sliding + 1
full, the others 5 + 1) with the KV-shared tail kept in proportion (E2B 5 of 10, E4B 6 of 12),
and the widths shrink: hidden 64, 4 heads of 32 (full layers 64), kv heads 1 or 2 and global kv
heads 1 as the published ratios allow, MLP 128, per-layer inputs 16, 8 experts of 64 (top 2),
vocab 512, sliding window 8. Every switch the published config sets (attention_k_eq_v,
double-wide MLP, KV sharing, per-layer embeddings, MoE, RoPE parameters, soft-cap, eps) is kept.
Vision and audio configs are small ones of our own (they are not the text side).

Weights come from mlx-vlm's own model classes (gemma4.Model / gemma4_unified.Model, every
parameter, towers included) filled with seeded values, and are written as:

  hf         the Hugging Face layout: model.language_model.*, model.vision_tower.* /
             model.vision_embedder.*, model.embed_vision.*, model.audio_tower.*, model.embed_audio.*,
             fused experts.gate_up_proj / experts.down_proj, K/V projections still present on
             KV-shared layers, audio convolutions in PyTorch layout: mlx-vlm's sanitize, inverted.
  vlm        mlx-vlm's convert without quantization (load_model = its sanitize, save_weights,
             save_config): language_model.model.*, vision_tower.*, ...
  vlm-4bit   mlx-vlm's convert --quantize (4 bits, group 64, the model's quant_predicate: routers
             8-bit; towers left unquantized)
  vlm-mixed  mlx-vlm's convert --quant-predicate mixed_4_6 (a per-module quantization entry for
             every quantized layer, 4 or 6 bits), as mlx-community's mixed-precision uploads
  lm-4bit    mlx-lm's convert --quantize (4 bits), for the sizes mlx-lm has (not the 12B)

The MoE size (26B-A4B) is written in float32: MLX's CPU backend runs the expert matmul (gather_mm)
in float32 only. Everything else is bfloat16, as published.

  python make_gemma4_published.py --out DIR [--sizes e2b,12b] [--layouts hf,vlm]
  -> DIR/<size>/<layout>/ (config.json, generation_config.json, tokenizer files, weights)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import glob
import io
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_tiny_model import VOCAB_SIZE, init_value, write_common  # noqa: E402

DATA = HERE.parent.parent / "packages" / "models" / "test" / "data" / "gemma4-published-configs.json"
SIZES = ["e2b", "e4b", "12b", "26b-a4b", "31b"]
LAYOUTS = ["hf", "vlm", "vlm-4bit", "vlm-mixed", "lm-4bit"]
# Reduced depth (a prefix of the published layer_types) and KV-shared layers kept.
DEPTH = {"e2b": (10, 5), "e4b": (12, 6), "12b": (6, 0), "26b-a4b": (6, 0), "31b": (6, 0)}


def published() -> dict:
    return json.loads(DATA.read_text())["sizes"]


def tiny_config(size: str) -> dict:
    pub = published()[size]["config"]
    c = copy.deepcopy(pub)
    t = c["text_config"]
    n, shared = DEPTH[size]
    heads = 4
    ratio = t["num_key_value_heads"] / t["num_attention_heads"]
    t.update(
        hidden_size=64,
        num_hidden_layers=n,
        layer_types=t["layer_types"][:n],
        num_kv_shared_layers=shared,
        intermediate_size=128,
        num_attention_heads=heads,
        num_key_value_heads=max(1, round(heads * ratio)),
        head_dim=32,
        global_head_dim=64,
        vocab_size=VOCAB_SIZE,
        sliding_window=8,
    )
    if t.get("num_global_key_value_heads"):
        t["num_global_key_value_heads"] = 1
    if t.get("hidden_size_per_layer_input"):
        t["hidden_size_per_layer_input"] = 16
        t["vocab_size_per_layer_input"] = VOCAB_SIZE
    if t.get("enable_moe_block"):
        t.update(num_experts=8, top_k_experts=2, moe_intermediate_size=64)
    dtype = "float32" if t.get("enable_moe_block") else "bfloat16"
    t["dtype"] = dtype
    c["torch_dtype"] = dtype
    c["vocab_size"] = VOCAB_SIZE
    # Our tokenizer's ids for these (make_tiny_model's SPECIAL_TOKENS order); eos as generation_config.
    c.update(image_token_id=19, audio_token_id=22, boi_token_id=17, eoi_token_id=18, boa_token_id=20, eoa_token_id=21, video_token_id=23)
    c["eos_token_id"] = [1, 6]
    if c["model_type"] == "gemma4_unified":
        c["vision_config"] = {
            "model_type": "gemma4_unified_vision",
            "patch_size": 8,
            "model_patch_size": 8,
            "pooling_kernel_size": 1,
            "mm_embed_dim": 32,
            "mm_posemb_size": 16,
            "num_soft_tokens": 16,
            "output_proj_dims": 32,
        }
        c["audio_config"] = {"model_type": "gemma4_unified_audio", "audio_samples_per_token": 32, "audio_embed_dim": 32, "hidden_size": 32, "output_proj_dims": 32}
        c.pop("eoa_token_id")
        c["eoa_token_index"] = 21
    else:
        c["vision_config"] = {
            "model_type": "gemma4_vision",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "global_head_dim": 16,
            "patch_size": 4,
            "position_embedding_size": 64,
            "pooling_kernel_size": 2,
            "default_output_length": 16,
        }
        if size in ("e2b", "e4b"):
            c["audio_config"] = {
                "model_type": "gemma4_audio",
                "hidden_size": 32,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "subsampling_conv_channels": [8, 4],
                "output_proj_dims": 32,
            }
        else:
            c["audio_config"] = None
    return c


def vlm_model(config: dict):
    """mlx-vlm's Model for a config dict, built as mlx_vlm.utils.load_model builds it."""
    from mlx_vlm.utils import get_model_and_args, update_module_configs

    config = copy.deepcopy(config)
    model_class, _ = get_model_and_args(config=config)
    config.setdefault("text_config", {})
    config.setdefault("vision_config", {})
    config.setdefault("audio_config", {})
    mc = model_class.ModelConfig.from_dict(config)
    mc = update_module_configs(mc, model_class, config, ["text", "vision", "perceiver", "projector", "audio"])
    return model_class.Model(mc)


def hf_weights(config: dict, seed: int) -> dict:
    """Every parameter of mlx-vlm's model, seeded, under the names the Hugging Face checkpoint uses."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    dtype = getattr(mx, config["text_config"]["dtype"])
    model = vlm_model(config)
    t = config["text_config"]
    out = {}
    gate_up: dict[str, dict] = {}
    for name, p in tree_flatten(model.parameters()):
        v = mx.array(init_value(name, tuple(p.shape), seed)).astype(dtype)
        if name.startswith("language_model.model."):
            hk = "model.language_model." + name[len("language_model.model.") :]
        else:
            hk = "model." + name
        if ".experts.switch_glu." in hk:
            base, rest = hk.split(".switch_glu.")
            part = rest.split(".")[0]
            if part == "down_proj":
                out[f"{base}.down_proj"] = v
            else:
                gate_up.setdefault(base, {})[part] = v
            continue
        # Audio convolutions in PyTorch layout (mlx-vlm's sanitize transposes them back).
        if "subsample_conv_projection" in hk and "conv.weight" in hk and v.ndim == 4:
            v = v.transpose(0, 3, 1, 2)
        if "depthwise_conv1d.weight" in hk and v.ndim == 3:
            v = v.transpose(0, 2, 1)
        out[hk] = v
    for base, parts in gate_up.items():
        out[f"{base}.gate_up_proj"] = mx.concatenate([parts["gate_proj"], parts["up_proj"]], axis=-2)
    # Google's checkpoints carry K/V projections on KV-shared layers (both references drop them).
    n = t["num_hidden_layers"]
    for i in range(n - t.get("num_kv_shared_layers", 0), n):
        full = t["layer_types"][i] == "full_attention"
        hd = t["global_head_dim"] if full else t["head_dim"]
        kv = t["num_key_value_heads"]
        pre = f"model.language_model.layers.{i}.self_attn."
        for nm, shape in {pre + "k_proj.weight": (kv * hd, t["hidden_size"]), pre + "v_proj.weight": (kv * hd, t["hidden_size"]), pre + "k_norm.weight": (hd,)}.items():
            out[nm] = mx.array(init_value(nm, shape, seed)).astype(dtype)
    mx.eval(out)
    return dict(sorted(out.items()))


def write_hf(size: str, out: Path, seed: int) -> None:
    import mlx.core as mx

    config = tiny_config(size)
    write_common(out, config, template_in_config=False)
    gen = json.loads((out / "generation_config.json").read_text())
    gen["eos_token_id"] = config["eos_token_id"]
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    mx.save_safetensors(str(out / "model.safetensors"), hf_weights(config, seed), metadata={"format": "pt"})


def vlm_convert(src: Path, out: Path, quantize: str | None) -> None:
    """mlx_vlm.convert.convert's steps (without its processor round trip, which needs a real one)."""
    import mlx.core as mx
    from mlx.utils import tree_map_with_path
    from mlx_vlm.convert import mixed_quant_predicate_builder
    from mlx_vlm.quant_utils import quantize_model
    from mlx_vlm.utils import load_config, load_model, save_config, save_weights, skip_multimodal_module

    config = load_config(src)
    model = load_model(src, lazy=True)
    dtype = config.get("torch_dtype") or config.get("text_config", {}).get("dtype")
    if dtype:
        dt = getattr(mx, dtype)
        model.update(tree_map_with_path(lambda k, v: v.astype(dt) if mx.issubdtype(v.dtype, mx.floating) else v, model.parameters()))
    if quantize:
        own = getattr(model, "quant_predicate", None)

        def base(path, module):
            if skip_multimodal_module(path):
                return False
            return own(path, module) if own is not None else True

        pred = mixed_quant_predicate_builder("mixed_4_6", model) if quantize == "mixed" else base
        config.setdefault("vision_config", {})
        with contextlib.redirect_stdout(io.StringIO()):
            model, config = quantize_model(model, config, 64, 4, mode="affine", quant_predicate=pred)
    save_weights(out, model, donate_weights=True)
    for pattern in ["*.json", "*.jinja"]:
        for f in glob.glob(str(src / pattern)):
            if Path(f).name != "model.safetensors.index.json":
                shutil.copy(f, out)
    save_config(config, config_path=out / "config.json")


def lm_convert(src: Path, out: Path) -> None:
    from mlx_lm.convert import convert

    with contextlib.redirect_stdout(io.StringIO()):
        convert(str(src), str(out), quantize=True, q_bits=4, q_group_size=64)
    if (out / "README.md").exists():
        (out / "README.md").unlink()


def make(root: Path, sizes: list[str], layouts: list[str], seed: int = 0) -> list[Path]:
    made = []
    for size in sizes:
        d = root / size
        hf = d / "hf"
        if hf.exists():
            shutil.rmtree(hf)
        # A seed per size: at this scale the 12B's and the 31B's text sides have the same shapes.
        write_hf(size, hf, seed + SIZES.index(size))
        for layout in layouts:
            out = d / layout
            if layout == "hf":
                made.append(out)
                continue
            if layout == "lm-4bit" and tiny_config(size)["model_type"] != "gemma4":
                continue  # mlx-lm has no gemma4_unified
            if out.exists():
                shutil.rmtree(out)
            if layout == "vlm":
                vlm_convert(hf, out, None)
            elif layout == "vlm-4bit":
                vlm_convert(hf, out, "4bit")
            elif layout == "vlm-mixed":
                vlm_convert(hf, out, "mixed")
            elif layout == "lm-4bit":
                lm_convert(hf, out)
            else:
                raise SystemExit(f"unknown layout {layout} (one of {', '.join(LAYOUTS)})")
            made.append(out)
        if "hf" not in layouts:
            shutil.rmtree(hf)
    return made


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    sizes = a.sizes.split(",")
    for s in sizes:
        if s not in SIZES:
            raise SystemExit(f"unknown size {s} (one of {', '.join(SIZES)})")
    made = make(Path(a.out), sizes, a.layouts.split(","), a.seed)
    print(json.dumps([str(p) for p in made]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

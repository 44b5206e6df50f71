#!/usr/bin/env python3
"""Write a benchmark-size, random-weight, 4-bit Gemma 4 checkpoint that mlx-lm and mlx-bun load.

The architecture is the "small" variant of tools/make-tiny-model (gemma-4 E2B/E4B-like:
per-layer embeddings, KV-sharing layers with the double-wide MLP, sliding/full layer pattern,
head_dim 256 / global_head_dim 512, one KV head, tied embeddings, logit soft-capping), at a
real size. Configs (--size):

  1b    hidden 1536, 20 layers (4 sliding : 1 full, 8 KV-shared), MLP 6144 (12288 on shared
        layers), 8 query heads, vocab 262144 (the real Gemma vocab, so the embedding/lm_head
        cost is the real one), per-layer inputs 256: 0.98B transformer + 0.40B embedding
        parameters read per decoded token, plus the 1.34B-entry per-layer embedding table
        (a lookup: only the rows of the fed tokens are read).
  mini  the same layer pattern and head dims at CPU size (hidden 256, 10 layers, 4 shared,
        vocab 4096) for the 2-core CI machine, where MLX's CPU quantized matmul runs at about
        1 GFLOP/s; float32 weights (MLX's CPU backend is ~8x slower in bf16).

The tokenizer is tools/make-tiny-model's (512 tokens); the embedding has `vocab_size` rows as
the config says. So that the random model only ever picks tokens the tokenizer can decode to
whole text, the rows of the special tokens, the byte-fallback tokens and the ids past the
tokenizer's vocabulary are scaled by 0.05 (their logits stay near 0, below the best text
token's): every row is still read and multiplied, so the cost is honest, and greedy decoding
never stops early (eos is never chosen).

Weights are seeded per tensor (as make_tiny_model's init_value, drawn in float32 and in row
chunks so the 1.3B-entry tables need no float64 copies), set into mlx-lm's own model class,
quantized with mlx-lm's quantize_model (the model's quant_predicate, group 64, 4 bits) and
written with mlx_lm.utils.save: the same steps as `mlx_lm.convert --quantize`, without a bf16
copy on disk.

  python make_bench_model.py --size 1b --out .native/bench-models/gemma4-1b-4bit
  python make_bench_model.py --size mini --out .native/bench-models/gemma4-mini-4bit --check
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "make-tiny-model"))
import make_tiny_model as tiny  # noqa: E402

S, F = "sliding_attention", "full_attention"


def pattern(n: int) -> list[str]:
    return [F if i % 5 == 4 else S for i in range(n)]


SIZES = {
    "1b": dict(
        dtype="bfloat16",
        overrides=dict(
            hidden_size=1536,
            num_hidden_layers=20,
            layer_types=pattern(20),
            num_kv_shared_layers=8,
            intermediate_size=6144,
            use_double_wide_mlp=True,
            num_attention_heads=8,
            num_key_value_heads=1,
            head_dim=256,
            global_head_dim=512,
            hidden_size_per_layer_input=256,
            vocab_size=262144,
            vocab_size_per_layer_input=262144,
            sliding_window=512,
            max_position_embeddings=131072,
        ),
    ),
    "mini": dict(
        dtype="float32",
        overrides=dict(
            hidden_size=256,
            num_hidden_layers=10,
            layer_types=pattern(10),
            num_kv_shared_layers=4,
            intermediate_size=512,
            use_double_wide_mlp=True,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=256,
            global_head_dim=512,
            hidden_size_per_layer_input=64,
            vocab_size=4096,
            vocab_size_per_layer_input=4096,
            sliding_window=512,
            max_position_embeddings=131072,
        ),
    ),
}

# Token ids the random model may pick: the tokenizer's learned merges and <unusedN> fillers
# (whole text). Specials (0..23) and byte-fallback tokens (24..279) are damped.
FIRST_TEXT_ID = len(tiny.SPECIAL_TOKENS) + len(tiny.BYTE_TOKENS)
DAMP = 0.05
CHUNK_ELEMS = 1 << 26  # 64M float32 per draw


class MlxRng:
    """numpy Generator's three draws on MLX's default device (the GPU on the device machine:
    seconds instead of minutes for 2.7B values); seeded per tensor, so deterministic per backend."""

    def __init__(self, seed: int, name: str):
        import mlx.core as mx

        self.key = mx.random.key((seed * 1_000_003 + zlib.crc32(name.encode())) % (1 << 31))

    def _next(self):
        import mlx.core as mx

        self.key, k = mx.random.split(self.key)
        return k

    def standard_normal(self, shape, dtype=np.float32):
        import mlx.core as mx

        return mx.random.normal(tuple(shape), key=self._next())

    def uniform(self, lo, hi, shape):
        import mlx.core as mx

        return mx.random.uniform(lo, hi, tuple(shape), key=self._next())


RNG = "numpy"


def init_tensor(name: str, shape: tuple, seed: int, dtype) -> "mx.array":
    """make_tiny_model.init_value, drawn in float32 row chunks; embeddings get the damping."""
    import mlx.core as mx

    if RNG == "mlx":
        return init_tensor_mlx(name, shape, seed, dtype)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    leaf = name.rsplit(".", 1)[-1]
    if "norm" in name or leaf in ("scale", "per_expert_scale"):
        return mx.array((1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)).astype(dtype)
    if leaf == "layer_scalar":
        return mx.array(rng.uniform(0.8, 1.2, shape).astype(np.float32)).astype(dtype)
    fan_in = shape[-1] if shape else 1
    gain = 1.0 if "embed_tokens" in name else 2.0
    scale = np.float32(gain / np.sqrt(fan_in))
    rows = shape[0] if shape else 1
    per_row = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    step = max(1, CHUNK_ELEMS // max(per_row, 1))
    parts = []
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        a = rng.standard_normal((r1 - r0, *shape[1:]) if shape else (), dtype=np.float32)
        a *= scale
        if name.endswith("embed_tokens.weight"):
            ids = np.arange(r0, r1)
            damp = (ids < FIRST_TEXT_ID) | (ids >= len_tokenizer_vocab())
            a[damp] *= DAMP
        parts.append(mx.array(a).astype(dtype))
        mx.eval(parts[-1])
        del a
    out = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=0)
    mx.eval(out)
    return out


def init_tensor_mlx(name: str, shape: tuple, seed: int, dtype) -> "mx.array":
    import mlx.core as mx

    rng = MlxRng(seed, name)
    leaf = name.rsplit(".", 1)[-1]
    if "norm" in name or leaf in ("scale", "per_expert_scale"):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(dtype)
    if leaf == "layer_scalar":
        return rng.uniform(0.8, 1.2, shape).astype(dtype)
    fan_in = shape[-1] if shape else 1
    gain = 1.0 if "embed_tokens" in name else 2.0
    a = rng.standard_normal(shape) * (gain / float(np.sqrt(fan_in)))
    if name.endswith("embed_tokens.weight"):
        ids = mx.arange(shape[0])
        damp = (ids < FIRST_TEXT_ID) | (ids >= len_tokenizer_vocab())
        a = a * mx.where(damp, DAMP, 1.0)[:, None]
    out = a.astype(dtype)
    mx.eval(out)
    return out


def len_tokenizer_vocab() -> int:
    return tiny.VOCAB_SIZE


def make(size: str, out: Path, seed: int = 0, log=print) -> Path:
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.utils import _get_classes, load_tokenizer, quantize_model, save

    spec = SIZES[size]
    dtype = spec["dtype"]
    config = tiny.model_config("small", "text", dtype, spec["overrides"])
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(copy.deepcopy(config)))
    t0 = time.time()
    params = []
    n_params = 0
    for name, p in tree_flatten(model.parameters()):
        params.append((name, init_tensor(name, tuple(p.shape), seed, getattr(mx, dtype))))
        n_params += p.size
    model.update(tree_unflatten(params))
    del params
    log(f"[bench-model] {size}: {n_params / 1e9:.3f}B parameters drawn in {time.time() - t0:.1f}s")
    with tempfile.TemporaryDirectory(prefix="bench-model-src-") as src:
        src = Path(src)
        tiny.write_common(src, config, template_in_config=False)
        tokenizer = load_tokenizer(src)
        with contextlib.redirect_stdout(io.StringIO()):
            model, qconfig = quantize_model(model, config, 64, 4)
        tmp = out.with_name(out.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        with contextlib.redirect_stdout(io.StringIO()):
            save(tmp, src, model, tokenizer, qconfig)
        shutil.copy(src / "chat_template.jinja", tmp / "chat_template.jinja")
    if (tmp / "README.md").exists():
        (tmp / "README.md").unlink()
    (tmp / "bench-model.json").write_text(
        json.dumps({"size": size, "seed": seed, "rng": RNG, "parameters": n_params, "tokenizer_vocab": tiny.VOCAB_SIZE,
                    "damped_rows": f"ids < {FIRST_TEXT_ID} and >= {tiny.VOCAB_SIZE} scaled by {DAMP}"}, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    log(f"[bench-model] {size}: written to {out} in {time.time() - t0:.1f}s")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="then load with mlx_lm.load and greedily generate 8 tokens")
    ap.add_argument("--rng", choices=["numpy", "mlx"], default="numpy",
                    help="numpy (default; the same values everywhere) or mlx (MLX's device RNG: fast on a GPU)")
    a = ap.parse_args(argv)
    global RNG
    RNG = a.rng
    make(a.size, a.out, a.seed)
    if a.check:
        print(json.dumps({"path": str(a.out), **tiny.check_generate(a.out, 8)}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

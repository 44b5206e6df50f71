#!/usr/bin/env python3
"""A dense, 12B-shaped random-weight 4-bit Gemma 4 checkpoint for decode profiling on a GPU
(tools/bench/make_bench_model.py with one more size; every other step is that script's).

  hidden 3840, 48 layers (5 sliding : 1 full), MLP 15360, 16 query / 8 KV heads, head dim 256
  (512 on full-attention layers), no per-layer inputs, no KV sharing, vocab 262144 (tied
  lm_head): 12.1B parameters read per decoded token, ~6.8 GB at 4 bits (group 64).
  Matrix shapes (out x in): q 4096x3840 (full 8192x3840), k/v 2048x3840 (full 4096x3840),
  o 3840x4096 (full 3840x8192), gate/up 15360x3840, down 3840x15360, lm_head 262144x3840.

  python tools/bench/device/make_12b_model.py --out .native/bench-models/gemma4-12b-4bit --rng mlx
  python tools/bench/device/make_12b_model.py --out /tmp/m --hidden 256 --layers 6 --mlp 512 --vocab 4096  # a dry run
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import make_bench_model as mbm  # noqa: E402


def pattern6(n: int) -> list[str]:
    return [mbm.F if i % 6 == 5 else mbm.S for i in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rng", choices=["numpy", "mlx"], default="mlx")
    ap.add_argument("--hidden", type=int, default=3840)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--mlp", type=int, default=15360)
    ap.add_argument("--vocab", type=int, default=262144)
    a = ap.parse_args()
    mbm.SIZES["12b"] = dict(
        dtype="bfloat16",
        overrides=dict(
            hidden_size=a.hidden,
            num_hidden_layers=a.layers,
            layer_types=pattern6(a.layers),
            num_kv_shared_layers=0,
            intermediate_size=a.mlp,
            use_double_wide_mlp=False,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=256,
            global_head_dim=512,
            hidden_size_per_layer_input=0,
            vocab_size=a.vocab,
            vocab_size_per_layer_input=a.vocab,
            sliding_window=1024,
            max_position_embeddings=131072,
        ),
    )
    mbm.RNG = a.rng
    mbm.make("12b", a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

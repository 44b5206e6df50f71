"""mlx-lm's generate_step on token ids: prints JSON {"tokens": [...], "logprobs": [...]} (the chosen tokens' log-probabilities).

Usage: python generate_oracle.py DIR --ids 1,2,3 --max-tokens N [--prefill-step N] [--temp T --seed S]
"""
import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import load_model

p = argparse.ArgumentParser()
p.add_argument("dir")
p.add_argument("--ids", required=True)
p.add_argument("--max-tokens", type=int, default=20)
p.add_argument("--prefill-step", type=int, default=2048)
p.add_argument("--temp", type=float, default=0.0)
p.add_argument("--seed", type=int, default=None)
a = p.parse_args()
model, _ = load_model(Path(a.dir))
if a.seed is not None:
    mx.random.seed(a.seed)
ids = mx.array([int(x) for x in a.ids.split(",")])
tokens, lps = [], []
for tok, lp in generate_step(ids, model, max_tokens=a.max_tokens, prefill_step_size=a.prefill_step, sampler=make_sampler(a.temp)):
    tokens.append(int(tok))
    lps.append(float(lp[int(tok)].astype(mx.float32).item()))
print(json.dumps({"tokens": tokens, "logprobs": lps}))

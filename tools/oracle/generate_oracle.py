"""mlx-lm's generate_step on token ids: prints JSON {"tokens": [...], "logprobs": [...]} (the chosen tokens' log-probabilities).

Usage: python generate_oracle.py DIR --ids 1,2,3 --max-tokens N [--prefill-step N] [--temp T --seed S]
       [--ban 5,6] [--no-repeat]   (logits processors: ban fixed ids; ban every id generated so far)
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
p.add_argument("--ban", default="")
p.add_argument("--no-repeat", action="store_true")
a = p.parse_args()
model, _ = load_model(Path(a.dir))
if a.seed is not None:
    mx.random.seed(a.seed)
ids = mx.array([int(x) for x in a.ids.split(",")])
processors = []
if a.ban:
    banned = mx.array([int(x) for x in a.ban.split(",")])

    def ban(tokens, logits):
        logits[:, banned] = -float("inf")
        return logits

    processors.append(ban)
if a.no_repeat:
    n_prompt = ids.size

    def no_repeat(tokens, logits):
        seen = sorted(set(tokens[n_prompt:].tolist()))
        if seen:
            logits[:, mx.array(seen)] = -float("inf")
        return logits

    processors.append(no_repeat)
tokens, lps = [], []
steps = generate_step(ids, model, max_tokens=a.max_tokens, prefill_step_size=a.prefill_step, sampler=make_sampler(a.temp), logits_processors=processors or None)
for tok, lp in steps:
    tokens.append(int(tok))
    lps.append(float(lp[int(tok)].astype(mx.float32).item()))
print(json.dumps({"tokens": tokens, "logprobs": lps}))

"""mlx-lm's generate_step on token ids: prints JSON {"tokens": [...], "logprobs": [...]} (the chosen tokens' log-probabilities).

Usage: python generate_oracle.py DIR --ids 1,2,3 --max-tokens N [--prefill-step N] [--temp T --seed S]
       [--top-p P] [--min-p P] [--top-k K] [--xtc-probability P --xtc-threshold T]
       [--ban 5,6] [--no-repeat]   (logits processors: ban fixed ids; ban every id generated so far)

With XTC, the special tokens are mlx_lm.generate's (tokenizer.encode("\n") + the eos ids) and the
output also holds them as "xtc_special_tokens".
"""
import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import load_model, load_tokenizer

p = argparse.ArgumentParser()
p.add_argument("dir")
p.add_argument("--ids", required=True)
p.add_argument("--max-tokens", type=int, default=20)
p.add_argument("--prefill-step", type=int, default=2048)
p.add_argument("--temp", type=float, default=0.0)
p.add_argument("--seed", type=int, default=None)
p.add_argument("--top-p", type=float, default=0.0)
p.add_argument("--min-p", type=float, default=0.0)
p.add_argument("--top-k", type=int, default=0)
p.add_argument("--xtc-probability", type=float, default=0.0)
p.add_argument("--xtc-threshold", type=float, default=0.1)
p.add_argument("--ban", default="")
p.add_argument("--no-repeat", action="store_true")
a = p.parse_args()
model, config = load_model(Path(a.dir))
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
special = None
if a.xtc_probability > 0:
    # As mlx_lm.utils.load: the config's eos ids join the tokenizer's.
    tokenizer = load_tokenizer(Path(a.dir), eos_token_ids=config.get("eos_token_id", None))
    special = tokenizer.encode("\n") + list(tokenizer.eos_token_ids)
sampler = make_sampler(
    a.temp,
    top_p=a.top_p,
    min_p=a.min_p,
    top_k=a.top_k,
    xtc_probability=a.xtc_probability,
    xtc_threshold=a.xtc_threshold,
    xtc_special_tokens=special,
)
tokens, lps = [], []
steps = generate_step(ids, model, max_tokens=a.max_tokens, prefill_step_size=a.prefill_step, sampler=sampler, logits_processors=processors or None)
for tok, lp in steps:
    tokens.append(int(tok))
    lps.append(float(lp[int(tok)].astype(mx.float32).item()))
out = {"tokens": tokens, "logprobs": lps}
if special is not None:
    out["xtc_special_tokens"] = special
print(json.dumps(out))

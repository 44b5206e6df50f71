"""mlx-lm's speculative_generate_step (greedy) on token ids: prints JSON
{"tokens": [...], "from_draft": [...]} for a target and a draft checkpoint.

Usage: python speculative_oracle.py TARGET DRAFT --ids 1,2,3 --max-tokens N --num-draft-tokens K
"""
import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import speculative_generate_step
from mlx_lm.utils import load_model

p = argparse.ArgumentParser()
p.add_argument("target")
p.add_argument("draft")
p.add_argument("--ids", required=True)
p.add_argument("--max-tokens", type=int, default=20)
p.add_argument("--num-draft-tokens", type=int, default=3)
p.add_argument("--prefill-step", type=int, default=2048)
a = p.parse_args()
model, _ = load_model(Path(a.target))
draft, _ = load_model(Path(a.draft))
ids = mx.array([int(x) for x in a.ids.split(",")])
tokens, from_draft = [], []
for tok, _lp, fd in speculative_generate_step(
    ids, model, draft, num_draft_tokens=a.num_draft_tokens, max_tokens=a.max_tokens, prefill_step_size=a.prefill_step
):
    tokens.append(int(tok))
    from_draft.append(bool(fd))
print(json.dumps({"tokens": tokens, "from_draft": from_draft}))

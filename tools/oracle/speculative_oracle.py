"""mlx-lm's speculative_generate_step (greedy) on token ids, for one or more target/draft pairs in
one process. Prints JSON {"tokens": [...], "from_draft": [...], "plain": [...]} for one pair, a
list of such objects for several; "plain" is mlx-lm's own non-speculative greedy generate_step
on the target (the reference both speculative outputs are compared with).

Usage: python speculative_oracle.py TARGET DRAFT [TARGET2 DRAFT2 ...] --ids 1,2,3 --max-tokens N --num-draft-tokens K
"""
import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.utils import load_model

p = argparse.ArgumentParser()
p.add_argument("models", nargs="+", metavar="TARGET DRAFT")
p.add_argument("--ids", required=True)
p.add_argument("--max-tokens", type=int, default=20)
p.add_argument("--num-draft-tokens", type=int, default=3)
p.add_argument("--prefill-step", type=int, default=2048)
a = p.parse_args()
if len(a.models) % 2:
    p.error("models come in TARGET DRAFT pairs")
ids = mx.array([int(x) for x in a.ids.split(",")])
out = []
for target, draft_dir in zip(a.models[::2], a.models[1::2]):
    model, _ = load_model(Path(target))
    draft, _ = load_model(Path(draft_dir))
    tokens, from_draft = [], []
    for tok, _lp, fd in speculative_generate_step(
        ids, model, draft, num_draft_tokens=a.num_draft_tokens, max_tokens=a.max_tokens, prefill_step_size=a.prefill_step
    ):
        tokens.append(int(tok))
        from_draft.append(bool(fd))
    plain = [int(t) for t, _ in generate_step(ids, model, max_tokens=a.max_tokens, prefill_step_size=a.prefill_step)]
    out.append({"tokens": tokens, "from_draft": from_draft, "plain": plain})
print(json.dumps(out[0] if len(out) == 1 else out))

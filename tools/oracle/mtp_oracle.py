"""mlx-vlm 0.7.10's Gemma 4 MTP speculative decoding (greedy) on token ids: the target loaded into
mlx-vlm's gemma4 LanguageModel (weights from mlx-lm's loader, which reads the tiny checkpoints),
the drafter through mlx-vlm's own load_drafter(kind="mtp"), then run_speculative_rounds as
mlx_vlm.generate runs them (prefill with return_hidden/return_shared_kv, first token from the
prefill logits, _mtp_rounds with its buffered sliding caches).

Prints JSON {"tokens": [...], "drafts": [[...] per round], "accepted": [...], "plain": [...]}:
"drafts" are the drafter's tokens of each round, "accepted" how many of them the target kept,
"plain" mlx-lm's own greedy generate_step tokens on the target.

Usage: python mtp_oracle.py TARGET DRAFTER --ids 1,2,3 --max-tokens N --num-draft-tokens K
"""
import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step
from mlx_lm.utils import load_model
from mlx_vlm.models.gemma4.config import TextConfig
from mlx_vlm.models.gemma4.language import LanguageModel
from mlx_vlm.speculative.drafters import load_drafter
from mlx_vlm.speculative.utils import run_speculative_rounds

p = argparse.ArgumentParser()
p.add_argument("target")
p.add_argument("drafter")
p.add_argument("--ids", required=True)
p.add_argument("--max-tokens", type=int, default=20)
p.add_argument("--num-draft-tokens", type=int, default=3)
a = p.parse_args()

ids = [int(x) for x in a.ids.split(",")]
ref, _ = load_model(Path(a.target))
cfg = json.loads((Path(a.target) / "config.json").read_text())
tc = dict(cfg.get("text_config", cfg))
if "text_config" in cfg:
    tc["vocab_size"] = cfg.get("vocab_size", tc.get("vocab_size"))
lm = LanguageModel(TextConfig.from_dict(tc))
src = dict(tree_flatten(getattr(ref, "language_model", ref).parameters()))
want = [k for k, _ in tree_flatten(lm.parameters())]
lm.load_weights([(k, src[k]) for k in want])
mx.eval(lm.parameters())

draft, kind = load_drafter(a.drafter, kind="mtp")
assert kind == "mtp", kind
rounds = []
orig = draft.draft_block


def record(*args, **kw):
    out = orig(*args, **kw)
    rounds.append([int(t) for t in out.reshape(-1).tolist()])
    return out


draft.draft_block = record
x = mx.array([ids])
cache = lm.make_cache()
out = lm(x, cache=cache, return_hidden=True, return_shared_kv=True)
logits = out.logits[:, -1, :]
first = mx.argmax(logits, axis=-1)
logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
tokens = []
for tok, _ in run_speculative_rounds(
    lm,
    draft,
    cache,
    x,
    first,
    logprobs,
    out,
    draft_kind="mtp",
    max_tokens=a.max_tokens,
    sampler=lambda z: mx.argmax(z, axis=-1),
    draft_block_size=a.num_draft_tokens + 1,
    sampler_is_greedy=True,
):
    tokens.append(int(tok))
accepted = [int(v) for v in draft.accept_lens]
plain = [int(t) for t, _ in generate_step(mx.array(ids), ref, max_tokens=a.max_tokens)]
print(json.dumps({"tokens": tokens, "drafts": rounds, "accepted": accepted, "plain": plain}))

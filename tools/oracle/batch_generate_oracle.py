"""mlx-lm's BatchGenerator (continuous batching, batched prefill) on token ids, greedy.

Prints JSON {"tokens": [[...], ...], "logprobs": [[...], ...]}: per prompt, every token it
produced (a stop token included) and the chosen tokens' log-probabilities.

Usage: python batch_generate_oracle.py DIR --prompts '[[1,2,3],[4,5]]' --max-tokens '[8,8]'
       [--eos 1,106] [--prefill-step N] [--prefill-batch N] [--completion-batch N]
"""
import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from mlx_lm.utils import load_model

p = argparse.ArgumentParser()
p.add_argument("dir")
p.add_argument("--prompts", required=True)
p.add_argument("--max-tokens", required=True)
p.add_argument("--eos", default="")
p.add_argument("--prefill-step", type=int, default=2048)
p.add_argument("--prefill-batch", type=int, default=8)
p.add_argument("--completion-batch", type=int, default=32)
a = p.parse_args()
model, _ = load_model(Path(a.dir))
prompts = json.loads(a.prompts)
max_tokens = json.loads(a.max_tokens)
eos = [[int(x)] for x in a.eos.split(",") if x]
gen = BatchGenerator(
    model,
    stop_tokens=eos or None,
    prefill_step_size=a.prefill_step,
    prefill_batch_size=a.prefill_batch,
    completion_batch_size=a.completion_batch,
)
uids = gen.insert(prompts, max_tokens)
tokens = {u: [] for u in uids}
lps = {u: [] for u in uids}
while responses := gen.next_generated():
    for r in responses:
        tokens[r.uid].append(int(r.token))
        lps[r.uid].append(float(r.logprobs[r.token].astype(mx.float32).item()))
gen.close()
print(json.dumps({"tokens": [tokens[u] for u in uids], "logprobs": [lps[u] for u in uids]}))

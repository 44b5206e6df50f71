"""mlx-lm's graph for one decode step (generate_step's _step: model call, last row, logprobs,
argmax) after a 65-token prefill, written with mx.export_to_dot. The twin of tools/oracle/graph.ts (decodeStepGraph).
   python tools/oracle/decode_graph.py MODEL_DIR OUT.dot"""
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import load_model

model, _ = load_model(Path(sys.argv[1]))
cache = model.make_cache()
prompt = mx.array([[5 + (i * 37) % 200 for i in range(65)]])
logits = model(prompt, cache=cache)[:, -1, :]
y = mx.argmax(logits - mx.logsumexp(logits, keepdims=True), axis=-1)
mx.eval(y, [c.state for c in cache])
logits = model(y[None], cache=cache)[:, -1, :]
logprobs = logits - mx.logsumexp(logits, keepdims=True)
y2 = mx.argmax(logprobs, axis=-1)
mx.export_to_dot(sys.argv[2], y2, logprobs)

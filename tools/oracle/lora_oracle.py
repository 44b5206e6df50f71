"""Make a random LoRA adapter for a checkpoint with mlx-lm's own tuner code, and its reference logits.

Usage: python lora_oracle.py MODEL_DIR ADAPTER_DIR OUT.safetensors --ids 1,2,3 [--layers 2] [--rank 4] [--scale 3.0]
Writes ADAPTER_DIR/adapter_config.json + adapters.safetensors (lora_b random, not zero) and
OUT.safetensors with "logits" of the prompt through mlx_lm.load(MODEL_DIR, adapter_path=ADAPTER_DIR).
"""
import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.tuner.utils import linear_to_lora_layers
from mlx_lm.utils import load, load_model

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("adapter")
p.add_argument("out")
p.add_argument("--ids", required=True)
p.add_argument("--layers", type=int, default=2)
p.add_argument("--rank", type=int, default=4)
p.add_argument("--scale", type=float, default=3.0)
a = p.parse_args()
cfg = {"fine_tune_type": "lora", "num_layers": a.layers, "lora_parameters": {"rank": a.rank, "scale": a.scale, "dropout": 0.0}}
model, _ = load_model(Path(a.model))
linear_to_lora_layers(model, a.layers, cfg["lora_parameters"])
mx.random.seed(3)
adapters = {}
for name, w in tree_flatten(model.trainable_parameters()):
    if name.endswith("lora_a") or name.endswith("lora_b"):
        adapters[name] = (mx.random.normal(w.shape) * 0.05).astype(mx.bfloat16)
Path(a.adapter).mkdir(parents=True, exist_ok=True)
mx.save_safetensors(str(Path(a.adapter) / "adapters.safetensors"), adapters)
(Path(a.adapter) / "adapter_config.json").write_text(json.dumps(cfg))
m2, _ = load(a.model, adapter_path=a.adapter)
ids = mx.array([[int(x) for x in a.ids.split(",")]])
logits = m2(ids)
mx.eval(logits)
mx.save_safetensors(a.out, {"logits": logits})

"""Reference logits and greedy tokens of mlx-vlm's (or mlx-lm's) Gemma 4 language model, for many
checkpoints in one process (tools/make-tiny-model/make_gemma4_published.py writes them).

Usage: python gemma4_published_oracle.py JOBS.json
  JOBS.json: {"ids": [...], "steps": N, "jobs": [{"dir": ..., "ref": "vlm" | "lm", "out": ...}]}

ref "vlm": mlx_vlm.utils.load_model(dir) (its sanitize, quantization and strict load), then the
language model alone, model.language_model(ids, cache=language_model.make_cache()): the whole
prompt in one call, then one token per call. ref "lm": mlx_lm.utils.load_model(dir), the same
loop through the model. Each job's out (safetensors) gets "logits" [steps + 1, vocab] (the last
prompt position, then one row per decode step, in the model's dtype) and "tokens" [steps].
Prints a JSON list: {"dir", "ref", "ok": true} or {"ok": false, "error": "..."} per job.

A job {"ref": "manifest", "config": {...config.json...}} instead builds mlx-vlm's Model for that
config (as mlx_vlm.utils.load_model builds it; parameters stay lazy, nothing is allocated) and
returns "params": {name: shape} of its language model (names as mlx-vlm's module tree).
"""
import json
import sys
from pathlib import Path

import mlx.core as mx


def run_vlm(d: Path, ids, steps):
    from mlx_vlm.utils import load_model

    model = load_model(d)
    lm = model.language_model
    cache = lm.make_cache()

    def fwd(x):
        return lm(mx.array([x]), cache=cache).logits

    return fwd


def run_lm(d: Path, ids, steps):
    from mlx_lm.utils import load_model

    model, _ = load_model(d)
    cache = model.make_cache()

    def fwd(x):
        return model(mx.array([x]), cache=cache)

    return fwd


def manifest(config: dict) -> dict:
    import copy

    from mlx.utils import tree_flatten
    from mlx_vlm.utils import get_model_and_args, update_module_configs

    config = copy.deepcopy(config)
    model_class, _ = get_model_and_args(config=config)
    for k in ("text_config", "vision_config", "audio_config"):
        config.setdefault(k, {})
    mc = model_class.ModelConfig.from_dict(config)
    mc = update_module_configs(mc, model_class, config, ["text", "vision", "perceiver", "projector", "audio"])
    model = model_class.Model(mc)
    return {f"language_model.{k}": list(v.shape) for k, v in tree_flatten(model.language_model.parameters())}


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    ids, steps = spec["ids"], spec["steps"]
    results = []
    for job in spec["jobs"]:
        try:
            if job["ref"] == "manifest":
                results.append({"ref": "manifest", "ok": True, "params": manifest(job["config"])})
                continue
            fwd = (run_vlm if job["ref"] == "vlm" else run_lm)(Path(job["dir"]), ids, steps)
            logits = fwd(ids)
            mx.eval(logits)
            rows = [logits[0, -1]]
            tokens = []
            for _ in range(steps):
                tok = mx.argmax(logits[0, -1], axis=-1).item()
                tokens.append(tok)
                logits = fwd([tok])
                mx.eval(logits)
                rows.append(logits[0, -1])
            out = {"logits": mx.stack(rows), "tokens": mx.array(tokens, dtype=mx.int32)}
            mx.eval(out)
            mx.save_safetensors(job["out"], out)
            results.append({"dir": job["dir"], "ref": job["ref"], "ok": True})
        except Exception as e:  # reported per job: the test names the checkpoint
            results.append({"dir": job["dir"], "ref": job["ref"], "ok": False, "error": f"{type(e).__name__}: {e}"})
    print(json.dumps(results))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Reference answers from mlx-lm / transformers for @mlx-bun/models tests. Prints one JSON object.

  gemma4_reference.py args DIR              ModelArgs fields + per-layer facts mlx-lm derives
  gemma4_reference.py args-json FILE        the same for a bare config.json (no weights needed)
  gemma4_reference.py args-many IN.json     [{"dir": DIR} | {"config": {...}}] -> [args report], one process
  gemma4_reference.py params-many IN.json   [DIR] -> [params]; sanitize-many likewise
  gemma4_reference.py params DIR            model parameters after mlx_lm.utils.load_model: name -> [shape, dtype]
  gemma4_reference.py sanitize DIR          checkpoint names -> names after Model.sanitize (and shapes)
  gemma4_reference.py tokenize DIR IN.json  {"encode": [...strings], "decode": [...id lists]} via transformers + tokenizers
  gemma4_reference.py chat DIR IN.json      [{"messages", "kwargs"}] -> apply_chat_template(tokenize=False) and token ids
"""

import contextlib
import io
import json
import sys
from pathlib import Path


def _dtype(d):
    return str(d).replace("mlx.core.", "")


def model_args_report(config: dict) -> dict:
    import mlx.core as mx
    from mlx_lm.models import gemma4_text
    from mlx_lm.models.rope_utils import ProportionalRoPE
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    args = args_class.from_dict(config)
    if config["model_type"] == "gemma4":
        targs = gemma4_text.ModelArgs.from_dict(args.text_config)
    else:
        targs = args
    fields = {k: getattr(targs, k) for k in targs.__dataclass_fields__}
    # Instantiating the model gives the per-layer facts exactly as mlx-lm derives them.
    model = gemma4_text.Model(targs)
    layers = []
    for i, layer in enumerate(model.model.layers):
        a = layer.self_attn
        rope = a.rope
        r = {"class": type(rope).__name__}
        if isinstance(rope, ProportionalRoPE):
            f = rope._freqs
            r.update(dims=rope.dims, traditional=rope.traditional, n_finite=int(mx.sum(mx.isfinite(f)).item()),
                     freqs=[float(x) for x in f.tolist() if x != float("inf")])
        else:
            r.update(dims=rope.dims, traditional=rope.traditional, base=rope.base, scale=rope.scale)
        layers.append({
            "type": layer.layer_type,
            "head_dim": a.head_dim,
            "n_heads": a.n_heads,
            "n_kv_heads": a.n_kv_heads,
            "has_kv": a.has_kv,
            "use_k_eq_v": a.use_k_eq_v,
            "kv_source": model.model.previous_kvs[i],
            "mlp_intermediate": layer.mlp.gate_proj.weight.shape[0],
            "rope": r,
        })
    return {"fields": fields, "layers": layers, "window": model.model.window_size}


def cmd_args(path: str) -> dict:
    from mlx_lm.utils import load_config

    return model_args_report(load_config(Path(path)))


def cmd_args_json(file: str) -> dict:
    return model_args_report(json.loads(Path(file).read_text()))


def cmd_args_many(infile: str) -> list:
    """IN.json: a list of {"dir": path} or {"config": {...}} -> a list of args reports, in one process."""
    from mlx_lm.utils import load_config

    out = []
    for item in json.loads(Path(infile).read_text()):
        cfg = load_config(Path(item["dir"])) if "dir" in item else item["config"]
        out.append(model_args_report(cfg))
    return out


def cmd_params_many(infile: str) -> list:
    return [cmd_params(d) for d in json.loads(Path(infile).read_text())]


def cmd_sanitize_many(infile: str) -> list:
    return [cmd_sanitize(d) for d in json.loads(Path(infile).read_text())]


def cmd_params(path: str) -> dict:
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(path), lazy=True)
    return {k: [list(v.shape), _dtype(v.dtype)] for k, v in tree_flatten(model.parameters())}


def cmd_sanitize(path: str) -> dict:
    import glob

    import mlx.core as mx
    from mlx_lm.utils import _get_classes, load_config

    config = load_config(Path(path))
    weights = {}
    for wf in glob.glob(str(Path(path) / "model*.safetensors")):
        weights.update(mx.load(wf))
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    out = model.sanitize(weights)
    return {k: [list(v.shape), _dtype(v.dtype)] for k, v in out.items()}


def cmd_tokenize(path: str, infile: str) -> dict:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    spec = json.loads(Path(infile).read_text())
    hf = AutoTokenizer.from_pretrained(path)
    raw = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
    enc = []
    for s in spec.get("encode", []):
        ids = hf.encode(s)
        enc.append({
            "ids": ids,
            "ids_no_special": hf.encode(s, add_special_tokens=False),
            "raw_ids": raw.encode(s).ids,
            "decode": hf.decode(ids),
            "decode_skip": hf.decode(ids, skip_special_tokens=True),
        })
    dec = [{"decode": hf.decode(ids), "raw": raw.decode(ids, skip_special_tokens=False)} for ids in spec.get("decode", [])]
    return {"encode": enc, "decode": dec, "eos_token_id": hf.eos_token_id, "bos_token_id": hf.bos_token_id, "len": len(hf)}


def cmd_chat(path: str, infile: str) -> dict:
    from transformers import AutoTokenizer

    cases = json.loads(Path(infile).read_text())
    tok = AutoTokenizer.from_pretrained(path)
    out = []
    for c in cases:
        kw = dict(c.get("kwargs", {}))
        try:
            text = tok.apply_chat_template(c["messages"], tokenize=False, **kw)
            ids = tok.apply_chat_template(c["messages"], tokenize=True, return_dict=False, **kw)
            out.append({"text": text, "ids": list(ids)})
        except Exception as e:  # noqa: BLE001
            out.append({"error": f"{type(e).__name__}: {e}"})
    return {"results": out}


def main() -> int:
    cmd, *rest = sys.argv[1:]
    fn = {
        "args": cmd_args,
        "args-json": cmd_args_json,
        "args-many": cmd_args_many,
        "params-many": cmd_params_many,
        "sanitize-many": cmd_sanitize_many,
        "params": cmd_params,
        "sanitize": cmd_sanitize,
        "tokenize": cmd_tokenize,
        "chat": cmd_chat,
    }[cmd]
    with contextlib.redirect_stdout(io.StringIO()):
        result = fn(*rest)
    sys.stdout.write(json.dumps(result, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

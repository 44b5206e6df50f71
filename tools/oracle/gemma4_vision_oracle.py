#!/usr/bin/env python3
"""mlx-vlm 0.7.10 as the reference for Gemma 4 images (issue 18).

    gemma4_vision_oracle.py pixels  CKPT OUT.safetensors IMAGE...
        mlx-vlm's image processor (processing_gemma4.Gemma4ImageProcessor as loaded from CKPT's
        processor_config.json, images opened by mlx_vlm.utils.load_image): pixel_values per image
        ("pixels.<i>", float32 [3, H, W]) and soft-token counts (metadata "soft_tokens"). For a
        gemma4_unified checkpoint (Gemma4UnifiedImageProcessor): the model patches "patches.<i>"
        (float32 [max_soft_tokens, 3·48²], zero padded) and "positions.<i>" (int32
        [max_soft_tokens, 2], (x, y), -1 padded) as well.
    gemma4_vision_oracle.py run     CKPT OUT.safetensors REQUEST.json
        REQUEST: {"messages": [...chat messages, image parts {"type": "image"}...],
                  "images": [paths], "steps": N}
        The prompt as mlx-vlm builds it (processor.apply_chat_template + processor(...)):
        "input_ids" [1, L]; the soft tokens (model.encode_image, "features"); the prefill logits of
        the last position ("prefill_logits", [vocab]) with mm_token_type_ids as the processor gives
        them; then N greedy decode steps through the language model's cache ("tokens",
        "step_logits" [N, vocab]).
    gemma4_vision_oracle.py generate CKPT REQUEST.json
        mlx_vlm.generate's stream_generate (greedy, temperature 0) on the prompt of REQUEST's
        messages (processor.apply_chat_template) with its images and "max_tokens": prints JSON
        {"prompt": text, "tokens": [...]} (the generated ids, as mlx_vlm.generate runs them).
"""

from __future__ import annotations

import json
import sys
import warnings

warnings.filterwarnings("ignore")


def load(ckpt):
    from mlx_vlm.utils import load as vlm_load

    return vlm_load(ckpt)


def pixels(ckpt, out, images):
    import mlx.core as mx
    import numpy as np
    from mlx_vlm.utils import load_image
    from pathlib import Path

    from mlx_vlm.models.gemma4.processing_gemma4 import Gemma4ImageProcessor
    from mlx_vlm.models.gemma4_unified.processing_gemma4_unified import Gemma4UnifiedImageProcessor

    # The image_processor block as Gemma4Processor.from_pretrained extracts it (no tokenizer needed).
    cfg = json.loads((Path(ckpt) / "processor_config.json").read_text())
    ip = dict(cfg.get("image_processor", {}))
    unified = ip.pop("image_processor_type", None) == "Gemma4UnifiedImageProcessor"
    image_processor = (Gemma4UnifiedImageProcessor if unified else Gemma4ImageProcessor)(**ip)
    arrays, counts = {}, []
    for i, path in enumerate(images):
        data, n = image_processor([load_image(path)])
        if unified:
            arrays[f"patches.{i}"] = mx.array(np.asarray(data["pixel_values"][0], dtype=np.float32))
            arrays[f"positions.{i}"] = mx.array(np.asarray(data["image_position_ids"][0], dtype=np.int32))
            counts.append(int(n[0]))
            continue
        pv = data["pixel_values"]
        pv = pv[0] if isinstance(pv, list) else pv[0]
        arrays[f"pixels.{i}"] = mx.array(np.asarray(pv, dtype=np.float32))
        counts.append(int(n[0]))
    mx.save_safetensors(out, arrays, metadata={"soft_tokens": json.dumps(counts)})


def run(ckpt, out, request_path):
    import mlx.core as mx
    from mlx_vlm.utils import load_image

    req = json.loads(open(request_path).read())
    model, processor = load(ckpt)
    prompt = processor.apply_chat_template(req["messages"], add_generation_prompt=True)
    images = [load_image(p) for p in req.get("images", [])]
    # mlx_vlm.generate's prepare_inputs: add_special_tokens = should_add_special_tokens(...), False
    # for gemma4 with a chat template (the template writes <bos>).
    inputs = processor(images=images or None, text=prompt, return_tensors="mlx", add_special_tokens=False)
    ids = inputs["input_ids"]
    pv = inputs.get("pixel_values")
    kwargs = {}
    if "mm_token_type_ids" in inputs:
        kwargs["mm_token_type_ids"] = inputs["mm_token_type_ids"]
    enc = {}
    if "image_position_ids" in inputs:  # gemma4_unified: the padded patches' positions
        enc["image_position_ids"] = kwargs["image_position_ids"] = inputs["image_position_ids"]
    result = {"input_ids": ids.astype(mx.int32)}
    if pv is not None:
        result["features"] = model.encode_image(pv if not isinstance(pv, list) else pv, **enc)
    cache = model.make_cache()
    if "image_position_ids" in inputs:
        # gemma4_unified: its Model.__call__ passes no mm_token_type_ids to the language model
        # (causal image tokens); mlx_vlm.generate runs get_input_embeddings, then the language
        # model on the whole prompt with the processor's mm_token_type_ids (the "vision"
        # bidirectional overlay, chunked prefill off). This is generate's path.
        emb = model.get_input_embeddings(ids, pv, **kwargs)
        logits = model.language_model(ids, inputs_embeds=emb.inputs_embeds, cache=cache, mm_token_type_ids=kwargs.get("mm_token_type_ids"))
    else:
        logits = model(ids, pixel_values=pv, cache=cache, **kwargs)
    logits = getattr(logits, "logits", logits)
    result["prefill_logits"] = logits[0, -1]
    toks, steps = [], []
    y = mx.argmax(logits[0, -1])
    for _ in range(int(req.get("steps", 0))):
        toks.append(int(y.item()))
        out_l = model.language_model(mx.array([[toks[-1]]]), cache=cache)
        lg = getattr(out_l, "logits", out_l)[0, -1]
        steps.append(lg)
        y = mx.argmax(lg)
    result["tokens"] = mx.array(toks, dtype=mx.int32)
    if steps:
        result["step_logits"] = mx.stack(steps)
    mx.eval(result)
    mx.save_safetensors(out, result, metadata={"prompt": prompt})


def generate(ckpt, request_path):
    from mlx_vlm.generate import stream_generate

    req = json.loads(open(request_path).read())
    model, processor = load(ckpt)
    prompt = processor.apply_chat_template(req["messages"], add_generation_prompt=True)
    images = req.get("images") or None
    toks = []
    for r in stream_generate(model, processor, prompt, image=images, max_tokens=int(req["max_tokens"]), temperature=0.0):
        if r.token is not None:
            toks.append(int(r.token))
    print(json.dumps({"prompt": prompt, "tokens": toks}))


def main():
    cmd = sys.argv[1]
    if cmd == "pixels":
        pixels(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif cmd == "generate":
        generate(sys.argv[2], sys.argv[3])
    elif cmd == "run":
        run(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()

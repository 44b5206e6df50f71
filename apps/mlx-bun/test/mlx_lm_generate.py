#!/usr/bin/env python3
"""Greedy mlx-lm generation for the app's tests, built as mlx_lm.generate's main() builds its
prompt (chat template with an optional system prompt unless ignored, then encode without a second
<bos>), or from given prompt ids. One process for many cases.

  python mlx_lm_generate.py MODEL_DIR CASES.json
  CASES.json: [{"prompt": "hi", "max_tokens": 8, "ignore_chat_template": false, "system_prompt": null}
               | {"prompt_ids": [2, 5, ...], "max_tokens": 8}]
Prints a JSON list: [{"prompt_ids": [...], "generated_ids": [...], "text": "...", "finish_reason": "..."}].
"""

import json
import sys

from mlx_lm import load
from mlx_lm.generate import stream_generate
from mlx_lm.sample_utils import make_sampler


def main() -> int:
    model_dir, cases_file = sys.argv[1], sys.argv[2]
    model, tokenizer = load(model_dir)
    cases = json.load(open(cases_file))
    out = []
    for c in cases:
        if "prompt_ids" in c:
            prompt = list(c["prompt_ids"])
        else:
            text = c["prompt"]
            use_chat_template = not c.get("ignore_chat_template") and tokenizer.has_chat_template
            if use_chat_template:
                messages = []
                if c.get("system_prompt") is not None:
                    messages.append({"role": "system", "content": c["system_prompt"]})
                messages.append({"role": "user", "content": text})
                text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            prompt = tokenizer.encode(text, add_special_tokens=not use_chat_template)
        tokens, pieces, finish = [], [], None
        for r in stream_generate(model, tokenizer, prompt, max_tokens=c["max_tokens"], sampler=make_sampler(0.0)):
            tokens.append(int(r.token))
            pieces.append(r.text)
            finish = r.finish_reason
        out.append({"prompt_ids": prompt, "generated_ids": tokens, "text": "".join(pieces), "finish_reason": finish})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

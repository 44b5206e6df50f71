#!/usr/bin/env python3
"""Write a seeded, random-weight, tiny Gemma 4 checkpoint directory that mlx-lm loads and runs.

Variants (every architecture switch that mlx_lm/models/gemma4_text.py has):

  small  like gemma-4 E2B/E4B: per-layer embeddings (hidden_size_per_layer_input),
         KV-sharing layers (num_kv_shared_layers), double-wide MLP on shared layers,
         separate k/v projections, tied embeddings.
  dense  like the dense 31B: attention_k_eq_v on full-attention layers with
         num_global_key_value_heads, no PLE, no KV sharing; untied lm_head (a coverage
         choice: real Gemma 4 checkpoints tie), so it defaults to the text-only form.
  moe    like 26B-A4B: dense MLP plus a routed expert block (enable_moe_block,
         num_experts, top_k_experts, moe_intermediate_size), attention_k_eq_v.

Files written: config.json (multimodal wrapper {"model_type": "gemma4", "text_config": {...}}
by default, or the text-only {"model_type": "gemma4_text", ...} with --form text),
generation_config.json, model.safetensors (or --shards N: model-0000i-of-0000N.safetensors +
model.safetensors.index.json), tokenizer.json, tokenizer_config.json, chat_template.jinja.

Weights are bfloat16 in Hugging Face naming (model.language_model.*, fused
experts.gate_up_proj, K/V projections still present on KV-shared layers, a stub vision tower)
the way google/gemma-4-* ship, or --naming mlx (mlx-lm's own module names, as mlx-community
checkpoints). --quant 4bit / mixed quantizes through mlx-lm's own convert path
(mlx_lm.convert.convert: load, quantize_model with the model's quant_predicate, save), so
config.json's "quantization" block is exactly what mlx-lm writes; MoE routers get mlx-lm's
per-module override {"group_size": 64, "bits": 8}; --quant mixed uses the mixed_4_6 recipe,
which records a per-module entry for every quantized layer. --dtype float32 (or float16) changes
the floating dtype; MLX's CPU backend runs the bf16 MoE expert matmul (gather_mm) in float32 only,
so the suite has a float32 MoE checkpoint besides the bf16 one.

  python make_tiny_model.py --variant small --out /tmp/tiny-small
  python make_tiny_model.py --variant moe --quant 4bit --out /tmp/tiny-moe-4bit
  python make_tiny_model.py --suite /tmp/tiny      # the standard set used by the tests
  python make_tiny_model.py --variant small --out /tmp/x --check   # then generate 20 tokens
  python make_tiny_model.py --generate /tmp/x /tmp/y               # mlx-lm load + 20 greedy tokens, JSON
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import shutil
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np

# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------

# Gemma 4's special tokens (tokenizer_config.json of google/gemma-4-*): <pad>/<eos>/<bos>/<unk>/
# <mask> keep Gemma's ids 0-4; the rest follow in this order (ids differ from the real vocab,
# which has e.g. <|tool_response>=50, <|turn>=105, <turn|>=106).
SPECIAL_TOKENS = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<mask>",
    "<|turn>",
    "<turn|>",
    "<|think|>",
    "<|channel>",
    "<channel|>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
    "<|image>",
    "<image|>",
    "<|image|>",
    "<|audio>",
    "<audio|>",
    "<|audio|>",
    "<|video|>",
]
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
VOCAB_SIZE = 512

# Fixed training text for the BPE merges: English, code-ish text, a little accented Latin,
# Greek and CJK so some multi-byte characters are whole tokens; emoji stay byte-fallback.
TRAIN_TEXT = """\
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.
Hello world! Hello there, how are you today? I am fine, thank you.
You are a helpful assistant. Answer the question as well as you can.
What is the capital of France? The capital of France is Paris.
Write a short poem about the sea and the sky and the stars at night.
def add(a, b):
    return a + b
for i in range(10):
    print(i, "hello", {"key": "value"})
The model thinks before it answers, then calls a tool to get the weather.
Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e na\u00efve fa\u00e7ade \u00fcber Stra\u00dfe se\u00f1or.
\u03b1\u03b2\u03b3 \u03b4\u03b5\u03b6 \u03ba\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1 \u03ba\u03cc\u03c3\u03bc\u03b5.
\u4f60\u597d\u4e16\u754c \u65e5\u672c\u8a9e \u4e2d\u6587 \u6c49\u5b57 \u3053\u3093\u306b\u3061\u306f.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159.
Punctuation: ( ) [ ] { } < > : ; , . ! ? ' " - _ = + * / \\ | @ # $ % ^ & ~ `.
The weather in London is cloudy with a chance of rain later in the day.
She sells sea shells by the sea shore, and the shells she sells are sea shells.
"""

CHAT_TEMPLATE = r"""{#- Tiny Gemma 4 style chat template: a subset of the official one with its turn, thinking and tool markup (tool declarations are simplified). -#}
{%- macro format_argument(argument) -%}
    {%- if argument is string -%}
        {{- '<|"|>' + argument + '<|"|>' -}}
    {%- elif argument is boolean -%}
        {{- 'true' if argument else 'false' -}}
    {%- elif argument is mapping -%}
        {{- '{' -}}
        {%- set ns = namespace(first=true) -%}
        {%- for key, value in argument | dictsort -%}
            {%- if not ns.first %},{% endif -%}
            {%- set ns.first = false -%}
            {{- key }}:{{ format_argument(value) -}}
        {%- endfor -%}
        {{- '}' -}}
    {%- elif argument is sequence -%}
        {{- '[' -}}
        {%- for item in argument -%}
            {{- format_argument(item) -}}
            {%- if not loop.last %},{% endif -%}
        {%- endfor -%}
        {{- ']' -}}
    {%- else -%}
        {{- argument -}}
    {%- endif -%}
{%- endmacro -%}
{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content | trim -}}
    {%- else -%}
        {%- for item in content -%}
            {%- if item['type'] == 'text' -%}
                {{- item['text'] | trim -}}
            {%- elif item['type'] == 'image' -%}
                {{- '<|image|>' -}}
            {%- elif item['type'] == 'audio' -%}
                {{- '<|audio|>' -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- set loop_messages = messages -%}
{%- if (enable_thinking is defined and enable_thinking) or tools or messages[0]['role'] in ['system', 'developer'] -%}
    {{- '<|turn>system\n' -}}
    {%- if enable_thinking is defined and enable_thinking -%}
        {{- '<|think|>\n' -}}
    {%- endif -%}
    {%- if messages[0]['role'] in ['system', 'developer'] -%}
        {{- render_content(messages[0]['content']) -}}
        {%- set loop_messages = messages[1:] -%}
    {%- endif -%}
    {%- if tools -%}
        {%- for tool in tools -%}
            {{- '<|tool>declaration:' + tool['function']['name'] -}}
            {{- format_argument({'description': tool['function']['description'] | default(''), 'parameters': tool['function']['parameters'] | default({})}) -}}
            {{- '<tool|>' -}}
        {%- endfor -%}
    {%- endif -%}
    {{- '<turn|>\n' -}}
{%- endif -%}
{%- set ns = namespace(prev='') -%}
{%- for message in loop_messages -%}
    {%- if message['role'] != 'tool' -%}
        {#- Tool results are written inline, after the call, in the model turn that made it (below). -#}
        {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
        {%- if not (role == 'model' and ns.prev == 'tool_response') -%}
            {{- '<|turn>' + role + '\n' -}}
        {%- endif -%}
        {%- set ns.prev = '' -%}
        {%- set outer = loop.index0 -%}
        {%- set nr = namespace(stop=false, any=false) -%}
        {%- if message['tool_calls'] is defined and message['tool_calls'] -%}
            {%- for tool_call in message['tool_calls'] -%}
                {{- '<|tool_call>call:' + tool_call['function']['name'] + format_argument(tool_call['function']['arguments']) + '<tool_call|>' -}}
            {%- endfor -%}
            {%- for k in range(outer + 1, loop_messages | length) -%}
                {%- if not nr.stop -%}
                    {%- if loop_messages[k]['role'] == 'tool' -%}
                        {{- '<|tool_response>response:' + (loop_messages[k]['name'] | default('tool')) + '{value:' + format_argument(loop_messages[k]['content']) + '}<tool_response|>' -}}
                        {%- set nr.any = true -%}
                    {%- else -%}
                        {%- set nr.stop = true -%}
                    {%- endif -%}
                {%- endif -%}
            {%- endfor -%}
        {%- endif -%}
        {%- if message['content'] is defined and message['content'] is not none -%}
            {{- render_content(message['content']) -}}
        {%- endif -%}
        {%- if nr.any -%}
            {#- The model goes on in the same turn once it has the results. -#}
            {%- set ns.prev = 'tool_response' -%}
        {%- else -%}
            {{- '<turn|>\n' -}}
        {%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt and ns.prev != 'tool_response' -%}
    {{- '<|turn>model\n' -}}
    {%- if not (enable_thinking is defined and enable_thinking) -%}
        {{- '<|channel>thought\n<channel|>' -}}
    {%- endif -%}
{%- endif -%}
"""


def build_tokenizer_json() -> dict:
    """A Gemma-style SentencePiece-BPE tokenizer.json: byte fallback, ' ' -> '▁', no dummy prefix."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
    from tokenizers.models import BPE

    n_learned = VOCAB_SIZE - len(SPECIAL_TOKENS) - len(BYTE_TOKENS)
    tok = Tokenizer(BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    # Training only: keep merges inside '▁word' units.
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="\u2581", behavior="merged_with_next")
    trainer = trainers.BpeTrainer(
        vocab_size=n_learned,
        special_tokens=[],
        min_frequency=2,
        show_progress=False,
        initial_alphabet=["\n", "\u2581"],
    )
    tok.train_from_iterator([TRAIN_TEXT] * 3, trainer=trainer)
    learned = json.loads(tok.to_str())["model"]
    learned_vocab = sorted(learned["vocab"].items(), key=lambda kv: kv[1])

    vocab: dict[str, int] = {}
    for t in SPECIAL_TOKENS + BYTE_TOKENS:
        vocab[t] = len(vocab)
    for t, _ in learned_vocab:
        if t not in vocab:
            vocab[t] = len(vocab)
    assert len(vocab) <= VOCAB_SIZE, len(vocab)
    # Pad with unused reserved tokens like Gemma's <unusedN>, so the vocab is exactly VOCAB_SIZE.
    i = 0
    while len(vocab) < VOCAB_SIZE:
        vocab[f"<unused{i}>"] = len(vocab)
        i += 1

    final = Tokenizer(BPE(vocab=vocab, merges=[tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]],
                          unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    final.normalizer = normalizers.Replace(" ", "\u2581")
    final.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    final.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    final.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    from tokenizers import AddedToken

    final.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    out = json.loads(final.to_str())
    # Added tokens must keep the ids of the vocab.
    for a in out["added_tokens"]:
        assert a["id"] == vocab[a["content"]], a
    return out


def tokenizer_config(with_template: bool) -> dict:
    cfg = {
        "audio_token": "<|audio|>",
        "backend": "tokenizers",
        "boa_token": "<|audio>",
        "boi_token": "<|image>",
        "bos_token": "<bos>",
        "eoa_token": "<audio|>",
        "eoc_token": "<channel|>",
        "eoi_token": "<image|>",
        "eos_token": "<eos>",
        "eot_token": "<turn|>",
        "escape_token": '<|"|>',
        "etc_token": "<tool_call|>",
        "etd_token": "<tool|>",
        "etr_token": "<tool_response|>",
        "extra_special_tokens": ["<|video|>"],
        "image_token": "<|image|>",
        "mask_token": "<mask>",
        "model_max_length": 131072,
        "model_specific_special_tokens": {
            "audio_token": "<|audio|>",
            "boa_token": "<|audio>",
            "boi_token": "<|image>",
            "eoa_token": "<audio|>",
            "eoc_token": "<channel|>",
            "eoi_token": "<image|>",
            "eot_token": "<turn|>",
            "escape_token": '<|"|>',
            "etc_token": "<tool_call|>",
            "etd_token": "<tool|>",
            "etr_token": "<tool_response|>",
            "image_token": "<|image|>",
            "soc_token": "<|channel>",
            "sot_token": "<|turn>",
            "stc_token": "<|tool_call>",
            "std_token": "<|tool>",
            "str_token": "<|tool_response>",
            "think_token": "<|think|>",
        },
        "pad_token": "<pad>",
        "padding_side": "left",
        "soc_token": "<|channel>",
        "sot_token": "<|turn>",
        "stc_token": "<|tool_call>",
        "std_token": "<|tool>",
        "str_token": "<|tool_response>",
        "think_token": "<|think|>",
        "tokenizer_class": "GemmaTokenizer",
        "unk_token": "<unk>",
    }
    if with_template:
        cfg["chat_template"] = CHAT_TEMPLATE
    return cfg


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------

ROPE = {
    "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
    "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
}


DTYPES = ("bfloat16", "float16", "float32")


def text_config(variant: str, dtype: str = "bfloat16", overrides: dict | None = None) -> dict:
    S, F = "sliding_attention", "full_attention"
    base = {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attention_k_eq_v": False,
        "bos_token_id": 2,
        "dtype": dtype,
        "enable_moe_block": False,
        "eos_token_id": 1,
        "final_logit_softcapping": 30.0,
        "global_head_dim": 64,
        "head_dim": 32,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 64,
        "hidden_size_per_layer_input": 0,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "max_position_embeddings": 4096,
        "model_type": "gemma4_text",
        "moe_intermediate_size": None,
        "num_attention_heads": 2,
        "num_experts": None,
        "num_global_key_value_heads": None,
        "num_key_value_heads": 1,
        "num_kv_shared_layers": 0,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-06,
        "rope_parameters": copy.deepcopy(ROPE),
        "sliding_window": 8,
        "tie_word_embeddings": True,
        "top_k_experts": None,
        "use_bidirectional_attention": None,
        "use_cache": True,
        "use_double_wide_mlp": False,
        "vocab_size": VOCAB_SIZE,
        "vocab_size_per_layer_input": VOCAB_SIZE,
    }
    if variant == "small":
        base.update(
            num_hidden_layers=6,
            layer_types=[S, S, F, S, S, F],
            hidden_size_per_layer_input=16,
            num_kv_shared_layers=2,
            use_double_wide_mlp=True,
        )
    elif variant == "dense":
        base.update(
            num_hidden_layers=4,
            layer_types=[S, S, S, F],
            attention_k_eq_v=True,
            num_key_value_heads=2,
            num_global_key_value_heads=1,
            tie_word_embeddings=False,
        )
    elif variant == "moe":
        base.update(
            num_hidden_layers=4,
            layer_types=[S, F, S, F],
            attention_k_eq_v=True,
            num_global_key_value_heads=1,
            enable_moe_block=True,
            num_experts=4,
            top_k_experts=2,
            moe_intermediate_size=64,
        )
    else:
        raise SystemExit(f"unknown variant {variant!r} (small, dense, moe)")
    base.update(overrides or {})
    return dict(sorted(base.items()))


def model_config(variant: str, form: str, dtype: str = "bfloat16", overrides: dict | None = None) -> dict:
    tc = text_config(variant, dtype, overrides)
    if form == "text":
        cfg = dict(tc)
        cfg["architectures"] = ["Gemma4ForCausalLM"]
        cfg["transformers_version"] = "5.24.0"
        return dict(sorted(cfg.items()))
    return {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "audio_token_id": None,
        "boa_token_id": None,
        "boi_token_id": SPECIAL_TOKENS.index("<|image>"),
        "dtype": dtype,
        "eoa_token_index": None,
        "eoi_token_id": SPECIAL_TOKENS.index("<image|>"),
        "eos_token_id": [SPECIAL_TOKENS.index("<eos>"), SPECIAL_TOKENS.index("<turn|>")],
        "image_token_id": SPECIAL_TOKENS.index("<|image|>"),
        "initializer_range": 0.02,
        "model_type": "gemma4",
        "text_config": tc,
        "tie_word_embeddings": tc["tie_word_embeddings"],
        "transformers_version": "5.24.0",
        "video_token_id": SPECIAL_TOKENS.index("<|video|>"),
        # mlx-lm's gemma4.ModelArgs overwrites text_config.vocab_size with this (default 262144).
        "vocab_size": VOCAB_SIZE,
    }


def generation_config() -> dict:
    ids = [SPECIAL_TOKENS.index(t) for t in ("<eos>", "<turn|>", "<|tool_response>")]
    return {
        "bos_token_id": 2,
        "do_sample": True,
        "eos_token_id": ids,
        "pad_token_id": 0,
        "temperature": 1.0,
        "top_k": 64,
        "top_p": 0.95,
        "transformers_version": "5.24.0",
    }


# ---------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------


def init_value(name: str, shape: tuple, seed: int) -> np.ndarray:
    """Deterministic per-tensor values: independent of tensor order and of MLX's own RNG."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    leaf = name.rsplit(".", 1)[-1]
    if "norm" in name or leaf in ("scale", "per_expert_scale"):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if leaf == "layer_scalar":
        return rng.uniform(0.8, 1.2, shape).astype(np.float32)
    fan_in = shape[-1] if shape else 1
    # Projections at twice the 1/sqrt(fan_in) scale: with it, greedy decoding of the random model
    # gives varied tokens instead of one repeated token (a better oracle for a port).
    gain = 1.0 if "embed_tokens" in name else 2.0
    return (gain * rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)


def build_mlx_weights(config: dict, seed: int, dtype: str = "bfloat16") -> dict:
    """mlx-lm's parameter names and shapes for this config, filled with seeded values."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(copy.deepcopy(config)))
    out = {}
    for name, p in tree_flatten(model.parameters()):
        out[name] = mx.array(init_value(name, tuple(p.shape), seed)).astype(getattr(mx, dtype))
    mx.eval(out)
    return out


def to_hf_names(weights: dict, config: dict, seed: int, vision_stub: bool, dtype: str = "bfloat16") -> dict:
    """Reverse of mlx-lm's gemma4 sanitize: the names transformers' Gemma4 classes save."""
    import mlx.core as mx

    wrapper = config["model_type"] == "gemma4"
    tc = config["text_config"] if wrapper else config
    n_layers = tc["num_hidden_layers"]
    first_shared = n_layers - tc.get("num_kv_shared_layers", 0)
    out = {}
    pending_gate = {}
    for k, v in weights.items():
        hk = k
        if wrapper:
            if k.startswith("language_model.model."):
                hk = "model.language_model." + k[len("language_model.model."):]
            elif k.startswith("language_model.lm_head."):
                hk = k[len("language_model."):]
        if ".experts.switch_glu." in hk:
            base = hk.split(".switch_glu.")[0]
            part = hk.split(".switch_glu.")[1].split(".")[0]
            if part == "down_proj":
                out[f"{base}.down_proj"] = v
            else:
                pending_gate.setdefault(base, {})[part] = v
            continue
        out[hk] = v
    for base, parts in pending_gate.items():
        out[f"{base}.gate_up_proj"] = mx.concatenate([parts["gate_proj"], parts["up_proj"]], axis=-2)
    # Google's checkpoints still carry K/V projections on KV-shared layers (transformers ignores them,
    # mlx-lm's sanitize drops them): add seeded ones so loaders exercise that path.
    prefix = "model.language_model." if wrapper else "model."
    hidden = tc["hidden_size"]
    for i in range(first_shared, n_layers):
        full = tc["layer_types"][i] == "full_attention"
        hd = tc["global_head_dim"] if full and tc.get("global_head_dim") else tc["head_dim"]
        k_eq_v = tc.get("attention_k_eq_v", False) and full
        kvh = tc["num_global_key_value_heads"] if k_eq_v and tc.get("num_global_key_value_heads") else tc["num_key_value_heads"]
        extra = {f"layers.{i}.self_attn.k_proj.weight": (kvh * hd, hidden), f"layers.{i}.self_attn.k_norm.weight": (hd,)}
        if not k_eq_v:
            extra[f"layers.{i}.self_attn.v_proj.weight"] = (kvh * hd, hidden)
        for n, shape in extra.items():
            out[prefix + n] = mx.array(init_value(prefix + n, shape, seed)).astype(getattr(mx, dtype))
    if wrapper and vision_stub:
        for n, shape in {
            "model.vision_tower.encoder.layers.0.mlp.gate_proj.linear.weight": (8, 8),
            "model.vision_tower.encoder.layers.0.mlp.gate_proj.input_max": (),
            "model.embed_vision.embedding_projection.weight": (hidden, 8),
        }.items():
            out[n] = mx.array(init_value(n, shape, seed)).astype(getattr(mx, dtype))
    mx.eval(out)
    return dict(sorted(out.items()))


def write_weights(out_dir: Path, weights: dict, shards: int) -> None:
    import mlx.core as mx

    for f in out_dir.glob("model*.safetensors"):
        f.unlink()
    idx = out_dir / "model.safetensors.index.json"
    if idx.exists():
        idx.unlink()
    names = sorted(weights)
    if shards <= 1:
        mx.save_safetensors(str(out_dir / "model.safetensors"), {n: weights[n] for n in names}, metadata={"format": "mlx"})
        return
    # Contiguous, roughly equal-byte shards in name order, like save_model's make_shards.
    total = sum(weights[n].nbytes for n in names)
    per = total / shards
    groups: list[list[str]] = [[] for _ in range(shards)]
    acc = 0
    for n in names:
        g = min(int(acc // per), shards - 1) if per > 0 else 0
        groups[g].append(n)
        acc += weights[n].nbytes
    groups = [g for g in groups if g]
    count = len(groups)
    weight_map = {}
    for i, g in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{count:05d}.safetensors"
        mx.save_safetensors(str(out_dir / fname), {n: weights[n] for n in g}, metadata={"format": "mlx"})
        for n in g:
            weight_map[n] = fname
    index = {"metadata": {"total_size": int(total)}, "weight_map": dict(sorted(weight_map.items()))}
    idx.write_text(json.dumps(index, indent=4) + "\n")


def read_all_weights(d: Path) -> dict:
    import mlx.core as mx

    w = {}
    for f in sorted(d.glob("model*.safetensors")):
        w.update(mx.load(str(f)))
    return w


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def write_common(out: Path, config: dict, template_in_config: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(generation_config(), indent=2) + "\n")
    (out / "tokenizer.json").write_text(json.dumps(build_tokenizer_json(), indent=2, ensure_ascii=False) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(template_in_config), indent=2, ensure_ascii=False) + "\n")
    tpl = out / "chat_template.jinja"
    if template_in_config:
        if tpl.exists():
            tpl.unlink()
    else:
        tpl.write_text(CHAT_TEMPLATE)


def make(
    variant: str,
    out: Path,
    *,
    form: str | None = None,
    quant: str = "none",
    shards: int = 1,
    naming: str | None = None,
    seed: int = 0,
    template_in_config: bool = False,
    vision_stub: bool = True,
    dtype: str = "bfloat16",
    overrides: dict | None = None,
) -> Path:
    form = form or ("text" if variant == "dense" else "wrapper")
    if form == "wrapper" and variant == "dense" and naming != "mlx":
        # An untied lm_head in the wrapper's HF naming ("lm_head.weight") is not where mlx-lm's
        # gemma4.Model looks ("language_model.lm_head.weight"); the text form has no such gap.
        naming = "mlx"
    naming = naming or ("mlx" if quant != "none" else "hf")
    config = model_config(variant, form, dtype, overrides)
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)

    if quant == "none":
        write_common(out, config, template_in_config)
        weights = build_mlx_weights(config, seed, dtype)
        if naming == "hf":
            weights = to_hf_names(weights, config, seed, vision_stub, dtype)
        write_weights(out, weights, shards)
        return out

    # Quantized: write the bf16 HF-form checkpoint, then run mlx-lm's own convert on it.
    from mlx_lm.convert import convert

    with tempfile.TemporaryDirectory(prefix="tiny-gemma4-src-") as src:
        src_dir = Path(src) / "bf16"
        make(variant, src_dir, form=form, quant="none", shards=1, naming="hf" if not (form == "wrapper" and variant == "dense") else "mlx",
             seed=seed, template_in_config=template_in_config, vision_stub=vision_stub, dtype=dtype, overrides=overrides)
        recipe = "mixed_4_6" if quant == "mixed" else None
        with contextlib.redirect_stdout(io.StringIO()):
            convert(str(src_dir), str(out), quantize=True, q_bits=4, q_group_size=64, quant_predicate=recipe)
    if (out / "README.md").exists():
        (out / "README.md").unlink()
    if shards > 1:
        write_weights(out, read_all_weights(out), shards)
    return out


SUITE = {
    # name: (variant, options)
    "small-bf16": ("small", {}),
    "small-4bit": ("small", {"quant": "4bit"}),
    "dense-bf16": ("dense", {"shards": 3, "template_in_config": True}),
    "dense-mixed": ("dense", {"quant": "mixed"}),
    "moe-bf16": ("moe", {"shards": 2}),
    # MLX's CPU backend runs gather_mm (the bf16 expert matmul) in float32 only.
    "moe-f32": ("moe", {"naming": "mlx", "dtype": "float32"}),
    "moe-4bit": ("moe", {"quant": "4bit"}),
}


def check_generate(path: Path, n: int = 20) -> dict:
    """Load with mlx_lm.load and greedily generate n tokens from a chat prompt."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, tok = load(str(path))
    messages = [{"role": "user", "content": "Hello world! What is the capital of France?"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
    ids = []
    # generate_step's default sampler is greedy; no stop on eos, so exactly n tokens.
    try:
        for token, _ in generate_step(mx.array(prompt), model, max_tokens=n):
            ids.append(int(token))
    except RuntimeError as e:
        if "GatherMM" in str(e) and mx.default_device() == mx.cpu:
            return {"skipped": f"MLX's CPU backend cannot run this checkpoint: {e}"}
        raise
    return {"prompt_tokens": len(prompt), "tokens": ids, "text": tok.decode(ids)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", choices=["small", "dense", "moe"])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--form", choices=["wrapper", "text"], help="config.json form (default: wrapper; dense: text)")
    ap.add_argument("--quant", choices=["none", "4bit", "mixed"], default="none")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--naming", choices=["hf", "mlx"], help="tensor names (default: hf for bf16, mlx when quantized)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=DTYPES, default="bfloat16",
                    help="floating dtype of the weights (MoE on MLX's CPU backend needs float32 unless quantized)")
    ap.add_argument("--template-in-config", action="store_true", help="chat template in tokenizer_config.json, no chat_template.jinja")
    ap.add_argument("--no-vision-stub", action="store_true", help="leave out the stub vision-tower tensors (HF naming)")
    ap.add_argument("--suite", type=Path, help="write the standard test set into subdirectories of this folder")
    ap.add_argument("--check", action="store_true", help="load with mlx_lm.load and generate 20 tokens")
    ap.add_argument("--generate", type=Path, nargs="+", metavar="DIR",
                    help="only load existing checkpoints with mlx_lm.load and greedily generate --tokens tokens (JSON list)")
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="override a text_config field, e.g. --set head_dim=64 --set sliding_window=16")
    a = ap.parse_args(argv)

    if a.generate:
        results = []
        for p in a.generate:
            with contextlib.redirect_stdout(io.StringIO()):
                r = check_generate(p, a.tokens)
            results.append({"path": str(p), **r})
        print(json.dumps(results, ensure_ascii=False))
        return 0

    made = []
    if a.suite:
        for name, (variant, opts) in SUITE.items():
            made.append(make(variant, a.suite / name, seed=a.seed, **opts))
        (a.suite / "suite.json").write_text(json.dumps({k: {"variant": v, **o} for k, (v, o) in SUITE.items()}, indent=2) + "\n")
    else:
        if not a.variant or not a.out:
            ap.error("--variant and --out are required (or --suite DIR)")
        made.append(
            make(
                a.variant,
                a.out,
                form=a.form,
                quant=a.quant,
                shards=a.shards,
                naming=a.naming,
                seed=a.seed,
                template_in_config=a.template_in_config,
                vision_stub=not a.no_vision_stub,
                dtype=a.dtype,
                overrides={k: json.loads(v) for k, v in (kv.split("=", 1) for kv in a.set)},
            )
        )
    for p in made:
        print(p)
        if a.check:
            print(json.dumps({"path": str(p), **check_generate(p)}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

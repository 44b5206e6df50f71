"""mlx-lm's Gemma 4 output handling, as the reference for packages/models/src/gemma4-output.ts.

Reads a JSON list on stdin, writes a JSON list (one result per item) on stdout.

  tool_parser_oracle.py
      items are texts; each result is mlx_lm.tool_parsers.gemma4.parse_tool_call(text) as
      {"calls": [{"name", "arguments"}, ...]} (a single dict result becomes a one-call list), or
      {"error": "<ExceptionType>: <message>"} where it raises.

  tool_parser_oracle.py --split MODEL_DIR
      items are {"chunks": [text, ...], "initial": "normal" | "reasoning"}; each chunk is fed to
      the TextStateMachine that mlx-lm builds for MODEL_DIR's tokenizer, collected the way
      server.py's handle_completion collects a response (finish_reason "length": the held-back
      buffer is flushed), and the tool texts go through the model's tool parser with server.py's
      ToolCallFormatter rule (a text that fails to parse is dropped). Result:
      {"content", "reasoning", "tool_calls": [{"name", "arguments"}], "dropped": n}.

Non-finite floats in arguments (NaN / Infinity literals, or overflowing exponents) are written as
{"__float__": "nan" | "inf" | "-inf"}, since JSON has no spelling for them.
"""

import json
import math
import sys
from pathlib import Path


def encode(value):
    if isinstance(value, float) and not math.isfinite(value):
        return {"__float__": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [encode(v) for v in value]
    return value


def as_calls(parsed):
    calls = parsed if isinstance(parsed, list) else [parsed]
    return [{"name": c["name"], "arguments": encode(c["arguments"])} for c in calls]


def parse_mode(items):
    from mlx_lm.tool_parsers.gemma4 import parse_tool_call

    out = []
    for text in items:
        try:
            out.append({"calls": as_calls(parse_tool_call(text))})
        except Exception as e:  # noqa: BLE001 - every failure is part of the reference
            out.append({"error": f"{type(e).__name__}: {e}"})
    return out


def split_mode(items, model_dir):
    from mlx_lm.generate import TextStateMachine, make_text_state_machine
    from mlx_lm.tokenizer_utils import load

    tokenizer = load(Path(model_dir))
    sm = make_text_state_machine(tokenizer)
    out = []
    for item in items:
        state = sm.make_state(item.get("initial", "normal"))
        prev = item.get("initial", "normal")
        text = reasoning = tool_text = ""
        tool_texts = []
        chunks = item["chunks"]
        for n, chunk in enumerate(chunks):
            state, segments = TextStateMachine.split(state, chunk)
            if n == len(chunks) - 1:
                state, flushed, current = TextStateMachine.flush(state)
                segments.append((current, flushed))
            for current, clean in segments:
                if current == "reasoning":
                    reasoning += clean
                elif current == "tool":
                    tool_text += clean
                elif current == "normal":
                    if prev == "tool":
                        tool_texts.append(tool_text)
                        tool_text = ""
                    text += clean
                prev = current
        if prev == "tool" and tool_text:
            tool_texts.append(tool_text)
        calls = []
        dropped = 0
        for t in tool_texts:
            try:
                calls.extend(as_calls(tokenizer.tool_parser(t, None)))
            except (ValueError, json.JSONDecodeError):
                dropped += 1
        out.append({"content": text, "reasoning": reasoning, "tool_calls": calls, "dropped": dropped})
    return out


def main():
    items = json.loads(sys.stdin.read())
    if len(sys.argv) >= 3 and sys.argv[1] == "--split":
        result = split_mode(items, sys.argv[2])
    else:
        result = parse_mode(items)
    sys.stdout.write(json.dumps(result))


if __name__ == "__main__":
    main()

// A chat turn's output split as the endpoints return it: content, reasoning and tool calls, from
// the generated text with its special tokens (Gemma4OutputParser). Protocol-neutral: the OpenAI
// chat, Anthropic Messages and Responses formatters read the same deltas.
import { randomUUID } from "node:crypto";
import { GEMMA4_MARKERS, type Gemma4OutputEvent, Gemma4OutputParser, type Gemma4Tokenizer, type ToolCall } from "@mlx-bun/models";

/** A tool call as the endpoints return it: its place in the turn, an id, the parsed call. */
export interface OutputToolCall {
  index: number;
  id: string;
  call: ToolCall;
}

/** One piece of the turn, in the order the model wrote it (Anthropic's content blocks, the Responses output items). */
export type OutputPart = { type: "content" | "reasoning"; text: string } | { type: "tool_call"; call: OutputToolCall };

/** What one piece of generated text adds to the turn. */
export interface OutputDelta {
  content: string;
  reasoning: string;
  toolCalls: OutputToolCall[];
  /** The same pieces in the order written (ChatOutput always fills it; a delta merged by a formatter may leave it out). */
  parts?: OutputPart[];
}

/** Whether the vocabulary has Gemma 4's tool-call and thinking delimiters. */
export function hasGemma4Markers(tok: Gemma4Tokenizer): boolean {
  return [GEMMA4_MARKERS.toolCallStart, GEMMA4_MARKERS.toolCallEnd, "<|channel>", GEMMA4_MARKERS.thoughtEnd].every((t) => tok.tokenToId(t) !== undefined);
}

/**
 * Where the model starts: inside the thinking channel when the prompt opened it and did not
 * close it (mlx_lm.server's initial state), else in content.
 */
export function initialOutputState(tok: Gemma4Tokenizer, promptIds: readonly number[]): "content" | "reasoning" {
  const open = tok.tokenToId("<|channel>");
  const close = tok.tokenToId(GEMMA4_MARKERS.thoughtEnd);
  if (open === undefined || close === undefined) return "content";
  return promptIds.lastIndexOf(open) > promptIds.lastIndexOf(close) ? "reasoning" : "content";
}

export class ChatOutput {
  readonly #parser: Gemma4OutputParser | null;
  content = "";
  reasoning = "";
  readonly toolCalls: OutputToolCall[] = [];

  /** `parser` null: the text is all content (a model without Gemma 4's delimiters). */
  constructor(parser: Gemma4OutputParser | null) {
    this.#parser = parser;
  }

  static for(tok: Gemma4Tokenizer, promptIds: readonly number[]): ChatOutput {
    return new ChatOutput(hasGemma4Markers(tok) ? new Gemma4OutputParser({ initialState: initialOutputState(tok, promptIds) }) : null);
  }

  push(text: string): OutputDelta {
    if (!this.#parser) return this.#take([{ type: "content", text }]);
    return this.#take(this.#parser.push(text));
  }

  /** The end of the turn: text the parser held back, a tool call the output ended in. */
  finish(): OutputDelta {
    return this.#take(this.#parser ? this.#parser.finish() : []);
  }

  #take(events: readonly Gemma4OutputEvent[]): OutputDelta {
    const parts: OutputPart[] = [];
    const d: OutputDelta = { content: "", reasoning: "", toolCalls: [], parts };
    const text = (type: "content" | "reasoning", t: string) => {
      if (!t) return;
      d[type] += t;
      const last = parts.at(-1);
      if (last && last.type === type) last.text += t;
      else parts.push({ type, text: t });
    };
    for (const e of events) {
      if (e.type === "content") text("content", e.text);
      else if (e.type === "reasoning") text("reasoning", e.text);
      else if (e.type === "tool_call") {
        const call = { index: this.toolCalls.length + d.toolCalls.length, id: `call_${randomUUID().replaceAll("-", "")}`, call: e.call };
        d.toolCalls.push(call);
        parts.push({ type: "tool_call", call });
      }
      // A section that holds no valid call stays visible as text (mlx_lm.server drops it silently).
      else text("content", `${GEMMA4_MARKERS.toolCallStart}${e.text}${GEMMA4_MARKERS.toolCallEnd}`);
    }
    this.content += d.content;
    this.reasoning += d.reasoning;
    this.toolCalls.push(...d.toolCalls);
    return d;
  }
}

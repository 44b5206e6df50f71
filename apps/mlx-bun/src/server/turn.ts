// One generated chat turn (a single choice) as the Anthropic Messages and Responses formatters
// read it: the ordered parts of the output (reasoning, content, tool calls) and why it ended,
// in protocol-neutral terms. The text keeps its special tokens (Gemma 4's markup is parsed by
// ChatOutput, as for /v1/chat/completions).
import { GEMMA4_MARKERS, type Gemma4Tokenizer } from "@mlx-bun/models";
import type { GenerationEvent, GenerationResult } from "@mlx-bun/runtime";
import { ChatOutput, type OutputPart, type OutputToolCall } from "./chat-output.ts";

/** Why a turn ended. */
export type TurnEnd =
  | { kind: "tool_calls" }
  | { kind: "end_turn" }
  | { kind: "stop_sequence"; sequence: string }
  /** max_tokens reached */
  | { kind: "max_tokens" }
  /** the context (max_position_embeddings) filled before max_tokens */
  | { kind: "context_full" }
  | { kind: "cancelled" };

export interface TurnOptions {
  /** Keep at most this many tool calls (a request that turns parallel calls off: 1); later ones are dropped. */
  maxToolCalls?: number;
  /** The request's stop strings (to name the one that ended the turn). */
  stops?: readonly string[];
  /** The max_tokens asked for (before the context cap), to tell max_tokens from a full context. */
  maxTokens?: number;
}

export class Turn {
  readonly output: ChatOutput;
  text = "";
  readonly toolCalls: OutputToolCall[] = [];
  #ended = false;

  constructor(
    readonly tokenizer: Gemma4Tokenizer,
    promptIds: readonly number[],
    readonly opts: TurnOptions = {},
  ) {
    this.output = ChatOutput.for(tokenizer, promptIds);
  }

  /** The parts one generated event adds, in order. */
  push(ev: GenerationEvent): OutputPart[] {
    this.text += ev.text;
    return ev.text ? this.#keep(this.output.push(ev.text).parts ?? []) : [];
  }

  /** The parts the end of the turn adds: a tail the generator settled at the end, text the parser held back. */
  end(r: GenerationResult): OutputPart[] {
    if (this.#ended) return [];
    this.#ended = true;
    const tail = r.text.startsWith(this.text) ? r.text.slice(this.text.length) : "";
    this.text += tail;
    const a = tail ? (this.output.push(tail).parts ?? []) : [];
    return this.#keep([...a, ...(this.output.finish().parts ?? [])]);
  }

  #keep(parts: OutputPart[]): OutputPart[] {
    const max = this.opts.maxToolCalls ?? Number.POSITIVE_INFINITY;
    return parts.filter((p) => {
      if (p.type !== "tool_call") return true;
      if (this.toolCalls.length >= max) return false;
      this.toolCalls.push(p.call);
      return true;
    });
  }

  /** Why the turn ended (call after `end`). */
  endOf(r: GenerationResult): TurnEnd {
    if (r.finishReason === "cancelled") return { kind: "cancelled" };
    if (r.finishReason === "length")
      return this.opts.maxTokens !== undefined && r.tokens.length < this.opts.maxTokens ? { kind: "context_full" } : { kind: "max_tokens" };
    if (this.toolCalls.length) return { kind: "tool_calls" };
    const last = r.tokens.at(-1);
    const stops = (this.opts.stops ?? []).filter((s) => s.length > 0);
    if (stops.length && last !== undefined && !this.tokenizer.eosTokenIds.has(last)) {
      // A stop string ended it: the earliest one in the decoded tokens (the generator cuts at the first).
      const full = this.tokenizer.decode(r.tokens);
      let best: { at: number; s: string } | null = null;
      for (const s of stops) {
        const at = full.indexOf(s);
        if (at >= 0 && (!best || at < best.at)) best = { at, s };
      }
      if (best) return { kind: "stop_sequence", sequence: best.s };
    }
    return { kind: "end_turn" };
  }

  /** Generated tokens of the thinking channel (through its closing delimiter), for reasoning-token counts. */
  reasoningTokens(r: GenerationResult): number {
    if (!this.output.reasoning) return 0;
    const close = this.tokenizer.tokenToId(GEMMA4_MARKERS.thoughtEnd);
    const at = close === undefined ? -1 : r.tokens.indexOf(close);
    return at >= 0 ? at + 1 : r.tokens.length;
  }
}

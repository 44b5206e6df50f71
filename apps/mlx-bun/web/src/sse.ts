// Server-sent events from a fetch body: the `data:` payload of each event, as the bytes arrive
// (an event or a line may be split across chunks). No DOM types: unit-tested outside the browser.

/** Splits a text stream into SSE events and returns each event's data (its `data:` lines joined by "\n"). */
export class SseParser {
  #buf = "";
  #data: string[] = [];

  /** Feed decoded text; returns the data of every event completed by it. */
  push(text: string): string[] {
    this.#buf += text;
    const out: string[] = [];
    for (;;) {
      const m = /\r\n|\r|\n/.exec(this.#buf);
      // A lone "\r" at the end may be the first half of "\r\n": wait for the next chunk.
      if (!m || (m[0] === "\r" && m.index === this.#buf.length - 1)) break;
      const line = this.#buf.slice(0, m.index);
      this.#buf = this.#buf.slice(m.index + m[0].length);
      if (line === "") {
        if (this.#data.length) out.push(this.#data.join("\n"));
        this.#data = [];
      } else if (line.startsWith("data:")) {
        this.#data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
      }
      // Comments (":") and other fields (event, id, retry) are not used by the OpenAI stream.
    }
    return out;
  }

  /** The end of the stream: an event not followed by a blank line still counts. */
  end(): string[] {
    const out = this.push("\n\n");
    this.#buf = "";
    return out;
  }
}

export interface ToolCallDelta {
  index?: number;
  id?: string;
  type?: string;
  function?: { name?: string; arguments?: string };
}

export interface ChatChunk {
  choices?: {
    index?: number;
    delta?: { content?: string | null; reasoning_content?: string | null; reasoning?: string | null; tool_calls?: ToolCallDelta[] | null };
    finish_reason?: string | null;
  }[];
  usage?: {
    prompt_tokens?: number;
    completion_tokens?: number;
    total_tokens?: number;
    prompt_tokens_details?: { cached_tokens?: number | null } | null;
  } | null;
  error?: { message?: string };
}

export interface StreamedToolCall {
  id: string;
  type: string;
  name: string;
  arguments: string;
}

/**
 * One streamed reply, put together from its chunks: text, reasoning (`reasoning_content`, or
 * mlx_lm.server's `reasoning` when only that is sent: the server sends both, with the same text),
 * tool calls merged by `index` (whole in one delta from mlx-bun; in pieces from OpenAI-style
 * servers), usage, finish reason, and the times that make the stats.
 */
export class ReplyAccumulator {
  content = "";
  reasoning = "";
  toolCalls: StreamedToolCall[] = [];
  finish: string | null = null;
  completionTokens: number | null = null;
  promptTokens: number | null = null;
  cachedTokens: number | null = null;
  /** Deltas that carried something (a token count when the server sends no usage). */
  deltas = 0;
  tFirst: number | null = null;
  tLast: number | null = null;
  /** Distinct arrival times of the deltas: 1 when the whole reply was read at once (no speed to tell). */
  arrivals = 0;
  /** First reasoning delta, and the first delta after it that is not reasoning. */
  tReasonStart: number | null = null;
  tReasonEnd: number | null = null;

  constructor(readonly t0: number) {}

  /** Take one chunk (received at `now`, ms); returns whether the reply's text, reasoning or calls changed. */
  apply(c: ChatChunk, now: number): boolean {
    if (c.error) throw new Error(c.error.message ?? "the server reported an error");
    if (c.usage) {
      if (typeof c.usage.completion_tokens === "number") this.completionTokens = c.usage.completion_tokens;
      if (typeof c.usage.prompt_tokens === "number") this.promptTokens = c.usage.prompt_tokens;
      const cached = c.usage.prompt_tokens_details?.cached_tokens;
      if (typeof cached === "number") this.cachedTokens = cached;
    }
    const choice = c.choices?.find((x) => (x.index ?? 0) === 0);
    if (!choice) return false;
    if (choice.finish_reason) this.finish = choice.finish_reason;
    const d = choice.delta;
    if (!d) return false;
    const reasoning = d.reasoning_content ?? d.reasoning ?? "";
    const content = d.content ?? "";
    const calls = d.tool_calls ?? [];
    if (!reasoning && !content && !calls.length) return false;
    this.deltas++;
    if (now !== this.tLast) this.arrivals++;
    this.tFirst ??= now;
    this.tLast = now;
    if (reasoning) {
      this.reasoning += reasoning;
      this.tReasonStart ??= now;
    } else if (this.tReasonStart !== null) this.tReasonEnd ??= now;
    this.content += content;
    for (const t of calls) {
      const i = t.index ?? this.toolCalls.length;
      const cur = (this.toolCalls[i] ??= { id: "", type: "function", name: "", arguments: "" });
      if (t.id) cur.id = t.id;
      if (t.type) cur.type = t.type;
      if (t.function?.name) cur.name += t.function.name;
      if (t.function?.arguments) cur.arguments += t.function.arguments;
    }
    return true;
  }

  /**
   * The stats of the reply, ended at `now`; `finish` overrides the server's reason ("stopped",
   * "error"). Decode speed is tokens after the first over the time from the first delta to the
   * last, as they arrived: none when they all arrived at once (read in one go, nothing to time).
   */
  stats(now: number, finish: string | null = null) {
    const tokens = this.completionTokens ?? this.deltas;
    const span = this.arrivals > 1 && this.tFirst !== null && this.tLast !== null ? this.tLast - this.tFirst : 0;
    const reasonEnd = this.tReasonEnd ?? (this.tReasonStart !== null ? (this.tLast ?? now) : null);
    return {
      ttftMs: this.tFirst === null ? null : this.tFirst - this.t0,
      tokens,
      tps: tokens > 1 && span > 0 ? (tokens - 1) / (span / 1000) : null,
      finish: finish ?? this.finish ?? "stop",
      promptTokens: this.promptTokens,
      cachedTokens: this.cachedTokens,
      reasoningMs: this.tReasonStart !== null && reasonEnd !== null ? reasonEnd - this.tReasonStart : null,
    };
  }
}

/** Read an OpenAI chat-completions SSE body, calling `onChunk` per JSON chunk, until `[DONE]` or the end. */
export async function readChatStream(body: ReadableStream<Uint8Array>, onChunk: (c: ChatChunk) => void): Promise<void> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  const parser = new SseParser();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      const events = done ? parser.push(decoder.decode()).concat(parser.end()) : parser.push(decoder.decode(value, { stream: true }));
      for (const data of events) {
        if (data === "[DONE]") return;
        onChunk(JSON.parse(data) as ChatChunk);
      }
      if (done) return;
    }
  } finally {
    // Done, a fault, or a chunk the caller rejected: let go of the connection either way.
    void reader.cancel().catch(() => {});
  }
}

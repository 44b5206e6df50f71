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

export interface ChatChunk {
  choices?: { delta?: { content?: string | null }; finish_reason?: string | null }[];
  usage?: { prompt_tokens: number; completion_tokens: number };
  error?: { message?: string };
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

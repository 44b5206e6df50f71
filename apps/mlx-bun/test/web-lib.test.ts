// The web chat's DOM-free parts: the SSE parser (events split anywhere across chunks) and the
// localStorage model (what is read back is checked; the history sent keeps roles alternating).
import { describe, expect, test } from "vitest";
import { readChatStream, SseParser } from "../web/src/sse.ts";
import { apiMessages, type KeyValueStore, KEYS, loadConversations, loadSettings, samplingFields, saveConversations, titleFor } from "../web/src/store.ts";

function memoryStore(init: Record<string, string> = {}): KeyValueStore & { data: Map<string, string> } {
  const data = new Map(Object.entries(init));
  return {
    data,
    getItem: (k) => data.get(k) ?? null,
    setItem: (k, v) => void data.set(k, v),
    removeItem: (k) => void data.delete(k),
  };
}

describe("SseParser", () => {
  const stream = 'data: {"a":1}\n\ndata: {"b":2}\r\n\r\n: comment\n\nevent: x\ndata: line1\ndata: line2\n\ndata: [DONE]\n\n';

  test("whole, and split at every position", () => {
    const whole = new SseParser().push(stream);
    expect(whole).toEqual(['{"a":1}', '{"b":2}', "line1\nline2", "[DONE]"]);
    for (let i = 0; i <= stream.length; i++) {
      const p = new SseParser();
      expect([...p.push(stream.slice(0, i)), ...p.push(stream.slice(i)), ...p.end()], `split at ${i}`).toEqual(whole);
    }
  });

  test("one character at a time; a last event without its blank line", () => {
    const p = new SseParser();
    const out: string[] = [];
    for (const ch of "data: x\r\n\r\ndata:y") out.push(...p.push(ch));
    out.push(...p.end());
    expect(out).toEqual(["x", "y"]);
  });

  test("readChatStream: chunks in order, stops at [DONE], multi-byte text split across reads", async () => {
    const text = 'data: {"choices":[{"delta":{"content":"héllo ✓"}}]}\n\ndata: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\ndata: [DONE]\n\ndata: {"late":1}\n\n';
    const bytes = new TextEncoder().encode(text);
    const body = new ReadableStream<Uint8Array>({
      start(c) {
        for (let i = 0; i < bytes.length; i += 3) c.enqueue(bytes.slice(i, i + 3));
        c.close();
      },
    });
    const seen: unknown[] = [];
    await readChatStream(body, (c) => seen.push(c));
    expect(seen).toEqual([{ choices: [{ delta: { content: "héllo ✓" } }] }, { choices: [], usage: { prompt_tokens: 3, completion_tokens: 2 } }]);
  });
});

describe("store", () => {
  test("conversations round-trip; bad entries are dropped, not trusted", () => {
    const s = memoryStore();
    const conv = { id: "a", title: "Hi", created: 1, updated: 2, messages: [{ role: "user" as const, content: "hi" }, { role: "assistant" as const, content: "<b>x</b>", stats: { ttftMs: 5, tokens: 3, tps: 10, finish: "stop" } }] };
    expect(saveConversations(s, [conv, { id: "empty", title: "", created: 3, updated: 3, messages: [] }])).toBe(true);
    expect(loadConversations(s)).toEqual([conv]); // the empty one is not kept

    s.setItem(
      KEYS.conversations,
      JSON.stringify([
        { id: "b", created: 5, messages: [{ role: "user", content: "first words here" }, { role: "hacker", content: "x" }, { role: "assistant", content: 42 }, "junk"] },
        { id: "b", messages: [] },
        { messages: [] },
        null,
      ]),
    );
    expect(loadConversations(s)).toEqual([{ id: "b", title: "first words here", created: 5, updated: 5, messages: [{ role: "user", content: "first words here" }] }]);
    s.setItem(KEYS.conversations, "{not json");
    expect(loadConversations(s)).toEqual([]);
  });

  test("settings: missing or wrong-typed fields are the server's default", () => {
    expect(loadSettings(memoryStore())).toEqual({ temperature: null, topP: null, maxTokens: null, systemPrompt: "" });
    const s = memoryStore({ [KEYS.settings]: JSON.stringify({ temperature: 0.7, topP: "0.9", maxTokens: 200, systemPrompt: 3 }) });
    const got = loadSettings(s);
    expect(got).toEqual({ temperature: 0.7, topP: null, maxTokens: 200, systemPrompt: "" });
    expect(samplingFields(got)).toEqual({ temperature: 0.7, max_tokens: 200 });
  });

  test("apiMessages: system prompt first; a failed reply leaves out its question", () => {
    const msgs = [
      { role: "user" as const, content: "q1" },
      { role: "assistant" as const, content: "", error: "HTTP 500" },
      { role: "user" as const, content: "q2" },
      { role: "assistant" as const, content: "a2 (stopped)" },
      { role: "user" as const, content: "q3" },
    ];
    expect(apiMessages(msgs, "be brief")).toEqual([
      { role: "system", content: "be brief" },
      { role: "user", content: "q2" },
      { role: "assistant", content: "a2 (stopped)" },
      { role: "user", content: "q3" },
    ]);
    expect(apiMessages(msgs, "  ")[0]).toEqual({ role: "user", content: "q2" });
  });

  test("titles", () => {
    expect(titleFor([])).toBe("New conversation");
    expect(titleFor([{ role: "user", content: "  hello\n  world " }])).toBe("hello world");
    expect(titleFor([{ role: "user", content: "x".repeat(100) }])).toHaveLength(58);
  });
});

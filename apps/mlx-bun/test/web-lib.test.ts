// The web chat's DOM-free parts: the SSE parser (events split anywhere across chunks), the reply
// accumulator (text, reasoning, tool calls, usage, stats), the settings' rules (the server's), the
// conversation tree in localStorage (branches; what is read back is checked), export/import, and
// the TeX syntax in Markdown.
import MarkdownIt from "markdown-it";
import { describe, expect, test } from "vitest";
import { mathPlugin } from "../web/src/math-syntax.ts";
import { checkSettings, DEFAULT_SETTINGS, NUMBER_FIELDS, samplingFields, stopList } from "../web/src/settings.ts";
import { type ChatChunk, ReplyAccumulator, readChatStream, SseParser } from "../web/src/sse.ts";
import {
  addMessage,
  apiMessages,
  branchEnd,
  type Conversation,
  exportJson,
  type KeyValueStore,
  KEYS,
  loadConversations,
  loadLayout,
  loadSettings,
  mergeImported,
  parseImport,
  pathOf,
  saveConversations,
  STORED_IMAGE_MAX_CHARS,
  searchConversations,
  setLeaf,
  siblingsOf,
  switchVersion,
  titleFor,
} from "../web/src/store.ts";

function memoryStore(init: Record<string, string> = {}): KeyValueStore & { data: Map<string, string> } {
  const data = new Map(Object.entries(init));
  return {
    data,
    getItem: (k) => data.get(k) ?? null,
    setItem: (k, v) => void data.set(k, v),
    removeItem: (k) => void data.delete(k),
  };
}

/** Ids m0, m1, … in order. */
function ids() {
  let n = 0;
  return () => `m${n++}`;
}

function conv(id = "c"): Conversation {
  return { id, title: "New conversation", created: 1, updated: 1, messages: [], leaf: null };
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
    const text =
      'data: {"choices":[{"delta":{"content":"héllo ✓"}}]}\n\ndata: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\ndata: [DONE]\n\ndata: {"late":1}\n\n';
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

describe("ReplyAccumulator", () => {
  const delta = (d: Record<string, unknown>, finish: string | null = null): ChatChunk => ({
    choices: [{ index: 0, delta: d as never, finish_reason: finish }],
  });

  test("reasoning (mlx-bun sends reasoning_content and reasoning, the same text: counted once), then text; usage with cached tokens; stats", () => {
    const a = new ReplyAccumulator(1000);
    expect(a.apply(delta({ role: "assistant" }), 1001)).toBe(false);
    expect(a.apply(delta({ reasoning_content: "Let me ", reasoning: "Let me " }), 1100)).toBe(true);
    a.apply(delta({ reasoning_content: "think.", reasoning: "think." }), 1200);
    a.apply(delta({ content: "Four" }), 1300);
    a.apply(delta({ content: "." }), 1500);
    a.apply(delta({}, "stop"), 1501);
    a.apply({ choices: [], usage: { prompt_tokens: 30, completion_tokens: 9, total_tokens: 39, prompt_tokens_details: { cached_tokens: 24 } } }, 1502);
    expect([a.reasoning, a.content, a.finish]).toEqual(["Let me think.", "Four.", "stop"]);
    expect(a.stats(1600)).toEqual({ ttftMs: 100, tokens: 9, tps: 8 / 0.4, finish: "stop", promptTokens: 30, cachedTokens: 24, reasoningMs: 200 });
    // Stopped or failed: the reason is the page's.
    expect(a.stats(1600, "stopped").finish).toBe("stopped");
  });

  test("only mlx_lm.server's `reasoning` field; no usage: the deltas are the token count", () => {
    const a = new ReplyAccumulator(0);
    a.apply(delta({ reasoning: "hm" }), 10);
    a.apply(delta({ content: "ok" }), 30);
    expect(a.reasoning).toBe("hm");
    const s = a.stats(40);
    expect([s.tokens, s.tps, s.promptTokens, s.cachedTokens, s.reasoningMs]).toEqual([2, 50, null, null, 20]);
  });

  test("tool calls: whole in one delta (mlx-bun), or in pieces by index (OpenAI-style)", () => {
    const a = new ReplyAccumulator(0);
    a.apply(delta({ content: "Let me check." }), 1);
    a.apply(delta({ tool_calls: [{ index: 0, id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } }] }), 2);
    a.apply(delta({}, "tool_calls"), 3);
    expect(a.toolCalls).toEqual([{ id: "call_1", type: "function", name: "get_weather", arguments: '{"city":"Paris"}' }]);
    expect(a.stats(4).finish).toBe("tool_calls");

    const b = new ReplyAccumulator(0);
    b.apply(delta({ tool_calls: [{ index: 0, id: "a", function: { name: "f", arguments: "" } }] }), 1);
    b.apply(
      delta({
        tool_calls: [
          { index: 0, function: { arguments: '{"x":' } },
          { index: 1, id: "b", function: { name: "g", arguments: "{}" } },
        ],
      }),
      2,
    );
    b.apply(delta({ tool_calls: [{ index: 0, function: { arguments: "1}" } }] }), 3);
    expect(b.toolCalls.map((t) => [t.id, t.name, t.arguments])).toEqual([
      ["a", "f", '{"x":1}'],
      ["b", "g", "{}"],
    ]);
  });

  test("a reply read all at once has no speed to tell; an error chunk throws its message; other choices are ignored", () => {
    const a = new ReplyAccumulator(0);
    for (const t of ["a", "b", "c"]) a.apply(delta({ content: t }), 50);
    expect(a.stats(60).tps).toBeNull();
    expect(a.stats(60).ttftMs).toBe(50);
    expect(() => a.apply({ error: { message: "boom" } }, 70)).toThrow("boom");
    a.apply({ choices: [{ index: 1, delta: { content: "other" } }] }, 80);
    expect(a.content).toBe("abc");
  });
});

describe("settings: the server's rules, checked before sending", () => {
  const all = {
    temperature: "0.7",
    topP: "0.9",
    topK: "40",
    minP: "0.05",
    seed: "-3",
    maxTokens: "256",
    repetitionPenalty: "1.1",
    repetitionContextSize: "64",
    presencePenalty: "-0.5",
    frequencyPenalty: "0.25",
    xtcProbability: "0.5",
    xtcThreshold: "0.1",
  };

  test("valid values become the request's fields under the server's names; empty is the server's default", () => {
    const { settings, errors } = checkSettings(all, { stop: "END\n\n###\n", systemPrompt: "be brief" });
    expect(errors.size).toBe(0);
    expect(samplingFields(settings)).toEqual({
      temperature: 0.7,
      top_p: 0.9,
      top_k: 40,
      min_p: 0.05,
      seed: -3,
      max_tokens: 256,
      repetition_penalty: 1.1,
      repetition_context_size: 64,
      presence_penalty: -0.5,
      frequency_penalty: 0.25,
      xtc_probability: 0.5,
      xtc_threshold: 0.1,
      stop: ["END", "###"],
    });
    expect(samplingFields(checkSettings({ temperature: " " }, { stop: "", systemPrompt: "" }).settings)).toEqual({});
    expect(stopList("a\r\nb\n")).toEqual(["a", "b"]);
    expect(NUMBER_FIELDS.map((f) => f.api).sort()).toEqual(Object.keys(samplingFields(checkSettings(all, { stop: "", systemPrompt: "" }).settings)).sort());
  });

  test("each invalid value is refused with a message naming the field", () => {
    const bad = (key: string, value: string) => [...checkSettings({ [key]: value }, { stop: "", systemPrompt: "" }).errors.values()];
    expect(bad("maxTokens", "0")).toEqual(["Max tokens must be at least 1."]);
    expect(bad("maxTokens", "1.5")).toEqual(["Max tokens must be a whole number."]);
    expect(bad("temperature", "-0.1")).toEqual(["Temperature must be at least 0."]);
    expect(bad("temperature", "hot")).toEqual(["Temperature must be a number."]);
    expect(bad("topP", "1.01")).toEqual(["Top-p must be at most 1."]);
    expect(bad("topK", "-1")).toEqual(["Top-k must be at least 0."]);
    expect(bad("minP", "2")).toEqual(["Min-p must be at most 1."]);
    expect(bad("seed", "1e30")).toEqual(["Seed must be a whole number."]);
    expect(bad("repetitionPenalty", "-1")).toEqual(["Repetition penalty must be at least 0."]);
    expect(bad("repetitionContextSize", "2.5")).toEqual(["Penalty context must be a whole number."]);
    expect(bad("xtcProbability", "1.5")).toEqual(["XTC probability must be at most 1."]);
    expect(bad("presencePenalty", "-100")).toEqual([]); // any number, as the server
    // XTC on needs its threshold in [0, 0.5]; off, the threshold may be up to 1.
    const xtc = checkSettings({ xtcProbability: "0.5", xtcThreshold: "0.7" }, { stop: "", systemPrompt: "" }).errors;
    expect([...xtc.entries()]).toEqual([["xtc-threshold", "XTC threshold must be at most 0.5 while XTC probability is above 0."]]);
    expect(checkSettings({ xtcProbability: "0", xtcThreshold: "0.7" }, { stop: "", systemPrompt: "" }).errors.size).toBe(0);
  });

  test("stored settings: missing, wrong-typed or out-of-range fields are the server's default", () => {
    expect(loadSettings(memoryStore())).toEqual(DEFAULT_SETTINGS);
    const s = memoryStore({ [KEYS.settings]: JSON.stringify({ temperature: 0.7, topP: "0.9", maxTokens: 0, topK: 2.5, seed: 7, stop: "X", systemPrompt: 3 }) });
    const got = loadSettings(s);
    expect(got).toEqual({ ...DEFAULT_SETTINGS, temperature: 0.7, seed: 7, stop: "X" });
    expect(samplingFields(got)).toEqual({ temperature: 0.7, seed: 7, stop: ["X"] });
  });

  test("layout: the conversation list open and the settings closed unless saved otherwise", () => {
    expect(loadLayout(memoryStore())).toEqual({ sidebar: true, settings: false });
    expect(loadLayout(memoryStore({ [KEYS.layout]: JSON.stringify({ sidebar: false, settings: "yes" }) }))).toEqual({ sidebar: false, settings: false });
  });
});

describe("the conversation tree", () => {
  test("edit and regenerate add versions; switching returns to where each branch was", () => {
    const c = conv();
    const id = ids();
    const q1 = addMessage(c, null, "user", "Pick a number", id);
    const a1 = addMessage(c, q1.id, "assistant", "One", id);
    expect(c.title).toBe("Pick a number");
    // Regenerate: a second reply to q1.
    setLeaf(c, q1.id);
    const a2 = addMessage(c, q1.id, "assistant", "Two", id);
    expect(pathOf(c).map((m) => m.content)).toEqual(["Pick a number", "Two"]);
    expect(siblingsOf(c, a2)).toEqual([a1, a2]);
    const q2 = addMessage(c, a2.id, "user", "And?", id);
    addMessage(c, q2.id, "assistant", "Three", id);
    // Edit q1: a new first message, its own reply; the title stays the conversation's.
    const e1 = addMessage(c, null, "user", "Pick a letter", id);
    addMessage(c, e1.id, "assistant", "Q", id);
    expect(c.title).toBe("Pick a number");
    expect(pathOf(c).map((m) => m.content)).toEqual(["Pick a letter", "Q"]);
    expect(switchVersion(c, e1, -1)).toBe(q1);
    expect(pathOf(c).map((m) => m.content)).toEqual(["Pick a number", "Two", "And?", "Three"]); // back where it was
    expect(switchVersion(c, q1, -1)).toBeNull();
    expect(switchVersion(c, a2, -1)).toBe(a1);
    expect(pathOf(c).map((m) => m.content)).toEqual(["Pick a number", "One"]);
    switchVersion(c, a1, 1);
    expect(pathOf(c).map((m) => m.content)).toEqual(["Pick a number", "Two", "And?", "Three"]);
    expect(branchEnd(c, e1)).toBe("m6");
  });

  test("stored conversations round-trip; bad entries are dropped, not trusted", () => {
    const s = memoryStore();
    const c = conv("a");
    const id = ids();
    const q = addMessage(c, null, "user", "hi", id);
    const r = addMessage(c, q.id, "assistant", "<b>x</b>", id);
    r.reasoning = "thinking";
    r.toolCalls = [{ id: "call_1", type: "function", name: "f", arguments: "{}" }];
    r.stats = { ttftMs: 5, tokens: 3, tps: 10, finish: "stop", promptTokens: 9, cachedTokens: 4, reasoningMs: 2 };
    c.renamed = true;
    c.title = "Greeting";
    expect(saveConversations(s, [c, conv("empty")])).toBe(true);
    expect(loadConversations(s)).toEqual([JSON.parse(JSON.stringify(c))]); // the empty one is not kept

    s.setItem(
      KEYS.conversations,
      JSON.stringify([
        {
          id: "t",
          created: 5,
          leaf: "nope",
          messages: [
            { id: "x", parent: null, role: "user", content: "first words here", selected: "zz" },
            { id: "y", parent: "x", role: "assistant", content: "ok", stats: { tokens: "many", finish: 3 } },
            { id: "z", parent: "ghost", role: "user", content: "orphan" },
            { id: "w", parent: "z", role: "assistant", content: "orphan's reply" },
            { id: "x", parent: null, role: "user", content: "duplicate id" },
            { id: "v", parent: "y", role: "hacker", content: "x" },
            { id: "u", parent: "y", role: "assistant", content: 42 },
            "junk",
          ],
        },
        { id: "t", messages: [] },
        { messages: [] },
        null,
      ]),
    );
    expect(loadConversations(s)).toEqual([
      {
        id: "t",
        title: "first words here",
        created: 5,
        updated: 5,
        leaf: "y",
        messages: [
          { id: "x", parent: null, role: "user", content: "first words here", created: 5 },
          { id: "y", parent: "x", role: "assistant", content: "ok", created: 5, stats: { ttftMs: null, tokens: 0, tps: null, finish: "stop" } },
        ],
      },
    ]);
    s.setItem(KEYS.conversations, "{not json");
    expect(loadConversations(s)).toEqual([]);
  });

  test("conversations saved before branches (a flat list of messages) are read as one branch", () => {
    const s = memoryStore({
      [KEYS.conversations]: JSON.stringify([
        {
          id: "old",
          title: "Hi",
          created: 1,
          updated: 2,
          messages: [
            { role: "user", content: "hi" },
            { role: "assistant", content: "hello", stats: { ttftMs: 5, tokens: 3, tps: 10, finish: "stop" } },
            { role: "user", content: "again" },
          ],
        },
      ]),
    });
    const [c] = loadConversations(s);
    expect(pathOf(c!).map((m) => [m.id, m.parent, m.content])).toEqual([
      ["m0", null, "hi"],
      ["m1", "m0", "hello"],
      ["m2", "m1", "again"],
    ]);
    expect(c!.leaf).toBe("m2");
  });

  test("apiMessages: system prompt first; a failed reply leaves out its question; reasoning is not sent; a tool-only reply is described", () => {
    const msgs = [
      { role: "user" as const, content: "q1" },
      { role: "assistant" as const, content: "", error: "HTTP 500" },
      { role: "user" as const, content: "q2" },
      { role: "assistant" as const, content: "a2 (stopped)", reasoning: "secret thoughts" },
      { role: "user" as const, content: "q3" },
      { role: "assistant" as const, content: "", toolCalls: [{ id: "c", type: "function", name: "get_weather", arguments: '{"city":"Paris"}' }] },
      { role: "user" as const, content: "q4" },
    ];
    expect(apiMessages(msgs, "be brief")).toEqual([
      { role: "system", content: "be brief" },
      { role: "user", content: "q2" },
      { role: "assistant", content: "a2 (stopped)" },
      { role: "user", content: "q3" },
      { role: "assistant", content: '(called get_weather with {"city":"Paris"})' },
      { role: "user", content: "q4" },
    ]);
    expect(apiMessages(msgs, "  ")[0]).toEqual({ role: "user", content: "q2" });
  });

  test("images: sent as image_url parts before the text; kept in storage up to the cap, else a note; only data: image URLs read back", () => {
    const small = `data:image/png;base64,${"A".repeat(100)}`;
    const big = `data:image/jpeg;base64,${"B".repeat(STORED_IMAGE_MAX_CHARS)}`;
    expect(
      apiMessages(
        [
          {
            role: "user",
            content: "what is it?",
            images: [
              { name: "a.png", bytes: 75, url: small },
              { name: "gone.png", bytes: 9 },
            ],
          },
          { role: "assistant", content: "a cat" },
          { role: "user", content: "", images: [{ name: "a.png", bytes: 75, url: small }] },
        ],
        "",
      ),
    ).toEqual([
      {
        role: "user",
        content: [
          { type: "image_url", image_url: { url: small } },
          { type: "text", text: "what is it?" },
        ],
      },
      { role: "assistant", content: "a cat" },
      { role: "user", content: [{ type: "image_url", image_url: { url: small } }] },
    ]);
    // An image not kept (no url) leaves its message plain text.
    expect(apiMessages([{ role: "user", content: "q", images: [{ name: "gone.png", bytes: 9 }] }], "")).toEqual([{ role: "user", content: "q" }]);

    const s = memoryStore();
    const c = conv("a");
    const id = ids();
    const q = addMessage(c, null, "user", "two images", id);
    q.images = [
      { name: "small.png", bytes: 75, url: small },
      { name: "big.jpg", bytes: 800_000, url: big },
    ];
    expect(saveConversations(s, [c])).toBe(true);
    expect(loadConversations(s)[0]!.messages[0]!.images).toEqual([
      { name: "small.png", bytes: 75, url: small },
      { name: "big.jpg", bytes: 800_000 },
    ]);
    expect(q.images[1]!.url).toBe(big); // the conversation in memory keeps it

    // Storage too full for the images: the text is kept without them.
    const tight = memoryStore();
    tight.setItem = (k, v) => {
      if (v.length > 300) throw new Error("QuotaExceededError");
      tight.data.set(k, v);
    };
    expect(saveConversations(tight, [c])).toBe("without-images");
    expect(loadConversations(tight)[0]!.messages[0]!.images).toEqual([
      { name: "small.png", bytes: 75 },
      { name: "big.jpg", bytes: 800_000 },
    ]);

    // Read back: only data:image/…;base64 URLs, only on user messages.
    s.setItem(
      KEYS.conversations,
      JSON.stringify([
        {
          id: "t",
          messages: [
            {
              id: "x",
              parent: null,
              role: "user",
              content: "",
              images: [
                { name: "ok.png", bytes: 1, url: small },
                { name: "js", bytes: 1, url: "javascript:alert(1)" },
                { name: "svg", bytes: 1, url: "data:text/html;base64,PGI+" },
                { name: 3, url: small },
                "junk",
              ],
            },
            { id: "y", parent: "x", role: "assistant", content: "ok", images: [{ name: "r.png", bytes: 1, url: small }] },
          ],
        },
      ]),
    );
    const [t] = loadConversations(s);
    expect(t!.messages[0]!.images).toEqual([
      { name: "ok.png", bytes: 1, url: small },
      { name: "js", bytes: 1 },
      { name: "svg", bytes: 1 },
    ]);
    expect(t!.messages[1]!.images).toBeUndefined();
    expect(t!.title).toBe("Image: ok.png");
  });

  test("titles", () => {
    expect(titleFor([])).toBe("New conversation");
    expect(titleFor([{ role: "user", content: "  hello\n  world " }])).toBe("hello world");
    expect(titleFor([{ role: "user", content: "x".repeat(100) }])).toHaveLength(58);
  });

  test("search: every word, in the title or any message of any branch, case-insensitive", () => {
    const a = conv("a");
    const id = ids();
    const q = addMessage(a, null, "user", "Tell me about the Sea", id);
    addMessage(a, q.id, "assistant", "Waves and salt.", id);
    addMessage(a, null, "user", "Other branch: mountains", id);
    const b = conv("b");
    addMessage(b, null, "user", "Pasta?", id);
    b.title = "Cooking";
    expect(searchConversations([a, b], "sea").map((c) => c.id)).toEqual(["a"]);
    expect(searchConversations([a, b], "SALT waves").map((c) => c.id)).toEqual(["a"]);
    expect(searchConversations([a, b], "mountains").map((c) => c.id)).toEqual(["a"]);
    expect(searchConversations([a, b], "cooking").map((c) => c.id)).toEqual(["b"]);
    expect(searchConversations([a, b], "sea pasta")).toEqual([]);
    expect(searchConversations([a, b], "  ")).toHaveLength(2);
  });
});

describe("export and import", () => {
  const make = (id: string, text: string) => {
    const c = conv(id);
    const m = addMessage(c, null, "user", text, () => `${id}-q`);
    addMessage(c, m.id, "assistant", `re: ${text}`, () => `${id}-a`);
    return JSON.parse(JSON.stringify(c)) as Conversation;
  };

  test("an export file reads back as the same conversations; a bare list or one conversation is read too", () => {
    const list = [make("a", "one"), make("b", "two")];
    const file = exportJson([...list, conv("empty")], new Date("2026-01-02T03:04:05Z"));
    const parsed = JSON.parse(file);
    expect([parsed.format, parsed.version, parsed.exported]).toEqual(["mlx-bun.chat", 2, "2026-01-02T03:04:05.000Z"]);
    expect(
      parseImport(file)
        .map((c) => c.id)
        .sort(),
    ).toEqual(["a", "b"]);
    expect(parseImport(file).find((c) => c.id === "a")).toEqual(list[0]);
    expect(parseImport(JSON.stringify(list))).toHaveLength(2);
    expect(parseImport(JSON.stringify(list[0]))).toEqual([list[0]]);
  });

  test("a file that is not an export is refused with a reason", () => {
    expect(() => parseImport("nope")).toThrow("the file is not JSON");
    expect(() => parseImport('{"hello": 1}')).toThrow("the file holds no conversations");
    expect(() => parseImport('{"conversations": [{"id": "x", "messages": [{"role": "evil", "content": "x"}]}]}')).toThrow(
      "none of the file's conversations could be read",
    );
  });

  test("merging: the same conversation is skipped, a different one with a taken id is added as a copy", () => {
    const a = make("a", "one");
    const changed = { ...make("a", "one, edited elsewhere"), updated: 9 };
    const b = make("b", "two");
    const { list, added, skipped } = mergeImported([a], [a, changed, b], () => "new-id");
    expect([added, skipped]).toEqual([2, 1]);
    expect(list.map((c) => c.id).sort()).toEqual(["a", "b", "new-id"]);
    expect(list.find((c) => c.id === "a")).toBe(a); // nothing here is overwritten
  });
});

describe("TeX in Markdown (syntax only)", () => {
  const md = new MarkdownIt({ html: false });
  mathPlugin(md, (tex, display) => `[${display ? "D" : "I"}:${tex}]`);
  const r = (s: string) => md.render(s).trim();

  test("inline and display delimiters", () => {
    expect(r("Euler: $e^{i\\pi}+1=0$.")).toBe("<p>Euler: [I:e^{i\\pi}+1=0].</p>");
    expect(r("Also \\(a_1\\) and \\[b^2\\] here")).toBe("<p>Also [I:a_1] and [D:b^2] here</p>");
    expect(r("Inline display $$x$$ too")).toBe("<p>Inline display [D:x] too</p>");
    expect(r("$$\n\\int_0^1 x\\,dx\n= \\frac12\n$$")).toBe('<p class="math-block">[D:\\int_0^1 x\\,dx\n= \\frac12]</p>');
    expect(r("\\[\nx = 1\n\\]")).toBe('<p class="math-block">[D:x = 1]</p>');
    expect(r("$$ y = 2 $$")).toBe('<p class="math-block">[D:y = 2]</p>');
    expect(r("Text\n$$\nz\n$$\nafter")).toBe('<p>Text</p>\n<p class="math-block">[D:z]</p>\n<p>after</p>');
  });

  test("dollars that are prices, escaped, unclosed or in code stay text", () => {
    expect(r("It costs $5 and $10.")).toBe("<p>It costs $5 and $10.</p>");
    expect(r("A $ sign, and \\$x\\$ escaped")).toBe("<p>A $ sign, and $x$ escaped</p>");
    expect(r("`$x$` in code")).toBe("<p><code>$x$</code> in code</p>");
    expect(r("```\n$$\nx\n$$\n```")).toBe("<pre><code>$$\nx\n$$\n</code></pre>");
    // A display being written (a reply streaming) is text until it closes.
    expect(r("$$\n\\frac{1}{2")).toBe("<p>$$\n\\frac{1}{2</p>");
    expect(r("$ x $")).toBe("<p>$ x $</p>");
  });
});

// Request validation without a model: every bad request is an ApiError with its status and an
// OpenAI-shaped body; good requests map to the runtime's GenerateRequest with mlx_lm.server's defaults.
import { describe, expect, test } from "vitest";
import { ApiError } from "../src/server/errors.ts";
import {
  choiceRequests,
  convertChat,
  MAX_CHOICES,
  MLX_LM_SERVER_DEFAULTS,
  parseChatRequest,
  parseCompletionRequest,
  parseJsonBody,
  toGenerateRequest,
  type ValidationContext,
} from "../src/server/validate.ts";

const ctx: ValidationContext = { defaults: MLX_LM_SERVER_DEFAULTS, vocabSize: 1000, modelIds: ["org/model", "/models/model"] };
const chat = (extra: Record<string, unknown> = {}) => ({ model: "org/model", messages: [{ role: "user", content: "hi" }], ...extra });
const completion = (extra: Record<string, unknown> = {}) => ({ model: "org/model", prompt: "hi", ...extra });

function apiError(f: () => unknown): ApiError {
  try {
    f();
  } catch (e) {
    expect(e).toBeInstanceOf(ApiError);
    const a = e as ApiError;
    // The body is always the OpenAI error shape.
    const b = a.body();
    expect(Object.keys(b.error).sort()).toEqual(["code", "message", "param", "type"]);
    expect(typeof b.error.message).toBe("string");
    return a;
  }
  throw new Error("expected an ApiError");
}

function expectError(f: () => unknown, status: number, param: string | null, code?: string): ApiError {
  const e = apiError(f);
  expect({ status: e.status, param: e.param }).toEqual({ status, param });
  if (code) expect(e.code).toBe(code);
  expect(e.type).toBe(status >= 500 ? "server_error" : "invalid_request_error");
  return e;
}

describe("body", () => {
  test("malformed JSON is a 400", () => {
    for (const t of ["", "{", "{'a': 1}", "[1,2", "nul"]) expectError(() => parseJsonBody(t), 400, null, "invalid_json");
  });
  test("a body that is not an object is a 400", () => {
    for (const t of ["[]", "1", '"x"', "null", "true"]) {
      const e = expectError(() => parseJsonBody(t), 400, null, "invalid_json");
      expect(e.message).toMatch(/JSON object/);
    }
  });
  test("an object parses", () => {
    expect(parseJsonBody('{"a": 1}')).toEqual({ a: 1 });
  });
});

describe("wrong field types and values", () => {
  const cases: [string, unknown, string][] = [
    ["max_tokens", "10", "invalid_type"],
    ["max_tokens", 1.5, "invalid_type"],
    ["max_tokens", 0, "invalid_value"],
    ["max_tokens", -3, "invalid_value"],
    ["max_completion_tokens", 0, "invalid_value"],
    ["temperature", "hot", "invalid_type"],
    ["temperature", -0.1, "invalid_value"],
    ["top_p", 1.5, "invalid_value"],
    ["top_p", -1, "invalid_value"],
    ["top_k", 2.5, "invalid_type"],
    ["top_k", -1, "invalid_value"],
    ["min_p", 2, "invalid_value"],
    ["repetition_penalty", -1, "invalid_value"],
    ["repetition_penalty", "1", "invalid_type"],
    ["repetition_context_size", -1, "invalid_value"],
    ["presence_penalty", "x", "invalid_type"],
    ["frequency_penalty", [], "invalid_type"],
    ["stream", "yes", "invalid_type"],
    ["stream", 1, "invalid_type"],
    ["logprobs", "true", "invalid_type"],
    ["top_logprobs", 21, "invalid_value"],
    ["top_logprobs", -2, "invalid_value"],
    ["top_logprobs", 1.5, "invalid_type"],
    ["seed", 1.5, "invalid_type"],
    ["seed", "42", "invalid_type"],
    ["logit_bias", [1, 2], "invalid_type"],
    ["logit_bias", { a: 1 }, "invalid_type"],
    ["logit_bias", { "5": "x" }, "invalid_type"],
    ["logit_bias", { "1000": 1 }, "invalid_value"],
    ["logit_bias", { "-1": 1 }, "invalid_value"],
    ["stop", 5, "invalid_type"],
    ["stop", ["a", 1], "invalid_type"],
    ["stream_options", "x", "invalid_type"],
    ["model", 5, "invalid_type"],
    ["xtc_probability", 2, "invalid_value"],
    ["xtc_probability", -0.1, "invalid_value"],
    ["xtc_probability", "0.5", "invalid_type"],
    ["xtc_threshold", 1.5, "invalid_value"],
    ["xtc_threshold", -1, "invalid_value"],
    ["n", 0, "invalid_value"],
    ["n", MAX_CHOICES + 1, "invalid_value"],
    ["n", 1.5, "invalid_type"],
    ["n", "2", "invalid_type"],
  ];
  for (const [key, value, code] of cases) {
    test(`${key}: ${JSON.stringify(value)} → 400 ${code}`, () => {
      const param = key === "stream_options" ? "stream_options" : key;
      expectError(() => parseChatRequest(chat({ [key]: value }), ctx), 400, param, code);
      if (key !== "logprobs") expectError(() => parseCompletionRequest(completion({ [key]: value }), ctx), 400, param, code);
    });
  }

  test("stream_options.include_usage must be a boolean", () => {
    expectError(() => parseChatRequest(chat({ stream_options: { include_usage: "yes" } }), ctx), 400, "stream_options.include_usage", "invalid_type");
  });

  test("the message names the field and the value", () => {
    const e = apiError(() => parseChatRequest(chat({ max_tokens: 0 }), ctx));
    expect(e.message).toBe("max_tokens must be at least 1, got 0");
  });
});

describe("unsupported parameters", () => {
  const cases: [Record<string, unknown>, string][] = [
    [{ draft_model: "other" }, "draft_model"],
    [{ adapters: "lora" }, "adapters"],
    [{ repetition_context_size: 10, presence_context_size: 30 }, "presence_context_size"],
  ];
  for (const [extra, param] of cases) {
    test(`${JSON.stringify(extra)} → 400 ${param}`, () => {
      expectError(() => parseChatRequest(chat(extra), ctx), 400, param, "unsupported_parameter");
    });
  }
  test("completions: echo, suffix, best_of, several prompts", () => {
    expectError(() => parseCompletionRequest(completion({ echo: true }), ctx), 400, "echo", "unsupported_parameter");
    expectError(() => parseCompletionRequest(completion({ suffix: "x" }), ctx), 400, "suffix", "unsupported_parameter");
    expectError(() => parseCompletionRequest(completion({ best_of: 3 }), ctx), 400, "best_of", "unsupported_parameter");
    expectError(() => parseCompletionRequest(completion({ prompt: ["a", "b"] }), ctx), 400, "prompt", "unsupported_parameter");
  });
});

describe("messages", () => {
  test("missing, not a list, empty", () => {
    expectError(() => parseChatRequest({ model: "org/model" }, ctx), 400, "messages", "missing_required_parameter");
    expectError(() => parseChatRequest({ messages: "hi" }, ctx), 400, "messages", "invalid_type");
    expectError(() => parseChatRequest({ messages: [] }, ctx), 400, "messages", "invalid_value");
  });
  test("a bad message names its index", () => {
    expectError(() => parseChatRequest({ messages: ["hi"] }, ctx), 400, "messages[0]", "invalid_type");
    expectError(() => parseChatRequest({ messages: [{ content: "hi" }] }, ctx), 400, "messages[0].role", "invalid_type");
    expectError(() => parseChatRequest({ messages: [{ role: "", content: "hi" }] }, ctx), 400, "messages[0].role", "invalid_value");
    expectError(
      () =>
        parseChatRequest(
          {
            messages: [
              { role: "user", content: "a" },
              { role: "user", content: 5 },
            ],
          },
          ctx,
        ),
      400,
      "messages[1].content",
      "invalid_type",
    );
  });
  test("only text and image_url content parts (images are read later, against the model)", () => {
    const audio = { role: "user", content: [{ type: "input_audio", input_audio: { data: "", format: "wav" } }] };
    expectError(() => parseChatRequest({ messages: [audio] }, ctx), 400, "messages[0].content[0]", "unsupported_parameter");
    const img = { role: "user", content: [{ type: "image_url", image_url: { url: "data:," } }] };
    expect(() => parseChatRequest({ messages: [img] }, ctx)).not.toThrow();
    expectError(
      () => parseChatRequest({ messages: [{ role: "user", content: [{ type: "image_url", image_url: {} }] }] }, ctx),
      400,
      "messages[0].content[0].image_url",
      "invalid_type",
    );
    expectError(() => parseChatRequest({ messages: [{ role: "user", content: [{ type: "text" }] }] }, ctx), 400, "messages[0].content[0].text", "invalid_type");
  });
  test("text parts are joined, null content is empty, tool-call arguments are parsed", () => {
    const p = parseChatRequest(
      {
        messages: [
          {
            role: "user",
            content: [
              { type: "text", text: "a" },
              { type: "text", text: "b" },
            ],
          },
          { role: "assistant", content: null, tool_calls: [{ type: "function", function: { name: "f", arguments: '{"x": 1}' } }] },
        ],
      },
      ctx,
    );
    expect(p.messages[0]!.content).toBe("ab");
    expect(p.messages[1]!.content).toBe("");
    expect((p.messages[1]!.tool_calls as { function: { arguments: unknown } }[])[0]!.function.arguments).toEqual({ x: 1 });
  });
  test("bad tool-call arguments and tools", () => {
    const bad = { role: "assistant", tool_calls: [{ function: { name: "f", arguments: "{not json" } }] };
    expectError(() => parseChatRequest({ messages: [bad] }, ctx), 400, "messages[0].tool_calls[0].function.arguments");
    expectError(() => parseChatRequest(chat({ tools: "f" }), ctx), 400, "tools", "invalid_type");
    expectError(() => parseChatRequest(chat({ tools: [1] }), ctx), 400, "tools[0]", "invalid_type");
    expectError(() => parseChatRequest(chat({ chat_template_kwargs: [] }), ctx), 400, "chat_template_kwargs", "invalid_type");
    expectError(() => parseChatRequest(chat({ role_mapping: { user: 1 } }), ctx), 400, "role_mapping", "invalid_type");
  });
});

describe("prompt", () => {
  test("missing or of the wrong type", () => {
    expectError(() => parseCompletionRequest({ model: "org/model" }, ctx), 400, "prompt", "missing_required_parameter");
    expectError(() => parseCompletionRequest(completion({ prompt: 5 }), ctx), 400, "prompt", "invalid_type");
    expectError(() => parseCompletionRequest(completion({ prompt: [] }), ctx), 400, "prompt", "invalid_type");
    expectError(() => parseCompletionRequest(completion({ prompt: { a: 1 } }), ctx), 400, "prompt", "invalid_type");
  });
  test("token-id prompts must be in the vocabulary", () => {
    expectError(() => parseCompletionRequest(completion({ prompt: [1, 1000] }), ctx), 400, "prompt", "invalid_value");
    expectError(() => parseCompletionRequest(completion({ prompt: [1, 2.5] }), ctx), 400, "prompt", "invalid_value");
    expect(parseCompletionRequest(completion({ prompt: [2, 5, 9] }), ctx).prompt).toEqual([2, 5, 9]);
    expect(parseCompletionRequest(completion({ prompt: ["one"] }), ctx).prompt).toBe("one");
  });
});

describe("model names", () => {
  test("an unknown model is a 404 model_not_found", () => {
    const e = expectError(() => parseChatRequest(chat({ model: "gpt-4" }), ctx), 404, "model", "model_not_found");
    expect(e.message).toContain("gpt-4");
    expectError(() => parseCompletionRequest(completion({ model: "gpt-4" }), ctx), 404, "model", "model_not_found");
  });
  test("the served id, its aliases, default_model and no model are accepted", () => {
    for (const model of ["org/model", "/models/model", "default_model", undefined, null]) {
      expect(parseChatRequest(chat({ model }), ctx).kind).toBe("chat");
    }
    expect(parseChatRequest(chat({ model: undefined }), ctx).model).toBe("default_model");
  });
  test("with no list of names any model is accepted", () => {
    expect(parseChatRequest(chat({ model: "gpt-4" }), { ...ctx, modelIds: [] }).model).toBe("gpt-4");
  });
});

describe("good requests", () => {
  test("mlx_lm.server's defaults", () => {
    const p = parseChatRequest(chat(), ctx);
    expect(p).toMatchObject({
      stream: false,
      includeUsage: false,
      maxTokens: 512,
      stop: [],
      logprobs: undefined,
      tools: null,
      sampling: { temperature: 0, topP: 1, topK: 0, minP: 0 },
    });
    expect(p.sampling.seed).toBeUndefined();
    expect(p.sampling.repetitionPenalty).toBeUndefined();
  });

  test("every field maps to the runtime's names", () => {
    const p = parseChatRequest(
      chat({
        stream: true,
        stream_options: { include_usage: true },
        max_tokens: 7,
        temperature: 0.7,
        top_p: 0.9,
        top_k: 40,
        min_p: 0.05,
        repetition_penalty: 1.1,
        repetition_context_size: 30,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        logit_bias: { "5": -100, "7": 2.5 },
        stop: "END",
        logprobs: true,
        top_logprobs: 3,
        seed: 42,
        tools: [{ type: "function", function: { name: "f" } }],
        chat_template_kwargs: { enable_thinking: true },
      }),
      ctx,
    );
    expect(p).toMatchObject({ stream: true, includeUsage: true, maxTokens: 7, stop: ["END"], logprobs: 3, chatTemplateKwargs: { enable_thinking: true } });
    expect(p.tools).toHaveLength(1);
    expect(p.sampling).toEqual({
      temperature: 0.7,
      topP: 0.9,
      topK: 40,
      minP: 0.05,
      repetitionPenalty: 1.1,
      presencePenalty: 0.5,
      frequencyPenalty: 0.25,
      penaltyContext: 30,
      logitBias: { 5: -100, 7: 2.5 },
      seed: 42,
    });
  });

  test("max_completion_tokens wins over max_tokens; null means the default", () => {
    expect(parseChatRequest(chat({ max_tokens: 5, max_completion_tokens: 9 }), ctx).maxTokens).toBe(9);
    expect(parseChatRequest(chat({ max_tokens: null }), ctx).maxTokens).toBe(512);
    expect(parseChatRequest(chat(), { ...ctx, defaults: { ...ctx.defaults, maxTokens: 64 } }).maxTokens).toBe(64);
  });

  test("logprobs: chat booleans; completions also take the legacy integer", () => {
    expect(parseChatRequest(chat({ logprobs: true }), ctx).logprobs).toBe(0);
    expect(parseChatRequest(chat({ logprobs: false, top_logprobs: 2 }), ctx).logprobs).toBe(2);
    expect(parseChatRequest(chat({ top_logprobs: -1 }), ctx).logprobs).toBeUndefined();
    expect(parseCompletionRequest(completion({ logprobs: 3 }), ctx).logprobs).toBe(3);
    expect(parseCompletionRequest(completion({ logprobs: true }), ctx).logprobs).toBe(0);
    expectError(() => parseCompletionRequest(completion({ logprobs: 21 }), ctx), 400, "logprobs", "invalid_value");
    expectError(() => parseChatRequest(chat({ logprobs: 2 }), ctx), 400, "logprobs", "invalid_type");
  });

  test("stop lists drop empty strings; repetition_penalty 0 (mlx_lm.server's default) is off", () => {
    const p = parseChatRequest(chat({ stop: ["a", "", "b"], repetition_penalty: 0 }), ctx);
    expect(p.stop).toEqual(["a", "b"]);
    expect(p.sampling.repetitionPenalty).toBeUndefined();
  });

  test("xtc_probability / xtc_threshold reach the sampling settings (mlx_lm.server's defaults: 0, 0.1)", () => {
    const p = parseChatRequest(chat({ temperature: 1, xtc_probability: 0.5, xtc_threshold: 0.2 }), ctx);
    expect(p.sampling).toMatchObject({ xtcProbability: 0.5, xtcThreshold: 0.2 });
    expect(parseCompletionRequest(completion({ xtc_probability: 1 }), ctx).sampling).toMatchObject({ xtcProbability: 1, xtcThreshold: 0.1 });
    // Off: nothing reaches the runtime, and a threshold up to 1 passes as in mlx_lm.server.
    const off = parseChatRequest(chat({ xtc_probability: 0, xtc_threshold: 0.9 }), ctx).sampling;
    expect(off.xtcProbability).toBeUndefined();
    expect(off.xtcThreshold).toBeUndefined();
    // On: apply_xtc's range [0, 0.5].
    const e = expectError(() => parseChatRequest(chat({ xtc_probability: 0.5, xtc_threshold: 0.6 }), ctx), 400, "xtc_threshold", "invalid_value");
    expect(e.message).toBe("xtc_threshold must be at most 0.5 when xtc_probability > 0, got 0.6");
    // Server-wide defaults apply when the request leaves them out.
    const d = parseChatRequest(chat(), { ...ctx, defaults: { ...ctx.defaults, xtcProbability: 0.3, xtcThreshold: 0.05 } });
    expect(d.sampling).toMatchObject({ xtcProbability: 0.3, xtcThreshold: 0.05 });
  });

  test("n: 1..MAX_CHOICES (default 1); each choice is its own request, seeded choices get seed + i", () => {
    expect(parseChatRequest(chat(), ctx).n).toBe(1);
    expect(parseCompletionRequest(completion({ n: MAX_CHOICES }), ctx).n).toBe(MAX_CHOICES);
    expect(apiError(() => parseChatRequest(chat({ n: 17 }), ctx)).message).toBe("n must be at most 16, got 17");
    expectError(() => parseChatRequest(chat({ n: 3 }), { ...ctx, maxChoices: 2 }), 400, "n", "invalid_value");
    const q = parseChatRequest(chat({ n: 3, seed: 40, temperature: 1 }), ctx);
    const r = toGenerateRequest(q, [2, 9], 4096);
    const rs = choiceRequests(r, q.n);
    expect(rs.map((x) => x.sampling?.seed)).toEqual([40, 41, 42]);
    expect(rs[0]).toBe(r);
    expect(rs.every((x) => x.sampling?.temperature === 1 && x.promptIds === r.promptIds)).toBe(true);
    const unseeded = choiceRequests(toGenerateRequest(parseChatRequest(chat({ n: 2 }), ctx), [2, 9], 4096), 2);
    expect(unseeded.map((x) => x.sampling?.seed)).toEqual([undefined, undefined]);
  });
});

describe("prompt against the context", () => {
  const p = () => parseCompletionRequest(completion({ max_tokens: 100 }), ctx);
  test("a prompt longer than the context is a 400 context_length_exceeded", () => {
    const e = expectError(() => toGenerateRequest(p(), new Array(64).fill(3), 64), 400, "prompt", "context_length_exceeded");
    expect(e.message).toContain("64");
    expectError(() => toGenerateRequest(p(), new Array(80).fill(3), 64), 400, "prompt", "context_length_exceeded");
    const c = parseChatRequest(chat(), ctx);
    expectError(() => toGenerateRequest(c, new Array(80).fill(3), 64), 400, "messages", "context_length_exceeded");
  });
  test("an empty prompt is a 400", () => {
    expectError(() => toGenerateRequest(p(), [], 64), 400, "prompt", "invalid_value");
  });
  test("max_tokens is capped to the room left", () => {
    expect(toGenerateRequest(p(), [1, 2, 3], 64).maxTokens).toBe(61);
    expect(toGenerateRequest(p(), [1, 2, 3], 4096).maxTokens).toBe(100);
  });
  test("the request carries prompt, sampling, stop, logprobs and the signal", () => {
    const ac = new AbortController();
    const q = parseChatRequest(chat({ stop: ["x"], top_logprobs: 2, seed: 1, max_tokens: 5 }), ctx);
    const r = toGenerateRequest(q, [2, 9], 4096, ac.signal);
    expect(r).toEqual({ promptIds: [2, 9], maxTokens: 5, sampling: q.sampling, stop: ["x"], logprobs: 2, signal: ac.signal, keepSpecialTokens: true });
  });
});

test("convert_chat as mlx_lm.server (models without a chat template)", () => {
  expect(
    convertChat([
      { role: "system", content: "be nice" },
      { role: "user", content: "hi" },
    ]),
  ).toBe("ASSISTANT's RULE: be nice\nUSER: hi\nASSISTANT:");
  expect(convertChat([{ role: "user", content: "hi" }], { user: "U> ", assistant: "A> ", stop: "|" })).toBe("U> hi|A>");
});

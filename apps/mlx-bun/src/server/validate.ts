// Request parsing and validation for the OpenAI-compatible endpoints, with the fields and defaults
// of mlx_lm.server (mlx_lm/server.py do_POST / validate_model_parameters). No model is needed
// here: what depends on the model (vocabulary size, accepted model names, context length) comes in
// as plain numbers and strings, so every bad request can be unit-tested on its own.
import type { ChatMessage, PreprocessedImage } from "@mlx-bun/models";
import type { GenerateRequest, SamplingParams, StructuredFormat, ToolSpec } from "@mlx-bun/runtime";
import { ApiError, badField } from "./errors.ts";
import { type ImageItem, imagePart } from "./images.ts";

/** Server-wide defaults (mlx_lm.server's --max-tokens, --temp, --top-p, --top-k, --min-p; XTC is ours). */
export interface RequestDefaults {
  maxTokens: number;
  temperature: number;
  topP: number;
  topK: number;
  minP: number;
  /** xtc_probability (default 0 = off) and xtc_threshold (default 0.1), as mlx_lm.server's request defaults. */
  xtcProbability?: number;
  xtcThreshold?: number;
}

export const MLX_LM_SERVER_DEFAULTS: RequestDefaults = { maxTokens: 512, temperature: 0, topP: 1, topK: 0, minP: 0, xtcProbability: 0, xtcThreshold: 0.1 };

/** The most choices (`n`) one request may ask for, unless the context says otherwise. */
export const MAX_CHOICES = 16;

/** What validation needs to know about the served model. */
export interface ValidationContext {
  defaults: RequestDefaults;
  /** Token ids are 0..vocabSize-1 (logit_bias keys, token-id prompts). */
  vocabSize: number;
  /** Names a request's "model" may use; empty = any name is accepted. */
  modelIds: readonly string[];
  /** Largest `n` (default MAX_CHOICES). */
  maxChoices?: number;
}

export interface ParsedCommon {
  /** The "model" field as sent (echoed back in responses). */
  model: string;
  stream: boolean;
  /** stream_options.include_usage */
  includeUsage: boolean;
  maxTokens: number;
  sampling: SamplingParams;
  stop: string[];
  /** undefined: no log-probabilities; n: the chosen token's plus n top alternatives. */
  logprobs: number | undefined;
  /** num_draft_tokens (speculative decoding with the server's --draft-model; 0 = off). */
  numDraftTokens?: number;
  /** n: choices to generate, each its own request (1..maxChoices). */
  n: number;
}

export interface ParsedChat extends ParsedCommon {
  kind: "chat";
  messages: ChatMessage[];
  /** The images of image_url parts, read and preprocessed (server/images.ts), in prompt order. */
  images?: PreprocessedImage[];
  /** Tool schemas passed to the chat template (null when none). */
  tools: unknown[] | null;
  chatTemplateKwargs: Record<string, unknown> | null;
  /** mlx_lm.server's role_mapping, used only for a model without a chat template. */
  roleMapping: Record<string, string> | null;
  /** tool_choice: "auto" (default with tools), "none", "required", or one named function. */
  toolChoice: ToolChoice;
  /** response_format json_object / json_schema: the output is constrained by a grammar; null: text. */
  responseFormat: StructuredFormat | null;
}

/** OpenAI's tool_choice. */
export type ToolChoice = { type: "auto" } | { type: "none" } | { type: "required" } | { type: "function"; name: string };

/** The function names declared in `tools` (OpenAI's {type: "function", function: {name}}). */
export function toolNames(tools: readonly unknown[] | null): string[] {
  return (tools ?? []).flatMap((t) => {
    const fn = isObject(t) && isObject(t.function) ? t.function : isObject(t) ? t : null;
    return fn && typeof fn.name === "string" ? [fn.name] : [];
  });
}

/** The functions a forced tool choice allows, with their parameter schemas (one for a named choice). */
export function toolSpecs(tools: readonly unknown[] | null, choice: ToolChoice): ToolSpec[] {
  const all = (tools ?? []).flatMap((t): ToolSpec[] => {
    const fn = isObject(t) && isObject(t.function) ? t.function : isObject(t) ? t : null;
    return fn && typeof fn.name === "string" ? [{ name: fn.name, parameters: fn.parameters }] : [];
  });
  return choice.type === "function" ? all.filter((t) => t.name === choice.name) : all;
}

function parseToolChoice(v: unknown, tools: unknown[] | null): ToolChoice {
  if (v === undefined || v === null || v === "auto") return { type: "auto" };
  if (v === "none") return { type: "none" };
  const names = toolNames(tools);
  if (v === "required") {
    if (!names.length) throw badField("tool_choice", 'tool_choice "required" needs at least one function in tools');
    return { type: "required" };
  }
  if (isObject(v) && v.type === "function" && isObject(v.function) && typeof v.function.name === "string") {
    const name = v.function.name;
    if (!names.includes(name))
      throw badField("tool_choice", `tool_choice names the function '${name}', which is not in tools (${names.map((n) => `'${n}'`).join(", ") || "none"})`);
    return { type: "function", name };
  }
  throw badField(
    "tool_choice",
    'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
    typeof v === "string" ? "invalid_value" : "invalid_type",
  );
}

/** OpenAI's reasoning_effort → Gemma 4's enable_thinking ("none" turns thinking off; the template has no effort levels). */
function reasoningEffort(v: unknown): boolean | undefined {
  if (v === undefined || v === null) return undefined;
  const levels = ["none", "minimal", "low", "medium", "high"];
  if (typeof v !== "string" || !levels.includes(v))
    throw badField(
      "reasoning_effort",
      `reasoning_effort must be one of ${levels.map((l) => `"${l}"`).join(", ")}`,
      typeof v === "string" ? "invalid_value" : "invalid_type",
    );
  return v !== "none";
}

export interface ParsedCompletion extends ParsedCommon {
  kind: "completion";
  /** Text (tokenized with the tokenizer's special tokens, as mlx_lm.server) or token ids. */
  prompt: string | number[];
}

export type ParsedRequest = ParsedChat | ParsedCompletion;

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

const typeName = (v: unknown): string => (v === null ? "null" : Array.isArray(v) ? "array" : typeof v);

/** Parse a request body: malformed JSON and non-object bodies are 400s. */
export function parseJsonBody(text: string): Record<string, unknown> {
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch (e) {
    throw new ApiError(400, `Invalid JSON in request body: ${(e as Error).message}`, null, "invalid_json");
  }
  if (!isObject(body)) throw new ApiError(400, `Request body must be a JSON object, got ${typeName(body)}`, null, "invalid_json");
  return body;
}

// ---- typed field readers: absent (undefined) or null → the default ----------------------------

interface NumberRule {
  min?: number;
  max?: number;
  /** min/max exclusive */
  exclusiveMin?: boolean;
}

function num(body: Record<string, unknown>, key: string, def: number, rule: NumberRule = {}): number {
  const v = body[key];
  if (v === undefined || v === null) return def;
  if (typeof v !== "number" || !Number.isFinite(v)) throw badField(key, `${key} must be a number, got ${typeName(v)}`, "invalid_type");
  return range(key, v, rule);
}

function int(body: Record<string, unknown>, key: string, def: number, rule: NumberRule = {}): number {
  const v = body[key];
  if (v === undefined || v === null) return def;
  if (typeof v !== "number" || !Number.isInteger(v))
    throw badField(key, `${key} must be an integer, got ${typeof v === "number" ? v : typeName(v)}`, "invalid_type");
  return range(key, v, rule);
}

function range(key: string, v: number, rule: NumberRule): number {
  if (rule.min !== undefined && (rule.exclusiveMin ? v <= rule.min : v < rule.min)) {
    throw badField(key, `${key} must be ${rule.exclusiveMin ? "greater than" : "at least"} ${rule.min}, got ${v}`);
  }
  if (rule.max !== undefined && v > rule.max) throw badField(key, `${key} must be at most ${rule.max}, got ${v}`);
  return v;
}

function bool(body: Record<string, unknown>, key: string, def: boolean, label = key): boolean {
  const v = body[key];
  if (v === undefined || v === null) return def;
  if (typeof v !== "boolean") throw badField(label, `${label} must be a boolean, got ${typeName(v)}`, "invalid_type");
  return v;
}

function str(body: Record<string, unknown>, key: string): string | undefined {
  const v = body[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "string") throw badField(key, `${key} must be a string, got ${typeName(v)}`, "invalid_type");
  return v;
}

function obj(body: Record<string, unknown>, key: string): Record<string, unknown> | null {
  const v = body[key];
  if (v === undefined || v === null) return null;
  if (!isObject(v)) throw badField(key, `${key} must be an object, got ${typeName(v)}`, "invalid_type");
  return v;
}

function unsupported(param: string, message: string): ApiError {
  return new ApiError(400, message, param, "unsupported_parameter");
}

// ---- the fields every endpoint shares -----------------------------------------------------------

function parseCommon(body: Record<string, unknown>, ctx: ValidationContext, endpoint: "chat" | "completion"): ParsedCommon {
  const model = str(body, "model") ?? "default_model";
  if (ctx.modelIds.length && model !== "default_model" && !ctx.modelIds.includes(model)) {
    throw new ApiError(
      404,
      `The model '${model}' does not exist; this server serves ${ctx.modelIds.map((m) => `'${m}'`).join(", ")}`,
      "model",
      "model_not_found",
    );
  }
  const stream = bool(body, "stream", false);
  let includeUsage = false;
  const so = obj(body, "stream_options");
  if (so) includeUsage = bool(so, "include_usage", false, "stream_options.include_usage");

  // max_completion_tokens (OpenAI's newer name) wins over max_tokens, as in mlx_lm.server.
  const maxKey = body.max_completion_tokens !== undefined && body.max_completion_tokens !== null ? "max_completion_tokens" : "max_tokens";
  const maxTokens = int(body, maxKey, ctx.defaults.maxTokens, { min: 1 });

  const temperature = num(body, "temperature", ctx.defaults.temperature, { min: 0 });
  const topP = num(body, "top_p", ctx.defaults.topP, { min: 0, max: 1 });
  const topK = int(body, "top_k", ctx.defaults.topK, { min: 0 });
  const minP = num(body, "min_p", ctx.defaults.minP, { min: 0, max: 1 });
  // mlx_lm.server's default repetition_penalty is 0.0, which (like 1.0) turns it off.
  const repetitionPenalty = num(body, "repetition_penalty", 0, { min: 0 });
  const presencePenalty = num(body, "presence_penalty", 0);
  const frequencyPenalty = num(body, "frequency_penalty", 0);
  const ctxSizes = ["repetition_context_size", "presence_context_size", "frequency_context_size"]
    .filter((k) => body[k] !== undefined && body[k] !== null)
    .map((k) => [k, int(body, k, 20, { min: 0 })] as const);
  if (new Set(ctxSizes.map(([, v]) => v)).size > 1) {
    throw unsupported(ctxSizes[1]![0], `the penalties share one context size here; got ${ctxSizes.map(([k, v]) => `${k}=${v}`).join(", ")}`);
  }
  const penaltyContext = ctxSizes[0]?.[1] ?? 20;

  // XTC (mlx_lm.server's xtc_probability / xtc_threshold, both in [0, 1]). With XTC on, the
  // threshold must also be in apply_xtc's [0, 0.5] (mlx_lm.server fails later, while sampling).
  const xtcProbability = num(body, "xtc_probability", ctx.defaults.xtcProbability ?? 0, { min: 0, max: 1 });
  const xtcThreshold = num(body, "xtc_threshold", ctx.defaults.xtcThreshold ?? 0.1, { min: 0, max: 1 });
  if (xtcProbability > 0 && xtcThreshold > 0.5)
    throw badField("xtc_threshold", `xtc_threshold must be at most 0.5 when xtc_probability > 0, got ${xtcThreshold}`);
  // Speculative decoding uses the server's --draft-model; num_draft_tokens 0 turns it off per request.
  const numDraftTokens =
    body.num_draft_tokens === undefined || body.num_draft_tokens === null ? undefined : int(body, "num_draft_tokens", 0, { min: 0, max: 64 });
  if (body.draft_model !== undefined && body.draft_model !== null && body.draft_model !== "default_model") {
    throw unsupported("draft_model", 'only the server\'s --draft-model ("default_model") can be used for speculative decoding');
  }
  if (body.adapters !== undefined && body.adapters !== null) {
    str(body, "adapters");
    throw unsupported("adapters", "adapters are not supported");
  }
  const n = int(body, "n", 1, { min: 1, max: ctx.maxChoices ?? MAX_CHOICES });

  let seed: number | undefined;
  if (body.seed !== undefined && body.seed !== null) seed = int(body, "seed", 0);

  let logitBias: Record<number, number> | undefined;
  const lb = obj(body, "logit_bias");
  if (lb) {
    logitBias = {};
    for (const [k, v] of Object.entries(lb)) {
      const id = /^-?\d+$/.test(k.trim()) ? Number(k) : Number.NaN;
      if (!Number.isInteger(id) || typeof v !== "number" || !Number.isFinite(v)) {
        throw badField("logit_bias", "logit_bias must be a dict of int to float", "invalid_type");
      }
      if (id < 0 || id >= ctx.vocabSize) throw badField("logit_bias", `logit_bias: token id ${id} is outside the vocabulary (0..${ctx.vocabSize - 1})`);
      logitBias[id] = v;
    }
  }

  // stop: a string or a list of strings (mlx_lm.server: `stop or []`).
  let stop: string[] = [];
  const s = body.stop;
  if (typeof s === "string") stop = [s];
  else if (Array.isArray(s)) {
    s.forEach((x, i) => {
      if (typeof x !== "string") throw badField("stop", `stop[${i}] must be a string, got ${typeName(x)}`, "invalid_type");
    });
    stop = s as string[];
  } else if (s !== undefined && s !== null) throw badField("stop", `stop must be a string or a list of strings, got ${typeName(s)}`, "invalid_type");
  stop = stop.filter((x) => x.length > 0);

  // logprobs: a boolean (mlx_lm.server, chat); /v1/completions also takes OpenAI's legacy integer.
  let wantLogprobs = false;
  let legacyTop: number | undefined;
  const lp = body.logprobs;
  if (endpoint === "completion" && typeof lp === "number") {
    legacyTop = int(body, "logprobs", 0, { min: 0, max: 20 });
    wantLogprobs = true;
  } else wantLogprobs = bool(body, "logprobs", false);
  // top_logprobs: 0..20 (OpenAI; mlx_lm.server allows 0..11 and -1 for none).
  const top = int(body, "top_logprobs", -1, { min: -1, max: 20 });
  let logprobs: number | undefined;
  if (legacyTop !== undefined) logprobs = Math.max(legacyTop, top);
  else if (top > 0) logprobs = top;
  else if (wantLogprobs) logprobs = 0;

  const sampling: SamplingParams = { temperature, topP, topK, minP };
  if (repetitionPenalty !== 0 && repetitionPenalty !== 1) sampling.repetitionPenalty = repetitionPenalty;
  if (presencePenalty !== 0) sampling.presencePenalty = presencePenalty;
  if (frequencyPenalty !== 0) sampling.frequencyPenalty = frequencyPenalty;
  if (sampling.repetitionPenalty !== undefined || sampling.presencePenalty !== undefined || sampling.frequencyPenalty !== undefined) {
    sampling.penaltyContext = penaltyContext;
  }
  if (logitBias) sampling.logitBias = logitBias;
  if (xtcProbability > 0) {
    sampling.xtcProbability = xtcProbability;
    sampling.xtcThreshold = xtcThreshold;
  }
  if (seed !== undefined) sampling.seed = seed;

  return { model, stream, includeUsage, maxTokens, sampling, stop, logprobs, n, ...(numDraftTokens !== undefined ? { numDraftTokens } : {}) };
}

// ---- /v1/chat/completions --------------------------------------------------------------------

function parseMessages(v: unknown): ChatMessage[] {
  if (v === undefined || v === null) throw new ApiError(400, "Request did not contain messages", "messages", "missing_required_parameter");
  if (!Array.isArray(v)) throw badField("messages", `messages must be a list, got ${typeName(v)}`, "invalid_type");
  if (v.length === 0) throw badField("messages", "messages must not be empty");
  return v.map((m, i): ChatMessage => {
    const p = `messages[${i}]`;
    if (!isObject(m)) throw badField(p, `${p} must be an object, got ${typeName(m)}`, "invalid_type");
    if (typeof m.role !== "string" || !m.role)
      throw badField(`${p}.role`, `${p}.role must be a non-empty string`, typeof m.role === "string" ? "invalid_value" : "invalid_type");
    const out: ChatMessage = { ...m, role: m.role };
    // content: a string, null, or a list of text parts (joined, as mlx_lm.server's process_message_content);
    // with image_url parts, the list of the template's items (text and image: server/images.ts).
    const c = m.content;
    if (c === undefined || c === null) out.content = "";
    else if (Array.isArray(c)) {
      const parts = c.map((part, j): string | ImageItem => {
        const pp = `${p}.content[${j}]`;
        if (!isObject(part)) throw badField(pp, `${pp} must be an object`, "invalid_type");
        if (part.type === "image_url") return imagePart(pp, part);
        if (part.type !== "text") throw unsupported(pp, `${pp}: only 'text' and 'image_url' content parts are supported, got ${JSON.stringify(part.type)}`);
        if (typeof part.text !== "string") throw badField(`${pp}.text`, `${pp}.text must be a string`, "invalid_type");
        return part.text;
      });
      out.content = parts.every((x) => typeof x === "string") ? parts.join("") : parts.map((x) => (typeof x === "string" ? { type: "text", text: x } : x));
    } else if (typeof c !== "string")
      throw badField(`${p}.content`, `${p}.content must be a string, a list of text parts or null, got ${typeName(c)}`, "invalid_type");
    // Tool-call arguments sent as JSON strings reach the template as objects (mlx_lm.server does the same).
    if (m.tool_calls !== undefined && m.tool_calls !== null) {
      if (!Array.isArray(m.tool_calls)) throw badField(`${p}.tool_calls`, `${p}.tool_calls must be a list`, "invalid_type");
      out.tool_calls = m.tool_calls.map((tc, j) => {
        const tp = `${p}.tool_calls[${j}]`;
        if (!isObject(tc)) throw badField(tp, `${tp} must be an object`, "invalid_type");
        const fn = tc.function;
        if (fn === undefined || fn === null) return tc;
        if (!isObject(fn)) throw badField(`${tp}.function`, `${tp}.function must be an object`, "invalid_type");
        let args = fn.arguments;
        if (typeof args === "string" && args.length) {
          try {
            args = JSON.parse(args);
          } catch {
            throw badField(`${tp}.function.arguments`, `${tp}.function.arguments must be a JSON object string`);
          }
        }
        return { ...tc, function: { ...fn, arguments: args } };
      });
    }
    return out;
  });
}

export function parseChatRequest(body: Record<string, unknown>, ctx: ValidationContext): ParsedChat {
  const messages = parseMessages(body.messages);
  const common = parseCommon(body, ctx, "chat");
  let tools: unknown[] | null = null;
  const t = body.tools;
  if (Array.isArray(t)) {
    t.forEach((x, i) => {
      if (!isObject(x)) throw badField(`tools[${i}]`, `tools[${i}] must be an object`, "invalid_type");
    });
    tools = t.length ? t : null;
  } else if (t !== undefined && t !== null) throw badField("tools", `tools must be a list, got ${typeName(t)}`, "invalid_type");
  const toolChoice = parseToolChoice(body.tool_choice, tools);
  let chatTemplateKwargs = obj(body, "chat_template_kwargs");
  // reasoning_effort sets enable_thinking unless chat_template_kwargs sets it itself.
  const thinking = reasoningEffort(body.reasoning_effort);
  if (thinking !== undefined && chatTemplateKwargs?.enable_thinking === undefined) chatTemplateKwargs = { ...chatTemplateKwargs, enable_thinking: thinking };
  const rm = obj(body, "role_mapping");
  let roleMapping: Record<string, string> | null = null;
  if (rm) {
    for (const [k, v] of Object.entries(rm)) if (typeof v !== "string") throw badField("role_mapping", `role_mapping.${k} must be a string`, "invalid_type");
    roleMapping = rm as Record<string, string>;
  }
  const responseFormat = parseResponseFormat(body.response_format, tools, toolChoice);
  return { kind: "chat", ...common, messages, tools, chatTemplateKwargs, roleMapping, toolChoice, responseFormat };
}

/**
 * OpenAI's response_format: {type: "text"} (the default), {type: "json_object"}, or
 * {type: "json_schema", json_schema: {name, description?, schema?, strict?}}. Every field is read:
 * unknown ones are 400s. The schema itself is checked when its grammar is built (http.ts).
 */
export function parseResponseFormat(v: unknown, tools: unknown[] | null = null, toolChoice: ToolChoice = { type: "auto" }): StructuredFormat | null {
  if (v === undefined || v === null) return null;
  const P = "response_format";
  if (!isObject(v)) throw badField(P, `${P} must be an object, got ${typeName(v)}`, "invalid_type");
  const only = (o: Record<string, unknown>, path: string, keys: string[]) => {
    for (const k of Object.keys(o)) if (!keys.includes(k)) throw badField(P, `${path}.${k} is not a known field (expected ${keys.join(", ")})`);
  };
  let out: StructuredFormat | null;
  if (v.type === "text") {
    only(v, P, ["type"]);
    out = null;
  } else if (v.type === "json_object") {
    only(v, P, ["type"]);
    out = { type: "json_object" };
  } else if (v.type === "json_schema") {
    only(v, P, ["type", "json_schema"]);
    const js = v.json_schema;
    if (!isObject(js))
      throw badField(P, `${P}.json_schema must be an object, got ${typeName(js)}`, js === undefined ? "missing_required_parameter" : "invalid_type");
    only(js, `${P}.json_schema`, ["name", "description", "schema", "strict"]);
    if (typeof js.name !== "string" || !/^[A-Za-z0-9_-]{1,64}$/.test(js.name)) {
      throw badField(P, `${P}.json_schema.name must be 1-64 letters, digits, underscores or dashes, got ${JSON.stringify(js.name)}`);
    }
    if (js.description !== undefined && js.description !== null && typeof js.description !== "string")
      throw badField(P, `${P}.json_schema.description must be a string`, "invalid_type");
    // strict: accepted; the schema is always enforced (strict or not), as OpenAI's strict mode.
    if (js.strict !== undefined && js.strict !== null && typeof js.strict !== "boolean")
      throw badField(P, `${P}.json_schema.strict must be a boolean`, "invalid_type");
    const schema = js.schema;
    if (schema !== undefined && schema !== null && !isObject(schema) && typeof schema !== "boolean")
      throw badField(P, `${P}.json_schema.schema must be an object, got ${typeName(schema)}`, "invalid_type");
    out = { type: "json_schema", schema: schema ?? {} };
  } else {
    throw badField(P, `${P}.type must be "text", "json_object" or "json_schema", got ${JSON.stringify(v.type)}`);
  }
  // The grammar allows only the JSON: a tool call could never be generated.
  if (out && tools && toolChoice.type !== "none") {
    throw unsupported(P, `${P} ${out.type} together with tools is not supported (a tool call could not be generated); send tool_choice "none" or no tools`);
  }
  return out;
}

// ---- /v1/completions -------------------------------------------------------------------------

const IMAGE_PART_TYPES = ["image_url", "image", "input_image"];
/** /v1/completions takes no images, as OpenAI's: said in each such 400. */
export const NO_COMPLETION_IMAGES = "/v1/completions takes no images (as OpenAI's API): send image_url content parts to /v1/chat/completions";

export function parseCompletionRequest(body: Record<string, unknown>, ctx: ValidationContext): ParsedCompletion {
  const p = body.prompt;
  let prompt: string | number[];
  if (p === undefined || p === null) throw new ApiError(400, "Request did not contain a prompt", "prompt", "missing_required_parameter");
  if (typeof p === "string") prompt = p;
  else if (Array.isArray(p) && p.length === 1 && typeof p[0] === "string") prompt = p[0];
  else if (Array.isArray(p) && p.length > 0 && p.every((x) => typeof x === "number")) {
    for (const x of p as number[]) {
      if (!Number.isInteger(x) || x < 0 || x >= ctx.vocabSize)
        throw badField("prompt", `prompt token id ${x} is outside the vocabulary (0..${ctx.vocabSize - 1})`);
    }
    prompt = p as number[];
  } else if (Array.isArray(p) && p.some((x) => isObject(x) && IMAGE_PART_TYPES.includes(x.type as string))) {
    throw unsupported("prompt", `${NO_COMPLETION_IMAGES}: the prompt is a string or a list of token ids`);
  } else if (Array.isArray(p) && p.length > 1 && p.every((x) => typeof x === "string")) {
    throw unsupported("prompt", "a list of several prompts is not supported; send one request per prompt");
  } else throw badField("prompt", `prompt must be a string or a list of token ids, got ${typeName(p)}`, "invalid_type");
  // Image fields of other servers' completions APIs (vLLM's multi_modal_data, llama.cpp's image_data, …).
  for (const k of ["images", "image", "image_url", "image_data", "input_image", "multi_modal_data"])
    if (body[k] !== undefined && body[k] !== null) throw unsupported(k, `${NO_COMPLETION_IMAGES}; '${k}' is not a field of it`);
  const common = parseCommon(body, ctx, "completion");
  if (bool(body, "echo", false)) throw unsupported("echo", "echo is not supported");
  if (str(body, "suffix")) throw unsupported("suffix", "suffix is not supported");
  const bestOf = int(body, "best_of", 1, { min: 1 });
  if (bestOf !== 1) throw unsupported("best_of", "only best_of=1 is supported");
  // Neither OpenAI's legacy completions nor mlx_lm.server take response_format here.
  if (body.response_format !== undefined && body.response_format !== null) {
    throw unsupported("response_format", "response_format is only supported by /v1/chat/completions");
  }
  return { kind: "completion", ...common, prompt };
}

// ---- the prompt against the context ----------------------------------------------------------

/**
 * The generation request of a parsed request whose prompt is `promptIds`. A prompt that leaves no
 * room in the context (max_position_embeddings) is a 400; max_tokens is capped to the room left.
 * For `n` > 1 see choiceRequests.
 */
export function toGenerateRequest(parsed: ParsedRequest, promptIds: number[], contextLength: number, signal?: AbortSignal): GenerateRequest {
  if (promptIds.length === 0) throw badField(parsed.kind === "chat" ? "messages" : "prompt", "the prompt is empty");
  if (promptIds.length >= contextLength) {
    throw new ApiError(
      400,
      `This model's maximum context length is ${contextLength} tokens, but the prompt has ${promptIds.length} tokens (at least one token must be left to generate)`,
      parsed.kind === "chat" ? "messages" : "prompt",
      "context_length_exceeded",
    );
  }
  const req: GenerateRequest = {
    promptIds,
    maxTokens: Math.min(parsed.maxTokens, contextLength - promptIds.length),
    sampling: parsed.sampling,
    stop: parsed.stop,
  };
  // Special tokens stay in the text, as mlx_lm.server's: Gemma 4's tool-call and thinking delimiters are special tokens.
  req.keepSpecialTokens = true;
  if (parsed.logprobs !== undefined) req.logprobs = parsed.logprobs;
  if (parsed.numDraftTokens !== undefined) req.numDraftTokens = parsed.numDraftTokens;
  if (signal) req.signal = signal;
  return req;
}

/**
 * The requests of the `n` choices: one row each. With a seed, choice i samples with seed + i, so
 * seeded choices differ from one another and each is reproducible (choice 0 is what n = 1 gives).
 */
export function choiceRequests(req: GenerateRequest, n: number): GenerateRequest[] {
  return Array.from({ length: n }, (_, i) => {
    if (i === 0) return req;
    const seed = req.sampling?.seed;
    return seed === undefined ? { ...req } : { ...req, sampling: { ...req.sampling, seed: seed + i } };
  });
}

/**
 * mlx_lm.server's convert_chat: the prompt of a chat request for a model without a chat template
 * ("USER: ...\nASSISTANT: "), with its default role mapping.
 */
export function convertChat(messages: readonly ChatMessage[], roleMapping?: Record<string, string> | null): string {
  const rm = roleMapping ?? {
    system_prompt: "A chat between a curious user and an artificial intelligence assistant. The assistant follows the given rules no matter what.",
    system: "ASSISTANT's RULE: ",
    user: "USER: ",
    assistant: "ASSISTANT: ",
    stop: "\n",
  };
  let prompt = "";
  for (const m of messages) prompt += `${rm[m.role] ?? ""}${typeof m.content === "string" ? m.content : ""}${rm.stop ?? ""}`;
  prompt += rm.assistant ?? "";
  return prompt.trimEnd();
}

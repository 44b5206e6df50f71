// OpenAI's Responses API over the server's chat pipeline: POST /v1/responses (whole or streamed
// with the Responses events), GET and DELETE /v1/responses/{id} for stored responses. `input`
// (a string or items: messages, function_call, function_call_output, reasoning) and
// `instructions` become the chat messages /v1/chat/completions would get, after the conversation
// of `previous_response_id` (kept in memory, bounded, when `store` is not false); the output is
// read with the same Gemma 4 parser and written as output items: reasoning, message,
// function_call. Errors have OpenAI's shape, as the other OpenAI endpoints.
import { randomUUID } from "node:crypto";
import type { GenerationResult } from "@mlx-bun/runtime";
import type { OutputPart } from "./chat-output.ts";
import { type ServerCore, type Submission, sse, sseResponse } from "./core.ts";
import { ApiError, badField } from "./errors.ts";
import { toApiError } from "./errors.ts";
import { imageUrlPart, nameImageItems } from "./images.ts";
import { decodePathSegment } from "./limits.ts";
import { type Turn as TurnType, Turn } from "./turn.ts";
import { type ParsedChat, parseChatRequest, parseJsonBody } from "./validate.ts";

type Obj = Record<string, unknown>;
const isObject = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
const typeName = (v: unknown): string => (v === null ? "null" : Array.isArray(v) ? "array" : typeof v);
const hex = () => randomUUID().replaceAll("-", "");

/** Fields of a Responses request this server reads; any other is a 400 (OpenAI: "Unrecognized request argument"). */
const FIELDS = [
  "model",
  "input",
  "instructions",
  "previous_response_id",
  "tools",
  "tool_choice",
  "parallel_tool_calls",
  "max_output_tokens",
  "temperature",
  "top_p",
  "stream",
  "store",
  "metadata",
  "reasoning",
  "text",
  "truncation",
  "include",
  "user",
  "safety_identifier",
  "prompt_cache_key",
  "service_tier",
  "background",
  "stream_options",
  "top_logprobs",
];
/** OpenAI fields with no equivalent here: named in the 400. */
const UNSUPPORTED: Record<string, string> = {
  conversation: "conversations are not supported; chain responses with previous_response_id",
  prompt: "prompt templates are not supported",
  max_tool_calls: "max_tool_calls is not supported",
  context_management: "context management is not supported",
  prompt_cache_retention: "prompt_cache_retention is not supported (the prompt cache is in memory, LRU)",
};

function unsupported(param: string, message: string): ApiError {
  return new ApiError(400, message, param, "unsupported_parameter");
}

function str(v: unknown, param: string, required = false): string | undefined {
  if (v === undefined || v === null) {
    if (required) throw new ApiError(400, `Missing required parameter: '${param}'.`, param, "missing_required_parameter");
    return undefined;
  }
  if (typeof v !== "string") throw badField(param, `Invalid type for '${param}': expected a string, but got ${typeName(v)} instead.`, "invalid_type");
  return v;
}

function bool(v: unknown, param: string): boolean | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "boolean") throw badField(param, `Invalid type for '${param}': expected a boolean, but got ${typeName(v)} instead.`, "invalid_type");
  return v;
}

function checkKeys(o: Obj, allowed: readonly string[], path: string): void {
  for (const k of Object.keys(o)) if (!allowed.includes(k)) throw new ApiError(400, `Unknown parameter: '${path}.${k}'.`, `${path}.${k}`, "unknown_parameter");
}

/** Where each image part of the translated messages came from (its input_image's path), for nameImageItems. */
type ImagePaths = WeakMap<object, string>;

/**
 * An input_image part at `pp` → the chat pipeline's image_url part (server/images.ts reads,
 * decodes and preprocesses it): `image_url` a data: URL, an absolute path / file:// URL, or
 * http(s) with --allow-remote-images; `file_id` (the Files API) is a 400; `detail` is checked and
 * has no effect (Gemma 4's processor has one image size budget).
 */
function inputImage(p: Obj, pp: string, paths: ImagePaths): Obj {
  checkKeys(p, ["type", "image_url", "file_id", "detail"], pp);
  if (p.file_id !== undefined && p.file_id !== null)
    throw unsupported(`${pp}.file_id`, `'${pp}.file_id': file inputs (the Files API) are not supported; send image_url`);
  const url = str(p.image_url, `${pp}.image_url`, true)!;
  if (!url) throw badField(`${pp}.image_url`, `Invalid value for '${pp}.image_url': expected a non-empty URL.`);
  const detail = p.detail;
  if (detail !== undefined && detail !== null && !["auto", "low", "high", "original"].includes(detail as string))
    throw badField(`${pp}.detail`, `Invalid value for '${pp}.detail': expected one of 'auto', 'low', 'high', 'original', got ${JSON.stringify(detail)}.`);
  const part = imageUrlPart(url);
  paths.set(part, `${pp}.image_url`);
  return part;
}

/** A content list of input_text / output_text parts (or a string) as text; with input_image parts, as text and image parts in order. */
function parts(v: unknown, param: string, allowed: readonly string[], paths: ImagePaths): string | Obj[] {
  if (typeof v === "string") return v;
  if (!Array.isArray(v))
    throw badField(param, `Invalid type for '${param}': expected a string or a list of content parts, but got ${typeName(v)} instead.`, "invalid_type");
  const out = v.map((p, i): string | Obj => {
    const pp = `${param}[${i}]`;
    if (!isObject(p)) throw badField(pp, `Invalid type for '${pp}': expected an object, but got ${typeName(p)} instead.`, "invalid_type");
    if (!allowed.includes(p.type as string)) {
      if (p.type === "input_image") throw unsupported(`${pp}.type`, `'${pp}.type': input_image parts are taken in user messages and function_call_output only`);
      if (typeof p.type === "string" && ["input_file", "input_audio", "refusal"].includes(p.type))
        throw unsupported(`${pp}.type`, `'${pp}.type': ${p.type} content is not supported`);
      throw badField(
        `${pp}.type`,
        `Invalid value for '${pp}.type': expected one of ${allowed.map((a) => `'${a}'`).join(", ")}, got ${JSON.stringify(p.type)}.`,
      );
    }
    if (p.type === "input_image") return inputImage(p, pp, paths);
    if (p.type === "output_text") {
      checkKeys(p, ["type", "text", "annotations", "logprobs"], pp);
      if (Array.isArray(p.annotations) && p.annotations.length) throw unsupported(`${pp}.annotations`, `'${pp}.annotations': annotations are not supported`);
    } else checkKeys(p, ["type", "text"], pp);
    return str(p.text, `${pp}.text`, true)!;
  });
  if (out.every((x) => typeof x === "string")) return out.join("");
  return out.map((x) => (typeof x === "string" ? { type: "text", text: x } : x));
}

/**
 * Input items → chat messages (appended to `out`, which may hold a previous response's
 * conversation): a function_call joins the assistant message before it (or starts one), a
 * function_call_output is a tool message named after its call; reasoning items are dropped (as
 * Gemma 4's template drops earlier thinking).
 */
function convertInput(v: unknown, out: Obj[], paths: ImagePaths): void {
  if (v === undefined || v === null) throw new ApiError(400, "Missing required parameter: 'input'.", "input", "missing_required_parameter");
  if (typeof v === "string") {
    out.push({ role: "user", content: v });
    return;
  }
  if (!Array.isArray(v))
    throw badField("input", `Invalid type for 'input': expected a string or a list of items, but got ${typeName(v)} instead.`, "invalid_type");
  const callName = (id: string): string | undefined => {
    for (const m of out) for (const c of (m.tool_calls as Obj[] | undefined) ?? []) if (c.id === id) return (c.function as Obj).name as string;
    return undefined;
  };
  let openAssistant: Obj | null = null; // the assistant message a following function_call joins
  v.forEach((item, i) => {
    const p = `input[${i}]`;
    if (!isObject(item)) throw badField(p, `Invalid type for '${p}': expected an object, but got ${typeName(item)} instead.`, "invalid_type");
    const type = item.type ?? "message";
    if (type === "message") {
      checkKeys(item, ["type", "role", "content", "id", "status"], p);
      const role = item.role;
      if (role !== "user" && role !== "assistant" && role !== "system" && role !== "developer") {
        throw badField(`${p}.role`, `Invalid value for '${p}.role': expected one of 'user', 'assistant', 'system', 'developer', got ${JSON.stringify(role)}.`);
      }
      const allowed = role === "assistant" ? ["output_text", "input_text"] : role === "user" ? ["input_text", "input_image"] : ["input_text"];
      const content = parts(item.content, `${p}.content`, allowed, paths);
      const m: Obj = { role: role === "developer" ? "system" : role, content };
      out.push(m);
      openAssistant = role === "assistant" ? m : null;
    } else if (type === "function_call") {
      checkKeys(item, ["type", "call_id", "name", "arguments", "id", "status"], p);
      const callId = str(item.call_id, `${p}.call_id`, true)!;
      const name = str(item.name, `${p}.name`, true)!;
      const argText = str(item.arguments, `${p}.arguments`, true)!;
      let args: unknown;
      try {
        args = argText.trim() ? JSON.parse(argText) : {};
      } catch {
        throw badField(`${p}.arguments`, `Invalid value for '${p}.arguments': expected a JSON object string.`);
      }
      if (!isObject(args)) throw badField(`${p}.arguments`, `Invalid value for '${p}.arguments': expected a JSON object string.`);
      const call = { id: callId, type: "function", function: { name, arguments: args } };
      if (!openAssistant) {
        openAssistant = { role: "assistant", content: null };
        out.push(openAssistant);
      }
      openAssistant.tool_calls = [...((openAssistant.tool_calls as Obj[] | undefined) ?? []), call];
    } else if (type === "function_call_output") {
      checkKeys(item, ["type", "call_id", "output", "id", "status"], p);
      const callId = str(item.call_id, `${p}.call_id`, true)!;
      const name = callName(callId);
      if (name === undefined) throw badField(`${p}.call_id`, `No tool call found for function call output with call_id ${callId}.`);
      const output = parts(item.output, `${p}.output`, ["input_text", "input_image"], paths);
      out.push({ role: "tool", tool_call_id: callId, name, content: output });
      openAssistant = null;
    } else if (type === "reasoning") {
      checkKeys(item, ["type", "id", "summary", "content", "encrypted_content", "status"], p);
      if (item.encrypted_content !== undefined && item.encrypted_content !== null)
        throw unsupported(`${p}.encrypted_content`, `'${p}.encrypted_content': encrypted reasoning is not supported`);
    } else if (typeof type === "string" && type === "item_reference") {
      throw unsupported(`${p}.type`, `'${p}.type': item references are not supported; use previous_response_id`);
    } else
      throw unsupported(`${p}.type`, `'${p}.type': ${JSON.stringify(type)} items are not supported (message, function_call, function_call_output, reasoning)`);
  });
}

/** Function tools ({type: "function", name, description, parameters}) → the template's schemas. */
function convertTools(v: unknown): Obj[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) throw badField("tools", `Invalid type for 'tools': expected an array, but got ${typeName(v)} instead.`, "invalid_type");
  return v.map((t, i) => {
    const p = `tools[${i}]`;
    if (!isObject(t)) throw badField(p, `Invalid type for '${p}': expected an object, but got ${typeName(t)} instead.`, "invalid_type");
    if (t.type !== "function") throw unsupported(`${p}.type`, `'${p}.type': only function tools are supported, got ${JSON.stringify(t.type)}`);
    checkKeys(t, ["type", "name", "description", "parameters", "strict"], p);
    const name = str(t.name, `${p}.name`, true)!;
    const description = str(t.description, `${p}.description`);
    if (bool(t.strict, `${p}.strict`) === true)
      throw unsupported(`${p}.strict`, `'${p}.strict': strict function calling (schema-constrained arguments) is not supported; send strict: false`);
    if (t.parameters !== undefined && t.parameters !== null && !isObject(t.parameters))
      throw badField(`${p}.parameters`, `Invalid type for '${p}.parameters': expected an object.`, "invalid_type");
    return {
      type: "function",
      function: { name, ...(description !== undefined ? { description } : {}), parameters: t.parameters ?? { type: "object", properties: {} } },
    };
  });
}

function convertToolChoice(v: unknown): unknown {
  if (v === undefined || v === null) return undefined;
  if (v === "auto" || v === "none" || v === "required") return v;
  if (isObject(v) && v.type === "function") {
    checkKeys(v, ["type", "name"], "tool_choice");
    return { type: "function", function: { name: str(v.name, "tool_choice.name", true)! } };
  }
  if (isObject(v) && typeof v.type === "string") throw unsupported("tool_choice", `tool_choice of type ${JSON.stringify(v.type)} is not supported`);
  throw badField("tool_choice", `Invalid value for 'tool_choice': expected "auto", "none", "required" or {"type": "function", "name"}.`);
}

/** A Responses request as the chat pipeline's request, and what the Responses formatter echoes. */
export interface ResponsesRequest {
  parsed: ParsedChat;
  stream: boolean;
  store: boolean;
  /** The conversation (without the instructions) that a later previous_response_id continues. */
  conversation: Obj[];
  /** reasoning.summary: the reasoning goes out as a summary (else as reasoning_text). */
  summary: boolean;
  oneToolCall: boolean;
  /** max_output_tokens as asked (null: the server's default). */
  maxOutputTokens: number | null;
  /** Fields echoed in the response object. */
  echo: Obj;
}

export function parseResponsesRequest(body: Obj, ctx: ServerCore["vctx"], store: ResponseStore): ResponsesRequest {
  for (const k of Object.keys(body)) {
    if (FIELDS.includes(k)) continue;
    if (UNSUPPORTED[k] && body[k] !== null && body[k] !== undefined) throw unsupported(k, UNSUPPORTED[k]!);
    if (!UNSUPPORTED[k]) throw new ApiError(400, `Unrecognized request argument supplied: ${k}`, k, "unknown_parameter");
  }
  const model = str(body.model, "model") ?? "default_model";
  const stream = bool(body.stream, "stream") ?? false;
  const keep = bool(body.store, "store") ?? true;
  const instructions = str(body.instructions, "instructions");
  const previousId = str(body.previous_response_id, "previous_response_id");
  const parallel = bool(body.parallel_tool_calls, "parallel_tool_calls") ?? true;
  if (bool(body.background, "background") === true) throw unsupported("background", "background responses are not supported");
  const truncation = str(body.truncation, "truncation");
  if (truncation !== undefined && truncation !== "disabled")
    throw unsupported("truncation", `truncation ${JSON.stringify(truncation)} is not supported (only "disabled": a prompt over the context is a 400)`);
  if (body.include !== undefined && body.include !== null) {
    if (!Array.isArray(body.include)) throw badField("include", "Invalid type for 'include': expected an array.", "invalid_type");
    if (body.include.length) throw unsupported("include", `include ${JSON.stringify(body.include)} is not supported`);
  }
  if (body.top_logprobs !== undefined && body.top_logprobs !== null && body.top_logprobs !== 0)
    throw unsupported("top_logprobs", "top_logprobs is not supported on /v1/responses (use /v1/chat/completions)");
  const tier = str(body.service_tier, "service_tier");
  if (tier !== undefined && tier !== "auto" && tier !== "default")
    throw unsupported("service_tier", `service_tier ${JSON.stringify(tier)} is not supported ("auto" or "default")`);
  if (body.stream_options !== undefined && body.stream_options !== null) {
    if (!isObject(body.stream_options)) throw badField("stream_options", "Invalid type for 'stream_options': expected an object.", "invalid_type");
    checkKeys(body.stream_options, ["include_obfuscation"], "stream_options");
    if (bool(body.stream_options.include_obfuscation, "stream_options.include_obfuscation") === true)
      throw unsupported("stream_options.include_obfuscation", "stream obfuscation is not supported");
  }
  const user = str(body.user, "user");
  const safetyIdentifier = str(body.safety_identifier, "safety_identifier");
  const promptCacheKey = str(body.prompt_cache_key, "prompt_cache_key");
  let metadata: Obj = {};
  if (body.metadata !== undefined && body.metadata !== null) {
    if (!isObject(body.metadata)) throw badField("metadata", "Invalid type for 'metadata': expected an object.", "invalid_type");
    const entries = Object.entries(body.metadata);
    if (entries.length > 16) throw badField("metadata", "Invalid 'metadata': at most 16 keys.");
    for (const [k, v] of entries) {
      if (k.length > 64) throw badField("metadata", `Invalid 'metadata': key '${k.slice(0, 16)}…' is longer than 64 characters.`);
      if (typeof v !== "string" || v.length > 512)
        throw badField(`metadata.${k}`, `Invalid 'metadata.${k}': expected a string of at most 512 characters.`, "invalid_type");
    }
    metadata = body.metadata;
  }
  let effort: string | undefined;
  let summary = false;
  if (body.reasoning !== undefined && body.reasoning !== null) {
    const r = body.reasoning;
    if (!isObject(r)) throw badField("reasoning", "Invalid type for 'reasoning': expected an object.", "invalid_type");
    checkKeys(r, ["effort", "summary", "generate_summary"], "reasoning");
    effort = str(r.effort, "reasoning.effort");
    for (const k of ["summary", "generate_summary"]) {
      const s = str(r[k], `reasoning.${k}`);
      if (s !== undefined && !["auto", "concise", "detailed"].includes(s))
        throw badField(`reasoning.${k}`, `Invalid value for 'reasoning.${k}': expected 'auto', 'concise' or 'detailed'.`);
      if (s !== undefined) summary = true;
    }
  }
  if (body.text !== undefined && body.text !== null) {
    const t = body.text;
    if (!isObject(t)) throw badField("text", "Invalid type for 'text': expected an object.", "invalid_type");
    checkKeys(t, ["format", "verbosity"], "text");
    if (t.format !== undefined && t.format !== null && !(isObject(t.format) && t.format.type === "text"))
      throw unsupported("text.format", 'text.format other than {"type": "text"} (structured output) is not supported on /v1/responses');
    const verbosity = str(t.verbosity, "text.verbosity");
    if (verbosity !== undefined && verbosity !== "medium")
      throw unsupported("text.verbosity", `text.verbosity ${JSON.stringify(verbosity)} is not supported (only "medium")`);
  }
  let maxOutputTokens: number | null = null;
  if (body.max_output_tokens !== undefined && body.max_output_tokens !== null) {
    const v = body.max_output_tokens;
    if (typeof v !== "number" || !Number.isInteger(v))
      throw badField("max_output_tokens", `Invalid type for 'max_output_tokens': expected an integer, but got ${typeName(v)} instead.`, "invalid_type");
    if (v < 1) throw badField("max_output_tokens", `Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 1, but got ${v} instead.`);
    maxOutputTokens = v;
  }

  const conversation: Obj[] = [];
  if (previousId !== undefined) {
    const prev = store.get(previousId);
    if (!prev) throw new ApiError(400, `Previous response with id '${previousId}' not found.`, "previous_response_id", "previous_response_not_found");
    conversation.push(...structuredClone(prev.conversation));
  }
  const paths: ImagePaths = new WeakMap();
  convertInput(body.input, conversation, paths);
  const tools = convertTools(body.tools);
  const toolChoice = convertToolChoice(body.tool_choice);
  const messages = [...(instructions !== undefined ? [{ role: "system", content: instructions }] : []), ...conversation];
  const chat: Obj = { model, messages };
  if (maxOutputTokens !== null) chat.max_tokens = maxOutputTokens;
  for (const [k, max] of [
    ["temperature", 2],
    ["top_p", 1],
  ] as const) {
    const v = body[k];
    if (v === undefined || v === null) continue;
    if (typeof v !== "number" || !Number.isFinite(v))
      throw badField(k, `Invalid type for '${k}': expected a number, but got ${typeName(v)} instead.`, "invalid_type");
    if (v < 0 || v > max) throw badField(k, `Invalid '${k}': expected a value between 0 and ${max}, but got ${v} instead.`);
    chat[k] = v;
  }
  if (tools.length) chat.tools = tools;
  if (toolChoice !== undefined) chat.tool_choice = toolChoice;
  if (effort !== undefined) chat.reasoning_effort = effort;
  let parsed: ParsedChat;
  try {
    parsed = parseChatRequest(chat, ctx);
  } catch (e) {
    // Shared names (model, temperature, top_p, tool_choice, reasoning_effort) stay; the conversation is `input`.
    if (e instanceof ApiError && e.param === "reasoning_effort")
      throw new ApiError(e.status, e.message.replace("reasoning_effort", "reasoning.effort"), "reasoning.effort", e.code);
    if (e instanceof ApiError && e.param?.startsWith("messages")) throw new ApiError(e.status, e.message, "input", e.code);
    throw e;
  }
  // The image parts, in prompt order, named by their input_image's path (those of an earlier
  // response's conversation by previous_response_id).
  nameImageItems(
    parsed.messages,
    messages.flatMap((m) =>
      Array.isArray(m.content) ? (m.content as Obj[]).filter((x) => x.type === "image_url").map((x) => paths.get(x) ?? "previous_response_id") : [],
    ),
  );
  const echo: Obj = {
    instructions: instructions ?? null,
    max_output_tokens: maxOutputTokens,
    metadata,
    parallel_tool_calls: parallel,
    previous_response_id: previousId ?? null,
    reasoning: { effort: effort ?? null, summary: summary ? ((body.reasoning as Obj).summary ?? (body.reasoning as Obj).generate_summary) : null },
    store: keep,
    temperature: parsed.sampling.temperature ?? null,
    text: { format: { type: "text" }, verbosity: "medium" },
    tool_choice: body.tool_choice ?? "auto",
    tools: Array.isArray(body.tools) ? body.tools : [],
    top_p: parsed.sampling.topP ?? null,
    truncation: "disabled",
    user: user ?? null,
    safety_identifier: safetyIdentifier ?? null,
    prompt_cache_key: promptCacheKey ?? null,
    background: false,
    service_tier: "default",
  };
  return { parsed, stream, store: keep, conversation, summary, oneToolCall: !parallel, maxOutputTokens, echo };
}

interface Stored {
  response: Obj;
  /** The conversation through this response's output, as chat messages (without instructions). */
  conversation: Obj[];
  chars: number;
}

/** Stored responses for previous_response_id and GET: in memory, least recently used evicted first. */
export class ResponseStore {
  readonly #m = new Map<string, Stored>();
  #chars = 0;

  constructor(
    readonly maxEntries = 256,
    /** Bound on the stored JSON, in characters. */
    readonly maxChars = 64 * 1024 * 1024,
  ) {}

  get size(): number {
    return this.#m.size;
  }

  get(id: string): Stored | undefined {
    const e = this.#m.get(id);
    if (e) {
      this.#m.delete(id);
      this.#m.set(id, e);
    }
    return e;
  }

  put(id: string, response: Obj, conversation: Obj[]): void {
    const chars = JSON.stringify(response).length + JSON.stringify(conversation).length;
    if (chars > this.maxChars) return;
    this.delete(id);
    this.#m.set(id, { response, conversation, chars });
    this.#chars += chars;
    for (const [k, e] of this.#m) {
      if (this.#m.size <= this.maxEntries && this.#chars <= this.maxChars) break;
      this.#m.delete(k);
      this.#chars -= e.chars;
    }
  }

  delete(id: string): boolean {
    const e = this.#m.get(id);
    if (!e) return false;
    this.#m.delete(id);
    this.#chars -= e.chars;
    return true;
  }
}

export class ResponsesApi {
  readonly store = new ResponseStore();

  constructor(readonly core: ServerCore) {}

  matches(path: string): boolean {
    return path === "/v1/responses" || path.startsWith("/v1/responses/");
  }

  json(req: Request, status: number, body: unknown): Response {
    return new Response(JSON.stringify(body), { status, headers: { "Content-Type": "application/json", ...this.core.cors(req) } });
  }

  async handle(req: Request, path: string): Promise<Response> {
    try {
      this.core.authorize(req);
      if (path !== "/v1/responses") return this.stored(req, decodePathSegment(path.slice("/v1/responses/".length)));
      if (req.method !== "POST") throw new ApiError(405, `${path} takes POST, not ${req.method}`, null, "method_not_allowed");
      const r = parseResponsesRequest(parseJsonBody(await this.core.readBody(req)), this.core.vctx, this.store);
      return await this.create(req, r);
    } catch (e) {
      const err = toApiError(e);
      const res = this.json(req, err.status, err.body());
      if (err.status === 401) res.headers.set("WWW-Authenticate", "Bearer");
      return res;
    }
  }

  stored(req: Request, id: string): Response {
    if (req.method !== "GET" && req.method !== "DELETE")
      throw new ApiError(405, `/v1/responses/{id} takes GET or DELETE, not ${req.method}`, null, "method_not_allowed");
    // A base, for an HTTP/1.0 request without Host (Bun then gives req.url as a bare path).
    const query = [...new URL(req.url, "http://localhost").searchParams.keys()][0];
    if (query !== undefined) throw unsupported(query, `${query} is not supported when retrieving a stored response`);
    const e = this.store.get(id);
    if (!e) throw new ApiError(404, `Response with id '${id}' not found.`, "response_id", "not_found");
    if (req.method === "DELETE") {
      this.store.delete(id);
      return this.json(req, 200, { id, object: "response", deleted: true });
    }
    return this.json(req, 200, e.response);
  }

  async create(req: Request, r: ResponsesRequest): Promise<Response> {
    await this.core.loadImages(r.parsed);
    const choiceProcessors = await this.core.grammars(r.parsed, { parallelToolCalls: !r.oneToolCall });
    const sub = this.core.submit(req, r.parsed, choiceProcessors ? { choiceProcessors } : {});
    const w = new ResponseWriter(
      r,
      sub,
      new Turn(this.core.opts.model.tokenizer, sub.promptIds, { maxToolCalls: r.oneToolCall ? 1 : Number.POSITIVE_INFINITY }),
      this,
    );
    if (r.stream)
      return sseResponse(this.core, req, sub, w.events(), (e) => {
        const err = toApiError(e).body().error;
        return sse("error", { type: "error", code: err.code ?? err.type, message: err.message, param: err.param, sequence_number: w.seq++ });
      });
    try {
      const stream = sub.streams[0]!;
      for await (const ev of stream) w.add(w.turn.push(ev));
      const result = await stream.result;
      return this.json(req, 200, w.finish(result));
    } catch (e) {
      sub.abort.abort();
      throw e;
    } finally {
      sub.done();
    }
  }
}

/** An output item being written, and where its text goes. */
interface OpenItem {
  index: number;
  item: Obj;
  kind: "reasoning" | "message";
  text: string;
}

/**
 * Builds one response from the turn's ordered parts: the output items, and (streamed) the
 * events that add them: output_item.added / content_part.added / *.delta / *.done /
 * content_part.done / output_item.done, between response.created + response.in_progress and
 * response.completed (response.incomplete when max_output_tokens ended it).
 */
class ResponseWriter {
  readonly id = `resp_${hex()}`;
  readonly createdAt = Math.floor(Date.now() / 1000);
  readonly output: Obj[] = [];
  seq = 0;
  #open: OpenItem | null = null;
  #events: string[] = [];
  #streaming = false;

  constructor(
    readonly r: ResponsesRequest,
    readonly sub: Submission,
    readonly turn: TurnType,
    readonly api: ResponsesApi,
  ) {}

  #emit(type: string, data: Obj): void {
    if (this.#streaming) this.#events.push(sse(type, { type, ...data, sequence_number: this.seq++ }));
  }

  #take(): string {
    const out = this.#events.join("");
    this.#events = [];
    return out;
  }

  /** The response object (status in_progress / completed / incomplete). */
  response(status: string, result: GenerationResult | null): Obj {
    const end = result ? this.turn.endOf(result) : null;
    const incomplete = end?.kind === "max_tokens" || end?.kind === "context_full";
    return {
      id: this.id,
      object: "response",
      created_at: this.createdAt,
      status,
      ...(status === "completed" ? { completed_at: Math.floor(Date.now() / 1000) } : {}),
      error: null,
      incomplete_details: incomplete ? { reason: "max_output_tokens" } : null,
      model: this.r.parsed.model,
      output: result ? this.output : [],
      ...this.r.echo,
      usage: result
        ? {
            input_tokens: result.promptTokens,
            input_tokens_details: { cached_tokens: result.cachedTokens },
            output_tokens: result.tokens.length,
            output_tokens_details: { reasoning_tokens: this.turn.reasoningTokens(result) },
            total_tokens: result.promptTokens + result.tokens.length,
          }
        : null,
    };
  }

  #close(status = "completed"): void {
    const o = this.#open;
    if (!o) return;
    this.#open = null;
    const base = { item_id: o.item.id, output_index: o.index };
    if (o.kind === "message") {
      const part = { type: "output_text", text: o.text, annotations: [], logprobs: [] };
      this.#emit("response.output_text.done", { ...base, content_index: 0, text: o.text, logprobs: [] });
      this.#emit("response.content_part.done", { ...base, content_index: 0, part });
      o.item.content = [part];
      o.item.status = status;
    } else if (this.r.summary) {
      const part = { type: "summary_text", text: o.text };
      this.#emit("response.reasoning_summary_text.done", { ...base, summary_index: 0, text: o.text });
      this.#emit("response.reasoning_summary_part.done", { ...base, summary_index: 0, part });
      o.item.summary = [part];
    } else {
      const part = { type: "reasoning_text", text: o.text };
      this.#emit("response.reasoning_text.done", { ...base, content_index: 0, text: o.text });
      this.#emit("response.content_part.done", { ...base, content_index: 0, part });
      o.item.content = [part];
    }
    this.#emit("response.output_item.done", { output_index: o.index, item: o.item });
  }

  /** Add parts to the output (and, streamed, the events that say so). */
  add(parts: OutputPart[]): void {
    for (const p of parts) {
      if (p.type === "tool_call") {
        this.#close();
        const args = JSON.stringify(p.call.call.arguments);
        const item: Obj = {
          id: `fc_${p.call.id.replace(/^call_/, "")}`,
          type: "function_call",
          status: "in_progress",
          call_id: p.call.id,
          name: p.call.call.name,
          arguments: "",
        };
        const index = this.output.length;
        this.output.push(item);
        this.#emit("response.output_item.added", { output_index: index, item: { ...item } });
        this.#emit("response.function_call_arguments.delta", { item_id: item.id, output_index: index, delta: args });
        this.#emit("response.function_call_arguments.done", { item_id: item.id, output_index: index, name: item.name, arguments: args });
        item.arguments = args;
        item.status = "completed";
        this.#emit("response.output_item.done", { output_index: index, item });
        continue;
      }
      const kind = p.type === "reasoning" ? "reasoning" : "message";
      if (this.#open?.kind !== kind) {
        this.#close();
        const index = this.output.length;
        const item: Obj =
          kind === "message"
            ? { id: `msg_${hex()}`, type: "message", status: "in_progress", role: "assistant", content: [] }
            : { id: `rs_${hex()}`, type: "reasoning", summary: [], content: [] };
        if (kind === "reasoning" && this.r.summary) delete item.content;
        this.output.push(item);
        this.#open = { index, item, kind, text: "" };
        this.#emit("response.output_item.added", { output_index: index, item: structuredClone(item) });
        const base = { item_id: item.id, output_index: index };
        if (kind === "message")
          this.#emit("response.content_part.added", { ...base, content_index: 0, part: { type: "output_text", text: "", annotations: [], logprobs: [] } });
        else if (this.r.summary) this.#emit("response.reasoning_summary_part.added", { ...base, summary_index: 0, part: { type: "summary_text", text: "" } });
        else this.#emit("response.content_part.added", { ...base, content_index: 0, part: { type: "reasoning_text", text: "" } });
      }
      const o = this.#open!;
      o.text += p.text;
      const base = { item_id: o.item.id, output_index: o.index };
      if (kind === "message") this.#emit("response.output_text.delta", { ...base, content_index: 0, delta: p.text, logprobs: [] });
      else if (this.r.summary) this.#emit("response.reasoning_summary_text.delta", { ...base, summary_index: 0, delta: p.text });
      else this.#emit("response.reasoning_text.delta", { ...base, content_index: 0, delta: p.text });
    }
  }

  /** The end: the last parts, the final response object; stored for previous_response_id unless store is false. */
  finish(result: GenerationResult): Obj {
    this.add(this.turn.end(result));
    const end = this.turn.endOf(result);
    const incomplete = end.kind === "max_tokens" || end.kind === "context_full";
    this.#close(incomplete ? "incomplete" : "completed");
    const response = this.response(incomplete ? "incomplete" : "completed", result);
    if (this.r.store && end.kind !== "cancelled") {
      const o = this.turn.output;
      const assistant: Obj = { role: "assistant", content: o.content || null };
      if (this.turn.toolCalls.length)
        assistant.tool_calls = this.turn.toolCalls.map((c) => ({ id: c.id, type: "function", function: { name: c.call.name, arguments: c.call.arguments } }));
      this.api.store.put(this.id, response, [...this.r.conversation, assistant]);
    }
    return response;
  }

  async *events(): AsyncGenerator<string> {
    this.#streaming = true;
    const start = this.response("in_progress", null);
    this.#emit("response.created", { response: start });
    this.#emit("response.in_progress", { response: start });
    yield this.#take();
    const stream = this.sub.streams[0]!;
    for await (const ev of stream) {
      this.add(this.turn.push(ev));
      const out = this.#take();
      if (out) yield out;
    }
    const response = this.finish(await stream.result);
    this.#emit(response.status === "incomplete" ? "response.incomplete" : "response.completed", { response });
    yield this.#take();
  }
}

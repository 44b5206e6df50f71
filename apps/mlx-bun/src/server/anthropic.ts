// Anthropic's Messages API over the server's chat pipeline: POST /v1/messages (whole or streamed
// with Anthropic's server-sent events) and POST /v1/messages/count_tokens. A request is checked
// field by field with Anthropic's names (an unknown field is a 400, as Anthropic answers), turned
// into the chat request /v1/chat/completions would get (system → system message, tool_use /
// tool_result blocks → tool_calls / tool messages, tools → function schemas, thinking →
// enable_thinking), and goes through the same templating and scheduler. The output is read with
// the same Gemma 4 parser and written as content blocks: thinking, text, tool_use.
import { randomUUID } from "node:crypto";
import { GEMMA4_MARKERS, type Gemma4Tokenizer } from "@mlx-bun/models";
import { type GenerationResult, type LogitsProcessor, maskIds } from "@mlx-bun/runtime";
import { initialOutputState, type OutputPart } from "./chat-output.ts";
import { type ServerCore, type Submission, sse, sseResponse } from "./core.ts";
import { ApiError } from "./errors.ts";
import { toApiError } from "./errors.ts";
import { imageUrlPart, nameImageItems } from "./images.ts";
import { type ParsedChat, parseChatRequest, parseJsonBody } from "./validate.ts";
import { Turn, type TurnEnd } from "./turn.ts";

export const ANTHROPIC_PATHS = ["/v1/messages", "/v1/messages/count_tokens"];

type Obj = Record<string, unknown>;
const isObject = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
const typeName = (v: unknown): string => (v === null ? "null" : Array.isArray(v) ? "array" : typeof v);

/** 400 naming the field, in Anthropic's dotted path style (messages.0.content.1.type). */
function bad(path: string, message: string, code = "invalid_value"): ApiError {
  return new ApiError(400, `${path}: ${message}`, path, code);
}
function unsupported(path: string, message: string): ApiError {
  return new ApiError(400, `${path}: ${message}`, path, "unsupported_parameter");
}

/** Fields of a Messages request this server reads; any other is a 400 (Anthropic: "Extra inputs are not permitted"). */
const MESSAGE_FIELDS = [
  "model",
  "max_tokens",
  "messages",
  "system",
  "stop_sequences",
  "stream",
  "temperature",
  "top_p",
  "top_k",
  "tools",
  "tool_choice",
  "thinking",
  "metadata",
  "service_tier",
  "cache_control",
];
const COUNT_FIELDS = ["model", "messages", "system", "tools", "tool_choice", "thinking", "cache_control"];
/** Anthropic fields with no equivalent here: named in the 400. */
const UNSUPPORTED_FIELDS: Record<string, string> = {
  container: "containers (code execution) are not supported",
  mcp_servers: "MCP servers are not supported",
  output_config: "output_config (effort, structured output) is not supported",
  output_format: "structured output is not supported",
  context_management: "context management is not supported",
  inference_geo: "inference_geo is not supported",
  speed: "speed is not supported",
  diagnostics: "diagnostics are not supported",
  user_profile_id: "user profiles are not supported",
  workspace_id: "workspaces are not supported",
};

function checkFields(body: Obj, allowed: readonly string[], path = ""): void {
  for (const k of Object.keys(body)) {
    if (allowed.includes(k)) continue;
    const p = path ? `${path}.${k}` : k;
    if (!path && UNSUPPORTED_FIELDS[k] && body[k] !== null && body[k] !== undefined) throw unsupported(p, UNSUPPORTED_FIELDS[k]!);
    if (!path && UNSUPPORTED_FIELDS[k]) continue; // null: the default
    throw bad(p, "Extra inputs are not permitted", "unknown_parameter");
  }
}

/** cache_control: Anthropic's prompt-caching hint. Prefix caching is automatic here (and on), so a valid hint is met as is. */
function checkCacheControl(v: unknown, path: string): void {
  if (v === undefined || v === null) return;
  if (!isObject(v) || v.type !== "ephemeral") throw bad(`${path}.cache_control`, 'expected {"type": "ephemeral"}', "invalid_type");
  checkFields(v, ["type", "ttl"], `${path}.cache_control`);
  if (v.ttl !== undefined && v.ttl !== null && v.ttl !== "5m" && v.ttl !== "1h") throw bad(`${path}.cache_control.ttl`, 'expected "5m" or "1h"');
}

function str(v: unknown, path: string, required = false): string | undefined {
  if (v === undefined || v === null) {
    if (required) throw bad(path, "Field required", "missing_required_parameter");
    return undefined;
  }
  if (typeof v !== "string") throw bad(path, `expected a string, got ${typeName(v)}`, "invalid_type");
  return v;
}

function num(v: unknown, path: string, min: number, max: number): number | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "number" || !Number.isFinite(v)) throw bad(path, `expected a number, got ${typeName(v)}`, "invalid_type");
  if (v < min || v > max) throw bad(path, `must be between ${min} and ${max}, got ${v}`);
  return v;
}

function int(v: unknown, path: string, min: number, required = false): number | undefined {
  if (v === undefined || v === null) {
    if (required) throw bad(path, "Field required", "missing_required_parameter");
    return undefined;
  }
  if (typeof v !== "number" || !Number.isInteger(v)) throw bad(path, `expected an integer, got ${typeof v === "number" ? v : typeName(v)}`, "invalid_type");
  if (v < min) throw bad(path, `must be at least ${min}, got ${v}`);
  return v;
}

/** Text of a list of text blocks (tool_result content, system): other block types are named in a 400. */
function textBlocks(v: unknown, path: string, what: string): string {
  if (typeof v === "string") return v;
  if (!Array.isArray(v)) throw bad(path, `expected a string or a list of text blocks, got ${typeName(v)}`, "invalid_type");
  return v
    .map((b, i) => {
      const p = `${path}.${i}`;
      if (!isObject(b)) throw bad(p, `expected an object, got ${typeName(b)}`, "invalid_type");
      if (b.type !== "text") throw unsupported(`${p}.type`, `only text blocks are supported in ${what}, got ${JSON.stringify(b.type)}`);
      return textBlock(b, p);
    })
    .join("");
}

/** The text of one {"type": "text"} block at `p`. */
function textBlock(b: Obj, p: string): string {
  checkFields(b, ["type", "text", "cache_control", "citations"], p);
  checkCacheControl(b.cache_control, p);
  if (b.citations !== undefined && b.citations !== null && !(Array.isArray(b.citations) && b.citations.length === 0))
    throw unsupported(`${p}.citations`, "citations are not supported");
  return str(b.text, `${p}.text`, true)!;
}

/** Anthropic's image media types (source.media_type), and the first bytes of each format. */
const MEDIA_TYPES: Record<string, (b: Buffer) => boolean> = {
  "image/jpeg": (b) => b[0] === 0xff && b[1] === 0xd8 && b[2] === 0xff,
  "image/png": (b) => b.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])),
  "image/gif": (b) => b.subarray(0, 4).toString("latin1") === "GIF8",
  "image/webp": (b) => b.subarray(0, 4).toString("latin1") === "RIFF" && b.subarray(8, 12).toString("latin1") === "WEBP",
};

/** Where each image part of the translated messages came from (its block's path), for nameImageItems. */
type ImagePaths = WeakMap<object, string>;

/**
 * An {"type": "image"} block at `p` → the chat pipeline's image_url part (server/images.ts reads,
 * decodes and preprocesses it): source base64 (a data: URL of media_type; the data must be of
 * that type, as Anthropic checks) or url (read by the server's image-URL rule: http(s) only with
 * --allow-remote-images). Files-API sources are a 400.
 */
function imageBlock(b: Obj, p: string, paths: ImagePaths): Obj {
  checkFields(b, ["type", "source", "cache_control"], p);
  const src = b.source;
  const sp = `${p}.source`;
  if (!isObject(src))
    throw bad(
      sp,
      src === undefined ? "Field required" : `expected an object, got ${typeName(src)}`,
      src === undefined ? "missing_required_parameter" : "invalid_type",
    );
  let part: Obj;
  if (src.type === "base64") {
    checkFields(src, ["type", "media_type", "data"], sp);
    const media = str(src.media_type, `${sp}.media_type`, true)!;
    const check = MEDIA_TYPES[media];
    if (!check)
      throw bad(
        `${sp}.media_type`,
        `expected one of ${Object.keys(MEDIA_TYPES)
          .map((m) => `'${m}'`)
          .join(", ")}, got ${JSON.stringify(media)}`,
      );
    const data = str(src.data, `${sp}.data`, true)!;
    if (!/^[A-Za-z0-9+/\s]*={0,2}\s*$/.test(data)) throw bad(`${sp}.data`, "is not valid base64", "invalid_image_data");
    const head = Buffer.from(data.slice(0, 64).replace(/\s/g, "").slice(0, 32), "base64");
    if (head.length && !check(head)) throw bad(`${sp}.data`, `the image data does not match the provided media type ${media}`, "invalid_image_data");
    part = imageUrlPart(`data:${media};base64,${data}`);
  } else if (src.type === "url") {
    checkFields(src, ["type", "url"], sp);
    const url = str(src.url, `${sp}.url`, true)!;
    if (!url) throw bad(`${sp}.url`, "must not be empty");
    part = imageUrlPart(url);
  } else if (src.type === "file") throw unsupported(`${sp}.type`, "file sources (the Files API) are not supported; send base64 data or a url");
  else throw bad(`${sp}.type`, `expected "base64" or "url", got ${JSON.stringify(src.type)}`);
  paths.set(part, sp);
  return part;
}

/** A list of text parts (joined) or, with images, of text and image parts in order. */
function joinParts(parts: (string | Obj)[]): string | Obj[] {
  if (parts.every((x) => typeof x === "string")) return parts.join("");
  return parts.map((x) => (typeof x === "string" ? { type: "text", text: x } : x));
}

/** How thinking is asked for: off, on (with a token budget for enabled), and whether its text is returned. */
interface Thinking {
  enabled: boolean;
  budget?: number;
  omitted: boolean;
}

function parseThinking(v: unknown, maxTokens: number | undefined): Thinking | undefined {
  if (v === undefined || v === null) return undefined;
  if (!isObject(v)) throw bad("thinking", `expected an object, got ${typeName(v)}`, "invalid_type");
  const display = str(v.display, "thinking.display");
  if (display !== undefined && display !== "summarized" && display !== "omitted") throw bad("thinking.display", 'expected "summarized" or "omitted"');
  const omitted = display === "omitted";
  if (v.type === "disabled") {
    checkFields(v, ["type"], "thinking");
    return { enabled: false, omitted: false };
  }
  if (v.type === "adaptive") {
    checkFields(v, ["type", "display"], "thinking");
    return { enabled: true, omitted };
  }
  if (v.type === "enabled") {
    checkFields(v, ["type", "budget_tokens", "display"], "thinking");
    const budget = int(v.budget_tokens, "thinking.budget_tokens", 1024, true)!;
    if (maxTokens !== undefined && budget >= maxTokens) throw bad("thinking.budget_tokens", `must be less than max_tokens (${maxTokens}), got ${budget}`);
    return { enabled: true, budget, omitted };
  }
  if (v.type === "between_tools") throw unsupported("thinking.type", '"between_tools" thinking is not supported');
  throw bad("thinking.type", `expected "enabled", "disabled" or "adaptive", got ${JSON.stringify(v.type)}`);
}

/** A Messages request as the chat pipeline's request, and what only the Messages formatter needs. */
export interface AnthropicRequest {
  parsed: ParsedChat;
  stream: boolean;
  thinking: Thinking | undefined;
  /** tool_choice.disable_parallel_tool_use: at most one tool_use block. */
  oneToolCall: boolean;
  maxTokens: number;
}

/**
 * Parse a Messages (or count_tokens) body into the chat request /v1/chat/completions would get.
 * `serverThinking`: the server's --chat-template-args set enable_thinking (then a request
 * without `thinking` keeps it; else thinking is off by default, as Anthropic's).
 */
export function parseAnthropicRequest(body: Obj, core: Pick<ServerCore, "vctx">, countOnly: boolean, serverThinking: boolean): AnthropicRequest {
  checkFields(body, countOnly ? COUNT_FIELDS : MESSAGE_FIELDS);
  const model = str(body.model, "model", true)!;
  const maxTokens = countOnly ? 1 : int(body.max_tokens, "max_tokens", 1, true)!;
  const stream = countOnly ? false : (body.stream ?? false) === true;
  if (!countOnly && body.stream !== undefined && body.stream !== null && typeof body.stream !== "boolean")
    throw bad("stream", `expected a boolean, got ${typeName(body.stream)}`, "invalid_type");
  checkCacheControl(body.cache_control, "body");
  const temperature = num(body.temperature, "temperature", 0, 1);
  const topP = num(body.top_p, "top_p", 0, 1);
  const topK = int(body.top_k, "top_k", 0);
  let stops: string[] = [];
  if (body.stop_sequences !== undefined && body.stop_sequences !== null) {
    if (!Array.isArray(body.stop_sequences)) throw bad("stop_sequences", `expected a list of strings, got ${typeName(body.stop_sequences)}`, "invalid_type");
    stops = body.stop_sequences.map((s, i) => str(s, `stop_sequences.${i}`, true)!);
  }
  if (body.metadata !== undefined && body.metadata !== null) {
    // Anthropic: an identifier of the end user for abuse detection; it does not change the output.
    if (!isObject(body.metadata)) throw bad("metadata", `expected an object, got ${typeName(body.metadata)}`, "invalid_type");
    checkFields(body.metadata, ["user_id"], "metadata");
    const user = str(body.metadata.user_id, "metadata.user_id");
    if (user !== undefined && user.length > 256) throw bad("metadata.user_id", "must be at most 256 characters");
  }
  const tier = str(body.service_tier, "service_tier");
  if (tier !== undefined && tier !== "auto" && tier !== "standard_only")
    throw bad("service_tier", `expected "auto" or "standard_only", got ${JSON.stringify(tier)}`);
  const thinking = parseThinking(body.thinking, countOnly ? undefined : maxTokens);

  const tools = parseTools(body.tools);
  const { toolChoice, oneToolCall } = parseToolChoice(body.tool_choice, tools);
  const paths: ImagePaths = new WeakMap();
  const messages = [...systemMessages(body.system), ...convertMessages(body.messages, paths)];
  // The image parts, in prompt order, named by their blocks' paths (messages.0.content.1.source).
  const imagePaths = messages.flatMap((m) => (Array.isArray(m.content) ? (m.content as Obj[]).flatMap((x) => paths.get(x) ?? []) : []));

  const chat: Obj = { model, messages, max_tokens: maxTokens, stop: stops };
  if (temperature !== undefined) chat.temperature = temperature;
  if (topP !== undefined) chat.top_p = topP;
  if (topK !== undefined) chat.top_k = topK;
  if (tools.length) chat.tools = tools;
  if (toolChoice !== undefined) chat.tool_choice = toolChoice;
  if (thinking) chat.chat_template_kwargs = { enable_thinking: thinking.enabled };
  else if (!serverThinking) chat.chat_template_kwargs = { enable_thinking: false };
  let parsed: ParsedChat;
  try {
    parsed = parseChatRequest(chat, core.vctx);
  } catch (e) {
    // The translated request names the chat fields; the ones shared with Anthropic keep their names.
    if (e instanceof ApiError && e.status === 400 && e.param && !e.message.startsWith(`${e.param}:`))
      throw new ApiError(400, `${e.param}: ${e.message}`, e.param, e.code);
    throw e;
  }
  nameImageItems(parsed.messages, imagePaths);
  return { parsed, stream, thinking, oneToolCall, maxTokens };
}

function systemMessages(v: unknown): Obj[] {
  if (v === undefined || v === null) return [];
  const text = textBlocks(v, "system", "system");
  return [{ role: "system", content: text }];
}

/** Anthropic tools ({name, description, input_schema}) → the template's function schemas. */
function parseTools(v: unknown): Obj[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) throw bad("tools", `expected a list, got ${typeName(v)}`, "invalid_type");
  const names = new Set<string>();
  return v.map((t, i) => {
    const p = `tools.${i}`;
    if (!isObject(t)) throw bad(p, `expected an object, got ${typeName(t)}`, "invalid_type");
    if (t.type !== undefined && t.type !== null && t.type !== "custom")
      throw unsupported(`${p}.type`, `only custom (client) tools are supported, got ${JSON.stringify(t.type)}`);
    checkFields(t, ["type", "name", "description", "input_schema", "cache_control", "strict"], p);
    checkCacheControl(t.cache_control, p);
    if (t.strict === true) throw unsupported(`${p}.strict`, "strict tool input (schema-constrained decoding) is not supported");
    const name = str(t.name, `${p}.name`, true)!;
    if (!/^[a-zA-Z0-9_-]{1,128}$/.test(name)) throw bad(`${p}.name`, "must match ^[a-zA-Z0-9_-]{1,128}$");
    if (names.has(name)) throw bad(`${p}.name`, `tool names must be unique, '${name}' is repeated`);
    names.add(name);
    const description = str(t.description, `${p}.description`);
    if (!isObject(t.input_schema))
      throw bad(
        `${p}.input_schema`,
        t.input_schema === undefined ? "Field required" : `expected an object, got ${typeName(t.input_schema)}`,
        t.input_schema === undefined ? "missing_required_parameter" : "invalid_type",
      );
    if (t.input_schema.type !== "object") throw bad(`${p}.input_schema.type`, 'must be "object"');
    return { type: "function", function: { name, ...(description !== undefined ? { description } : {}), parameters: t.input_schema } };
  });
}

function parseToolChoice(v: unknown, tools: Obj[]): { toolChoice: unknown; oneToolCall: boolean } {
  if (v === undefined || v === null) return { toolChoice: undefined, oneToolCall: false };
  if (!isObject(v)) throw bad("tool_choice", `expected an object, got ${typeName(v)}`, "invalid_type");
  const disable = v.disable_parallel_tool_use;
  if (disable !== undefined && disable !== null && typeof disable !== "boolean")
    throw bad("tool_choice.disable_parallel_tool_use", `expected a boolean, got ${typeName(disable)}`, "invalid_type");
  const oneToolCall = disable === true;
  const names = tools.map((t) => (t.function as Obj).name as string);
  switch (v.type) {
    case "auto":
      checkFields(v, ["type", "disable_parallel_tool_use"], "tool_choice");
      return { toolChoice: "auto", oneToolCall };
    case "none":
      checkFields(v, ["type"], "tool_choice");
      return { toolChoice: "none", oneToolCall };
    case "any":
      checkFields(v, ["type", "disable_parallel_tool_use"], "tool_choice");
      if (!names.length) throw bad("tool_choice", 'tool_choice "any" needs at least one tool');
      return { toolChoice: "required", oneToolCall };
    case "tool": {
      checkFields(v, ["type", "name", "disable_parallel_tool_use"], "tool_choice");
      const name = str(v.name, "tool_choice.name", true)!;
      if (!names.includes(name)) throw bad("tool_choice.name", `'${name}' is not in tools (${names.map((n) => `'${n}'`).join(", ") || "none"})`);
      return { toolChoice: { type: "function", function: { name } }, oneToolCall };
    }
    default:
      throw bad("tool_choice.type", `expected "auto", "any", "tool" or "none", got ${JSON.stringify(v.type)}`);
  }
}

/**
 * Anthropic messages → the chat messages of /v1/chat/completions: an assistant's tool_use blocks
 * become its tool_calls; a user's tool_result blocks become tool messages (named after their
 * call) right after that turn, before the user's text; thinking blocks of earlier turns are
 * dropped, as Anthropic drops them from the context (and as Gemma 4's template does).
 */
function convertMessages(v: unknown, paths: ImagePaths): Obj[] {
  if (v === undefined || v === null) throw bad("messages", "Field required", "missing_required_parameter");
  if (!Array.isArray(v)) throw bad("messages", `expected a list, got ${typeName(v)}`, "invalid_type");
  if (v.length === 0) throw bad("messages", "at least one message is required");
  const callNames = new Map<string, string>();
  const out: Obj[] = [];
  v.forEach((m, i) => {
    const p = `messages.${i}`;
    if (!isObject(m)) throw bad(p, `expected an object, got ${typeName(m)}`, "invalid_type");
    checkFields(m, ["role", "content"], p);
    if (m.role !== "user" && m.role !== "assistant") throw bad(`${p}.role`, `expected "user" or "assistant", got ${JSON.stringify(m.role)}`);
    const role = m.role;
    if (role === "assistant" && i === v.length - 1) throw unsupported(p, "a final assistant message (prefilling the reply) is not supported");
    if (typeof m.content === "string") {
      out.push({ role, content: m.content });
      return;
    }
    if (!Array.isArray(m.content))
      throw bad(
        `${p}.content`,
        m.content === undefined ? "Field required" : `expected a string or a list of content blocks, got ${typeName(m.content)}`,
        m.content === undefined ? "missing_required_parameter" : "invalid_type",
      );
    const parts: (string | Obj)[] = [];
    const calls: Obj[] = [];
    const results: Obj[] = [];
    m.content.forEach((b, j) => {
      const bp = `${p}.content.${j}`;
      if (!isObject(b)) throw bad(bp, `expected an object, got ${typeName(b)}`, "invalid_type");
      checkCacheControl(b.cache_control, bp);
      if (b.type === "text") {
        parts.push(textBlock(b, bp));
      } else if (b.type === "image" && role === "user") {
        parts.push(imageBlock(b, bp, paths));
      } else if (b.type === "tool_use" && role === "assistant") {
        checkFields(b, ["type", "id", "name", "input", "cache_control", "caller"], bp);
        const id = str(b.id, `${bp}.id`, true)!;
        const name = str(b.name, `${bp}.name`, true)!;
        if (!isObject(b.input)) throw bad(`${bp}.input`, `expected an object, got ${typeName(b.input)}`, "invalid_type");
        callNames.set(id, name);
        calls.push({ id, type: "function", function: { name, arguments: b.input } });
      } else if (b.type === "tool_result" && role === "user") {
        checkFields(b, ["type", "tool_use_id", "content", "is_error", "cache_control"], bp);
        const id = str(b.tool_use_id, `${bp}.tool_use_id`, true)!;
        const name = callNames.get(id);
        if (name === undefined) throw bad(`${bp}.tool_use_id`, `no tool_use block with id '${id}' comes before this tool_result`);
        const content = b.content === undefined || b.content === null ? [] : toolResultParts(b.content, `${bp}.content`, paths);
        if (b.is_error !== undefined && b.is_error !== null && typeof b.is_error !== "boolean")
          throw bad(`${bp}.is_error`, `expected a boolean, got ${typeName(b.is_error)}`, "invalid_type");
        // Gemma 4's template has no error flag for a tool response: the text says it.
        if (b.is_error === true) content.unshift("Error: ");
        results.push({ role: "tool", tool_call_id: id, name, content: joinParts(content) });
      } else if ((b.type === "thinking" || b.type === "redacted_thinking") && role === "assistant") {
        checkFields(b, b.type === "thinking" ? ["type", "thinking", "signature"] : ["type", "data"], bp);
      } else if (b.type === "tool_use" || b.type === "tool_result" || b.type === "thinking" || b.type === "redacted_thinking" || b.type === "image") {
        throw bad(`${bp}.type`, `${b.type} blocks belong in ${b.type === "tool_result" || b.type === "image" ? "user" : "assistant"} messages`);
      } else throw unsupported(`${bp}.type`, `${JSON.stringify(b.type)} content blocks are not supported (text, image, tool_use, tool_result, thinking)`);
    });
    const content = joinParts(parts);
    if (role === "assistant") out.push({ role, content, ...(calls.length ? { tool_calls: calls } : {}) });
    else {
      out.push(...results);
      if (content.length || !results.length) out.push({ role, content });
    }
  });
  return out;
}

/** tool_result content: a string, or text and image blocks (the images go to the tool message, where the template allows). */
function toolResultParts(v: unknown, path: string, paths: ImagePaths): (string | Obj)[] {
  if (typeof v === "string") return [v];
  if (!Array.isArray(v)) throw bad(path, `expected a string or a list of text and image blocks, got ${typeName(v)}`, "invalid_type");
  return v.map((b, i) => {
    const p = `${path}.${i}`;
    if (!isObject(b)) throw bad(p, `expected an object, got ${typeName(b)}`, "invalid_type");
    if (b.type === "image") return imageBlock(b, p, paths);
    if (b.type !== "text") throw unsupported(`${p}.type`, `only text and image blocks are supported in tool_result content, got ${JSON.stringify(b.type)}`);
    return textBlock(b, p);
  });
}

/**
 * A thinking budget (thinking.budget_tokens): once the turn has written `budget` tokens inside the
 * thinking channel, the next token is its closing delimiter. Null for a vocabulary without one.
 */
export function thinkingBudget(tok: Gemma4Tokenizer, budget: number): LogitsProcessor | null {
  const open = tok.tokenToId("<|channel>");
  const close = tok.tokenToId(GEMMA4_MARKERS.thoughtEnd);
  if (open === undefined || close === undefined) return null;
  // The first call sees the prompt alone (the first token is sampled from its last position).
  let seen = -1;
  let inside = false;
  let used = 0;
  return {
    process(history, logits) {
      if (seen < 0) {
        seen = history.length;
        inside = initialOutputState(tok, history) === "reasoning";
      }
      for (; seen < history.length; seen++) {
        const t = history[seen]!;
        if (t === open) inside = true;
        else if (t === close) inside = false;
        else if (inside) used++;
      }
      if (!inside || used < budget) return logits.retain();
      const V = logits.shape[logits.ndim - 1]!;
      return maskIds(
        logits,
        (function* () {
          for (let i = 0; i < V; i++) if (i !== close) yield i;
        })(),
      );
    },
  };
}

const ERROR_TYPES: Record<number, string> = {
  400: "invalid_request_error",
  401: "authentication_error",
  403: "permission_error",
  404: "not_found_error",
  405: "invalid_request_error",
  413: "request_too_large",
  429: "rate_limit_error",
  529: "overloaded_error",
};

/** Anthropic's error body: {"type": "error", "error": {"type", "message"}}. */
export function anthropicError(e: ApiError) {
  const message = e.param && !e.message.startsWith(`${e.param}:`) && e.status !== 401 ? `${e.param}: ${e.message}` : e.message;
  return { type: "error", error: { type: ERROR_TYPES[e.status] ?? (e.status >= 500 ? "api_error" : "invalid_request_error"), message } };
}

const STOP_REASONS: Record<TurnEnd["kind"], string> = {
  tool_calls: "tool_use",
  end_turn: "end_turn",
  stop_sequence: "stop_sequence",
  max_tokens: "max_tokens",
  context_full: "model_context_window_exceeded",
  cancelled: "end_turn",
};

export class AnthropicApi {
  constructor(readonly core: ServerCore) {}

  matches(path: string): boolean {
    return ANTHROPIC_PATHS.includes(path);
  }

  json(req: Request, status: number, body: unknown): Response {
    return new Response(JSON.stringify(body), { status, headers: { "Content-Type": "application/json", ...this.core.cors(req) } });
  }

  /** Every answer, errors included, in Anthropic's shapes. */
  async handle(req: Request, path: string): Promise<Response> {
    try {
      this.core.authorize(req);
      if (req.method !== "POST") throw new ApiError(405, `${path} takes POST, not ${req.method}`, null, "method_not_allowed");
      const body = parseJsonBody(await this.core.readBody(req));
      const serverThinking = this.core.opts.chatTemplateArgs?.enable_thinking !== undefined;
      if (path === "/v1/messages/count_tokens") {
        const r = parseAnthropicRequest(body, this.core, true, serverThinking);
        // Images are read and preprocessed: each counts its soft tokens (and its begin/end markers).
        await this.core.loadImages(r.parsed);
        return this.json(req, 200, { input_tokens: this.core.promptIds(r.parsed).length });
      }
      return await this.messages(req, parseAnthropicRequest(body, this.core, false, serverThinking));
    } catch (e) {
      const err = toApiError(e);
      const res = this.json(req, err.status, anthropicError(err));
      if (err.status === 401) res.headers.set("WWW-Authenticate", "Bearer");
      return res;
    }
  }

  async messages(req: Request, r: AnthropicRequest): Promise<Response> {
    await this.core.loadImages(r.parsed);
    const tok = this.core.opts.model.tokenizer;
    const budget = r.thinking?.budget !== undefined ? thinkingBudget(tok, r.thinking.budget) : null;
    const choiceProcessors = await this.core.grammars(r.parsed, { parallelToolCalls: !r.oneToolCall });
    const sub = this.core.submit(req, r.parsed, { ...(budget ? { logitsProcessors: [budget] } : {}), ...(choiceProcessors ? { choiceProcessors } : {}) });
    const msg = new MessageWriter(r, sub, tok);
    if (r.stream) return sseResponse(this.core, req, sub, msg.events(), (e) => sse("error", anthropicError(toApiError(e))));
    try {
      const stream = sub.streams[0]!;
      for await (const ev of stream) msg.add(msg.turn.push(ev));
      const result = await stream.result;
      msg.add(msg.turn.end(result));
      return this.json(req, 200, msg.message(result));
    } catch (e) {
      sub.abort.abort();
      throw e;
    } finally {
      sub.done();
    }
  }
}

/** Builds one Messages response (whole or as events) from the turn's ordered parts. */
class MessageWriter {
  readonly id = `msg_${randomUUID().replaceAll("-", "")}`;
  readonly turn: Turn;
  readonly blocks: Obj[] = [];

  constructor(
    readonly r: AnthropicRequest,
    readonly sub: Submission,
    tok: Gemma4Tokenizer,
  ) {
    this.turn = new Turn(tok, sub.promptIds, { maxToolCalls: r.oneToolCall ? 1 : Number.POSITIVE_INFINITY, stops: r.parsed.stop, maxTokens: r.maxTokens });
  }

  /** Add parts to the content blocks (whole response). */
  add(parts: OutputPart[]): void {
    for (const p of parts) {
      const last = this.blocks.at(-1);
      if (p.type === "tool_call") this.blocks.push(toolUse(p.call));
      else if (p.type === "reasoning") {
        if (last?.type === "thinking") last.thinking = (last.thinking as string) + this.#thinkingText(p.text);
        else this.blocks.push({ type: "thinking", thinking: this.#thinkingText(p.text), signature: "" });
      } else if (last?.type === "text") last.text = (last.text as string) + p.text;
      else this.blocks.push({ type: "text", text: p.text });
    }
  }

  #thinkingText(t: string): string {
    return this.r.thinking?.omitted ? "" : t;
  }

  usage(result: GenerationResult) {
    return {
      input_tokens: result.promptTokens - result.cachedTokens,
      output_tokens: result.tokens.length,
      cache_creation_input_tokens: 0,
      cache_read_input_tokens: result.cachedTokens,
    };
  }

  message(result: GenerationResult): Obj {
    const end = this.turn.endOf(result);
    return {
      id: this.id,
      type: "message",
      role: "assistant",
      model: this.r.parsed.model,
      content: this.blocks,
      stop_reason: STOP_REASONS[end.kind],
      stop_sequence: end.kind === "stop_sequence" ? end.sequence : null,
      stop_details: null,
      usage: { ...this.usage(result), service_tier: "standard" },
    };
  }

  /**
   * Anthropic's event sequence: message_start, ping, then per block content_block_start,
   * content_block_delta (text_delta / thinking_delta / input_json_delta), content_block_stop;
   * message_delta (stop_reason, stop_sequence, usage), message_stop.
   */
  async *events(): AsyncGenerator<string> {
    const stream = this.sub.streams[0]!;
    yield sse("message_start", {
      type: "message_start",
      message: {
        id: this.id,
        type: "message",
        role: "assistant",
        model: this.r.parsed.model,
        content: [],
        stop_reason: null,
        stop_sequence: null,
        stop_details: null,
        // Cached prompt tokens are known once the request ends: message_delta carries the split.
        usage: {
          input_tokens: this.sub.promptIds.length,
          output_tokens: 0,
          cache_creation_input_tokens: 0,
          cache_read_input_tokens: 0,
          service_tier: "standard",
        },
      },
    });
    yield sse("ping", { type: "ping" });
    let open: { index: number; type: string } | null = null;
    let next = 0;
    const write = (parts: OutputPart[]): string => {
      let out = "";
      const close = () => {
        if (open) out += sse("content_block_stop", { type: "content_block_stop", index: open.index });
        open = null;
      };
      for (const p of parts) {
        if (p.type === "tool_call") {
          close();
          const index = next++;
          const block = toolUse(p.call);
          out += sse("content_block_start", { type: "content_block_start", index, content_block: { ...block, input: {} } });
          out += sse("content_block_delta", {
            type: "content_block_delta",
            index,
            delta: { type: "input_json_delta", partial_json: JSON.stringify(block.input) },
          });
          out += sse("content_block_stop", { type: "content_block_stop", index });
          continue;
        }
        const type = p.type === "reasoning" ? "thinking" : "text";
        if (open?.type !== type) {
          close();
          open = { index: next++, type };
          out += sse("content_block_start", {
            type: "content_block_start",
            index: open.index,
            content_block: type === "thinking" ? { type, thinking: "", signature: "" } : { type, text: "" },
          });
        }
        const delta = type === "thinking" ? { type: "thinking_delta", thinking: this.#thinkingText(p.text) } : { type: "text_delta", text: p.text };
        if (type === "text" || delta.thinking) out += sse("content_block_delta", { type: "content_block_delta", index: open!.index, delta });
      }
      return out;
    };
    for await (const ev of stream) {
      const out = write(this.turn.push(ev));
      if (out) yield out;
    }
    const result = await stream.result;
    let out = write(this.turn.end(result));
    if (open) out += sse("content_block_stop", { type: "content_block_stop", index: (open as { index: number }).index });
    const end = this.turn.endOf(result);
    out += sse("message_delta", {
      type: "message_delta",
      delta: { stop_reason: STOP_REASONS[end.kind], stop_sequence: end.kind === "stop_sequence" ? end.sequence : null, stop_details: null },
      usage: this.usage(result),
    });
    out += sse("message_stop", { type: "message_stop" });
    yield out;
  }
}

/** A tool call as a tool_use block (ids in Anthropic's toolu_ form). */
function toolUse(c: { id: string; call: { name: string; arguments: Record<string, unknown> } }): Obj & { input: Record<string, unknown> } {
  return { type: "tool_use", id: `toolu_${c.id.replace(/^call_/, "")}`, name: c.call.name, input: c.call.arguments };
}

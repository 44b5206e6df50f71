// The HTTP layer: an OpenAI-compatible server on Bun.serve, a drop-in for mlx_lm.server
// (/v1/chat/completions, /v1/completions, /v1/models, /health), over the runtime's scheduler,
// and the web chat at "/" (web.ts).
import { randomUUID, timingSafeEqual } from "node:crypto";
import { memory, mlxVersion } from "@mlx-bun/mlx-ffi";
import { type ChatTemplate, GEMMA4_MARKERS, type Gemma4Tokenizer } from "@mlx-bun/models";
import { banTokens, type GenerateRequest, type GenerationEvent, type GenerationResult, type GenerationStream } from "@mlx-bun/runtime";
import { chatPromptCheckpoints, chatPromptIds, rawPromptIds } from "../prompt.ts";
import { VERSION } from "../version.ts";
import { ChatOutput, type OutputDelta, type OutputToolCall } from "./chat-output.ts";
import { ApiError } from "./errors.ts";
import {
  choiceRequests,
  MLX_LM_SERVER_DEFAULTS,
  type ParsedChat,
  type ParsedRequest,
  parseChatRequest,
  parseCompletionRequest,
  parseJsonBody,
  type RequestDefaults,
  toGenerateRequest,
  type ValidationContext,
} from "./validate.ts";
import { DEFAULT_WEB_DIR, WebChat } from "./web.ts";

/** What the server needs of the loaded model (an Engine's `loaded`). */
export interface ServedModel {
  dir: string;
  tokenizer: Gemma4Tokenizer;
  template: ChatTemplate | null;
  config: { text: { maxPositionEmbeddings: number } };
}

/** What the server needs of the scheduler: submit a request, count the running ones. */
export interface RequestSink {
  submit(req: GenerateRequest): GenerationStream;
  readonly active: number;
}

export interface ServerOptions {
  model: ServedModel;
  scheduler: RequestSink;
  /** The id /v1/models lists and responses echo by default. */
  modelId: string;
  /** Other names a request's "model" may use (default_model is always accepted). */
  modelAliases?: string[];
  /** Accept any "model" name instead of a 404 for an unknown one. */
  anyModel?: boolean;
  host?: string;
  /** 0 picks a free port. Default 8080, as mlx_lm.server. */
  port?: number;
  /** Require "Authorization: Bearer <apiKey>" (all endpoints but /health). */
  apiKey?: string;
  /** Largest request body in bytes (413 beyond it). Default 16 MiB. */
  maxBodyBytes?: number;
  defaults?: Partial<RequestDefaults>;
  /** Server-wide chat template kwargs (mlx_lm.server --chat-template-args); a request's chat_template_kwargs override them. */
  chatTemplateArgs?: Record<string, unknown>;
  /** CORS origins; "*" (the default) allows any. */
  allowedOrigins?: string[];
  /** One line per request (default: none). */
  log?: (line: string) => void;
  /** The built web chat served at "/" (default: apps/mlx-bun/web/dist, built by tools/setup.sh); null: none. */
  webDir?: string | null;
  /** The KV cache mode /health reports (the engine's kvModeName, e.g. "bf16"). */
  kvMode?: string;
  /** The draft model of speculative decoding (--draft-model), if any: /health then reports acceptance totals. */
  draftModel?: string;
}

export interface RunningServer {
  server: ReturnType<typeof Bun.serve>;
  /** e.g. http://127.0.0.1:8080 */
  url: string;
  port: number;
  /** The web chat at "/": served, asked for but not built (a 503 page says how), or off (webDir null). */
  webChat: "on" | "not built" | "off";
  stop(): Promise<void>;
}

const JSON_HEADERS = { "Content-Type": "application/json" };

/** Start the server; resolves once it listens. */
export function startServer(opts: ServerOptions): RunningServer {
  const app = new App(opts);
  const maxBody = opts.maxBodyBytes ?? 16 * 1024 * 1024;
  const server = Bun.serve({
    hostname: opts.host ?? "127.0.0.1",
    port: opts.port ?? 8080,
    // Our own check answers 413 with JSON first; Bun's limit is only a backstop.
    maxRequestBodySize: maxBody + 16 * 1024 * 1024,
    idleTimeout: 0,
    fetch: (req, srv) => app.handle(req, srv),
    error: (e) => app.errorResponse(new ApiError(500, `internal error: ${(e as Error).message}`)),
  });
  const host = server.hostname?.includes(":") ? `[${server.hostname}]` : server.hostname;
  return {
    server,
    url: `http://${host}:${server.port}`,
    port: server.port!,
    webChat: app.web.assets.size ? "on" : app.web.missing ? "not built" : "off",
    stop: async () => {
      await server.stop(true);
    },
  };
}

class App {
  readonly created = Math.floor(Date.now() / 1000);
  /** Totals of speculatively decoded requests, for /health. */
  #spec = { requests: 0, drafted: 0, accepted: 0 };

  #countSpeculative(r: GenerationResult): void {
    if (!r.speculative) return;
    this.#spec.requests++;
    this.#spec.drafted += r.speculative.drafted;
    this.#spec.accepted += r.speculative.accepted;
  }
  readonly fingerprint: string;
  readonly vctx: ValidationContext;
  readonly maxBody: number;
  readonly contextLength: number;
  readonly origins: string[];
  readonly apiKey: Buffer | null;
  readonly web: WebChat;

  constructor(readonly opts: ServerOptions) {
    let mlx = "unknown";
    try {
      mlx = mlxVersion();
    } catch {
      // the version is informational
    }
    this.fingerprint = `mlx-bun-${VERSION}-mlx-${mlx}-${process.platform}-${process.arch}`;
    this.vctx = {
      defaults: { ...MLX_LM_SERVER_DEFAULTS, ...opts.defaults },
      vocabSize: opts.model.tokenizer.vocabSize,
      modelIds: opts.anyModel ? [] : [opts.modelId, ...(opts.modelAliases ?? [])],
    };
    this.maxBody = opts.maxBodyBytes ?? 16 * 1024 * 1024;
    this.contextLength = opts.model.config.text.maxPositionEmbeddings;
    this.origins = opts.allowedOrigins ?? ["*"];
    this.apiKey = opts.apiKey ? Buffer.from(opts.apiKey) : null;
    this.web = new WebChat(opts.webDir === undefined ? DEFAULT_WEB_DIR : opts.webDir);
  }

  cors(req: Request | null): Record<string, string> {
    const h: Record<string, string> = { "Access-Control-Allow-Methods": "*", "Access-Control-Allow-Headers": "*" };
    const origin = req?.headers.get("origin");
    if (this.origins.includes("*")) h["Access-Control-Allow-Origin"] = "*";
    else if (origin && this.origins.includes(origin)) {
      h["Access-Control-Allow-Origin"] = origin;
      h.Vary = "Origin";
    }
    return h;
  }

  json(req: Request | null, status: number, body: unknown, extra: Record<string, string> = {}): Response {
    return new Response(JSON.stringify(body), { status, headers: { ...JSON_HEADERS, ...this.cors(req), ...extra } });
  }

  errorResponse(e: ApiError, req: Request | null = null): Response {
    const extra: Record<string, string> = e.status === 401 ? { "WWW-Authenticate": "Bearer" } : {};
    return this.json(req, e.status, e.body(), extra);
  }

  async handle(req: Request, _srv: unknown): Promise<Response> {
    const t0 = performance.now();
    const path = new URL(req.url).pathname.replace(/\/+$/, "") || "/";
    let res: Response;
    try {
      res = await this.route(req, path);
    } catch (e) {
      res = this.errorResponse(toApiError(e), req);
    }
    this.opts.log?.(`${req.method} ${path} ${res.status} ${((performance.now() - t0) / 1000).toFixed(3)}s`);
    return res;
  }

  async route(req: Request, path: string): Promise<Response> {
    if (req.method === "OPTIONS") return new Response(null, { status: 204, headers: this.cors(req) });
    // The page and its files hold no secret: served without the API key (the page sends it).
    if ((req.method === "GET" || req.method === "HEAD") && this.web.has(path)) return this.web.serve(req, path);
    const post = ["/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions"];
    const get = path === "/health" || path === "/v1/models" || path.startsWith("/v1/models/");
    if (!post.includes(path) && !get) throw new ApiError(404, `Unknown endpoint ${req.method} ${path}`, null, "not_found");
    if (path !== "/health") this.authorize(req);
    if (get) {
      if (req.method !== "GET" && req.method !== "HEAD") throw new ApiError(405, `${path} takes GET, not ${req.method}`, null, "method_not_allowed");
      if (path === "/health") return this.health(req);
      return this.models(req, path);
    }
    if (req.method !== "POST") throw new ApiError(405, `${path} takes POST, not ${req.method}`, null, "method_not_allowed");
    const body = parseJsonBody(await this.readBody(req));
    const parsed = path.endsWith("/chat/completions") ? parseChatRequest(body, this.vctx) : parseCompletionRequest(body, this.vctx);
    return this.complete(req, parsed);
  }

  authorize(req: Request): void {
    if (!this.apiKey) return;
    const h = req.headers.get("authorization") ?? "";
    const m = /^Bearer\s+(.+)$/i.exec(h.trim());
    const given = m ? Buffer.from(m[1]!) : null;
    if (!given || given.length !== this.apiKey.length || !timingSafeEqual(given, this.apiKey)) {
      throw new ApiError(401, given ? "Incorrect API key provided" : "Missing API key: send 'Authorization: Bearer <key>'", null, "invalid_api_key");
    }
  }

  async readBody(req: Request): Promise<string> {
    const declared = req.headers.get("content-length");
    if (declared !== null) {
      const n = Number(declared);
      if (!Number.isFinite(n) || n < 0) throw new ApiError(400, "Invalid Content-Length header", null, "invalid_request");
      if (n > this.maxBody) throw tooLarge(this.maxBody);
    }
    if (!req.body) return "";
    const chunks: Uint8Array[] = [];
    let total = 0;
    const reader = req.body.getReader();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      total += value.byteLength;
      if (total > this.maxBody) {
        void reader.cancel().catch(() => {});
        throw tooLarge(this.maxBody);
      }
      chunks.push(value);
    }
    try {
      return new TextDecoder("utf-8", { fatal: true }).decode(Buffer.concat(chunks));
    } catch {
      throw new ApiError(400, "Request body is not valid UTF-8", null, "invalid_json");
    }
  }

  health(req: Request): Response {
    return this.json(req, 200, {
      status: "ok",
      model: this.opts.modelId,
      kv_mode: this.opts.kvMode ?? null,
      active_requests: this.opts.scheduler.active,
      ...(this.opts.draftModel ? { draft_model: this.opts.draftModel, speculative: { requests: this.#spec.requests, ...speculativeUsage(this.#spec) } } : {}),
      memory: { active_bytes: memory.active(), peak_bytes: memory.peak(), cache_bytes: memory.cache() },
    });
  }

  modelCard() {
    return { id: this.opts.modelId, object: "model", created: this.created, owned_by: "mlx-bun" };
  }

  models(req: Request, path: string): Response {
    if (path === "/v1/models") return this.json(req, 200, { object: "list", data: [this.modelCard()] });
    const id = decodeURIComponent(path.slice("/v1/models/".length));
    const names = [this.opts.modelId, ...(this.opts.modelAliases ?? []), "default_model"];
    if (!names.includes(id)) throw new ApiError(404, `The model '${id}' does not exist`, "model", "model_not_found");
    return this.json(req, 200, this.modelCard());
  }

  promptIds(p: ParsedRequest): number[] {
    const m = this.opts.model;
    if (p.kind === "completion") return typeof p.prompt === "string" ? rawPromptIds(m, p.prompt) : p.prompt;
    const kwargs = { ...this.opts.chatTemplateArgs, ...p.chatTemplateKwargs };
    try {
      return chatPromptIds(m, p.messages, { tools: p.tools, kwargs, roleMapping: p.roleMapping });
    } catch (e) {
      // The template rejects the conversation (e.g. its raise_exception on a bad role order).
      throw new ApiError(400, `chat template: ${(e as Error).message}`, "messages", "invalid_value");
    }
  }

  /** Where the prompt cache keeps snapshots of a chat prompt (the end of the system messages and of the history). */
  promptCheckpoints(p: ParsedChat, promptIds: readonly number[]): number[] {
    const kwargs = { ...this.opts.chatTemplateArgs, ...p.chatTemplateKwargs };
    return chatPromptCheckpoints(this.opts.model, p.messages, promptIds, { tools: p.tools, kwargs });
  }

  async complete(req: Request, p: ParsedRequest): Promise<Response> {
    const abort = new AbortController();
    const onAbort = () => abort.abort();
    req.signal.addEventListener("abort", onAbort, { once: true });
    const done = () => req.signal.removeEventListener("abort", onAbort);
    // n choices: one request row each, all submitted now so the scheduler batches them.
    const streams: GenerationStream[] = [];
    let promptIds: number[] = [];
    try {
      promptIds = this.promptIds(p);
      const greq = toGenerateRequest(p, promptIds, this.contextLength, abort.signal);
      if (p.kind === "chat") {
        greq.cacheCheckpoints = this.promptCheckpoints(p, promptIds);
        const toolCall = this.opts.model.tokenizer.tokenToId(GEMMA4_MARKERS.toolCallStart);
        // tool_choice "none": the model cannot open a tool call.
        if (p.toolChoice.type === "none" && toolCall !== undefined) greq.logitsProcessors = [...(greq.logitsProcessors ?? []), banTokens([toolCall])];
      }
      for (const r of choiceRequests(greq, p.n)) {
        const stream = this.opts.scheduler.submit(r);
        stream.result.then((res) => this.#countSpeculative(res), () => {});
        streams.push(stream);
      }
    } catch (e) {
      abort.abort(); // the choices already submitted end at their next step
      done();
      throw e;
    }
    const meta: ResponseMeta = {
      id: `${p.kind === "chat" ? "chatcmpl" : "cmpl"}-${randomUUID()}`,
      created: Math.floor(Date.now() / 1000),
      model: p.model,
      system_fingerprint: this.fingerprint,
    };
    const fmts = streams.map((_, i) => new Formatter(p, meta, this.opts.model.tokenizer, i, promptIds));
    if (p.stream) return this.streamResponse(req, fmts, streams, abort, done);
    return await this.wholeResponse(req, fmts, streams, abort, done);
  }

  async wholeResponse(req: Request, fmts: Formatter[], streams: GenerationStream[], abort: AbortController, done: () => void): Promise<Response> {
    try {
      const results = await Promise.all(
        streams.map(async (stream, i) => {
          for await (const ev of stream) fmts[i]!.add(ev);
          return await stream.result;
        }),
      );
      const f = fmts[0]!;
      return this.json(req, 200, {
        ...f.base(f.chat ? "chat.completion" : "text_completion"),
        choices: results.map((r, i) => fmts[i]!.choice(r)),
        usage: usageOf(results),
      });
    } catch (e) {
      abort.abort();
      throw e;
    } finally {
      done();
    }
  }

  /**
   * Server-sent events of all the choices, interleaved as their tokens come: each chunk carries one
   * choice (its index); a choice's last chunk has its finish_reason; then the usage chunk (when
   * asked for) once all have ended, and [DONE].
   */
  streamResponse(req: Request, fmts: Formatter[], streams: GenerationStream[], abort: AbortController, done: () => void): Response {
    const enc = new TextEncoder();
    const its = streams.map((s) => s[Symbol.asyncIterator]());
    type Next = { i: number; r?: IteratorResult<GenerationEvent>; error?: unknown };
    // A failure comes back as a value, so a promise nobody races yet never rejects unhandled.
    const next = (i: number): Promise<Next> => its[i]!.next().then((r) => ({ i, r }), (error: unknown) => ({ i, error }));
    const pending = new Map<number, Promise<Next>>(its.map((_, i) => [i, next(i)]));
    const results: GenerationResult[] = [];
    let finished = false;
    const finish = () => {
      if (finished) return;
      finished = true;
      done();
    };
    const sse = (o: unknown) => enc.encode(`data: ${JSON.stringify(o)}\n\n`);
    const body = new ReadableStream<Uint8Array>({
      pull: async (c) => {
        try {
          while (pending.size) {
            const { i, r, error } = await Promise.race(pending.values());
            if (error !== undefined) throw error;
            const fmt = fmts[i]!;
            if (r!.done) {
              pending.delete(i);
              const result = await streams[i]!.result;
              results[i] = result;
              c.enqueue(sse(fmt.finalChunk(result)));
              return;
            }
            pending.set(i, next(i));
            const chunk = fmt.addAndChunk(r!.value);
            if (chunk) {
              c.enqueue(sse(chunk));
              return;
            }
          }
          const f = fmts[0]!;
          if (f.p.includeUsage) c.enqueue(sse({ ...f.base(f.chat ? "chat.completion.chunk" : "text_completion"), choices: [], usage: usageOf(results) }));
          c.enqueue(enc.encode("data: [DONE]\n\n"));
          c.close();
          finish();
        } catch (e) {
          // Headers are gone: report the fault in the stream itself, then end it.
          abort.abort();
          try {
            c.enqueue(sse(toApiError(e).body()));
            c.close();
          } catch {
            // the client is gone
          }
          finish();
        }
      },
      cancel: () => {
        // The client went away mid-stream: cancel the request (its cache rows are freed).
        abort.abort();
        finish();
      },
    });
    return new Response(body, {
      status: 200,
      headers: { "Content-Type": "text/event-stream", "Cache-Control": "no-cache", Connection: "keep-alive", ...this.cors(req) },
    });
  }
}

function tooLarge(limit: number): ApiError {
  return new ApiError(413, `Request body is larger than the limit of ${limit} bytes`, null, "request_too_large");
}

/** Map anything thrown while serving to an ApiError: the runtime's RequestError is the caller's fault (400). */
export function toApiError(e: unknown): ApiError {
  if (e instanceof ApiError) return e;
  const err = e as Error;
  if (err && (err.name === "RequestError" || err.constructor?.name === "RequestError")) return new ApiError(400, err.message, null, "invalid_value");
  return new ApiError(500, `internal error: ${err?.message ?? String(e)}`, null, null, "server_error");
}

interface ResponseMeta {
  id: string;
  created: number;
  model: string;
  system_fingerprint: string;
}

interface LogprobEntry {
  id: number;
  token: string;
  logprob: number;
  bytes: number[];
  top_logprobs: { id: number; token: string; logprob: number; bytes: number[] }[];
}

/**
 * Builds mlx_lm.server / OpenAI response bodies from the generation events of one choice (`index`).
 * Chat text goes through ChatOutput: content, reasoning (`reasoning_content`, and mlx_lm.server's
 * `reasoning`) and tool calls.
 */
class Formatter {
  readonly chat: boolean;
  readonly entries: LogprobEntry[] = [];
  readonly output: ChatOutput | null;
  text = "";
  #ended = false;

  constructor(
    readonly p: ParsedRequest,
    readonly meta: ResponseMeta,
    readonly tokenizer: Gemma4Tokenizer,
    readonly index = 0,
    promptIds: readonly number[] = [],
  ) {
    this.chat = p.kind === "chat";
    this.output = this.chat ? ChatOutput.for(tokenizer, promptIds) : null;
  }

  tokenInfo(id: number) {
    let bytes: number[] = [];
    try {
      bytes = Array.from(this.tokenizer.tokenBytes(id));
    } catch {
      // an id outside the vocabulary has no bytes
    }
    return { id, token: this.tokenizer.decode([id]), bytes };
  }

  entry(ev: GenerationEvent): LogprobEntry | null {
    if (this.p.logprobs === undefined || ev.logprob === undefined) return null;
    return {
      ...this.tokenInfo(ev.token),
      logprob: ev.logprob,
      top_logprobs: (ev.topLogprobs ?? []).map((t) => ({ ...this.tokenInfo(t.token), logprob: t.logprob })),
    };
  }

  add(ev: GenerationEvent): { entry: LogprobEntry | null; delta: OutputDelta | null } {
    this.text += ev.text;
    const e = this.entry(ev);
    if (e) this.entries.push(e);
    return { entry: e, delta: this.output && ev.text ? this.output.push(ev.text) : null };
  }

  /** The rest of the text (a tail the generator settled at the end) and the end of the chat output. */
  #end(r: GenerationResult): { tail: string; delta: OutputDelta | null } {
    const tail = r.text.startsWith(this.text) ? r.text.slice(this.text.length) : "";
    this.text += tail;
    if (!this.output || this.#ended) return { tail, delta: null };
    this.#ended = true;
    const a = this.output.push(tail);
    const b = this.output.finish();
    return { tail, delta: { content: a.content + b.content, reasoning: a.reasoning + b.reasoning, toolCalls: [...a.toolCalls, ...b.toolCalls] } };
  }

  /** "tool_calls" when the turn made calls and stopped by itself, as mlx_lm.server. */
  #finishReason(r: GenerationResult): string {
    const f = finishReason(r);
    return f === "stop" && this.output?.toolCalls.length ? "tool_calls" : f;
  }

  logprobsBlock(entries: LogprobEntry[], textOffset0: number) {
    if (this.p.logprobs === undefined) return undefined;
    const block: Record<string, unknown> = { content: entries };
    if (this.chat) block.refusal = null;
    else {
      // OpenAI's legacy completions shape, alongside mlx_lm.server's "content" list.
      let off = textOffset0;
      block.tokens = entries.map((e) => e.token);
      block.token_logprobs = entries.map((e) => e.logprob);
      block.top_logprobs = entries.map((e) => Object.fromEntries(e.top_logprobs.map((t) => [t.token, t.logprob])));
      block.text_offset = entries.map((e) => {
        const o = off;
        off += e.token.length;
        return o;
      });
    }
    return block;
  }

  base(object: string) {
    return { id: this.meta.id, object, created: this.meta.created, model: this.meta.model, system_fingerprint: this.meta.system_fingerprint };
  }

  /** One streamed chunk for an event, or null when it carries nothing to send. */
  addAndChunk(ev: GenerationEvent): Record<string, unknown> | null {
    const offset = this.text.length;
    const { entry, delta } = this.add(ev);
    if (!entry && (this.chat ? isEmpty(delta) : !ev.text)) return null;
    return this.chunk(ev.text, null, entry ? [entry] : [], offset, delta);
  }

  chunk(text: string, finish: string | null, entries: LogprobEntry[], offset: number, out: OutputDelta | null = null): Record<string, unknown> {
    const choice: Record<string, unknown> = { index: this.index, finish_reason: finish };
    if (this.chat) {
      const delta: Record<string, unknown> = { role: "assistant" };
      if (out?.content) delta.content = out.content;
      if (out?.reasoning) {
        delta.reasoning_content = out.reasoning;
        delta.reasoning = out.reasoning;
      }
      if (out?.toolCalls.length) delta.tool_calls = out.toolCalls.map((c) => ({ index: c.index, ...openAiToolCall(c) }));
      choice.delta = delta;
    } else choice.text = text;
    const lp = entries.length ? this.logprobsBlock(entries, offset) : undefined;
    choice.logprobs = lp ?? null;
    return { ...this.base(this.chat ? "chat.completion.chunk" : "text_completion"), choices: [choice] };
  }

  finalChunk(r: GenerationResult): Record<string, unknown> {
    // The generator's events carry all the text; any tail it settled at the end is in result.text.
    const offset = this.text.length;
    const { tail, delta } = this.#end(r);
    return this.chunk(tail, this.#finishReason(r), [], offset, delta);
  }

  /** The choice of a whole (non-streamed) response. */
  choice(r: GenerationResult): Record<string, unknown> {
    const text = r.text;
    this.#end(r);
    const choice: Record<string, unknown> = { index: this.index, finish_reason: this.#finishReason(r) };
    if (this.output) {
      const o = this.output;
      const message: Record<string, unknown> = { role: "assistant", content: o.content ? o.content : null };
      if (o.reasoning) {
        message.reasoning_content = o.reasoning;
        message.reasoning = o.reasoning;
      }
      if (o.toolCalls.length) message.tool_calls = o.toolCalls.map(openAiToolCall);
      choice.message = message;
    } else choice.text = text;
    choice.logprobs = this.logprobsBlock(this.entries, 0) ?? null;
    return choice;
  }
}

/**
 * usage over the choices of one request, as OpenAI: the prompt counted once, completion tokens
 * summed over the choices (cached prompt tokens: the first choice's; speculative counts summed).
 */
function usageOf(results: readonly GenerationResult[]) {
  const r0 = results[0]!;
  const completion = results.reduce((n, r) => n + r.tokens.length, 0);
  const spec = results.filter((r) => r.speculative).map((r) => r.speculative!);
  return {
    prompt_tokens: r0.promptTokens,
    completion_tokens: completion,
    total_tokens: r0.promptTokens + completion,
    prompt_tokens_details: { cached_tokens: r0.cachedTokens },
    ...(spec.length ? { speculative: speculativeUsage({ drafted: spec.reduce((n, x) => n + x.drafted, 0), accepted: spec.reduce((n, x) => n + x.accepted, 0) }) } : {}),
  };
}

function isEmpty(d: OutputDelta | null): boolean {
  return !d || (!d.content && !d.reasoning && !d.toolCalls.length);
}

/** OpenAI's tool call: arguments as a JSON string. */
function openAiToolCall(c: OutputToolCall) {
  return { id: c.id, type: "function", function: { name: c.call.name, arguments: JSON.stringify(c.call.arguments) } };
}

function finishReason(r: GenerationResult): string {
  return r.finishReason === "length" ? "length" : "stop";
}

/** usage.speculative: drafted and accepted draft tokens of a speculatively decoded request. */
export function speculativeUsage(s: { drafted: number; accepted: number }) {
  return { drafted_tokens: s.drafted, accepted_tokens: s.accepted, acceptance_rate: s.drafted > 0 ? s.accepted / s.drafted : 0 };
}

// The HTTP layer: an OpenAI-compatible server on Bun.serve, a drop-in for mlx_lm.server
// (/v1/chat/completions, /v1/completions, /v1/models, /health), over the runtime's scheduler,
// and the web chat at "/" (web.ts).
import { randomUUID, timingSafeEqual } from "node:crypto";
import { memory, mlxVersion } from "@mlx-bun/mlx-ffi";
import { type ChatTemplate, GEMMA4_MARKERS, type Gemma4Tokenizer, TemplateTimeoutError } from "@mlx-bun/models";
import {
  banTokens,
  type GenerateRequest,
  type GenerationEvent,
  type GenerationResult,
  type GenerationStream,
  grammarProcessor,
  type GrammarProcessor,
  resolveSampling,
  toolCallProcessor,
} from "@mlx-bun/runtime";
import { chatPromptCheckpoints, chatPromptIds, rawPromptIds } from "../prompt.ts";
import { VERSION } from "../version.ts";
import { AnthropicApi } from "./anthropic.ts";
import { ChatOutput, type OutputDelta, type OutputToolCall } from "./chat-output.ts";
import type { ServerCore, SubmitExtras, Submission } from "./core.ts";
import { ApiError, toApiError } from "./errors.ts";
import { expandPromptImages, loadRequestImages } from "./images.ts";
import type { RequestSink, ServerOptions } from "./server-options.ts";
import { BodyError, bunIdleTimeout, DEFAULT_LIMITS, decodePathSegment, readBodyText, requestPath, type ServerLimits } from "./limits.ts";
import { ServerMetrics } from "./metrics.ts";
import { OriginPolicy } from "./origin.ts";
import { ResponsesApi } from "./responses.ts";
import { guardedStream } from "./stream-guard.ts";
import {
  choiceRequests,
  MLX_LM_SERVER_DEFAULTS,
  type ParsedChat,
  type ParsedRequest,
  parseChatRequest,
  parseCompletionRequest,
  NO_COMPLETION_IMAGES,
  parseJsonBody,
  type RequestDefaults,
  toGenerateRequest,
  toolSpecs,
  type ValidationContext,
} from "./validate.ts";
import { DEFAULT_WEB_DIR, WebChat } from "./web.ts";

export type { RequestSink, ServedModel, ServerOptions } from "./server-options.ts";
export { toApiError } from "./errors.ts";

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
  const server = Bun.serve({
    hostname: opts.host ?? "127.0.0.1",
    port: opts.port ?? 8080,
    // The body is read as a stream under our own limit (413 with the OpenAI error body, on the
    // Content-Length or while reading); Bun's limit would answer first, with an empty 413.
    maxRequestBodySize: Number.MAX_SAFE_INTEGER,
    // A silent connection (keep-alive, a body that stopped) is closed after this; while a request
    // is served the server's own timeouts apply (App.handle).
    idleTimeout: bunIdleTimeout(app.limits.idleTimeoutS),
    // No Bun error pages, no stack traces printed for a connection dropped on purpose.
    development: false,
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

class App implements ServerCore {
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
  readonly policy: OriginPolicy;
  readonly limits: ServerLimits;
  readonly apiKey: Buffer | null;
  /** The server of each request being served (to set its connection's timeout). */
  #servers = new WeakMap<Request, { timeout(req: Request, seconds: number): void }>();
  /** Requests answered with a guarded stream: their connection's idle timeout comes back when the stream ends. */
  #streaming = new WeakSet<Request>();
  /** Requests whose body was not read to its end: the connection is closed after the answer. */
  #unread = new WeakSet<Request>();
  readonly web: WebChat;
  readonly metrics: ServerMetrics;
  /** Endpoints of other protocols (their own error shapes): Anthropic Messages, OpenAI Responses. */
  readonly protocols: { matches(path: string): boolean; handle(req: Request, path: string): Promise<Response> }[];

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
    this.limits = { ...DEFAULT_LIMITS, ...opts.limits };
    this.policy = new OriginPolicy({
      allowedOrigins: opts.allowedOrigins ?? [],
      allowedHosts: opts.allowedHosts ?? [],
      bindHost: opts.host ?? "127.0.0.1",
      hasApiKey: !!opts.apiKey,
    });
    this.apiKey = opts.apiKey ? Buffer.from(opts.apiKey) : null;
    this.web = new WebChat(opts.webDir === undefined ? DEFAULT_WEB_DIR : opts.webDir);
    this.metrics = new ServerMetrics(opts.scheduler);
    this.protocols = [new AnthropicApi(this), new ResponsesApi(this)];
  }

  /** CORS headers of a response (origin.ts: only for an allowed cross-origin page). */
  cors(req: Request | null): Record<string, string> {
    return this.policy.headers(req);
  }

  json(req: Request | null, status: number, body: unknown, extra: Record<string, string> = {}): Response {
    return new Response(JSON.stringify(body), { status, headers: { ...JSON_HEADERS, ...this.cors(req), ...extra } });
  }

  errorResponse(e: ApiError, req: Request | null = null): Response {
    const extra: Record<string, string> = e.status === 401 ? { "WWW-Authenticate": "Bearer" } : {};
    return this.json(req, e.status, e.body(), extra);
  }

  async handle(req: Request, srv: { timeout(req: Request, seconds: number): void } | null): Promise<Response> {
    const t0 = performance.now();
    const path = requestPath(req);
    // While the request is served, its connection is bounded by the server's own timeouts (the
    // body's, the stream's); Bun's idle timeout would otherwise drop a long generation silently.
    if (srv) {
      this.#servers.set(req, srv);
      this.#setTimeout(req, 0);
    }
    let res: Response;
    try {
      // Host (DNS rebinding) and Origin before anything else, preflights included.
      this.policy.check(req);
      res = await this.route(req, path);
    } catch (e) {
      res = this.errorResponse(toApiError(e), req);
    }
    // A body left on the wire (413, 408, a bad chunk, or an answer that needed no body): close
    // rather than read the rest.
    if (this.#unread.has(req) || (hasBody(req) && !req.bodyUsed)) res.headers.set("Connection", "close");
    if (!this.#streaming.has(req)) this.restoreTimeout(req);
    this.metrics.request(req.method, path, res.status);
    this.opts.log?.(`${req.method} ${path} ${res.status} ${((performance.now() - t0) / 1000).toFixed(3)}s`);
    return res;
  }

  #setTimeout(req: Request, seconds: number): void {
    try {
      this.#servers.get(req)?.timeout(req, seconds);
    } catch {
      // the connection is gone
    }
  }

  /** Give the connection its idle timeout back (the response is complete, or its last bytes are being written). */
  restoreTimeout(req: Request): void {
    this.#setTimeout(req, bunIdleTimeout(this.limits.idleTimeoutS));
  }

  /**
   * The body of a streamed response (server-sent events written by `frames`), bounded by the
   * write timeout and the buffered-output limit (stream-guard.ts); `abort` cancels the request,
   * `done` runs once the response has ended.
   */
  streamBody(req: Request, frames: AsyncIterator<string>, o: { abort(): void; done(): void; errorFrame(e: unknown): string }): ReadableStream<Uint8Array> {
    this.#streaming.add(req);
    return guardedStream(frames, {
      writeTimeoutMs: this.limits.writeTimeoutS * 1000,
      maxBufferedBytes: this.limits.maxBufferedBytes,
      abort: o.abort,
      errorFrame: o.errorFrame,
      beforeClose: () => this.restoreTimeout(req),
      onEnd: () => o.done(),
    });
  }

  async route(req: Request, path: string): Promise<Response> {
    if (req.method === "OPTIONS") return this.policy.preflight(req);
    // The page and its files hold no secret: served without the API key (the page sends it).
    if ((req.method === "GET" || req.method === "HEAD") && this.web.has(path)) return this.web.serve(req, path);
    const protocol = this.protocols.find((x) => x.matches(path));
    if (protocol) return await protocol.handle(req, path);
    if (path === "/metrics") return await this.metricsResponse(req);
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
    // Anthropic's clients send the key as x-api-key.
    const raw = m ? m[1]! : req.headers.get("x-api-key");
    const given = raw ? Buffer.from(raw) : null;
    if (!given || given.length !== this.apiKey.length || !timingSafeEqual(given, this.apiKey)) {
      throw new ApiError(
        401,
        given ? "Incorrect API key provided" : "Missing API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')",
        null,
        "invalid_api_key",
      );
    }
  }

  /** The body as UTF-8 text, within the size limit (413) and the body and idle timeouts (408). */
  async readBody(req: Request): Promise<string> {
    try {
      return await readBodyText(req, { maxBytes: this.maxBody, idleMs: this.limits.idleTimeoutS * 1000, totalMs: this.limits.bodyTimeoutS * 1000 });
    } catch (e) {
      if (e instanceof BodyError) this.#unread.add(req);
      throw e;
    }
  }

  /** GET /metrics (Prometheus text format); the API key is needed when the server has one. */
  async metricsResponse(req: Request): Promise<Response> {
    this.authorize(req);
    if (req.method !== "GET" && req.method !== "HEAD") throw new ApiError(405, `/metrics takes GET, not ${req.method}`, null, "method_not_allowed");
    const m = await this.metrics.render();
    return new Response(req.method === "HEAD" ? null : m.body, { status: 200, headers: { "Content-Type": m.contentType, ...this.cors(req) } });
  }

  health(req: Request): Response {
    return this.json(req, 200, {
      status: "ok",
      model: this.opts.modelId,
      kv_mode: this.opts.kvMode ?? null,
      // Whether the model takes images (image_url parts): the web chat shows its attach button then.
      vision: !!this.opts.images,
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
    const id = decodePathSegment(path.slice("/v1/models/".length));
    const names = [this.opts.modelId, ...(this.opts.modelAliases ?? []), "default_model"];
    if (!names.includes(id)) throw new ApiError(404, `The model '${id}' does not exist`, "model", "model_not_found");
    return this.json(req, 200, this.modelCard());
  }

  promptIds(p: ParsedRequest): number[] {
    const m = this.opts.model;
    if (p.kind === "completion") {
      const ids = typeof p.prompt === "string" ? rawPromptIds(m, p.prompt) : p.prompt;
      // An image placeholder token with no image behind it (a vision model would read it as an image position).
      const image = this.opts.images?.tokens.imageTokenId;
      if (image !== undefined && ids.includes(image))
        throw new ApiError(400, `the prompt holds the image placeholder token (id ${image}); ${NO_COMPLETION_IMAGES}`, "prompt", "unsupported_parameter");
      return ids;
    }
    const kwargs = { ...this.opts.chatTemplateArgs, ...p.chatTemplateKwargs };
    try {
      const ids = chatPromptIds(m, p.messages, { tools: p.tools, kwargs, roleMapping: p.roleMapping, timeoutMs: this.limits.templateTimeoutMs });
      // Each image placeholder becomes its image's soft tokens (server/images.ts).
      return p.images?.length && this.opts.images ? expandPromptImages(ids, p.images, this.opts.images.tokens, p.messages) : ids;
    } catch (e) {
      if (e instanceof ApiError) throw e;
      // A template that loops too long: stopped by its time budget (--template-timeout).
      if (e instanceof TemplateTimeoutError) throw new ApiError(400, `chat template: ${e.message}`, "messages", "chat_template_timeout");
      // The template rejects the conversation (e.g. its raise_exception on a bad role order).
      throw new ApiError(400, `chat template: ${(e as Error).message}`, "messages", "invalid_value");
    }
  }

  /** Where the prompt cache keeps snapshots of a chat prompt (the end of the system messages and of the history). */
  promptCheckpoints(p: ParsedChat, promptIds: readonly number[]): number[] {
    const kwargs = { ...this.opts.chatTemplateArgs, ...p.chatTemplateKwargs };
    try {
      return chatPromptCheckpoints(this.opts.model, p.messages, promptIds, { tools: p.tools, kwargs, timeoutMs: this.limits.templateTimeoutMs });
    } catch {
      // Checkpoints only help prompt reuse: without them the request runs all the same.
      return [];
    }
  }

  /** The request pipeline of every chat endpoint: prompt ids, GenerateRequest(s), one scheduler stream per choice. */
  submit(req: Request, p: ParsedRequest, extra: SubmitExtras = {}): Submission {
    const endpoint = requestPath(req);
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
      // The runtime's own checks of the sampling settings, now: a bad value is this request's 400,
      // not a fault inside the scheduler (a 500, or an error event after a 200 for a stream).
      // Every choice's (with a seed, choice i samples with seed + i).
      try {
        for (const r of choiceRequests(greq, p.n)) resolveSampling(r.sampling, this.opts.model.tokenizer.vocabSize);
      } catch (e) {
        throw new ApiError(400, (e as Error).message, null, "invalid_value");
      }
      if (p.kind === "chat" && p.images?.length) greq.images = p.images;
      else if (p.kind === "chat") greq.cacheCheckpoints = this.promptCheckpoints(p, promptIds);
      if (p.kind === "chat") {
        const toolCall = this.opts.model.tokenizer.tokenToId(GEMMA4_MARKERS.toolCallStart);
        // tool_choice "none": the model cannot open a tool call.
        if (p.toolChoice.type === "none" && toolCall !== undefined) greq.logitsProcessors = [...(greq.logitsProcessors ?? []), banTokens([toolCall])];
      }
      if (extra.logitsProcessors?.length) greq.logitsProcessors = [...(greq.logitsProcessors ?? []), ...extra.logitsProcessors];
      for (const [i, r] of choiceRequests(greq, p.n).entries()) {
        const own = extra.choiceProcessors?.[i];
        if (own) r.logitsProcessors = [...(r.logitsProcessors ?? []), ...own];
        const stream = this.opts.scheduler.submit(r);
        if (own) stream.result.finally(() => own.forEach((x) => x.dispose())).catch(() => {});
        stream.result.then(
          (res) => {
            this.#countSpeculative(res);
            this.metrics.generation(endpoint, res);
          },
          () => {},
        );
        streams.push(stream);
      }
    } catch (e) {
      abort.abort(); // the choices already submitted end at their next step
      done();
      for (const own of extra.choiceProcessors?.slice(streams.length) ?? []) own.forEach((x) => x.dispose());
      throw e;
    }
    return { streams, promptIds, abort, done };
  }

  /**
   * One grammar processor per choice: response_format's (a 400 naming the schema feature it cannot
   * enforce), or tool_choice "required" / a named function's (the turn must be tool calls).
   */
  async grammars(p: ParsedRequest, o: { parallelToolCalls?: boolean } = {}): Promise<GrammarProcessor[][] | undefined> {
    if (p.kind !== "chat") return undefined;
    const tok = this.opts.model.tokenizer;
    let make: () => Promise<GrammarProcessor>;
    let param: string;
    if (p.responseFormat) {
      const format = p.responseFormat;
      make = () => grammarProcessor(tok, format);
      param = "response_format";
    } else if (p.toolChoice.type === "required" || p.toolChoice.type === "function") {
      const tools = toolSpecs(p.tools, p.toolChoice);
      // The model may think first unless the prompt closed the thought channel (thinking off).
      const promptIds = this.promptIds(p);
      const thinking = promptIds.at(-1) !== tok.tokenToId(GEMMA4_MARKERS.thoughtEnd);
      make = () => toolCallProcessor(tok, { tools, thinking, parallel: o.parallelToolCalls ?? true }, { promptTokens: promptIds.length });
      param = "tool_choice";
    } else return undefined;
    const out: GrammarProcessor[][] = [];
    try {
      for (let i = 0; i < p.n; i++) out.push([await make()]);
    } catch (e) {
      for (const g of out) g.forEach((x) => x.dispose());
      const err = e as Error;
      if (err.name === "SchemaError" || err.name === "RequestError") throw new ApiError(400, err.message, param, "invalid_value");
      if (err.name === "ToolGrammarError") throw new ApiError(400, `tool_choice cannot be enforced: ${err.message}`, "tools", "invalid_value");
      throw e;
    }
    return out;
  }

  async loadImages(p: ParsedRequest): Promise<void> {
    if (p.kind === "chat") p.images = await loadRequestImages(p.messages, this.opts.images, this.opts.modelId);
  }

  async complete(req: Request, p: ParsedRequest): Promise<Response> {
    await this.loadImages(p);
    const choiceProcessors = await this.grammars(p);
    const { streams, promptIds, abort, done } = this.submit(req, p, choiceProcessors ? { choiceProcessors } : {});
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
    const its = streams.map((s) => s[Symbol.asyncIterator]());
    type Next = { i: number; r?: IteratorResult<GenerationEvent>; error?: unknown };
    // A failure comes back as a value, so a promise nobody races yet never rejects unhandled.
    const next = (i: number): Promise<Next> =>
      its[i]!.next().then(
        (r) => ({ i, r }),
        (error: unknown) => ({ i, error }),
      );
    const sse = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`;
    async function* frames(): AsyncGenerator<string> {
      const pending = new Map<number, Promise<Next>>(its.map((_, i) => [i, next(i)]));
      const results: GenerationResult[] = [];
      while (pending.size) {
        const { i, r, error } = await Promise.race(pending.values());
        if (error !== undefined) throw error;
        const fmt = fmts[i]!;
        if (r!.done) {
          pending.delete(i);
          const result = await streams[i]!.result;
          results[i] = result;
          yield sse(fmt.finalChunk(result));
          continue;
        }
        pending.set(i, next(i));
        const chunk = fmt.addAndChunk(r!.value);
        if (chunk) yield sse(chunk);
      }
      const f = fmts[0]!;
      if (f.p.includeUsage) yield sse({ ...f.base(f.chat ? "chat.completion.chunk" : "text_completion"), choices: [], usage: usageOf(results) });
      yield "data: [DONE]\n\n";
    }
    // Headers are gone once streaming: a fault is reported in the stream itself, then it ends.
    const body = this.streamBody(req, frames(), { abort: () => abort.abort(), done, errorFrame: (e) => sse(toApiError(e).body()) });
    return new Response(body, {
      status: 200,
      headers: { "Content-Type": "text/event-stream", "Cache-Control": "no-cache", Connection: "keep-alive", ...this.cors(req) },
    });
  }
}

/** Whether the request announced a body (Content-Length > 0 or a chunked transfer encoding). */
function hasBody(req: Request): boolean {
  const n = req.headers.get("content-length");
  return (n !== null && n.trim() !== "0") || req.headers.has("transfer-encoding");
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
    // Kept for the whole response's logprobs only: a stream sends each entry in its chunk, and
    // keeping them all would hold ~KBs per token per choice until the stream ends.
    if (e && !this.p.stream) this.entries.push(e);
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
    ...(spec.length
      ? { speculative: speculativeUsage({ drafted: spec.reduce((n, x) => n + x.drafted, 0), accepted: spec.reduce((n, x) => n + x.accepted, 0) }) }
      : {}),
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

// What the protocol modules (anthropic.ts, responses.ts) use of the HTTP server: its settings, its
// body reading and API-key check, and the one request pipeline every chat endpoint goes through
// (chat template → prompt ids → GenerateRequest → scheduler), plus the server-sent-events
// plumbing of one streamed turn. The OpenAI endpoints of http.ts use the same `submit`.
import type { GenerationStream, GrammarProcessor, LogitsProcessor } from "@mlx-bun/runtime";
import type { ServerOptions } from "./server-options.ts";
import type { ParsedRequest, ValidationContext } from "./validate.ts";

/** Per-request additions to the pipeline's GenerateRequest (one choice: the processors keep state). */
export interface SubmitExtras {
  logitsProcessors?: LogitsProcessor[];
  /**
   * Processors of each choice (index i: choice i's), e.g. response_format grammars. Each choice
   * disposes its own when its stream ends; submit disposes those of choices it did not submit.
   */
  choiceProcessors?: (LogitsProcessor & { dispose(): void })[][];
}

/** A submitted request: the prompt, the scheduler stream of each choice, and how to cancel them. */
export interface Submission {
  streams: GenerationStream[];
  promptIds: number[];
  /** Aborts the request's rows (the client's hang-up does too). */
  abort: AbortController;
  /** Call once the response is finished (unhooks the client's abort signal). */
  done(): void;
}

export interface ServerCore {
  readonly opts: ServerOptions;
  readonly vctx: ValidationContext;
  readonly contextLength: number;
  cors(req: Request | null): Record<string, string>;
  /** Throws a 401 ApiError unless the request carries the server's API key (Bearer or x-api-key). */
  authorize(req: Request): void;
  /** The body as UTF-8 text, within the body-size limit (413 beyond it). */
  readBody(req: Request): Promise<string>;
  /**
   * Read, decode and preprocess the images of a chat request's image items (server/images.ts) into
   * `p.images`, before promptIds / grammars / submit: 400s name the item's path.
   */
  loadImages(p: ParsedRequest): Promise<void>;
  /** The prompt ids of a parsed request (chat template with tools and kwargs). */
  promptIds(p: ParsedRequest): number[];
  /**
   * The grammar processors of each choice (pass as `choiceProcessors`): response_format's, or a
   * forced tool call's (tool_choice "required" / a named function); undefined when none applies.
   * `parallelToolCalls` false: the turn is exactly one call.
   */
  grammars(p: ParsedRequest, o?: { parallelToolCalls?: boolean }): Promise<GrammarProcessor[][] | undefined>;
  /** Build the GenerateRequest(s) of a parsed request and submit them to the scheduler. */
  submit(req: Request, p: ParsedRequest, extra?: SubmitExtras): Submission;
  /**
   * The body of a streamed response written by `frames`, bounded per connection (stream-guard.ts:
   * a client that stops reading is cut off after the write timeout, one that falls too far behind
   * gets an error event; either way the request is cancelled).
   */
  streamBody(req: Request, frames: AsyncIterator<string>, o: { abort(): void; done(): void; errorFrame(e: unknown): string }): ReadableStream<Uint8Array>;
}

/**
 * A streamed response of server-sent events written by `frames` (each yield is one or more whole
 * events), read with back-pressure. A fault inside `frames` becomes `errorFrame(e)` and ends the
 * stream; a client that goes away cancels the request.
 */
export function sseResponse(core: ServerCore, req: Request, sub: Submission, frames: AsyncGenerator<string>, errorFrame: (e: unknown) => string): Response {
  let finished = false;
  const finish = () => {
    if (finished) return;
    finished = true;
    sub.done();
  };
  const body = core.streamBody(req, frames, { abort: () => sub.abort.abort(), done: finish, errorFrame });
  return new Response(body, {
    status: 200,
    headers: { "Content-Type": "text/event-stream", "Cache-Control": "no-cache", Connection: "keep-alive", ...core.cors(req) },
  });
}

/** One server-sent event: `event:` line (when named) and the JSON data. */
export function sse(event: string | null, data: unknown): string {
  return `${event ? `event: ${event}\n` : ""}data: ${JSON.stringify(data)}\n\n`;
}

// Limits that keep one connection from holding the server: how long a request may take to arrive,
// how long a connection may sit idle, how much response a client that does not read may leave
// waiting, and how long a chat template may render. Also the request path and body readers that
// never throw anything but an ApiError (a malformed request is a 4xx, never a 500).
import { ApiError } from "./errors.ts";

export interface ServerLimits {
  /**
   * Seconds a connection may stay silent (a keep-alive connection between requests, a request
   * body that stops arriving). Bun's idleTimeout (1..255). While a request is being served the
   * server's own timeouts below apply instead.
   */
  idleTimeoutS: number;
  /** Seconds to receive a whole request body (once its headers are in); 408 beyond it. */
  bodyTimeoutS: number;
  /** Seconds a streamed response may wait on a client that does not read; then the request is cancelled and the connection closed. */
  writeTimeoutS: number;
  /**
   * Bytes of streamed output one response may hold that the socket has not taken (the client
   * reads slower than the model writes); beyond it the request is cancelled and an error event
   * ends the stream.
   */
  maxBufferedBytes: number;
  /** Milliseconds a chat template may take to render one prompt (a 400 beyond it). */
  templateTimeoutMs: number;
}

export const DEFAULT_LIMITS: ServerLimits = {
  idleTimeoutS: 30,
  bodyTimeoutS: 60,
  writeTimeoutS: 30,
  maxBufferedBytes: 4 * 1024 * 1024,
  templateTimeoutMs: 5_000,
};

/** Bun's idleTimeout takes whole seconds in 0..255 (0 = never, which a server should not use). */
export function bunIdleTimeout(s: number): number {
  return Math.min(255, Math.max(1, Math.ceil(s)));
}

/**
 * The request's path without its query, as sent. Bun gives `req.url` as a bare path when the
 * Host header is missing or invalid (an HTTP/1.0 request), which `new URL` refuses.
 */
export function requestPath(req: Request): string {
  const raw = req.url;
  let path: string;
  if (raw.startsWith("/")) path = raw;
  else {
    try {
      path = new URL(raw).pathname;
    } catch {
      const m = /^[a-z][a-z0-9+.-]*:\/\/[^/?#]*([^?#]*)/i.exec(raw);
      path = m?.[1] || "/";
    }
  }
  path = path.replace(/[?#].*$/s, "");
  return path.replace(/\/+$/, "") || "/";
}

/** decodeURIComponent as a 400 for bad percent-encoding (e.g. /v1/models/%ZZ). */
export function decodePathSegment(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    throw new ApiError(400, `Malformed percent-encoding in the request path: ${JSON.stringify(s)}`, null, "invalid_request");
  }
}

/** A 4xx after which the rest of the request body may still be on the wire: the connection is closed after the answer. */
export class BodyError extends ApiError {
  override name = "BodyError";
}

export function tooLarge(limit: number): BodyError {
  return new BodyError(413, `Request body is larger than the limit of ${limit} bytes`, null, "request_too_large");
}

export interface BodyLimits {
  maxBytes: number;
  /** The longest silence between two chunks (ms). */
  idleMs: number;
  /** The whole body (ms). */
  totalMs: number;
}

/**
 * The request body as UTF-8 text within `limits`: 413 past maxBytes (on Content-Length first,
 * then while reading a chunked body), 408 when it stops arriving or takes too long, 400 for a bad
 * Content-Length or invalid UTF-8. The reader is cancelled on every failure.
 */
export async function readBodyText(req: Request, limits: BodyLimits): Promise<string> {
  const declared = req.headers.get("content-length");
  if (declared !== null) {
    // Bun's parser has already refused non-numeric values; this is the backstop.
    if (!/^\s*\d+\s*$/.test(declared)) throw new BodyError(400, "Invalid Content-Length header", null, "invalid_request");
    if (Number(declared) > limits.maxBytes) throw tooLarge(limits.maxBytes);
  }
  if (!req.body) return "";
  const reader = req.body.getReader();
  const chunks: Uint8Array[] = [];
  let total = 0;
  const t0 = performance.now();
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    for (;;) {
      const left = limits.totalMs - (performance.now() - t0);
      const wait = Math.max(0, Math.min(limits.idleMs, left));
      const timeout = new Promise<"timeout">((resolve) => {
        timer = setTimeout(() => resolve("timeout"), wait);
      });
      let r: Awaited<ReturnType<typeof reader.read>> | "timeout";
      try {
        r = await Promise.race([reader.read(), timeout]);
      } catch {
        throw new BodyError(400, "The request body could not be read (the client aborted it or sent a malformed chunked encoding)", null, "invalid_request");
      } finally {
        clearTimeout(timer);
      }
      if (r === "timeout") {
        const whole = left <= limits.idleMs;
        throw new BodyError(
          408,
          whole
            ? `The request body took longer than ${Math.round(limits.totalMs / 1000)} s to arrive (--body-timeout)`
            : `The request body stopped arriving for ${Math.round(limits.idleMs / 1000)} s (--idle-timeout)`,
          null,
          "request_timeout",
        );
      }
      if (r.done) break;
      total += r.value.byteLength;
      if (total > limits.maxBytes) throw tooLarge(limits.maxBytes);
      chunks.push(r.value);
    }
  } catch (e) {
    void reader.cancel().catch(() => {});
    throw e;
  }
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(Buffer.concat(chunks));
  } catch {
    throw new ApiError(400, "Request body is not valid UTF-8", null, "invalid_json");
  }
}

// The body of a streamed response, written with back-pressure and bounds. The generation runs at
// the model's pace whatever the client does, so its events are taken as they come and kept here
// until the socket takes them; this is where a client that reads slowly or not at all is bounded:
// - at most `maxBufferedBytes` may wait: beyond that the request is cancelled (its scheduler row
//   and KV memory freed) and an error event replaces what was waiting;
// - a write the socket has not taken for `writeTimeoutMs` ends the response: the request is
//   cancelled and the connection closed (reset), since the client is not reading.
// It is a Bun "direct" ReadableStream: its write() says when the socket is full (it returns a
// promise), and close(error) drops the connection; a plain ReadableStream gives neither (Bun stops
// pulling, but a stalled connection is then held as long as the client keeps it open).
import { ApiError } from "./errors.ts";

export interface StreamGuardOptions {
  writeTimeoutMs: number;
  maxBufferedBytes: number;
  /** Cancel the generation (client gone, stalled, or too far behind). */
  abort(): void;
  /** The server-sent event that reports `e` in the stream (the headers are gone). */
  errorFrame(e: unknown): string;
  /** Called once, when the response has ended one way or another (with why). */
  onEnd?(how: StreamEnd): void;
  /** Called once the last byte was written, right before the stream closes normally. */
  beforeClose?(): void;
}

export type StreamEnd = "done" | "error" | "client_gone" | "stalled" | "overflow";

/**
 * What the guards of this process have done (tests and the soak benchmark read it): responses
 * cut off after the write timeout, requests cancelled for falling too far behind (counted when it
 * happens; such a response then ends one way or another), clients gone mid-stream.
 */
export const streamGuardStats = { stalled: 0, overflow: 0, clientGone: 0 };

interface DirectController {
  write(data: Uint8Array): number | Promise<number>;
  close(error?: Error): void;
}

class Stalled extends Error {
  override name = "StreamStalled";
  override stack = "";
}

/** A response body of the strings `frames` yields (each one or more whole SSE events). */
export function guardedStream(frames: AsyncIterator<string>, o: StreamGuardOptions): ReadableStream<Uint8Array> {
  const enc = new TextEncoder();
  const queue: Uint8Array[] = [];
  let queued = 0;
  let produced = false; // the producer has ended (normally, by error, or cut off)
  let stopped = false; // the response is over from our side (client gone or stalled)
  let ended = false;
  let wake: (() => void) | null = null;
  const notify = () => {
    const w = wake;
    wake = null;
    w?.();
  };
  const end = (how: StreamEnd) => {
    if (ended) return;
    ended = true;
    if (how === "stalled") streamGuardStats.stalled++;
    else if (how === "client_gone") streamGuardStats.clientGone++;
    o.onEnd?.(how);
  };
  let outcome: StreamEnd = "done";
  let started = false;

  // The producer: takes every event as it comes, so nothing piles up in the runtime's channel.
  const pump = async () => {
    try {
      for (;;) {
        const { value, done } = await frames.next();
        if (done || stopped) break;
        const b = enc.encode(value);
        queue.push(b);
        queued += b.byteLength;
        if (queued > o.maxBufferedBytes) {
          outcome = "overflow";
          streamGuardStats.overflow++;
          o.abort();
          queue.length = 0;
          const e = new ApiError(
            400,
            `The client read the stream too slowly: more than ${o.maxBufferedBytes} bytes were waiting (--max-buffered-output); the request was cancelled`,
            null,
            "stream_overflow",
          );
          const f = enc.encode(o.errorFrame(e));
          queue.push(f);
          queued = f.byteLength;
          break;
        }
        notify();
      }
    } catch (e) {
      if (!stopped) {
        outcome = "error";
        o.abort();
        const f = enc.encode(o.errorFrame(e));
        queue.push(f);
        queued += f.byteLength;
      }
    } finally {
      produced = true;
      notify();
      if (outcome === "overflow" || stopped) void Promise.resolve(frames.return?.()).catch(() => {});
    }
  };

  return new ReadableStream({
    type: "direct",
    pull: async (c: DirectController) => {
      if (started) return;
      started = true;
      void pump();
      try {
        for (;;) {
          if (stopped) return;
          const chunk = queue.shift();
          if (!chunk) {
            if (produced) break;
            await new Promise<void>((r) => {
              wake = r;
            });
            continue;
          }
          queued -= chunk.byteLength;
          const w = c.write(chunk);
          if (typeof w === "object" && w !== null && typeof w.then === "function") {
            // The socket is full: wait for the client to take it, for a while.
            let timer: ReturnType<typeof setTimeout> | undefined;
            const timedOut = await Promise.race([
              w.then(
                () => false,
                () => false,
              ),
              new Promise<boolean>((r) => {
                timer = setTimeout(() => r(true), o.writeTimeoutMs);
              }),
            ]);
            clearTimeout(timer);
            if (stopped) return;
            if (timedOut) {
              stopped = true;
              o.abort();
              notify();
              end("stalled");
              // Drops the connection: the client has not read for writeTimeoutMs.
              c.close(new Stalled(`the client did not read the stream for ${o.writeTimeoutMs} ms`));
              return;
            }
          }
        }
        o.beforeClose?.();
        c.close();
        end(outcome);
      } catch {
        // The connection is gone.
        stopped = true;
        o.abort();
        end("client_gone");
      }
    },
    cancel: () => {
      // The client went away: cancel the request (its cache rows are freed).
      stopped = true;
      o.abort();
      notify();
      end("client_gone");
    },
  } as unknown as ConstructorParameters<typeof ReadableStream<Uint8Array>>[0]);
}

// The messages between rank 0's model thread and its HTTP worker (serve across ranks,
// docs/distributed.md "serve across ranks"). Plain structured-clone data only.
import type { GenerateRequest, GenerationEvent, GenerationResult } from "@mlx-bun/runtime";
import type { ServerOptions } from "../server/http.ts";

/** A request as it crosses the thread boundary (the abort signal becomes a "cancel" message). */
export type WireRequest = Omit<GenerateRequest, "signal">;

/** An error as it crosses: its class name (RequestError maps to 400), message and an HTTP status if fixed. */
export interface WireError {
  name: string;
  message: string;
  status?: number;
}

/** Worker → model thread. */
export type ToModel =
  | { t: "listening"; url: string; webChat: "on" | "not built" | "off" }
  | { t: "startFailed"; error: WireError }
  | { t: "submit"; id: number; req: WireRequest }
  | { t: "cancel"; id: number }
  | { t: "closed" };

/** Model thread → worker. */
export type ToWorker =
  | { t: "init"; init: WorkerInit }
  | { t: "tick" }
  | { t: "event"; id: number; ev: GenerationEvent }
  | { t: "done"; id: number; result: GenerationResult }
  | { t: "error"; id: number; error: WireError }
  /** Fail every open request with this error (503), refuse new ones, stop listening, answer "closed". */
  | { t: "shutdown"; error: WireError };

/** What the worker is started with (its first message). */
export interface WorkerInit {
  dir: string;
  /** The model thread is declared stuck when it sends no tick for this long. */
  stallMs: number;
  /** Engine limits the worker checks before a request crosses (as Scheduler.submit does). */
  maxKvSize: number | undefined;
  server: Omit<ServerOptions, "model" | "scheduler" | "log">;
  log: boolean;
}

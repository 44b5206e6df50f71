// GET /metrics: the server's counters in Prometheus' text format (prom-client, one registry per
// server). Requests by endpoint and status, prompt / generated / cached tokens, time to first
// token and time per output token, and, read at scrape time, the scheduler's batch, MLX memory
// and the prompt cache's hits, misses and reused tokens.
import { memory } from "@mlx-bun/mlx-ffi";
import type { GenerationResult } from "@mlx-bun/runtime";
import { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { RequestSink } from "./server-options.ts";

/** What the metrics read of the scheduler where it has it (the runtime's Scheduler does). */
interface SchedulerView {
  readonly active: number;
  readonly batchSize?: number;
  readonly promptCache?:
    | { readonly stats: { hits: number; misses: number; cachedTokens: number; evictions?: number }; readonly bytes: number; readonly size: number }
    | undefined;
}

/** The `endpoint` label of a path: the routes, with ids folded (bounded cardinality). */
export function endpointLabel(path: string): string {
  const known = [
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/completions",
    "/completions",
    "/v1/models",
    "/health",
    "/metrics",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/",
  ];
  if (known.includes(path)) return path;
  if (path.startsWith("/v1/models/")) return "/v1/models/{id}";
  if (path.startsWith("/v1/responses/")) return "/v1/responses/{id}";
  if (path.startsWith("/assets/")) return "/assets";
  return "other";
}

const PREFIX = "mlx_bun_";

export class ServerMetrics {
  readonly registry = new Registry();
  readonly requests: Counter<"endpoint" | "method" | "status">;
  readonly promptTokens: Counter<"endpoint">;
  readonly cachedTokens: Counter<"endpoint">;
  readonly generationTokens: Counter<"endpoint">;
  readonly finished: Counter<"endpoint" | "finish_reason">;
  readonly ttft: Histogram<"endpoint">;
  readonly tpot: Histogram<"endpoint">;

  constructor(sink: RequestSink) {
    const registers = [this.registry];
    const s = sink as RequestSink & SchedulerView;
    this.requests = new Counter({
      name: `${PREFIX}http_requests_total`,
      help: "HTTP requests answered, by endpoint, method and status code",
      labelNames: ["endpoint", "method", "status"],
      registers,
    });
    this.promptTokens = new Counter({
      name: `${PREFIX}prompt_tokens_total`,
      help: "Prompt tokens of finished generation requests (cached ones included)",
      labelNames: ["endpoint"],
      registers,
    });
    this.cachedTokens = new Counter({
      name: `${PREFIX}prompt_tokens_cached_total`,
      help: "Prompt tokens served from the prompt cache instead of prefilled",
      labelNames: ["endpoint"],
      registers,
    });
    this.generationTokens = new Counter({
      name: `${PREFIX}generation_tokens_total`,
      help: "Tokens generated (a final end-of-turn token included)",
      labelNames: ["endpoint"],
      registers,
    });
    this.finished = new Counter({
      name: `${PREFIX}requests_finished_total`,
      help: "Generation requests (one per choice) by how they ended: stop, length, cancelled",
      labelNames: ["endpoint", "finish_reason"],
      registers,
    });
    this.ttft = new Histogram({
      name: `${PREFIX}time_to_first_token_seconds`,
      help: "Time from submission to the first generated token (queueing and prefill)",
      labelNames: ["endpoint"],
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80],
      registers,
    });
    this.tpot = new Histogram({
      name: `${PREFIX}time_per_output_token_seconds`,
      help: "Decode time per output token after the first (one observation per request: its mean)",
      labelNames: ["endpoint"],
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5],
      registers,
    });
    const gauge = (name: string, help: string, read: () => number | undefined) =>
      new Gauge({
        name: `${PREFIX}${name}`,
        help,
        registers,
        collect() {
          const v = read();
          if (v !== undefined) this.set(v);
        },
      });
    const counter = (name: string, help: string, read: () => number | undefined) =>
      new Counter({
        name: `${PREFIX}${name}`,
        help,
        registers,
        collect() {
          const v = read();
          if (v === undefined) return;
          this.reset();
          this.inc(v);
        },
      });
    gauge("active_requests", "Requests running, being prefilled or waiting in the scheduler", () => s.active);
    // What the scheduler does not have (a batch size, a prompt cache) is left out rather than reported as 0.
    if (typeof s.batchSize === "number") gauge("batch_size", "Requests in the scheduler's decode batch", () => s.batchSize);
    gauge("memory_active_bytes", "MLX active memory: weights, KV caches and live arrays", () => memory.active());
    gauge("memory_peak_bytes", "MLX peak active memory since start", () => memory.peak());
    gauge("memory_cache_bytes", "MLX buffer cache (freed memory kept for reuse)", () => memory.cache());
    const pc = () => s.promptCache;
    if (pc()) {
      counter("prompt_cache_hits_total", "Prompt-cache lookups that reused a cached prefix", () => pc()?.stats.hits);
      counter("prompt_cache_misses_total", "Prompt-cache lookups with nothing to reuse", () => pc()?.stats.misses);
      counter("prompt_cache_cached_tokens_total", "Prompt tokens the prompt cache served, over all hits", () => pc()?.stats.cachedTokens);
      gauge("prompt_cache_bytes", "Bytes held by the prompt cache's entries", () => pc()?.bytes);
      gauge("prompt_cache_entries", "Entries in the prompt cache", () => pc()?.size);
    }
  }

  /** One answered HTTP request. */
  request(method: string, path: string, status: number): void {
    this.requests.inc({ endpoint: endpointLabel(path), method, status: String(status) });
  }

  /** One finished generation request (a choice) of `path`. */
  generation(path: string, r: GenerationResult): void {
    const endpoint = endpointLabel(path);
    this.promptTokens.inc({ endpoint }, r.promptTokens);
    this.cachedTokens.inc({ endpoint }, r.cachedTokens);
    this.generationTokens.inc({ endpoint }, r.tokens.length);
    this.finished.inc({ endpoint, finish_reason: r.finishReason });
    if (r.tokens.length > 0) this.ttft.observe({ endpoint }, r.ttft);
    if (r.tokens.length > 1) this.tpot.observe({ endpoint }, r.decodeSeconds / (r.tokens.length - 1));
  }

  async render(): Promise<{ body: string; contentType: string }> {
    return { body: await this.registry.metrics(), contentType: this.registry.contentType };
  }
}

// The server's options and what it needs of the model and the scheduler (shared by http.ts and the endpoint files).
import type { ChatTemplate, Gemma4Tokenizer } from "@mlx-bun/models";
import type { GenerateRequest, GenerationStream } from "@mlx-bun/runtime";
import type { ImageSupport } from "./images.ts";
import type { ServerLimits } from "./limits.ts";
import type { RequestDefaults } from "./validate.ts";

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
  /** Web origins whose pages may call the API (CORS); "*" allows any. Default: none but the server's own (the web chat). */
  allowedOrigins?: string[];
  /** Host names the DNS-rebinding check accepts besides localhost, 127.0.0.1, [::1] and the bound address ("*": no check). */
  allowedHosts?: string[];
  /** Timeouts and buffer bounds per connection (limits.ts; defaults DEFAULT_LIMITS). */
  limits?: Partial<ServerLimits>;
  /** One line per request (default: none). */
  log?: (line: string) => void;
  /** The built web chat served at "/" (default: apps/mlx-bun/web/dist, built by tools/setup.sh); null: none. */
  webDir?: string | null;
  /** The KV cache mode /health reports (the engine's kvModeName, e.g. "bf16"). */
  kvMode?: string;
  /** Image input (image_url parts): the model's image settings (server/images.ts imageSupportFor); null or absent: a 400 for images. */
  images?: ImageSupport | null;
  /** The draft model of speculative decoding (--draft-model), if any: /health then reports acceptance totals. */
  draftModel?: string;
}

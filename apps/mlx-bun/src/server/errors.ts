// OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}} with an HTTP status.

export interface ApiErrorBody {
  error: { message: string; type: string; param: string | null; code: string | null };
}

/** An error the HTTP layer turns into a JSON response with `status`. */
export class ApiError extends Error {
  override name = "ApiError";
  readonly type: string;

  constructor(
    readonly status: number,
    message: string,
    readonly param: string | null = null,
    readonly code: string | null = null,
    type?: string,
  ) {
    super(message);
    this.type = type ?? (status >= 500 ? "server_error" : status === 401 ? "authentication_error" : "invalid_request_error");
  }

  body(): ApiErrorBody {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

/** 400 for a field of the wrong type or value. */
export function badField(param: string, message: string, code = "invalid_value"): ApiError {
  return new ApiError(400, message, param, code);
}

/** Map anything thrown while serving to an ApiError: the runtime's RequestError is the caller's fault (400). */
export function toApiError(e: unknown): ApiError {
  if (e instanceof ApiError) return e;
  const err = e as Error;
  if (err && (err.name === "RequestError" || err.constructor?.name === "RequestError")) return new ApiError(400, err.message, null, "invalid_value");
  return new ApiError(500, `internal error: ${err?.message ?? String(e)}`, null, null, "server_error");
}

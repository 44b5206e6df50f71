// What a browser may do with the server. Browsers are the one client that reaches a server on
// 127.0.0.1 on behalf of someone else (any web page the user opens), so:
// - CORS is off unless origins are allowed (--allowed-origins, as mlx_lm.server's flag, whose
//   default "*" is not kept here): a page of another origin cannot read responses;
// - a request sent by a page of another origin that is not allowed is refused (403) before any
//   work, so a "simple" cross-origin POST (text/plain, no preflight) cannot start a generation;
// - preflights answer for allowed origins only;
// - a keyless server bound to loopback checks the Host header against DNS rebinding (a page whose
//   own name resolves to 127.0.0.1 is same-origin with the server in the browser's eyes, but its
//   requests carry its own name as Host).
import { ApiError } from "./errors.ts";

export interface OriginOptions {
  /** Allowed page origins ("*" = any); empty or absent = none but the server's own. */
  allowedOrigins?: readonly string[];
  /** Extra Host names accepted by the DNS-rebinding check ("*" turns the check off). */
  allowedHosts?: readonly string[];
  /** The address the server listens on (the Host check runs on loopback addresses). */
  bindHost: string;
  /** A server with an API key: requests without it fail anyway, so the Host check is not needed. */
  hasApiKey: boolean;
}

const METHODS = "GET, HEAD, POST, DELETE, OPTIONS";

/** "127.0.0.1:8080" → "127.0.0.1"; "[::1]:8080" → "::1"; lower case, no trailing dot. */
export function hostName(host: string): string {
  let h = host.trim().toLowerCase();
  if (h.startsWith("[")) {
    const end = h.indexOf("]");
    h = end > 0 ? h.slice(1, end) : h.slice(1);
  } else {
    const colon = h.lastIndexOf(":");
    if (colon >= 0 && h.indexOf(":") === colon) h = h.slice(0, colon);
  }
  return h.replace(/\.$/, "");
}

export function isLoopbackName(name: string): boolean {
  const h = hostName(name);
  return h === "localhost" || h.endsWith(".localhost") || h === "::1" || h === "0:0:0:0:0:0:0:1" || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(h);
}

function normalizeOrigin(o: string): string {
  return o.trim().replace(/\/+$/, "").toLowerCase();
}

/** The host:port of an origin ("http://a:80" → "a:80"; the scheme's default port filled in). */
function originHostPort(origin: string): string | null {
  try {
    const u = new URL(origin);
    const port = u.port || (u.protocol === "https:" ? "443" : u.protocol === "http:" ? "80" : "");
    return `${hostName(u.host)}:${port}`;
  } catch {
    return null;
  }
}

function hostHeaderHostPort(host: string): string {
  const h = host.trim().toLowerCase();
  const name = hostName(h);
  const m = /:(\d+)$/.exec(h);
  return `${name}:${m ? m[1] : "80"}`;
}

export class OriginPolicy {
  readonly anyOrigin: boolean;
  readonly origins: Set<string>;
  readonly hostCheck: boolean;
  readonly hosts: Set<string>;

  constructor(o: OriginOptions) {
    const origins = (o.allowedOrigins ?? []).map((x) => x.trim()).filter((x) => x.length > 0);
    this.anyOrigin = origins.includes("*");
    this.origins = new Set(origins.filter((x) => x !== "*").map(normalizeOrigin));
    const hosts = (o.allowedHosts ?? []).map((x) => x.trim()).filter((x) => x.length > 0);
    // On loopback without a key, or wherever hosts are listed explicitly ("*" turns it off).
    this.hostCheck = !hosts.includes("*") && ((isLoopbackName(o.bindHost) && !o.hasApiKey) || hosts.length > 0);
    this.hosts = new Set(hosts.map(hostName));
    this.hosts.add(hostName(o.bindHost));
  }

  /** Whether the Host header names this server (always true when the check is off or no Host was sent). */
  hostAllowed(host: string | null): boolean {
    if (!this.hostCheck || host === null) return true;
    const name = hostName(host);
    return isLoopbackName(name) || this.hosts.has(name);
  }

  /** Whether a page of `origin` sent this request to its own server (scheme aside: the Host check covers the name). */
  sameOrigin(req: Request, origin: string): boolean {
    const host = req.headers.get("host");
    if (host === null) return false;
    const o = originHostPort(origin);
    return o !== null && o === hostHeaderHostPort(host);
  }

  originAllowed(req: Request, origin: string): boolean {
    if (this.anyOrigin || this.origins.has(normalizeOrigin(origin))) return true;
    return origin !== "null" && this.sameOrigin(req, origin);
  }

  /**
   * Refuse (ApiError 403) a request whose Host is not this server's (DNS rebinding) or that a page
   * of a disallowed origin sent, preflights included; returns when it may go on.
   */
  check(req: Request): void {
    const host = req.headers.get("host");
    if (!this.hostAllowed(host)) {
      throw new ApiError(
        403,
        `Host ${JSON.stringify(host)} is not this server's: a server on a loopback address without an API key answers only to localhost, 127.0.0.1, [::1] and its own address (--allowed-hosts adds names, or set --api-key)`,
        null,
        "host_not_allowed",
      );
    }
    const origin = req.headers.get("origin");
    if (origin !== null && !this.originAllowed(req, origin)) {
      throw new ApiError(403, `Requests from the web origin ${JSON.stringify(origin)} are not allowed (--allowed-origins)`, null, "origin_not_allowed");
    }
  }

  /** CORS headers of a response to `req` (none for same-origin or origin-less requests). */
  headers(req: Request | null): Record<string, string> {
    const origin = req?.headers.get("origin");
    if (!req || !origin) return {};
    if (this.anyOrigin) return { "Access-Control-Allow-Origin": "*" };
    if (this.origins.has(normalizeOrigin(origin))) return { "Access-Control-Allow-Origin": origin, Vary: "Origin" };
    return {};
  }

  /** The answer to an OPTIONS request: a CORS preflight for an allowed origin, 403 for another, 204 with Allow otherwise. */
  preflight(req: Request): Response {
    const origin = req.headers.get("origin");
    const method = req.headers.get("access-control-request-method");
    if (origin === null || method === null) return new Response(null, { status: 204, headers: { Allow: METHODS } });
    // check() has let it through: an allowed origin, or the server's own page.
    const h: Record<string, string> = {
      "Access-Control-Allow-Origin": this.anyOrigin ? "*" : origin,
      "Access-Control-Allow-Methods": METHODS,
      "Access-Control-Max-Age": "600",
      Vary: "Origin, Access-Control-Request-Headers",
    };
    const asked = req.headers.get("access-control-request-headers");
    if (asked) h["Access-Control-Allow-Headers"] = asked;
    return new Response(null, { status: 204, headers: h });
  }
}

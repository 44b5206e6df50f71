// The web chat at "/", in a real browser: Playwright (playwright-core) drives Debian's Chromium,
// headless, against the real server on a tiny checkpoint, at a phone's viewport (390x844) and a
// desktop's (1280x900). Each feature is checked at both, and leaves screenshots for review in
// apps/mlx-bun/test/screenshots/ (git-ignored: the folder ignores itself).
//
// Replies come from the tiny model. Where a test needs a given reply (reasoning, tool calls, code
// and TeX, one version told from another), the model is made to write a fixed text: a logits
// processor allows one token per step (as tool-calls.test.ts does), so what the server parses and
// streams is real.
//
// Chromium missing is a failure, not a skip: .ci/run installs it. MLX_BUN_SKIP_BROWSER=1 skips the
// browser tests on purpose (reported as skipped; ignored when CI=true); MLX_BUN_CHROMIUM names another binary.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Engine, type GenerateRequest, PromptCache, Scheduler } from "@mlx-bun/runtime";
import { type Browser, type BrowserContext, chromium, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { type RunningServer, startServer } from "../src/server/http.ts";
import { imageSupportFor } from "../src/server/images.ts";
import { DEFAULT_WEB_DIR } from "../src/server/web.ts";
import { buildWeb, listFiles } from "../web/build.ts";
import { makeTinySmall, ROOT, tempDir } from "./helpers.ts";
import { scriptedSink } from "./scripted.ts";
import { runPython } from "../../../tools/oracle/oracle.ts";

// page.evaluate callbacks run in the page; this tsconfig has no DOM lib, so its globals are typed loosely here.
declare const document: any, window: any, navigator: any, localStorage: any, performance: any, location: any;
declare function getComputedStyle(e: unknown): any;
type HTMLInputElement = any;
declare const DataTransfer: any, File: any, ClipboardEvent: any, DragEvent: any;

const CHROMIUM = process.env.MLX_BUN_CHROMIUM || "/usr/bin/chromium";
const SKIP_BROWSER = process.env.MLX_BUN_SKIP_BROWSER === "1" && process.env.CI !== "true"; // never in CI
const SHOTS = join(import.meta.dirname, "screenshots");
const MODEL = "tiny-web/chat";
const CONVERSATIONS = "mlx-bun.chat.conversations.v1";
/** A reply that runs until stopped (thousands of tokens). */
const LONG = "and the waves came back again, ".repeat(400);

let tmp: ReturnType<typeof tempDir>;
let webDir: string;
let engine: Engine;
let scheduler: Scheduler;
let promptCache: PromptCache;
let srv: RunningServer;
/** What the next requests are made to write (FIFO), as text with the model's special tokens. */
let scripts: string[];
/** Every request the server took, in order. */
let seen: GenerateRequest[];

beforeAll(async () => {
  tmp = tempDir("mlxb-web-");
  webDir = join(tmp.path, "web");
  await buildWeb(webDir);
  engine = Engine.load(makeTinySmall(join(tmp.path, "tiny")));
  promptCache = new PromptCache({ maxEntries: 16, maxBytes: 256 * 1024 * 1024 });
  scheduler = new Scheduler(engine, { maxBatch: 4, promptCache });
  const sink = scriptedSink(engine, scheduler);
  ({ scripts, seen } = sink);
  srv = startServer({ model: engine.loaded, scheduler: sink, modelId: MODEL, port: 0, webDir, kvMode: engine.kvModeName });
});

afterAll(async () => {
  await srv?.stop();
  await scheduler?.close();
  promptCache?.dispose();
  engine?.dispose();
  tmp?.cleanup();
});

async function health(): Promise<{ model: string; kv_mode: string | null; active_requests: number; memory: { active_bytes: number } }> {
  return (await fetch(`${srv.url}/health`)).json() as never;
}

async function waitFor(what: string, cond: () => Promise<boolean> | boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await Bun.sleep(20);
  }
}

describe("serving the page", () => {
  test("/ and its assets from the API's port, with a strict CSP; nothing else is a file", async () => {
    const res = await fetch(`${srv.url}/`);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("text/html; charset=utf-8");
    const csp = res.headers.get("content-security-policy")!;
    expect(csp).toContain("script-src 'self'");
    expect(csp).toContain("connect-src 'self'");
    expect(csp).not.toContain("unsafe-inline");
    expect(res.headers.get("x-content-type-options")).toBe("nosniff");
    const html = await res.text();
    const assets = [...html.matchAll(/(?:src|href)="\.?(\/assets\/[^"]+)"/g)].map((m) => m[1]!);
    expect(assets.some((a) => a.endsWith(".js"))).toBe(true);
    expect(assets.some((a) => a.endsWith(".css"))).toBe(true);
    // No CDN: every script and stylesheet is one of ours.
    expect(html).not.toMatch(/<(script|link)[^>]+(src|href)="(https?:)?\/\//);
    // The chunks loaded on first need (highlighting, TeX) are served the same way.
    const chunks = listFiles(webDir).filter((f) => /^assets\/(highlight|tex)-.+\.js$/.test(f));
    expect(chunks).toHaveLength(2);
    for (const a of [...assets, ...chunks.map((c) => `/${c}`)]) {
      const r = await fetch(`${srv.url}${a}`);
      expect(r.status, a).toBe(200);
      expect(r.headers.get("content-type")).toMatch(a.endsWith(".js") ? /^text\/javascript/ : /^text\/css/);
      expect(r.headers.get("cache-control")).toContain("immutable");
      expect((await r.arrayBuffer()).byteLength).toBeGreaterThan(100);
    }
    const head = await fetch(`${srv.url}/`, { method: "HEAD" });
    expect(head.status).toBe(200);
    expect(await head.text()).toBe("");
    for (const p of ["/assets/nope.js", "/assets/..%2findex.html", "/%2e%2e/package.json", "/build.ts", "/src/main.ts"]) {
      const r = await fetch(`${srv.url}${p}`);
      expect(r.status, p).toBe(404);
      expect(((await r.json()) as { error: { code: string } }).error.code).toBe("not_found");
    }
    expect((await fetch(`${srv.url}/`, { method: "POST" })).status).toBe(404);
    const h = await health();
    expect(h.kv_mode).toBe("bf16");
    expect(h.active_requests).toBe(0);
  });

  test("no page: webDir null is a 404; a page not built is a 503 that says how to build it", async () => {
    const off = startServer({ model: engine.loaded, scheduler, modelId: MODEL, port: 0, webDir: null });
    const unbuilt = startServer({ model: engine.loaded, scheduler, modelId: MODEL, port: 0, webDir: join(tmp.path, "nothing-here") });
    try {
      expect(off.webChat).toBe("off");
      expect((await fetch(`${off.url}/`)).status).toBe(404);
      expect(unbuilt.webChat).toBe("not built");
      const r = await fetch(`${unbuilt.url}/`);
      expect(r.status).toBe(503);
      expect(await r.text()).toContain("tools/setup.sh");
      expect((await fetch(`${unbuilt.url}/health`)).status).toBe(200);
    } finally {
      await off.stop();
      await unbuilt.stop();
    }
  });

  test("the page `mlx-bun serve` serves (web/dist, built by tools/setup.sh) is what the sources build to", () => {
    const hint = "web/dist is missing or stale: run `bash tools/setup.sh` (or `.native/bin/bun apps/mlx-bun/web/build.ts`)";
    expect(existsSync(join(DEFAULT_WEB_DIR, "index.html")), hint).toBe(true);
    const files = listFiles(webDir);
    expect(
      listFiles(DEFAULT_WEB_DIR).filter((f) => !f.startsWith(".")),
      hint,
    ).toEqual(files);
    for (const f of files) expect(readFileSync(join(DEFAULT_WEB_DIR, f)).equals(readFileSync(join(webDir, f))), `${hint} (${f} differs)`).toBe(true);
  });
});

const VIEWPORTS = [
  { name: "390x844", width: 390, height: 844, narrow: true },
  { name: "1280x900", width: 1280, height: 900, narrow: false },
] as const;

const FLAGS = [
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

let browser: Browser;

describe.skipIf(SKIP_BROWSER)("in Chromium", () => {
  beforeAll(async () => {
    if (!existsSync(CHROMIUM)) {
      throw new Error(
        `Chromium not found at ${CHROMIUM}: install it (apt-get install -y chromium, as .ci/run does), or set MLX_BUN_SKIP_BROWSER=1 to skip the browser tests`,
      );
    }
    mkdirSync(SHOTS, { recursive: true });
    writeFileSync(join(SHOTS, ".gitignore"), "*\n");
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: FLAGS });
  });

  afterAll(async () => {
    await browser?.close();
  });

  describe.each(VIEWPORTS)("at $name", (vp) => {
    let context: BrowserContext;
    let page: Page;
    const dialogs: string[] = [];
    const foreignRequests: string[] = [];
    const pageErrors: string[] = [];
    /** Errors the page logged: a Content-Security-Policy violation would show here. */
    const consoleErrors: string[] = [];
    /** The bodies of the page's /v1/chat/completions requests. */
    const chatBodies: Record<string, any>[] = [];

    beforeAll(async () => {
      context = await browser.newContext({ viewport: { width: vp.width, height: vp.height }, acceptDownloads: true });
      await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: srv.url });
      page = await context.newPage();
      page.on("dialog", (d) => {
        dialogs.push(d.message());
        void d.dismiss();
      });
      page.on("request", (r) => {
        if (!r.url().startsWith(`${srv.url}/`) && !r.url().startsWith("data:") && !r.url().startsWith("blob:")) foreignRequests.push(r.url());
        if (r.url() === `${srv.url}/v1/chat/completions`) chatBodies.push(JSON.parse(r.postData() ?? "{}"));
      });
      page.on("pageerror", (e) => pageErrors.push(String(e)));
      page.on("console", (m) => {
        if (m.type() === "error") consoleErrors.push(m.text());
      });
    });

    afterAll(async () => {
      await context?.close();
    });

    const shot = (name: string) => page.screenshot({ path: join(SHOTS, `${vp.name}-${name}.png`) });
    const lastReply = () => page.locator(".message-assistant").last();
    const replyState = () =>
      page.evaluate(() => {
        const a = [...document.querySelectorAll(".message-assistant")].at(-1);
        return { text: a?.querySelector(".message-content")?.textContent ?? "", busy: a?.getAttribute("aria-busy") ?? null };
      });
    const ready = () => page.waitForSelector("html[data-ready=true]");
    const reload = async () => {
      await page.reload();
      await ready();
    };
    const waitReplyDone = () =>
      page.waitForFunction(() => [...document.querySelectorAll(".message-assistant")].at(-1)?.getAttribute("aria-busy") === "false", null, { timeout: 30_000 });
    /** The settings panel open (true) or closed. */
    const settingsPanel = async (open: boolean) => {
      if ((await page.getAttribute("#toggle-settings", "aria-expanded")) !== String(open)) await page.click(open ? "#toggle-settings" : "#close-settings");
      await page.locator("#settings-panel").waitFor({ state: open ? "visible" : "hidden" });
    };
    const sidebar = async (open: boolean) => {
      if ((await page.getAttribute("#toggle-sidebar", "aria-expanded")) !== String(open)) await page.click(open ? "#toggle-sidebar" : "#close-sidebar");
      await page.locator("#sidebar").waitFor({ state: open ? "visible" : "hidden" });
    };
    /** Type values into settings fields (element id → text), then close the panel. */
    const setFields = async (values: Record<string, string>) => {
      await settingsPanel(true);
      for (const [id, v] of Object.entries(values)) await page.fill(`#${id}`, v);
      await settingsPanel(false);
    };
    const send = async (text: string) => {
      await page.fill("#prompt", text);
      await page.keyboard.press("Enter");
      await waitReplyDone();
    };
    const inView = async (selector: string) => {
      const box = await page.locator(selector).boundingBox();
      return !!box && box.x >= 0 && box.y >= 0 && box.x + box.width <= vp.width + 0.5 && box.y + box.height <= vp.height + 0.5;
    };
    const noHorizontalScroll = () =>
      page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth && document.body.scrollWidth <= window.innerWidth);
    const openConversationNamed = async (name: RegExp) => {
      if (vp.narrow) await sidebar(true);
      await page.getByRole("button", { name }).click();
    };
    const newChat = async () => {
      if (vp.narrow) await sidebar(true);
      await page.click("#new-chat");
    };

    test("loads with the model and the KV mode; the message box and Send are in view", async () => {
      await page.goto(`${srv.url}/`);
      await ready();
      await expect.poll(() => page.textContent("#model-name")).toBe(MODEL);
      expect(await page.textContent("#kv-mode")).toBe("bf16");
      await expect.poll(() => page.textContent("#active-requests")).toBe("0");
      expect(await page.evaluate(() => document.activeElement?.id)).toBe("prompt");
      expect(await inView("#prompt")).toBe(true);
      expect(await inView("#send")).toBe(true);
      expect(await inView("#toggle-settings")).toBe(true);
      expect(await noHorizontalScroll()).toBe(true);
      // A phone starts with the conversation list closed, a desktop with it open beside the chat.
      expect(await page.isVisible("#sidebar")).toBe(!vp.narrow);
      expect(await page.getAttribute("#toggle-sidebar", "aria-expanded")).toBe(String(!vp.narrow));
      await shot("01-empty");
    });

    test("the conversation list collapses and opens (over the chat on a phone, beside it on a desktop)", async () => {
      if (vp.narrow) {
        await page.click("#toggle-sidebar");
        expect(await page.isVisible("#sidebar")).toBe(true);
        expect(await page.isVisible("#backdrop")).toBe(true);
        expect(await page.evaluate(() => document.querySelector("#chat").inert)).toBe(true); // the chat behind is out of reach
        expect(await page.evaluate(() => document.activeElement?.id)).toBe("search");
        await shot("02-sidebar-open");
        await page.keyboard.press("Escape");
        expect(await page.isVisible("#sidebar")).toBe(false);
        expect(await page.evaluate(() => document.activeElement?.id)).toBe("toggle-sidebar");
        expect(await page.evaluate(() => document.querySelector("#chat").inert)).toBe(false);
        await page.click("#toggle-sidebar");
        await page.click("#backdrop", { position: { x: vp.width - 10, y: vp.height / 2 } });
        expect(await page.isVisible("#sidebar")).toBe(false);
      } else {
        const chatWidth = async () => (await page.locator("#chat").boundingBox())!.width;
        const wide = await chatWidth();
        await page.click("#close-sidebar");
        expect(await page.isVisible("#sidebar")).toBe(false);
        expect(await page.getAttribute("#toggle-sidebar", "aria-expanded")).toBe("false");
        expect(await chatWidth()).toBeGreaterThan(wide + 200);
        await shot("02-sidebar-collapsed");
        await reload(); // remembered
        expect(await page.isVisible("#sidebar")).toBe(false);
        await page.click("#toggle-sidebar");
        expect(await page.isVisible("#sidebar")).toBe(true);
        expect(await chatWidth()).toBe(wide);
      }
    });

    test("every setting is reachable: the panel scrolls to its last control, each one in view", async () => {
      await settingsPanel(true);
      const controls = await page.locator("#settings-panel input, #settings-panel textarea, #settings-panel button").evaluateAll((els) => els.map((e) => e.id));
      expect(controls).toEqual(
        expect.arrayContaining([
          "temperature",
          "top-p",
          "top-k",
          "min-p",
          "seed",
          "max-tokens",
          "repetition-penalty",
          "presence-penalty",
          "frequency-penalty",
          "penalty-context",
          "xtc-probability",
          "xtc-threshold",
          "stop-sequences",
          "system-prompt",
          "api-key",
          "reset-settings",
        ]),
      );
      await shot("03-settings");
      for (const id of controls) {
        await page.locator(`#${id}`).scrollIntoViewIfNeeded();
        expect(await inView(`#${id}`), `#${id} in view`).toBe(true);
      }
      expect(await noHorizontalScroll()).toBe(true);
      await shot("03-settings-end");
      if (vp.narrow) {
        // Over the chat: Escape closes it and gives the focus back to its button.
        await page.focus("#temperature");
        await page.keyboard.press("Escape");
        expect(await page.isVisible("#settings-panel")).toBe(false);
        expect(await page.evaluate(() => document.activeElement?.id)).toBe("toggle-settings");
      } else {
        // Beside the chat: the message box stays usable with the panel open.
        expect(await inView("#send")).toBe(true);
        await settingsPanel(false);
      }
    });

    test("keyboard: Shift+Enter is a new line, Enter sends; the reply streams frame by frame with its stats", async () => {
      await setFields({ "max-tokens": "200", temperature: "0" });
      await page.focus("#prompt");
      await page.keyboard.type("Tell me a story");
      await page.keyboard.press("Shift+Enter");
      await page.keyboard.type("about the sea");
      expect(await page.inputValue("#prompt")).toBe("Tell me a story\nabout the sea");
      expect(await page.locator(".message").count()).toBe(0); // Shift+Enter sent nothing

      await page.keyboard.press("Enter");
      const seenLengths: number[] = [];
      const deadline = Date.now() + 30_000;
      for (;;) {
        const s = await replyState();
        if (s.busy === "true" && s.text.length > 0) seenLengths.push(s.text.length);
        if (s.busy === "false" || Date.now() > deadline) break;
        await Bun.sleep(15);
      }
      expect(new Set(seenLengths).size, `reply lengths seen while streaming: ${seenLengths.join(",")}`).toBeGreaterThanOrEqual(3);
      expect(await page.inputValue("#prompt")).toBe("");
      expect(await page.locator(".message-user .message-content").textContent()).toBe("Tell me a story\nabout the sea");
      const stats = (await lastReply().locator(".message-stats").textContent())!;
      expect(stats).toMatch(/^\d+ tokens · \d+\.\d tok\/s · TTFT \d+\.\d\d s · prompt \d+ \(\d+ cached\) · (finished|hit max tokens)$/);
      const tokens = Number(/^(\d+) tokens/.exec(stats)![1]);
      expect(tokens).toBeGreaterThan(3);
      expect(tokens).toBeLessThanOrEqual(200);
      // The page asked for usage, and sent the settings as the server names them.
      expect(chatBodies.at(-1)).toMatchObject({ stream: true, stream_options: { include_usage: true }, max_tokens: 200, temperature: 0 });
      if (vp.narrow) await sidebar(true);
      expect(await page.locator("#conversations .conversation-title").allTextContents()).toEqual(["Tell me a story about the sea"]);
      if (vp.narrow) await sidebar(false);
      expect(await inView("#send")).toBe(true);
      await shot("04-reply");
    });

    test("stats from usage (tokens, tok/s, TTFT, prompt and cached tokens) stay after a reload", async () => {
      await setFields({ "max-tokens": "12" });
      await send("And another one");
      const stats = (await lastReply().locator(".message-stats").textContent())!;
      // The second turn reuses the first from the server's prompt cache.
      const [, prompt, cached] = /prompt (\d+) \((\d+) cached\)/.exec(stats)!.map(Number);
      expect(cached).toBeGreaterThan(0);
      expect(cached).toBeLessThan(prompt!);
      expect(stats).toMatch(/^12 tokens · (\d+\.\d tok\/s · )?TTFT \d+\.\d\d s · prompt \d+ \(\d+ cached\) · hit max tokens$/);
      expect(await lastReply().locator(".message-stats abbr").getAttribute("title")).toBe("time to first token");
      const before = await page.locator(".message-stats").allTextContents();
      await reload();
      expect(await page.locator(".message-stats").allTextContents()).toEqual(before);
      expect(await inView("#send")).toBe(true); // a long conversation scrolls; the message box stays
      await shot("05-stats");
    });

    test("Escape stops a reply: the server cancels it (active requests back to 0, its memory freed)", async () => {
      await waitFor("the server to be idle", async () => (await health()).active_requests === 0);
      promptCache.clear();
      const baseline = (await health()).memory.active_bytes;
      await setFields({ "max-tokens": "3000" });
      scripts.push(LONG); // made to go on: a tiny model may end a reply early at random
      await page.fill("#prompt", "And now a very long one");
      await page.click("#send");
      await waitFor("the reply to start", async () => (await replyState()).text.length > 0);
      expect((await health()).active_requests).toBe(1);
      expect(await page.isEnabled("#stop")).toBe(true);
      expect(await page.isDisabled("#send")).toBe(true);
      await expect.poll(() => page.textContent("#active-requests"), { timeout: 5_000 }).toBe("1");
      await shot("06-streaming");
      expect((await health()).active_requests).toBe(1); // still going: Stop is what ends it
      await page.focus("#prompt");
      await page.keyboard.press("Escape");
      await waitFor("/health active_requests to return to 0", async () => (await health()).active_requests === 0, 5_000);
      expect(scheduler.active).toBe(0);
      // The scheduler dropped the row at its next step: once the prompt cache lets go of what it
      // kept, MLX holds no more than before the request.
      await waitReplyDone();
      promptCache.clear();
      await expect.poll(async () => (await health()).memory.active_bytes, { timeout: 5_000 }).toBe(baseline);
      const stats = (await lastReply().locator(".message-stats").textContent())!;
      expect(stats).toMatch(/ · stopped$/);
      expect(Number(/^(\d+) tokens/.exec(stats)![1])).toBeLessThan(3000);
      expect(await page.isDisabled("#stop")).toBe(true);
      expect(await page.isEnabled("#send")).toBe(true);
      await expect.poll(() => page.textContent("#active-requests"), { timeout: 5_000 }).toBe("0");
      expect(await page.textContent("#status")).toMatch(/stopped/);
    });

    test("an invalid setting is refused with a message: nothing is sent, the text is kept", async () => {
      const before = chatBodies.length;
      await settingsPanel(true);
      await page.fill("#max-tokens", "0");
      expect(await page.getAttribute("#max-tokens", "aria-invalid")).toBe("true");
      expect(await page.textContent("#max-tokens-error")).toBe("Max tokens must be at least 1.");
      expect(await page.isVisible("#settings-summary")).toBe(true);
      expect(await page.getAttribute("#max-tokens", "aria-describedby")).toContain("max-tokens-error");
      if (vp.narrow) await settingsPanel(false);
      expect(await page.isVisible("#settings-badge")).toBe(true);
      await page.fill("#prompt", "Should not be sent");
      await page.keyboard.press("Enter");
      await page.waitForSelector("#error:not([hidden])");
      expect(await page.textContent("#error")).toBe("Not sent: Max tokens must be at least 1. Fix it in Settings, or clear it to use the server's default.");
      expect(await page.inputValue("#prompt")).toBe("Should not be sent");
      // The settings open at the field to fix.
      expect(await page.isVisible("#settings-panel")).toBe(true);
      expect(await page.evaluate(() => document.activeElement?.id)).toBe("max-tokens");
      await shot("07-invalid-setting");
      await Bun.sleep(100);
      expect(chatBodies.length).toBe(before);
      expect(await page.locator(".message-user", { hasText: "Should not be sent" }).count()).toBe(0);
      // XTC's threshold must be at most 0.5 while XTC is on (the server's rule).
      await page.fill("#max-tokens", "8");
      await page.fill("#xtc-probability", "0.5");
      await page.fill("#xtc-threshold", "0.7");
      expect(await page.textContent("#xtc-threshold-error")).toMatch(/at most 0\.5 while XTC probability is above 0/);
      for (const [id, bad, msg] of [
        ["top-k", "2.5", "Top-k must be a whole number."],
        ["top-p", "1.5", "Top-p must be at most 1."],
        ["temperature", "warm", "Temperature must be a number."],
      ]) {
        await page.fill(`#${id}`, bad!);
        expect(await page.textContent(`#${id}-error`)).toBe(msg);
        await page.fill(`#${id}`, "");
      }
      await page.fill("#xtc-probability", "");
      await page.fill("#xtc-threshold", "");
      expect(await page.isVisible("#settings-badge")).toBe(false);
      if (vp.narrow) await settingsPanel(false);
      await page.focus("#prompt");
      await page.keyboard.press("Enter");
      await waitReplyDone();
      expect(chatBodies.length).toBe(before + 1);
      expect(chatBodies.at(-1)!.max_tokens).toBe(8);
      expect(await page.isHidden("#error")).toBe(true);
      await settingsPanel(false);
    });

    test("every sampling setting the server accepts is sent under its name, and the server takes them", async () => {
      const values: Record<string, [string, string, number]> = {
        temperature: ["temperature", "0.7", 0.7],
        "top-p": ["top_p", "0.9", 0.9],
        "top-k": ["top_k", "40", 40],
        "min-p": ["min_p", "0.05", 0.05],
        seed: ["seed", "1234", 1234],
        "max-tokens": ["max_tokens", "6", 6],
        "repetition-penalty": ["repetition_penalty", "1.1", 1.1],
        "presence-penalty": ["presence_penalty", "0.5", 0.5],
        "frequency-penalty": ["frequency_penalty", "-0.25", -0.25],
        "penalty-context": ["repetition_context_size", "32", 32],
        "xtc-probability": ["xtc_probability", "0.5", 0.5],
        "xtc-threshold": ["xtc_threshold", "0.2", 0.2],
      };
      await setFields({ ...Object.fromEntries(Object.entries(values).map(([id, [, text]]) => [id, text])), "stop-sequences": "END\nSTOP HERE" });
      await send("With every setting");
      const body = chatBodies.at(-1)!;
      for (const [, [api, , v]] of Object.entries(values)) expect(body[api], api).toBe(v);
      expect(body.stop).toEqual(["END", "STOP HERE"]);
      const req = seen.at(-1)!;
      expect(req.sampling).toMatchObject({
        temperature: 0.7,
        topP: 0.9,
        topK: 40,
        minP: 0.05,
        seed: 1234,
        repetitionPenalty: 1.1,
        presencePenalty: 0.5,
        frequencyPenalty: -0.25,
        penaltyContext: 32,
        xtcProbability: 0.5,
        xtcThreshold: 0.2,
      });
      expect(await lastReply().locator(".message-stats").textContent()).toMatch(/· (hit max tokens|finished)$/);
      expect(await page.isHidden("#error")).toBe(true);
      await settingsPanel(true);
      await shot("08-all-settings");
      // Reset: every sampling field back to the server's default.
      await page.click("#reset-settings");
      for (const id of Object.keys(values)) expect(await page.inputValue(`#${id}`)).toBe("");
      await page.fill("#temperature", "0");
      await settingsPanel(false);
    });

    test("regenerate: a new version of the reply; arrows switch between versions", async () => {
      await newChat();
      scripts.push("Answer one.");
      await send("Pick a number");
      expect(await lastReply().locator(".message-content").innerText()).toBe("Answer one.");
      scripts.push("Answer two.");
      await lastReply().getByRole("button", { name: "Regenerate reply" }).click();
      await waitReplyDone();
      expect(await lastReply().locator(".message-content").innerText()).toBe("Answer two.");
      expect(await lastReply().locator(".version-count").textContent()).toBe("2 / 2");
      expect(await page.locator(".message").count()).toBe(2); // the new version replaces the old one in view
      // The request held the history up to the question, not the old answer.
      expect(chatBodies.at(-1)!.messages.map((m: { content: string }) => m.content)).toEqual(["Pick a number"]);
      await shot("09-regenerated");
      await lastReply().getByRole("button", { name: "Previous version of this reply" }).click();
      expect(await lastReply().locator(".message-content").innerText()).toBe("Answer one.");
      expect(await lastReply().locator(".version-count").textContent()).toBe("1 / 2");
      expect(await page.evaluate(() => document.activeElement?.className)).toContain("version-next"); // the focus stays on the arrows (the first one is now disabled)
      await lastReply().getByRole("button", { name: "Next version of this reply" }).click();
      expect(await lastReply().locator(".message-content").innerText()).toBe("Answer two.");
    });

    test("edit a message: a new branch with its own reply, the old branch kept; both survive a reload", async () => {
      scripts.push("Reply to the follow-up.");
      await send("A follow-up");
      const userMsgs = () => page.locator(".message-user .message-content").allTextContents();
      expect(await userMsgs()).toEqual(["Pick a number", "A follow-up"]);
      // Edit the first question: the branch starts there.
      await page.locator(".message-user").first().getByRole("button", { name: "Edit message" }).click();
      const editor = page.getByRole("textbox", { name: "Edit message" });
      expect(await editor.inputValue()).toBe("Pick a number");
      expect(await page.evaluate(() => document.activeElement?.className)).toBe("edit-text");
      // Escape cancels an edit (and stops nothing).
      await page.keyboard.press("Escape");
      expect(await page.locator(".edit-form").count()).toBe(0);
      await page.locator(".message-user").first().getByRole("button", { name: "Edit message" }).click();
      await editor.fill("Pick a letter");
      await shot("10-editing");
      scripts.push("The letter Q.");
      await page.getByRole("button", { name: "Save and send" }).click();
      await waitReplyDone();
      expect(await userMsgs()).toEqual(["Pick a letter"]);
      expect(await page.locator(".message-assistant .message-content").allInnerTexts()).toEqual(["The letter Q."]);
      expect(await page.locator(".message-user .version-count").textContent()).toBe("2 / 2");
      expect(chatBodies.at(-1)!.messages.map((m: { content: string }) => m.content)).toEqual(["Pick a letter"]);
      await shot("10-edited-branch");
      await page.getByRole("button", { name: "Previous version of this message" }).click();
      expect(await userMsgs()).toEqual(["Pick a number", "A follow-up"]);
      expect(await page.locator(".message-assistant .message-content").allInnerTexts()).toEqual(["Answer two.", "Reply to the follow-up."]);
      await reload();
      expect(await userMsgs()).toEqual(["Pick a number", "A follow-up"]);
      await page.getByRole("button", { name: "Next version of this message" }).click();
      expect(await userMsgs()).toEqual(["Pick a letter"]);
      expect(await page.locator(".message-assistant .message-content").allInnerTexts()).toEqual(["The letter Q."]);
    });

    test("copy a whole message: the reply's Markdown source, the question's text", async () => {
      const md = "# Title\n\nSome **bold** text and `code`.\n\n- one\n- two";
      scripts.push(md);
      await send("Give me markdown");
      await lastReply().getByRole("button", { name: "Copy reply" }).click();
      expect(await page.evaluate(() => navigator.clipboard.readText())).toBe(md);
      expect(await lastReply().getByRole("button", { name: "Copy reply" }).textContent()).toBe("Copied");
      expect(await page.textContent("#status")).toBe("Copied to the clipboard");
      await page.locator(".message-user").last().getByRole("button", { name: "Copy message" }).click();
      expect(await page.evaluate(() => navigator.clipboard.readText())).toBe("Give me markdown");
      await shot("11-copied");
    });

    test("code is highlighted and TeX typeset (KaTeX, MathML), both sanitized: markup in them stays text", async () => {
      const reply = [
        "Code:",
        "",
        "```python",
        "def square(x):",
        "    # the square",
        '    return x ** 2  # "<script>alert(1)</script>"',
        "```",
        "",
        "Inline $e^{i\\pi} + 1 = 0$, a price of $5 and $10, and a display:",
        "",
        "$$",
        "\\int_0^1 x^2\\,dx = \\frac{1}{3}",
        "$$",
        "",
        "Tricks: $\\href{javascript:alert(2)}{click}$ $\\url{javascript:alert(3)}$ $\\text{<img src=x onerror=alert(4)>}$ \\(\\htmlClass{x}{y}\\) $\\fcolorbox{red}{blue}{boxed}$ $\\frac{1}{$",
      ].join("\n");
      scripts.push(reply);
      await send("Code and math please");
      const content = lastReply().locator(".message-content");
      // The renderers load on first need, then the reply is drawn again with them.
      await content.locator(".hljs-keyword").first().waitFor();
      await content.locator("math").first().waitFor();
      const dom = await page.evaluate(() => {
        const c = [...document.querySelectorAll(".message-assistant .message-content")].at(-1);
        return {
          keywords: [...c.querySelectorAll(".hljs-keyword")].map((e: any) => e.textContent),
          comments: c.querySelectorAll(".hljs-comment").length,
          code: c.querySelector("pre code").textContent,
          lang: c.querySelector(".code-lang")?.textContent,
          maths: c.querySelectorAll("math").length,
          displays: c.querySelectorAll('math[display="block"]').length,
          mathText: [...c.querySelectorAll("math")].map((m: any) => m.textContent).join(" | "),
          text: c.textContent.replace(/\u00a0/g, " "),
          scripts: document.querySelectorAll("#messages script").length,
          imgs: c.querySelectorAll("img").length,
          links: [...c.querySelectorAll("a")].map((a: any) => a.getAttribute("href")),
          styled: c.querySelectorAll("[style]").length,
          handlers: [...c.querySelectorAll("*")].filter((e: any) => [...e.attributes].some((a: any) => a.name.startsWith("on"))).length,
          annotations: c.querySelectorAll("annotation, semantics").length,
          errors: [...c.querySelectorAll(".math-error")].map((e: any) => [e.textContent, e.title]),
          pwned: window.__pwned ?? null,
        };
      });
      expect(dom.keywords).toEqual(expect.arrayContaining(["def", "return"]));
      expect(dom.comments).toBe(2);
      expect(dom.code).toBe('def square(x):\n    # the square\n    return x ** 2  # "<script>alert(1)</script>"\n');
      expect(dom.lang).toBe("python");
      expect(dom.maths).toBeGreaterThanOrEqual(4);
      expect(dom.displays).toBe(1);
      expect(dom.mathText).toContain("∫");
      expect(dom.mathText).not.toContain("\\frac"); // the TeX source (KaTeX's annotation) is dropped
      expect(dom.text).toContain("a price of $5 and $10, and a display");
      expect(dom.text).toContain("<img src=x onerror=alert(4)>"); // \text{…} is text
      expect(dom.scripts).toBe(0);
      expect(dom.imgs).toBe(0);
      expect(dom.links).toEqual([]); // \href and \url need trust, which is off
      expect(dom.styled).toBe(0);
      expect(dom.handlers).toBe(0);
      expect(dom.annotations).toBe(0);
      expect(dom.errors).toEqual([["\\frac{1}{", expect.stringMatching(/^KaTeX parse error: /)]]); // shown as its source
      expect(dom.pwned).toBeNull();
      // The code block's own Copy button copies the code alone.
      await content.getByRole("button", { name: "Copy code (python)" }).click();
      expect(await page.evaluate(() => navigator.clipboard.readText())).toBe(
        'def square(x):\n    # the square\n    return x ** 2  # "<script>alert(1)</script>"\n',
      );
      await content.locator(".code-block").scrollIntoViewIfNeeded();
      await shot("12-code-and-math");
    });

    test("model output is rendered as text, never as HTML: no script runs, none is in the DOM", async () => {
      const reply = [
        "Here is a script: <script>window.__pwned = 1; alert(1)</script>",
        "",
        'And an image: <img src=x onerror="window.__pwned = 2; alert(2)"> and a [link](javascript:alert(3)).',
        "",
        "```html",
        "<script>alert(4)</script>",
        "```",
        "",
        "**bold** and `code`",
      ].join("\n");
      // Stored the way conversations were kept before branches (a flat list): still read.
      await page.evaluate(
        ({ key, reply }) => {
          const list = JSON.parse(localStorage.getItem(key) ?? "[]");
          list.push({
            id: "xss",
            title: "Markup check",
            created: Date.now(),
            updated: Date.now(),
            messages: [
              { role: "user", content: "<b>not bold</b> <img src=x onerror=alert(5)>" },
              {
                role: "assistant",
                content: reply,
                reasoning: "<img src=x onerror=alert(6)> **thinking**",
                toolCalls: [{ id: "<b>", type: "function", name: "<img src=x onerror=alert(7)>", arguments: "<script>alert(8)</script>" }],
                stats: { ttftMs: 12, tokens: 40, tps: 99.5, finish: "stop" },
              },
            ],
          });
          localStorage.setItem(key, JSON.stringify(list));
        },
        { key: CONVERSATIONS, reply },
      );
      await reload();
      await openConversationNamed(/^Markup check/);
      await page.locator(".message-assistant .hljs-tag").first().waitFor();
      const dom = await page.evaluate(() => {
        const m = document.querySelector("#messages")!;
        const content = [...m.querySelectorAll(".message-assistant .message-content")].at(-1)!;
        return {
          scripts: m.querySelectorAll("script").length,
          pageScripts: [...document.querySelectorAll("script")].map((s: any) => s.getAttribute("src")),
          imgs: m.querySelectorAll("img").length,
          handlers: [...m.querySelectorAll("*")].filter((e: any) => [...e.attributes].some((a: any) => a.name.startsWith("on"))).length,
          jsLinks: m.querySelectorAll('a[href^="javascript" i]').length,
          text: content.textContent,
          code: content.querySelector("pre code")?.textContent,
          bold: content.querySelector("strong")?.textContent,
          user: m.querySelector(".message-user .message-content")?.textContent,
          userBold: m.querySelectorAll(".message-user b").length,
          reasoning: m.querySelector(".message-assistant .reasoning-content")?.textContent,
          tool: m.querySelector(".tool-name")?.textContent,
          toolArgs: m.querySelector(".tool-arguments")?.textContent,
          pwned: window.__pwned ?? null,
        };
      });
      expect(dom.scripts).toBe(0);
      expect(dom.pageScripts).toHaveLength(1); // the page's own bundle only
      expect(dom.pageScripts[0]).toMatch(/^\.?\/assets\/.+\.js$/);
      expect(dom.imgs).toBe(0);
      expect(dom.handlers).toBe(0);
      expect(dom.jsLinks).toBe(0);
      expect(dom.text).toContain("<script>window.__pwned = 1; alert(1)</script>");
      expect(dom.text).toContain('<img src=x onerror="window.__pwned = 2; alert(2)">');
      expect(dom.code).toBe("<script>alert(4)</script>\n");
      expect(dom.bold).toBe("bold");
      expect(dom.user).toBe("<b>not bold</b> <img src=x onerror=alert(5)>");
      expect(dom.userBold).toBe(0);
      expect(dom.reasoning).toContain("<img src=x onerror=alert(6)> thinking");
      expect(dom.tool).toBe("<img src=x onerror=alert(7)>");
      expect(dom.toolArgs).toBe("<script>alert(8)</script>");
      expect(dom.pwned).toBeNull();
      expect(await page.locator(".message-assistant .message-stats").textContent()).toBe("40 tokens · 99.5 tok/s · TTFT 0.01 s · finished");
      await Bun.sleep(100);
      expect(dialogs).toEqual([]);
      await shot("13-markup-as-text");
    });

    test("the model's reasoning: a block open while it thinks, collapsed once it answers; kept after a reload", async () => {
      await newChat();
      scripts.push(`<|channel>thought\n${"Let me think step by step. ".repeat(3)}Two and two make four.<channel|>The answer is **4**.`);
      await page.fill("#prompt", "What is 2 + 2?");
      await page.keyboard.press("Enter");
      // While the reasoning streams (and before any answer), its block is open: seen in the same
      // frame as the reply's state (unless the whole reply was done before the first look).
      const whileStreaming = await (
        await page.waitForFunction(() => {
          const a = [...document.querySelectorAll(".message-assistant")].at(-1);
          const d = a?.querySelector(".reasoning");
          if (a?.getAttribute("aria-busy") === "false") return { busy: "false" };
          if (d && !d.hidden)
            return {
              busy: a.getAttribute("aria-busy"),
              open: d.open,
              summary: a.querySelector(".reasoning-summary").textContent,
              answer: a.querySelector(".message-content").textContent,
            };
          return null;
        })
      ).jsonValue();
      if (whileStreaming?.busy === "true") expect(whileStreaming).toEqual({ busy: "true", open: true, summary: "Thinking…", answer: "" });
      await waitReplyDone();
      const r = lastReply();
      expect(await r.locator(".message-content").innerText()).toBe("The answer is 4.");
      expect(await r.locator(".message-content strong").textContent()).toBe("4");
      expect(await r.locator(".reasoning").evaluate((d: any) => d.open)).toBe(false);
      expect(await r.locator(".reasoning-summary").textContent()).toMatch(/^Reasoning · \d+\.\d s$/);
      expect(await r.locator(".reasoning-content").isVisible()).toBe(false);
      await shot("14-reasoning-collapsed");
      await r.locator(".reasoning-summary").click();
      expect(await r.locator(".reasoning-content").isVisible()).toBe(true);
      expect(await r.locator(".reasoning-content").textContent()).toContain("Two and two make four.");
      await shot("14-reasoning-open");
      // The reasoning is not sent back with the next turn.
      await reload();
      expect(await lastReply().locator(".reasoning-content").textContent()).toContain("Two and two make four.");
      scripts.push("Yes.");
      await send("Sure?");
      expect(chatBodies.at(-1)!.messages).toEqual([
        { role: "user", content: "What is 2 + 2?" },
        { role: "assistant", content: "The answer is **4**." },
        { role: "user", content: "Sure?" },
      ]);
    });

    test("tool calls are shown as the server returns them: name, id, arguments", async () => {
      await newChat();
      const Q = '<|"|>';
      scripts.push(`<|channel>thought\nI need the weather.<channel|>Let me check.<|tool_call>call:get_weather{city:${Q}Paris${Q},days:3}<tool_call|>`);
      await send("Weather in Paris?");
      const r = lastReply();
      expect(await r.locator(".message-content").innerText()).toBe("Let me check.");
      const call = r.locator(".tool-call");
      expect(await call.count()).toBe(1);
      expect(await call.getAttribute("aria-label")).toBe("Tool call: get_weather");
      expect(await call.locator(".tool-name").textContent()).toBe("get_weather");
      expect(await call.locator(".tool-id").textContent()).toMatch(/^call_[0-9a-f]{32}$/);
      expect(JSON.parse((await call.locator(".tool-arguments").textContent())!)).toEqual({ city: "Paris", days: 3 });
      expect(await call.locator(".tool-arguments").textContent()).toBe('{\n  "city": "Paris",\n  "days": 3\n}');
      expect(await r.locator(".message-stats").textContent()).toMatch(/ · called a tool$/);
      await shot("15-tool-call");
      await reload();
      expect(await lastReply().locator(".tool-name").textContent()).toBe("get_weather");
    });

    test("conversations: rename, search, export and import as JSON", async () => {
      if (vp.narrow) await sidebar(true);
      const titles = () => page.locator("#conversations .conversation-title").allTextContents();
      expect(await titles()).toEqual(["Weather in Paris?", "What is 2 + 2?", "Markup check", "Pick a number", "Tell me a story about the sea"]);
      // Rename
      await page.getByRole("button", { name: "Rename conversation: Pick a number" }).click();
      const input = page.getByRole("textbox", { name: "New title for “Pick a number”" });
      expect(await page.evaluate(() => document.activeElement?.id)).toBe("rename-input");
      await shot("16-renaming");
      await input.fill("Numbers and letters");
      await page.keyboard.press("Enter");
      expect(await titles()).toContain("Numbers and letters");
      expect(await page.textContent("#status")).toBe("Renamed to “Numbers and letters”");
      // Escape cancels a rename.
      await page.getByRole("button", { name: "Rename conversation: Markup check" }).click();
      await page.keyboard.type("nope");
      await page.keyboard.press("Escape");
      expect(await titles()).toContain("Markup check");
      // Search: titles and the text of every message.
      await page.fill("#search", "sea");
      expect(await titles()).toEqual(["Tell me a story about the sea"]);
      await page.fill("#search", "letter q.");
      expect(await titles()).toEqual(["Numbers and letters"]); // found in a reply of another branch
      await page.fill("#search", "xyzzy-nowhere");
      expect(await titles()).toEqual([]);
      expect(await page.textContent("#no-matches")).toBe("No conversation matches “xyzzy-nowhere”.");
      await shot("16-search");
      await page.fill("#search", "");
      expect(await titles()).toHaveLength(5);

      // Export: a JSON file of every conversation, branches included.
      const [download] = await Promise.all([page.waitForEvent("download"), page.click("#export")]);
      expect(download.suggestedFilename()).toMatch(/^mlx-bun-chats-\d{4}-\d{2}-\d{2}\.json$/);
      const file = join(tmp.path, `export-${vp.name}.json`);
      await download.saveAs(file);
      const exported = JSON.parse(readFileSync(file, "utf8"));
      expect(exported.format).toBe("mlx-bun.chat");
      expect(exported.conversations.map((c: { title: string }) => c.title)).toEqual(await titles());
      const numbers = exported.conversations.find((c: { title: string }) => c.title === "Numbers and letters");
      expect(numbers.messages.length).toBe(11); // both branches

      // Import: into an empty browser, everything comes back; again, nothing is doubled.
      await page.evaluate((key) => localStorage.removeItem(key), CONVERSATIONS);
      await reload();
      if (vp.narrow) await sidebar(true);
      expect(await titles()).toEqual([]);
      await page.setInputFiles("#import-file", file);
      await expect.poll(() => page.textContent("#status")).toBe("Imported 5 conversations");
      expect(await titles()).toEqual(exported.conversations.map((c: { title: string }) => c.title));
      await page.setInputFiles("#import-file", file);
      await expect.poll(() => page.textContent("#status")).toBe("Imported 0 conversations (5 already here)");
      expect(await titles()).toHaveLength(5);
      // A file that is not an export is refused with a message.
      await page.setInputFiles("#import-file", { name: "bad.json", mimeType: "application/json", buffer: Buffer.from('{"hello": 1}') });
      await page.waitForSelector("#error:not([hidden])");
      expect(await page.textContent("#error")).toBe("Import failed: the file holds no conversations (expected an mlx-bun chat export).");
      await shot("16-imported");
      await openConversationNamed(/^Numbers and letters/);
      expect(await page.textContent("#chat-title")).toBe("Numbers and letters");
      expect(await page.locator(".message-user .version-count").textContent()).toBe("2 / 2");
    });

    test("a new conversation during a reply keeps the reply running in its own conversation", async () => {
      await waitFor("the server to be idle", async () => (await health()).active_requests === 0);
      await setFields({ "max-tokens": "3000" });
      await openConversationNamed(/^Tell me a story about the sea/);
      scripts.push(LONG);
      await page.fill("#prompt", "One more, very long");
      await page.keyboard.press("Enter");
      await waitFor("the reply to start", async () => (await replyState()).text.length > 0);
      await newChat();
      expect(await page.locator(".message").count()).toBe(0);
      expect(await page.textContent("#chat-title")).toBe("New conversation");
      expect(dialogs).toEqual([]); // not asked: kept
      expect((await health()).active_requests).toBe(1);
      expect(await page.textContent("#status")).toBe("New conversation. The reply in “Tell me a story about the sea” keeps going.");
      // Send and Stop belong to the conversation shown: this one is idle.
      expect(await page.isEnabled("#send")).toBe(true);
      expect(await page.isDisabled("#stop")).toBe(true);
      if (vp.narrow) await sidebar(true);
      expect(await page.locator(".conversation", { hasText: "Tell me a story about the sea" }).locator(".conversation-busy").textContent()).toBe("replying…");
      await shot("17-reply-kept-running");
      await page.getByRole("button", { name: /^Tell me a story about the sea/ }).click();
      expect(await replyState()).toMatchObject({ busy: "true" });
      const length = (await replyState()).text.length;
      await waitFor("the reply to grow", async () => (await replyState()).text.length > length);
      await page.click("#stop");
      await waitReplyDone();
      expect(await lastReply().locator(".message-stats").textContent()).toMatch(/ · stopped$/);
      await waitFor("the server to be idle", async () => (await health()).active_requests === 0);
      await setFields({ "max-tokens": "8" });
    });

    test("keyboard and screen-reader basics: labels, names, live region, focus order, visible focus", async () => {
      const a11y = await page.evaluate(() => {
        const controls = [...document.querySelectorAll("input, textarea, select")] as HTMLInputElement[];
        const log = document.querySelector("#messages")!;
        const name = (b: any) => (b.getAttribute("aria-label") ?? b.textContent).trim();
        return {
          unlabeled: controls.filter((c) => !c.labels?.length).map((c) => c.id),
          unnamedButtons: [...document.querySelectorAll("button")].filter((b: any) => !name(b)).map((b: any) => b.outerHTML),
          clickableNonButtons: [...document.querySelectorAll("[onclick], [role=button], div[tabindex='0'], span[tabindex='0']")].length,
          live: [log.getAttribute("role"), log.getAttribute("aria-live")],
          status: document.querySelector("#status")?.getAttribute("role"),
          toggles: [...document.querySelectorAll("#toggle-sidebar, #toggle-settings")].map((b: any) => [
            b.getAttribute("aria-controls"),
            b.hasAttribute("aria-expanded"),
          ]),
          deleteNames: [...document.querySelectorAll(".conversation-delete")].map((b) => b.getAttribute("aria-label")),
        };
      });
      expect(a11y.unlabeled).toEqual([]);
      expect(a11y.unnamedButtons).toEqual([]);
      expect(a11y.clickableNonButtons).toBe(0);
      expect(a11y.live).toEqual(["log", "polite"]);
      expect(a11y.status).toBe("status");
      expect(a11y.toggles).toEqual([
        ["sidebar", true],
        ["settings-panel", true],
      ]);
      expect(a11y.deleteNames[0]).toMatch(/^Delete conversation: /);
      // The settings button names itself "Settings" at every width (only an icon on a phone).
      expect(await page.getByRole("button", { name: /^Settings/ }).count()).toBe(1);

      // The skip link, first in the page, jumps to the message box.
      if (vp.narrow) await sidebar(false);
      await page.focus(".skip-link");
      await page.keyboard.press("Enter");
      expect(await page.evaluate(() => document.activeElement?.id)).toBe("prompt");
      // Tab through the page from the top: the order follows the layout.
      if (!vp.narrow) await settingsPanel(true);
      await page.focus(".skip-link");
      const order: string[] = ["skip-link"];
      for (let i = 0; i < 80; i++) {
        await page.keyboard.press("Tab");
        order.push(await page.evaluate(() => document.activeElement?.id || document.activeElement?.className || ""));
      }
      const at = (name: string) => order.indexOf(name);
      const pairs: [string, string][] = vp.narrow
        ? [
            ["toggle-sidebar", "toggle-settings"],
            ["toggle-settings", "prompt"],
            ["prompt", "send"],
          ]
        : [
            ["new-chat", "search"],
            ["search", "conversation-open"],
            ["conversation-open", "export"],
            ["export", "toggle-sidebar"],
            ["toggle-sidebar", "toggle-settings"],
            ["toggle-settings", "prompt"],
            ["prompt", "send"],
            ["send", "temperature"],
            ["temperature", "top-p"],
            ["top-p", "max-tokens"],
          ];
      for (const [a, b] of pairs) {
        expect(at(a), `${a} in ${order.join(" > ")}`).toBeGreaterThanOrEqual(0);
        expect(at(a), `${a} before ${b} in ${order.join(" > ")}`).toBeLessThan(at(b));
      }
      if (!vp.narrow) await settingsPanel(false);
      await page.focus("#send");
      await page.keyboard.press("Shift+Tab");
      await page.keyboard.press("Tab");
      const outline = await page.evaluate(() => {
        const s = getComputedStyle(document.activeElement!);
        return { id: document.activeElement!.id, style: s.outlineStyle, width: parseFloat(s.outlineWidth) };
      });
      expect(outline.id).toBe("send");
      expect(outline.style).not.toBe("none");
      expect(outline.width).toBeGreaterThanOrEqual(2);
    });

    test("a server started with --api-key: the page says so, takes the key, then replies", async () => {
      const keyed = startServer({ model: engine.loaded, scheduler, modelId: MODEL, port: 0, webDir, kvMode: engine.kvModeName, apiKey: "sk-web-test" });
      const p = await context.newPage();
      try {
        await p.goto(`${keyed.url}/`); // the page itself needs no key
        await p.waitForSelector("html[data-ready=true]");
        await p.click("#toggle-settings");
        await p.fill("#max-tokens", "8");
        if (vp.narrow) await p.click("#close-settings");
        await p.fill("#prompt", "hello");
        await p.keyboard.press("Enter");
        await p.waitForSelector("#error:not([hidden])");
        expect(await p.textContent("#error")).toMatch(/^HTTP 401: Missing API key.*enter the server's API key in Settings/);
        expect(await p.evaluate(() => document.activeElement?.id)).toBe("api-key");
        await p.fill("#api-key", "sk-web-test");
        if (vp.narrow) await p.click("#close-settings");
        await p.fill("#prompt", "hello again");
        await p.click("#send");
        await p.waitForFunction(() => [...document.querySelectorAll(".message-assistant")].at(-1)?.getAttribute("aria-busy") === "false");
        expect(await p.locator(".message-assistant .message-stats").last().textContent()).toMatch(/^8 tokens · .* · hit max tokens$/);
        expect(await p.isHidden("#error")).toBe(true);
      } finally {
        await p.close();
        await keyed.stop();
      }
    });

    test("the page fetched nothing from another host, threw no error, broke no CSP rule", () => {
      expect(foreignRequests).toEqual([]);
      expect(pageErrors).toEqual([]);
      expect(consoleErrors).toEqual([]);
    });
  });

  // Images (image_url parts) on a tiny vision checkpoint (tools/make-tiny-model/make_tiny_vision_model.py,
  // as images-serve.test.ts): attached through the file input, a paste and a drop, sent before the text.
  describe("images", () => {
    let vEngine: Engine;
    let vScheduler: Scheduler;
    let vSrv: RunningServer;
    let context: BrowserContext;
    let page: Page;
    let pngA: Buffer;
    let pngB: Buffer;
    const chatBodies: Record<string, any>[] = [];
    const problems: string[] = [];

    beforeAll(async () => {
      const dir = join(tmp.path, "vision");
      mkdirSync(dir, { recursive: true });
      runPython([join(ROOT, "tools", "make-tiny-model", "make_tiny_vision_model.py"), "--suite", dir]);
      const py = `import sys, numpy as np; from PIL import Image
Image.fromarray(np.random.default_rng(1).integers(0, 256, (100, 130, 3), dtype=np.uint8)).save(sys.argv[1])
Image.fromarray(np.random.default_rng(2).integers(0, 256, (60, 40, 3), dtype=np.uint8)).save(sys.argv[2])`;
      runPython(["-c", py, join(dir, "a.png"), join(dir, "b.png")]);
      pngA = readFileSync(join(dir, "a.png"));
      pngB = readFileSync(join(dir, "b.png"));
      vEngine = Engine.load(join(dir, "vision-e"));
      vScheduler = new Scheduler(vEngine, { maxBatch: 2 });
      vSrv = startServer({ model: vEngine.loaded, scheduler: vScheduler, modelId: "tiny-vision", port: 0, webDir, images: imageSupportFor(vEngine.loaded) });
      context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
      page = await context.newPage();
      page.on("request", (r) => {
        if (r.url().endsWith("/v1/chat/completions")) chatBodies.push(JSON.parse(r.postData() ?? "{}"));
      });
      page.on("pageerror", (e) => problems.push(String(e)));
      page.on("console", (m) => {
        if (m.type() === "error") problems.push(m.text());
      });
    });

    afterAll(async () => {
      await context?.close();
      await vSrv?.stop();
      await vScheduler?.close();
      vEngine?.dispose();
    });

    /** Paste (or drop, on the message box) files made in the page from these bytes. */
    const putFiles = (how: "paste" | "drop", files: { name: string; type: string; b64: string }[]) =>
      page.evaluate(
        ({ how, files }) => {
          const dt = new DataTransfer();
          for (const f of files) dt.items.add(new File([Uint8Array.from(atob(f.b64), (c) => c.charCodeAt(0))], f.name, { type: f.type }));
          if (how === "paste")
            document.querySelector("#prompt").dispatchEvent(new ClipboardEvent("paste", { clipboardData: dt, bubbles: true, cancelable: true }));
          else {
            const box = document.querySelector("#composer-box");
            box.dispatchEvent(new DragEvent("dragover", { dataTransfer: dt, bubbles: true, cancelable: true }));
            box.dispatchEvent(new DragEvent("drop", { dataTransfer: dt, bubbles: true, cancelable: true }));
          }
        },
        { how, files },
      );
    const thumbs = () => page.$$eval(".attachment-thumb", (els: any[]) => els.map((e) => ({ alt: e.alt, loaded: e.complete && e.naturalWidth > 0 })));
    const promptTokens = async () => Number(/prompt (\d+)/.exec((await page.locator(".message-assistant .message-stats").last().textContent()) ?? "")?.[1]);
    const sendAndWait = async () => {
      await page.click("#send");
      await page.waitForFunction(() => [...document.querySelectorAll(".message-assistant")].at(-1)?.getAttribute("aria-busy") === "false", null, {
        timeout: 60_000,
      });
    };

    test("/health says whether the model takes images; a text-only model's page has no attach button and refuses a pasted image", async () => {
      expect(((await (await fetch(`${vSrv.url}/health`)).json()) as { vision: boolean }).vision).toBe(true);
      expect(((await (await fetch(`${srv.url}/health`)).json()) as { vision: boolean }).vision).toBe(false);
      const p = await context.newPage();
      try {
        await p.goto(`${srv.url}/`);
        await p.waitForSelector("html[data-ready=true]");
        await expect.poll(() => p.textContent("#model-name")).toBe(MODEL);
        expect(await p.isHidden("#attach")).toBe(true);
        expect(await p.isHidden("#image-hint")).toBe(true);
        await p.evaluate((b64: string) => {
          const dt = new DataTransfer();
          dt.items.add(new File([Uint8Array.from(atob(b64), (c) => c.charCodeAt(0))], "a.png", { type: "image/png" }));
          document.querySelector("#prompt").dispatchEvent(new ClipboardEvent("paste", { clipboardData: dt, bubbles: true, cancelable: true }));
        }, pngA.toString("base64"));
        expect(await p.textContent("#error")).toBe(`Not attached: the model “${MODEL}” takes no images.`);
        expect(await p.isHidden("#attachments")).toBe(true);
      } finally {
        await p.close();
      }
    });

    test("attach (file input), paste and drop: thumbnails with Remove; sent as image_url parts before the text; shown in the message and after a reload", async () => {
      await page.goto(`${vSrv.url}/`);
      await page.waitForSelector("html[data-ready=true]");
      await page.locator("#attach").waitFor({ state: "visible" });
      expect(await page.getAttribute("#attach", "aria-label")).toBe("Attach images");
      expect(await page.isVisible("#image-hint")).toBe(true);
      if ((await page.getAttribute("#toggle-settings", "aria-expanded")) !== "true") await page.click("#toggle-settings");
      await page.fill("#max-tokens", "2");
      await page.click("#close-settings");

      // The same text without an image, for its prompt size.
      await page.fill("#prompt", "What is in this picture?");
      await sendAndWait();
      const textOnly = await promptTokens();
      expect(textOnly).toBeGreaterThan(0);
      await page.click("#new-chat");

      // Refused: not an image, too large.
      await page.setInputFiles("#attach-file", { name: "notes.txt", mimeType: "text/plain", buffer: Buffer.from("hello") });
      await expect.poll(() => page.textContent("#error")).toBe("Not attached: “notes.txt” is not an image (text/plain).");
      await page.setInputFiles("#attach-file", { name: "huge.png", mimeType: "image/png", buffer: Buffer.alloc(11 * 1024 * 1024) });
      await expect.poll(() => page.textContent("#error")).toBe("Not attached: “huge.png” is 11.0 MB, more than the limit of 10.0 MB.");
      expect(await page.isHidden("#attachments")).toBe(true);

      // The file picker's input, then a paste and a drop.
      await page.setInputFiles("#attach-file", { name: "a.png", mimeType: "image/png", buffer: pngA });
      await expect.poll(thumbs).toEqual([{ alt: "a.png", loaded: true }]);
      expect(await page.isHidden("#error")).toBe(true);
      await putFiles("paste", [{ name: "b.png", type: "image/png", b64: pngB.toString("base64") }]);
      await expect.poll(thumbs).toEqual([
        { alt: "a.png", loaded: true },
        { alt: "b.png", loaded: true },
      ]);
      await putFiles("drop", [{ name: "c.png", type: "image/png", b64: pngB.toString("base64") }]);
      await expect.poll(() => thumbs().then((t) => t.map((x) => x.alt))).toEqual(["a.png", "b.png", "c.png"]);
      await page.screenshot({ path: join(SHOTS, "images-pending.png") });
      // Remove (by its name, from the keyboard): the focus moves to the next Remove button.
      await page.getByRole("button", { name: "Remove image: c.png" }).focus();
      await page.keyboard.press("Enter");
      await expect.poll(() => thumbs().then((t) => t.map((x) => x.alt))).toEqual(["a.png", "b.png"]);
      expect(await page.evaluate(() => document.activeElement?.getAttribute("aria-label"))).toBe("Remove image: b.png");

      await page.fill("#prompt", "What is in this picture?");
      await sendAndWait();
      expect(await page.isHidden("#error")).toBe(true);
      expect(await page.isHidden("#attachments")).toBe(true);
      const body = chatBodies.at(-1)!;
      const content = body.messages.at(-1).content;
      expect(content.map((p: { type: string }) => p.type)).toEqual(["image_url", "image_url", "text"]);
      expect(content[0].image_url.url).toBe(`data:image/png;base64,${pngA.toString("base64")}`);
      expect(content[1].image_url.url).toBe(`data:image/png;base64,${pngB.toString("base64")}`);
      expect(content[2]).toEqual({ type: "text", text: "What is in this picture?" });
      // The server took the images: their soft tokens are in the prompt.
      expect(await promptTokens()).toBeGreaterThan(textOnly + 2);
      const shown = () =>
        page.$$eval(".message-user .message-image", (els: any[]) => els.map((e) => ({ alt: e.alt, loaded: e.complete && e.naturalWidth > 0 })));
      expect(await shown()).toEqual([
        { alt: "a.png", loaded: true },
        { alt: "b.png", loaded: true },
      ]);
      expect(await page.textContent("#chat-title")).toBe("What is in this picture?");
      await page.screenshot({ path: join(SHOTS, "images-sent.png") });

      // Kept with the conversation (small images), shown and sent again after a reload.
      await page.reload();
      await page.waitForSelector("html[data-ready=true]");
      await expect.poll(shown).toEqual([
        { alt: "a.png", loaded: true },
        { alt: "b.png", loaded: true },
      ]);
      await page.locator(".action-regenerate").last().click();
      await page.waitForFunction(() => [...document.querySelectorAll(".message-assistant")].at(-1)?.getAttribute("aria-busy") === "false", null, {
        timeout: 60_000,
      });
      expect(chatBodies.at(-1)!.messages.at(-1).content.length).toBe(3);

      // An image alone is a message too.
      await page.click("#new-chat");
      await page.setInputFiles("#attach-file", { name: "a.png", mimeType: "image/png", buffer: pngA });
      await expect.poll(thumbs).toHaveLength(1);
      await page.focus("#prompt");
      await page.keyboard.press("Enter");
      await page.waitForFunction(() => [...document.querySelectorAll(".message-assistant")].at(-1)?.getAttribute("aria-busy") === "false", null, {
        timeout: 60_000,
      });
      expect(
        chatBodies
          .at(-1)!
          .messages.at(-1)
          .content.map((p: { type: string }) => p.type),
      ).toEqual(["image_url"]);
      expect(await page.textContent("#chat-title")).toBe("Image: a.png");
      expect(problems).toEqual([]);
    });
  });

  test("first paint and bundle size (recorded in test/screenshots/metrics.json)", async () => {
    const files = listFiles(webDir);
    const size = (f: string) => {
      const b = readFileSync(join(webDir, f));
      return { bytes: b.byteLength, gzip: Bun.gzipSync(b, { level: 9 }).byteLength };
    };
    const html = readFileSync(join(webDir, "index.html"), "utf8");
    const initial = files.filter((f) => f === "index.html" || html.includes(f));
    const lazy = files.filter((f) => !initial.includes(f));
    const sum = (list: string[]) => list.map(size).reduce((a, b) => ({ bytes: a.bytes + b.bytes, gzip: a.gzip + b.gzip }), { bytes: 0, gzip: 0 });
    const metrics: Record<string, unknown> = {
      files: Object.fromEntries(files.map((f) => [f, size(f)])),
      initial: sum(initial),
      lazy: sum(lazy),
    };
    // What the first visit loads stays small; highlighting and TeX come later, on first need.
    expect((metrics.initial as { gzip: number }).gzip).toBeLessThan(100_000);
    for (const vp of VIEWPORTS) {
      const runs: { fcp: number; ready: number }[] = [];
      for (let i = 0; i < 5; i++) {
        const ctx = await browser.newContext({ viewport: { width: vp.width, height: vp.height } });
        const p = await ctx.newPage();
        await p.goto(`${srv.url}/`);
        await p.waitForSelector("html[data-ready=true]");
        runs.push(
          await p.evaluate(() => {
            const fcp = performance.getEntriesByName("first-contentful-paint")[0]?.startTime ?? Number.NaN;
            const ready = performance.getEntriesByName("mlx-bun:ready")[0]?.startTime ?? Number.NaN;
            return { fcp: Math.round(fcp), ready: Math.round(ready) };
          }),
        );
        await ctx.close();
      }
      const median = (xs: number[]) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
      metrics[vp.name] = { firstContentfulPaintMs: median(runs.map((r) => r.fcp)), readyMs: median(runs.map((r) => r.ready)), runs };
      expect(median(runs.map((r) => r.fcp))).toBeLessThan(2_000);
    }
    writeFileSync(join(SHOTS, "metrics.json"), `${JSON.stringify(metrics, null, 2)}\n`);
    const brief = (k: string) => {
      const { firstContentfulPaintMs, readyMs } = metrics[k] as { firstContentfulPaintMs: number; readyMs: number };
      return { firstContentfulPaintMs, readyMs };
    };
    console.log(JSON.stringify({ initial: metrics.initial, lazy: metrics.lazy, "390x844": brief("390x844"), "1280x900": brief("1280x900") }));
  });
});

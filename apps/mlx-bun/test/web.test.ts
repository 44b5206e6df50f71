// The web chat at "/", in a real browser: Playwright (playwright-core) drives Debian's Chromium,
// headless, against the real server on a tiny checkpoint. A reply streams (its text sampled as it
// grows), Stop cancels the request on the server (/health's active_requests back to 0),
// conversations survive a reload, model output is never HTML, the page works from the keyboard.
// Screenshots go to test-results/ (git-ignored).
//
// Chromium missing is a failure, not a skip: .ci/run installs it. MLX_BUN_SKIP_BROWSER=1 skips the
// browser tests on purpose (reported as skipped; ignored when CI=true); MLX_BUN_CHROMIUM names another binary.
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Engine, Scheduler } from "@mlx-bun/runtime";
import { type BrowserContext, chromium, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { type RunningServer, startServer } from "../src/server/http.ts";
import { DEFAULT_WEB_DIR } from "../src/server/web.ts";
import { buildWeb, listFiles } from "../web/build.ts";
import { makeTinySmall, ROOT, tempDir } from "./helpers.ts";

// page.evaluate callbacks run in the page; this tsconfig has no DOM lib, so its globals are typed loosely here.
declare const document: any, window: any;
declare function getComputedStyle(e: unknown): any;
type HTMLInputElement = any;

const CHROMIUM = process.env.MLX_BUN_CHROMIUM || "/usr/bin/chromium";
const SKIP_BROWSER = process.env.MLX_BUN_SKIP_BROWSER === "1" && process.env.CI !== "true"; // never in CI
const ARTIFACTS = join(ROOT, "test-results");
const MODEL = "tiny-web/chat";

let tmp: ReturnType<typeof tempDir>;
let webDir: string;
let engine: Engine;
let scheduler: Scheduler;
let srv: RunningServer;

beforeAll(async () => {
  tmp = tempDir("mlxb-web-");
  webDir = join(tmp.path, "web");
  await buildWeb(webDir);
  engine = Engine.load(makeTinySmall(join(tmp.path, "tiny")));
  scheduler = new Scheduler(engine, { maxBatch: 4 });
  srv = startServer({ model: engine.loaded, scheduler, modelId: MODEL, port: 0, webDir, kvMode: engine.kvModeName });
});

afterAll(async () => {
  await srv?.stop();
  await scheduler?.close();
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
    expect(res.headers.get("x-content-type-options")).toBe("nosniff");
    const html = await res.text();
    const assets = [...html.matchAll(/(?:src|href)="\.?(\/assets\/[^"]+)"/g)].map((m) => m[1]!);
    expect(assets.some((a) => a.endsWith(".js"))).toBe(true);
    expect(assets.some((a) => a.endsWith(".css"))).toBe(true);
    // No CDN: every script and stylesheet is one of ours.
    expect(html).not.toMatch(/<(script|link)[^>]+(src|href)="(https?:)?\/\//);
    for (const a of assets) {
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
    expect(listFiles(DEFAULT_WEB_DIR).filter((f) => !f.startsWith(".")), hint).toEqual(files);
    for (const f of files) expect(readFileSync(join(DEFAULT_WEB_DIR, f)).equals(readFileSync(join(webDir, f))), `${hint} (${f} differs)`).toBe(true);
  });
});

describe.skipIf(SKIP_BROWSER)("in Chromium", () => {
  let context: BrowserContext;
  let page: Page;
  const dialogs: string[] = [];
  const foreignRequests: string[] = [];
  const pageErrors: string[] = [];

  beforeAll(async () => {
    if (!existsSync(CHROMIUM)) {
      throw new Error(`Chromium not found at ${CHROMIUM}: install it (apt-get install -y chromium, as .ci/run does), or set MLX_BUN_SKIP_BROWSER=1 to skip the browser tests`);
    }
    mkdirSync(ARTIFACTS, { recursive: true });
    // A fresh, empty --user-data-dir (the profile) in this run's temporary folder.
    context = await chromium.launchPersistentContext(join(tmp.path, "chromium-profile"), {
      executablePath: CHROMIUM,
      headless: true,
      args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
      viewport: { width: 1280, height: 820 },
    });
    page = context.pages()[0] ?? (await context.newPage());
    page.on("dialog", (d) => {
      dialogs.push(d.message());
      void d.dismiss();
    });
    page.on("request", (r) => {
      if (!r.url().startsWith(`${srv.url}/`) && !r.url().startsWith("data:")) foreignRequests.push(r.url());
    });
    page.on("pageerror", (e) => pageErrors.push(String(e)));
  });

  afterAll(async () => {
    await context?.close();
  });

  const lastReply = () => page.locator(".message-assistant").last();
  const replyState = () =>
    page.evaluate(() => {
      const a = [...document.querySelectorAll(".message-assistant")].at(-1);
      return { text: a?.querySelector(".message-content")?.textContent ?? "", busy: a?.getAttribute("aria-busy") ?? null };
    });

  test("the page loads and shows the model and the KV mode", async () => {
    await page.goto(`${srv.url}/`);
    await page.waitForSelector("html[data-ready=true]");
    await expect.poll(() => page.textContent("#model-name")).toBe(MODEL);
    expect(await page.textContent("#kv-mode")).toBe("bf16");
    await expect.poll(() => page.textContent("#active-requests")).toBe("0");
    expect(await page.evaluate(() => document.activeElement?.id)).toBe("prompt");
  });

  test("Shift+Enter is a new line, Enter sends; the reply grows frame by frame; TTFT and tokens/s shown", async () => {
    await page.fill("#max-tokens", "200");
    await page.fill("#temperature", "0");
    await page.focus("#prompt");
    await page.keyboard.type("Tell me a story");
    await page.keyboard.press("Shift+Enter");
    await page.keyboard.type("about the sea");
    expect(await page.inputValue("#prompt")).toBe("Tell me a story\nabout the sea");
    expect(await page.locator(".message").count()).toBe(0); // Shift+Enter sent nothing

    await page.keyboard.press("Enter");
    const seen: number[] = [];
    const deadline = Date.now() + 30_000;
    for (;;) {
      const s = await replyState();
      if (s.busy === "true" && s.text.length > 0) seen.push(s.text.length);
      if (s.busy === "false" || Date.now() > deadline) break;
      await Bun.sleep(15);
    }
    const distinct = new Set(seen);
    expect(distinct.size, `reply lengths seen while streaming: ${seen.join(",")}`).toBeGreaterThanOrEqual(3);
    expect(await page.inputValue("#prompt")).toBe("");
    expect(await page.locator(".message-user .message-content").textContent()).toBe("Tell me a story\nabout the sea");
    const stats = (await lastReply().locator(".message-stats").textContent())!;
    expect(stats).toMatch(/^time to first token \d+\.\d\d s · \d+\.\d tokens\/s · \d+ tokens · (finished|hit max tokens)$/);
    const tokens = Number(/(\d+) tokens ·/.exec(stats)![1]);
    expect(tokens).toBeGreaterThan(3);
    expect(tokens).toBeLessThanOrEqual(200);
    expect(await page.locator("#conversations .conversation-title").allTextContents()).toEqual(["Tell me a story about the sea"]);
    await page.screenshot({ path: join(ARTIFACTS, "web-chat.png") });
  });

  test("Stop mid-reply cancels the request on the server: active requests back to 0, its memory freed", async () => {
    await waitFor("the server to be idle", async () => (await health()).active_requests === 0);
    const baseline = (await health()).memory.active_bytes;
    await page.fill("#max-tokens", "3000");
    await page.fill("#prompt", "And now a very long one");
    await page.click("#send");
    await waitFor("the reply to start", async () => (await replyState()).text.length > 0);
    expect((await health()).active_requests).toBe(1);
    expect(await page.isEnabled("#stop")).toBe(true);
    expect(await page.isDisabled("#send")).toBe(true);
    await expect.poll(() => page.textContent("#active-requests"), { timeout: 5_000 }).toBe("1");
    await page.screenshot({ path: join(ARTIFACTS, "web-chat-streaming.png") });
    expect((await health()).active_requests).toBe(1); // still going: Stop is what ends it
    await page.click("#stop");
    await waitFor("/health active_requests to return to 0", async () => (await health()).active_requests === 0, 5_000);
    expect(scheduler.active).toBe(0);
    // The scheduler dropped the row at its next step: MLX holds no more than before the request.
    await expect.poll(async () => (await health()).memory.active_bytes, { timeout: 5_000 }).toBe(baseline);
    await waitFor("the reply to settle", async () => (await replyState()).busy === "false");
    const stats = (await lastReply().locator(".message-stats").textContent())!;
    expect(stats).toMatch(/ · stopped$/);
    expect(Number(/(\d+) tokens ·/.exec(stats)![1])).toBeLessThan(3000);
    expect(await page.isDisabled("#stop")).toBe(true);
    expect(await page.isEnabled("#send")).toBe(true);
    await expect.poll(() => page.textContent("#active-requests"), { timeout: 5_000 }).toBe("0");
    expect(await page.textContent("#status")).toMatch(/stopped/);
  });

  test("a reload keeps the conversation (localStorage) and the settings", async () => {
    const before = await page.locator("#messages .message").allTextContents();
    expect(before).toHaveLength(4);
    await page.reload();
    await page.waitForSelector("html[data-ready=true]");
    expect(await page.locator("#conversations .conversation-title").allTextContents()).toEqual(["Tell me a story about the sea"]);
    expect(await page.inputValue("#max-tokens")).toBe("3000");
    await page.click("#new-chat");
    expect(await page.locator("#messages .message").count()).toBe(0);
    await page.getByRole("button", { name: /^Tell me a story about the sea/ }).click();
    expect(await page.locator("#messages .message").allTextContents()).toEqual(before);
    expect(await page.getAttribute(".conversation-open", "aria-current")).toBe("true");
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
    await page.evaluate(
      ({ key, reply }) => {
        const list = JSON.parse(localStorage.getItem(key) ?? "[]");
        list.push({
          id: "xss",
          title: "Markup check",
          created: Date.now(),
          updated: Date.now() + 60_000,
          messages: [
            { role: "user", content: "<b>not bold</b> <img src=x onerror=alert(5)>" },
            { role: "assistant", content: reply, stats: { ttftMs: 12, tokens: 40, tps: 99.5, finish: "stop" } },
          ],
        });
        localStorage.setItem(key, JSON.stringify(list));
      },
      { key: "mlx-bun.chat.conversations.v1", reply },
    );
    await page.reload();
    await page.waitForSelector("html[data-ready=true]");
    expect(await page.locator("#conversations .conversation-title").allTextContents()).toEqual(["Markup check", "Tell me a story about the sea"]);
    await page.getByRole("button", { name: /^Markup check/ }).click();

    const dom = await page.evaluate(() => {
      const m = document.querySelector("#messages")!;
      const content = [...m.querySelectorAll(".message-assistant .message-content")].at(-1)!;
      return {
        scripts: m.querySelectorAll("script").length,
        pageScripts: [...document.querySelectorAll("script")].map((s) => s.getAttribute("src")),
        imgs: m.querySelectorAll("img").length,
        handlers: [...m.querySelectorAll("*")].filter((e) => [...e.attributes].some((a) => a.name.startsWith("on"))).length,
        jsLinks: m.querySelectorAll('a[href^="javascript" i]').length,
        text: content.textContent,
        code: content.querySelector("pre code")?.textContent,
        bold: content.querySelector("strong")?.textContent,
        user: m.querySelector(".message-user .message-content")?.textContent,
        userBold: m.querySelectorAll(".message-user b").length,
        pwned: (window as { __pwned?: number }).__pwned ?? null,
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
    expect(dom.pwned).toBeNull();
    expect(await page.locator(".message-assistant .message-stats").textContent()).toBe("time to first token 0.01 s · 99.5 tokens/s · 40 tokens · finished");
    await Bun.sleep(100);
    expect(dialogs).toEqual([]);
    await page.screenshot({ path: join(ARTIFACTS, "web-chat-markdown.png") });
  });

  test("keyboard and screen-reader basics: labels, live region, focus order, visible focus", async () => {
    const a11y = await page.evaluate(() => {
      const controls = [...document.querySelectorAll("input, textarea, select")] as HTMLInputElement[];
      const log = document.querySelector("#messages")!;
      return {
        unlabeled: controls.filter((c) => !c.labels?.length).map((c) => c.id),
        clickableNonButtons: [...document.querySelectorAll("[onclick], [role=button], div[tabindex='0'], span[tabindex='0']")].length,
        live: [log.getAttribute("role"), log.getAttribute("aria-live")],
        status: document.querySelector("#status")?.getAttribute("role"),
        buttons: [...document.querySelectorAll("#new-chat, #send, #stop, .conversation-open, .conversation-delete")].every((b) => b.tagName === "BUTTON"),
        deleteNames: [...document.querySelectorAll(".conversation-delete")].map((b) => b.getAttribute("aria-label")),
      };
    });
    expect(a11y.unlabeled).toEqual([]);
    expect(a11y.clickableNonButtons).toBe(0);
    expect(a11y.live).toEqual(["log", "polite"]);
    expect(a11y.status).toBe("status");
    expect(a11y.buttons).toBe(true);
    expect(a11y.deleteNames).toEqual(["Delete conversation: Markup check", "Delete conversation: Tell me a story about the sea"]);

    // The skip link, first in the page, jumps to the message box.
    await page.focus(".skip-link");
    await page.keyboard.press("Enter");
    expect(await page.evaluate(() => document.activeElement?.id)).toBe("prompt");
    // Tab through the page from the top: the order follows the layout.
    await page.focus(".skip-link");
    const order: string[] = ["skip-link"];
    for (let i = 0; i < 20; i++) {
      await page.keyboard.press("Tab");
      order.push(await page.evaluate(() => document.activeElement?.id || document.activeElement?.className || ""));
    }
    const at = (name: string) => order.indexOf(name);
    for (const [a, b] of [
      ["new-chat", "conversation-open"],
      ["conversation-open", "temperature"],
      ["temperature", "top-p"],
      ["top-p", "max-tokens"],
      ["max-tokens", "prompt"],
      ["prompt", "send"],
    ] as const) {
      expect(at(a), `${a} in ${order.join(" > ")}`).toBeGreaterThanOrEqual(0);
      expect(at(a), `${a} before ${b} in ${order.join(" > ")}`).toBeLessThan(at(b));
    }
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
      await p.fill("#max-tokens", "8");
      await p.click("#new-chat");
      await p.fill("#prompt", "hello");
      await p.keyboard.press("Enter");
      await p.waitForSelector("#error:not([hidden])");
      expect(await p.textContent("#error")).toMatch(/^HTTP 401: Missing API key.*enter the server's API key in Settings/);
      expect(await p.evaluate(() => document.activeElement?.id)).toBe("api-key");
      await p.fill("#api-key", "sk-web-test");
      await p.fill("#prompt", "hello again");
      await p.click("#send");
      await p.waitForFunction(() => [...document.querySelectorAll(".message-assistant")].at(-1)?.getAttribute("aria-busy") === "false");
      expect(await p.locator(".message-assistant .message-stats").last().textContent()).toMatch(/ · 8 tokens · hit max tokens$/);
      expect(await p.isHidden("#error")).toBe(true);
    } finally {
      await p.close();
      await keyed.stop();
    }
  });

  test("the page fetched nothing from another host and threw no error", () => {
    expect(foreignRequests).toEqual([]);
    expect(pageErrors).toEqual([]);
  });
});

// The web chat of `mlx-bun serve`: one page on the API's own port. Replies stream from
// /v1/chat/completions (SSE read with fetch + ReadableStream); Stop aborts the fetch, and the
// server cancels the request. Conversations and settings live in localStorage.
import { renderMarkdown } from "./markdown.ts";
import { type ChatChunk, readChatStream } from "./sse.ts";
import {
  apiMessages,
  type Conversation,
  loadConversations,
  loadCurrentId,
  loadSettings,
  type Message,
  newId,
  type ReplyStats,
  samplingFields,
  saveConversations,
  saveCurrentId,
  saveSettings,
  type Settings,
  sortConversations,
  titleFor,
} from "./store.ts";

const $ = <T extends HTMLElement>(id: string): T => {
  const el = document.getElementById(id);
  if (!el) throw new Error(`#${id} is missing from the page`);
  return el as T;
};

const ui = {
  newChat: $<HTMLButtonElement>("new-chat"),
  list: $<HTMLUListElement>("conversations"),
  noConversations: $<HTMLParagraphElement>("no-conversations"),
  settings: $<HTMLFormElement>("settings"),
  temperature: $<HTMLInputElement>("temperature"),
  topP: $<HTMLInputElement>("top-p"),
  maxTokens: $<HTMLInputElement>("max-tokens"),
  systemPrompt: $<HTMLTextAreaElement>("system-prompt"),
  apiKey: $<HTMLInputElement>("api-key"),
  title: $<HTMLHeadingElement>("chat-title"),
  model: $<HTMLElement>("model-name"),
  kv: $<HTMLElement>("kv-mode"),
  active: $<HTMLElement>("active-requests"),
  messages: $<HTMLDivElement>("messages"),
  empty: $<HTMLParagraphElement>("empty-state"),
  status: $<HTMLParagraphElement>("status"),
  error: $<HTMLParagraphElement>("error"),
  composer: $<HTMLFormElement>("composer"),
  prompt: $<HTMLTextAreaElement>("prompt"),
  send: $<HTMLButtonElement>("send"),
  stop: $<HTMLButtonElement>("stop"),
};

const store = window.localStorage;
const API_KEY_SLOT = "mlx-bun.chat.api-key";

const state = {
  conversations: loadConversations(store),
  current: null as Conversation | null,
  settings: loadSettings(store),
  /** The model id requests name; "default_model" is always accepted. */
  modelId: "default_model",
  /** The reply being streamed. */
  streaming: null as { controller: AbortController; conv: Conversation; message: Message } | null,
};

// ---------- server info (/health) ----------

async function refreshHealth(): Promise<void> {
  try {
    const r = await fetch("/health", { cache: "no-store" });
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    const h = (await r.json()) as { model?: string; kv_mode?: string | null; active_requests?: number };
    if (typeof h.model === "string") {
      state.modelId = h.model;
      ui.model.textContent = h.model;
    }
    ui.kv.textContent = typeof h.kv_mode === "string" ? h.kv_mode : "unknown";
    ui.active.textContent = String(h.active_requests ?? "?");
  } catch {
    ui.active.textContent = "server unreachable";
  }
}

let healthTimer: ReturnType<typeof setTimeout> | undefined;
function scheduleHealth(): void {
  clearTimeout(healthTimer);
  // Faster while a reply streams, so the count is seen to go up and back down.
  healthTimer = setTimeout(
    async () => {
      if (document.visibilityState !== "hidden") await refreshHealth();
      scheduleHealth();
    },
    state.streaming ? 500 : 2000,
  );
}

// ---------- settings ----------

function parseField(input: HTMLInputElement, lo: number, hi: number, integer: boolean): number | null {
  const raw = input.value.trim();
  if (raw === "") {
    input.removeAttribute("aria-invalid");
    return null;
  }
  const v = Number(raw);
  const ok = Number.isFinite(v) && v >= lo && v <= hi && (!integer || Number.isInteger(v));
  if (ok) input.removeAttribute("aria-invalid");
  else input.setAttribute("aria-invalid", "true");
  return ok ? v : null;
}

function readSettings(): Settings {
  return {
    temperature: parseField(ui.temperature, 0, 2, false),
    topP: parseField(ui.topP, 0, 1, false),
    maxTokens: parseField(ui.maxTokens, 1, 1_000_000, true),
    systemPrompt: ui.systemPrompt.value,
  };
}

function showSettings(s: Settings): void {
  ui.temperature.value = s.temperature === null ? "" : String(s.temperature);
  ui.topP.value = s.topP === null ? "" : String(s.topP);
  ui.maxTokens.value = s.maxTokens === null ? "" : String(s.maxTokens);
  ui.systemPrompt.value = s.systemPrompt;
}

ui.settings.addEventListener("input", () => {
  state.settings = readSettings();
  saveSettings(store, state.settings);
});
ui.settings.addEventListener("submit", (e) => e.preventDefault());
ui.apiKey.addEventListener("input", () => sessionStorage.setItem(API_KEY_SLOT, ui.apiKey.value));

// ---------- conversations ----------

function persist(): void {
  if (!saveConversations(store, state.conversations)) showError("The browser's storage is full or disabled: this conversation will not survive a reload.");
}

function renderList(): void {
  state.conversations = sortConversations(state.conversations);
  const saved = state.conversations.filter((c) => c.messages.length > 0);
  ui.noConversations.hidden = saved.length > 0;
  ui.list.replaceChildren(
    ...saved.map((c) => {
      const li = document.createElement("li");
      li.className = "conversation";
      const open = document.createElement("button");
      open.type = "button";
      open.className = "conversation-open";
      open.dataset.id = c.id;
      if (c === state.current) open.setAttribute("aria-current", "true");
      const title = document.createElement("span");
      title.className = "conversation-title";
      title.textContent = c.title;
      const when = document.createElement("span");
      when.className = "conversation-date muted small";
      when.textContent = new Date(c.updated || c.created).toLocaleString();
      open.append(title, when);
      open.addEventListener("click", () => openConversation(c.id));
      const del = document.createElement("button");
      del.type = "button";
      del.className = "conversation-delete";
      del.setAttribute("aria-label", `Delete conversation: ${c.title}`);
      del.title = "Delete";
      del.textContent = "×";
      del.addEventListener("click", () => deleteConversation(c.id));
      li.append(open, del);
      return li;
    }),
  );
}

function openConversation(id: string | null): void {
  stopReply();
  state.current = (id && state.conversations.find((c) => c.id === id)) || null;
  saveCurrentId(store, state.current?.id ?? null);
  renderConversation();
  renderList();
}

function newConversation(): void {
  openConversation(null);
  announce("New conversation");
  ui.prompt.focus();
}

function deleteConversation(id: string): void {
  const c = state.conversations.find((x) => x.id === id);
  if (!c || !confirmDelete(c)) return;
  if (state.streaming?.conv === c) stopReply();
  state.conversations = state.conversations.filter((x) => x !== c);
  persist();
  if (state.current === c) openConversation(null);
  else renderList();
  announce(`Deleted “${c.title}”`);
  ui.newChat.focus();
}

function confirmDelete(c: Conversation): boolean {
  return window.confirm(`Delete “${c.title}”?`);
}

// ---------- messages ----------

const views = new WeakMap<Message, { article: HTMLElement; body: HTMLElement; stats: HTMLElement }>();

function renderConversation(): void {
  const c = state.current;
  ui.title.textContent = c ? c.title : "New conversation";
  document.title = c ? `${c.title} · mlx-bun chat` : "mlx-bun chat";
  ui.messages.replaceChildren(...(c?.messages ?? []).map(messageView));
  if (!c?.messages.length) ui.messages.append(ui.empty);
  scrollToEnd(true);
}

function messageView(m: Message): HTMLElement {
  const article = document.createElement("article");
  article.className = `message message-${m.role}`;
  const who = document.createElement("h3");
  who.className = "message-role";
  who.textContent = m.role === "user" ? "You" : m.role === "assistant" ? "Assistant" : "System";
  const body = document.createElement("div");
  body.className = "message-content";
  const stats = document.createElement("p");
  stats.className = "message-stats muted small";
  article.append(who, body, stats);
  views.set(m, { article, body, stats });
  fillMessage(m, true);
  return article;
}

/** Show a message's text (markdown for replies, plain text for the user's) and its stats. */
function fillMessage(m: Message, final: boolean): void {
  const v = views.get(m);
  if (!v) return;
  if (m.role === "assistant") {
    v.body.innerHTML = renderMarkdown(m.content);
    if (final) addCopyButtons(v.body);
  } else v.body.textContent = m.content;
  if (m.error) {
    const e = document.createElement("p");
    e.className = "error";
    e.textContent = m.error;
    v.body.append(e);
  }
  v.stats.textContent = m.stats ? formatStats(m.stats) : "";
  v.stats.hidden = !m.stats;
}

function addCopyButtons(root: HTMLElement): void {
  for (const pre of root.querySelectorAll("pre")) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "copy-code";
    b.textContent = "Copy";
    b.setAttribute("aria-label", "Copy code");
    b.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(pre.querySelector("code")?.textContent ?? pre.textContent ?? "");
        b.textContent = "Copied";
      } catch {
        b.textContent = "Copy failed";
      }
      setTimeout(() => (b.textContent = "Copy"), 1500);
    });
    const wrap = document.createElement("div");
    wrap.className = "code-block";
    pre.replaceWith(wrap);
    wrap.append(b, pre);
  }
}

function formatStats(s: ReplyStats): string {
  const parts: string[] = [];
  if (s.ttftMs !== null) parts.push(`time to first token ${(s.ttftMs / 1000).toFixed(2)} s`);
  if (s.tps !== null) parts.push(`${s.tps.toFixed(1)} tokens/s`);
  parts.push(`${s.tokens} token${s.tokens === 1 ? "" : "s"}`);
  const why: Record<string, string> = { stop: "finished", length: "hit max tokens", stopped: "stopped", error: "failed" };
  parts.push(why[s.finish] ?? s.finish);
  return parts.join(" · ");
}

let autoScroll = true;
ui.messages.addEventListener("scroll", () => {
  const el = ui.messages;
  autoScroll = el.scrollHeight - el.scrollTop - el.clientHeight < 48;
});
function scrollToEnd(force = false): void {
  if (force || autoScroll) ui.messages.scrollTop = ui.messages.scrollHeight;
}

function announce(text: string): void {
  ui.status.textContent = text;
}

function showError(text: string | null): void {
  ui.error.hidden = !text;
  ui.error.textContent = text ?? "";
}

// ---------- sending and streaming ----------

function setStreaming(on: boolean): void {
  ui.send.disabled = on;
  ui.stop.disabled = !on;
  ui.composer.setAttribute("aria-busy", String(on));
}

async function send(): Promise<void> {
  const text = ui.prompt.value;
  if (!text.trim() || state.streaming) return;
  showError(null);
  state.settings = readSettings();
  let conv = state.current;
  if (!conv) {
    conv = { id: newId(), title: "", created: Date.now(), updated: Date.now(), messages: [] };
    state.conversations.push(conv);
    state.current = conv;
    saveCurrentId(store, conv.id);
  }
  const user: Message = { role: "user", content: text };
  conv.messages.push(user);
  if (!conv.title) conv.title = titleFor(conv.messages);
  const history = apiMessages(conv.messages, state.settings.systemPrompt);
  const reply: Message = { role: "assistant", content: "" };
  conv.messages.push(reply);
  conv.updated = Date.now();
  ui.prompt.value = "";
  renderConversation();
  renderList();
  persist();

  const v = views.get(reply)!;
  v.article.setAttribute("aria-busy", "true");
  v.article.classList.add("streaming");
  const controller = new AbortController();
  state.streaming = { controller, conv, message: reply };
  setStreaming(true);
  scheduleHealth();
  void refreshHealth();
  announce("The assistant is replying…");

  const t0 = performance.now();
  let tFirst: number | null = null;
  let tLast = t0;
  let chunks = 0;
  let usageTokens: number | null = null;
  let finish = "stop";
  let frame = 0;
  const paint = () => {
    frame = 0;
    fillMessage(reply, false);
    scrollToEnd();
  };
  try {
    const headers: Record<string, string> = { "Content-Type": "application/json" };
    const key = ui.apiKey.value.trim();
    if (key) headers.Authorization = `Bearer ${key}`;
    const res = await fetch("/v1/chat/completions", {
      method: "POST",
      headers,
      signal: controller.signal,
      body: JSON.stringify({
        model: state.modelId,
        messages: history,
        stream: true,
        stream_options: { include_usage: true },
        ...samplingFields(state.settings),
      }),
    });
    if (!res.ok || !res.body) throw new Error(await errorText(res));
    await readChatStream(res.body, (c: ChatChunk) => {
      if (c.error) throw new Error(c.error.message ?? "the server reported an error");
      if (c.usage) usageTokens = c.usage.completion_tokens;
      const choice = c.choices?.[0];
      if (!choice) return;
      const delta = choice.delta?.content;
      if (delta) {
        const now = performance.now();
        tFirst ??= now;
        tLast = now;
        chunks++;
        reply.content += delta;
        frame ||= requestAnimationFrame(paint);
      }
      if (choice.finish_reason) finish = choice.finish_reason;
    });
  } catch (e) {
    if (controller.signal.aborted) finish = "stopped";
    else {
      finish = "error";
      reply.error = (e as Error).message || String(e);
    }
  } finally {
    if (frame) cancelAnimationFrame(frame);
    const tokens = usageTokens ?? chunks;
    reply.stats = {
      ttftMs: tFirst === null ? null : tFirst - t0,
      tokens,
      tps: tFirst !== null && chunks > 1 && tLast > tFirst ? (chunks - 1) / ((tLast - tFirst) / 1000) : null,
      finish,
    };
    conv.updated = Date.now();
    state.streaming = null;
    v.article.classList.remove("streaming");
    fillMessage(reply, true);
    v.article.setAttribute("aria-busy", "false");
    persist();
    renderList();
    setStreaming(false);
    scrollToEnd();
    announce(finish === "error" ? `The reply failed: ${reply.error}` : `Reply ${formatStats(reply.stats)}.`);
    if (reply.error) showError(reply.error);
    void refreshHealth();
    scheduleHealth();
    if (document.activeElement === ui.stop || document.activeElement === document.body) ui.prompt.focus();
  }
}

async function errorText(res: Response): Promise<string> {
  let msg = `HTTP ${res.status}`;
  try {
    const body = (await res.json()) as { error?: { message?: string } };
    if (body.error?.message) msg = `${msg}: ${body.error.message}`;
  } catch {
    // not JSON
  }
  if (res.status === 401) {
    msg += " (enter the server's API key in Settings)";
    ui.apiKey.focus();
  }
  return msg;
}

function stopReply(): void {
  state.streaming?.controller.abort();
}

ui.composer.addEventListener("submit", (e) => {
  e.preventDefault();
  void send();
});
ui.prompt.addEventListener("keydown", (e) => {
  // Enter sends; Shift+Enter is a new line; an IME composing text keeps its Enter.
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing && e.keyCode !== 229) {
    e.preventDefault();
    if (!state.streaming) ui.composer.requestSubmit();
  }
});
ui.stop.addEventListener("click", () => {
  stopReply();
  ui.prompt.focus();
});
ui.newChat.addEventListener("click", newConversation);
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape" && state.streaming) stopReply();
});
window.addEventListener("pagehide", () => {
  if (state.streaming) persist();
});

// ---------- start ----------

showSettings(state.settings);
ui.apiKey.value = sessionStorage.getItem(API_KEY_SLOT) ?? "";
openConversation(loadCurrentId(store));
void refreshHealth();
scheduleHealth();
ui.prompt.focus();
document.documentElement.dataset.ready = "true";

// The web chat of `mlx-bun serve`: one page on the API's own port. Replies stream from
// /v1/chat/completions (SSE read with fetch + ReadableStream); Stop aborts the fetch, and the
// server cancels the request. Conversations (a tree of branches), settings and the layout live in
// localStorage. A reply keeps streaming into its conversation while another one is shown.
import { onRenderersLoaded, renderMarkdown } from "./markdown.ts";
import { checkSettings, NUMBER_FIELDS, type NumericKey, samplingFields } from "./settings.ts";
import { readChatStream, ReplyAccumulator } from "./sse.ts";
import {
  addMessage,
  apiMessages,
  type ChatImage,
  type Conversation,
  exportJson,
  IMAGE_DATA_URL,
  type Layout,
  loadConversations,
  loadCurrentId,
  loadLayout,
  loadSettings,
  type Message,
  mergeImported,
  newId,
  parseImport,
  pathOf,
  type ReplyStats,
  saveConversations,
  saveCurrentId,
  saveLayout,
  saveSettings,
  searchConversations,
  type Settings,
  setLeaf,
  siblingsOf,
  STORED_IMAGE_MAX_CHARS,
  sortConversations,
  switchVersion,
  titleFor,
} from "./store.ts";

const $ = <T extends HTMLElement>(id: string): T => {
  const el = document.getElementById(id);
  if (!el) throw new Error(`#${id} is missing from the page`);
  return el as T;
};

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  props: Partial<Record<string, string>> = {},
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (v === undefined) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v);
  }
  e.append(...children);
  return e;
}

const ui = {
  app: $<HTMLDivElement>("app"),
  sidebar: $<HTMLElement>("sidebar"),
  settingsPanel: $<HTMLElement>("settings-panel"),
  backdrop: $<HTMLDivElement>("backdrop"),
  chat: $<HTMLElement>("chat"),
  toggleSidebar: $<HTMLButtonElement>("toggle-sidebar"),
  closeSidebar: $<HTMLButtonElement>("close-sidebar"),
  toggleSettings: $<HTMLButtonElement>("toggle-settings"),
  closeSettings: $<HTMLButtonElement>("close-settings"),
  settingsBadge: $<HTMLSpanElement>("settings-badge"),
  newChat: $<HTMLButtonElement>("new-chat"),
  search: $<HTMLInputElement>("search"),
  list: $<HTMLUListElement>("conversations"),
  noConversations: $<HTMLParagraphElement>("no-conversations"),
  noMatches: $<HTMLParagraphElement>("no-matches"),
  exportBtn: $<HTMLButtonElement>("export"),
  importBtn: $<HTMLButtonElement>("import"),
  importFile: $<HTMLInputElement>("import-file"),
  settings: $<HTMLFormElement>("settings"),
  settingsSummary: $<HTMLParagraphElement>("settings-summary"),
  numberFields: $<HTMLDivElement>("number-fields"),
  stopSequences: $<HTMLTextAreaElement>("stop-sequences"),
  systemPrompt: $<HTMLTextAreaElement>("system-prompt"),
  apiKey: $<HTMLInputElement>("api-key"),
  resetSettings: $<HTMLButtonElement>("reset-settings"),
  title: $<HTMLHeadingElement>("chat-title"),
  model: $<HTMLElement>("model-name"),
  kv: $<HTMLElement>("kv-mode"),
  active: $<HTMLElement>("active-requests"),
  messages: $<HTMLDivElement>("messages"),
  empty: $<HTMLParagraphElement>("empty-state"),
  status: $<HTMLParagraphElement>("status"),
  error: $<HTMLParagraphElement>("error"),
  composer: $<HTMLFormElement>("composer"),
  composerBox: $<HTMLDivElement>("composer-box"),
  attach: $<HTMLButtonElement>("attach"),
  attachFile: $<HTMLInputElement>("attach-file"),
  attachments: $<HTMLUListElement>("attachments"),
  imageHint: $<HTMLSpanElement>("image-hint"),
  prompt: $<HTMLTextAreaElement>("prompt"),
  send: $<HTMLButtonElement>("send"),
  stop: $<HTMLButtonElement>("stop"),
};

const store = window.localStorage;
const API_KEY_SLOT = "mlx-bun.chat.api-key";

interface Stream {
  controller: AbortController;
  conv: Conversation;
  message: Message;
  frame: number;
}

const state = {
  conversations: loadConversations(store),
  /** The conversation shown; null: a new one, not saved until its first message. */
  current: null as Conversation | null,
  settings: loadSettings(store),
  /** Element id → why the server would refuse the value typed there. */
  invalid: new Map<string, string>(),
  /** The model id requests name; "default_model" is always accepted. */
  modelId: "default_model",
  /** Replies being streamed, by conversation id (one per conversation). */
  streams: new Map<string, Stream>(),
  /** The user message being edited. */
  editing: null as string | null,
  /** The conversation being renamed in the list, and the title typed so far. */
  renaming: null as string | null,
  renameDraft: "",
  layout: loadLayout(store),
  open: { sidebar: false, settings: false },
  /** The model takes images (/health's `vision`): attaching is offered. */
  vision: false,
  /** Images attached to the message being written. */
  pending: [] as ChatImage[],
  /** Said once per page: the storage could not hold the images. */
  toldImagesDropped: false,
};

const streamOf = (c: Conversation | null) => (c ? state.streams.get(c.id) : undefined);

// ---------- layout: panels beside the chat (wide), or over it (narrow) ----------

const narrowQuery = window.matchMedia("(max-width: 899px)");
const isNarrow = () => narrowQuery.matches;

function applyLayout(): void {
  const { sidebar, settings } = state.open;
  ui.app.dataset.sidebar = sidebar ? "open" : "closed";
  ui.app.dataset.settings = settings ? "open" : "closed";
  ui.toggleSidebar.setAttribute("aria-expanded", String(sidebar));
  ui.toggleSettings.setAttribute("aria-expanded", String(settings));
  const overlay = isNarrow() && (sidebar || settings);
  ui.backdrop.hidden = !overlay;
  ui.chat.inert = overlay;
  ui.app.dataset.overlay = String(overlay);
}

function setPanel(which: "sidebar" | "settings", open: boolean, focus = true): void {
  if (state.open[which] === open) return;
  state.open[which] = open;
  // Over the chat only one panel at a time.
  if (open && isNarrow()) state.open[which === "sidebar" ? "settings" : "sidebar"] = false;
  if (!isNarrow()) {
    state.layout[which] = open;
    saveLayout(store, state.layout);
  }
  applyLayout();
  if (!focus) return;
  if (open) (which === "sidebar" ? ui.search : (ui.settings.querySelector<HTMLElement>("input, textarea") ?? ui.closeSettings)).focus();
  else (which === "sidebar" ? ui.toggleSidebar : ui.toggleSettings).focus();
}

function closeOverlays(): boolean {
  if (!isNarrow()) return false;
  const which = state.open.sidebar ? "sidebar" : state.open.settings ? "settings" : null;
  if (!which) return false;
  setPanel(which, false);
  return true;
}

narrowQuery.addEventListener("change", () => {
  state.open = isNarrow() ? { sidebar: false, settings: false } : { ...state.layout };
  applyLayout();
});
ui.toggleSidebar.addEventListener("click", () => setPanel("sidebar", !state.open.sidebar));
ui.closeSidebar.addEventListener("click", () => setPanel("sidebar", false));
ui.toggleSettings.addEventListener("click", () => setPanel("settings", !state.open.settings));
ui.closeSettings.addEventListener("click", () => setPanel("settings", false));
ui.backdrop.addEventListener("click", () => closeOverlays());

// ---------- server info (/health) ----------

async function refreshHealth(): Promise<void> {
  try {
    const r = await fetch("/health", { cache: "no-store" });
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    const h = (await r.json()) as { model?: string; kv_mode?: string | null; active_requests?: number; vision?: boolean };
    setVision(h.vision === true);
    if (typeof h.model === "string") {
      state.modelId = h.model;
      ui.model.textContent = h.model;
      ui.model.title = h.model;
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
    state.streams.size ? 500 : 2000,
  );
}

// ---------- settings ----------

const GROUPS: Record<string, string> = { sampling: "Sampling", length: "Length", penalties: "Repetition penalties", xtc: "XTC (exclude top choices)" };
const numberInputs = new Map<NumericKey, HTMLInputElement>();

function buildSettingsForm(): void {
  for (const [group, legend] of Object.entries(GROUPS)) {
    const fs = el("fieldset", {}, el("legend", { text: legend }));
    for (const f of NUMBER_FIELDS.filter((x) => x.group === group)) {
      const input = el("input", {
        id: f.id,
        name: f.api,
        type: "text",
        inputmode: f.integer && (f.min ?? -1) >= 0 ? "numeric" : "decimal",
        autocomplete: "off",
        spellcheck: "false",
        placeholder: "server default",
        "aria-describedby": `${f.id}-help ${f.id}-error`,
      });
      numberInputs.set(f.key, input);
      fs.append(
        el(
          "div",
          { class: "field" },
          el("label", { for: f.id, text: f.label }),
          input,
          el("p", { id: `${f.id}-help`, class: "help", text: `${f.help} (${f.api})` }),
          el("p", { id: `${f.id}-error`, class: "field-error", hidden: "" }),
        ),
      );
    }
    ui.numberFields.append(fs);
  }
}

/** Reads the form, marks every invalid field and keeps the valid values. */
function readSettings(): void {
  const raw: Partial<Record<NumericKey, string>> = {};
  for (const [k, input] of numberInputs) raw[k] = input.value;
  const { settings, errors } = checkSettings(raw, { stop: ui.stopSequences.value, systemPrompt: ui.systemPrompt.value });
  state.settings = settings;
  state.invalid = errors;
  for (const f of NUMBER_FIELDS) {
    const input = numberInputs.get(f.key)!;
    const err = errors.get(f.id);
    const p = $<HTMLParagraphElement>(`${f.id}-error`);
    if (err) input.setAttribute("aria-invalid", "true");
    else input.removeAttribute("aria-invalid");
    p.textContent = err ?? "";
    p.hidden = !err;
  }
  ui.settingsBadge.hidden = errors.size === 0;
  ui.settingsSummary.hidden = errors.size === 0;
  ui.settingsSummary.textContent = errors.size
    ? `${errors.size === 1 ? "One value is" : `${errors.size} values are`} invalid: nothing is sent until ${errors.size === 1 ? "it is" : "they are"} fixed or cleared.`
    : "";
  saveSettings(store, settings);
}

function showSettings(s: Settings): void {
  for (const f of NUMBER_FIELDS) numberInputs.get(f.key)!.value = s[f.key] === null ? "" : String(s[f.key]);
  ui.stopSequences.value = s.stop;
  ui.systemPrompt.value = s.systemPrompt;
}

/** False (and says why, with the settings open at the first bad field) when a value is invalid. */
function settingsOk(): boolean {
  readSettings();
  const first = state.invalid.entries().next();
  if (first.done) return true;
  const [id, msg] = first.value;
  showError(`Not sent: ${msg} Fix it in Settings, or clear it to use the server's default.`);
  setPanel("settings", true, false);
  $<HTMLInputElement>(id).focus();
  return false;
}

ui.settings.addEventListener("input", (e) => {
  if (e.target !== ui.apiKey) readSettings();
});
ui.settings.addEventListener("submit", (e) => e.preventDefault());
ui.apiKey.addEventListener("input", () => sessionStorage.setItem(API_KEY_SLOT, ui.apiKey.value));
ui.resetSettings.addEventListener("click", () => {
  showSettings({ ...state.settings, ...Object.fromEntries(NUMBER_FIELDS.map((f) => [f.key, null])), stop: "" });
  readSettings();
  announce("Sampling settings reset to the server's defaults");
});

// ---------- conversations ----------

function persist(): void {
  const saved = saveConversations(store, state.conversations);
  if (!saved) showError("The browser's storage is full or disabled: this conversation will not survive a reload.");
  else if (saved === "without-images" && !state.toldImagesDropped) {
    state.toldImagesDropped = true;
    showError("The browser's storage is full: the conversations' images are not kept (their text is). After a reload, a note stands in for each image.");
  }
}

function renderList(): void {
  state.conversations = sortConversations(state.conversations);
  const saved = state.conversations.filter((c) => c.messages.length > 0);
  const q = ui.search.value.trim();
  const shown = searchConversations(saved, q);
  ui.noConversations.hidden = saved.length > 0;
  ui.noMatches.hidden = !(saved.length > 0 && shown.length === 0);
  ui.noMatches.textContent = `No conversation matches “${q}”.`;
  ui.list.replaceChildren(...shown.map(listItem));
}

function listItem(c: Conversation): HTMLLIElement {
  const li = el("li", { class: "conversation", "data-id": c.id });
  if (state.renaming === c.id) {
    const input = el("input", { id: "rename-input", type: "text", autocomplete: "off" });
    input.value = state.renameDraft;
    input.addEventListener("input", () => (state.renameDraft = input.value));
    const form = el(
      "form",
      { class: "rename-form" },
      el("label", { for: "rename-input", class: "visually-hidden", text: `New title for “${c.title}”` }),
      input,
      el("button", { type: "submit", class: "primary small-button", text: "Save" }),
      el("button", { type: "button", class: "small-button", text: "Cancel" }),
    );
    const done = (save: boolean) => {
      if (state.renaming !== c.id) return;
      state.renaming = null;
      if (save) renameConversation(c, input.value);
      renderList();
      ui.list.querySelector<HTMLButtonElement>(`[data-id="${CSS.escape(c.id)}"] .conversation-open`)?.focus();
    };
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      done(true);
    });
    form.querySelector("button[type=button]")!.addEventListener("click", () => done(false));
    input.addEventListener("keydown", (e) => {
      if (e.key === "Escape") {
        e.preventDefault();
        e.stopPropagation();
        done(false);
      }
    });
    li.append(form);
    queueMicrotask(() => {
      if (document.activeElement === input) return;
      input.focus();
      input.select();
    });
    return li;
  }
  const open = el("button", { type: "button", class: "conversation-open", "data-id": c.id });
  if (c === state.current) open.setAttribute("aria-current", "true");
  open.append(
    el("span", { class: "conversation-title", text: c.title }),
    el("span", {
      class: "conversation-date muted small",
      text: new Date(c.updated || c.created).toLocaleString(undefined, { dateStyle: "short", timeStyle: "short" }),
    }),
  );
  if (state.streams.has(c.id)) open.append(el("span", { class: "conversation-busy small", text: "replying…" }));
  open.addEventListener("click", () => {
    openConversation(c.id);
    if (isNarrow()) setPanel("sidebar", false, false);
    ui.prompt.focus();
  });
  const rename = el(
    "button",
    { type: "button", class: "conversation-rename icon-button", "aria-label": `Rename conversation: ${c.title}`, title: "Rename" },
    el("span", { "aria-hidden": "true", text: "✎" }),
  );
  rename.addEventListener("click", () => {
    state.renaming = c.id;
    state.renameDraft = c.title;
    renderList();
  });
  const del = el(
    "button",
    { type: "button", class: "conversation-delete icon-button", "aria-label": `Delete conversation: ${c.title}`, title: "Delete" },
    el("span", { "aria-hidden": "true", text: "×" }),
  );
  del.addEventListener("click", () => deleteConversation(c.id));
  li.append(open, rename, del);
  return li;
}

function renameConversation(c: Conversation, title: string): void {
  const t = title.replace(/\s+/g, " ").trim();
  if (t) {
    c.title = t;
    c.renamed = true;
  } else {
    delete c.renamed;
    c.title = titleFor(pathOf(c));
  }
  persist();
  if (c === state.current) showTitle();
  announce(`Renamed to “${c.title}”`);
}

function showTitle(): void {
  const c = state.current;
  ui.title.textContent = c ? c.title : "New conversation";
  document.title = c ? `${c.title} · mlx-bun chat` : "mlx-bun chat";
}

function openConversation(id: string | null): void {
  state.current = (id && state.conversations.find((c) => c.id === id)) || null;
  state.editing = null;
  saveCurrentId(store, state.current?.id ?? null);
  showError(null);
  renderConversation();
  renderList();
}

function newConversation(): void {
  const running = streamOf(state.current);
  openConversation(null);
  if (isNarrow()) setPanel("sidebar", false, false);
  // A reply being written keeps going in its own conversation (shown as "replying…" in the list).
  announce(running ? `New conversation. The reply in “${running.conv.title}” keeps going.` : "New conversation");
  ui.prompt.focus();
}

function deleteConversation(id: string): void {
  const c = state.conversations.find((x) => x.id === id);
  if (!c || !window.confirm(`Delete “${c.title}”?`)) return;
  state.streams.get(c.id)?.controller.abort();
  state.conversations = state.conversations.filter((x) => x !== c);
  persist();
  if (state.current === c) openConversation(null);
  else renderList();
  announce(`Deleted “${c.title}”`);
  ui.newChat.focus();
}

// ---------- export / import ----------

ui.exportBtn.addEventListener("click", () => {
  const saved = state.conversations.filter((c) => c.messages.length > 0);
  if (!saved.length) {
    announce("Nothing to export yet");
    return;
  }
  const url = URL.createObjectURL(new Blob([exportJson(saved)], { type: "application/json" }));
  const a = el("a", { href: url, download: `mlx-bun-chats-${new Date().toISOString().slice(0, 10)}.json`, class: "visually-hidden" });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 30_000);
  announce(`Exported ${saved.length} conversation${saved.length === 1 ? "" : "s"}`);
});
ui.importBtn.addEventListener("click", () => ui.importFile.click());
ui.importFile.addEventListener("change", async () => {
  const file = ui.importFile.files?.[0];
  ui.importFile.value = "";
  if (!file) return;
  try {
    const imported = parseImport(await file.text());
    const { list, added, skipped } = mergeImported(state.conversations, imported);
    state.conversations = list;
    persist();
    renderList();
    showError(null);
    announce(`Imported ${added} conversation${added === 1 ? "" : "s"}${skipped ? ` (${skipped} already here)` : ""}`);
  } catch (e) {
    showError(`Import failed: ${(e as Error).message}.`);
  }
});

ui.search.addEventListener("input", renderList);
ui.search.addEventListener("keydown", (e) => {
  if (e.key === "Escape" && ui.search.value) {
    e.stopPropagation();
    ui.search.value = "";
    renderList();
  }
});

// ---------- messages ----------

interface View {
  article: HTMLElement;
  body: HTMLElement;
  reasoning: HTMLDetailsElement;
  reasoningSummary: HTMLElement;
  reasoningBody: HTMLElement;
  /** The reader opened or closed the reasoning: leave it as they set it. */
  reasoningTouched: boolean;
  tools: HTMLElement;
  error: HTMLElement;
  stats: HTMLElement;
}

const views = new WeakMap<Message, View>();

function renderConversation(keepScroll = false): void {
  const c = state.current;
  showTitle();
  const path = c ? pathOf(c) : [];
  ui.messages.replaceChildren(...path.map((m) => messageView(c!, m)));
  if (!path.length) ui.messages.append(ui.empty);
  refreshControls();
  if (!keepScroll) scrollToEnd(true);
}

const ROLE_NAMES = { user: "You", assistant: "Assistant", system: "System" } as const;

function messageView(c: Conversation, m: Message): HTMLElement {
  const article = el("article", { class: `message message-${m.role}`, "data-id": m.id });
  const head = el("header", { class: "message-head" }, el("h3", { class: "message-role", text: ROLE_NAMES[m.role] }));
  const sibs = siblingsOf(c, m);
  if (sibs.length > 1) {
    const i = sibs.indexOf(m);
    const prev = el(
      "button",
      {
        type: "button",
        class: "icon-button version-prev",
        "aria-label": `Previous version of this ${m.role === "user" ? "message" : "reply"}`,
        title: "Previous version",
      },
      el("span", { "aria-hidden": "true", text: "‹" }),
    );
    const next = el(
      "button",
      {
        type: "button",
        class: "icon-button version-next",
        "aria-label": `Next version of this ${m.role === "user" ? "message" : "reply"}`,
        title: "Next version",
      },
      el("span", { "aria-hidden": "true", text: "›" }),
    );
    prev.disabled = i === 0;
    next.disabled = i === sibs.length - 1;
    prev.addEventListener("click", () => showVersion(c, m, -1));
    next.addEventListener("click", () => showVersion(c, m, 1));
    head.append(
      el(
        "div",
        { class: "versions", role: "group", "aria-label": "Versions", "data-index": String(i), "data-count": String(sibs.length) },
        prev,
        el("span", { class: "version-count small", text: `${i + 1} / ${sibs.length}`, "aria-label": `version ${i + 1} of ${sibs.length}` }),
        next,
      ),
    );
  }
  const reasoningSummary = el("summary", { class: "reasoning-summary" });
  const reasoningBody = el("div", { class: "reasoning-content" });
  const reasoning = el("details", { class: "reasoning" }, reasoningSummary, reasoningBody);
  const body = el("div", { class: "message-content" });
  const tools = el("div", { class: "tool-calls" });
  const error = el("p", { class: "error message-error" });
  const stats = el("p", { class: "message-stats muted small" });
  const actions = el("div", { class: "message-actions", role: "group", "aria-label": "Message actions" });
  const copy = el("button", {
    type: "button",
    class: "small-button action-copy",
    text: "Copy",
    "aria-label": `Copy ${m.role === "user" ? "message" : "reply"}`,
  });
  copy.addEventListener("click", () => copyText(messageText(m), copy, "Copy"));
  actions.append(copy);
  if (m.role === "user") {
    const edit = el("button", { type: "button", class: "small-button action-edit needs-idle", text: "Edit", "aria-label": "Edit message" });
    edit.addEventListener("click", () => startEdit(m));
    actions.append(edit);
  } else if (m.role === "assistant") {
    const regen = el("button", { type: "button", class: "small-button action-regenerate needs-idle", text: "Regenerate", "aria-label": "Regenerate reply" });
    regen.addEventListener("click", () => regenerate(c, m));
    actions.append(regen);
  }
  article.append(head, ...(m.images?.length ? [imagesView(m.images)] : []), reasoning, body, tools, error, stats, actions);
  const v: View = { article, body, reasoning, reasoningSummary, reasoningBody, reasoningTouched: false, tools, error, stats };
  reasoningSummary.addEventListener("click", () => (v.reasoningTouched = true));
  views.set(m, v);
  const streaming = streamOf(c)?.message === m;
  if (streaming) {
    article.classList.add("streaming");
    article.setAttribute("aria-busy", "true");
  } else if (m.role === "assistant") article.setAttribute("aria-busy", "false");
  if (state.editing === m.id) fillEditor(m, v);
  else fillMessage(m, !streaming);
  return article;
}

/** A user message's images (shown from their data: URLs), or a note for one not kept in storage. */
function imagesView(images: ChatImage[]): HTMLElement {
  return el(
    "div",
    { class: "message-images", role: "group", "aria-label": images.length === 1 ? "Image" : `${images.length} images` },
    ...images.map((img) =>
      img.url
        ? el("img", { class: "message-image", src: img.url, alt: img.name, title: img.name })
        : el("p", {
            class: "image-dropped muted small",
            text: `Image “${img.name}” (${sizeText(img.bytes)}) was too large to keep in this browser's storage: it is no longer shown or sent.`,
          }),
    ),
  );
}

function sizeText(bytes: number): string {
  return bytes >= 1024 * 1024 ? `${(bytes / (1024 * 1024)).toFixed(1)} MB` : `${Math.max(1, Math.round(bytes / 1024))} KB`;
}

function messageText(m: Message): string {
  const calls = (m.toolCalls ?? []).map((t) => `${t.name}(${t.arguments})`);
  return [m.content, ...calls].filter(Boolean).join("\n\n");
}

/** Show a message's reasoning, text (markdown for replies, plain text for the user's), tool calls and stats. */
function fillMessage(m: Message, final: boolean): void {
  const v = views.get(m);
  if (!v) return;
  const thinking = !final && !m.content && !m.toolCalls?.length;
  if (m.reasoning) {
    v.reasoning.hidden = false;
    v.reasoningBody.innerHTML = renderMarkdown(m.reasoning);
    const ms = m.stats?.reasoningMs;
    v.reasoningSummary.textContent = thinking ? "Thinking…" : ms ? `Reasoning · ${(ms / 1000).toFixed(1)} s` : "Reasoning";
    // Open while the model thinks, closed once it answers (unless the reader chose).
    if (!v.reasoningTouched) v.reasoning.open = thinking;
  } else v.reasoning.hidden = true;
  if (m.role === "assistant") {
    v.body.innerHTML = renderMarkdown(m.content);
    if (final) decorateCode(v.body);
  } else v.body.textContent = m.content;
  // A reply that only reasoned or called tools has no text box.
  v.body.hidden = m.role === "assistant" && !m.content && (!!m.reasoning || !!m.toolCalls?.length);
  v.tools.replaceChildren(...(m.toolCalls ?? []).map(toolCallView));
  v.tools.hidden = !m.toolCalls?.length;
  v.error.textContent = m.error ?? "";
  v.error.hidden = !m.error;
  v.stats.replaceChildren(...(m.stats ? statsNodes(m.stats) : []));
  v.stats.hidden = !m.stats;
}

function toolCallView(t: { id: string; type: string; name: string; arguments: string }): HTMLElement {
  let args = t.arguments;
  try {
    args = JSON.stringify(JSON.parse(t.arguments), null, 2);
  } catch {
    // not JSON: shown as the server sent it
  }
  return el(
    "div",
    { class: "tool-call", role: "group", "aria-label": `Tool call: ${t.name}` },
    el(
      "p",
      { class: "tool-call-head" },
      el("span", { class: "tool-call-kind", text: "Tool call" }),
      " ",
      el("code", { class: "tool-name", text: t.name }),
      t.id ? el("span", { class: "tool-id muted small", text: t.id }) : "",
    ),
    el("pre", {}, el("code", { class: "tool-arguments", text: args })),
  );
}

/** Code blocks: a language label and a Copy button. */
function decorateCode(root: HTMLElement): void {
  for (const pre of root.querySelectorAll("pre")) {
    const code = pre.querySelector("code");
    const lang = /(?:^|\s)language-(\S+)/.exec(code?.className ?? "")?.[1] ?? "";
    const b = el("button", { type: "button", class: "copy-code small-button", text: "Copy", "aria-label": `Copy code${lang ? ` (${lang})` : ""}` });
    b.addEventListener("click", () => copyText(code?.textContent ?? pre.textContent ?? "", b, "Copy"));
    const bar = el("div", { class: "code-bar" }, el("span", { class: "code-lang", text: lang || "code" }), b);
    const wrap = el("div", { class: "code-block" });
    pre.replaceWith(wrap);
    wrap.append(bar, pre);
  }
}

async function copyText(text: string, button: HTMLButtonElement, label: string): Promise<void> {
  let ok = false;
  try {
    await navigator.clipboard.writeText(text);
    ok = true;
  } catch {
    // No Clipboard API (a page served over plain http to another host is not a secure context):
    // the older way, through a selection.
    const ta = el("textarea", { class: "visually-hidden", "aria-hidden": "true", tabindex: "-1" });
    ta.value = text;
    document.body.append(ta);
    ta.select();
    try {
      ok = document.execCommand("copy");
    } catch {
      ok = false;
    }
    ta.remove();
    button.focus();
  }
  button.textContent = ok ? "Copied" : "Copy failed";
  announce(ok ? "Copied to the clipboard" : "Could not copy: the browser refused");
  setTimeout(() => (button.textContent = label), 1500);
}

function statsNodes(s: ReplyStats): (Node | string)[] {
  const parts: Node[] = [];
  const add = (...n: (Node | string)[]) => parts.push(el("span", { class: "stat" }, ...n));
  add(`${s.tokens} token${s.tokens === 1 ? "" : "s"}`);
  if (s.tps !== null) add(`${s.tps.toFixed(1)} tok/s`);
  if (s.ttftMs !== null) add(el("abbr", { title: "time to first token", text: "TTFT" }), ` ${(s.ttftMs / 1000).toFixed(2)} s`);
  if (typeof s.promptTokens === "number") add(`prompt ${s.promptTokens}${typeof s.cachedTokens === "number" ? ` (${s.cachedTokens} cached)` : ""}`);
  add(FINISH[s.finish] ?? s.finish);
  const out: (Node | string)[] = [];
  parts.forEach((p, i) => out.push(...(i ? [" · ", p] : [p])));
  return out;
}

const FINISH: Record<string, string> = { stop: "finished", length: "hit max tokens", tool_calls: "called a tool", stopped: "stopped", error: "failed" };

function statsSentence(s: ReplyStats): string {
  const parts = [`${s.tokens} token${s.tokens === 1 ? "" : "s"}`];
  if (s.tps !== null) parts.push(`${s.tps.toFixed(1)} tokens per second`);
  if (s.ttftMs !== null) parts.push(`first token after ${(s.ttftMs / 1000).toFixed(2)} s`);
  if (typeof s.cachedTokens === "number") parts.push(`${s.cachedTokens} prompt tokens from the cache`);
  parts.push(FINISH[s.finish] ?? s.finish);
  return parts.join(", ");
}

let autoScroll = true;
ui.messages.addEventListener("scroll", () => {
  const m = ui.messages;
  autoScroll = m.scrollHeight - m.scrollTop - m.clientHeight < 48;
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

// ---------- branches: versions, edit, regenerate ----------

function showVersion(c: Conversation, m: Message, step: number): void {
  if (streamOf(c)) return;
  const shown = switchVersion(c, m, step);
  if (!shown) return;
  persist();
  renderConversation(true);
  const sibs = siblingsOf(c, shown);
  announce(`Version ${sibs.indexOf(shown) + 1} of ${sibs.length}`);
  // Keep the focus on the arrow that was pressed (its article was rebuilt).
  const art = ui.messages.querySelector<HTMLElement>(`[data-id="${CSS.escape(shown.id)}"]`);
  const btn = art?.querySelector<HTMLButtonElement>(step < 0 ? ".version-prev" : ".version-next");
  (btn && !btn.disabled ? btn : art?.querySelector<HTMLButtonElement>(".versions button:not(:disabled)"))?.focus();
}

function startEdit(m: Message): void {
  if (streamOf(state.current)) return;
  state.editing = m.id;
  renderConversation(true);
}

function fillEditor(m: Message, v: View): void {
  const id = `edit-${m.id}`;
  const ta = el("textarea", { id, class: "edit-text", rows: "3" });
  ta.value = m.content;
  const cancel = el("button", { type: "button", class: "small-button", text: "Cancel" });
  const form = el(
    "form",
    { class: "edit-form" },
    el("label", { for: id, class: "visually-hidden", text: "Edit message" }),
    ta,
    el("div", { class: "edit-actions" }, cancel, el("button", { type: "submit", class: "primary small-button", text: "Save and send" })),
  );
  const stop = () => {
    state.editing = null;
    renderConversation(true);
    ui.messages.querySelector<HTMLElement>(`[data-id="${CSS.escape(m.id)}"] .action-edit`)?.focus();
  };
  cancel.addEventListener("click", stop);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const text = ta.value;
    if ((!text.trim() && !m.images?.length) || !state.current || !settingsOk()) return;
    state.editing = null;
    const c = state.current;
    const user = addMessage(c, m.parent, "user", text);
    // The new version keeps the images of the one edited.
    if (m.images?.length) user.images = m.images.map((i) => ({ ...i }));
    void startReply(c, user);
  });
  ta.addEventListener("keydown", (e) => {
    if (e.key === "Escape") {
      e.preventDefault();
      e.stopPropagation();
      stop();
    } else if (e.key === "Enter" && !e.shiftKey && !e.isComposing && e.keyCode !== 229) {
      e.preventDefault();
      form.requestSubmit();
    }
  });
  v.body.replaceChildren(form);
  v.reasoning.hidden = true;
  v.tools.hidden = true;
  v.error.hidden = true;
  v.stats.hidden = true;
  v.article.classList.add("editing");
  queueMicrotask(() => {
    ta.focus();
    ta.setSelectionRange(ta.value.length, ta.value.length);
  });
}

function regenerate(c: Conversation, m: Message): void {
  if (streamOf(c) || !m.parent || !settingsOk()) return;
  const parent = c.messages.find((x) => x.id === m.parent);
  if (parent) void startReply(c, parent);
}

// ---------- sending and streaming ----------

/** Send, Stop and the branch controls follow whether the conversation shown has a reply streaming. */
function refreshControls(): void {
  const busy = !!streamOf(state.current);
  ui.send.disabled = busy;
  ui.stop.disabled = !busy;
  ui.composer.setAttribute("aria-busy", String(busy));
  for (const b of ui.messages.querySelectorAll<HTMLButtonElement>(".needs-idle, .versions button")) {
    if (busy) b.disabled = true;
    else if (b.classList.contains("needs-idle")) b.disabled = false;
  }
  if (!busy) {
    // version arrows: disabled only at the ends
    for (const g of ui.messages.querySelectorAll<HTMLElement>(".versions")) {
      const i = Number(g.dataset.index);
      (g.querySelector(".version-prev") as HTMLButtonElement).disabled = i === 0;
      (g.querySelector(".version-next") as HTMLButtonElement).disabled = i === Number(g.dataset.count) - 1;
    }
  }
}

async function submitPrompt(): Promise<void> {
  const text = ui.prompt.value;
  const images = state.pending;
  if ((!text.trim() && !images.length) || streamOf(state.current)) return;
  if (!settingsOk()) return;
  showError(null);
  let conv = state.current;
  if (!conv) {
    conv = { id: newId(), title: titleFor([{ role: "user", content: text, images }]), created: Date.now(), updated: Date.now(), messages: [], leaf: null };
    state.conversations.push(conv);
    state.current = conv;
    saveCurrentId(store, conv.id);
  }
  const user = addMessage(conv, conv.leaf, "user", text);
  if (images.length) {
    user.images = images;
    if (conv.messages.length === 1 && !conv.renamed) conv.title = titleFor([user]);
    state.pending = [];
    renderAttachments();
  }
  ui.prompt.value = "";
  fitPrompt();
  await startReply(conv, user);
}

/** Write a new reply after `parent` (a user message), in a new branch when it already has one. */
async function startReply(conv: Conversation, parent: Message): Promise<void> {
  showError(null);
  setLeaf(conv, parent.id);
  const history = apiMessages(pathOf(conv), state.settings.systemPrompt);
  const reply = addMessage(conv, parent.id, "assistant", "");
  const controller = new AbortController();
  const s: Stream = { controller, conv, message: reply, frame: 0 };
  state.streams.set(conv.id, s);
  if (conv === state.current) renderConversation();
  renderList();
  persist();
  scheduleHealth();
  void refreshHealth();
  announce("The assistant is replying…");

  const acc = new ReplyAccumulator(performance.now());
  let finish: string | null = null;
  const paint = () => {
    s.frame = 0;
    if (!views.get(reply)?.article.isConnected) return; // another conversation is shown
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
    await readChatStream(res.body, (c) => {
      if (!acc.apply(c, performance.now())) return;
      reply.content = acc.content;
      if (acc.reasoning) reply.reasoning = acc.reasoning;
      if (acc.toolCalls.length) reply.toolCalls = acc.toolCalls.map((t) => ({ ...t }));
      s.frame ||= requestAnimationFrame(paint);
    });
  } catch (e) {
    if (controller.signal.aborted) finish = "stopped";
    else {
      finish = "error";
      reply.error = (e as Error).message || String(e);
    }
  } finally {
    if (s.frame) cancelAnimationFrame(s.frame);
    reply.content = acc.content;
    if (acc.reasoning) reply.reasoning = acc.reasoning;
    if (acc.toolCalls.length) reply.toolCalls = acc.toolCalls.map((t) => ({ ...t }));
    reply.stats = acc.stats(performance.now(), finish);
    conv.updated = Date.now();
    state.streams.delete(conv.id);
    const v = views.get(reply);
    if (v?.article.isConnected) {
      v.article.classList.remove("streaming");
      fillMessage(reply, true);
      v.article.setAttribute("aria-busy", "false");
    }
    persist();
    renderList();
    const shown = conv === state.current;
    if (shown) {
      refreshControls();
      scrollToEnd();
      if (reply.error) showError(reply.error);
    }
    const where = shown ? "" : ` in “${conv.title}”`;
    announce(finish === "error" ? `The reply${where} failed: ${reply.error}` : `Reply${where}: ${statsSentence(reply.stats)}.`);
    void refreshHealth();
    scheduleHealth();
    if (shown && (document.activeElement === ui.stop || document.activeElement === document.body)) ui.prompt.focus();
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
    setPanel("settings", true, false);
    ui.apiKey.focus();
  }
  return msg;
}

function stopReply(): boolean {
  const s = streamOf(state.current);
  s?.controller.abort();
  return !!s;
}

/** The message box grows with its text, up to a third of the window. */
function fitPrompt(): void {
  const p = ui.prompt;
  p.style.height = "auto";
  p.style.height = `${Math.min(p.scrollHeight + 2, Math.max(96, window.innerHeight / 3))}px`;
}

// ---------- images: attach (file picker), paste, drop ----------

/** The largest image file taken: its data: URL (a third larger) must fit the server's 16 MB request body. */
const MAX_IMAGE_BYTES = 10 * 1024 * 1024;
const MAX_IMAGES = 8;

function setVision(on: boolean): void {
  if (state.vision === on) return;
  state.vision = on;
  ui.attach.hidden = !on;
  ui.imageHint.hidden = !on;
}

function readDataUrl(file: File): Promise<string> {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => (typeof r.result === "string" ? resolve(r.result) : reject(new Error("not read as a data URL")));
    r.onerror = () => reject(r.error ?? new Error("could not be read"));
    r.readAsDataURL(file);
  });
}

/** Attach image files to the message being written; anything else is refused with a message. */
async function attachFiles(files: File[]): Promise<void> {
  if (!files.length) return;
  if (!state.vision) {
    showError(`Not attached: the model “${state.modelId}” takes no images.`);
    return;
  }
  const refused: string[] = [];
  let added = 0;
  for (const f of files) {
    const name = f.name || "pasted image";
    if (!f.type.startsWith("image/")) {
      refused.push(`“${name}” is not an image${f.type ? ` (${f.type})` : ""}`);
      continue;
    }
    if (f.size > MAX_IMAGE_BYTES) {
      refused.push(`“${name}” is ${sizeText(f.size)}, more than the limit of ${sizeText(MAX_IMAGE_BYTES)}`);
      continue;
    }
    if (state.pending.length >= MAX_IMAGES) {
      refused.push(`at most ${MAX_IMAGES} images go with one message`);
      break;
    }
    let url: string;
    try {
      url = await readDataUrl(f);
    } catch (e) {
      refused.push(`“${name}” could not be read (${(e as Error).message})`);
      continue;
    }
    if (!IMAGE_DATA_URL.test(url)) {
      refused.push(`“${name}” could not be read as an image`);
      continue;
    }
    state.pending.push({ name, bytes: f.size, url });
    added++;
  }
  renderAttachments();
  showError(refused.length ? `Not attached: ${refused.join("; ")}.` : null);
  if (added) {
    const big = state.pending.some((i) => (i.url?.length ?? 0) > STORED_IMAGE_MAX_CHARS);
    announce(
      `${added} image${added === 1 ? "" : "s"} attached${big ? " (an image over about 750 KB is sent, but not kept with the conversation after a reload)" : ""}`,
    );
  }
}

/** Thumbnails of the images to send, each with a Remove button. */
function renderAttachments(): void {
  ui.attachments.replaceChildren(
    ...state.pending.map((img) => {
      const remove = el(
        "button",
        { type: "button", class: "icon-button attachment-remove", "aria-label": `Remove image: ${img.name}`, title: "Remove" },
        el("span", { "aria-hidden": "true", text: "×" }),
      );
      remove.addEventListener("click", () => {
        const i = state.pending.indexOf(img);
        if (i >= 0) state.pending.splice(i, 1);
        renderAttachments();
        announce(`Removed image “${img.name}”`);
        const buttons = ui.attachments.querySelectorAll<HTMLButtonElement>(".attachment-remove");
        (buttons[Math.min(i, buttons.length - 1)] ?? ui.prompt).focus();
      });
      return el("li", { class: "attachment" }, el("img", { class: "attachment-thumb", src: img.url ?? "", alt: img.name, title: img.name }), remove);
    }),
  );
  ui.attachments.hidden = state.pending.length === 0;
  // A message may be images alone.
  ui.prompt.required = state.pending.length === 0;
}

ui.attach.addEventListener("click", () => ui.attachFile.click());
ui.attachFile.addEventListener("change", () => {
  const files = [...(ui.attachFile.files ?? [])];
  ui.attachFile.value = "";
  void attachFiles(files).then(() => ui.prompt.focus());
});
ui.prompt.addEventListener("paste", (e) => {
  const files = [...(e.clipboardData?.files ?? [])];
  if (!files.length) return; // text: pasted as usual
  e.preventDefault();
  void attachFiles(files);
});
const draggingFiles = (e: DragEvent) => !!e.dataTransfer && [...e.dataTransfer.types].includes("Files");
ui.composerBox.addEventListener("dragover", (e) => {
  if (!draggingFiles(e)) return;
  e.preventDefault();
  e.dataTransfer!.dropEffect = "copy";
  ui.composerBox.classList.add("dragging");
});
ui.composerBox.addEventListener("dragleave", (e) => {
  if (!(e.relatedTarget instanceof Node && ui.composerBox.contains(e.relatedTarget))) ui.composerBox.classList.remove("dragging");
});
ui.composerBox.addEventListener("drop", (e) => {
  if (!draggingFiles(e)) return;
  e.preventDefault();
  ui.composerBox.classList.remove("dragging");
  void attachFiles([...e.dataTransfer!.files]);
});
// A file dropped anywhere else would make the browser open it, leaving the chat.
for (const type of ["dragover", "drop"] as const) {
  document.addEventListener(type, (e) => {
    if (!e.defaultPrevented && draggingFiles(e)) {
      e.preventDefault();
      e.dataTransfer!.dropEffect = "none";
    }
  });
}

ui.composer.addEventListener("submit", (e) => {
  e.preventDefault();
  void submitPrompt();
});
ui.prompt.addEventListener("input", fitPrompt);
ui.prompt.addEventListener("keydown", (e) => {
  // Enter sends; Shift+Enter is a new line; an IME composing text keeps its Enter.
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing && e.keyCode !== 229) {
    e.preventDefault();
    if (!streamOf(state.current)) ui.composer.requestSubmit();
  }
});
ui.stop.addEventListener("click", () => {
  stopReply();
  ui.prompt.focus();
});
ui.newChat.addEventListener("click", newConversation);
document.addEventListener("keydown", (e) => {
  if (e.key !== "Escape" || e.defaultPrevented) return;
  // Escape closes a panel over the chat first, then stops the reply being written.
  if (closeOverlays() || stopReply()) e.preventDefault();
});
window.addEventListener("pagehide", () => {
  if (state.streams.size) persist();
});

// Code highlighting and TeX load on first need: render the messages shown again with them.
onRenderersLoaded(() => {
  const c = state.current;
  if (!c) return;
  for (const m of pathOf(c)) if (m.role === "assistant" && state.editing !== m.id) fillMessage(m, streamOf(c)?.message !== m);
});

// ---------- start ----------

buildSettingsForm();
showSettings(state.settings);
readSettings();
ui.apiKey.value = sessionStorage.getItem(API_KEY_SLOT) ?? "";
state.open = isNarrow() ? { sidebar: false, settings: false } : { ...state.layout };
applyLayout();
openConversation(loadCurrentId(store));
void refreshHealth();
scheduleHealth();
fitPrompt();
ui.prompt.focus();
document.documentElement.dataset.ready = "true";
performance.mark("mlx-bun:ready");

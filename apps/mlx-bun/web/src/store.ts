// Conversations and settings kept in localStorage (they survive a reload), and exported/imported
// as JSON files. What is read back, from storage or a file, is checked field by field: a stored
// value is data, never trusted markup or code. No DOM types: unit-tested outside the browser.
//
// A conversation is a tree: editing a user message or regenerating a reply adds a sibling (a new
// branch) instead of overwriting. `leaf` names the last message of the branch shown; the path is
// read from it up through `parent`. Each message remembers the child last shown under it
// (`selected`), so switching back to a branch returns to where it was.
import { DEFAULT_SETTINGS, NUMBER_FIELDS, type Settings } from "./settings.ts";

export { DEFAULT_SETTINGS, type Settings } from "./settings.ts";

export type Role = "system" | "user" | "assistant";

export interface ReplyStats {
  /** Milliseconds from sending to the first token (reasoning, text or tool call). */
  ttftMs: number | null;
  /** Tokens generated (the server's usage count when it sent one). */
  tokens: number;
  /** Decode speed: tokens after the first, per second. */
  tps: number | null;
  /** "stop" / "length" / "tool_calls" from the server, "stopped" when the user pressed Stop, "error". */
  finish: string;
  /** usage.prompt_tokens. */
  promptTokens?: number | null;
  /** usage.prompt_tokens_details.cached_tokens: prompt tokens the server's cache already held. */
  cachedTokens?: number | null;
  /** How long the model reasoned (first reasoning delta to the first answer delta). */
  reasoningMs?: number | null;
}

/** A tool call as the server returned it (`tool_calls[i]`; arguments is a JSON string). */
export interface ToolCall {
  id: string;
  type: string;
  name: string;
  arguments: string;
}

/**
 * An image of a user message, sent as an OpenAI `image_url` part (a data: URL) before its text.
 * `url` is absent when the image was too large to keep in the browser's storage: the message
 * then shows a note in its place, and the image is no longer sent.
 */
export interface ChatImage {
  name: string;
  /** The file's size in bytes. */
  bytes: number;
  /** `data:image/…;base64,…` */
  url?: string;
}

/** The largest image (its data: URL's length) kept in stored conversations; larger ones are dropped from storage, with a note. */
export const STORED_IMAGE_MAX_CHARS = 1024 * 1024;

/** A data: URL of an image, in base64: the only image URL the page sends, shows or reads back. */
export const IMAGE_DATA_URL = /^data:image\/[a-z0-9.+-]+;base64,[a-z0-9+/]*={0,2}$/i;

export interface Message {
  id: string;
  /** The message this one follows; null for the first turn. */
  parent: string | null;
  role: Role;
  content: string;
  /** Images of a user message (sent before its text). */
  images?: ChatImage[];
  /** The model's reasoning (`reasoning_content`). */
  reasoning?: string;
  toolCalls?: ToolCall[];
  stats?: ReplyStats;
  /** Why a reply failed (shown under its content). */
  error?: string;
  created: number;
  /** The child last shown under this message. */
  selected?: string;
}

export interface Conversation {
  id: string;
  title: string;
  /** The title was set by hand (rename): it no longer follows the first message. */
  renamed?: boolean;
  created: number;
  updated: number;
  /** Every message of every branch, parents before their children. */
  messages: Message[];
  /** The last message of the branch shown (null: empty). */
  leaf: string | null;
}

/** The part of Web Storage used here. */
export interface KeyValueStore {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
  removeItem(key: string): void;
}

// The keys kept their ".v1" names: conversations saved before branches existed (a flat list of
// messages without ids) are read as one branch.
export const KEYS = {
  conversations: "mlx-bun.chat.conversations.v1",
  current: "mlx-bun.chat.current.v1",
  settings: "mlx-bun.chat.settings.v1",
  layout: "mlx-bun.chat.layout.v1",
} as const;

const isObj = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);
const num = (v: unknown): number | null => (typeof v === "number" && Number.isFinite(v) ? v : null);
const optNum = (v: unknown): number | null | undefined => (v === undefined ? undefined : num(v));

function readJson(store: KeyValueStore, key: string): unknown {
  try {
    const s = store.getItem(key);
    return s === null ? null : JSON.parse(s);
  } catch {
    return null;
  }
}

function toStats(v: unknown): ReplyStats | undefined {
  if (!isObj(v)) return undefined;
  const s: ReplyStats = { ttftMs: num(v.ttftMs), tokens: num(v.tokens) ?? 0, tps: num(v.tps), finish: typeof v.finish === "string" ? v.finish : "stop" };
  for (const k of ["promptTokens", "cachedTokens", "reasoningMs"] as const) {
    const x = optNum(v[k]);
    if (x !== undefined) s[k] = x;
  }
  return s;
}

function toImage(v: unknown): ChatImage | null {
  if (!isObj(v) || typeof v.name !== "string") return null;
  const img: ChatImage = { name: v.name, bytes: num(v.bytes) ?? 0 };
  if (typeof v.url === "string" && IMAGE_DATA_URL.test(v.url)) img.url = v.url;
  return img;
}

function toToolCall(v: unknown): ToolCall | null {
  if (!isObj(v)) return null;
  const fn = isObj(v.function) ? v.function : v;
  const name = typeof fn.name === "string" ? fn.name : null;
  if (name === null) return null;
  return {
    id: typeof v.id === "string" ? v.id : "",
    type: typeof v.type === "string" ? v.type : "function",
    name,
    arguments: typeof fn.arguments === "string" ? fn.arguments : fn.arguments === undefined ? "" : JSON.stringify(fn.arguments),
  };
}

/** One stored message; `fallback` supplies id/parent for the flat lists saved before branches. */
function toMessage(v: unknown, fallback: { id: string; parent: string | null; created: number }): Message | null {
  if (!isObj(v) || typeof v.content !== "string") return null;
  if (v.role !== "user" && v.role !== "assistant" && v.role !== "system") return null;
  const hasTree = typeof v.id === "string" && v.id !== "";
  const m: Message = {
    id: hasTree ? (v.id as string) : fallback.id,
    parent: hasTree ? (typeof v.parent === "string" ? v.parent : null) : fallback.parent,
    role: v.role,
    content: v.content,
    created: num(v.created) ?? fallback.created,
  };
  if (typeof v.reasoning === "string" && v.reasoning) m.reasoning = v.reasoning;
  if (m.role === "user" && Array.isArray(v.images)) {
    const images = v.images.map(toImage).filter((x): x is ChatImage => x !== null);
    if (images.length) m.images = images;
  }
  if (Array.isArray(v.toolCalls)) {
    const calls = v.toolCalls.map(toToolCall).filter((c): c is ToolCall => c !== null);
    if (calls.length) m.toolCalls = calls;
  }
  const stats = toStats(v.stats);
  if (stats) m.stats = stats;
  if (typeof v.error === "string") m.error = v.error;
  if (typeof v.selected === "string") m.selected = v.selected;
  return m;
}

/** A stored or imported conversation, checked; null when it is not one. */
export function toConversation(v: unknown): Conversation | null {
  if (!isObj(v) || typeof v.id !== "string" || !v.id || !Array.isArray(v.messages)) return null;
  const created = num(v.created) ?? 0;
  // Parents must come before their children (so there is no cycle); a message whose parent is
  // unknown is dropped, with its descendants.
  const byId = new Map<string, Message>();
  let prev: string | null = null;
  v.messages.forEach((raw, i) => {
    const m = toMessage(raw, { id: `m${i}`, parent: prev, created });
    if (!m || byId.has(m.id) || (m.parent !== null && !byId.has(m.parent))) return;
    byId.set(m.id, m);
    prev = m.id;
  });
  const messages = [...byId.values()];
  for (const m of messages) if (m.selected && byId.get(m.selected)?.parent !== m.id) delete m.selected;
  const leaf = typeof v.leaf === "string" && byId.has(v.leaf) ? v.leaf : (messages.at(-1)?.id ?? null);
  const c: Conversation = { id: v.id, title: "", created, updated: num(v.updated) ?? created, messages, leaf };
  const renamed = v.renamed === true && typeof v.title === "string" && v.title.trim() !== "";
  if (renamed) c.renamed = true;
  c.title = renamed || (typeof v.title === "string" && v.title.trim()) ? (v.title as string) : titleFor(pathOf(c));
  return c;
}

/** Checked conversations, duplicates (by id) dropped, most recent first. */
export function toConversations(list: unknown[]): Conversation[] {
  const seen = new Set<string>();
  const out: Conversation[] = [];
  for (const c of list.map(toConversation)) {
    if (c && !seen.has(c.id)) {
      seen.add(c.id);
      out.push(c);
    }
  }
  return sortConversations(out);
}

export function loadConversations(store: KeyValueStore): Conversation[] {
  const v = readJson(store, KEYS.conversations);
  return Array.isArray(v) ? toConversations(v) : [];
}

/** Most recently updated first. */
export function sortConversations(list: Conversation[]): Conversation[] {
  return [...list].sort((a, b) => b.updated - a.updated);
}

/** The JSON of conversations, each image's data dropped when it is over `maxImageChars` (the conversations in memory keep theirs). */
function conversationsJson(list: Conversation[], maxImageChars: number): string {
  return JSON.stringify(list, (key, value: unknown) => {
    if (key !== "images" || !Array.isArray(value)) return value;
    return value.map((img: ChatImage) => (img.url && img.url.length > maxImageChars ? { name: img.name, bytes: img.bytes } : img));
  });
}

/**
 * Save the conversations that have at least one message. Images larger than
 * STORED_IMAGE_MAX_CHARS are not kept (localStorage holds a few MB per site); when the rest does not
 * fit either, every image is dropped from storage and the text is kept ("without-images").
 * false: storage refused even that (full, or disabled).
 */
export function saveConversations(store: KeyValueStore, list: Conversation[]): true | "without-images" | false {
  const saved = list.filter((c) => c.messages.length > 0);
  try {
    store.setItem(KEYS.conversations, conversationsJson(saved, STORED_IMAGE_MAX_CHARS));
    return true;
  } catch {
    // retried below without the images
  }
  if (!saved.some((c) => c.messages.some((m) => m.images?.some((i) => i.url)))) return false;
  try {
    store.setItem(KEYS.conversations, conversationsJson(saved, 0));
    return "without-images";
  } catch {
    return false;
  }
}

export function loadCurrentId(store: KeyValueStore): string | null {
  try {
    return store.getItem(KEYS.current);
  } catch {
    return null;
  }
}

export function saveCurrentId(store: KeyValueStore, id: string | null): void {
  try {
    if (id === null) store.removeItem(KEYS.current);
    else store.setItem(KEYS.current, id);
  } catch {
    // storage disabled: the page still works, without memory
  }
}

export function loadSettings(store: KeyValueStore): Settings {
  const v = readJson(store, KEYS.settings);
  const s: Settings = { ...DEFAULT_SETTINGS };
  if (!isObj(v)) return s;
  for (const f of NUMBER_FIELDS) {
    const x = num(v[f.key]);
    s[f.key] = x !== null && (!f.integer || Number.isSafeInteger(x)) && (f.min === undefined || x >= f.min) && (f.max === undefined || x <= f.max) ? x : null;
  }
  if (typeof v.stop === "string") s.stop = v.stop;
  if (typeof v.systemPrompt === "string") s.systemPrompt = v.systemPrompt;
  return s;
}

export function saveSettings(store: KeyValueStore, s: Settings): void {
  try {
    store.setItem(KEYS.settings, JSON.stringify(s));
  } catch {
    // as above
  }
}

export interface Layout {
  /** The conversation list beside the chat on a wide screen (a narrow one always starts with it closed). */
  sidebar: boolean;
  /** The settings panel beside the chat on a wide screen. */
  settings: boolean;
}

export function loadLayout(store: KeyValueStore): Layout {
  const v = readJson(store, KEYS.layout);
  return { sidebar: isObj(v) && typeof v.sidebar === "boolean" ? v.sidebar : true, settings: isObj(v) && typeof v.settings === "boolean" ? v.settings : false };
}

export function saveLayout(store: KeyValueStore, l: Layout): void {
  try {
    store.setItem(KEYS.layout, JSON.stringify(l));
  } catch {
    // as above
  }
}

// ---------- the tree ----------

/** The messages of the branch shown, first to last. */
export function pathOf(c: Conversation): Message[] {
  const byId = new Map(c.messages.map((m) => [m.id, m]));
  const out: Message[] = [];
  let m = c.leaf === null ? undefined : byId.get(c.leaf);
  while (m && out.length <= c.messages.length) {
    out.push(m);
    m = m.parent === null ? undefined : byId.get(m.parent);
  }
  return out.reverse();
}

/** The versions of a message: the messages with its parent, oldest first (itself included). */
export function siblingsOf(c: Conversation, m: Message): Message[] {
  return c.messages.filter((x) => x.parent === m.parent && x.role === m.role);
}

/** Show the branch that ends at `id` (and remember, at each fork, which way it went). */
export function setLeaf(c: Conversation, id: string | null): void {
  c.leaf = id;
  const path = pathOf(c);
  for (let i = 0; i + 1 < path.length; i++) path[i]!.selected = path[i + 1]!.id;
}

/** From `m` down to the end of the branch last shown under it (else the newest). */
export function branchEnd(c: Conversation, m: Message): string {
  let cur = m;
  for (let guard = 0; guard <= c.messages.length; guard++) {
    const kids = c.messages.filter((x) => x.parent === cur.id);
    if (!kids.length) break;
    cur = kids.find((k) => k.id === cur.selected) ?? kids.at(-1)!;
  }
  return cur.id;
}

/** Show another version of `m` (step -1: the previous one, +1: the next). Returns it, or null. */
export function switchVersion(c: Conversation, m: Message, step: number): Message | null {
  const sibs = siblingsOf(c, m);
  const next = sibs[sibs.indexOf(m) + step];
  if (!next) return null;
  setLeaf(c, branchEnd(c, next));
  return next;
}

/** Add a message after `parent` and show it. */
export function addMessage(c: Conversation, parent: string | null, role: Role, content: string, newIdFn: () => string = newId): Message {
  const m: Message = { id: newIdFn(), parent, role, content, created: Date.now() };
  c.messages.push(m);
  setLeaf(c, m.id);
  c.updated = Date.now();
  // Named after its first message; later edits make branches but keep the name.
  if (c.messages.length === 1 && !c.renamed) c.title = titleFor([m]);
  return m;
}

/** A conversation's title: the start of its first user message (or its first image's name). */
export function titleFor(messages: (Pick<Message, "role" | "content"> & { images?: ChatImage[] })[]): string {
  const user = messages.find((m) => m.role === "user");
  const first = user?.content.replace(/\s+/g, " ").trim() || (user?.images?.length ? `Image: ${user.images[0]!.name}` : "");
  if (!first) return "New conversation";
  return first.length > 60 ? `${first.slice(0, 57)}…` : first;
}

/**
 * The messages to send: the system prompt, then the turns. A failed or empty reply is left out
 * together with the user turn it answered, so the roles keep alternating as chat templates require.
 * A user message with images is a list of parts: its images (image_url, data: URLs), then its text.
 * Reasoning is not sent back (as OpenAI-style clients do); a reply that only called tools is sent
 * as its calls, described in text (the page runs no tools, so there is no tool result to pair).
 */
export function apiMessages(messages: (Pick<Message, "role" | "content" | "toolCalls"> & { images?: ChatImage[] })[], systemPrompt: string): ApiMessage[] {
  const out: ApiMessage[] = [];
  if (systemPrompt.trim()) out.push({ role: "system", content: systemPrompt });
  for (const m of messages) {
    if (m.role === "system") continue;
    let content = m.content;
    if (m.role === "assistant" && !content && m.toolCalls?.length) content = m.toolCalls.map((t) => `(called ${t.name} with ${t.arguments})`).join("\n");
    if (m.role === "assistant" && !content) {
      if (out.at(-1)?.role === "user") out.pop();
      continue;
    }
    // A user message's images go first, as image_url parts (the ones not kept in storage are gone).
    const urls = m.role === "user" ? (m.images ?? []).flatMap((i) => (i.url ? [i.url] : [])) : [];
    if (urls.length) {
      const parts: ContentPart[] = urls.map((url) => ({ type: "image_url", image_url: { url } }));
      if (content) parts.push({ type: "text", text: content });
      out.push({ role: m.role, content: parts });
    } else out.push({ role: m.role, content });
  }
  return out;
}

export type ContentPart = { type: "image_url"; image_url: { url: string } } | { type: "text"; text: string };
export interface ApiMessage {
  role: Role;
  content: string | ContentPart[];
}

/** Conversations whose title or any message (any branch) holds every word of `query`, case-insensitive. */
export function searchConversations(list: Conversation[], query: string): Conversation[] {
  const words = query.toLowerCase().split(/\s+/).filter(Boolean);
  if (!words.length) return list;
  return list.filter((c) => {
    const text = [c.title, ...c.messages.map((m) => m.content)].join("\n").toLowerCase();
    return words.every((w) => text.includes(w));
  });
}

// ---------- export / import ----------

export const EXPORT_FORMAT = "mlx-bun.chat";

/** The JSON of an export file. */
export function exportJson(list: Conversation[], now = new Date()): string {
  return JSON.stringify({ format: EXPORT_FORMAT, version: 2, exported: now.toISOString(), conversations: list.filter((c) => c.messages.length > 0) }, null, 2);
}

/** An export file's text → its conversations (checked as stored ones are). Throws with a message a person can act on. */
export function parseImport(text: string): Conversation[] {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    throw new Error("the file is not JSON");
  }
  const raw = Array.isArray(v) ? v : isObj(v) && Array.isArray(v.conversations) ? v.conversations : isObj(v) && Array.isArray(v.messages) ? [v] : null;
  if (!raw) throw new Error("the file holds no conversations (expected an mlx-bun chat export)");
  const list = toConversations(raw).filter((c) => c.messages.length > 0);
  if (!list.length) throw new Error("none of the file's conversations could be read");
  return list;
}

/**
 * Add imported conversations: one already here with the same id and the same content is skipped;
 * one that differs is added as a copy with a new id (nothing here is overwritten).
 */
export function mergeImported(
  existing: Conversation[],
  imported: Conversation[],
  newIdFn: () => string = newId,
): { list: Conversation[]; added: number; skipped: number } {
  const byId = new Map(existing.map((c) => [c.id, c]));
  const out = [...existing];
  let added = 0;
  let skipped = 0;
  for (const c of imported) {
    const same = byId.get(c.id);
    if (same && JSON.stringify(same.messages) === JSON.stringify(c.messages)) {
      skipped++;
      continue;
    }
    const copy = same ? { ...c, id: newIdFn() } : c;
    byId.set(copy.id, copy);
    out.push(copy);
    added++;
  }
  return { list: sortConversations(out), added, skipped };
}

export function newId(): string {
  const c = (globalThis as { crypto?: { randomUUID?: () => string } }).crypto;
  return c?.randomUUID ? c.randomUUID() : `${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
}

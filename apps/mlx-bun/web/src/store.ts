// Conversations and settings kept in localStorage (they survive a reload). What is read back is
// checked field by field: a stored value is data, never trusted markup or code. No DOM types.

export type Role = "system" | "user" | "assistant";

export interface ReplyStats {
  /** Milliseconds from sending to the first token. */
  ttftMs: number | null;
  /** Tokens generated (the server's usage count when it sent one). */
  tokens: number;
  /** Decode speed: tokens after the first, per second. */
  tps: number | null;
  /** "stop" / "length" from the server, "stopped" when the user pressed Stop, "error". */
  finish: string;
}

export interface Message {
  role: Role;
  content: string;
  stats?: ReplyStats;
  /** Why a reply failed (shown in place of content). */
  error?: string;
}

export interface Conversation {
  id: string;
  title: string;
  created: number;
  updated: number;
  messages: Message[];
}

export interface Settings {
  /** null: the server's default. */
  temperature: number | null;
  topP: number | null;
  maxTokens: number | null;
  systemPrompt: string;
}

/** The part of Web Storage used here. */
export interface KeyValueStore {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
  removeItem(key: string): void;
}

export const KEYS = {
  conversations: "mlx-bun.chat.conversations.v1",
  current: "mlx-bun.chat.current.v1",
  settings: "mlx-bun.chat.settings.v1",
} as const;

export const DEFAULT_SETTINGS: Settings = { temperature: null, topP: null, maxTokens: null, systemPrompt: "" };

const isObj = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);
const num = (v: unknown): number | null => (typeof v === "number" && Number.isFinite(v) ? v : null);

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
  return { ttftMs: num(v.ttftMs), tokens: num(v.tokens) ?? 0, tps: num(v.tps), finish: typeof v.finish === "string" ? v.finish : "stop" };
}

function toMessage(v: unknown): Message | null {
  if (!isObj(v) || typeof v.content !== "string") return null;
  if (v.role !== "user" && v.role !== "assistant" && v.role !== "system") return null;
  const m: Message = { role: v.role, content: v.content };
  const stats = toStats(v.stats);
  if (stats) m.stats = stats;
  if (typeof v.error === "string") m.error = v.error;
  return m;
}

function toConversation(v: unknown): Conversation | null {
  if (!isObj(v) || typeof v.id !== "string" || !v.id || !Array.isArray(v.messages)) return null;
  const messages = v.messages.map(toMessage).filter((m): m is Message => m !== null);
  const created = num(v.created) ?? 0;
  return {
    id: v.id,
    title: typeof v.title === "string" && v.title.trim() ? v.title : titleFor(messages),
    created,
    updated: num(v.updated) ?? created,
    messages,
  };
}

export function loadConversations(store: KeyValueStore): Conversation[] {
  const v = readJson(store, KEYS.conversations);
  if (!Array.isArray(v)) return [];
  const seen = new Set<string>();
  const out: Conversation[] = [];
  for (const c of v.map(toConversation)) {
    if (c && !seen.has(c.id)) {
      seen.add(c.id);
      out.push(c);
    }
  }
  return sortConversations(out);
}

/** Most recently updated first. */
export function sortConversations(list: Conversation[]): Conversation[] {
  return [...list].sort((a, b) => b.updated - a.updated);
}

/** Save the conversations that have at least one message. Returns false when storage refused (full, or disabled). */
export function saveConversations(store: KeyValueStore, list: Conversation[]): boolean {
  try {
    store.setItem(KEYS.conversations, JSON.stringify(list.filter((c) => c.messages.length > 0)));
    return true;
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
  if (!isObj(v)) return { ...DEFAULT_SETTINGS };
  return {
    temperature: num(v.temperature),
    topP: num(v.topP),
    maxTokens: num(v.maxTokens),
    systemPrompt: typeof v.systemPrompt === "string" ? v.systemPrompt : "",
  };
}

export function saveSettings(store: KeyValueStore, s: Settings): void {
  try {
    store.setItem(KEYS.settings, JSON.stringify(s));
  } catch {
    // as above
  }
}

/** A conversation's title: the start of its first user message. */
export function titleFor(messages: Message[]): string {
  const first = messages.find((m) => m.role === "user")?.content.replace(/\s+/g, " ").trim() ?? "";
  if (!first) return "New conversation";
  return first.length > 60 ? `${first.slice(0, 57)}…` : first;
}

/**
 * The messages to send: the system prompt, then the turns. A failed or empty reply is left out
 * together with the user turn it answered, so the roles keep alternating as chat templates require.
 */
export function apiMessages(messages: Message[], systemPrompt: string): { role: Role; content: string }[] {
  const out: { role: Role; content: string }[] = [];
  if (systemPrompt.trim()) out.push({ role: "system", content: systemPrompt });
  for (const m of messages) {
    if (m.role === "assistant" && !m.content) {
      if (out.at(-1)?.role === "user") out.pop();
      continue;
    }
    if (m.role === "system") continue;
    out.push({ role: m.role, content: m.content });
  }
  return out;
}

/** Request body fields for the settings (absent = the server's default). */
export function samplingFields(s: Settings): Record<string, number> {
  const f: Record<string, number> = {};
  if (s.temperature !== null) f.temperature = s.temperature;
  if (s.topP !== null) f.top_p = s.topP;
  if (s.maxTokens !== null) f.max_tokens = s.maxTokens;
  return f;
}

export function newId(): string {
  const c = (globalThis as { crypto?: { randomUUID?: () => string } }).crypto;
  return c?.randomUUID ? c.randomUUID() : `${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
}

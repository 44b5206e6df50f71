// Prompt token ids the way mlx-lm builds them: mlx_lm.generate (chat template unless
// --ignore-chat-template, optional system prompt) and mlx_lm.server (chat template with tools, or
// convert_chat for a model without one; raw prompts tokenized with the special tokens).
import type { ChatMessage, ChatTemplate, Gemma4Tokenizer } from "@mlx-bun/models";
import { convertChat } from "./server/validate.ts";

/** The parts of a loaded model that prompt building needs. */
export interface PromptModel {
  tokenizer: Gemma4Tokenizer;
  template: ChatTemplate | null;
}

export interface ChatPromptOptions {
  tools?: unknown[] | null;
  /** apply_chat_template kwargs (e.g. {enable_thinking: true}). */
  kwargs?: Record<string, unknown> | null;
  /** mlx_lm.server's role_mapping for a model without a chat template. */
  roleMapping?: Record<string, string> | null;
  /** Time budget of each template render (ms; default the template's own): a TemplateTimeoutError beyond it. */
  timeoutMs?: number;
}

/**
 * Whether the vocabulary has thinking markers, as mlx-lm's _infer_thinking: <think>/</think>,
 * <longcat_think>/</longcat_think>, <|think:start|>/<|think:end|>, or Gemma 4's <|channel>/<channel|>.
 */
export function hasThinking(tok: Gemma4Tokenizer): boolean {
  const pairs = [
    ["<think>", "</think>"],
    ["<longcat_think>", "</longcat_think>"],
    ["<|think:start|>", "<|think:end|>"],
    ["<|channel>", "<channel|>"],
  ];
  return pairs.some(([a, b]) => tok.tokenToId(a!) !== undefined && tok.tokenToId(b!) !== undefined);
}

/**
 * Template kwargs as mlx-lm's TokenizerWrapper.apply_chat_template passes them: enable_thinking
 * defaults to whether the vocabulary has thinking markers (so Gemma 4 prompts open with <|think|>).
 */
export function templateKwargs(tok: Gemma4Tokenizer, kwargs?: Record<string, unknown> | null): Record<string, unknown> {
  return { enable_thinking: hasThinking(tok), ...kwargs };
}

/** A chat turn's prompt: the template with add_generation_prompt, else convert_chat (as mlx_lm.server). */
export function chatPromptIds(m: PromptModel, messages: readonly ChatMessage[], opts: ChatPromptOptions = {}): number[] {
  if (!m.template) return m.tokenizer.encode(convertChat(messages, opts.roleMapping));
  return m.template.apply(m.tokenizer, messages, {
    addGenerationPrompt: true,
    tools: opts.tools ?? null,
    kwargs: templateKwargs(m.tokenizer, opts.kwargs),
    ...(opts.timeoutMs !== undefined ? { timeoutMs: opts.timeoutMs } : {}),
  });
}

/**
 * Where a chat prompt's prefix stays the same in the conversation's next turn, for the prompt
 * cache (mlx_lm.server's prompt segments): the end of the system messages, and the end of the
 * history (the template without the generation prompt, whose tail — `<|turn>model` and any
 * thinking markers — the next turn renders differently). Lengths inside the prompt, ascending.
 */
export function chatPromptCheckpoints(m: PromptModel, messages: readonly ChatMessage[], promptIds: readonly number[], opts: ChatPromptOptions = {}): number[] {
  if (!m.template || messages.length === 0) return [];
  const render = (msgs: readonly ChatMessage[]): number[] =>
    m.template!.apply(m.tokenizer, msgs, {
      addGenerationPrompt: false,
      tools: opts.tools ?? null,
      kwargs: templateKwargs(m.tokenizer, opts.kwargs),
      ...(opts.timeoutMs !== undefined ? { timeoutMs: opts.timeoutMs } : {}),
    });
  const out = new Set<number>();
  const shared = (ids: readonly number[]): number => {
    let i = 0;
    while (i < ids.length && i < promptIds.length && ids[i] === promptIds[i]) i++;
    return i;
  };
  try {
    const system = messages.findIndex((x) => x.role !== "system");
    // As mlx_lm.server: the system messages followed by an empty user turn, up to where they differ.
    if (system > 0) out.add(shared(render([...messages.slice(0, system), { role: "user", content: "" }])));
    if (messages.at(-1)!.role === "user" || messages.at(-1)!.role === "tool") out.add(shared(render(messages)));
  } catch {
    // A template that cannot render the shortened conversation: no checkpoints, no reuse lost beyond them.
  }
  return [...out].filter((c) => c > 0 && c < promptIds.length).sort((a, b) => a - b);
}

/** A raw text prompt (mlx_lm.server /v1/completions; mlx_lm.generate --ignore-chat-template): with <bos>. */
export function rawPromptIds(m: PromptModel, text: string): number[] {
  return m.tokenizer.encode(text, { addSpecialTokens: true });
}

export interface GeneratePromptOptions {
  ignoreChatTemplate?: boolean;
  systemPrompt?: string;
  kwargs?: Record<string, unknown> | null;
}

/**
 * mlx_lm.generate's prompt: with the chat template (and an optional system message) unless
 * ignored or absent, then tokenized without a second <bos>.
 */
export function generatePromptIds(m: PromptModel, text: string, opts: GeneratePromptOptions = {}): number[] {
  if (opts.ignoreChatTemplate || !m.template) return rawPromptIds(m, text);
  const messages: ChatMessage[] = [];
  if (opts.systemPrompt !== undefined) messages.push({ role: "system", content: opts.systemPrompt });
  messages.push({ role: "user", content: text });
  const rendered = m.template.render(messages, { addGenerationPrompt: true, kwargs: templateKwargs(m.tokenizer, opts.kwargs) });
  return m.tokenizer.encode(rendered, { addSpecialTokens: false });
}

/** mlx_lm.generate expands the two-character escapes "\\n" and "\\t" of a --prompt argument. */
export function expandEscapes(prompt: string): string {
  return prompt.replaceAll("\\n", "\n").replaceAll("\\t", "\t");
}

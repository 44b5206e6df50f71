// The checkpoint's chat template (chat_template.jinja, else tokenizer_config.json's chat_template)
// rendered with @huggingface/jinja the way transformers' apply_chat_template renders it
// (tokenization_utils_base.py apply_chat_template, utils/chat_template_utils.py render_jinja_template).
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Interpreter, Template } from "@huggingface/jinja";
import { readJson } from "./config.ts";
import { ConfigError } from "./errors.ts";
import { assertRegularFile } from "./files.ts";
import type { Gemma4Tokenizer } from "./tokenizer.ts";

export interface ChatMessage {
  role: string;
  content?: unknown;
  [key: string]: unknown;
}

export interface ChatTemplateOptions {
  /** Append the model-turn header (Gemma 4: "<|turn>model\n", plus an empty thought channel unless enable_thinking). */
  addGenerationPrompt?: boolean;
  /** Tool JSON schemas ({type: "function", function: {name, description, parameters}}), passed to the template as `tools`. */
  tools?: unknown[] | null;
  documents?: unknown[] | null;
  /** Leave the last message open so the model continues it (transformers' continue_final_message). */
  continueFinalMessage?: boolean;
  /** Extra template variables (e.g. {enable_thinking: true}); they override the special-token variables. */
  kwargs?: Record<string, unknown>;
  /** Time budget of this render in milliseconds (default: the template's renderTimeoutMs); beyond it, a TemplateTimeoutError. */
  timeoutMs?: number;
}

/** A checkpoint that has no chat template at all (neither chat_template.jinja nor tokenizer_config.json's chat_template). */
export class NoChatTemplateError extends ConfigError {
  override name = "NoChatTemplateError";
}

/** A render that ran past its time budget (a template looping for too long). */
export class TemplateTimeoutError extends Error {
  override name = "TemplateTimeoutError";
}

/** Default time budget of one render (ChatTemplate.renderTimeoutMs). */
export const DEFAULT_RENDER_TIMEOUT_MS = 10_000;

/**
 * The most items a template's range() may make, as the sandboxed Jinja2 environment that
 * transformers renders chat templates in (jinja2.sandbox.MAX_RANGE): range() builds its whole
 * list at once, so a huge one would stall the thread and exhaust memory before any time check.
 */
export const MAX_RANGE = 100_000;

function boundedRange(start: number, stop?: number, step = 1): number[] {
  if (stop === undefined) {
    stop = start;
    start = 0;
  }
  if (step === 0) throw new Error("range() step must not be zero");
  const n = step > 0 ? Math.ceil((stop - start) / step) : Math.ceil((start - stop) / -step);
  if (n > MAX_RANGE) throw new Error(`range() of ${n} items is too big: chat templates may make at most ${MAX_RANGE} (Jinja2's sandbox MAX_RANGE)`);
  const out: number[] = [];
  if (step > 0) for (let i = start; i < stop; i += step) out.push(i);
  else for (let i = start; i > stop; i += step) out.push(i);
  return out;
}

const REASONING_FIELDS = ["reasoning_content", "thinking", "reasoning"];
const CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG ";

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** Drop null/undefined keys (transformers' _normalize_chat_messages), deep-copying plain data. */
function plain(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(plain);
  if (isObject(v)) {
    const o: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) if (x !== undefined) o[k] = plain(x);
    return o;
  }
  return v;
}

function normalizeMessages(messages: readonly ChatMessage[]): Record<string, unknown>[] {
  return messages.map((m, i) => {
    if (!isObject(m)) throw new TypeError(`chat message ${i} must be an object, got ${JSON.stringify(m)}`);
    const o: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(m)) if (v !== null && v !== undefined) o[k] = plain(v);
    // _alias_reasoning_fields: fill `thinking` and `reasoning_content` from whichever reasoning field is set.
    const r = REASONING_FIELDS.map((k) => o[k]).find((x) => x !== undefined && x !== null);
    if (r !== undefined) return { thinking: r, ...o, reasoning_content: r };
    return o;
  });
}

// @huggingface/jinja prints `{{ none }}` as "" and `{{ true }}` as "true"; Python's Jinja2 (what
// transformers runs) prints "None" and "True". Gemma 4's official template prints tool-call
// argument values that way (format_argument's last branch), so the block renderer is swapped for
// one with Python's output of these scalars while a template renders (rendering is synchronous).
// Lists and dicts still print as JSON rather than Python repr; a float like 2.0 from JSON prints "2".
type Node = { type: string; value?: string };
type Runtime = { type: string; value: unknown; toString(): string };
interface InterpreterInternals {
  renderBlock(statements: Node[], env: unknown): string;
  renderIf(n: Node, env: unknown): string;
  renderFor(n: Node, env: unknown): string;
  executeSet(n: Node, env: unknown): void;
  evaluate(n: Node, env: unknown): Runtime;
  run(program: unknown): Runtime;
  global: { variables: Map<string, unknown>; set(name: string, value: unknown): unknown };
}
const interpreterProto = Interpreter.prototype as unknown as InterpreterInternals;
const jsRenderBlock = interpreterProto.renderBlock;
const jsEvaluate = interpreterProto.evaluate;
const jsRun = interpreterProto.run;
/** run() with the global range() replaced by boundedRange (the globals are set before any variable could be). */
function boundedRun(this: InterpreterInternals, program: unknown): Runtime {
  this.global.variables.delete("range");
  this.global.set("range", boundedRange);
  return jsRun.call(this, program);
}

// The time budget of the render in progress (rendering is synchronous: one at a time). Every
// expression goes through evaluate() and every loop iteration through renderBlock(), so checking
// the clock there (every 64 calls) bounds any template loop.
let deadline = Number.POSITIVE_INFINITY;
let budgetMs = 0;
let steps = 0;
function tick(): void {
  if ((++steps & 63) === 0 && performance.now() > deadline) {
    throw new TemplateTimeoutError(`rendering the chat template took longer than ${budgetMs} ms (a template loop running too long); the request was not run`);
  }
}
function budgetedEvaluate(this: InterpreterInternals, n: Node, env: unknown): Runtime {
  tick();
  return jsEvaluate.call(this, n, env);
}
const STATEMENTS = new Set(["Macro", "CallStatement", "FilterStatement"]);
function pythonRenderBlock(this: InterpreterInternals, statements: Node[], env: unknown): string {
  tick();
  let out = "";
  for (const st of statements) {
    switch (st.type) {
      case "StringLiteral":
        out += st.value;
        break;
      case "If":
        out += this.renderIf(st, env);
        break;
      case "For":
        out += this.renderFor(st, env);
        break;
      case "Set":
        this.executeSet(st, env);
        break;
      case "Comment":
        break;
      default: {
        const v = this.evaluate(st, env);
        if (v.type === "UndefinedValue") break;
        if (v.type === "NullValue") {
          if (!STATEMENTS.has(st.type)) out += "None";
        } else if (v.type === "BooleanValue") out += v.value ? "True" : "False";
        else out += v.toString();
      }
    }
  }
  return out;
}

function renderPythonStyle(t: Template, items: Record<string, unknown>, timeoutMs: number): string {
  interpreterProto.renderBlock = pythonRenderBlock;
  interpreterProto.evaluate = budgetedEvaluate;
  interpreterProto.run = boundedRun;
  budgetMs = timeoutMs;
  deadline = performance.now() + timeoutMs;
  steps = 0;
  try {
    return t.render(items);
  } finally {
    interpreterProto.renderBlock = jsRenderBlock;
    interpreterProto.evaluate = jsEvaluate;
    interpreterProto.run = jsRun;
    deadline = Number.POSITIVE_INFINITY;
  }
}

/** A compiled chat template plus the special-token variables transformers hands it. */
export class ChatTemplate {
  private readonly template: Template;
  /** Time budget of a render (ms) when the call gives none; a render past it throws TemplateTimeoutError. */
  renderTimeoutMs = DEFAULT_RENDER_TIMEOUT_MS;

  constructor(
    readonly source: string,
    readonly variables: Record<string, unknown> = {},
    readonly origin = "chat template",
  ) {
    try {
      this.template = new Template(source);
    } catch (e) {
      throw new ConfigError(`${origin}: cannot parse the chat template: ${(e as Error).message}`);
    }
  }

  /**
   * Load a checkpoint's template: chat_template.jinja, else tokenizer_config.json's chat_template
   * (a string, or a list of {name, template} from which "tool_use" is taken when tools are
   * given and it exists, else "default"). Variables: the tokenizer's special tokens.
   */
  static load(dir: string, tokenizer?: Gemma4Tokenizer, opts: { withTools?: boolean } = {}): ChatTemplate {
    const vars = tokenizer ? Object.fromEntries(tokenizer.specialTokens) : {};
    const jinja = join(dir, "chat_template.jinja");
    if (existsSync(jinja)) {
      assertRegularFile(jinja, (m) => new ConfigError(m));
      return new ChatTemplate(readFileSync(jinja, "utf8"), vars, jinja);
    }
    const tcFile = join(dir, "tokenizer_config.json");
    if (existsSync(tcFile)) {
      const tc = readJson(tcFile);
      const t = isObject(tc) ? tc.chat_template : undefined;
      if (typeof t === "string") return new ChatTemplate(t, vars, `${tcFile} chat_template`);
      if (Array.isArray(t)) {
        const named = new Map<string, string>();
        for (const e of t) if (isObject(e) && typeof e.name === "string" && typeof e.template === "string") named.set(e.name, e.template);
        const pick = opts.withTools && named.has("tool_use") ? "tool_use" : "default";
        const src = named.get(pick);
        if (src !== undefined) return new ChatTemplate(src, vars, `${tcFile} chat_template["${pick}"]`);
      }
      if (t !== undefined && t !== null) throw new ConfigError(`${tcFile}: chat_template must be a string or a list of {name, template}`);
    }
    throw new NoChatTemplateError(`${dir}: no chat template (chat_template.jinja or tokenizer_config.json's chat_template)`);
  }

  /** Render messages to the prompt string (transformers' apply_chat_template(..., tokenize=False)). */
  render(messages: readonly ChatMessage[], opts: ChatTemplateOptions = {}): string {
    if (messages.length === 0) throw new Error("cannot apply the chat template to an empty conversation");
    const chat = normalizeMessages(messages);
    let finalText: string | undefined;
    if (opts.continueFinalMessage) {
      if (opts.addGenerationPrompt) throw new Error("continueFinalMessage and addGenerationPrompt are not compatible");
      const last = chat[chat.length - 1]!;
      const c = last.content;
      if (typeof c === "string") {
        finalText = c;
        last.content = c + CONTINUE_TAG;
      } else if (Array.isArray(c)) {
        const block = [...c].reverse().find((b) => isObject(b) && typeof b.text === "string") as Record<string, string> | undefined;
        if (!block) throw new Error("continueFinalMessage: the final message has no text to continue");
        finalText = block.text!;
        block.text = block.text + CONTINUE_TAG;
      } else throw new Error('continueFinalMessage: the final message has no "content" to continue');
    }
    let out: string;
    try {
      out = renderPythonStyle(
        this.template,
        {
          ...this.variables,
          ...(opts.kwargs ? (plain(opts.kwargs) as Record<string, unknown>) : {}),
          messages: chat,
          tools: opts.tools ? plain(opts.tools) : null,
          documents: opts.documents ? plain(opts.documents) : null,
          add_generation_prompt: opts.addGenerationPrompt ?? false,
        },
        opts.timeoutMs ?? this.renderTimeoutMs,
      );
    } catch (e) {
      if (e instanceof TemplateTimeoutError) throw new TemplateTimeoutError(`${this.origin}: ${e.message}`);
      throw new Error(`${this.origin}: ${(e as Error).message}`);
    }
    if (finalText !== undefined) {
      const tag = CONTINUE_TAG.trim();
      if (!out.includes(finalText.trim()) || !out.includes(tag)) {
        throw new Error("continueFinalMessage: the final message does not appear in the rendered chat");
      }
      const at = out.lastIndexOf(tag);
      out = out.slice(at, at + CONTINUE_TAG.length) === CONTINUE_TAG ? out.slice(0, at) : out.slice(0, at).trimEnd();
    }
    return out;
  }

  /**
   * Render and tokenize, as apply_chat_template(..., tokenize=True): the template writes <bos>
   * itself, so the text is encoded without the tokenizer's post-processor (no second <bos>).
   */
  apply(tokenizer: Gemma4Tokenizer, messages: readonly ChatMessage[], opts: ChatTemplateOptions = {}): number[] {
    return tokenizer.encode(this.render(messages, opts), { addSpecialTokens: false });
  }
}

// Gemma 4's output markup: thinking in the thought channel, tool calls in tool-call sections.
//
//   <|channel>thought\n…reasoning…<channel|>…content…<|tool_call>call:name{key:value,…}<tool_call|>
//
// The delimiters are special tokens; a detokenizer that keeps special tokens hands them over as
// text. Tool-call arguments are Gemma 4's JSON dialect (the chat template's format_argument):
// keys unquoted, strings between <|"|> delimiters, numbers/true/false as in JSON, nested {…}/[…].
//
// Reference: mlx-lm 0.32.2 (mlx_lm/tool_parsers/gemma4.py for the calls, mlx_lm/generate.py
// TextStateMachine + make_text_state_machine and server.py handle_completion for the stream).
// parseToolCalls gives the calls mlx-lm's parser gives on the same text and fails where it
// fails; the stream parser splits text the way mlx-lm's server does. See docs/gemma4.md §9.

/** One tool call: the function name and its arguments as a JSON object. */
export interface ToolCall {
  name: string;
  arguments: Record<string, unknown>;
}

/** A tool-call text that holds no call, or whose arguments are not valid Gemma 4 / JSON. */
export class ToolCallParseError extends Error {
  override name = "ToolCallParseError";
  constructor(
    message: string,
    /** "no_call": no `call:name{…}` in the text; "invalid_arguments": a call's arguments do not parse. */
    readonly reason: "no_call" | "invalid_arguments",
  ) {
    super(message);
  }
}

/** Gemma 4's output delimiters (each a special token, except the channel name "thought"). */
export const GEMMA4_MARKERS = {
  thoughtStart: "<|channel>thought",
  thoughtEnd: "<channel|>",
  toolCallStart: "<|tool_call>",
  toolCallEnd: "<tool_call|>",
  stringDelimiter: '<|"|>',
} as const;

const Q = GEMMA4_MARKERS.stringDelimiter;

// Python `regex`'s \w (what mlx-lm's patterns use): Unicode alphabetic, marks, decimal digits,
// connector punctuation, join controls. Equal to the regex module's class for every code point
// both Unicode tables know (Bun's tables may lack the newest assignments).
const WORD_CLASS = String.raw`\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}`;
const NAME_CHAR = new RegExp(`[${WORD_CLASS}-]`, "u");
// A bare key: a run of word characters right after "{" or "," and followed by ":".
const BARE_KEY = new RegExp(`(?<=[{,])([${WORD_CLASS}]+):`, "gu");

/**
 * The tool calls in `text`: every `call:name{…}` (name of word characters and "-", braces
 * balanced outside <|"|> strings), left to right, with their arguments. `text` may be a tool-call
 * section's inside or whole model output with markup around the calls.
 *
 * Throws a ToolCallParseError when there is no call, or when any call's arguments do not parse
 * (then none of the calls is returned, as mlx-lm's parser raises for the whole text).
 */
export function parseToolCalls(text: string): ToolCall[] {
  const calls: ToolCall[] = [];
  for (const m of findCalls(text)) calls.push({ name: m.name, arguments: parseArguments(m.name, m.args) });
  if (calls.length === 0) throw new ToolCallParseError("no tool call found: expected call:name{...}", "no_call");
  return calls;
}

interface CallMatch {
  name: string;
  args: string;
}

function* findCalls(text: string): Generator<CallMatch> {
  let from = 0;
  for (;;) {
    const at = text.indexOf("call:", from);
    if (at < 0) return;
    let i = at + 5;
    while (i < text.length) {
      const cp = text.codePointAt(i)!;
      if (!NAME_CHAR.test(String.fromCodePoint(cp))) break;
      i += cp > 0xffff ? 2 : 1;
    }
    const end = i > at + 5 && text[i] === "{" ? braceGroupEnd(text, i) : -1;
    if (end < 0) {
      from = at + 1;
      continue;
    }
    yield { name: text.slice(at + 5, i), args: text.slice(i, end) };
    from = end;
  }
}

/** End (exclusive) of the balanced {…} group opening at `open`, skipping <|"|> strings; -1 if none. */
function braceGroupEnd(text: string, open: number): number {
  let depth = 0;
  let i = open;
  while (i < text.length) {
    const c = text[i];
    if (c === "{") {
      depth++;
      i++;
    } else if (c === "}") {
      i++;
      if (--depth === 0) return i;
    } else if (c === "<" && text.startsWith(Q, i)) {
      const close = text.indexOf(Q, i + Q.length);
      if (close < 0) return -1; // an unterminated string: no group here
      i = close + Q.length;
    } else i++;
  }
  return -1;
}

/**
 * Gemma 4 arguments → a JSON object. Like mlx-lm: the <|"|> strings are set aside, every bare
 * word key right after "{" or "," is quoted (a purely textual step: it also applies inside JSON
 * "…" strings), the strings go back as JSON strings, and the result is read by a reader with
 * Python json.loads's grammar (NaN, Infinity, -Infinity accepted; "-0" is the integer 0).
 */
function parseArguments(name: string, args: string): Record<string, unknown> {
  const strings: string[] = [];
  let text = "";
  let i = 0;
  for (;;) {
    const open = args.indexOf(Q, i);
    const close = open < 0 ? -1 : args.indexOf(Q, open + Q.length);
    if (close < 0) {
      text += args.slice(i);
      break;
    }
    text += `${args.slice(i, open)}\0${strings.length}\0`;
    strings.push(args.slice(open + Q.length, close));
    i = close + Q.length;
  }
  text = text.replace(BARE_KEY, '"$1":');
  for (let k = 0; k < strings.length; k++) text = text.split(`\0${k}\0`).join(JSON.stringify(strings[k]));
  let value: unknown;
  try {
    value = new PyJsonReader(text).document();
  } catch (e) {
    const snippet = args.length > 200 ? `${args.slice(0, 200)}…` : args;
    throw new ToolCallParseError(
      `tool call ${JSON.stringify(name)}: invalid arguments ${JSON.stringify(snippet)}: ${(e as Error).message}`,
      "invalid_arguments",
    );
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new ToolCallParseError(`tool call ${JSON.stringify(name)}: arguments are not an object`, "invalid_arguments");
  }
  return value as Record<string, unknown>;
}

const MAX_DEPTH = 1000; // Python's json raises RecursionError near its recursion limit (1000)
const MAX_INT_DIGITS = 4300; // Python's int() refuses longer decimal strings (sys.get_int_max_str_digits)
const NUMBER = /-?(?:0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?/y;
const ESCAPES: Record<string, string> = { '"': '"', "\\": "\\", "/": "/", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t" };

/** A JSON reader with the grammar of Python's json.loads (strict mode). */
class PyJsonReader {
  private i = 0;
  constructor(private readonly s: string) {}

  document(): unknown {
    this.ws();
    const v = this.value(0);
    this.ws();
    if (this.i !== this.s.length) this.fail("extra data after the value");
    return v;
  }

  private fail(what: string): never {
    throw new Error(`${what} at char ${this.i} of the converted JSON`);
  }

  private ws(): void {
    const s = this.s;
    while (this.i < s.length) {
      const c = s[this.i];
      if (c !== " " && c !== "\t" && c !== "\n" && c !== "\r") break;
      this.i++;
    }
  }

  private value(depth: number): unknown {
    if (depth >= MAX_DEPTH) this.fail("nesting too deep");
    const s = this.s;
    const c = s[this.i];
    if (c === '"') return this.string();
    if (c === "{") return this.object(depth + 1);
    if (c === "[") return this.array(depth + 1);
    for (const [word, v] of LITERALS) {
      if (s.startsWith(word, this.i)) {
        this.i += word.length;
        return v;
      }
    }
    NUMBER.lastIndex = this.i;
    const m = NUMBER.exec(s);
    if (!m) this.fail("expected a value");
    this.i += m[0].length;
    if (m[1] !== undefined || m[2] !== undefined) return Number(m[0]);
    if (m[0].replace("-", "").length > MAX_INT_DIGITS) this.fail(`integer with more than ${MAX_INT_DIGITS} digits`);
    return Number(m[0]) + 0; // the integer -0 is 0
  }

  private object(depth: number): Record<string, unknown> {
    const s = this.s;
    const obj: Record<string, unknown> = {};
    this.i++;
    this.ws();
    if (s[this.i] === "}") {
      this.i++;
      return obj;
    }
    for (;;) {
      if (s[this.i] !== '"') this.fail("expected a property name in double quotes");
      const key = this.string();
      this.ws();
      if (s[this.i] !== ":") this.fail("expected ':'");
      this.i++;
      this.ws();
      const v = this.value(depth);
      if (key === "__proto__") Object.defineProperty(obj, key, { value: v, writable: true, enumerable: true, configurable: true });
      else obj[key] = v;
      this.ws();
      if (s[this.i] === "}") {
        this.i++;
        return obj;
      }
      if (s[this.i] !== ",") this.fail("expected ',' or '}'");
      this.i++;
      this.ws();
    }
  }

  private array(depth: number): unknown[] {
    const s = this.s;
    const arr: unknown[] = [];
    this.i++;
    this.ws();
    if (s[this.i] === "]") {
      this.i++;
      return arr;
    }
    for (;;) {
      arr.push(this.value(depth));
      this.ws();
      if (s[this.i] === "]") {
        this.i++;
        return arr;
      }
      if (s[this.i] !== ",") this.fail("expected ',' or ']'");
      this.i++;
      this.ws();
    }
  }

  private string(): string {
    const s = this.s;
    let out = "";
    let i = this.i + 1;
    let run = i;
    for (;;) {
      if (i >= s.length) {
        this.i = i;
        this.fail("unterminated string");
      }
      const c = s.charCodeAt(i);
      if (c === 0x22) break;
      if (c < 0x20) {
        this.i = i;
        this.fail("control character in a string");
      }
      if (c !== 0x5c) {
        i++;
        continue;
      }
      out += s.slice(run, i);
      const e = s[i + 1];
      if (e === "u") {
        const hex = s.slice(i + 2, i + 6);
        if (!/^[0-9a-fA-F]{4}$/.test(hex)) {
          this.i = i;
          this.fail("invalid \\u escape");
        }
        out += String.fromCharCode(Number.parseInt(hex, 16));
        i += 6;
      } else if (e !== undefined && e in ESCAPES) {
        out += ESCAPES[e];
        i += 2;
      } else {
        this.i = i;
        this.fail("invalid escape");
      }
      run = i;
    }
    out += s.slice(run, i);
    this.i = i + 1;
    return out;
  }
}

const LITERALS: readonly (readonly [string, unknown])[] = [
  ["null", null],
  ["true", true],
  ["false", false],
  ["NaN", Number.NaN],
  ["Infinity", Number.POSITIVE_INFINITY],
  ["-Infinity", Number.NEGATIVE_INFINITY],
];

// ---------------------------------------------------------------------------------------------
// Streaming

/** Where the model is writing: visible content, the thought channel, or a tool-call section. */
export type Gemma4OutputState = "content" | "reasoning" | "tool_call";

/**
 * What the stream parser reports, free of any HTTP protocol: text deltas with the markup removed,
 * and whole tool calls. OpenAI chat completions map them to `delta.content`, `delta.reasoning`
 * and `delta.tool_calls[index]`; Anthropic Messages to text / thinking / tool_use blocks; OpenAI
 * Responses to output_text, reasoning and function_call items.
 */
export type Gemma4OutputEvent =
  | { type: "content"; text: string }
  | { type: "reasoning"; text: string }
  /** A complete call, once its section's end delimiter (or the end of output) arrives; `index` counts calls from 0. */
  | { type: "tool_call"; index: number; call: ToolCall }
  /** A tool-call section that holds no valid call (mlx-lm logs and drops these); `text` is the section's inside. */
  | { type: "tool_call_error"; text: string; error: string };

export interface Gemma4OutputParserOptions {
  /**
   * The state the output starts in. "reasoning" when the prompt ends inside an open thought
   * channel (mlx-lm: the prompt's last `<|channel>thought` after its last `<channel|>`). Default "content".
   */
  initialState?: "content" | "reasoning";
}

const TRANSITIONS: Record<Gemma4OutputState, readonly (readonly [string, Gemma4OutputState])[]> = {
  content: [
    [GEMMA4_MARKERS.thoughtStart, "reasoning"],
    [GEMMA4_MARKERS.toolCallStart, "tool_call"],
  ],
  reasoning: [
    [GEMMA4_MARKERS.thoughtEnd, "content"],
    [GEMMA4_MARKERS.toolCallStart, "tool_call"],
  ],
  tool_call: [[GEMMA4_MARKERS.toolCallEnd, "content"]],
};

/**
 * Splits Gemma 4 output, fed as text deltas that include the special-token delimiters, into
 * content, reasoning and tool-call events. Text that may be the start of a delimiter is held back
 * until the next delta decides it; `finish()` flushes it. The events (adjacent text deltas of one
 * kind joined) do not depend on how the text was cut into deltas.
 */
export class Gemma4OutputParser {
  private readonly initial: Gemma4OutputState;
  private current: Gemma4OutputState;
  private pending = ""; // unreported text of the current state: at most a partial delimiter between calls
  private toolText = ""; // the open tool-call section's text
  private calls = 0;

  constructor(options: Gemma4OutputParserOptions = {}) {
    this.initial = options.initialState ?? "content";
    this.current = this.initial;
  }

  /** The state the next text belongs to. */
  get state(): Gemma4OutputState {
    return this.current;
  }

  /** Tool calls reported so far (the next call's index). */
  get toolCallCount(): number {
    return this.calls;
  }

  /** Feed one text delta; returns the events it completes. */
  push(delta: string): Gemma4OutputEvent[] {
    const events: Gemma4OutputEvent[] = [];
    let buf = this.pending + delta;
    for (;;) {
      let best: { at: number; marker: string; next: Gemma4OutputState } | undefined;
      for (const [marker, next] of TRANSITIONS[this.current]) {
        const at = buf.indexOf(marker);
        if (at >= 0 && (!best || at + marker.length < best.at + best.marker.length)) best = { at, marker, next };
      }
      if (!best) break;
      this.report(buf.slice(0, best.at), events);
      buf = buf.slice(best.at + best.marker.length);
      if (this.current === "tool_call") this.closeToolSection(events);
      this.current = best.next;
    }
    const hold = heldBack(buf, TRANSITIONS[this.current]);
    this.report(buf.slice(0, buf.length - hold), events);
    this.pending = buf.slice(buf.length - hold);
    return events;
  }

  /** End of output: flush held-back text, report an unterminated tool-call section, and reset for reuse. */
  finish(): Gemma4OutputEvent[] {
    const events: Gemma4OutputEvent[] = [];
    this.report(this.pending, events);
    this.pending = "";
    if (this.current === "tool_call" && this.toolText !== "") this.closeToolSection(events);
    this.toolText = "";
    this.current = this.initial;
    this.calls = 0;
    return events;
  }

  private report(text: string, events: Gemma4OutputEvent[]): void {
    if (text === "") return;
    const state = this.current;
    if (state === "tool_call") {
      this.toolText += text;
      return;
    }
    const last = events[events.length - 1];
    if (last && last.type === state) last.text += text;
    else events.push({ type: state, text });
  }

  private closeToolSection(events: Gemma4OutputEvent[]): void {
    const text = this.toolText;
    this.toolText = "";
    let calls: ToolCall[];
    try {
      calls = parseToolCalls(text);
    } catch (e) {
      events.push({ type: "tool_call_error", text, error: (e as Error).message });
      return;
    }
    for (const call of calls) events.push({ type: "tool_call", index: this.calls++, call });
  }
}

/** Length of the longest end of `buf` that is a proper prefix of one of the delimiters. */
function heldBack(buf: string, edges: readonly (readonly [string, Gemma4OutputState])[]): number {
  let hold = 0;
  for (const [marker] of edges) {
    for (let n = Math.min(marker.length - 1, buf.length); n > hold; n--) {
      if (buf.endsWith(marker.slice(0, n))) {
        hold = n;
        break;
      }
    }
  }
  return hold;
}

/** A whole Gemma 4 output split into its parts. */
export interface Gemma4Output {
  /** Visible text with the markup removed; null when empty. */
  content: string | null;
  /** The thought channel's text; null when empty. */
  reasoning: string | null;
  /** Calls of every well-formed tool-call section (malformed sections are dropped, as mlx-lm does). */
  toolCalls: ToolCall[];
}

/** Split a complete output (special tokens kept) with the stream parser. */
export function splitGemma4Output(text: string, options: Gemma4OutputParserOptions = {}): Gemma4Output {
  const parser = new Gemma4OutputParser(options);
  let content = "";
  let reasoning = "";
  const toolCalls: ToolCall[] = [];
  for (const e of [...parser.push(text), ...parser.finish()]) {
    if (e.type === "content") content += e.text;
    else if (e.type === "reasoning") reasoning += e.text;
    else if (e.type === "tool_call") toolCalls.push(e.call);
  }
  return { content: content || null, reasoning: reasoning || null, toolCalls };
}

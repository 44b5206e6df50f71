// Gemma 4 output parsing (src/gemma4-output.ts) against mlx-lm 0.32.2: tool calls against
// mlx_lm.tool_parsers.gemma4.parse_tool_call, whole outputs against the TextStateMachine and
// response collection of mlx_lm/server.py (tools/oracle/tool_parser_oracle.py), and the stream
// parser against itself under every way of cutting the text into deltas.
import { existsSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { beforeAll, describe, expect, test } from "vitest";
import {
  ChatTemplate,
  type Gemma4OutputEvent,
  Gemma4OutputParser,
  type Gemma4OutputParserOptions,
  parseToolCalls,
  splitGemma4Output,
  type ToolCall,
  ToolCallParseError,
} from "../src/index.ts";

const ROOT = fileURLToPath(new URL("../../..", import.meta.url));
const ORACLE = join(ROOT, "tools", "oracle", "tool_parser_oracle.py");
const TINY = join(ROOT, ".native", "models", "tiny-gemma4");
const Q = '<|"|>';

/** Run the oracle once over all items (JSON on stdin, JSON on stdout). */
function oracle<T>(items: unknown[], args: string[] = []): T[] {
  const py = process.env.MLX_BUN_PYTHON ?? join(ROOT, ".native", "venv", "bin", "python");
  if (!existsSync(py)) throw new Error(`oracle: ${py} not found; run bash tools/setup.sh`);
  const p = Bun.spawnSync([py, ORACLE, ...args], { cwd: ROOT, stdin: new TextEncoder().encode(JSON.stringify(items)), stdout: "pipe", stderr: "pipe" });
  if (p.exitCode !== 0) throw new Error(`tool_parser_oracle.py failed (${p.exitCode}):\n${p.stderr.toString()}`);
  const out = JSON.parse(p.stdout.toString()) as T[];
  expect(out.length).toBe(items.length);
  return out;
}

/** Undo the oracle's spelling of non-finite floats. */
function decode(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(decode);
  if (typeof v === "object" && v !== null) {
    const o = v as Record<string, unknown>;
    const keys = Object.keys(o);
    if (keys.length === 1 && keys[0] === "__float__") return { nan: Number.NaN, inf: Infinity, "-inf": -Infinity }[o.__float__ as string];
    const out: Record<string, unknown> = {};
    for (const k of keys) Object.defineProperty(out, k, { value: decode(o[k]), writable: true, enumerable: true, configurable: true });
    return out;
  }
  return v;
}
/** Deep equality that tells 0 from -0, takes NaN as equal to NaN, and compares own keys. */
function same(a: unknown, b: unknown): boolean {
  if (Object.is(a, b)) return true;
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  if (ka.length !== kb.length) return false;
  return ka.every((k) => Object.hasOwn(b, k) && same((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]));
}

const decodeCalls = (calls: ToolCall[]): ToolCall[] => calls.map((c) => ({ name: c.name, arguments: decode(c.arguments) as Record<string, unknown> }));

// ---------------------------------------------------------------------------------------------
// Gemma 4's tool-call serializer, from the chat template's format_argument macro:
// string → <|"|>s<|"|>; boolean → true/false; mapping → {key:value,…} (dictsort, keys unquoted);
// sequence → [a,b]; anything else printed as Python's Jinja prints it (numbers; None for null).

/** A scalar printed verbatim (the many spellings of a number, "null" as a model may write it). */
class Lit {
  constructor(
    readonly lit: string,
    readonly value: unknown,
  ) {}
}

function formatArgument(v: unknown): string {
  if (typeof v === "string") return Q + v + Q;
  if (typeof v === "boolean") return v ? "true" : "false";
  if (v instanceof Lit) return v.lit;
  if (Array.isArray(v)) return `[${v.map(formatArgument).join(",")}]`;
  if (typeof v === "object" && v !== null) {
    const keys = Object.keys(v).sort((a, b) => (a.toLowerCase() < b.toLowerCase() ? -1 : a.toLowerCase() > b.toLowerCase() ? 1 : 0));
    return `{${keys.map((k) => `${k}:${formatArgument((v as Record<string, unknown>)[k])}`).join(",")}}`;
  }
  if (v === null) return "None";
  return String(v);
}

function formatCall(name: string, args: Record<string, unknown>): string {
  return `call:${name}${formatArgument(args)}`;
}

/** What parsing the rendered value should give (Lit → its value). */
function plainValue(v: unknown): unknown {
  if (v instanceof Lit) return v.value;
  if (Array.isArray(v)) return v.map(plainValue);
  if (typeof v === "object" && v !== null) return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, plainValue(x)]));
  return v;
}

// ---------------------------------------------------------------------------------------------
// Seeded generation

class Rng {
  private s: number;
  constructor(seed: number) {
    this.s = seed >>> 0;
  }
  next(): number {
    // mulberry32
    this.s = (this.s + 0x6d2b79f5) >>> 0;
    let t = this.s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
  int(lo: number, hi: number): number {
    return lo + Math.floor(this.next() * (hi - lo + 1));
  }
  pick<T>(xs: readonly T[]): T {
    return xs[Math.floor(this.next() * xs.length)]!;
  }
  chance(p: number): boolean {
    return this.next() < p;
  }
}

const STRING_PIECES = [
  "hello",
  "Paris",
  "a b",
  " ",
  "",
  '"',
  "'",
  '\\"',
  "{",
  "}",
  "{}",
  "[",
  "]",
  ",",
  ":",
  ", ",
  "a:1",
  "key:",
  "{a:b}",
  "[1,2]",
  "\n",
  "\r\n",
  "\t",
  "\\",
  "\\n",
  "\\u00e9",
  "/",
  "é",
  "日本語",
  "Ünïcödé",
  "😀",
  "👍🏽",
  "e\u0301",
  "\u200d",
  "\u00a0",
  "\u2028",
  "<",
  ">",
  "|",
  "<|",
  "|>",
  '"|',
  '<|"',
  '"|>',
  '|"|>',
  '<|"|',
  "<>",
  "<<",
  "call:x{",
  "call:",
  "null",
  "true",
  "None",
  "-1.5e3",
  "<tool_call|>",
  "<|tool_call>",
  "<|channel>thought",
  "<channel|>",
  "<turn|>",
  "\u0000",
  "\u001f",
];
const KEYS = ["city", "days", "a", "b", "query", "b_c", "x1", "_", "Key", "units", "2", "007", "über", "名前", "café", "limit", "opts", "deep"];
const NAMES = ["get_weather", "search", "run-code", "f", "tool_1", "calc", "ünï_cödé", "a-b-c", "x", "get_time"];

function genString(r: Rng): string {
  for (;;) {
    let s = "";
    const n = r.int(0, 5);
    for (let i = 0; i < n; i++) s += r.pick(STRING_PIECES);
    if (!s.includes(Q)) return s; // a string cannot hold its own delimiter
  }
}

function genNumber(r: Rng): Lit {
  const digits = (n: number) => Array.from({ length: n }, (_, i) => String(i === 0 ? r.int(1, 9) : r.int(0, 9))).join("");
  const sign = r.chance(0.35) ? "-" : "";
  let lit: string;
  switch (r.int(0, 6)) {
    case 0:
      lit = sign + String(r.int(0, 100));
      break;
    case 1:
      lit = sign + digits(r.int(10, 25)); // beyond 2^53
      break;
    case 2:
      lit = `${sign}${r.int(0, 999)}.${String(r.int(0, 99999))}`;
      break;
    case 3:
      lit = `${sign}${r.int(1, 9)}${r.chance(0.5) ? `.${r.int(0, 999)}` : ""}${r.pick(["e", "E"])}${r.pick(["", "+", "-"])}${r.int(0, 30)}`;
      break;
    case 4:
      lit = `${sign}${r.int(1, 9)}e${r.pick(["+", "-", ""])}${r.pick([300, 307, 308, 309, 320, 400, 5, 16])}`; // 1e400 → inf
      break;
    case 5:
      lit = r.pick(["0", "-0", "0.0", "-0.0", "1.0", "1e-05", "1e+16", "4.9e-324", "1.7976931348623157e+308", "0.1", "-1e-400"]);
      break;
    default:
      lit = sign + String(r.int(0, 2 ** 31));
  }
  const isInt = !/[.eE]/.test(lit);
  return new Lit(lit, isInt ? Number(lit) + 0 : Number(lit));
}

function genValue(r: Rng, depth: number): unknown {
  const k = r.int(0, depth > 0 ? 9 : 6);
  switch (k) {
    case 0:
    case 1:
      return genString(r);
    case 2:
    case 3:
      return genNumber(r);
    case 4:
      return r.chance(0.5);
    case 5:
      return new Lit("null", null);
    case 6:
      return genString(r);
    case 7:
    case 8:
      return genObject(r, depth - 1);
    default:
      return Array.from({ length: r.int(0, 4) }, () => genValue(r, depth - 1));
  }
}

function genObject(r: Rng, depth: number): Record<string, unknown> {
  const o: Record<string, unknown> = {};
  const n = r.int(0, 4);
  for (let i = 0; i < n; i++) o[r.pick(KEYS)] = genValue(r, depth);
  return o;
}

interface GenCall {
  name: string;
  args: Record<string, unknown>;
}

const genCall = (r: Rng): GenCall => ({ name: r.pick(NAMES), args: genObject(r, r.int(0, 3)) });

const AROUND = [
  "",
  "",
  "Sure.",
  "Let me check.\n",
  "recall: nothing",
  "{not a call}",
  "a < b",
  '<|"|>quoted<|"|>',
  "<|channel>thought\nplan<channel|>",
  "<turn|>",
];
const BETWEEN = ["", "", "\n", " and ", "<tool_call|><|tool_call>"];

/** Text of well-formed calls as Gemma 4 writes them, each maybe in its tool-call section. */
function genCallText(r: Rng, calls: GenCall[]): string {
  const wrap = r.chance(0.6);
  const parts = calls.map((c) => (wrap ? `<|tool_call>${formatCall(c.name, c.args)}<tool_call|>` : formatCall(c.name, c.args)));
  let text = parts[0]!;
  for (let i = 1; i < parts.length; i++) text += (wrap ? r.pick(["", "\n"]) : r.pick(BETWEEN)) + parts[i];
  return r.pick(AROUND) + text + r.pick(AROUND);
}

const MUTATIONS = ["{", "}", "[", "]", ",", ":", '"', " ", Q, "<", "|", ">", "\\", "a", "1", "-", ".", "e", "\n", "call:", "N", "I", "None", "x:"];

function mutate(r: Rng, text: string): string {
  let t = text;
  for (let n = r.int(1, 3); n > 0; n--) {
    const at = r.int(0, t.length);
    switch (r.int(0, 3)) {
      case 0:
        t = t.slice(0, at) + t.slice(at + r.int(1, 3));
        break;
      case 1:
        t = t.slice(0, at) + r.pick(MUTATIONS) + t.slice(at);
        break;
      case 2:
        t = t.slice(0, at);
        break;
      default:
        t = t.slice(0, at) + t.slice(at, at + 1).repeat(2) + t.slice(at + 1);
    }
  }
  return t;
}

/** Hand-picked texts at the edges of the grammar (valid or not: the oracle decides). */
const EDGE_CASES: string[] = [
  "",
  "no call here",
  "call:",
  "call:f",
  "call:f{",
  "call:f}",
  "call:{a:1}",
  "call:f{}",
  "call:f {a:1}",
  "call: f{a:1}",
  "call:f{a:1}}",
  "call:f{{a:1}}",
  "call:f{a:{b:{c:{d:[[[]]]}}}}",
  "call:f{ a:1}",
  "call:f{a:1, b:2}",
  "call:f{a :1}",
  "call:f{a: 1}",
  "call:f{a:1,}",
  "call:f{a:[1,]}",
  "call:f{a:01}",
  "call:f{a:.5}",
  "call:f{a:1.}",
  "call:f{a:+1}",
  "call:f{a:-}",
  "call:f{a:1e}",
  "call:f{a:0x10}",
  "call:f{a:NaN,b:Infinity,c:-Infinity}",
  "call:f{a:nan}",
  "call:f{a:inf}",
  "call:f{a:None}",
  "call:f{a:True}",
  "call:f{a:null}",
  "call:f{a:nul}",
  "call:f{a:truex}",
  `call:f{a:${"9".repeat(4300)}}`,
  `call:f{a:-${"9".repeat(4300)}}`,
  `call:f{a:${"9".repeat(4301)}}`,
  `call:f{a:${"9".repeat(5000)}.5}`,
  "call:f{a:1e400,b:-1e400,c:1e-400,d:-1e-400}",
  "call:f{a:-0,b:-0.0,c:0e0}",
  "call:f{a:1,a:2}",
  "call:f{b:1,a:2,b:3}",
  "call:f{__proto__:{x:1}}",
  "call:f{constructor:1,toString:2}",
  "call:f{2:a}",
  "call:f{2:3,10:4,b:5}",
  "call:f{my-key:1}",
  "call:f{my.key:1}",
  "call:f{über:1,名前:2}",
  `call:f{${Q}quoted key${Q}:1}`,
  `call:f{"a":1}`,
  `call:f{a:"plain json"}`,
  `call:f{a:"x,b:y"}`,
  `call:f{a:"\\u00e9\\n\\t\\"\\\\\\/"}`,
  `call:f{a:"\\ud83d\\ude00 and \\ud800 lone"}`,
  `call:f{a:"bad \\x escape"}`,
  `call:f{a:"raw\ttab"}`,
  `call:f{a:'single'}`,
  `call:f{a:${Q}${Q}}`,
  `call:f{a:${Q}unterminated}`,
  `call:f{a:${Q}x${Q}${Q}y${Q}}`,
  `call:f{a:${Q}{${Q},b:${Q}}${Q}}`,
  `call:f{a:${Q}<|"${Q},b:${Q}"|>${Q}}`,
  `call:f{a:${Q}call:g{b:1}${Q}}`,
  `call:a{x:${Q}call:b{y:1}`,
  `call:f{a:<|"|b}`,
  "call:f{a:<b}",
  "call:f{a:<}",
  "call:f{a:1}call:g{b:2}",
  "call:f{a:1}call:g{b:}",
  "call:f{a:1}call:g{b:2",
  "call:call:f{a:1}",
  "xcall:f{a:1}",
  "call:f-{a:1}",
  "call:-{a:1}",
  "call:f.g{a:1}",
  "call:ünï{a:1}",
  "call:f\u0301{a:1}",
  "call:𝑓{a:1}",
  "call:f{a:1\u0000}",
  "call:f{a:\u00000\u0000}",
  `call:f{a:\u00000\u0000,b:${Q}s${Q}}`,
  "<|tool_call>call:f{a:1}<tool_call|>",
  "<|tool_call>call:f{a:1}",
  "<|tool_call><tool_call|>",
  '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>text<|tool_call>call:get_time{}<tool_call|>',
  "call:f{a:[1,2,{b:[3,{c:4}]}],d:[]}",
  "call:f{a:{},b:[],c:[{}]}",
  "call:f{a:[b:1]}",
  "call:f{a:[1,b:2]}",
  "call:f{a:{b:1}x}",
  "call:f{a:1\n,b:2}",
  "call:f{\na:1}",
  "call:f{a:1\n}",
  "call:f{a:\t1}",
];

interface ParseCase {
  text: string;
  /** What a well-formed rendering must parse to (undefined for mutated and edge cases). */
  expected?: ToolCall[];
}

function parseCases(): ParseCase[] {
  const r = new Rng(0x6e3d4a);
  const cases: ParseCase[] = [];
  for (let i = 0; i < 320; i++) {
    const calls = Array.from({ length: r.int(1, 4) }, () => genCall(r));
    const text = genCallText(r, calls);
    cases.push({ text, expected: calls.map((c) => ({ name: c.name, arguments: plainValue(c.args) as Record<string, unknown> })) });
  }
  const wellFormed = cases.map((c) => c.text);
  for (let i = 0; i < 320; i++) cases.push({ text: mutate(r, r.pick(wellFormed)) });
  // Template-faithful nulls: format_argument prints None (Python Jinja), which mlx-lm cannot read.
  for (let i = 0; i < 20; i++) {
    const args = genObject(r, 2);
    args[r.pick(KEYS)] = null;
    cases.push({ text: `<|tool_call>${formatCall(r.pick(NAMES), args)}<tool_call|>` });
  }
  for (const text of EDGE_CASES) cases.push({ text });
  return cases;
}

type ParseResult = { calls: ToolCall[] } | { error: string };

describe("parseToolCalls against mlx-lm's gemma4 parser", () => {
  const cases = parseCases();
  let results: ParseResult[];

  beforeAll(() => {
    results = oracle<ParseResult>(cases.map((c) => c.text));
  });

  test("the serializer writes what the chat template writes", () => {
    const tpl = ChatTemplate.load(TINY);
    const args = { city: "Paris", days: 3, nested: { list: [1, "two", false, { x: 2.5 }], ok: true }, neg: -4 };
    const out = tpl.render([
      { role: "user", content: "hi" },
      { role: "assistant", content: null, tool_calls: [{ type: "function", function: { name: "get_weather", arguments: args } }] },
    ]);
    expect(out).toContain(`<|tool_call>${formatCall("get_weather", args)}<tool_call|>`);
    const withNull = tpl.render([
      { role: "user", content: "hi" },
      { role: "assistant", tool_calls: [{ type: "function", function: { name: "f", arguments: { a: null } } }] },
    ]);
    expect(withNull).toContain("<|tool_call>call:f{a:None}<tool_call|>");
  });

  test(`well-formed renderings (${cases.filter((c) => c.expected).length} seeded cases) round-trip through mlx-lm and parseToolCalls`, () => {
    const bad: unknown[] = [];
    cases.forEach((c, i) => {
      if (!c.expected) return;
      const ref = results[i]!;
      if (!("calls" in ref)) bad.push({ text: c.text, oracle: ref.error });
      else if (!same(decodeCalls(ref.calls), c.expected)) bad.push({ text: c.text, oracle: ref.calls, expected: c.expected });
    });
    expect(bad).toEqual([]);
  });

  test(`all ${cases.length} cases (well-formed, mutated, template nulls, edge cases) give mlx-lm's calls or fail where it fails`, () => {
    const bad: unknown[] = [];
    let failures = 0;
    cases.forEach((c, i) => {
      const ref = results[i]!;
      let got: ToolCall[] | ToolCallParseError;
      try {
        got = parseToolCalls(c.text);
      } catch (e) {
        if (!(e instanceof ToolCallParseError)) throw e;
        got = e;
      }
      if ("error" in ref) {
        failures++;
        const reason = ref.error === "ValueError: No function provided." ? "no_call" : "invalid_arguments";
        if (!(got instanceof ToolCallParseError) || got.reason !== reason) bad.push({ text: c.text, oracle: ref.error, got });
      } else if (got instanceof ToolCallParseError) bad.push({ text: c.text, oracle: ref.calls, got: got.message });
      else {
        const want = decodeCalls(ref.calls);
        if (!same(got, want)) bad.push({ text: c.text, oracle: want, got });
      }
    });
    expect(bad).toEqual([]);
    // The set exercises both sides.
    expect(failures).toBeGreaterThan(100);
    expect(cases.length - failures).toBeGreaterThan(400);
  });

  test("errors name the problem", () => {
    expect(() => parseToolCalls("nothing")).toThrow(/no tool call found/);
    expect(() => parseToolCalls("call:get{a:None}")).toThrow(/tool call "get": invalid arguments "\{a:None\}": expected a value/);
    expect(() => parseToolCalls("call:f{a:1, b:2}")).toThrow(/expected a property name/);
  });
});

// ---------------------------------------------------------------------------------------------
// Streaming

/** Join adjacent text deltas of one kind: the chunking-independent form of an event list. */
function coalesce(events: Gemma4OutputEvent[]): Gemma4OutputEvent[] {
  const out: Gemma4OutputEvent[] = [];
  for (const e of events) {
    const last = out[out.length - 1];
    if (last && (e.type === "content" || e.type === "reasoning") && last.type === e.type) last.text += e.text;
    else out.push(e.type === "content" || e.type === "reasoning" ? { ...e } : e);
  }
  return out;
}

function run(chunks: string[], options?: Gemma4OutputParserOptions): Gemma4OutputEvent[] {
  const p = new Gemma4OutputParser(options);
  const events: Gemma4OutputEvent[] = [];
  for (const c of chunks) events.push(...p.push(c));
  events.push(...p.finish());
  return events;
}

const CONTENT_PIECES = [
  "Hello",
  " world",
  "\n",
  "The answer is 42.",
  "😀",
  "日本語",
  Q,
  "<|channel>",
  "<|channel>though",
  "<channel|>",
  "<|tool",
  "<tool_call|",
  "<tool_call|>",
  "<",
  "|>",
  "<|",
  "thought",
  "call:f{a:1}",
  "<turn|>",
  '<|"|>x<|"|>',
  "a < b > c",
];

interface StreamCase {
  text: string;
  /** Token-like deltas: special tokens whole, other text cut at random. */
  chunks: string[];
  initial: "content" | "reasoning";
}

const SPECIAL = /(<\|channel>|<channel\|>|<\|tool_call>|<tool_call\|>|<\|"\|>|<turn\|>)/;

function tokenLike(r: Rng, text: string): string[] {
  const out: string[] = [];
  for (const part of text.split(SPECIAL)) {
    if (part === "") continue;
    if (SPECIAL.test(part)) {
      out.push(part);
      continue;
    }
    let i = 0;
    while (i < part.length) {
      const n = r.int(1, 6);
      out.push(part.slice(i, i + n));
      i += n;
    }
  }
  return out.length ? out : [""];
}

function genOutput(r: Rng): string {
  let text = "";
  const n = r.int(1, 6);
  for (let i = 0; i < n; i++) {
    const last = i === n - 1;
    switch (r.pick(["thought", "content", "content", "tool", "tool"])) {
      case "thought": {
        text += "<|channel>thought" + (r.chance(0.8) ? "\n" : "");
        for (let k = r.int(0, 4); k > 0; k--) text += r.pick(CONTENT_PIECES.filter((p) => !p.startsWith("<channel|>") && p !== "<|tool_call>"));
        if (!last || r.chance(0.6)) text += "<channel|>";
        break;
      }
      case "content":
        for (let k = r.int(1, 4); k > 0; k--) text += r.pick(CONTENT_PIECES);
        break;
      default: {
        text += "<|tool_call>";
        const calls = r.int(1, 2);
        for (let k = 0; k < calls; k++) {
          let call = formatCall(r.pick(NAMES), genObject(r, 2));
          if (r.chance(0.15)) call = mutate(r, call);
          text += (k ? r.pick(["", "\n"]) : "") + call;
        }
        if (!last || r.chance(0.7)) text += "<tool_call|>";
      }
    }
  }
  return text;
}

function streamCases(): StreamCase[] {
  const r = new Rng(0x5eed);
  const cases: StreamCase[] = [];
  for (let i = 0; i < 240; i++) {
    const initial = r.chance(0.1) ? "reasoning" : "content";
    const text = (initial === "reasoning" ? "still thinking" : "") + genOutput(r);
    cases.push({ text, chunks: tokenLike(r, text), initial });
  }
  const fixed = [
    "",
    '<|channel>thought\nThe user wants the weather.<channel|>Let me check.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
    "<|channel>thought\n<channel|>Just content.",
    "<|channel>thought\nthinking then a call<|tool_call>call:f{a:1}<tool_call|>after",
    '<|tool_call>call:f{a:1}call:g{b:<|"|>x<|"|>}<tool_call|><|tool_call>call:h{}<tool_call|>done',
    "<|tool_call>call:f{a:None}<tool_call|>ok",
    "<|tool_call><tool_call|>",
    "<|tool_call>call:f{a:1}",
    "<|tool_call>call:f{a:1}<tool_call",
    "content <|chan",
    "content <|channel>",
    "<|channel>thought unterminated <chan",
    "<|channel>thought\n<|channel>thought nested<channel|><channel|>",
  ];
  for (const text of fixed) cases.push({ text, chunks: tokenLike(r, text), initial: "content" });
  return cases;
}

interface SplitResult {
  content: string;
  reasoning: string;
  tool_calls: ToolCall[];
  dropped: number;
}

describe("Gemma4OutputParser", () => {
  const cases = streamCases();
  let results: SplitResult[];

  beforeAll(() => {
    results = oracle<SplitResult>(
      cases.map((c) => ({ chunks: c.chunks, initial: c.initial === "reasoning" ? "reasoning" : "normal" })),
      ["--split", TINY],
    );
  });

  test("a turn with thinking, content and two tool calls", () => {
    const text =
      '<|channel>thought\nThe user wants weather and time.<channel|>Checking.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>' +
      '<|tool_call>call:get_time{tz:<|"|>Europe/Paris<|"|>}<tool_call|>';
    expect(coalesce(run(tokenLike(new Rng(1), text)))).toEqual([
      { type: "reasoning", text: "\nThe user wants weather and time." },
      { type: "content", text: "Checking." },
      { type: "tool_call", index: 0, call: { name: "get_weather", arguments: { city: "Paris", days: 2 } } },
      { type: "tool_call", index: 1, call: { name: "get_time", arguments: { tz: "Europe/Paris" } } },
    ]);
    expect(splitGemma4Output(text)).toEqual({
      content: "Checking.",
      reasoning: "\nThe user wants weather and time.",
      toolCalls: [
        { name: "get_weather", arguments: { city: "Paris", days: 2 } },
        { name: "get_time", arguments: { tz: "Europe/Paris" } },
      ],
    });
  });

  test("a partial delimiter is held back until the next delta decides it, and flushed by finish()", () => {
    const p = new Gemma4OutputParser();
    expect(p.push("Hello <|tool")).toEqual([{ type: "content", text: "Hello " }]);
    expect(p.state).toBe("content");
    expect(p.push("_call>call:f{a:")).toEqual([]);
    expect(p.state).toBe("tool_call");
    expect(p.push("1}<tool_call")).toEqual([]);
    expect(p.push("|>Done <|chan")).toEqual([
      { type: "tool_call", index: 0, call: { name: "f", arguments: { a: 1 } } },
      { type: "content", text: "Done " },
    ]);
    expect(p.push("nel>x")).toEqual([{ type: "content", text: "<|channel>x" }]); // a channel other than "thought" is content
    expect(p.push(" <")).toEqual([{ type: "content", text: " " }]);
    expect(p.finish()).toEqual([{ type: "content", text: "<" }]);
    expect(p.toolCallCount).toBe(0); // finish() resets
  });

  test("a malformed section is reported as tool_call_error and does not take an index", () => {
    expect(run(["<|tool_call>call:f{a:None}<tool_call|><|tool_call>call:g{}<tool_call|>"])).toEqual([
      { type: "tool_call_error", text: "call:f{a:None}", error: expect.stringMatching(/invalid arguments/) },
      { type: "tool_call", index: 0, call: { name: "g", arguments: {} } },
    ]);
  });

  test("an unterminated tool-call section is parsed at the end of output", () => {
    expect(run(["<|tool_call>call:f{a:", "1}"])).toEqual([{ type: "tool_call", index: 0, call: { name: "f", arguments: { a: 1 } } }]);
  });

  test("initialState reasoning: the prompt left the thought channel open", () => {
    expect(run(["still thinking<chan", "nel|>answer"], { initialState: "reasoning" })).toEqual([
      { type: "reasoning", text: "still thinking" },
      { type: "content", text: "answer" },
    ]);
  });

  test(`splitGemma4Output equals mlx-lm's server split on ${cases.length} outputs`, () => {
    const bad: unknown[] = [];
    cases.forEach((c, i) => {
      const ref = results[i]!;
      const got = splitGemma4Output(c.text, { initialState: c.initial });
      const errors = run([c.text], { initialState: c.initial }).filter((e) => e.type === "tool_call_error").length;
      const want = { content: ref.content || null, reasoning: ref.reasoning || null, toolCalls: decodeCalls(ref.tool_calls) };
      if (!same(got, want) || errors !== ref.dropped) bad.push({ text: c.text, want, dropped: ref.dropped, got, errors });
    });
    expect(bad).toEqual([]);
    expect(cases.filter((_, i) => results[i]!.tool_calls.length > 0).length).toBeGreaterThan(100);
    expect(cases.filter((_, i) => results[i]!.reasoning !== "").length).toBeGreaterThan(50);
    expect(cases.filter((_, i) => results[i]!.dropped > 0).length).toBeGreaterThan(10);
  });

  test("the events do not depend on how the text is cut: every split point, single characters, random chunks", () => {
    const r = new Rng(99);
    const bad: unknown[] = [];
    for (const c of cases) {
      const opts = { initialState: c.initial };
      const whole = coalesce(run([c.text], opts));
      const check = (chunks: string[]) => {
        const got = coalesce(run(chunks, opts));
        if (!same(got, whole)) bad.push({ text: c.text, chunks, whole, got });
      };
      for (let at = 0; at <= c.text.length; at++) check([c.text.slice(0, at), c.text.slice(at)]);
      check([...c.text]);
      check(c.chunks);
      for (let k = 0; k < 5; k++) {
        const chunks: string[] = [];
        for (let i = 0; i < c.text.length; ) {
          const n = r.int(0, 12);
          chunks.push(c.text.slice(i, i + n));
          i += n;
        }
        check(chunks);
      }
      if (bad.length > 5) break;
    }
    expect(bad).toEqual([]);
  });

  test("no delimiter or partial delimiter reaches content or reasoning before it is decided", () => {
    // Fed one character at a time, every emitted delta must be a prefix-safe piece of the final text.
    for (const c of cases.slice(0, 120)) {
      const p = new Gemma4OutputParser({ initialState: c.initial });
      const final = splitGemma4Output(c.text, { initialState: c.initial });
      let content = "";
      let reasoning = "";
      for (const ch of c.text) {
        for (const e of p.push(ch)) {
          if (e.type === "content") content += e.text;
          if (e.type === "reasoning") reasoning += e.text;
        }
        if (!(final.content ?? "").startsWith(content)) expect({ text: c.text, content }).toBe(final.content);
        if (!(final.reasoning ?? "").startsWith(reasoning)) expect({ text: c.text, reasoning }).toBe(final.reasoning);
      }
    }
  });
});

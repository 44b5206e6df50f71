// The grammar of a Gemma 4 turn that must call a tool (tool_choice "required" or one named
// function): an optional thought channel (when thinking is on), then one or more
//
//   <|tool_call>call:NAME{key:value,…}<tool_call|>
//
// with NAME one of the allowed functions and the arguments in Gemma 4's value syntax (the chat
// template's format_argument: keys bare, strings between <|"|> delimiters), constrained by the
// function's JSON-schema `parameters` where the subset below allows, else any well-formed value.
// Then the grammar ends (the stop tokens, e.g. <|tool_response>). See docs/server.md ("tool_choice").
//
// The delimiters are single special tokens. XGrammar matches text, so structured-output.ts gives
// each of them an ASCII control character of its own in the grammar's vocabulary (`GrammarMarks`):
// the grammar then admits exactly that token where a delimiter goes, never a spelling of its text.
// (ASCII, because XGrammar 0.1.27's character classes are exact only there: a negated class drops
// its characters above 127, and ranges above 127 match loosely, e.g. [\u0080-\ud7ff] takes U+E001.)
import { parseToolCalls } from "@mlx-bun/models";
import { RequestError } from "./request.ts";

/** One function the model may call: its name and its JSON-schema parameters (absent: any object). */
export interface ToolSpec {
  name: string;
  parameters?: unknown;
}

/** The characters that stand for Gemma 4's delimiter tokens in the grammar's vocabulary. */
export interface GrammarMarks {
  callOpen: string;
  callClose: string;
  quote: string;
  channelOpen: string;
  channelClose: string;
  /** Every mark character (never in free text or a literal). */
  reserved: string;
}

/** A tool list or schema the call grammar cannot be built for (a 400 naming the tool). */
export class ToolGrammarError extends RequestError {
  override name = "ToolGrammarError";
}

// XGrammar precomputes a token mask for every grammar position: free text (any character) is
// the costly kind, ~0.1-0.5 s per position at a 262k vocabulary, on the server thread. So free
// text is one shared 3-state rule, and string lengths are not counted out (each counted character
// would be 3 more such positions: maxLength 32 took 15 s; see docs/server.md).
/** Longest number run (a runaway model ends its value instead of writing forever). */
const MAX_DIGITS = 20;
/** A JSON number; the exponent has at most 2 digits, so every number is finite (1e999 would read as Infinity). */
const NUMBER = `"-"? ("0" | [1-9] [0-9]{0,${MAX_DIGITS - 1}}) ("." [0-9]{1,${MAX_DIGITS}})? ([eE] [+\\-]? [0-9]{1,2})?`;

/**
 * EBNF (XGrammar's dialect) of a turn that calls one or more of `tools`. `thinking`: the model may
 * open the thought channel first (free text, then the call); `parallel` false: exactly one call.
 */
export function gemma4ToolCallEbnf(tools: readonly ToolSpec[], marks: GrammarMarks, opts: { thinking: boolean; parallel?: boolean }): string {
  if (!tools.length) throw new ToolGrammarError("a required tool call needs at least one function");
  const b = new Builder(marks);
  const alts = tools.map((t) => {
    if (!isCallName(t.name)) {
      throw new ToolGrammarError(`function name ${JSON.stringify(t.name)} cannot be written in Gemma 4's call syntax (word characters and '-' only)`);
    }
    const args = b.objectArgs(t.parameters ?? { type: "object" }, t.parameters ?? {}, `tools[${JSON.stringify(t.name)}].parameters`);
    return `${lit(`call:${t.name}`)} ${args}`;
  });
  b.rule("call", `${lit(marks.callOpen)} (${alts.join(" | ")}) ${lit(marks.callClose)}`);
  const thought = opts.thinking ? `(${lit(`${marks.channelOpen}thought`)} ${b.freeText()} ${lit(marks.channelClose)})? ` : "";
  return `root ::= ${thought}call${opts.parallel === false ? "" : "+"}\n${b.rules.join("\n")}\n`;
}

/** Whether `name` is a name the tool-call parser reads back whole (mlx-lm's [\w-]+). */
function isCallName(name: string): boolean {
  if (!name) return false;
  try {
    const calls = parseToolCalls(`call:${name}{}`);
    return calls.length === 1 && calls[0]!.name === name;
  } catch {
    return false;
  }
}

type Schema = Record<string, unknown>;

class Builder {
  readonly rules: string[] = [];
  readonly #memo = new Map<unknown, string>();
  readonly #named = new Set<string>();
  #next = 0;
  #root: unknown = null;

  constructor(readonly marks: GrammarMarks) {}

  rule(name: string, body: string): string {
    this.rules.push(`${name} ::= ${body}`);
    this.#named.add(name);
    return name;
  }

  #fresh(stem: string): string {
    return `${stem}_${this.#next++}`;
  }

  /** The arguments: an object; a schema that is not an object schema still yields `{…}`. */
  objectArgs(schema: unknown, root: unknown, where: string): string {
    this.#root = root;
    if (isObject(schema) && schema.type === undefined && schema.properties !== undefined) return this.value({ ...schema, type: "object" }, where);
    if (isObject(schema) && (schema.type === "object" || schema.properties !== undefined)) return this.value(schema, where);
    return this.anyObject();
  }

  /** The rule name of a value valid against `schema` (best effort: see docs/server.md). */
  value(schema: unknown, where: string): string {
    const hit = this.#memo.get(schema);
    if (hit) return hit;
    if (schema === true || schema === undefined || !isObject(schema)) {
      if (schema === false) throw new ToolGrammarError(`${where}: the schema false admits no value`);
      return this.anyValue();
    }
    const name = this.#fresh("v");
    // Recursive $refs find the name before the body is built.
    this.#memo.set(schema, name);
    this.rule(name, this.#body(schema, where));
    return name;
  }

  #body(s: Schema, where: string): string {
    if (typeof s.$ref === "string") return this.value(this.#resolve(s.$ref, where), `${where}.$ref`);
    if ("const" in s) return this.#literal(s.const, where);
    if (Array.isArray(s.enum)) {
      const alts = s.enum.map((v) => this.#literalOrNull(v)).filter((x): x is string => x !== null);
      if (!alts.length) throw new ToolGrammarError(`${where}.enum: no value can be written in Gemma 4's argument syntax`);
      return alts.join(" | ");
    }
    const union = Array.isArray(s.anyOf) ? s.anyOf : Array.isArray(s.oneOf) ? s.oneOf : null;
    if (union?.length) return union.map((x, i) => this.value(x, `${where}.${s.anyOf ? "anyOf" : "oneOf"}[${i}]`)).join(" | ");
    if (Array.isArray(s.allOf) && s.allOf.length === 1) return this.value(s.allOf[0], `${where}.allOf[0]`);
    const types = typeof s.type === "string" ? [s.type] : Array.isArray(s.type) ? s.type.filter((t): t is string => typeof t === "string") : [];
    if (!types.length) {
      if (s.properties !== undefined) types.push("object");
      else if (s.items !== undefined) types.push("array");
      else return this.anyValue();
    }
    return types.map((t) => this.#typed(t, s, where)).join(" | ");
  }

  #typed(type: string, s: Schema, where: string): string {
    switch (type) {
      case "string":
        // minLength / maxLength / pattern / format are not enforced (see the note at the top).
        return `${lit(this.marks.quote)} ${this.freeText()} ${lit(this.marks.quote)}`;
      case "integer":
        return this.#shared("int", `"-"? ("0" | [1-9] [0-9]{0,${MAX_DIGITS - 1}})`);
      case "number":
        return this.#shared("num", NUMBER);
      case "boolean":
        return `"true" | "false"`;
      case "null":
        return `"null"`;
      case "array":
        return this.#array(s, where);
      case "object":
        return this.#object(s, where);
      default:
        throw new ToolGrammarError(`${where}.type: unknown type ${JSON.stringify(type)}`);
    }
  }

  #array(s: Schema, where: string): string {
    const item = s.items === undefined || typeof s.items === "boolean" || isObject(s.items) ? this.value(s.items, `${where}.items`) : this.anyValue();
    const min = nonNegInt(s.minItems) ?? 0;
    const max = nonNegInt(s.maxItems) ?? Number.POSITIVE_INFINITY;
    if (min > max) throw new ToolGrammarError(`${where}: minItems is above maxItems`);
    if (max === 0) return `"[]"`;
    const rest = Number.isFinite(max) ? `("," ${item}){${Math.max(0, min - 1)},${max - 1}}` : min > 1 ? `("," ${item}){${min - 1},}` : `("," ${item})*`;
    const some = `${item} ${rest}`;
    return min === 0 ? `"[" (${some})? "]"` : `"[" ${some} "]"`;
  }

  #object(s: Schema, where: string): string {
    const props = isObject(s.properties) ? s.properties : null;
    if (!props || !Object.keys(props).length) return s.additionalProperties === false ? `"{}"` : this.anyObject();
    const required = new Set(Array.isArray(s.required) ? s.required.filter((k): k is string => typeof k === "string") : []);
    // Keys in the chat template's order (dictsort), each once; undeclared keys are never written.
    const keys = dictsort(Object.keys(props));
    for (const r of required) if (!(r in props)) throw new ToolGrammarError(`${where}.required: '${r}' is not in properties`);
    const kv = keys.map((k) => `${lit(`${this.#key(k, where)}:`)} ${this.value(props[k], `${where}.properties.${k}`)}`);
    // first[i]: keys i.. with none written yet; later[i]: keys i.. after one was written (comma first).
    let first = `""`;
    let later = `""`;
    for (let i = keys.length - 1; i >= 0; i--) {
      const req = required.has(keys[i]!);
      const nextLater = this.rule(this.#fresh("o"), later);
      const f = `${kv[i]} ${nextLater}`;
      const l = `"," ${kv[i]} ${nextLater}`;
      first = req ? f : `${f} | ${this.rule(this.#fresh("o"), first)}`;
      later = req ? l : `${l} | ${nextLater}`;
    }
    return `"{" (${first}) "}"`;
  }

  /** A property name as written before its ":": bare when the parser reads it back, else JSON-quoted. */
  #key(k: string, where: string): string {
    for (const text of [k, JSON.stringify(k)]) {
      try {
        const [call] = parseToolCalls(`call:x{${text}:0}`);
        const args = call!.arguments;
        if (Object.keys(args).length === 1 && Object.hasOwn(args, k) && args[k] === 0) return text;
      } catch {}
    }
    throw new ToolGrammarError(`${where}: property name ${JSON.stringify(k)} cannot be written in Gemma 4's argument syntax`);
  }

  #resolve(ref: string, where: string): unknown {
    if (!ref.startsWith("#")) throw new ToolGrammarError(`${where}.$ref: only local references ("#/...") are supported, got ${JSON.stringify(ref)}`);
    let at: unknown = this.#root;
    for (const raw of ref.slice(1).split("/").slice(1)) {
      const part = decodeURIComponent(raw).replaceAll("~1", "/").replaceAll("~0", "~");
      at = isObject(at) ? at[part] : Array.isArray(at) ? at[Number(part)] : undefined;
      if (at === undefined) throw new ToolGrammarError(`${where}.$ref: ${JSON.stringify(ref)} does not resolve`);
    }
    return at;
  }

  #literal(v: unknown, where: string): string {
    const r = this.#literalOrNull(v);
    if (r === null) throw new ToolGrammarError(`${where}.const: the value cannot be written in Gemma 4's argument syntax`);
    return r;
  }

  /** A JSON value written as the chat template's format_argument writes it, if the parser reads it back. */
  #literalOrNull(v: unknown): string | null {
    const text = gemmaValue(v, this.marks.quote, this.marks.reserved);
    if (text === null) return null;
    try {
      const [call] = parseToolCalls(`call:x{v:${text.replaceAll(this.marks.quote, '<|"|>')}}`);
      if (!sameJson(call!.arguments.v, v)) return null;
    } catch {
      return null;
    }
    return lit(text);
  }

  #shared(name: string, body: string): string {
    if (!this.#named.has(name)) this.rule(name, body);
    return name;
  }

  /**
   * Text between delimiters (a string's inside, the thought): no mark, and never "<|" or "|>"
   * (every Gemma 4 delimiter's text opens with one or closes with the other, and the output parser
   * reads text: a spelled-out delimiter would end the string or section early).
   */
  freeText(): string {
    if (this.#named.has("tn")) return "tn";
    // Negated ASCII classes (exact in XGrammar): any character but "<", "|" (">" too after "|") and the marks.
    const marks = [...this.marks.reserved].map((ch) => cls(ch.codePointAt(0)!)).join("");
    // States: tn (last char plain, or none yet), ta (last "<": no "|" next), tp (last "|": no ">" next).
    this.rule("tn", `"" | [^<|${marks}] tn | "<" ta | "|" tp`);
    this.rule("ta", `"" | [^<|${marks}] tn | "<" ta`);
    this.rule("tp", `"" | [^<|>${marks}] tn | "<" ta | "|" tp`);
    return "tn";
  }

  anyValue(): string {
    if (this.#named.has("any")) return "any";
    const q = lit(this.marks.quote);
    this.rule("any", `${q} ${this.freeText()} ${q} | num | "true" | "false" | "null" | anyobj | anyarr`);
    this.#shared("num", NUMBER);
    this.rule("anyarr", `"[" (any ("," any)*)? "]"`);
    this.rule("anyobj", `"{" (anykv ("," anykv)*)? "}"`);
    this.rule("anykv", `[a-zA-Z_] [a-zA-Z0-9_]* ":" any`);
    return "any";
  }

  anyObject(): string {
    this.anyValue();
    return "anyobj";
  }
}

/** `v` in Gemma 4's argument syntax (`quote` delimits strings); null for what JSON cannot hold. */
function gemmaValue(v: unknown, quote: string, reserved: string): string | null {
  if (v === null) return "null";
  if (typeof v === "boolean") return v ? "true" : "false";
  if (typeof v === "number") return Number.isFinite(v) ? JSON.stringify(v) : null;
  // Never a delimiter's text or a mark inside a string (as for free text, see freeText).
  if (typeof v === "string") return v.includes("<|") || v.includes("|>") || [...v].some((ch) => reserved.includes(ch)) ? null : `${quote}${v}${quote}`;
  if (Array.isArray(v)) {
    const items = v.map((x) => gemmaValue(x, quote, reserved));
    return items.includes(null) ? null : `[${items.join(",")}]`;
  }
  if (isObject(v)) {
    const parts: string[] = [];
    for (const k of dictsort(Object.keys(v))) {
      const x = gemmaValue(v[k], quote, reserved);
      if (x === null) return null;
      parts.push(`${k}:${x}`);
    }
    return `{${parts.join(",")}}`;
  }
  return null;
}

/** Jinja's dictsort order (case-insensitive, as the chat template writes arguments). */
function dictsort(keys: string[]): string[] {
  const lower = (k: string) => k.toLowerCase();
  return keys.sort((a, b) => (lower(a) < lower(b) ? -1 : lower(a) > lower(b) ? 1 : a < b ? -1 : a > b ? 1 : 0));
}

function sameJson(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (Array.isArray(a) && Array.isArray(b)) return a.length === b.length && a.every((x, i) => sameJson(x, b[i]));
  if (isObject(a) && isObject(b)) {
    const ka = Object.keys(a);
    return ka.length === Object.keys(b).length && ka.every((k) => Object.hasOwn(b, k) && sameJson(a[k], b[k]));
  }
  return false;
}

function isObject(v: unknown): v is Schema {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function nonNegInt(v: unknown): number | undefined {
  return typeof v === "number" && Number.isInteger(v) && v >= 0 ? v : undefined;
}

/**
 * An EBNF literal of `s`: printable ASCII runs quoted, every other character a quoted escape of its
 * own (XGrammar reads the hex digits of \\u greedily: "\\u0003fa" would be U+03FA).
 */
function lit(s: string): string {
  const parts: string[] = [];
  let run = "";
  for (const ch of s) {
    const cp = ch.codePointAt(0)!;
    if (cp >= 0x20 && cp < 0x7f) {
      run += ch === '"' || ch === "\\" ? `\\${ch}` : ch;
      continue;
    }
    if (run) parts.push(`"${run}"`);
    run = "";
    parts.push(`"${cls(cp)}"`);
  }
  if (run || !parts.length) parts.push(`"${run}"`);
  return parts.length === 1 ? parts[0]! : `(${parts.join(" ")})`;
}

/** A code point inside an EBNF character class. */
function cls(cp: number): string {
  return cp > 0xffff ? `\\U${cp.toString(16).padStart(8, "0")}` : `\\u${cp.toString(16).padStart(4, "0")}`;
}

// Structured output: grammar-constrained decoding of JSON (OpenAI's response_format json_object /
// json_schema) with XGrammar's WebAssembly build (@mlc-ai/web-xgrammar). Per tokenizer, one
// grammar compiler (made on first use: the vocabulary from tokenizer.json, decoded as XGrammar's
// TokenizerInfo.from_huggingface would); per request, a logits processor whose grammar matcher
// gives the mask of every token the grammar does not allow. See docs/server.md ("Structured output").
//
// Threads: XGrammar's compiler, the compiled grammars and the matchers live in one long-lived
// grammar worker per compiler (grammar-engine-worker.ts): compiling a new grammar (~0.4 s at a
// 262k vocabulary) never blocks the serving thread, which per step sends the accepted ids and
// gets the next bitmask back (transferred; a step's advances batched in one message).
//
// Safety: a user schema is checked against the enforced subset (json-schema-support.ts), then
// converted to EBNF in a throwaway Bun Worker (XGrammar aborts its module on schemas it cannot
// convert; an abort costs only that worker), and only that EBNF goes to the grammar worker.
// Grammars are cached by the checked schema's canonical text.
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { GEMMA4_MARKERS, type Gemma4Tokenizer } from "@mlx-bun/models";
import type { EngineAnswer, EngineInit, EngineOp, EngineReply, EngineRequest } from "./grammar-engine-worker.ts";
import type { ConvertReply, ConvertRequest } from "./grammar-worker.ts";
import { prepareJsonSchema, SchemaError } from "./json-schema-support.ts";
import { type GrammarMarks, gemma4ToolCallEbnf, ToolGrammarError, type ToolSpec } from "./tool-call-grammar.ts";
import type { LogitsProcessor } from "./types.ts";

export { SchemaError } from "./json-schema-support.ts";

/** What the output must be: any JSON object, or JSON valid against a schema. */
export type StructuredFormat = { type: "json_object" } | { type: "json_schema"; schema?: unknown };

export interface GrammarProcessorOptions {
  /**
   * Prompt length: `history` minus this many ids is what was generated. Default: the history
   * length the first `process` call sees (the runner's first call passes the prompt alone).
   */
  promptTokens?: number;
}

/** A grammar's logits processor: owns a matcher (in the grammar worker); dispose it when its request ends. */
export interface GrammarProcessor extends LogitsProcessor, Disposable {
  readonly readsHistory: true;
  advance(history: readonly number[]): Promise<void>;
  /** Whether the grammar accepted a stop token (the output is complete). */
  readonly terminated: boolean;
  /** Free the matcher (idempotent). The processor cannot be used afterwards. */
  dispose(): void;
}

/** Grammars kept per compiler, converted here and compiled in the grammar worker (least recently used dropped beyond it). */
const CACHE_ENTRIES = 64;
/** A conversion that takes longer than this is refused (its worker is terminated). */
const CONVERT_TIMEOUT_MS = 30_000;
/** Longest schema text accepted. */
const MAX_SCHEMA_CHARS = 256 * 1024;

/** json_object: any JSON object (XGrammar's non-strict object: any keys, any values). */
const JSON_OBJECT = { text: '{"type":"object"}', strict: false };

const compilers = new WeakMap<Gemma4Tokenizer, StructuredOutputCompiler>();
const markupCompilers = new WeakMap<Gemma4Tokenizer, StructuredOutputCompiler>();

/**
 * A logits processor that constrains a request's output to `format`. The initial mask is ready
 * when the promise resolves. A schema that cannot be enforced rejects with a SchemaError (a
 * RequestError) naming the feature and its JSON pointer.
 */
export async function grammarProcessor(tokenizer: Gemma4Tokenizer, format: StructuredFormat, opts: GrammarProcessorOptions = {}): Promise<GrammarProcessor> {
  const compiler = StructuredOutputCompiler.for(tokenizer);
  return await compiler.processor(await compiler.compile(format), opts);
}

/** What a turn that must call a tool may call (tool-call-grammar.ts). */
export interface ToolCallFormat {
  /** The functions allowed (one for a named tool_choice). */
  tools: readonly ToolSpec[];
  /** Whether the model may think first (the thought channel, then the call). */
  thinking: boolean;
  /** Whether the turn may hold several calls (default true); false: exactly one. */
  parallel?: boolean;
}

/**
 * A logits processor that makes a Gemma 4 turn one or more tool calls of `format.tools` (see
 * tool-call-grammar.ts). Rejects with a ToolGrammarError (a RequestError) on a tool it cannot
 * write or a vocabulary without Gemma 4's delimiter tokens.
 */
export async function toolCallProcessor(tokenizer: Gemma4Tokenizer, format: ToolCallFormat, opts: GrammarProcessorOptions = {}): Promise<GrammarProcessor> {
  const compiler = StructuredOutputCompiler.forToolCalls(tokenizer);
  const marks = await compiler.marks();
  return await compiler.processor(
    await compiler.compileEbnf(gemma4ToolCallEbnf(format.tools, marks, { thinking: format.thinking, parallel: format.parallel ?? true })),
    opts,
  );
}

/** Check a format without compiling it (throws the SchemaError grammarProcessor would). */
export function checkStructuredFormat(format: StructuredFormat): void {
  prepareFormat(format);
}

function prepareFormat(format: StructuredFormat): { text: string; strict: boolean } {
  if (format.type === "json_object") return JSON_OBJECT;
  if (format.type !== "json_schema") throw new SchemaError(`unknown structured output type ${JSON.stringify((format as { type: unknown }).type)}`, "", "type");
  const raw = format.schema === undefined ? {} : format.schema;
  let text: string;
  try {
    text = JSON.stringify(raw);
  } catch (e) {
    throw new SchemaError(`response_format schema is not JSON: ${(e as Error).message}`, "", "schema");
  }
  if (text.length > MAX_SCHEMA_CHARS) throw new SchemaError(`response_format schema is longer than ${MAX_SCHEMA_CHARS} characters`, "", "size");
  // Strict: properties and items the schema does not declare are never generated.
  return { text: prepareJsonSchema(raw).text, strict: true };
}

/** The vocabulary of a tokenizer as XGrammar's TokenizerInfo.from_huggingface reads tokenizer.json. */
export function grammarVocabulary(
  tokenizer: Gemma4Tokenizer,
  /** Special tokens the grammar may write, each as one character of its own (their text → that character). */
  marks: ReadonlyMap<string, string> = new Map(),
): { vocab: string[]; vocabType: "byte_fallback" | "byte_level" | "raw"; prependSpace: boolean } {
  const tj = tokenizer.tokenizerJson as Record<string, any>;
  const vocab: string[] = [];
  const model = tj.model ?? {};
  if (model.vocab && !Array.isArray(model.vocab)) for (const [t, id] of Object.entries(model.vocab as Record<string, number>)) vocab[id] = t;
  else if (Array.isArray(model.vocab)) (model.vocab as [string, number][]).forEach(([t], id) => (vocab[id] = t)); // Unigram
  // Added tokens: special ones become "" (XGrammar never generates an empty token; the stop ids
  // are passed apart), as our detokenizer drops them; others are their text.
  for (const a of (tj.added_tokens ?? []) as { id: number; content: string; special?: boolean }[])
    vocab[a.id] = a.special ? (marks.get(a.content) ?? "") : a.content;
  for (let i = 0; i < vocab.length; i++) vocab[i] ??= "";
  // XGrammar's DetectVocabType: the first ByteLevel or ByteFallback decoder; DetectAddPrefixSpace:
  // a Prepend("▁") normalizer or a Metaspace pre-tokenizer that prepends.
  const decoders = tj.decoder?.type === "Sequence" ? (tj.decoder.decoders ?? []) : tj.decoder ? [tj.decoder] : [];
  let vocabType: "byte_fallback" | "byte_level" | "raw" = "raw";
  for (const d of decoders) {
    if (d?.type === "ByteLevel") {
      vocabType = "byte_level";
      break;
    }
    if (d?.type === "ByteFallback") {
      vocabType = "byte_fallback";
      break;
    }
  }
  const norms = tj.normalizer?.type === "Sequence" ? (tj.normalizer.normalizers ?? []) : tj.normalizer ? [tj.normalizer] : [];
  const pre = tj.pre_tokenizer;
  const prependSpace =
    norms.some((n: any) => n?.type === "Prepend" && n.prepend === "\u2581") ||
    (pre?.type === "Metaspace" && (pre.prepend_scheme === "always" || pre.prepend_scheme === "first"));
  return { vocab, vocabType, prependSpace };
}

/** A grammar for the grammar worker: its cache key and its EBNF (which parsed once already). */
export interface GrammarSource {
  readonly key: string;
  readonly ebnf: string;
}

/**
 * One tokenizer's grammar compiler (made on first use, then shared): the vocabulary and the UTF-8
 * guard here, the conversion worker (throwaway) and the grammar worker (long-lived: compiler,
 * compiled grammars and matchers, grammar-engine-worker.ts).
 */
export class StructuredOutputCompiler {
  /** Token ids the grammars end on (the tokenizer's eos ids). */
  readonly stopIds: number[];
  #init: Promise<{ init: EngineInit; vocabSize: number; guard: Utf8Guard; marks: GrammarMarks | null }> | null = null;
  readonly #cache = new Map<string, Promise<GrammarSource>>();
  #worker: ConversionWorker | null = null;
  #engine: GrammarEngine | null = null;

  private constructor(
    readonly tokenizer: Gemma4Tokenizer,
    /** Whether Gemma 4's delimiter tokens are in the grammar's vocabulary (as GrammarMarks); else every special token is unwritable. */
    readonly markup: boolean,
  ) {
    this.stopIds = [...tokenizer.eosTokenIds].sort((a, b) => a - b);
  }

  /** The compiler of `tokenizer` (one per tokenizer object). */
  static for(tokenizer: Gemma4Tokenizer): StructuredOutputCompiler {
    let c = compilers.get(tokenizer);
    if (!c) {
      c = new StructuredOutputCompiler(tokenizer, false);
      compilers.set(tokenizer, c);
    }
    return c;
  }

  /** The compiler of tool-call grammars of `tokenizer` (its vocabulary can write Gemma 4's delimiters). */
  static forToolCalls(tokenizer: Gemma4Tokenizer): StructuredOutputCompiler {
    let c = markupCompilers.get(tokenizer);
    if (!c) {
      c = new StructuredOutputCompiler(tokenizer, true);
      markupCompilers.set(tokenizer, c);
    }
    return c;
  }

  #ready() {
    this.#init ??= (async () => {
      const marks = this.markup ? chooseMarks(this.tokenizer) : null;
      const { vocab, vocabType, prependSpace } = grammarVocabulary(this.tokenizer, marks?.byToken);
      const guard = utf8Guard(vocab, vocabType);
      // Byte tokens that would spell a mark's character: a mark is written only as its own token.
      if (marks) for (const b of marks.bytes) guard.never.push(...byteTokens(vocab, vocabType, b));
      const init: EngineInit = { vocab, vocabType, prependSpace, stopIds: this.stopIds, cacheEntries: CACHE_ENTRIES };
      return { init, vocabSize: vocab.length, guard, marks: marks?.marks ?? null };
    })();
    return this.#init;
  }

  /** The characters that stand for Gemma 4's delimiters (a tool-call compiler's). */
  async marks(): Promise<GrammarMarks> {
    const m = (await this.#ready()).marks;
    if (!m) throw new Error("grammar compiler: this compiler has no Gemma 4 delimiter marks (use forToolCalls)");
    return m;
  }

  /** A processor of a grammar (compiled in the grammar worker unless cached there), its first mask ready. */
  async processor(grammar: GrammarSource, opts: GrammarProcessorOptions = {}): Promise<GrammarProcessor> {
    const { init, vocabSize, guard } = await this.#ready();
    if (!this.#engine || this.#engine.dead) this.#engine = new GrammarEngine(init);
    const p = new XGrammarProcessor(this.#engine, vocabSize, guard, this.stopIds, opts.promptTokens);
    try {
      await p.start(grammar);
    } catch (e) {
      p.dispose();
      throw e;
    }
    return p;
  }

  /** Vocabulary size of the masks (the tokenizer's; wider logits are disallowed beyond it). */
  async vocabSize(): Promise<number> {
    return (await this.#ready()).vocabSize;
  }

  /** The byte tokens that would make invalid UTF-8 (see Utf8Guard). */
  async utf8Guard(): Promise<Utf8Guard> {
    return (await this.#ready()).guard;
  }

  /** The grammar of a format (its conversion cached by the checked schema). Throws SchemaError on a schema it cannot enforce. */
  compile(format: StructuredFormat): Promise<GrammarSource> {
    const { text, strict } = prepareFormat(format);
    return this.#cached(`${strict ? "s" : "n"}:${text}`, async () => {
      try {
        return await this.#workerFor().convert(text, strict);
      } catch (e) {
        if (e instanceof SchemaError) throw e;
        throw new SchemaError(`response_format schema: the grammar compiler refused it: ${(e as Error).message}`, "", "schema");
      }
    });
  }

  /** The grammar of EBNF text made here (tool-call-grammar.ts), parsed in the conversion worker first. */
  compileEbnf(ebnf: string): Promise<GrammarSource> {
    return this.#cached(`g:${ebnf}`, async () => {
      await this.#workerFor().parse(ebnf);
      return ebnf;
    });
  }

  #workerFor(): ConversionWorker {
    if (!this.#worker || this.#worker.dead) this.#worker = new ConversionWorker();
    return this.#worker;
  }

  #cached(key: string, make: () => Promise<string>): Promise<GrammarSource> {
    let hit = this.#cache.get(key);
    if (hit) {
      this.#cache.delete(key);
      this.#cache.set(key, hit);
      return hit;
    }
    hit = make().then((ebnf) => ({ key, ebnf }));
    this.#cache.set(key, hit);
    hit.catch(() => {});
    while (this.#cache.size > CACHE_ENTRIES) this.#cache.delete(this.#cache.keys().next().value!);
    return hit;
  }

  /** Stop the conversion worker and the grammar worker (a later request starts others; live processors fail). */
  close(): void {
    this.#worker?.terminate();
    this.#worker = null;
    this.#engine?.terminate();
    this.#engine = null;
  }
}

const ENGINE_URL = new URL(import.meta.url.endsWith(".ts") ? "./grammar-engine-worker.ts" : "./grammar-engine-worker.js", import.meta.url);

/**
 * The grammar worker's client. Operations posted in one turn of the event loop (a decode step's
 * advances) go as one message, answered with the masks transferred. If the worker dies, every
 * pending operation rejects and the compiler starts another for later requests.
 */
class GrammarEngine {
  dead = false;
  readonly #w: Worker;
  readonly #ready: Promise<void>;
  readonly #pending = new Map<number, { resolve(a: EngineAnswer): void; reject(e: Error): void }>();
  #batch: { id: number; body: EngineOp }[] = [];
  #next = 0;
  #mids = 0;

  constructor(init: EngineInit) {
    this.#w = new Worker(ENGINE_URL.href);
    this.#w.unref();
    const { promise, resolve: ready, reject: failed } = Promise.withResolvers<void>();
    this.#ready = promise;
    this.#ready.catch(() => {});
    const down = (why: string) => {
      if (!this.dead) this.terminate();
      failed(new Error(why));
      for (const p of this.#pending.values()) p.reject(new Error(why));
      this.#pending.clear();
    };
    this.#w.onmessage = (ev: MessageEvent<EngineReply>) => {
      const m = ev.data;
      if ("loaded" in m) this.#w.postMessage({ init } satisfies EngineRequest);
      else if ("ready" in m) ready();
      else if ("initError" in m) down(`the grammar worker could not start: ${m.initError}`);
      else {
        for (const a of m.answers) {
          const p = this.#pending.get(a.id);
          this.#pending.delete(a.id);
          p?.resolve(a);
        }
        if (!this.#pending.size && !this.dead) this.#w.unref();
      }
    };
    this.#w.onerror = (e) => down(`the grammar worker failed: ${e.message}`);
    this.#w.addEventListener("close", () => down("the grammar worker exited"));
  }

  /** A new matcher id. */
  matcherId(): number {
    return this.#mids++;
  }

  request(body: Exclude<EngineOp, { op: "free" }>): Promise<EngineAnswer> {
    if (this.dead) return Promise.reject(new Error("the grammar worker exited"));
    const id = this.#next++;
    const out = new Promise<EngineAnswer>((resolve, reject) => this.#pending.set(id, { resolve, reject }));
    // Keep the process alive while an answer is due (the idle worker is unref'd).
    if (this.#pending.size === 1) this.#w.ref();
    this.#post(id, body);
    return out;
  }

  /** Free a matcher (no answer). */
  free(mid: number): void {
    if (!this.dead) this.#post(-1, { op: "free", mid });
  }

  #post(id: number, body: EngineOp): void {
    this.#batch.push({ id, body });
    if (this.#batch.length > 1) return;
    queueMicrotask(() => {
      const batch = this.#batch;
      this.#batch = [];
      this.#ready.then(
        () => {
          if (!this.dead) this.#w.postMessage({ batch } satisfies EngineRequest);
        },
        () => {},
      );
    });
  }

  terminate(): void {
    if (this.dead) return;
    this.dead = true;
    this.#w.terminate();
  }
}

const WORKER_URL = new URL(import.meta.url.endsWith(".ts") ? "./grammar-worker.ts" : "./grammar-worker.js", import.meta.url);

/** The conversion worker: one request at a time; retired after any refusal (XGrammar may have aborted). */
class ConversionWorker {
  dead = false;
  readonly #w: Worker;
  readonly #ready: Promise<void>;
  #queue: Promise<unknown> = Promise.resolve();
  #next = 0;
  #pending: { id: number; resolve(ebnf: string): void; reject(e: Error): void } | null = null;

  constructor() {
    this.#w = new Worker(WORKER_URL.href);
    this.#w.unref();
    const { promise, resolve: ready, reject: failed } = Promise.withResolvers<void>();
    this.#ready = promise;
    this.#ready.catch(() => {});
    this.#w.onmessage = (ev: MessageEvent<ConvertReply | { ready: true }>) => {
      const m = ev.data;
      if ("ready" in m) return ready();
      const p = this.#pending;
      if (!p || p.id !== m.id) return;
      this.#pending = null;
      if ("ebnf" in m) p.resolve(m.ebnf);
      else {
        this.terminate();
        p.reject(new Error(m.error));
      }
    };
    const down = (why: string) => {
      this.dead = true;
      failed(new Error(why));
      const p = this.#pending;
      this.#pending = null;
      p?.reject(new Error(why));
    };
    this.#w.onerror = (e) => down(`the grammar worker failed: ${e.message}`);
    this.#w.addEventListener("close", () => down("the grammar worker exited"));
  }

  convert(schema: string, strict: boolean): Promise<string> {
    return this.#request({ schema, strict });
  }

  /** Parse EBNF made here (rejects with XGrammar's message if it does not parse). */
  async parse(ebnf: string): Promise<void> {
    await this.#request({ ebnf });
  }

  #request(body: { schema: string; strict: boolean } | { ebnf: string }): Promise<string> {
    const run = async () => {
      if (this.dead) throw new Error("the grammar worker exited");
      // Keep the process alive while a conversion is pending (the idle worker is unref'd).
      this.#w.ref();
      try {
        return await this.#convert(body);
      } finally {
        if (!this.dead) this.#w.unref();
      }
    };
    const out = this.#queue.then(run, run);
    this.#queue = out.catch(() => {});
    return out;
  }

  async #convert(body: { schema: string; strict: boolean } | { ebnf: string }): Promise<string> {
    await this.#ready;
    return await new Promise<string>((resolve, reject) => {
      const id = this.#next++;
      const timer = setTimeout(() => {
        this.terminate();
        reject(new Error(`conversion took longer than ${CONVERT_TIMEOUT_MS / 1000} s`));
      }, CONVERT_TIMEOUT_MS);
      this.#pending = {
        id,
        resolve: (v) => (clearTimeout(timer), resolve(v)),
        reject: (e) => (clearTimeout(timer), reject(e)),
      };
      this.#w.postMessage({ id, ...body } satisfies ConvertRequest);
    });
  }

  terminate(): void {
    if (this.dead) return;
    this.dead = true;
    this.#w.terminate();
  }
}

/**
 * XGrammar matches UTF-8 leniently: byte-fallback tokens may spell overlong forms, surrogates or
 * code points beyond U+10FFFF, which the tokenizer's ByteFallback decoder turns into U+FFFD — one
 * per byte of the whole byte run, a quote spelled as a byte token included — so the text would not
 * be what the grammar matched. The masks therefore never allow the bytes no UTF-8 holds (C0, C1,
 * F5-FF), and after the leads E0, ED, F0 and F4 only the second bytes RFC 3629 allows.
 */
export interface Utf8Guard {
  /** Byte tokens never allowed. */
  never: number[];
  /** Lead byte token id → the continuation byte tokens not allowed right after it. */
  after: Map<number, number[]>;
}

function utf8Guard(vocab: readonly string[], vocabType: string): Utf8Guard {
  const guard: Utf8Guard = { never: [], after: new Map() };
  if (vocabType !== "byte_fallback") return guard;
  const byteId = new Map<number, number>();
  vocab.forEach((t, id) => {
    const m = /^<0x([0-9A-F]{2})>$/.exec(t);
    if (m) byteId.set(Number.parseInt(m[1]!, 16), id);
  });
  for (const [b, id] of byteId) if (b === 0xc0 || b === 0xc1 || b >= 0xf5) guard.never.push(id);
  // The second byte RFC 3629 allows after these leads (others: 80-BF, which XGrammar enforces).
  const second: [number, number, number][] = [
    [0xe0, 0xa0, 0xbf],
    [0xed, 0x80, 0x9f],
    [0xf0, 0x90, 0xbf],
    [0xf4, 0x80, 0x8f],
  ];
  for (const [lead, lo, hi] of second) {
    const id = byteId.get(lead);
    if (id === undefined) continue;
    const banned: number[] = [];
    for (let b = 0x80; b <= 0xbf; b++) if ((b < lo || b > hi) && byteId.has(b)) banned.push(byteId.get(b)!);
    guard.after.set(id, banned);
  }
  return guard;
}

/** The Gemma 4 delimiters a tool-call grammar writes, each given an ASCII control character no token contains. */
const MARKED_TOKENS = {
  callOpen: GEMMA4_MARKERS.toolCallStart,
  callClose: GEMMA4_MARKERS.toolCallEnd,
  quote: GEMMA4_MARKERS.stringDelimiter,
  channelOpen: "<|channel>",
  channelClose: GEMMA4_MARKERS.thoughtEnd,
} as const;
/** Candidate mark characters: C0 controls other than tab, newline, carriage return. */
const MARK_CANDIDATES = [...Array.from({ length: 8 }, (_, i) => 0x01 + i), 0x0b, 0x0c, ...Array.from({ length: 18 }, (_, i) => 0x0e + i)];

function chooseMarks(tokenizer: Gemma4Tokenizer): { marks: GrammarMarks; byToken: Map<string, string>; bytes: number[] } {
  for (const t of Object.values(MARKED_TOKENS)) {
    if (tokenizer.tokenToId(t) === undefined) throw new ToolGrammarError(`the vocabulary has no ${t} token (not a Gemma 4 tokenizer)`);
  }
  const { vocab } = grammarVocabulary(tokenizer);
  const used = new Set<number>();
  for (const t of vocab) for (const ch of t) if (ch.codePointAt(0)! < 0x20) used.add(ch.codePointAt(0)!);
  const free = MARK_CANDIDATES.filter((cp) => !used.has(cp)).slice(0, 5);
  if (free.length < 5) throw new ToolGrammarError("tool-call grammar: no control characters free for the delimiter marks");
  const [callOpen, callClose, quote, channelOpen, channelClose] = free.map((cp) => String.fromCodePoint(cp)) as [string, string, string, string, string];
  const marks: GrammarMarks = { callOpen, callClose, quote, channelOpen, channelClose, reserved: callOpen + callClose + quote + channelOpen + channelClose };
  const byToken = new Map(Object.entries(MARKED_TOKENS).map(([k, t]) => [t, marks[k as keyof typeof MARKED_TOKENS]]));
  return { marks, byToken, bytes: free };
}

/** The byte-fallback token of one byte (none for other vocabulary types). */
function byteTokens(vocab: readonly string[], vocabType: string, byte: number): number[] {
  if (vocabType !== "byte_fallback") return [];
  const name = `<0x${byte.toString(16).toUpperCase().padStart(2, "0")}>`;
  const id = vocab.indexOf(name);
  return id < 0 ? [] : [id];
}

function clearBits(words: Int32Array, ids: readonly number[]): void {
  for (const id of ids) if (id >> 5 < words.length) words[id >> 5]! &= ~(1 << (id & 31));
}

/** Frees the matchers of processors dropped without dispose(). */
const leaked = new FinalizationRegistry<{ engine: GrammarEngine; mid: number }>(({ engine, mid }) => engine.free(mid));

class XGrammarProcessor implements GrammarProcessor {
  readonly readsHistory = true as const;
  /** Generated ids the matcher has accepted. */
  readonly #ids: number[] = [];
  #base: number | undefined;
  #mask: Int32Array | null = null;
  #terminated = false;
  #mid: number | null;

  constructor(
    readonly engine: GrammarEngine,
    readonly vocabSize: number,
    readonly guard: Utf8Guard,
    readonly stopIds: readonly number[],
    promptTokens: number | undefined,
  ) {
    this.#mid = engine.matcherId();
    this.#base = promptTokens;
    leaked.register(this, { engine, mid: this.#mid }, this);
  }

  get terminated(): boolean {
    return this.#terminated;
  }

  /** Make the matcher in the grammar worker (compiling the grammar unless cached there) and take the first mask. */
  async start(grammar: GrammarSource): Promise<void> {
    this.#take(await this.engine.request({ op: "matcher", mid: this.#live(), key: grammar.key, ebnf: grammar.ebnf }));
  }

  /** Sync the matcher with the generated ids of `history` (rolled back where they changed), then fetch the next mask. */
  async advance(history: readonly number[]): Promise<void> {
    const mid = this.#live();
    this.#base ??= history.length - this.#ids.length;
    const base = this.#base;
    const n = history.length - base;
    if (n < 0) throw new Error(`grammar processor: history of ${history.length} ids is shorter than the prompt (${base})`);
    let common = 0;
    while (common < this.#ids.length && common < n && this.#ids[common] === history[base + common]) common++;
    const rollBack = this.#ids.length - common;
    const accept = history.slice(base + common, base + n);
    if (!rollBack && !accept.length) return;
    const a = await this.engine.request({ op: "advance", mid, rollBack, accept });
    this.#ids.length = common;
    if ("error" in a) {
      if (a.accepted === undefined) throw new Error(`grammar processor: ${a.error}`);
      this.#ids.push(...accept.slice(0, a.accepted));
      throw new Error(`grammar processor: token ${accept[a.accepted]} is not allowed by the grammar after ${this.#ids.length} tokens`);
    }
    this.#ids.push(...accept);
    this.#take(a);
  }

  #take(a: EngineAnswer): void {
    if ("error" in a) throw new Error(`grammar processor: ${a.error}`);
    this.#terminated = a.terminated;
    const mask = a.mask;
    if (mask) {
      clearBits(mask, this.guard.never);
      const after = this.guard.after.get(this.#ids.at(-1) ?? -1);
      if (after) clearBits(mask, after);
    }
    this.#mask = mask;
  }

  process(history: readonly number[], logits: MlxArray): MlxArray {
    this.#live();
    this.#base ??= history.length - this.#ids.length;
    if (history.length - this.#base !== this.#ids.length) {
      throw new Error(
        `grammar processor: called with ${history.length - this.#base} generated ids, the matcher has ${this.#ids.length} (advance() was not awaited)`,
      );
    }
    return maskLogits(logits, this.#mask, this.vocabSize, this.stopIds);
  }

  #live(): number {
    if (this.#mid === null) throw new Error("grammar processor: used after dispose()");
    return this.#mid;
  }

  dispose(): void {
    if (this.#mid === null) return;
    leaked.unregister(this);
    this.engine.free(this.#mid);
    this.#mid = null;
    this.#mask = null;
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

/**
 * logits [1, V] with every token the bitmask does not allow set to -inf (bit i of word i >> 5 =
 * token i allowed); ids at or beyond the mask's vocabulary are disallowed. A null mask (the grammar
 * ended) allows only `stopIds`. `vocabSize`: the tokenizer's (the mask's) vocabulary.
 */
export function maskLogits(logits: MlxArray, words: Int32Array | null, vocabSize: number, stopIds: readonly number[]): MlxArray {
  const V = logits.shape.at(-1)!;
  if (!words) {
    const allow = new Uint8Array(V);
    for (const id of stopIds) if (id < V) allow[id] = 1;
    using keep = MlxArray.fromTypedArray(allow, [1, V], "bool");
    return mx.where(keep, logits, Number.NEGATIVE_INFINITY);
  }
  const W = words.length;
  using w = MlxArray.fromTypedArray(new Uint32Array(words.buffer, words.byteOffset, W), [W, 1], "uint32");
  using shifts = mx.arange(0, 32, 1, { dtype: "uint32" });
  using shifted = mx.right_shift(w, shifts);
  using bits = mx.bitwise_and(shifted, 1);
  using flat = mx.reshape(bits, [W * 32]);
  const n = Math.min(V, vocabSize, W * 32);
  using head = n === W * 32 ? flat.retain() : mx.slice(flat, [0], [n]);
  using pad = n === V ? null : mx.zeros([V - n], "uint32");
  using padded = pad ? mx.concatenate([head, pad], 0) : head.retain();
  using row = mx.reshape(padded, [1, V]);
  using keep = mx.astype(row, "bool");
  return mx.where(keep, logits, Number.NEGATIVE_INFINITY);
}

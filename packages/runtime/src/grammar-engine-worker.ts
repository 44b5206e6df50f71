// The grammar engine: a long-lived Bun Worker per grammar compiler (structured-output.ts) that owns
// XGrammar's tokenizer info, its grammar compiler, the compiled grammars (cached by key) and every
// request's grammar matcher. XGrammar 0.1.27 cannot pass a compiled grammar between threads, so
// compiling (~0.4 s per new grammar at a 262k vocabulary, more for the first) and matching live on
// this one thread and the serving thread only exchanges token ids and bitmasks with it: compiling
// a new grammar never blocks the server's event loop. The EBNF it compiles has parsed once already
// in the throwaway conversion worker (grammar-worker.ts), where an abort costs nothing.
import type { CompiledGrammar, GrammarCompiler, GrammarMatcher } from "@mlc-ai/web-xgrammar";

declare const self: Worker;

/** The vocabulary and stop ids of the grammars (sent once, first). */
export interface EngineInit {
  vocab: string[];
  vocabType: "byte_fallback" | "byte_level" | "raw";
  prependSpace: boolean;
  stopIds: number[];
  /** Compiled grammars kept (least recently used dropped beyond it; matchers keep their own). */
  cacheEntries: number;
}

/** One operation. `matcher`: a new matcher `mid` of the grammar `key` (compiled from `ebnf` unless cached). */
export type EngineOp =
  | { op: "matcher"; mid: number; key: string; ebnf: string }
  | { op: "advance"; mid: number; rollBack: number; accept: number[] }
  | { op: "free"; mid: number };

export type EngineRequest = { init: EngineInit } | { batch: { id: number; body: EngineOp }[] };

/**
 * The answer to an op: the matcher's state after it (terminated, else the next token bitmask,
 * transferred), or why it failed; `accepted` (a token the grammar rejects): tokens of `accept` taken before it.
 */
export type EngineAnswer = { id: number; terminated: boolean; mask: Int32Array | null } | { id: number; error: string; accepted?: number };

/** `loaded`: the module is up (send the init); `ready`: the compiler is made. */
export type EngineReply = { loaded: true } | { ready: true } | { initError: string } | { answers: EngineAnswer[] };

const xg = (await import("@mlc-ai/web-xgrammar")).default;

let compiler: GrammarCompiler | null = null;
let stopIds: number[] = [];
let cacheEntries = 64;
const grammars = new Map<string, CompiledGrammar>();
const matchers = new Map<number, GrammarMatcher>();

/** Messages are handled one after another (XGrammar's calls are async). */
let queue: Promise<void> = Promise.resolve();
self.onmessage = (ev: MessageEvent<EngineRequest>) => {
  const req = ev.data;
  queue = queue.then(() => ("init" in req ? init(req.init) : run(req.batch)));
};

async function init(i: EngineInit): Promise<void> {
  try {
    const info = await xg.TokenizerInfo.createTokenizerInfo(i.vocab, i.vocabType, i.prependSpace, i.vocab.length, i.stopIds);
    compiler = await xg.GrammarCompiler.createGrammarCompiler(info);
    stopIds = i.stopIds;
    cacheEntries = i.cacheEntries;
    self.postMessage({ ready: true } satisfies EngineReply);
  } catch (e) {
    self.postMessage({ initError: (e as Error).message } satisfies EngineReply);
  }
}

async function run(batch: { id: number; body: EngineOp }[]): Promise<void> {
  let answers: EngineAnswer[] = [];
  const send = () => {
    if (!answers.length) return;
    const masks = answers.flatMap((a) => ("mask" in a && a.mask ? [a.mask.buffer as ArrayBuffer] : []));
    self.postMessage({ answers } satisfies EngineReply, masks);
    answers = [];
  };
  for (const { id, body } of batch) {
    if (body.op === "free") {
      matchers.get(body.mid)?.dispose();
      matchers.delete(body.mid);
      continue;
    }
    // A compile takes long: answer what is done first, so no stream waits on it needlessly.
    if (body.op === "matcher" && !grammars.has(body.key)) send();
    try {
      answers.push({ id, ...(await apply(body)) });
    } catch (e) {
      const err = e as Error & { accepted?: number };
      answers.push({ id, error: err.message, accepted: err.accepted });
    }
  }
  send();
}

async function apply(body: Exclude<EngineOp, { op: "free" }>): Promise<{ terminated: boolean; mask: Int32Array | null }> {
  let m: GrammarMatcher;
  if (body.op === "matcher") {
    m = await xg.GrammarMatcher.createGrammarMatcher(await grammar(body.key, body.ebnf), stopIds, false, -1);
    matchers.set(body.mid, m);
  } else {
    const found = matchers.get(body.mid);
    if (!found) throw new Error(`no matcher ${body.mid} in the grammar worker`);
    m = found;
    if (body.rollBack) m.rollBack(body.rollBack);
    for (let k = 0; k < body.accept.length; k++) {
      if (!m.acceptToken(body.accept[k]!)) throw Object.assign(new Error(`token ${body.accept[k]} is not allowed by the grammar`), { accepted: k });
    }
  }
  if (m.isTerminated()) return { terminated: true, mask: null };
  return { terminated: false, mask: await m.getNextTokenBitmask() };
}

/** The compiled grammar of `key` (least recently used dropped first; matchers keep their own reference). */
async function grammar(key: string, ebnf: string): Promise<CompiledGrammar> {
  if (!compiler) throw new Error("the grammar worker has no compiler");
  let g = grammars.get(key);
  if (g) grammars.delete(key);
  else g = await compiler.compileGrammar(ebnf);
  grammars.set(key, g);
  while (grammars.size > cacheEntries) {
    const [old, o] = grammars.entries().next().value!;
    grammars.delete(old);
    o.dispose();
  }
  return g;
}

self.postMessage({ loaded: true } satisfies EngineReply);

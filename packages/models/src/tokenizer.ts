// Tokenizer of a checkpoint (tokenizer.json + tokenizer_config.json) on @huggingface/tokenizers,
// the end-of-sequence ids mlx-lm stops on, and a streaming, UTF-8-safe detokenizer.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";
import { readJson } from "./config.ts";
import { ConfigError } from "./errors.ts";

/** Named special tokens of transformers' SPECIAL_TOKENS_ATTRIBUTES (tokenization_utils_base.py). */
export const NAMED_SPECIAL_TOKENS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"] as const;

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** A token value in tokenizer_config.json: a string or an AddedToken-like {"content": ...}. */
function tokenString(v: unknown): string | null {
  if (typeof v === "string") return v;
  if (isObject(v) && typeof v.content === "string") return v.content;
  return null;
}

/**
 * End-of-sequence ids as mlx-lm collects them (utils.py load_config + TokenizerWrapper):
 * config.json's eos_token_id (an int or a list), replaced by generation_config.json's when that
 * is truthy; the tokenizer's own eos token is added by Gemma4Tokenizer.
 */
export function readEosTokenIds(dir: string): number[] {
  const ids = (v: unknown, file: string): number[] => {
    const list = Array.isArray(v) ? v : [v];
    for (const x of list) {
      if (typeof x !== "number" || !Number.isInteger(x) || x < 0) {
        throw new ConfigError(`${file}: eos_token_id must be a token id or a list of them, got ${JSON.stringify(v)}`);
      }
    }
    return list as number[];
  };
  let out: number[] = [];
  const cfgFile = join(dir, "config.json");
  if (existsSync(cfgFile)) {
    const c = readJson(cfgFile);
    if (isObject(c) && c.eos_token_id != null) out = ids(c.eos_token_id, cfgFile);
  }
  const genFile = join(dir, "generation_config.json");
  if (existsSync(genFile)) {
    let g: unknown = {};
    try {
      g = JSON.parse(readFileSync(genFile, "utf8"));
    } catch {
      // mlx-lm ignores an unreadable generation_config.json
    }
    if (isObject(g) && g.eos_token_id) out = ids(g.eos_token_id, genFile);
  }
  return out;
}

export interface EncodeOptions {
  /** Apply the post-processor (Gemma: prepend <bos>). Default true, as transformers' encode. */
  addSpecialTokens?: boolean;
}

export interface DecodeOptions {
  skipSpecialTokens?: boolean;
}

/**
 * The special token a tokenizer.json post-processor puts in front of a single sequence
 * (TemplateProcessing's `single`, alone or inside a Sequence processor), e.g. Gemma's "<bos>".
 */
export function postProcessorBos(tokenizerJson: Record<string, unknown>): string | null {
  const pp = tokenizerJson.post_processor;
  const processors = isObject(pp) ? (pp.type === "Sequence" && Array.isArray(pp.processors) ? pp.processors : [pp]) : [];
  for (const p of processors) {
    if (!isObject(p) || p.type !== "TemplateProcessing" || !Array.isArray(p.single)) continue;
    const first = p.single[0];
    if (isObject(first) && isObject(first.SpecialToken) && typeof first.SpecialToken.id === "string") return first.SpecialToken.id;
  }
  return null;
}

/** A checkpoint's tokenizer. */
export class Gemma4Tokenizer {
  readonly tok: Tokenizer;
  /** Named special tokens (bos_token, eos_token, …, and tokenizer_config's model_specific_special_tokens such as sot_token/eot_token). */
  readonly specialTokens: Map<string, string>;
  readonly bosTokenId: number | null;
  readonly eosTokenId: number | null;
  readonly padTokenId: number | null;
  /** Ids generation stops on: config/generation_config eos_token_id plus the tokenizer's eos token. */
  readonly eosTokenIds: Set<number>;
  /** Ids of added tokens marked special (skipped by decode({skipSpecialTokens: true})). */
  readonly specialIds: Set<number>;
  readonly vocabSize: number;
  private readonly bytesCache: (Uint8Array | undefined)[] = [];
  /** Set when the decoder is the SentencePiece chain: whether it ends with Strip(" ", 1, 0). */
  private readonly spmStrip: boolean | undefined;
  private readonly cleanUpSpaces: boolean;
  private readonly unkToken: string;
  /** Problems found while loading that were worked around (printed by the CLI at start-up). */
  readonly warnings: string[] = [];

  constructor(
    readonly tokenizerJson: Record<string, unknown>,
    readonly config: Record<string, unknown>,
    eosTokenIds: readonly number[] = [],
    readonly source = "tokenizer.json",
  ) {
    try {
      // Pass clean_up_tokenization_spaces explicitly: tokenizers.js defaults it to true, transformers to false.
      this.tok = new Tokenizer(tokenizerJson, { ...config, clean_up_tokenization_spaces: config.clean_up_tokenization_spaces === true });
    } catch (e) {
      throw new ConfigError(`${source}: cannot build the tokenizer: ${(e as Error).message}`);
    }
    this.specialTokens = new Map();
    for (const k of NAMED_SPECIAL_TOKENS) {
      const v = tokenString(config[k]);
      if (v !== null) this.specialTokens.set(k, v);
    }
    const extra = config.model_specific_special_tokens;
    if (isObject(extra)) {
      for (const [k, v] of Object.entries(extra)) {
        const s = tokenString(v);
        if (s !== null && !this.specialTokens.has(k)) this.specialTokens.set(k, s);
      }
    }
    const id = (k: string) => {
      const t = this.specialTokens.get(k);
      return t === undefined ? null : (this.tokenToId(t) ?? null);
    };
    this.bosTokenId = id("bos_token");
    this.eosTokenId = id("eos_token");
    this.padTokenId = id("pad_token");
    this.eosTokenIds = new Set(eosTokenIds);
    if (this.eosTokenId !== null) this.eosTokenIds.add(this.eosTokenId);
    this.specialIds = new Set();
    const added = Array.isArray(tokenizerJson.added_tokens) ? tokenizerJson.added_tokens : [];
    for (const a of added) if (isObject(a) && a.special === true && typeof a.id === "number") this.specialIds.add(a.id);
    this.vocabSize = this.tok.get_vocab(true).size;
    this.spmStrip = spmDecoderKind(tokenizerJson.decoder);
    this.cleanUpSpaces = config.clean_up_tokenization_spaces === true;
    const model = isObject(tokenizerJson.model) ? tokenizerJson.model : {};
    this.unkToken = typeof model.unk_token === "string" ? model.unk_token : "";
  }

  /** Load dir/tokenizer.json and dir/tokenizer_config.json (and the eos ids of config.json / generation_config.json). */
  static load(dir: string): Gemma4Tokenizer {
    const tjFile = join(dir, "tokenizer.json");
    const tj = readJson(tjFile);
    if (!isObject(tj)) throw new ConfigError(`${tjFile}: must be a JSON object`);
    const tcFile = join(dir, "tokenizer_config.json");
    if (existsSync(tcFile)) {
      const tc = readJson(tcFile);
      if (!isObject(tc)) throw new ConfigError(`${tcFile}: must be a JSON object`);
      return new Gemma4Tokenizer(tj, tc, readEosTokenIds(dir), tjFile);
    }
    // Without tokenizer_config.json the special-token names are unknown, and the chat template's
    // {{ bos_token }} renders empty: transformers (and so mlx-lm) then build prompts without <bos>,
    // which Gemma needs. Take bos_token from the post-processor that prepends it to encoded text.
    const bos = postProcessorBos(tj);
    const tok = new Gemma4Tokenizer(tj, bos ? { bos_token: bos } : {}, readEosTokenIds(dir), tjFile);
    tok.warnings.push(
      bos
        ? `${tcFile} is missing: bos_token taken from tokenizer.json's post-processor (${JSON.stringify(bos)}), so chat prompts start with it (mlx-lm would render the chat template without it)`
        : `${tcFile} is missing and tokenizer.json's post-processor names no leading special token: chat templates render {{ bos_token }} empty`,
    );
    return tok;
  }

  encode(text: string, opts: EncodeOptions = {}): number[] {
    return this.tok.encode(text, { add_special_tokens: opts.addSpecialTokens ?? true }).ids;
  }

  /**
   * Decode ids to text as the tokenizers library (Rust, and so transformers) does. For
   * SentencePiece-style decoders (Gemma's Replace("▁", " ") + ByteFallback + Fuse [+ Strip]) this
   * runs that chain here: tokenizers.js differs from the Rust library there on invalid byte
   * sequences (one U+FFFD per byte in Rust) and on a U+FEFF it drops. Other decoders use
   * tokenizers.js.
   */
  decode(ids: readonly number[], opts: DecodeOptions = {}): string {
    if (ids.length === 0) return "";
    const skip = opts.skipSpecialTokens ?? false;
    if (this.spmStrip !== undefined) {
      const tokens: string[] = [];
      for (const id of ids) {
        if (skip && this.specialIds.has(id)) continue;
        tokens.push(this.idToToken(id) ?? this.unkToken);
      }
      let text = spmDecodeChain(tokens);
      if (this.spmStrip && text.startsWith(" ")) text = text.slice(1);
      return this.cleanUpSpaces ? cleanUpTokenization(text) : text;
    }
    return this.tok.decode([...ids], { skip_special_tokens: skip });
  }

  tokenToId(token: string): number | undefined {
    return this.tok.token_to_id(token);
  }

  idToToken(id: number): string | undefined {
    return this.tok.id_to_token(id);
  }

  /** Id of a named special token ("eot_token", "sot_token", …), or null. */
  specialTokenId(name: string): number | null {
    const t = this.specialTokens.get(name);
    return t === undefined ? null : (this.tokenToId(t) ?? null);
  }

  /**
   * The bytes one token contributes to the decoded text, as mlx-lm's SPMStreamingDetokenizer
   * maps them: a byte-fallback token <0xNN> is that byte; any other token is its UTF-8 with the
   * SentencePiece "▁" turned into a space.
   */
  tokenBytes(id: number): Uint8Array {
    let b = this.bytesCache[id];
    if (b) return b;
    const t = this.idToToken(id);
    if (t === undefined) throw new RangeError(`token id ${id} is not in the vocabulary (${this.vocabSize} tokens)`);
    const m = /^<0x([0-9A-Fa-f]{2})>$/.exec(t);
    b = m ? Uint8Array.of(Number.parseInt(m[1]!, 16)) : new TextEncoder().encode(t.replaceAll("\u2581", " "));
    this.bytesCache[id] = b;
    return b;
  }

  /** A fresh streaming detokenizer over this tokenizer. */
  streamDecoder(opts: DecodeOptions = {}): StreamingDetokenizer {
    const skip = opts.skipSpecialTokens ?? false;
    return new StreamingDetokenizer((id) => (skip && this.specialIds.has(id) ? EMPTY : this.tokenBytes(id)));
  }
}

const EMPTY = new Uint8Array(0);

/**
 * mlx-lm's _is_spm_decoder / _is_spm_decoder_no_space: Sequence[Replace("▁", " "), ByteFallback,
 * Fuse] (false), the same plus Strip(" ", 1, 0) (true), anything else (undefined).
 */
function spmDecoderKind(decoder: unknown): boolean | undefined {
  if (!isObject(decoder) || decoder.type !== "Sequence" || !Array.isArray(decoder.decoders)) return undefined;
  const d = decoder.decoders as Record<string, unknown>[];
  const replace = d[0];
  const ok =
    isObject(replace) &&
    replace.type === "Replace" &&
    isObject(replace.pattern) &&
    replace.pattern.String === "\u2581" &&
    replace.content === " " &&
    d[1]?.type === "ByteFallback" &&
    d[2]?.type === "Fuse";
  if (!ok) return undefined;
  if (d.length === 3) return false;
  const st = d[3];
  if (d.length === 4 && st?.type === "Strip" && st.content === " " && st.start === 1 && st.stop === 0) return true;
  return undefined;
}

const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** Replace("▁", " ") per token, then ByteFallback and Fuse, as the Rust tokenizers decoders. */
function spmDecodeChain(tokens: string[]): string {
  let out = "";
  let pending: number[] = [];
  const flush = () => {
    if (!pending.length) return;
    try {
      out += utf8.decode(Uint8Array.from(pending));
    } catch {
      out += "\ufffd".repeat(pending.length); // ByteFallback: one replacement per byte of an invalid run
    }
    pending = [];
  };
  for (const t of tokens) {
    const r = t.replaceAll("\u2581", " ");
    const m = r.length === 6 && r.startsWith("<0x") && r.endsWith(">") ? /^<0x([0-9A-Fa-f]{2})>$/.exec(r) : null;
    if (m) pending.push(Number.parseInt(m[1]!, 16));
    else {
      flush();
      out += r;
    }
  }
  flush();
  return out;
}

/** transformers' clean_up_tokenization. */
function cleanUpTokenization(s: string): string {
  return s
    .replaceAll(" .", ".")
    .replaceAll(" ?", "?")
    .replaceAll(" !", "!")
    .replaceAll(" ,", ",")
    .replaceAll(" ' ", "'")
    .replaceAll(" n't", "n't")
    .replaceAll(" 'm", "'m")
    .replaceAll(" 's", "'s")
    .replaceAll(" 've", "'ve")
    .replaceAll(" 're", "'re");
}

/**
 * Incremental detokenizer: feed token ids one at a time, get back only complete text. Bytes of a
 * multi-byte UTF-8 character split over several (byte-fallback) tokens are held until the
 * character is complete, so no half character (and no spurious U+FFFD) is ever emitted; invalid
 * bytes become U+FFFD as Python's decode("utf-8", "replace") does. For any ids that decode to
 * valid UTF-8, the concatenated output equals the tokenizer's decode(ids).
 */
export class StreamingDetokenizer {
  private decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
  private _text = "";
  private offset = 0;
  readonly tokens: number[] = [];

  constructor(private readonly bytesOf: (id: number) => Uint8Array) {}

  /** Add one token; returns the text it completed (possibly ""). */
  add(id: number): string {
    this.tokens.push(id);
    const s = this.decoder.decode(this.bytesOf(id), { stream: true });
    this._text += s;
    return s;
  }

  /** Flush held bytes at the end of generation (an incomplete character becomes U+FFFD). */
  finalize(): string {
    const s = this.decoder.decode();
    this._text += s;
    return s;
  }

  /** All text emitted so far. */
  get text(): string {
    return this._text;
  }

  /** Text emitted since the last read of lastSegment (as mlx-lm's StreamingDetokenizer.last_segment). */
  get lastSegment(): string {
    const seg = this._text.slice(this.offset);
    this.offset = this._text.length;
    return seg;
  }

  reset(): void {
    this.decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
    this._text = "";
    this.offset = 0;
    this.tokens.length = 0;
  }
}

import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Gemma4Tokenizer, readEosTokenIds, StreamingDetokenizer } from "../src/index.ts";
import { makeSuite, reference, type TinySuite } from "./helpers.ts";

let suite: TinySuite;
let tok: Gemma4Tokenizer;

const STRINGS = [
  "Hello world!",
  "The quick brown fox jumps over the lazy dog.",
  "",
  " ",
  "  two  spaces  ",
  "line one\nline two\n\n\ttabbed",
  "Café crème brûlée naïve façade über Straße señor",
  "e\u0301 (combining acute) and \u00e9 (precomposed)",
  "αβγ καλημέρα κόσμε",
  "你好世界 日本語 こんにちは 한국어",
  "emoji 😀 🎉 👍🏽 family 👩‍👩‍👧 flag 🇫🇷 keycap 1️⃣",
  "<|turn>user\nHi<turn|>\n<|turn>model\n",
  "<bos>literal<eos> and <0x41> and <unused0>",
  'tool <|tool_call>call:get{city:<|"|>Paris<|"|>}<tool_call|>',
  "def add(a, b):\n    return a + b  # 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
  "\u0000\u0001 control \u007f and \u200b zero-width and \ufeff BOM",
  "مرحبا بالعالم שלום עולם",
  "x".repeat(300),
];

interface PyTok {
  encode: { ids: number[]; ids_no_special: number[]; raw_ids: number[]; decode: string; decode_skip: string }[];
  decode: { decode: string; raw: string }[];
  eos_token_id: number;
  bos_token_id: number;
  len: number;
}
let py: PyTok;
// Id sequences, including byte-fallback tokens that do not form valid UTF-8 on their own.
let DECODE: number[][];

beforeAll(() => {
  suite = makeSuite();
  tok = Gemma4Tokenizer.load(suite.path("small-bf16"));
  const b = (x: number) => tok.tokenToId(`<0x${x.toString(16).toUpperCase().padStart(2, "0")}>`)!;
  DECODE = [
    [b(0xf0), b(0x9f), b(0x98), b(0x80)],
    [b(0xe4), b(0xbd)],
    [b(0x80), tok.tokenToId("a")!, b(0xff)],
    [2, 5, 6, 1, 0],
    Array.from({ length: 60 }, (_, i) => (i * 37) % 512),
  ];
  py = reference<PyTok>("tokenize", [suite.path("small-bf16")], { encode: STRINGS, decode: DECODE });
});
afterAll(() => suite?.cleanup());

describe("encode/decode equal transformers and tokenizers (Python)", () => {
  test.each(STRINGS.map((s, i) => [i, s] as const))("string %i", (i, s) => {
    const p = py.encode[i]!;
    expect(p.ids).toEqual(p.raw_ids); // transformers and the tokenizers library agree
    expect(tok.encode(s)).toEqual(p.ids);
    expect(tok.encode(s, { addSpecialTokens: false })).toEqual(p.ids_no_special);
    expect(tok.decode(p.ids)).toBe(p.decode);
    expect(tok.decode(p.ids, { skipSpecialTokens: true })).toBe(p.decode_skip);
  });

  test("decode of arbitrary ids (invalid UTF-8 bytes included)", () => {
    DECODE.forEach((ids, i) => {
      expect(py.decode[i]!.decode).toBe(py.decode[i]!.raw);
      expect(tok.decode(ids), `case ${i}`).toBe(py.decode[i]!.decode);
    });
    expect(tok.decode([])).toBe("");
  });

  test("special tokens and vocab", () => {
    expect(tok.vocabSize).toBe(py.len);
    expect(tok.bosTokenId).toBe(py.bos_token_id);
    expect(tok.eosTokenId).toBe(py.eos_token_id);
    expect(tok.padTokenId).toBe(0);
    expect(tok.specialTokens.get("eot_token")).toBe("<turn|>");
    expect(tok.specialTokens.get("sot_token")).toBe("<|turn>");
    expect(tok.specialTokenId("eot_token")).toBe(tok.tokenToId("<turn|>"));
    expect(tok.idToToken(tok.bosTokenId!)).toBe("<bos>");
  });

  test("eos ids: generation_config.json's list plus the tokenizer's eos", () => {
    const ids = readEosTokenIds(suite.path("small-bf16"));
    expect(ids).toEqual([tok.tokenToId("<eos>"), tok.tokenToId("<turn|>"), tok.tokenToId("<|tool_response>")]);
    expect([...tok.eosTokenIds].sort((a, b) => a - b)).toEqual([...new Set([...ids, tok.eosTokenId!])].sort((a, b) => a - b));
  });
});

describe("streaming detokenizer", () => {
  const bytes = (...xs: number[]) => xs.map((x) => tok.tokenToId(`<0x${x.toString(16).toUpperCase().padStart(2, "0")}>`)!);

  test("a 4-byte emoji split over byte-fallback tokens comes out whole, once", () => {
    const d = tok.streamDecoder();
    const [a, b, c, e] = bytes(0xf0, 0x9f, 0x98, 0x80);
    expect(d.add(tok.tokenToId("Hello")!)).toBe("Hello");
    expect(d.add(a!)).toBe("");
    expect(d.add(b!)).toBe("");
    expect(d.add(c!)).toBe("");
    expect(d.add(e!)).toBe("😀");
    expect(d.lastSegment).toBe("Hello😀");
    expect(d.lastSegment).toBe("");
    expect(d.finalize()).toBe("");
    expect(d.text).toBe("Hello😀");
  });

  test("never emits half a character, and the text equals decode()", () => {
    for (const s of STRINGS) {
      const ids = tok.encode(s);
      const d = tok.streamDecoder();
      const pieces = ids.map((id) => d.add(id));
      pieces.push(d.finalize());
      for (const p of pieces) expect(p.includes("\ufffd")).toBe(s.includes("\ufffd"));
      expect(pieces.join("")).toBe(tok.decode(ids));
      expect(d.text).toBe(tok.decode(ids));
    }
  });

  test("invalid and truncated bytes become U+FFFD", () => {
    const d = tok.streamDecoder();
    expect(d.add(bytes(0x80)[0]!)).toBe("\ufffd"); // lone continuation byte
    expect(d.add(bytes(0xe4)[0]!)).toBe(""); // start of a 3-byte character
    expect(d.add(tok.tokenToId("a")!)).toBe("\ufffda"); // interrupted
    expect(d.add(bytes(0xe4)[0]!)).toBe("");
    expect(d.finalize()).toBe("\ufffd"); // cut off at the end
  });

  test("skipSpecialTokens drops special tokens from the stream", () => {
    const ids = tok.encode("<|turn>model\nHi<turn|>");
    const d = tok.streamDecoder({ skipSpecialTokens: true });
    for (const id of ids) d.add(id);
    d.finalize();
    expect(d.text).toBe(tok.decode(ids, { skipSpecialTokens: true }));
    expect(d.text).toBe("model\nHi");
    d.reset();
    expect(d.text).toBe("");
    expect(d.tokens).toEqual([]);
  });

  test("works over any byte source", () => {
    const enc = new TextEncoder().encode("ü€😀");
    const d = new StreamingDetokenizer((i) => enc.subarray(i, i + 1));
    const out = [...enc.keys()].map((i) => d.add(i));
    expect(out).toEqual(["", "ü", "", "", "€", "", "", "", "😀"]);
  });
});

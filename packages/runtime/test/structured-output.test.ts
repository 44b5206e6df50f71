// Structured output (src/structured-output.ts, src/json-schema-support.ts): grammar-constrained
// decoding on a tiny random-weight model, 50+ JSON schemas, greedy and seeded sampling, every
// output parsed and validated by ajv; random walks through the masks that check each allowed
// keyword is enforced; refused features named with their JSON pointer; a schema that aborts
// XGrammar's module leaves later requests working; 16 batched rows equal their solo runs.
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import { memory, MlxArray } from "@mlx-bun/mlx-ffi";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import {
  Engine,
  type GenerateRequest,
  grammarProcessor,
  grammarVocabulary,
  maskLogits,
  Scheduler,
  SchemaError,
  StructuredOutputCompiler,
  type StructuredFormat,
} from "../src/index.ts";
import { tinyModels } from "./helpers.ts";
import { SCHEMAS, WALK_ONLY } from "./json-schemas.ts";

let models: ReturnType<typeof tinyModels>;
let engine: Engine;
beforeAll(() => {
  models = tinyModels({ small: ["--variant", "small"] });
  engine = Engine.load(models.path("small"));
});
afterAll(() => {
  engine?.dispose();
  models?.cleanup();
});

const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);

const prompt = (i: number) => Array.from({ length: 4 + (i % 5) }, (_, j) => 30 + ((i * 37 + j * 11) % 400));

function validator(schema: object) {
  const v = ajv.compile(schema);
  return (text: string) => {
    const value = JSON.parse(text);
    if (!v(value)) throw new Error(`${text} does not validate: ${ajv.errorsText(v.errors)}`);
    return value;
  };
}

const solo = { submit: (r: GenerateRequest) => engine.generate(r) };

async function run(
  sched: { submit(r: GenerateRequest): ReturnType<Scheduler["submit"]> },
  format: StructuredFormat,
  req: Omit<GenerateRequest, "logitsProcessors">,
) {
  const p = await grammarProcessor(engine.loaded.tokenizer, format, { promptTokens: req.promptIds.length });
  try {
    const s = sched.submit({ ...req, logitsProcessors: [p] });
    for await (const _ of s) {
    }
    return await s.result;
  } finally {
    p.dispose();
  }
}

/**
 * Steps through the grammar's masks from a fresh processor: `next` reads a step's masked row
 * (logits 0 where allowed, -inf elsewhere, vocabulary + 40 wide) and returns the token to take, or
 * null to stop before taking one. Returns the tokens taken.
 */
async function followGrammar(format: StructuredFormat, next: (row: Float64Array, step: number) => number | null, maxSteps: number): Promise<number[]> {
  const tok = engine.loaded.tokenizer;
  const p = await grammarProcessor(tok, format, { promptTokens: 1 });
  using zeros = MlxArray.fromTypedArray(new Float32Array(tok.vocabSize + 40), [1, tok.vocabSize + 40]);
  const hist = [2];
  try {
    for (let step = 0; step < maxSteps; step++) {
      using masked = p.process(hist, zeros);
      const t = next(masked.toFloat64Array(), step);
      if (t === null) break;
      hist.push(t);
      await p.advance(hist);
    }
    return hist.slice(1);
  } finally {
    p.dispose();
  }
}

/** The first step at which `tokens` leave the grammar's mask, or -1 if every one is allowed. */
async function grammarRejects(format: StructuredFormat, tokens: readonly number[]): Promise<number> {
  let at = -1;
  await followGrammar(
    format,
    (row, step) => {
      if (row[tokens[step]!] !== Number.NEGATIVE_INFINITY) return tokens[step]!;
      at = step;
      return null;
    },
    tokens.length,
  );
  return at;
}

describe("schemas on a tiny model", () => {
  test(`${Object.keys(SCHEMAS).length - WALK_ONLY.size} schemas, greedy and two seeds: every output stops, parses and validates`, async () => {
    expect(Object.keys(SCHEMAS).length - WALK_ONLY.size).toBeGreaterThanOrEqual(50);
    const sched = new Scheduler(engine, { maxBatch: 16 });
    // A sampled row may draw a string with no bound (an email's local part) past maxTokens: batch
    // composition changes a row's bf16 logits in the last bit, so which seeded row does is timing-
    // dependent. Such a row must still be grammar-consistent token by token, and be rare.
    const cut: { name: string; format: StructuredFormat; tokens: number[] }[] = [];
    try {
      const jobs: Promise<void>[] = [];
      let i = 0;
      for (const [name, schema] of Object.entries(SCHEMAS)) {
        if (WALK_ONLY.has(name)) continue;
        const check = validator(schema);
        for (const sampling of [{ temperature: 0 }, { temperature: 1, seed: 1 }, { temperature: 0.7, seed: 2 }]) {
          const k = i++;
          const format: StructuredFormat = { type: "json_schema", schema };
          jobs.push(
            run(sched, format, { promptIds: prompt(k), maxTokens: 400, sampling }).then((r) => {
              if (r.finishReason === "length" && sampling.temperature > 0 && r.tokens.length === 400) {
                cut.push({ name, format, tokens: r.tokens });
                return;
              }
              if (r.finishReason !== "stop")
                throw new Error(`${name} ${JSON.stringify(sampling)}: finished by ${r.finishReason} after ${r.tokens.length} tokens: ${r.text}`);
              try {
                check(r.text);
              } catch (e) {
                throw new Error(`${name} ${JSON.stringify(sampling)}: ${(e as Error).message}`);
              }
            }),
          );
        }
      }
      await Promise.all(jobs);
    } finally {
      await sched.close();
    }
    expect(cut.length, cut.map((c) => c.name).join(", ")).toBeLessThanOrEqual(3);
    // The replay does see a token outside the mask: "]" cannot open an object.
    const closer = engine.loaded.tokenizer.encode('{"a": 1}]', { addSpecialTokens: false });
    expect(await grammarRejects({ type: "json_object" }, closer)).toBe(closer.length - 1);
    for (const c of cut) expect(await grammarRejects(c.format, c.tokens), c.name).toBe(-1);
  }, 600_000);

  test("json_object: any JSON object", async () => {
    // Unbounded strings: the random model may not finish; a finished output is an object.
    const r = await run(solo, { type: "json_object" }, { promptIds: prompt(3), maxTokens: 120, sampling: { temperature: 1, seed: 5 } });
    expect(r.text.startsWith("{")).toBe(true);
    if (r.finishReason === "stop") expect(typeof JSON.parse(r.text)).toBe("object");
  });
});

describe("every allowed keyword is enforced: random walks through the masks", () => {
  // Uniform choices among the allowed tokens (byte-fallback tokens included, so every byte is
  // tried), a stop token taken half the time it is allowed.
  const stops = () => [...engine.loaded.tokenizer.eosTokenIds];
  async function walk(format: StructuredFormat, seed: number, maxSteps = 200): Promise<string | null> {
    let s = seed;
    const rnd = () => (s = (Math.imul(s, 1103515245) + 12345) >>> 0) / 2 ** 32;
    const tok = engine.loaded.tokenizer;
    let stopped = false;
    const taken = await followGrammar(
      format,
      (row) => {
        const allowed: number[] = [];
        row.forEach((v, id) => v !== Number.NEGATIVE_INFINITY && allowed.push(id));
        expect(allowed.length).toBeGreaterThan(0);
        expect(Math.max(...allowed)).toBeLessThan(tok.vocabSize); // logits beyond the vocabulary are masked
        const stop = allowed.filter((id) => stops().includes(id));
        const t = stop.length && rnd() < 0.5 ? stop[0]! : allowed[Math.floor(rnd() * allowed.length)]!;
        stopped = stops().includes(t);
        return stopped ? null : t;
      },
      maxSteps,
    );
    return stopped ? tok.decode(taken, { skipSpecialTokens: true }) : null;
  }

  test("each schema: 40 walks; every finished one parses and validates", async () => {
    let finished = 0;
    for (const [name, schema] of Object.entries(SCHEMAS)) {
      const check = validator(schema);
      let done = 0;
      for (let seed = 1; seed <= 40; seed++) {
        const text = await walk({ type: "json_schema", schema }, seed * 7919 + name.length);
        if (text === null) continue;
        done++;
        try {
          check(text);
        } catch (e) {
          throw new Error(`${name}, seed ${seed}: ${(e as Error).message}`);
        }
      }
      expect(done, name).toBeGreaterThan(0);
      finished += done;
    }
    expect(finished).toBeGreaterThan(40 * Object.keys(SCHEMAS).length * 0.8);
  }, 600_000);

  test("json_object walks give JSON objects", async () => {
    let done = 0;
    for (let seed = 1; seed <= 60; seed++) {
      const text = await walk({ type: "json_object" }, seed, 150);
      if (text === null) continue;
      done++;
      const v = JSON.parse(text);
      expect(typeof v === "object" && v !== null && !Array.isArray(v), text).toBe(true);
    }
    expect(done).toBeGreaterThan(10);
  });
});

describe("refused schemas", () => {
  const refused: [string, unknown, string, string][] = [
    ["if/then", { type: "object", if: { properties: { a: { const: 1 } } }, then: { required: ["b"] } }, "if", "/if"],
    ["not", { not: { type: "string" } }, "not", "/not"],
    ["uniqueItems", { type: "array", items: { type: "integer" }, uniqueItems: true }, "uniqueItems", "/uniqueItems"],
    ["multipleOf", { type: "object", properties: { n: { type: "integer", multipleOf: 3 } } }, "multipleOf", "/properties/n/multipleOf"],
    ["patternProperties", { type: "object", patternProperties: { "^x": { type: "integer" } } }, "patternProperties", "/patternProperties"],
    ["propertyNames", { type: "object", propertyNames: { maxLength: 3 } }, "propertyNames", "/propertyNames"],
    ["minProperties", { type: "object", minProperties: 1 }, "minProperties", "/minProperties"],
    ["contains", { type: "array", contains: { const: 1 } }, "contains", "/contains"],
    ["dependentRequired", { type: "object", dependentRequired: { a: ["b"] } }, "dependentRequired", "/dependentRequired"],
    ["unknown keyword", { type: "string", maxLenght: 3 }, "maxLenght", "/maxLenght"],
    ["unknown type", { type: "foo" }, "type", "/type"],
    ["format ipv6", { type: "string", format: "ipv6" }, "format: ipv6", "/format"],
    ["format uri", { type: "object", properties: { u: { type: "string", format: "uri" } } }, "format: uri", "/properties/u/format"],
    ["number bounds", { type: "number", minimum: 0 }, "minimum", "/minimum"],
    ["pattern with maxLength", { type: "string", pattern: "a+", maxLength: 3 }, "maxLength", "/maxLength"],
    ["format with maxLength", { type: "string", format: "date", maxLength: 3 }, "maxLength", "/maxLength"],
    ["lookahead", { type: "string", pattern: "(?=a)a" }, "pattern", "/pattern"],
    ["backreference", { type: "string", pattern: "(a)\\1" }, "pattern", "/pattern"],
    ["literal quote in pattern", { type: "string", pattern: 'a"b' }, "pattern", "/pattern"],
    ["required not in properties", { type: "object", properties: { a: { type: "boolean" } }, required: ["a", "b"] }, "required", "/required/1"],
    [
      "additionalProperties next to properties",
      { type: "object", properties: { a: { type: "boolean" } }, additionalProperties: true },
      "additionalProperties",
      "/additionalProperties",
    ],
    ["oneOf overlapping", { oneOf: [{ type: "string" }, { type: "string", maxLength: 2 }] }, "oneOf", "/oneOf"],
    ["allOf of two", { allOf: [{ type: "object" }, { required: [] }] }, "allOf", "/allOf"],
    ["sibling of $ref", { $defs: { A: { type: "string" } }, $ref: "#/$defs/A", maxLength: 2 }, "maxLength", "/maxLength"],
    ["sibling of anyOf", { type: "object", anyOf: [{ required: ["a"] }] }, "type", "/type"],
    ["remote $ref", { $ref: "https://example.com/schema.json" }, "$ref", "/$ref"],
    ["$ref into properties", { type: "object", properties: { a: { type: "boolean" }, b: { $ref: "#/properties/a" } } }, "$ref", "/properties/b/$ref"],
    ["$ref to nothing", { $ref: "#/$defs/Missing" }, "$ref", "/$ref"],
    ["draft-4 tuple items", { type: "array", items: [{ type: "string" }] }, "items", "/items"],
    ["nullable", { type: "string", nullable: true }, "nullable", "/nullable"],
    ["keyword without type", { maxLength: 3 }, "maxLength", "/maxLength"],
    ["false", { type: "object", properties: { a: false } }, "false", "/properties/a"],
    ["minItems beyond prefixItems", { type: "array", prefixItems: [{ type: "null" }], minItems: 2 }, "minItems", "/minItems"],
    ["nested in $defs", { $defs: { A: { type: "array", uniqueItems: true } }, type: "boolean" }, "uniqueItems", "/$defs/A/uniqueItems"],
    ["integer bound not whole", { type: "integer", minimum: 1.5 }, "minimum", "/minimum"],
    ["property name with a quote", { type: "object", properties: { 'a"b': { type: "null" } } }, "property name", '/properties/a"b'],
  ];
  for (const [name, schema, feature, pointer] of refused) {
    test(`${name}: a SchemaError naming "${feature}" at ${pointer || "the root"}`, async () => {
      const e = await grammarProcessor(engine.loaded.tokenizer, { type: "json_schema", schema }).then(
        () => null,
        (x: unknown) => x,
      );
      expect(e).toBeInstanceOf(SchemaError);
      const se = e as SchemaError;
      expect(se.name).toBe("SchemaError");
      expect(se.feature).toBe(feature);
      expect(se.pointer).toBe(pointer);
      expect(se.message).toContain(pointer || "the root");
    });
  }

  test("a schema that aborts XGrammar's converter is refused, and later requests still work", async () => {
    // Passes the checker; XGrammar's EBNF parser aborts on the empty alternative.
    const bad: StructuredFormat = { type: "json_schema", schema: { type: "string", pattern: "(|a)" } };
    for (let k = 0; k < 2; k++) {
      const e = await grammarProcessor(engine.loaded.tokenizer, bad).then(
        () => null,
        (x: unknown) => x as Error,
      );
      expect(e).toBeInstanceOf(SchemaError);
      expect(e!.message).toMatch(/grammar compiler refused it: .*EBNF parser error/);
    }
    // A new schema after the abort compiles (in a fresh worker) and constrains the output.
    const schema = { type: "object", properties: { after: { enum: ["abort", "ok"] } }, required: ["after"] };
    const r = await run(solo, { type: "json_schema", schema }, { promptIds: prompt(1), maxTokens: 40 });
    expect(r.finishReason).toBe("stop");
    validator(schema)(r.text);
  });
});

describe("batched rows", () => {
  test("16 concurrent rows with different schemas equal their solo runs", async () => {
    // Schemas whose outputs here are short. The long ones are left out for bf16 rounding, not a
    // batching bug: replaying the batched run's tokens (forced, no grammar) through this schedule,
    // "person" (row 7) has raw logits bit-identical to solo for 95 steps, then up to 0.11 apart
    // (a bf16 rounding flip of a ~1e-6 batched-vs-solo difference, amplified) and its sampled
    // token flips at step 96; the same replay on a float32 checkpoint stays within 1.7e-5 of solo
    // for all 120 steps (largest at step 95), where mlx-lm's BatchGenerator is within 3.1e-5 of
    // solo, and greedy rows of up to 200 tokens after most rows left are bit-identical to mlx-lm's
    // BatchGenerator. A wrong mask, padding or position would be O(0.1) in float32 too. "person"
    // and "format email" also hit maxTokens here (finishReason "length", not "stop").
    const long = new Set(["person", "format email", "order", "event", "string pattern negated class"]);
    const names = Object.keys(SCHEMAS).filter((n) => !WALK_ONLY.has(n) && !long.has(n));
    const reqs = Array.from({ length: 16 }, (_, i) => ({
      schema: SCHEMAS[names[(i * 7) % names.length]!]!,
      req: { promptIds: prompt(i + 20), maxTokens: 120, sampling: i % 2 ? { temperature: 0.9, seed: 100 + i } : { temperature: 0 } },
    }));
    const alone: number[][] = [];
    for (const { schema, req } of reqs) alone.push((await run(solo, { type: "json_schema", schema }, req)).tokens);
    const base = memory.active();
    const sched = new Scheduler(engine, { maxBatch: 16 });
    try {
      const batched = await Promise.all(reqs.map(({ schema, req }) => run(sched, { type: "json_schema", schema }, req)));
      batched.forEach((r, i) => {
        expect(r.tokens, `row ${i}`).toEqual(alone[i]);
        expect(r.finishReason).toBe("stop");
        validator(reqs[i]!.schema)(r.text);
      });
    } finally {
      await sched.close();
    }
    expect(memory.active()).toBeLessThanOrEqual(base + 1024);
  }, 300_000);
});

describe("processor", () => {
  test("the vocabulary is read as XGrammar's from_huggingface reads Gemma's tokenizer.json: byte_fallback, no prefix space", () => {
    const v = grammarVocabulary(engine.loaded.tokenizer);
    expect(v.vocabType).toBe("byte_fallback");
    expect(v.prependSpace).toBe(false);
    expect(v.vocab.length).toBe(engine.loaded.tokenizer.vocabSize);
    // Special added tokens are empty (never generated); the byte tokens stay as written.
    for (const id of engine.loaded.tokenizer.specialIds) expect(v.vocab[id]).toBe("");
    expect(v.vocab.filter((t) => /^<0x[0-9A-F]{2}>$/.test(t)).length).toBe(256);
  });

  test("maskLogits: allowed ids keep their logits, others and ids beyond the vocabulary are -inf", () => {
    const V = 70;
    const words = new Int32Array(2);
    for (const id of [0, 5, 31, 33, 63]) words[id >> 5]! |= 1 << (id & 31);
    using logits = MlxArray.fromTypedArray(
      Float32Array.from({ length: V }, (_, i) => i),
      [1, V],
    );
    // The vocabulary is 40: bit 63 is beyond it.
    using out = maskLogits(logits, words, 40, [1]);
    const row = out.toFloat64Array();
    row.forEach((v, i) => expect(v, `id ${i}`).toBe([0, 5, 31, 33].includes(i) ? i : Number.NEGATIVE_INFINITY));
    using ended = maskLogits(logits, null, 40, [1, 6]);
    ended.toFloat64Array().forEach((v, i) => expect(v).toBe(i === 1 || i === 6 ? i : Number.NEGATIVE_INFINITY));
  });

  test("advance rolls back when the history shrinks or changes", async () => {
    const tok = engine.loaded.tokenizer;
    const p = await grammarProcessor(tok, { type: "json_schema", schema: { type: "array", items: { enum: [1, 2] }, maxItems: 3 } }, { promptTokens: 2 });
    try {
      using zeros = MlxArray.fromTypedArray(new Float32Array(tok.vocabSize), [1, tok.vocabSize]);
      const allowed = (h: number[]) => {
        using m = p.process(h, zeros);
        return [...m.toFloat64Array()].flatMap((v, i) => (v === 0 ? [i] : []));
      };
      const open = tok.encode("[", { addSpecialTokens: false });
      const one = tok.encode("1", { addSpecialTokens: false });
      const start = allowed([7, 8]);
      await p.advance([7, 8, ...open]);
      const afterOpen = allowed([7, 8, ...open]);
      await p.advance([7, 8, ...open, ...one]);
      await p.advance([7, 8]); // shrank: back to the start
      expect(allowed([7, 8])).toEqual(start);
      await p.advance([7, 8, ...open]);
      expect(allowed([7, 8, ...open])).toEqual(afterOpen);
      expect(() => p.process([7, 8], zeros)).toThrow(/advance\(\) was not awaited/);
    } finally {
      p.dispose();
    }
    using one = MlxArray.fromNumbers([0], [1, 1]);
    expect(() => p.process([7, 8], one)).toThrow(/after dispose/);
  });

  test("the grammar worker: a token the grammar rejects is an error naming it; after the worker stops, live processors fail and a new one works", async () => {
    const tok = engine.loaded.tokenizer;
    const schema = { type: "array", items: { enum: [3, 4] }, maxItems: 2 };
    const open = tok.encode("[", { addSpecialTokens: false });
    const brace = tok.encode("{", { addSpecialTokens: false });
    const p = await grammarProcessor(tok, { type: "json_schema", schema }, { promptTokens: 1 });
    try {
      await expect(p.advance([5, ...brace])).rejects.toThrow(new RegExp(`token ${brace[0]} is not allowed by the grammar after 0 tokens`));
      await p.advance([5, ...open]);
      StructuredOutputCompiler.for(tok).close();
      await expect(p.advance([5, ...open, ...tok.encode("3", { addSpecialTokens: false })])).rejects.toThrow(/grammar worker/);
    } finally {
      p.dispose();
    }
    // A fresh worker compiles the (cached) grammar again and constrains a walk to valid JSON.
    const q = await grammarProcessor(tok, { type: "json_schema", schema }, { promptTokens: 1 });
    try {
      using zeros = MlxArray.fromTypedArray(new Float32Array(tok.vocabSize), [1, tok.vocabSize]);
      const hist = [5];
      const stop = new Set(tok.eosTokenIds);
      for (let step = 0; step < 40; step++) {
        using m = q.process(hist, zeros);
        const allowed = [...m.toFloat64Array()].flatMap((v, i) => (v === 0 ? [i] : []));
        const t = allowed.find((i) => !stop.has(i)) ?? allowed[0]!;
        if (stop.has(t)) break;
        hist.push(t);
        await q.advance(hist);
        if (q.terminated) break;
      }
      expect(JSON.parse(tok.decode(hist.slice(1)))).toSatisfy((v: unknown) => Array.isArray(v) && v.every((x) => x === 3 || x === 4));
    } finally {
      q.dispose();
    }
  });
});

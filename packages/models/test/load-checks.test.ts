// What loading refuses or reports instead of changing the answers silently: a chat template that
// does not parse, checkpoint files that are not regular files (a FIFO would block the load), a
// missing tokenizer_config.json (transformers then drops <bos> from chat prompts), chat templates
// that loop (time budget, bounded range()), and KV modes the model's head dims cannot take.
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, unlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import {
  ChatTemplate,
  checkKvMode,
  ConfigError,
  Gemma4Tokenizer,
  loadGemma4Config,
  loadModel,
  loadTextSide,
  MAX_RANGE,
  parseKvMode,
  postProcessorBos,
  TemplateTimeoutError,
} from "../src/index.ts";
import { makeTiny } from "./helpers.ts";

let root: string;
let tiny: string;

beforeAll(() => {
  root = mkdtempSync(join(tmpdir(), "mlxb-load-checks-"));
  tiny = makeTiny(join(root, "tiny"), ["--variant", "small"]);
});

afterAll(() => rmSync(root, { recursive: true, force: true }));

/** A copy of the tiny checkpoint with `change` applied to its folder. */
function variant(name: string, change: (dir: string) => void): string {
  const dir = join(root, name);
  mkdirSync(dir);
  for (const f of ["config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "model.safetensors", "generation_config.json"]) {
    try {
      copyFileSync(join(tiny, f), join(dir, f));
    } catch {
      // a file this variant of the maker does not write
    }
  }
  change(dir);
  return dir;
}

describe("chat templates", () => {
  test("a template that does not parse is a ConfigError naming the file; no template at all is null", () => {
    const bad = variant("bad-template", (d) => writeFileSync(join(d, "chat_template.jinja"), "{% for x in %}"));
    expect(() => loadTextSide(bad)).toThrow(ConfigError);
    expect(() => loadTextSide(bad)).toThrow(/chat_template\.jinja: cannot parse the chat template/);
    const none = variant("no-template", (d) => {
      unlinkSync(join(d, "chat_template.jinja"));
      const tc = JSON.parse(readFileSync(join(d, "tokenizer_config.json"), "utf8"));
      delete tc.chat_template;
      writeFileSync(join(d, "tokenizer_config.json"), JSON.stringify(tc));
    });
    expect(loadTextSide(none).template).toBeNull();
  });

  test("a render that loops past its time budget throws TemplateTimeoutError; range() is bounded as Jinja2's sandbox", () => {
    const spin = new ChatTemplate("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", {}, "spin");
    const t0 = performance.now();
    expect(() => spin.render([{ role: "user", content: "hi" }], { timeoutMs: 200 })).toThrow(TemplateTimeoutError);
    expect(performance.now() - t0).toBeLessThan(2000);
    spin.renderTimeoutMs = 100;
    expect(() => spin.render([{ role: "user", content: "hi" }])).toThrow(/took longer than 100 ms/);
    const big = new ChatTemplate(`{% for i in range(${MAX_RANGE + 1}) %}{% endfor %}`, {}, "big");
    expect(() => big.render([{ role: "user", content: "hi" }])).toThrow(/range\(\) of 100001 items is too big/);
    // range() still works as before within the bound, with start/stop/step.
    const ok = new ChatTemplate("{% for i in range(2, 11, 3) %}{{ i }},{% endfor %}{% for i in range(3, 0, -1) %}{{ i }}{% endfor %}", {}, "ok");
    expect(ok.render([{ role: "user", content: "hi" }])).toBe("2,5,8,321");
    // The interpreter is left as it was after a timeout: the next render works.
    const model = loadTextSide(tiny).template!;
    expect(model.render([{ role: "user", content: "hi" }], { addGenerationPrompt: true })).toContain("hi");
  });
});

describe("checkpoint files", () => {
  test("a FIFO as the weights (or the config) is refused at once instead of blocking the load", () => {
    const fifo = variant("fifo-weights", (d) => {
      unlinkSync(join(d, "model.safetensors"));
      expect(Bun.spawnSync(["mkfifo", join(d, "model.safetensors")]).exitCode).toBe(0);
    });
    const t0 = performance.now();
    expect(() => loadModel(fifo)).toThrow(/model\.safetensors: a FIFO \(named pipe\), not a regular file/);
    expect(performance.now() - t0).toBeLessThan(5000);
    const cfg = variant("fifo-config", (d) => {
      unlinkSync(join(d, "config.json"));
      expect(Bun.spawnSync(["mkfifo", join(d, "config.json")]).exitCode).toBe(0);
    });
    expect(() => loadGemma4Config(cfg)).toThrow(/config\.json: a FIFO/);
    const dir = variant("dir-as-weights", (d) => {
      unlinkSync(join(d, "model.safetensors"));
      mkdirSync(join(d, "model.safetensors"));
    });
    expect(() => loadModel(dir)).toThrow(/a directory, not a regular file/);
  });

  test("without tokenizer_config.json, bos_token comes from the post-processor (chat prompts keep <bos>) and a warning says so", () => {
    const notc = variant("no-tokenizer-config", (d) => unlinkSync(join(d, "tokenizer_config.json")));
    const full = loadTextSide(tiny);
    const bare = loadTextSide(notc);
    expect(postProcessorBos(full.tokenizer.tokenizerJson)).toBe("<bos>");
    expect(bare.tokenizer.bosTokenId).toBe(full.tokenizer.bosTokenId);
    const msgs = [{ role: "user", content: "hello" }];
    const ids = (t: typeof full) => t.template!.apply(t.tokenizer, msgs, { addGenerationPrompt: true });
    expect(ids(bare)[0]).toBe(full.tokenizer.bosTokenId);
    expect(ids(bare)).toEqual(ids(full));
    expect(bare.warnings.join("\n")).toMatch(/tokenizer_config\.json is missing: bos_token taken from tokenizer\.json's post-processor \("<bos>"\)/);
    expect(full.warnings).toEqual([]);
    expect(Gemma4Tokenizer.load(notc).warnings).toHaveLength(1);
  });
});

describe("KV modes", () => {
  test("bits and head dims are checked at start-up", () => {
    expect(() => parseKvMode("turbo:0,0")).toThrow(/TurboQuant takes key bits 2, 3, 4, 8 and value bits 2, 3, 4, got 0,0/);
    expect(() => parseKvMode("turbo:9,9")).toThrow(ConfigError);
    expect(parseKvMode("turbo:4,3")).toEqual({ kind: "turbo", kBits: 4, vBits: 3 });
    const config = loadGemma4Config(tiny);
    // The tiny model: sliding layers of head dim 32, full-attention layers of 64.
    expect(() => checkKvMode(parseKvMode("q4"), config)).toThrow(/--kv q4 cannot hold this model's sliding-attention layers \(head dim 32\)/);
    expect(() => checkKvMode(parseKvMode("turbo:4,3"), config)).toThrow(/head dim 32.*supported: 64, 128, 256, 512/);
    expect(() => checkKvMode(parseKvMode("q8"), config, { layers: "full_attention" })).not.toThrow();
    expect(() =>
      checkKvMode({ kind: "affine", bits: 4, groupSize: 128 }, config, { layers: "full_attention", what: "--kv-bits 4 --kv-group-size 128" }),
    ).toThrow(/--kv-bits 4 --kv-group-size 128 cannot hold .*full-attention layers \(head dim 64\)/);
    expect(() => checkKvMode({ kind: "affine", bits: 4, groupSize: 32 }, config)).not.toThrow();
    expect(() => checkKvMode(parseKvMode("bf16"), config)).not.toThrow();
  });
});

// OpenAI image_url parts through /v1/chat/completions (server/images.ts) on a tiny Gemma 4 vision
// checkpoint (tools/make-tiny-model/make_tiny_vision_model.py): the official Python `openai`
// client sends a data: URL image; the greedy tokens equal mlx-vlm's for the same image and prompt
// (tools/oracle/gemma4_vision_oracle.py run: Model.__call__ + greedy steps); 100 image requests
// leave MLX's active memory at its baseline; bad images are 400s in OpenAI's error shape.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { memory } from "@mlx-bun/mlx-ffi";
import type { Engine } from "@mlx-bun/runtime";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { runPython, runPythonAsync } from "../../../tools/oracle/oracle.ts";
import type { RunningServer } from "../src/server/http.ts";
import { runCli, tempDir } from "./helpers.ts";
import { makeVisionFixture, startVisionServers, type VisionServers, visionReference } from "./vision-fixtures.ts";

const N = 8;
let tmp: ReturnType<typeof tempDir>;
let ckpt: string;
let engine: Engine;
let srv: RunningServer;
let textOnly: RunningServer;
let servers: VisionServers;
let png: string;
let big: string;
/** mlx-vlm's prompt ids and greedy tokens for [image, TEXT]. */
let ref: { ids: number[]; tokens: number[] };

beforeAll(() => {
  tmp = tempDir("mlxb-images-serve-");
  ({ ckpt, png } = makeVisionFixture(tmp.path));
  ref = visionReference(tmp.path, { ckpt, png }, TEXT, N);
  big = join(tmp.path, "big.png");
  runPython(["-c", `import sys; from PIL import Image; Image.new("L", (10000, 10000)).save(sys.argv[1])`, big]);
  servers = startVisionServers(ckpt);
  ({ engine, srv, textOnly } = servers);
});

afterAll(async () => {
  await servers?.stop();
  tmp?.cleanup();
});

const dataUrl = (bytes: Uint8Array, type = "image/png") => `data:${type};base64,${Buffer.from(bytes).toString("base64")}`;
const TEXT = "What is in this picture?";

async function post(url: string, content: unknown[], extra: Record<string, unknown> = {}): Promise<{ status: number; body: any }> {
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ messages: [{ role: "user", content }], max_tokens: 2, temperature: 0, ...extra }),
  });
  return { status: r.status, body: await r.json() };
}

describe("image_url parts", () => {
  // The server renders Gemma 4 prompts with enable_thinking on by default (as mlx_lm.server: the
  // vocabulary has thinking markers); mlx-vlm's processor leaves it off. The request turns it off,
  // so both render the same prompt.
  test("the Python openai client: greedy tokens equal mlx-vlm's for the same image and prompt", async () => {
    const script = `import sys, json
from openai import OpenAI
c = OpenAI(base_url=sys.argv[1], api_key="x", max_retries=0)
r = c.chat.completions.create(model="tiny", max_tokens=${N}, temperature=0, logprobs=True,
    extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": sys.argv[2]}}, {"type": "text", "text": ${JSON.stringify(TEXT)}}]}])
print(json.dumps({"tokens": [t.token for t in r.choices[0].logprobs.content], "usage": r.usage.model_dump()}))`;
    const got = JSON.parse(await runPythonAsync(["-c", script, `${srv.url}/v1`, dataUrl(readFileSync(png))])) as {
      tokens: string[];
      usage: { prompt_tokens: number };
    };
    const tok = engine.loaded.tokenizer;
    expect(got.usage.prompt_tokens, "prompt tokens").toBe(ref.ids.length);
    expect(got.tokens).toEqual(ref.tokens.map((id) => tok.decode([id], { skipSpecialTokens: false })));
  });

  test("mlx-bun generate --image: greedy tokens equal mlx-vlm's (image first, then the text, as mlx_vlm.generate); bad images are clear errors", async () => {
    const args = ["generate", "--model", ckpt, "--prompt", TEXT, "--max-tokens", String(N), "--temp", "0", "--json"];
    const noThinking = ["--chat-template-config", '{"enable_thinking": false}'];
    const r = await runCli([...args, ...noThinking, "--image", png]);
    expect(r.code, r.stderr).toBe(0);
    const j = JSON.parse(r.stdout);
    expect(j.prompt_ids).toEqual(ref.ids);
    expect(j.generated_ids).toEqual(ref.tokens);
    const bad = join(tmp.path, "not-an-image.png");
    writeFileSync(bad, "hello");
    const e = await runCli([...args, "--image", bad]);
    expect(e.code).toBe(1);
    expect(e.stderr).toMatch(/^mlx-bun: error: --image .*not-an-image\.png: .*not an image/m);
  }, 120_000);

  test("100 image requests (data: URLs and file paths) leave MLX's active memory at its baseline", async () => {
    await post(srv.url, [
      { type: "image_url", image_url: { url: png } },
      { type: "text", text: TEXT },
    ]);
    memory.clearCache();
    const baseline = memory.active();
    const handles = memory.liveHandles();
    const url = dataUrl(readFileSync(png));
    for (let i = 0; i < 100; i += 4) {
      const rs = await Promise.all(
        [0, 1, 2, 3].map((k) =>
          post(srv.url, [
            { type: "text", text: `${i + k}` },
            { type: "image_url", image_url: { url: k % 2 ? url : `file://${png}` } },
          ]),
        ),
      );
      for (const r of rs) expect(r.status, JSON.stringify(r.body)).toBe(200);
    }
    memory.clearCache();
    expect(memory.liveHandles()).toBe(handles);
    expect(memory.active()).toBe(baseline);
  });

  test("bad images are 400s naming the part", async () => {
    const bytes = readFileSync(png);
    const cases: [unknown, RegExp, string?][] = [
      [{ url: "https://example.com/cat.png" }, /--allow-remote-images/, "remote_images_disabled"],
      [{ url: dataUrl(bytes, "text/plain") }, /content type must be image/, "invalid_image_content_type"],
      [{ url: dataUrl(new TextEncoder().encode("hello, no image here")) }, /not an image/, "image_not_an_image"],
      [{ url: dataUrl(bytes.subarray(0, Math.floor(bytes.length / 2))) }, /truncated|could not be decoded/],
      [{ url: big }, /megapixels/, "image_too_large"],
      [{ url: "relative/a.png" }, /must be absolute/],
      [{ url: join(tmp.path, "missing.png") }, /cannot read/, "image_not_found"],
      [{}, /non-empty "url"/],
    ];
    for (const [iu, msg, code] of cases) {
      const r = await post(srv.url, [
        { type: "text", text: "x" },
        { type: "image_url", image_url: iu },
      ]);
      expect(r.status, JSON.stringify(r.body)).toBe(400);
      expect(r.body.error.message).toMatch(msg);
      expect(r.body.error.param).toMatch(/^messages\[0\]\.content\[1\]\.image_url/);
      if (code) expect(r.body.error.code).toBe(code);
    }
    const r = await post(textOnly.url, [{ type: "image_url", image_url: { url: png } }]);
    expect(r.status).toBe(400);
    expect(r.body.error.message).toMatch(/has no vision tower/);
    expect(r.body.error.param).toBe("messages[0].content[0].image_url");
  });
});

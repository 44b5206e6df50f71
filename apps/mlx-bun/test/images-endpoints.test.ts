// Images on the other endpoints of `mlx-bun serve` (server/images.ts through anthropic.ts and
// responses.ts) on a tiny Gemma 4 vision checkpoint (tools/make-tiny-model/make_tiny_vision_model.py):
// the official @anthropic-ai/sdk (image blocks, base64) and `openai` npm client (responses API,
// input_image with a data: URL) send an image and a text; the prompt ids and the greedy tokens equal
// mlx-vlm's for the same image and prompt (tools/oracle/gemma4_vision_oracle.py run), with thinking
// off as mlx-vlm's processor renders it (Anthropic: no `thinking`, its default; Responses:
// reasoning.effort "none"); count_tokens counts the image's soft tokens. Bad images, images in tool
// results (the template does not render them), and a model without a vision tower are 400s in each
// endpoint's error shape; /v1/completions refuses images with a 400.
import { readFileSync } from "node:fs";
import Anthropic, { type APIError as AnthropicError } from "@anthropic-ai/sdk";
import { type Engine, type GenerateRequest, type GenerationResult } from "@mlx-bun/runtime";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import type { RunningServer } from "../src/server/http.ts";
import { tempDir } from "./helpers.ts";
import { makeVisionFixture, startVisionServers, type VisionServers, visionReference } from "./vision-fixtures.ts";

const N = 8;
const TEXT = "What is in this picture?";
let tmp: ReturnType<typeof tempDir>;
let ckpt: string;
let engine: Engine;
let srv: RunningServer;
let textOnly: RunningServer;
let servers: VisionServers;
let png: string;
let pngBytes: Buffer;
/** mlx-vlm's prompt ids and greedy tokens for [image, TEXT]. */
let ref: { ids: number[]; tokens: number[] };
/** What the server submitted to the scheduler, and the results. */
const seen: { req: GenerateRequest; result: Promise<GenerationResult> }[] = [];

beforeAll(() => {
  tmp = tempDir("mlxb-images-endpoints-");
  ({ ckpt, png } = makeVisionFixture(tmp.path));
  pngBytes = readFileSync(png);
  ref = visionReference(tmp.path, { ckpt, png }, TEXT, N);
  servers = startVisionServers(ckpt, (sched) => ({
    get active() {
      return sched.active;
    },
    submit(r: GenerateRequest) {
      const stream = sched.submit(r);
      seen.push({ req: r, result: stream.result });
      return stream;
    },
  }));
  ({ engine, srv, textOnly } = servers);
}, 300_000);

afterAll(async () => {
  await servers?.stop();
  tmp?.cleanup();
});

const b64 = (b: Uint8Array) => Buffer.from(b).toString("base64");
const dataUrl = (b: Uint8Array, type = "image/png") => `data:${type};base64,${b64(b)}`;

async function post(base: string, path: string, body: unknown): Promise<{ status: number; body: any }> {
  const r = await fetch(`${base}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

/** The last request the server submitted: its prompt ids and generated tokens. */
async function lastRun(): Promise<{ promptIds: number[]; tokens: number[] }> {
  const s = seen.at(-1)!;
  return { promptIds: [...s.req.promptIds], tokens: (await s.result).tokens };
}

describe("Anthropic image blocks", () => {
  const image = (data = b64(pngBytes), media_type: "image/png" | "image/jpeg" = "image/png"): Anthropic.ImageBlockParam => ({
    type: "image",
    source: { type: "base64", media_type, data },
  });

  test("the official SDK: prompt ids and greedy tokens equal mlx-vlm's; count_tokens counts the image", async () => {
    const client = new Anthropic({ baseURL: srv.url, apiKey: "x", maxRetries: 0 });
    const messages: Anthropic.MessageParam[] = [{ role: "user", content: [image(), { type: "text", text: TEXT }] }];
    // No `thinking`: off, as Anthropic's default and mlx-vlm's processor. Greedy: the server's
    // default temperature (0, as mlx_lm.server); the SDK's types have no temperature.
    const m = await client.messages.create({ model: "tiny", max_tokens: N, messages });
    const run = await lastRun();
    expect(run.promptIds).toEqual(ref.ids);
    expect(run.tokens).toEqual(ref.tokens);
    expect(m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0)).toBe(ref.ids.length);
    expect(m.usage.output_tokens).toBe(N);
    const text = m.content.map((b) => (b.type === "text" ? b.text : b.type === "thinking" ? b.thinking : "")).join("");
    expect(text.length).toBeGreaterThan(0);
    const c = await client.messages.countTokens({ model: "tiny", messages });
    expect(c.input_tokens).toBe(ref.ids.length);
    // Streamed, the same tokens.
    const s = client.messages.stream({ model: "tiny", max_tokens: N, messages });
    await s.finalMessage();
    expect((await lastRun()).tokens).toEqual(ref.tokens);
  });

  test("bad images, images in tool results, a model without a vision tower: 400s in Anthropic's shape naming the block", async () => {
    const half = b64(pngBytes.subarray(0, Math.floor(pngBytes.length / 2)));
    const msg = (content: unknown[], role = "user") => ({ model: "tiny", max_tokens: 4, messages: [{ role, content }] });
    const cases: [unknown, string][] = [
      [msg([image(b64(pngBytes), "image/jpeg")]), "messages.0.content.0.source.data: the image data does not match the provided media type image/jpeg"],
      [msg([{ type: "image", source: { type: "base64", media_type: "image/bmp", data: b64(pngBytes) } }]), "messages.0.content.0.source.media_type:"],
      [msg([image("not base64!")]), "messages.0.content.0.source.data: is not valid base64"],
      [msg([image(half)]), "messages.0.content.0.source: "],
      [msg([{ type: "image", source: { type: "url", url: "https://example.com/cat.png" } }]), "--allow-remote-images"],
      [msg([{ type: "image", source: { type: "file", file_id: "file_1" } }]), "messages.0.content.0.source.type: file sources"],
      [msg([{ type: "image" }]), "messages.0.content.0.source: Field required"],
      [msg([{ type: "image", source: { type: "base64", media_type: "image/png", data: b64(pngBytes), extra: 1 } }]), "source.extra: Extra inputs"],
      [
        {
          model: "tiny",
          max_tokens: 4,
          messages: [
            { role: "user", content: "Hi" },
            { role: "assistant", content: [image()] },
            { role: "user", content: "Hi" },
          ],
        },
        "messages.1.content.0.type: image blocks belong in user messages",
      ],
      [
        {
          model: "tiny",
          max_tokens: 4,
          messages: [
            { role: "user", content: "Take a screenshot" },
            { role: "assistant", content: [{ type: "tool_use", id: "toolu_1", name: "shot", input: {} }] },
            { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: [{ type: "text", text: "here" }, image()] }] },
          ],
        },
        "messages.2.content.0.content.1.source: the model's chat template does not render images in tool messages",
      ],
    ];
    for (const [body, want] of cases) {
      for (const path of ["/v1/messages", "/v1/messages/count_tokens"]) {
        const b = path.endsWith("count_tokens") ? { ...(body as Record<string, unknown>), max_tokens: undefined } : body;
        const r = await post(srv.url, path, b);
        expect([r.status, r.body.type, r.body.error?.type], `${path} ${JSON.stringify(body).slice(0, 300)}`).toEqual([400, "error", "invalid_request_error"]);
        expect(r.body.error.message).toContain(want);
      }
    }
    const client = new Anthropic({ baseURL: textOnly.url, apiKey: "x", maxRetries: 0 });
    const e = (await client.messages
      .create({ model: "text", max_tokens: 4, messages: [{ role: "user", content: [image(), { type: "text", text: "Hi" }] }] })
      .catch((x) => x)) as AnthropicError;
    expect(e.status).toBe(400);
    expect((e.error as { error: { type: string; message: string } }).error).toEqual({
      type: "invalid_request_error",
      message: "messages.0.content.0.source: the model 'text' has no vision tower: it does not take images",
    });
  });
});

describe("Responses input_image parts", () => {
  test("the official openai client: prompt ids and greedy tokens equal mlx-vlm's (reasoning.effort none: thinking off)", async () => {
    const client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: "x", maxRetries: 0 });
    const input: OpenAI.Responses.ResponseInput = [
      {
        role: "user",
        content: [
          { type: "input_image", image_url: dataUrl(pngBytes), detail: "auto" },
          { type: "input_text", text: TEXT },
        ],
      },
    ];
    const r = await client.responses.create({ model: "tiny", input, max_output_tokens: N, temperature: 0, reasoning: { effort: "none" } });
    const run = await lastRun();
    expect(run.promptIds).toEqual(ref.ids);
    expect(run.tokens).toEqual(ref.tokens);
    expect(r.usage?.input_tokens).toBe(ref.ids.length);
    expect(r.usage?.output_tokens).toBe(N);
    // previous_response_id carries the image on: the next turn's prompt starts with this one's.
    const next = await client.responses.create({
      model: "tiny",
      previous_response_id: r.id,
      input: "And now?",
      max_output_tokens: 2,
      temperature: 0,
      reasoning: { effort: "none" },
    });
    expect(next.status).toBe("incomplete");
    const image = engine.loaded.tokenizer.tokenToId("<|image|>")!;
    const count = (ids: number[]) => ids.filter((t) => t === image).length;
    expect(count((await lastRun()).promptIds)).toBe(count(ref.ids));
    // Streamed, the same tokens.
    const s = client.responses.stream({ model: "tiny", input, max_output_tokens: N, temperature: 0, reasoning: { effort: "none" } });
    await s.finalResponse();
    expect((await lastRun()).tokens).toEqual(ref.tokens);
  });

  test("bad images, images in function_call_output, a model without a vision tower: 400s in OpenAI's shape naming the part", async () => {
    const user = (part: Record<string, unknown>, role = "user") => ({
      model: "tiny",
      max_output_tokens: 4,
      input: [
        {
          role,
          content: [
            { type: "input_text", text: "x" },
            { type: "input_image", ...part },
          ],
        },
      ],
    });
    const P = "input[0].content[1]";
    const cases: [unknown, string, RegExp, string?][] = [
      [user({ image_url: dataUrl(pngBytes, "text/plain") }), `${P}.image_url`, /content type must be image/, "invalid_image_content_type"],
      [user({ image_url: dataUrl(new TextEncoder().encode("hello, no image here")) }), `${P}.image_url`, /not an image/, "image_not_an_image"],
      [user({ image_url: dataUrl(pngBytes.subarray(0, Math.floor(pngBytes.length / 2))) }), `${P}.image_url`, /truncated|could not be decoded/],
      [user({ image_url: "https://example.com/cat.png" }), `${P}.image_url`, /--allow-remote-images/, "remote_images_disabled"],
      [user({ image_url: "relative.png" }), `${P}.image_url`, /must be absolute/],
      [user({ image_url: png, detail: "ultra" }), `${P}.detail`, /'auto', 'low', 'high', 'original'/, "invalid_value"],
      [user({ file_id: "file_1" }), `${P}.file_id`, /Files API/, "unsupported_parameter"],
      [user({}), `${P}.image_url`, /Missing required parameter/, "missing_required_parameter"],
      [user({ image_url: png, foo: 1 }), `${P}.foo`, /Unknown parameter/, "unknown_parameter"],
      [user({ image_url: png }, "system"), `${P}.type`, /user messages and function_call_output only/, "unsupported_parameter"],
      [
        {
          model: "tiny",
          input: [
            { role: "user", content: "Take a screenshot" },
            { type: "function_call", call_id: "call_1", name: "shot", arguments: "{}" },
            { type: "function_call_output", call_id: "call_1", output: [{ type: "input_image", image_url: png }] },
          ],
        },
        "input[2].output[0].image_url",
        /does not render images in tool messages/,
        "invalid_value",
      ],
    ];
    for (const [body, param, msg, code] of cases) {
      const r = await post(srv.url, "/v1/responses", body);
      expect(r.status, JSON.stringify(r.body)).toBe(400);
      expect(r.body.error.param).toBe(param);
      expect(r.body.error.message).toMatch(msg);
      if (code) expect(r.body.error.code).toBe(code);
    }
    const client = new OpenAI({ baseURL: `${textOnly.url}/v1`, apiKey: "x", maxRetries: 0 });
    const e = (await client.responses
      .create({ model: "text", input: [{ role: "user", content: [{ type: "input_image", image_url: png, detail: "auto" }] }] })
      .catch((x) => x)) as InstanceType<typeof OpenAI.APIError>;
    expect(e.status).toBe(400);
    expect(e.param).toBe("input[0].content[0].image_url");
    expect(e.code).toBe("model_not_multimodal");
  });
});

describe("/v1/completions", () => {
  test("takes no images: a clear 400, not a silent ignore", async () => {
    const cases: [unknown, string][] = [
      [
        {
          prompt: [
            { type: "image_url", image_url: { url: png } },
            { type: "text", text: "x" },
          ],
        },
        "prompt",
      ],
      [{ prompt: "Describe", images: [dataUrl(pngBytes)] }, "images"],
      [{ prompt: "Describe", image_url: { url: png } }, "image_url"],
      [{ prompt: "Describe", multi_modal_data: { image: png } }, "multi_modal_data"],
      [{ prompt: "<|image|> Describe" }, "prompt"],
    ];
    for (const [body, param] of cases) {
      const r = await post(srv.url, "/v1/completions", { max_tokens: 2, ...(body as Record<string, unknown>) });
      expect(r.status, JSON.stringify(r.body)).toBe(400);
      expect(r.body.error.param).toBe(param);
      expect(r.body.error.message).toMatch(/\/v1\/completions takes no images/);
    }
  });
});

// `mlx-bun serve --draft-model <Gemma 4 MTP drafter>` as a process: a chat completion returns the
// same tokens as the same request without speculation (num_draft_tokens 0: the plain batched
// path), alone and with two requests in flight at once (two speculative ones, and a speculative
// one beside a plain one: with an MTP drafter they share the scheduler's decode batch). The drafter is an "echo" drafter made with mlx-vlm's own modules
// (tools/make-tiny-model/make_tiny_drafter.py), so rounds accept drafts; the target is float32,
// where greedy speculative output equals plain greedy output (docs/speculative.md).
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { runPython } from "../../../tools/oracle/oracle.ts";
import { makeTinySmall, ROOT, type ServeProcess, startServe, tempDir } from "./helpers.ts";

let tmp: ReturnType<typeof tempDir>;
let srv: ServeProcess | undefined;
let url: string;

beforeAll(async () => {
  tmp = tempDir("mlxb-mtp-serve-");
  const target = makeTinySmall(join(tmp.path, "target"), ["--dtype", "float32", "--set", "head_dim=64"]);
  const drafter = join(tmp.path, "drafter");
  runPython([join(ROOT, "tools", "make-tiny-model", "make_tiny_drafter.py"), "--target", target, "--out", drafter, "--echo"]);
  srv = await startServe(["--model", target, "--draft-model", drafter]);
  url = srv.url;
});

afterAll(async () => {
  await srv?.stop();
  tmp?.cleanup();
});

interface Answer {
  text: string;
  tokens: string[];
  completion: number;
  speculative?: { drafted_tokens: number; accepted_tokens: number };
}

async function chat(content: string, extra: Record<string, unknown> = {}): Promise<Answer> {
  const body = { messages: [{ role: "user", content }], max_tokens: 20, temperature: 0, logprobs: true, ...extra };
  const r = await fetch(`${url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  const j = (await r.json()) as {
    choices: { message: { content: string }; logprobs: { content: { token: string }[] } }[];
    usage: { completion_tokens: number; speculative?: Answer["speculative"] };
  };
  expect(r.status, JSON.stringify(j)).toBe(200);
  const c = j.choices[0]!;
  return { text: c.message.content, tokens: c.logprobs.content.map((t) => t.token), completion: j.usage.completion_tokens, speculative: j.usage.speculative };
}

const A = "tell me about the quick brown fox and the lazy dog";
const B = "write a short poem about the sea";

describe("serve --draft-model <MTP drafter>", () => {
  test("a chat completion has the same tokens with and without the drafter, alone and two at once", async () => {
    const plainA = await chat(A, { num_draft_tokens: 0 });
    const plainB = await chat(B, { num_draft_tokens: 0 });
    expect(plainA.speculative).toBeUndefined();
    expect(plainA.completion).toBeGreaterThan(0);
    expect(plainA.tokens).not.toEqual(plainB.tokens);

    // Alone: the drafter's default k (block_size - 1).
    const specA = await chat(A);
    expect(specA.tokens).toEqual(plainA.tokens);
    expect(specA.text).toBe(plainA.text);
    expect(specA.speculative!.drafted_tokens).toBeGreaterThan(0);
    expect(specA.speculative!.accepted_tokens).toBeGreaterThan(0); // the echo drafter's drafts are kept

    // Two speculative requests in flight at once.
    const [a2, b2] = await Promise.all([chat(A), chat(B)]);
    expect(a2.tokens).toEqual(plainA.tokens);
    expect(b2.tokens).toEqual(plainB.tokens);
    expect(b2.text).toBe(plainB.text);
    expect(b2.speculative!.drafted_tokens).toBeGreaterThan(0);

    // A speculative request beside a plain one.
    const [a3, b3] = await Promise.all([chat(A, { num_draft_tokens: 2 }), chat(B, { num_draft_tokens: 0 })]);
    expect(a3.tokens).toEqual(plainA.tokens);
    expect(b3.tokens).toEqual(plainB.tokens);
    expect(b3.speculative).toBeUndefined();
  });
});

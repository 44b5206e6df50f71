// `mlx-bun serve --draft-model` as a process: speculative requests return the same greedy text as
// the same request without the draft (num_draft_tokens 0), usage.speculative counts what was
// drafted and kept, a request's num_draft_tokens applies to it, and /health sums the requests.
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { makeTinySmall, type ServeProcess, startServe, tempDir } from "./helpers.ts";

let tmp: ReturnType<typeof tempDir>;
let srv: ServeProcess | undefined;
let url: string;

beforeAll(async () => {
  tmp = tempDir("mlxb-spec-serve-");
  // A float32 target (greedy equality holds exactly there: docs/speculative.md) and its 4-bit
  // quantization as the draft, which agrees with it often but not always.
  const target = makeTinySmall(join(tmp.path, "target"), ["--dtype", "float32"]);
  const draft = makeTinySmall(join(tmp.path, "draft"), ["--dtype", "float32", "--quant", "4bit"]);
  srv = await startServe(["--model", target, "--draft-model", draft, "--num-draft-tokens", "2"]);
  expect(srv.startup).toContain("draft");
  url = srv.url;
});

afterAll(async () => {
  await srv?.stop();
  tmp?.cleanup();
});

interface Usage {
  completion_tokens: number;
  speculative?: { drafted_tokens: number; accepted_tokens: number; acceptance_rate: number };
}
async function complete(extra: Record<string, unknown>): Promise<{ text: string; usage: Usage }> {
  const body = { prompt: "the quick brown fox jumps over the lazy dog and the model thinks", max_tokens: 16, temperature: 0, ...extra };
  const r = await fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  const j = (await r.json()) as { choices: { text: string }[]; usage: Usage; error?: unknown };
  expect(r.status, JSON.stringify(j)).toBe(200);
  return { text: j.choices[0]!.text, usage: j.usage };
}

describe("serve --draft-model", () => {
  test("greedy text equals the text without the draft; usage.speculative; per-request num_draft_tokens; /health totals", async () => {
    const plain = await complete({ num_draft_tokens: 0 });
    expect(plain.usage.speculative).toBeUndefined();
    expect(plain.usage.completion_tokens).toBe(16);
    expect(plain.text.length).toBeGreaterThan(0);

    const spec = await complete({}); // the server's --num-draft-tokens 2
    expect(spec.text).toBe(plain.text);
    const s = spec.usage.speculative!;
    expect(s.drafted_tokens).toBeGreaterThan(0);
    expect(s.accepted_tokens).toBeGreaterThan(0); // a 4-bit copy of the target agrees with it often
    expect(s.accepted_tokens).toBeLessThanOrEqual(s.drafted_tokens);
    expect(s.acceptance_rate).toBeCloseTo(s.accepted_tokens / s.drafted_tokens, 12);
    // Each round drafts at most 2 and emits its kept drafts plus one target token.
    const rounds = Math.ceil(s.drafted_tokens / 2);
    expect(spec.usage.completion_tokens).toBeLessThanOrEqual(s.accepted_tokens + s.drafted_tokens);
    expect(rounds).toBeLessThanOrEqual(spec.usage.completion_tokens);

    // num_draft_tokens 1 for this request: one draft per round, so drafted = rounds, and each
    // round emits its kept draft (0 or 1) plus the target's token; only the last round can lose
    // that token to max_tokens. So tokens = accepted + drafted, or one less.
    const one = await complete({ num_draft_tokens: 1 });
    expect(one.text).toBe(plain.text);
    const o = one.usage.speculative!;
    expect(o.accepted_tokens + o.drafted_tokens - one.usage.completion_tokens).toBeGreaterThanOrEqual(0);
    expect(o.accepted_tokens + o.drafted_tokens - one.usage.completion_tokens).toBeLessThanOrEqual(1);

    // Streamed, with the usage chunk: the same text and counts as not streamed.
    const res = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        prompt: "the quick brown fox jumps over the lazy dog and the model thinks",
        max_tokens: 16,
        temperature: 0,
        stream: true,
        stream_options: { include_usage: true },
      }),
    });
    let text = "";
    let usage: Usage | undefined;
    for (const line of (await res.text()).split("\n")) {
      if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
      const c = JSON.parse(line.slice(6)) as { choices: { text: string }[]; usage?: Usage | null };
      text += c.choices[0]?.text ?? "";
      if (c.usage) usage = c.usage;
    }
    expect(text).toBe(plain.text);
    expect(usage!.speculative).toEqual(s);

    const h = (await (await fetch(`${url}/health`)).json()) as {
      draft_model: string;
      speculative: { requests: number; drafted_tokens: number; accepted_tokens: number; acceptance_rate: number };
    };
    expect(h.draft_model).toContain("draft");
    expect(h.speculative.requests).toBe(3);
    expect(h.speculative.drafted_tokens).toBe(2 * s.drafted_tokens + o.drafted_tokens);
    expect(h.speculative.accepted_tokens).toBe(2 * s.accepted_tokens + o.accepted_tokens);
    expect(h.speculative.acceptance_rate).toBeCloseTo(h.speculative.accepted_tokens / h.speculative.drafted_tokens, 12);
  });
});

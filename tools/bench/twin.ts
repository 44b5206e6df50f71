// The Python twin of the benches: tools/bench/mlx_lm_bench.py --serve, one JSON command per line
// on stdin and one JSON reply per line on stdout, so mlx-lm runs in the same machine state.
import { join } from "node:path";

function spawnTwin(python: string, root: string) {
  return Bun.spawn([python, join(root, "tools", "bench", "mlx_lm_bench.py"), "--serve"], { stdin: "pipe", stdout: "pipe", stderr: "inherit" });
}

export class Twin {
  #p: ReturnType<typeof spawnTwin>;
  #read: () => Promise<{ done: boolean; value?: Uint8Array }>;
  #buf = "";
  #dec = new TextDecoder();
  constructor(python: string, root: string) {
    this.#p = spawnTwin(python, root);
    const reader = this.#p.stdout.getReader();
    this.#read = () => reader.read();
  }
  async line(): Promise<string> {
    for (;;) {
      const nl = this.#buf.indexOf("\n");
      if (nl >= 0) {
        const l = this.#buf.slice(0, nl);
        this.#buf = this.#buf.slice(nl + 1);
        return l;
      }
      const { value, done } = await this.#read();
      if (done) throw new Error("mlx_lm_bench.py exited");
      this.#buf += this.#dec.decode(value);
    }
  }
  async call<T = Record<string, unknown>>(cmd: string, args: Record<string, unknown> = {}): Promise<T> {
    this.#p.stdin.write(`${JSON.stringify({ cmd, ...args })}\n`);
    this.#p.stdin.flush();
    const r = JSON.parse(await this.line()) as { ok: boolean; error?: string; trace?: string };
    if (!r.ok) throw new Error(`mlx_lm_bench ${cmd}: ${r.error}\n${r.trace ?? ""}`);
    return r as T;
  }
  async close(): Promise<void> {
    this.#p.stdin.write(`{"cmd":"quit"}\n`);
    this.#p.stdin.end();
    await this.#p.exited;
  }
}

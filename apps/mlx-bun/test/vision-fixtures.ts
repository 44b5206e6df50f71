// What the app's image tests share: the tiny vision checkpoint (tools/make-tiny-model/
// make_tiny_vision_model.py: vision-e), a PNG of pseudo-random pixels, and mlx-vlm's prompt ids and
// greedy tokens for [that image, a text] (tools/oracle/gemma4_vision_oracle.py run).
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { loadSafetensors } from "@mlx-bun/mlx-ffi";
import { Engine, Scheduler } from "@mlx-bun/runtime";
import { runPython } from "../../../tools/oracle/oracle.ts";
import { type RunningServer, startServer } from "../src/server/http.ts";
import { imageSupportFor } from "../src/server/images.ts";
import type { RequestSink } from "../src/server/server-options.ts";
import { ROOT } from "./helpers.ts";

export interface VisionFixture {
  /** The vision-e checkpoint. */
  ckpt: string;
  /** A 130 x 100 PNG. */
  png: string;
}

/** The tiny vision checkpoints and the PNG, in `dir`. */
export function makeVisionFixture(dir: string): VisionFixture {
  runPython([join(ROOT, "tools", "make-tiny-model", "make_tiny_vision_model.py"), "--suite", dir]);
  const png = join(dir, "a.png");
  const py = `import sys, numpy as np; from PIL import Image
Image.fromarray(np.random.default_rng(1).integers(0, 256, (100, 130, 3), dtype=np.uint8)).save(sys.argv[1])`;
  runPython(["-c", py, png]);
  return { ckpt: join(dir, "vision-e"), png };
}

/** mlx-vlm's prompt ids and `steps` greedy tokens for a user message [image, text] (thinking off, as its processor renders). */
export function visionReference(dir: string, f: VisionFixture, text: string, steps: number): { ids: number[]; tokens: number[] } {
  const req = join(dir, "vision-ref.json");
  writeFileSync(req, JSON.stringify({ messages: [{ role: "user", content: [{ type: "image" }, { type: "text", text }] }], images: [f.png], steps }));
  const out = join(dir, "vision-ref.safetensors");
  runPython([join(ROOT, "tools", "oracle", "gemma4_vision_oracle.py"), "run", f.ckpt, out, req]);
  using r = loadSafetensors(out);
  return {
    ids: [...(r.tensors.get("input_ids")!.toTypedArray() as Int32Array)],
    tokens: [...(r.tensors.get("tokens")!.toTypedArray() as Int32Array)],
  };
}

export interface VisionServers {
  engine: Engine;
  scheduler: Scheduler;
  /** The checkpoint with its vision tower ("tiny"). */
  srv: RunningServer;
  /** The same model served as text-only (images: null; "text"). */
  textOnly: RunningServer;
  stop(): Promise<void>;
}

/** The vision checkpoint behind two servers on one scheduler (maxBatch 4); `sink` may wrap the scheduler to see what is submitted. */
export function startVisionServers(ckpt: string, sink: (s: Scheduler) => RequestSink = (s) => s): VisionServers {
  const engine = Engine.load(ckpt);
  const scheduler = new Scheduler(engine, { maxBatch: 4 });
  const to = sink(scheduler);
  const srv = startServer({ model: engine.loaded, scheduler: to, modelId: "tiny", port: 0, webDir: null, images: imageSupportFor(engine.loaded) });
  const textOnly = startServer({ model: engine.loaded, scheduler: to, modelId: "text", port: 0, webDir: null, images: null });
  return {
    engine,
    scheduler,
    srv,
    textOnly,
    async stop() {
      await srv.stop();
      await textOnly.stop();
      await scheduler.close();
      engine.dispose();
    },
  };
}

// Thin entry: run make_tiny_model.py with the project's venv Python, passing the arguments through.
//   bun tools/make-tiny-model/make-tiny-model.ts --variant small --out /tmp/tiny-small [--quant 4bit] [--check]
//   bun tools/make-tiny-model/make-tiny-model.ts --suite /tmp/tiny
import { join } from "node:path";
import { oraclePython } from "../oracle/oracle.ts";

const script = join(import.meta.dir, "make_tiny_model.py");
const p = Bun.spawnSync([oraclePython(), script, ...process.argv.slice(2)], { stdout: "inherit", stderr: "inherit" });
process.exit(p.exitCode ?? 1);

import { packageBuildConfig } from "../../tools/tsup.shared.ts";

const config = packageBuildConfig(["@mlx-bun/mlx-ffi", "@mlx-bun/mlx-ops", "@mlx-bun/kv-cache", "@mlx-bun/models"]);

// The grammar workers (structured-output.ts) are loaded by URL at run time: entries of their own.
export default { ...config, entry: ["src/index.ts", "src/grammar-worker.ts", "src/grammar-engine-worker.ts"] };

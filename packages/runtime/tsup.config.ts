import { packageBuildConfig } from "../../tools/tsup.shared.ts";

const config = packageBuildConfig(["@mlx-bun/mlx-ffi", "@mlx-bun/mlx-ops", "@mlx-bun/kv-cache", "@mlx-bun/models"]);

// The grammar worker (structured-output.ts) is loaded by URL at run time: it is an entry of its own.
export default { ...config, entry: ["src/index.ts", "src/grammar-worker.ts"] };

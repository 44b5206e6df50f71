import { packageBuildConfig } from "../../tools/tsup.shared.ts";

export default packageBuildConfig(["@mlx-bun/mlx-ffi", "@mlx-bun/mlx-ops", "@mlx-bun/kv-cache"]);

import { packageBuildConfig } from "../../tools/tsup.shared.ts";

// Two entries: the library, and the source-build fallback (bin mlx-bun-build-native).
export default { ...packageBuildConfig([]), entry: ["src/index.ts", "src/build-native.ts"] };

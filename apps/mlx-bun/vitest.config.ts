import { packageTestConfig } from "../../tools/vitest.shared.ts";

export default packageTestConfig("mlx-bun");

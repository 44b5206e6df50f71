import { packageBuildConfig } from "../../tools/tsup.shared.ts";

export default packageBuildConfig([]);

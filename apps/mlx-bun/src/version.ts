// The app's version (package.json), for --version and the server's system_fingerprint.
import pkg from "../package.json" with { type: "json" };

export const VERSION: string = pkg.version;

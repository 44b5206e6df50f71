// Checkpoint files are opened only when they are regular files: opening a FIFO (or a character
// device) for reading blocks until a writer comes, so a checkpoint folder holding one would hang
// the load forever instead of failing.
import { statSync } from "node:fs";

/** What a path is, in words, for an error message. */
function kindOf(st: ReturnType<typeof statSync>): string {
  if (!st) return "missing";
  if (st.isDirectory()) return "a directory";
  if (st.isFIFO()) return "a FIFO (named pipe)";
  if (st.isSocket()) return "a socket";
  if (st.isCharacterDevice()) return "a character device";
  if (st.isBlockDevice()) return "a block device";
  return "not a regular file";
}

/**
 * Throw `make(message)` unless `path` is a regular file (symbolic links are followed). Does not
 * open the file, so it never blocks. A missing file is left to the caller's own open (its
 * "file not found" message stays as it was).
 */
export function assertRegularFile(path: string, make: (message: string) => Error): void {
  let st: ReturnType<typeof statSync>;
  try {
    st = statSync(path);
  } catch {
    return;
  }
  if (st && !st.isFile()) throw make(`${path}: ${kindOf(st)}, not a regular file; checkpoint files must be regular files`);
}

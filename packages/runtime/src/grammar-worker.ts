// A Bun Worker that turns a JSON schema into XGrammar's EBNF (structured-output.ts). XGrammar's
// WebAssembly build aborts on a schema it cannot convert, and its module is unusable after an
// abort, so user schemas are converted here, in a module of this worker's own: an abort costs
// only this worker (the parent replaces it) and its message names the problem.
declare const self: Worker;

/** A request: the schema text and XGrammar's conversion options, or EBNF to parse (the answer: ""). */
export type ConvertRequest = { id: number; schema: string; strict: boolean } | { id: number; ebnf: string };

/** The answer: the EBNF of the schema, or why XGrammar refused it (the module is then retired). */
export type ConvertReply = { id: number; ebnf: string } | { id: number; error: string };

// XGrammar prints its fatal messages through console.error before aborting: keep the last one.
let lastFatal = "";
console.error = (...args: unknown[]) => {
  const line = args.map(String).join(" ");
  if (line.includes("[FATAL]") || !lastFatal) lastFatal = line;
};

const xg = (await import("@mlc-ai/web-xgrammar")).default;

self.onmessage = async (ev: MessageEvent<ConvertRequest>) => {
  const req = ev.data;
  const id = req.id;
  lastFatal = "";
  try {
    // One line, ", " and ": " as separators (json.dumps' defaults), no free whitespace.
    const ebnf = "ebnf" in req ? req.ebnf : await xg.Testings._jsonSchemaToEBNF(req.schema, false, -1, undefined, req.strict);
    // Parse it here too, so the parent only ever parses EBNF that parsed once already.
    (await xg.Grammar.fromEBNF(ebnf)).dispose();
    self.postMessage({ id, ebnf: "ebnf" in req ? "" : ebnf } satisfies ConvertReply);
  } catch (e) {
    self.postMessage({ id, error: fatalMessage(lastFatal) || (e as Error).message } satisfies ConvertReply);
  }
};

/** "[FATAL] /path/json_schema_converter.cc:902: Unsupported type "foo"" → "Unsupported type "foo"". */
function fatalMessage(line: string): string {
  const m = /\[FATAL\]\s*\S+:\d+:\s*(.*)$/s.exec(line.trim());
  return (m ? m[1]! : line).replace(/^Check failed: \(.*?\) is false:\s*/s, "").trim();
}

self.postMessage({ ready: true });

// TeX in Markdown, as models write it: $…$ and \(…\) inline, $$…$$ and \[…\] displayed (a block
// when the delimiters open and close lines, inline otherwise). Only the syntax lives here; the
// caller renders the TeX. Dollar rules that keep prices as text: an inline $ must be followed by a
// non-space, its closing $ preceded by a non-space and not followed by a digit; \$ is a dollar.
import type { MarkdownIt, StateBlock, StateInline } from "markdown-it";

export type RenderTex = (tex: string, display: boolean) => string;

const isSpace = (c: string | undefined) => c === undefined || /\s/.test(c);

/** The end of the closing delimiter's match at or after `from`, or -1. */
function findClose(src: string, from: number, max: number, open: string, close: string): number {
  for (let i = from; i < max; ) {
    const j = src.indexOf(close, i);
    if (j < 0 || j + close.length > max) return -1;
    if (open === "$") {
      // not \$, not after a space, not before a digit (a price: "$5 and $10")
      if (src[j - 1] === "\\" || isSpace(src[j - 1]) || /[0-9]/.test(src[j + 1] ?? "")) {
        i = j + 1;
        continue;
      }
    }
    return j;
  }
  return -1;
}

function mathInline(state: StateInline, silent: boolean): boolean {
  const { src, pos, posMax } = state;
  let open: string;
  let close: string;
  let display: boolean;
  if (src[pos] === "$") {
    if (src[pos + 1] === "$") [open, close, display] = ["$$", "$$", true];
    else [open, close, display] = ["$", "$", false];
  } else if (src[pos] === "\\" && src[pos + 1] === "(") [open, close, display] = ["\\(", "\\)", false];
  else if (src[pos] === "\\" && src[pos + 1] === "[") [open, close, display] = ["\\[", "\\]", true];
  else return false;
  const from = pos + open.length;
  if (open === "$" && isSpace(src[from])) return false;
  const end = findClose(src, from, posMax, open, close);
  if (end < 0 || !src.slice(from, end).trim()) return false;
  if (!silent) {
    const t = state.push("math_inline", "math", 0);
    t.content = src.slice(from, end);
    t.markup = open;
    t.info = display ? "display" : "";
  }
  state.pos = end + close.length;
  return true;
}

function mathBlock(state: StateBlock, startLine: number, endLine: number, silent: boolean): boolean {
  if (state.sCount[startLine]! - state.blkIndent >= 4) return false;
  const lineText = (n: number) => state.src.slice(state.bMarks[n]! + state.tShift[n]!, state.eMarks[n]).trimEnd();
  const first = lineText(startLine);
  const open = first.startsWith("$$") ? "$$" : first.startsWith("\\[") ? "\\[" : null;
  if (!open) return false;
  const close = open === "$$" ? "$$" : "\\]";
  const rest = first.slice(2);
  let body: string[];
  let last = startLine;
  if (rest.endsWith(close) && rest.length > close.length - 1 && rest.trim() !== close.trim()) {
    body = [rest.slice(0, -close.length)]; // $$ x $$ on one line
  } else if (rest.includes(close)) {
    return false; // "$$x$$ and more": inline math in a paragraph
  } else {
    body = rest.trim() ? [rest] : [];
    let found = false;
    for (let n = startLine + 1; n < endLine; n++) {
      // A line less indented than the block (the end of a list item, a quote) ends the search.
      if (state.sCount[n]! < state.blkIndent && lineText(n) !== "") break;
      const t = lineText(n);
      if (t.endsWith(close)) {
        body.push(t.slice(0, -close.length));
        last = n;
        found = true;
        break;
      }
      body.push(t);
    }
    if (!found) return false; // not closed (yet, while a reply streams): shown as text
  }
  const tex = body.join("\n").trim();
  if (!tex) return false;
  if (silent) return true;
  const t = state.push("math_block", "math", 0);
  t.block = true;
  t.content = tex;
  t.markup = open;
  t.map = [startLine, last + 1];
  state.line = last + 1;
  return true;
}

/** Adds the math syntax to `md`; `render` makes the HTML of one formula. */
export function mathPlugin(md: MarkdownIt, render: RenderTex): void {
  // Before "escape", which would turn \( and \[ into plain brackets.
  md.inline.ruler.before("escape", "math_inline", mathInline);
  md.block.ruler.before("fence", "math_block", mathBlock, { alt: ["paragraph", "reference", "blockquote", "list"] });
  md.renderer.rules.math_inline = (tokens, i) => render(tokens[i]!.content, tokens[i]!.info === "display");
  md.renderer.rules.math_block = (tokens, i) => `<p class="math-block">${render(tokens[i]!.content, true)}</p>\n`;
}

// TeX → MathML with KaTeX (loaded on first need, as its own chunk). MathML output: the browser
// lays it out, so neither KaTeX's stylesheet nor its fonts nor any inline style are needed (the
// page's CSP allows none; the few style attributes KaTeX still writes, e.g. \fcolorbox's border,
// are dropped here, before DOMPurify, which drops them too). `trust: false` refuses \href, \url,
// \includegraphics and \html*; a formula that does not parse is shown as its source, marked as
// an error with KaTeX's message as its title.
import katex from "katex";

const escapeHtml = (s: string) => s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

export function renderTex(tex: string, display: boolean): string {
  try {
    const html = katex.renderToString(tex, {
      displayMode: display,
      output: "mathml",
      throwOnError: true,
      trust: false,
      strict: "ignore",
      maxSize: 20,
      maxExpand: 500,
    });
    // KaTeX escapes attribute values, so a style attribute of its output ends at the next quote.
    return html.replace(/\sstyle="[^"]*"/g, "");
  } catch (e) {
    const why = e instanceof katex.ParseError ? e.message : String(e);
    return `<code class="math-error" title="${escapeHtml(why)}">${escapeHtml(tex)}</code>`;
  }
}

// Model output → safe HTML. markdown-it with `html: false` escapes every tag the text holds (a
// `<script>` in a reply is shown as text) and refuses javascript:/vbscript:/data: links; DOMPurify
// then sanitizes its output again, as a second wall. Nothing a model writes reaches innerHTML any
// other way.
import DOMPurify from "dompurify";
import MarkdownIt from "markdown-it";

const md = new MarkdownIt({ html: false, linkify: true, breaks: true, typographer: false });

const purify = DOMPurify(window);
purify.addHook("afterSanitizeAttributes", (node) => {
  // Links open in a new tab, with no opener and no referrer.
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

const PURIFY_OPTIONS = {
  USE_PROFILES: { html: true },
  // No inline styles (the page's CSP has none either), no forms, no media that loads by itself.
  FORBID_ATTR: ["style"],
  FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "img", "video", "audio", "iframe", "object", "embed"],
  ADD_ATTR: ["target"],
};

/** Markdown text → sanitized HTML (a string for innerHTML). */
export function renderMarkdown(text: string): string {
  return purify.sanitize(md.render(text), PURIFY_OPTIONS) as string;
}

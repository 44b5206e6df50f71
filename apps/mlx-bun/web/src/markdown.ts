// Model output → safe HTML. markdown-it with `html: false` escapes every tag the text holds (a
// `<script>` in a reply is shown as text) and refuses javascript:/vbscript:/data: links; DOMPurify
// then sanitizes its output again, as a second wall. Nothing a model writes reaches innerHTML any
// other way.
//
// Two renderers are loaded on first need, as separate chunks (the page paints without them):
// highlight.js for fenced code with a language (./highlight.ts), KaTeX for TeX between $…$,
// $$…$$, \(…\) and \[…\] (./tex.ts; MathML output, so no inline styles and no fonts are needed,
// and it goes through DOMPurify like the rest). Until one has loaded, code is plain and TeX is
// shown as code; `onRenderersLoaded` lets the page render again when it arrives.
import DOMPurify from "dompurify";
import MarkdownIt from "markdown-it";
import { mathPlugin } from "./math-syntax.ts";

type TexFn = (tex: string, display: boolean) => string;
type CodeFn = (code: string, lang: string) => string | null;

const engines: { tex: TexFn | null; code: CodeFn | null } = { tex: null, code: null };
const loading: { tex: Promise<void> | null; code: Promise<void> | null } = { tex: null, code: null };
const listeners = new Set<() => void>();

function notify(): void {
  for (const l of listeners) l();
}

function loadTex(): void {
  loading.tex ??= import("./tex.ts").then(
    (m) => {
      engines.tex = m.renderTex;
      notify();
    },
    () => {}, // stays shown as code
  );
}

function loadCode(): void {
  loading.code ??= import("./highlight.ts").then(
    (m) => {
      engines.code = m.highlightCode;
      notify();
    },
    () => {},
  );
}

/** Called once each time a renderer (code highlighting, TeX) has loaded: render again to use it. */
export function onRenderersLoaded(fn: () => void): () => void {
  listeners.add(fn);
  return () => listeners.delete(fn);
}

const escapeHtml = (s: string) => s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

const md = new MarkdownIt({
  html: false,
  linkify: true,
  breaks: true,
  typographer: false,
  highlight(code, lang) {
    const name = lang.trim().toLowerCase();
    if (!name) return "";
    if (!engines.code) {
      loadCode();
      return "";
    }
    return engines.code(code, name) ?? ""; // "": markdown-it escapes the code itself
  },
});

mathPlugin(md, (tex, display) => {
  if (engines.tex) return `<span class="math${display ? " math-display" : ""}">${engines.tex(tex, display)}</span>`;
  loadTex();
  return `<code class="math-source">${escapeHtml(tex)}</code>`;
});

const purify = DOMPurify(window);
purify.addHook("afterSanitizeAttributes", (node) => {
  // Links open in a new tab, with no opener and no referrer.
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

const PURIFY_OPTIONS = {
  // MathML for KaTeX's output (DOMPurify checks it as it does HTML).
  USE_PROFILES: { html: true, mathMl: true },
  // No inline styles (the page's CSP has none either), no forms, no media that loads by itself.
  FORBID_ATTR: ["style"],
  FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "img", "video", "audio", "iframe", "object", "embed"],
  // KaTeX keeps the TeX source in <annotation>, which DOMPurify does not allow: drop it with its text.
  ADD_FORBID_CONTENTS: ["annotation", "annotation-xml"],
  ADD_ATTR: ["target"],
};

/** Markdown text → sanitized HTML (a string for innerHTML). */
export function renderMarkdown(text: string): string {
  return purify.sanitize(md.render(text), PURIFY_OPTIONS) as string;
}

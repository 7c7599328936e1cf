// Turning untrusted text into DOM. A model's answer, a cell's output, a title: all of it may hold
// HTML meant to run. Plain text goes in as text nodes (`el`); markdown is rendered by marked with
// raw HTML, images and links other than http(s)/mailto shown as their source text, then sanitised
// by DOMPurify into a fragment (no string of HTML is ever assigned: the page's CSP enforces Trusted
// Types, so an assignment that skipped DOMPurify would throw).

import hljs from './vendor/highlight-core.js';
import bash from './vendor/highlight-bash.js';
import diff from './vendor/highlight-diff.js';
import json from './vendor/highlight-json.js';
import python from './vendor/highlight-python.js';

hljs.registerLanguage('python', python);
hljs.registerLanguage('bash', bash);
hljs.registerLanguage('diff', diff);
hljs.registerLanguage('json', json);

const purify = window.DOMPurify;
purify.addHook('afterSanitizeAttributes', (node) => {
  if (node.tagName === 'A') {
    node.setAttribute('target', '_blank');
    node.setAttribute('rel', 'noopener noreferrer nofollow');
  }
});
const SANITIZE = {
  RETURN_DOM_FRAGMENT: true,
  FORBID_TAGS: ['style', 'form', 'input', 'button', 'textarea', 'select', 'img', 'svg', 'math'],
  FORBID_ATTR: ['style', 'id', 'name'],
};
const LINKABLE = /^(https?:\/\/|mailto:)/i;

export function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

const md = new window.marked.Marked({
  gfm: true,
  renderer: {
    html: (token) => escapeHtml(token.text),
    image: (token) => escapeHtml(token.raw),
    link: (token) => (LINKABLE.test(token.href) ? false : escapeHtml(token.raw)),
    code: (token) => `<pre><code class="hljs">${highlighted(token.text, token.lang)}</code></pre>`,
  },
});

function highlighted(code, lang) {
  const language = { py: 'python', sh: 'bash', shell: 'bash', console: 'bash', patch: 'diff' }[lang] || lang;
  return language && hljs.getLanguage(language)
    ? hljs.highlight(code, { language, ignoreIllegals: true }).value
    : escapeHtml(code);
}

/** A fragment of sanitised HTML. */
export function sanitised(html) {
  return purify.sanitize(html, SANITIZE);
}

/** Markdown (a model's answer), as a sanitised fragment. */
export function markdown(text) {
  return sanitised(md.parse(text || ''));
}

/** A highlighted code block: <pre><code>. */
export function codeBlock(code, lang) {
  const inner = el('code', { class: 'hljs' });
  inner.append(sanitised(highlighted(code, lang)));
  return el('pre', { class: 'code' }, inner);
}

/** An element; string children become text nodes, never HTML. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? '' : value);
  }
  for (const child of children.flat()) {
    if (child !== undefined && child !== null && child !== false) node.append(child);
  }
  return node;
}

/** Terminal colour codes (IPython's tracebacks) stripped. */
export function plain(text) {
  return String(text || '').replace(/\x1b\[[0-9;?]*[ -/]*[@-~]/g, '');
}

/** `3 min ago`, for a time in seconds since the epoch. */
export function ago(ts) {
  const s = Math.max(0, Date.now() / 1000 - ts);
  if (s < 60) return 'just now';
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return new Date(ts * 1000).toLocaleDateString();
}

/** 2910 -> 2.9k, 128000 -> 128k. */
export function k(n) {
  if (n < 1000) return String(n);
  if (n < 10000) return `${(n / 1000).toFixed(1).replace(/\.0$/, '')}k`;
  if (n < 1e6) return `${Math.floor(n / 1000)}k`;
  return `${(n / 1e6).toFixed(1).replace(/\.0$/, '')}M`;
}

/** `1,200 in (800 cached) · 300 out · $0.0042`. */
export function usageLine(u) {
  let text = `${u.prompt_tokens.toLocaleString()} in`;
  if (u.cached_tokens) text += ` (${u.cached_tokens.toLocaleString()} cached)`;
  text += ` · ${u.completion_tokens.toLocaleString()} out`;
  if (u.cost) text += ` · $${u.cost.toFixed(4)}`;
  return text;
}

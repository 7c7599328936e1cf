// The web page (docs/web.md): the login, the sessions, a session's view. Its state is the daemon's:
// the page keeps only its login (an HttpOnly cookie, and the XSRF token in this origin's storage)
// and which view it shows (the address's #), so a reload replays the session's events.

import { api, defaultCwd, events, LoggedOut, login, logout } from './api.js';
import { Conversation } from './conversation.js';
import { harnessPanel } from './harness.js';
import { ago, el, k } from './render.js';

const bar = document.getElementById('bar');
const main = document.getElementById('main');
const toasts = document.getElementById('toasts');
let view = null;

const enc = encodeURIComponent;
const sleep = (ms, signal) => new Promise((done) => {
  const timer = setTimeout(done, ms);
  signal.addEventListener('abort', () => { clearTimeout(timer); done(); }, { once: true });
});

/** Tell an error: a lost login shows the login box, anything else a message for a while. */
function say(error) {
  if (error instanceof LoggedOut) {
    showLogin();
    return;
  }
  const toast = el('div', { class: 'toast', role: 'alert' }, error.message || String(error));
  toasts.append(toast);
  setTimeout(() => toast.remove(), 8000);
}

async function boot() {
  const token = new URLSearchParams(location.search).get('token');
  if (token) {
    history.replaceState(null, '', `/${location.hash}`);  // the token leaves the address bar at once
    try {
      await login(token);
    } catch (error) {
      showLogin(error.message);
      return;
    }
  }
  window.addEventListener('hashchange', route);
  route();
}

function route() {
  view?.abort();
  view = new AbortController();
  const match = location.hash.match(/^#\/s\/(.+)$/);
  const shown = match ? sessionView(decodeURIComponent(match[1]), view.signal) : listView(view.signal);
  shown.catch(say);
}

function showLogin(message) {
  view?.abort();
  if (!message && main.querySelector('form.login')) return;  // shown already: what is typed there stays
  const input = el('input', { type: 'password', 'aria-label': 'Token', autocomplete: 'off', placeholder: 'login token' });
  const form = el('form', { class: 'login' }, el('h2', {}, 'Log in'),
    el('p', {}, 'Open the URL that ', el('code', {}, 'prime-agent web'), ' printed, or paste its token here.'),
    input, el('button', { type: 'submit' }, 'Log in'), message && el('p', { class: 'error' }, message));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    try {
      await login(input.value.trim());
      route();
    } catch (error) {
      showLogin(error.message);
    }
  });
  bar.replaceChildren(el('h1', {}, 'Prime Agent'));
  main.replaceChildren(form);
  input.focus();
}

// --- the sessions ----------------------------------------------------------------------------

async function listView(signal) {
  const sessions = await api('GET', '/v1/sessions');
  const list = el('div', { class: 'sessions' });
  const form = newSessionForm();
  const out = el('button', { type: 'button', class: 'secondary', onclick: () => logout().then(() => showLogin()) }, 'Log out');
  bar.replaceChildren(el('h1', {}, 'Prime Agent'),
    el('button', { type: 'button', onclick: () => { form.hidden = !form.hidden; } }, 'New session'), out);
  main.replaceChildren(form, el('h2', {}, 'Sessions'), list);
  for (let shown = sessions; !signal.aborted; shown = await api('GET', '/v1/sessions')) {
    list.replaceChildren(...shown.sort((a, b) => b.updated - a.updated).map(sessionRow));
    if (!shown.length) list.append(el('p', { class: 'dim' }, 'No sessions yet: start one with New session.'));
    await sleep(5000, signal);
  }
}

function sessionRow(s) {
  const open = `#/s/${enc(s.id)}`;
  const resume = ['dormant', 'closed'].includes(s.state);
  return el('div', { class: 'session-row', 'data-session': s.id },
    el('a', { class: 'title', href: open }, s.title || '(untitled)'),
    el('span', { class: `state ${s.state}` }, s.state),
    el('span', { class: 'cwd' }, s.cwd),
    el('span', { class: 'when' }, `${s.model} · ${ago(s.updated)} · ${s.turns} turn(s)`),
    el('a', { class: 'button', href: open }, resume ? 'Resume' : 'Open'));
}

function newSessionForm() {
  const cwd = el('input', { type: 'text', 'aria-label': 'Directory', value: defaultCwd() });
  const model = el('input', { type: 'text', 'aria-label': 'Model', placeholder: 'default model' });
  const plan = el('input', { type: 'checkbox', 'aria-label': 'Plan mode' });
  const form = el('form', { class: 'new-session', hidden: true }, el('h2', {}, 'New session'),
    el('label', {}, 'Directory ', cwd), el('label', {}, 'Model ', model),
    el('label', { class: 'check' }, plan, ' Plan mode: read-only until you approve a plan'),
    el('button', { type: 'submit' }, 'Create'));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const body = { cwd: cwd.value.trim(), ...(model.value.trim() ? { model: model.value.trim() } : {}) };
    try {
      const s = await api('POST', '/v1/sessions', plan.checked ? { ...body, mode: 'plan' } : body);
      location.hash = `#/s/${enc(s.id)}`;
    } catch (error) {
      say(error);
    }
  });
  return form;
}

// --- one session -----------------------------------------------------------------------------

async function sessionView(id, signal) {
  const path = `/v1/sessions/${enc(id)}`;
  const info = await api('GET', path);
  const status = new Status(info, path);
  const log = el('div', { class: 'conversation' });
  const conversation = new Conversation(log, id, say);
  const panel = harnessPanel(id, say);
  panel.hidden = true;
  bar.replaceChildren(el('a', { class: 'back', href: '#/' }, '← Sessions'), status.node,
    el('button', { type: 'button', class: 'secondary', onclick: () => toggle(panel) }, 'Harness'));
  main.replaceChildren(panel, log, composer(path, status));
  document.title = `${info.title || id} · Prime Agent`;
  let after = 0;
  while (!signal.aborted) {
    try {
      for await (const batch of events(id, after, signal)) {
        conversation.apply(batch);
        for (const e of batch) status.track(e);
        after = Math.max(after, ...batch.map((e) => e.seq));
        status.render(true);
        if (batch.some((e) => e.type === 'turn.started' || e.type === 'turn.queued')) status.retitle().catch(say);
      }
    } catch (error) {
      if (signal.aborted) return;
      if (error instanceof LoggedOut) throw error;
    }
    status.render(false);  // the stream ended or broke (the daemon restarting): again, from where it stopped
    await sleep(1000, signal);
  }
}

/** Show the harness panel (loaded afresh, scrolled to) or hide it. */
function toggle(panel) {
  panel.hidden = !panel.hidden;
  if (panel.hidden) return;
  panel.load();
  panel.scrollIntoView({ block: 'start' });
}

function composer(path, status) {
  const text = el('textarea', { 'aria-label': 'Message', rows: 2, placeholder: 'Message (Enter: send · Shift+Enter: new line)' });
  const send = async (mode) => {
    const value = text.value;
    if (!value.trim()) return;
    try {
      await api('POST', `${path}/messages`, { text: value, mode: mode || (status.busy() ? 'steer' : 'prompt') });
      text.value = '';
    } catch (error) {
      say(error);
    }
  };
  text.addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      send();
    }
  });
  const stop = el('button', { type: 'button', class: 'danger', onclick: () => api('POST', `${path}/interrupt`, {}).catch(say) }, 'Stop');
  const queue = el('button', { type: 'button', class: 'secondary', title: 'a new turn after this one', onclick: () => send('follow_up') }, 'Queue');
  const go = el('button', { type: 'button', onclick: () => send() }, 'Send');
  status.onBusy = (busy) => {
    stop.hidden = queue.hidden = !busy;
    go.textContent = busy ? 'Steer' : 'Send';
  };
  status.onBusy(status.busy());
  return el('div', { class: 'composer' }, text, el('div', { class: 'buttons' }, go, queue, stop));
}

/** The session's line at the top: title, state, model, context fill, tokens and cost, sandbox. */
class Status {
  constructor(info, path) {
    Object.assign(this, { info, path, state: info.state, running: null, tokens: 0, turnTokens: 0, cost: 0,
      contextUsed: 0, contextWindow: 0, sandbox: info.sandbox || '', onBusy: null, model: info.model });
    this.node = el('div', { class: 'status' });
    this.modelInput = el('input', { type: 'text', 'aria-label': 'Model', value: info.model, size: 12, class: 'model' });
    this.modelInput.addEventListener('change', () => this.switchModel());
    this.modelInput.addEventListener('blur', () => { this.modelInput.value = this.modelInput.value.trim() || this.model; });
    this.render(true);
  }

  busy() {
    return this.state === 'running' || this.state === 'queued';
  }

  async switchModel() {
    const model = this.modelInput.value.trim();
    if (!model || model === this.model) return;  // emptied on the way to typing another: nothing to switch to
    try {
      this.info = await api('PATCH', this.path, { model });
      this.model = this.info.model;
    } catch (error) {
      this.modelInput.value = this.model;
      say(error);
    }
  }

  /** The daemon titles a session by its first prompt: once one is in, its title is asked for. */
  async retitle() {
    if (this.info.title || this.asked) return;
    this.asked = true;
    try {
      this.info = { ...this.info, title: (await api('GET', this.path)).title };
      document.title = `${this.info.title || this.info.id} · Prime Agent`;
      this.render(true);
    } finally {
      this.asked = false;
    }
  }

  track(e) {
    switch (e.type) {
      case 'turn.started': this.state = 'running'; this.running = e.turn_id; break;
      case 'turn.queued': if (this.state !== 'running') this.state = 'queued'; break;
      case 'model.completed': {
        const total = e.usage.prompt_tokens + e.usage.completion_tokens;
        this.contextUsed = total || this.contextUsed;
        this.turnTokens += total;
        break;
      }
      case 'turn.finished': if (e.turn_id === this.running || !this.running) { this.state = 'idle'; this.running = null; } break;
      case 'session.started': case 'session.resumed':
        this.sandbox = e.sandbox || this.sandbox;
        this.contextWindow = e.context_window || this.contextWindow;
        break;
      case 'model.fallback': this.model = e.to_model; break;
      default:
    }
    if (e.type === 'turn.finished') this.turnTokens = 0;
    if (e.type === 'turn.finished' || e.type === 'usage') {  // every token spent, counted once
      this.tokens += e.usage.prompt_tokens + e.usage.completion_tokens;
      this.cost += e.usage.cost;
    }
  }

  render(connected) {
    const fill = this.contextWindow
      ? `ctx ${this.contextUsed ? k(this.contextUsed) : '-'}/${k(this.contextWindow)}`
        + (this.contextUsed / this.contextWindow > 0.5 ? ` ${Math.round((100 * this.contextUsed) / this.contextWindow)}%` : '')
      : '';
    const loose = this.sandbox && !/^(workspace-write|read-only)/.test(this.sandbox);
    if (document.activeElement !== this.modelInput) this.modelInput.value = this.model;
    this.node.replaceChildren(...[
      el('span', { class: 'title' }, this.info.title || this.info.id),
      el('span', { class: `state ${this.state}` }, connected ? this.state : 'reconnecting…'),
      this.modelInput,
      fill && el('span', { class: 'fill' }, fill),
      el('span', { class: 'tokens' }, `${(this.tokens + this.turnTokens).toLocaleString()} tok`),
      this.cost ? el('span', { class: 'cost' }, `$${this.cost.toFixed(2)}`) : null,
      this.sandbox && !this.sandbox.startsWith('workspace-write')
        ? el('span', { class: loose ? 'sandbox loud' : 'sandbox' }, loose ? `⚠ ${this.sandbox}` : this.sandbox) : null,
      el('span', { class: 'cwd', title: this.info.cwd }, this.info.cwd)].filter(Boolean));
    this.onBusy?.(this.busy());
  }
}

boot();

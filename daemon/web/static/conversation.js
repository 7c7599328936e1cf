// The conversation: a session's events (agent/events.py, docs/daemon.md#events) turned into
// messages, cells and cards, with the meaning the app gives them (tui/widgets/conversation.py).
// Everything the model or a cell wrote goes through render.js: text as text, markdown sanitised.

import { api } from './api.js';
import { codeBlock, el, markdown, plain, usageLine } from './render.js';

const REFINEMENT = {
  'refinement.applied': 'applied', 'refinement.pending': 'waiting for you', 'refinement.dry_run': 'dry run',
  'refinement.rejected': 'rejected',
};
const DECIDED = { approve: 'allowed once', always: 'always allowed', deny: 'denied' };
const IMAGE = /^image\/(png|jpeg|gif|webp|svg\+xml)$/;

export class Conversation {
  /** `root`: where it is shown; `sessionId`: whose events; `say(error)`: how a failed action is told. */
  constructor(root, sessionId, say) {
    Object.assign(this, { root, sessionId, say });
    this.prompts = new Map();
    this.cells = new Map();
    this.turnCells = new Map();
    this.lastCell = new Map();
    this.speaking = new Map();
    this.answered = new Map();
    this.said = new Map();
    this.approvals = new Map();
    this.refinements = new Map();
    this.children = new Map();
    this.plan = null;
    this.dirty = new Set();
  }

  /** Show a batch of events; the view follows the end if it was there. */
  apply(batch) {
    const follow = following();
    for (const e of batch) this.one(e);
    for (const message of this.dirty) message.render();
    this.dirty.clear();
    follow();
  }

  add(node) {
    this.root.append(node);
    return node;
  }

  notice(text, kind = 'info') {
    return this.add(el('div', { class: `notice ${kind}` }, text));
  }

  path(...parts) {
    return `/v1/sessions/${[this.sessionId, ...parts].map(encodeURIComponent).join('/')}`;
  }

  async act(card, method, path, body) {
    card.querySelectorAll('button').forEach((b) => { b.disabled = true; });
    try {
      await api(method, path, body);
    } catch (error) {
      card.querySelectorAll('button').forEach((b) => { b.disabled = false; });
      this.say(error);
    }
  }

  one(e) {
    const turn = e.turn_id;
    switch (e.type) {
      case 'model.started': case 'harness.reloaded': case 'message.delivered': return;
      case 'turn.queued': this.userMessage(turn, e.prompt, true); return;
      case 'turn.started':
        if (this.prompts.has(turn)) this.prompts.get(turn).classList.remove('queued');
        else this.userMessage(turn, e.prompt, false);
        return;
      case 'model.delta': {
        let message = this.speaking.get(turn);
        if (!message) this.speaking.set(turn, (message = this.assistant()));
        if (e.reasoning) message.reasoning += e.text; else message.text += e.text;
        this.dirty.add(message);
        return;
      }
      case 'model.completed': {
        let message = this.speaking.get(turn);
        this.speaking.delete(turn);
        if (e.text) this.said.set(turn, e.text);
        if (!message) {
          if (!(e.text.trim() || e.reasoning)) return;
          message = this.assistant();
        }
        Object.assign(message, { text: e.text, reasoning: e.reasoning || message.reasoning, streaming: false });
        this.answered.set(turn, message);
        this.dirty.add(message);
        return;
      }
      case 'cell.started': this.cellStarted(e); return;
      case 'cell.output': {
        const cell = this.cells.get(e.cell_id);
        if (cell) cell.out.append(el('span', { class: e.stream === 'stderr' ? 'stderr' : '' }, plain(e.text)));
        return;
      }
      case 'cell.finished': this.cellFinished(e); return;
      case 'subagent.spawned': {
        const row = el('div', { class: 'row' }, `subagent ${e.name} (${e.id}): running`);
        this.children.set(e.id, row);
        (this.lastCell.get(turn)?.rows || this.root).append(row);
        return;
      }
      case 'subagent.finished': {
        const row = this.children.get(e.id);
        if (row) row.textContent = `subagent ${e.name} (${e.id}): ${e.outcome}${e.answer ? ` — ${e.answer}` : ''}`;
        return;
      }
      case 'mcp.called': {
        const row = el('div', { class: `row ${e.outcome === 'ok' ? '' : 'error'}` },
          `mcp ${e.server}.${e.tool}: ${e.outcome}${e.error ? ` — ${e.error}` : ''}`);
        (this.cells.get(e.cell_id || '')?.rows || this.root).append(row);
        return;
      }
      case 'hook.ran': {
        const r = e.run;
        const how = r.timed_out ? 'timed out' : r.exit_code !== null ? `exit ${r.exit_code}` : 'not run';
        const row = el('div', { class: `row ${r.error || r.exit_code === 2 ? 'error' : ''}` },
          `hook ${r.event} (${r.source}): ${r.command}: ${how}${r.error ? ` — ${r.error}` : ''}`);
        (this.cells.get(e.cell_id || '')?.rows || this.root).append(row);
        return;
      }
      case 'turn.finished': this.turnFinished(e); return;
      case 'refinement.applied': case 'refinement.pending': case 'refinement.dry_run': case 'refinement.rejected':
        this.refinement(e); return;
      case 'refinement.rolled_back': {
        this.refinements.get(e.ref)?.setStatus('rolled back');
        this.notice(`rolled back ${e.ref} (${e.scope} scope)`);
        return;
      }
      case 'approval.requested': this.approval(e); return;
      case 'approval.decided': {
        const card = this.approvals.get(e.request_id);
        const said = `${DECIDED[e.decision]}${e.by === 'user' ? '' : ` (${e.by === 'rule' ? 'by an earlier always' : e.by})`}`;
        if (card) card.setStatus(said + (e.exit_code !== null ? `; exit ${e.exit_code}` : ''));
        else this.notice(`${e.kind === 'mcp' ? 'MCP call' : 'command'}: ${said}`);
        return;
      }
      case 'plan.proposed': this.planCard(e); return;
      case 'plan.decided':
        if (this.plan?.waiting) this.plan.setStatus(e.approved ? 'approved' : `rejected${e.note ? `: ${e.note}` : ''}`);
        else this.notice(`plan ${e.approved ? 'approved' : 'rejected'}${e.note ? `: ${e.note}` : ''}`);
        return;
      default: {
        const text = describe(e);
        if (text) this.notice(text, e.type === 'error' ? 'error' : 'info');
      }
    }
  }

  userMessage(turn, prompt, queued) {
    const rewind = el('button', { class: 'link', type: 'button', title: 'go back to before this turn' }, 'rewind');
    const node = el('div', { class: `message user${queued ? ' queued' : ''}`, 'data-turn': turn },
      el('div', { class: 'who' }, 'you', rewind), el('div', { class: 'text' }, prompt));
    rewind.addEventListener('click', () => this.askRewind(node, turn));
    this.prompts.set(turn, node);
    this.add(node);
  }

  askRewind(node, turn) {
    if (node.querySelector('.confirm')) return;
    const box = el('div', { class: 'confirm' }, 'Rewind files, conversation, harness and kernel to before this turn? ');
    const go = el('button', { type: 'button' }, 'Rewind');
    const cancel = el('button', { type: 'button', class: 'secondary' }, 'Cancel');
    cancel.addEventListener('click', () => box.remove());
    go.addEventListener('click', async () => {
      go.disabled = true;
      try {
        const rows = await api('GET', this.path('checkpoints'));
        const row = rows.find((r) => r.turn_id === turn);
        if (!row) throw new Error(`turn ${turn} has no checkpoint to rewind to`);
        await api('POST', this.path('rewind'), { turn: row.turn });
        box.remove();
      } catch (error) {
        go.disabled = false;
        this.say(error);
      }
    });
    box.append(go, cancel);
    node.append(box);
  }

  assistant() {
    const body = el('div', { class: 'text markdown' });
    const thinking = el('details', { class: 'reasoning', hidden: true }, el('summary', {}, 'reasoning'));
    const node = this.add(el('div', { class: 'message assistant' }, el('div', { class: 'who' }, 'agent'), thinking, body));
    const message = {
      node, text: '', reasoning: '', streaming: true,
      render() {
        body.replaceChildren(markdown(this.text));
        node.classList.toggle('streaming', this.streaming);
        thinking.hidden = !this.reasoning.trim();
        if (this.reasoning.trim()) thinking.replaceChildren(el('summary', {}, 'reasoning'), el('div', { class: 'dim' }, this.reasoning));
        node.hidden = !(this.text.trim() || this.reasoning.trim()) && !this.streaming;
      },
    };
    return message;
  }

  cellStarted(e) {
    const message = this.answered.get(e.turn_id);
    if (message) {  // a text-mode model writes its cell as a ```python block: shown once, as the cell
      const fence = '```python\n' + e.code + '\n```';
      if (message.text.includes(fence)) {
        message.text = message.text.replace(fence, '');
        this.dirty.add(message);
      }
    }
    const status = el('span', { class: 'cell-status' }, 'running…');
    const out = el('pre', { class: 'output' });
    const rows = el('div', { class: 'rows' });
    const node = this.add(el('section', { class: 'cell running', 'data-cell': e.cell_id },
      el('div', { class: 'cell-head' }, el('span', {}, 'cell'), status), codeBlock(e.code, 'python'), out, rows));
    const cell = { node, out, rows, status, turn: e.turn_id };
    this.cells.set(e.cell_id, cell);
    this.lastCell.set(e.turn_id, cell);
    if (!this.turnCells.has(e.turn_id)) this.turnCells.set(e.turn_id, []);
    this.turnCells.get(e.turn_id).push(cell);
  }

  cellFinished(e) {
    const cell = this.cells.get(e.cell_id);
    if (!cell) return;
    const r = e.result;
    cell.done = true;
    cell.node.classList.remove('running');
    const failed = r.error_name || (r.kernel_events || []).length;
    cell.node.classList.toggle('failed', !!failed);
    cell.status.textContent = failed ? (r.error_name || r.kernel_events.join(', ')) : `${r.duration.toFixed(2)} s`;
    if (!cell.out.childNodes.length && (r.stdout || r.stderr)) {
      cell.out.append(el('span', {}, plain(r.stdout)), el('span', { class: 'stderr' }, plain(r.stderr)));
    }
    if (r.result !== null && r.result !== undefined) cell.out.append(el('span', { class: 'result' }, plain(r.result)));
    if (r.traceback || r.error_name) {
      cell.out.append(el('span', { class: 'stderr' }, plain(r.traceback || `${r.error_name}: ${r.error_value}`)));
    }
    cell.out.hidden = !cell.out.childNodes.length;
    for (const text of [r.kernel_message, ...(r.hook_notes || [])]) {
      if (text) cell.rows.append(el('div', { class: 'row warning' }, text));
    }
    if ((e.attachments || []).length) this.images(cell, e);
    if (e.files) cell.rows.append(filesView(e.files));
  }

  async images(cell, e) {
    const box = cell.rows.insertBefore(el('div', { class: 'images' }), cell.rows.firstChild);
    try {
      const outputs = await api('GET', this.path('turns', e.turn_id, 'cells', e.cell_id, 'outputs'));
      outputs.forEach((o, i) => {
        if (IMAGE.test(o.mime) && /^[A-Za-z0-9+/=\s]*$/.test(o.data)) {
          const img = el('img', { alt: `display output ${i + 1} of the cell` });
          img.addEventListener('load', following(), { once: true });
          img.src = `data:${o.mime};base64,${o.data.replace(/\s/g, '')}`;
          box.append(img);
        } else if (o.mime === 'text/markdown') {  // a table (a DataFrame) or Markdown: sanitised by render.js
          box.append(el('div', { class: 'markdown table-output' }, markdown(o.data)));
        } else {
          box.append(el('div', { class: 'row' }, `${o.mime} output (not shown here)`));
        }
      });
    } catch (error) {
      box.append(el('div', { class: 'row error' }, `the cell's images: ${error.message}`));
    }
  }

  turnFinished(e) {
    const turn = e.turn_id;
    this.speaking.delete(turn);
    for (const cell of this.turnCells.get(turn) || []) {
      if (!cell.done) {  // the turn ended under it (a daemon that died, a closed session)
        cell.node.classList.remove('running');
        cell.status.textContent = 'did not finish';
      }
    }
    this.turnCells.delete(turn);
    this.prompts.get(turn)?.classList.remove('queued');
    if (e.outcome !== 'completed') {
      this.notice(`turn ${e.outcome}${e.error ? `: ${e.error}` : ''}`, e.outcome === 'error' ? 'error' : 'warning');
    } else if (e.answer && e.answer.trim() !== (this.said.get(turn) || '').trim()) {
      const message = this.assistant();
      Object.assign(message, { text: e.answer, streaming: false });
      this.dirty.add(message);
    }
    if (e.files) {
      const names = e.files.files.slice(0, 6).map((f) => f.path).join(', ');
      this.notice(`${e.files.files.length + e.files.more} file(s) changed: ${names}`, 'files');
    }
    const u = e.usage;
    if (u.prompt_tokens + u.completion_tokens || u.cost) this.notice(`${turn}: ${usageLine(u)}`, 'usage');
  }

  card(kind, title, ...body) {
    const status = el('div', { class: 'card-status' });
    const buttons = el('div', { class: 'buttons' });
    const node = this.add(el('section', { class: `card ${kind}` }, el('h3', {}, title), ...body, buttons, status));
    node.buttons = buttons;
    node.setStatus = (text) => {
      buttons.remove();
      node.classList.add('decided');
      status.textContent = text;
    };
    return node;
  }

  approval(e) {
    const what = e.kind === 'mcp' ? 'Allow this MCP call?' : 'Allow this command?';
    const card = this.card('approval', what, el('pre', { class: 'summary' }, e.summary),
      e.reason && el('p', {}, `Why: ${e.reason}`), e.runs_in && el('p', { class: 'dim' }, `Runs ${e.runs_in}`),
      (e.notes || []).map((n) => el('p', { class: 'warning' }, n)),
      e.prefix && el('p', { class: 'dim' }, 'Always allow covers: ', el('code', {}, e.prefix)));
    const decide = (decision) => () => this.act(card, 'POST', this.path('approvals', e.request_id),
      decision === 'always' && e.kind === 'mcp' ? { decision, prefix: e.prefix } : { decision });
    card.buttons.append(el('button', { type: 'button', onclick: decide('approve') }, 'Allow once'));
    if (e.prefix) card.buttons.append(el('button', { type: 'button', onclick: decide('always') }, 'Always allow'));
    card.buttons.append(el('button', { type: 'button', class: 'danger', onclick: decide('deny') }, 'Deny'));
    this.approvals.set(e.request_id, card);
  }

  planCard(e) {
    const note = el('input', { type: 'text', 'aria-label': 'Why (for the model)', placeholder: 'why, if you reject it' });
    const plan = el('div', { class: 'markdown' });
    plan.append(markdown(e.plan));
    const card = this.card('plan', 'The model proposes a plan', plan);
    const decide = (approve) => () => this.act(card, 'POST', this.path('plan'), { approve, note: note.value || null });
    card.buttons.append(el('button', { type: 'button', onclick: decide(true) }, 'Approve the plan'),
      el('button', { type: 'button', class: 'danger', onclick: decide(false) }, 'Reject'), note);
    card.waiting = true;
    const setStatus = card.setStatus;
    card.setStatus = (text) => { card.waiting = false; setStatus(text); };
    this.plan = card;
  }

  refinement(e) {
    const status = REFINEMENT[e.type];
    let card = this.refinements.get(e.id);
    if (!card) {
      card = this.card('refinement', `Refinement ${e.id}: ${e.summary}`,
        e.scopes.length ? el('p', { class: 'dim' }, `scopes: ${e.scopes.join(', ')}`) : null,
        e.diff ? el('details', { open: e.type === 'refinement.pending' }, el('summary', {}, 'diff'), codeBlock(e.diff, 'diff')) : null,
        (e.refused || []).map((r) => el('p', { class: 'warning' }, `refused ${r.id}: ${r.reason}`)));
      this.refinements.set(e.id, card);
      if (e.type === 'refinement.pending') {
        const decide = (approve) => () => this.act(card, 'POST', this.path('refinements', e.id), { approve });
        card.buttons.append(el('button', { type: 'button', onclick: decide(true) }, 'Approve'),
          el('button', { type: 'button', class: 'danger', onclick: decide(false) }, 'Reject'));
        card.querySelector('.card-status').textContent = status;
        return;
      }
    }
    card.setStatus(status + (e.reason ? `: ${e.reason}` : ''));
  }
}

/** Call it before the page grows, and what it returns after: the view follows the end if it was there. */
function following() {
  const atEnd = window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 120;
  return () => {
    if (atEnd) window.scrollTo(0, document.documentElement.scrollHeight);
  };
}

function filesView(files) {
  const box = el('div', { class: 'files' });
  for (const f of files.files) {
    const counts = f.added === null ? (f.note || '') : `+${f.added} −${f.removed}`;
    const summary = el('summary', {}, `${f.change} ${f.path} `, el('span', { class: 'dim' }, counts));
    box.append(f.diff ? el('details', {}, summary, codeBlock(f.diff, 'diff')) : el('div', { class: 'row' }, summary.textContent));
  }
  if (files.more) box.append(el('div', { class: 'row dim' }, `and ${files.more} more file(s)`));
  return box;
}

/** The line a notice shows for an event the conversation has no special view of. */
function describe(e) {
  switch (e.type) {
    case 'session.started':
      return `session started in ${e.cwd} (${e.model})${e.sandbox && e.sandbox !== 'workspace-write' ? `; sandbox: ${e.sandbox}` : ''}`
        + e.ignored.map((line) => `\nproject: ${line}`).join('');
    case 'session.resumed': return `session resumed (${e.reason}): a new kernel; variables from before are gone`;
    case 'session.rewound':
      return `rewound to ${e.after ? 'the end of' : 'before'} turn ${e.turn} (${e.parts.join(', ')})`
        + (e.files.length ? `; files: ${e.files.map((f) => f.path).slice(0, 8).join(', ')}` : '');
    case 'note': return `note: ${e.text}`;
    case 'error': return `error: ${e.message}`;
    case 'usage': return `${e.purpose} for ${e.turn_id || 'the session'}: ${usageLine(e.usage)}`;
    case 'steer.delivered': return `steer delivered: ${e.text}`;
    case 'model.retry': return `model: ${e.reason}; retry ${e.attempt} in ${e.delay.toFixed(1)}s`;
    case 'model.fallback': return `model: ${e.from_model} keeps failing (${e.reason}); switched to ${e.to_model}`;
    case 'compaction': return `context compacted (${e.folded_messages} messages summarised)`;
    case 'harness.edited': return `harness edited (${e.scope}, ${e.source}): ${e.entries.join(', ')}`;
    case 'refinement.proposed': return `refinement proposed: ${e.summary}`;
    case 'refinement.failed': return `refinement failed: ${e.reason}`;
    case 'refinement.skipped': return `refinement skipped: ${e.rationale}`;
    case 'goal.started': return `goal ${e.goal_id}: ${e.text}${e.check ? ` (until \`${e.check}\` passes)` : ' (autonomous)'}`;
    case 'goal.check': return e.passed ? 'goal check passed' : `goal check failed (exit ${e.exit_code})`;
    case 'goal.continued': return `goal: continuation ${e.continuation}`;
    case 'goal.finished': return `goal ${e.state} after ${e.turns} turn(s): ${e.reason}`;
    case 'schedule.fired': return `schedule ${e.schedule_id}: ${e.outcome}${e.reason ? ` (${e.reason})` : ''}`;
    default: return `${e.type}`;
  }
}

// The harness panel of a session: the entries in force, each scope's history with a change's diff and
// its rollback, and "refine now" (docs/harness.md; the routes in docs/daemon.md).

import { api } from './api.js';
import { codeBlock, el } from './render.js';

const enc = encodeURIComponent;

export function harnessPanel(sessionId, say) {
  const entries = el('div', { class: 'entries' });
  const history = el('div', { class: 'history' });
  const scope = el('select', { 'aria-label': 'Scope' },
    ...['session', 'project', 'user'].map((s) => el('option', { value: s }, s)));
  const refine = el('button', { type: 'button' }, 'Refine now');
  const told = el('p', { class: 'dim' });
  const panel = el('section', { class: 'harness panel' }, el('h2', {}, 'Harness'),
    el('div', { class: 'buttons' }, refine, told),
    el('h3', {}, 'In force'), entries, el('h3', {}, 'History ', scope), history);

  refine.addEventListener('click', async () => {
    try {
      told.textContent = (await api('POST', `/v1/sessions/${enc(sessionId)}/refine`, {})).message;
    } catch (error) {
      say(error);
    }
  });
  scope.addEventListener('change', () => loadHistory());

  async function loadHistory() {
    const s = scope.value;
    const query = `scope=${s}&session=${enc(sessionId)}`;
    const changes = await api('GET', `/v1/harness/log?${query}&n=30`);
    history.replaceChildren(...changes.map((c) => change(c, s, query)));
    if (!changes.length) history.append(el('p', { class: 'dim' }, `no changes in the ${s} scope yet`));
  }

  function change(c, s, query) {
    const shown = el('div', { class: 'diff' });
    const diff = el('button', { type: 'button', class: 'secondary' }, 'Diff');
    const back = el('button', { type: 'button', class: 'danger' }, 'Roll back');
    diff.addEventListener('click', async () => {
      try {
        const text = await api('GET', `/v1/harness/diff?${query}&a=${enc(`${c.commit}^`)}&b=${enc(c.commit)}`);
        shown.replaceChildren(codeBlock(text || '(no difference)', 'diff'));
      } catch (error) {
        say(error);
      }
    });
    back.addEventListener('click', async () => {
      back.disabled = true;
      try {
        const done = await api('POST', '/v1/harness/rollback', { ref: c.commit, scope: s, session: sessionId });
        shown.replaceChildren(el('p', {}, `rolled back: ${done.summary}`));
        await loadHistory();
      } catch (error) {
        back.disabled = false;
        say(error);
      }
    });
    return el('div', { class: 'change' },
      el('div', {}, el('code', {}, c.commit.slice(0, 8)), ` ${new Date(c.date).toLocaleString()} · ${c.trigger} · `,
        el('strong', {}, c.summary)),
      c.entries.length ? el('div', { class: 'dim' }, c.entries.join(', ')) : null,
      el('div', { class: 'buttons' }, diff, back), shown);
  }

  panel.load = async () => {
    try {
      const inForce = await api('GET', `/v1/harness?session=${enc(sessionId)}`);
      entries.replaceChildren(...inForce.map((e) => el('div', { class: 'entry' },
        el('code', {}, e.id), ` ${e.kind} · ${e.scope} · `, el('strong', {}, e.title), e.summary ? ` — ${e.summary}` : '')));
      if (!inForce.length) entries.append(el('p', { class: 'dim' }, 'nothing in force yet'));
      await loadHistory();
    } catch (error) {
      say(error);
    }
  };
  return panel;
}

// The daemon's HTTP API as the page calls it (docs/daemon.md): every request carries the login's
// XSRF token in a header beside the HttpOnly cookie, and the event stream is read with fetch
// (EventSource cannot send a header).

const XSRF = 'prime-agent-xsrf';
const CWD = 'prime-agent-cwd';
const HEADER = 'X-Prime-Agent-Xsrf';

/** The daemon answered 401: the login is gone (or never was). */
export class LoggedOut extends Error {}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function apiError(r) {
  try {
    const { error } = await r.json();
    return new ApiError(r.status, error.code, error.message);
  } catch {
    return new ApiError(r.status, 'http_error', `HTTP ${r.status}`);
  }
}

export function defaultCwd() {
  return localStorage.getItem(CWD) || '';
}

/** Trade the token `prime-agent web` printed for a login. */
export async function login(token) {
  const r = await fetch('/web/login', {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ token }),
  });
  if (!r.ok) throw await apiError(r);
  const body = await r.json();
  localStorage.setItem(XSRF, body.xsrf);
  localStorage.setItem(CWD, body.cwd);
}

export async function logout() {
  await fetch('/web/logout', { method: 'POST', headers: { [HEADER]: localStorage.getItem(XSRF) || '' } });
  localStorage.removeItem(XSRF);
}

/** A call of the API: its JSON reply (or text); LoggedOut on 401, ApiError on any other error. */
export async function api(method, path, body) {
  const headers = { [HEADER]: localStorage.getItem(XSRF) || '' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (r.status === 401) throw new LoggedOut();
  if (!r.ok) throw await apiError(r);
  if (r.status === 204) return null;
  return (r.headers.get('content-type') || '').includes('json') ? r.json() : r.text();
}

/** A session's events after `after`, replayed then live: yields each read's events as one batch. */
export async function* events(sessionId, after, signal) {
  const r = await fetch(`/v1/sessions/${encodeURIComponent(sessionId)}/events?after=${after}`, {
    headers: { [HEADER]: localStorage.getItem(XSRF) || '' }, signal,
  });
  if (r.status === 401) throw new LoggedOut();
  if (!r.ok) throw await apiError(r);
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    const frames = buffer.split('\n\n');
    buffer = frames.pop();
    const batch = [];
    for (const frame of frames) {
      const data = frame.split('\n').filter((line) => line.startsWith('data:')).map((line) => line.slice(5).trimStart());
      if (data.length && !frame.startsWith('event:')) batch.push(JSON.parse(data.join('\n')));
    }
    if (batch.length) yield batch;
  }
}

// api.js: the token, REST calls and the job event stream (server-sent events read through
// fetch, so the token travels in the Authorization header and never in a URL).

const KEY = 'mge.token';
let onAuthNeeded = () => {};
let onConn = () => {};

export function setHandlers(auth, conn) { onAuthNeeded = auth; onConn = conn; }
export function token() { return sessionStorage.getItem(KEY) || ''; }
export function setToken(t) { if (t) sessionStorage.setItem(KEY, t); else sessionStorage.removeItem(KEY); }

// A "?token=T" in the fragment (#/jobs/3?token=T) moves to sessionStorage and leaves the URL.
// Fragments never reach the server, so the token is in no server or proxy log.
export function takeTokenFromHash() {
    const hash = location.hash;
    const q = hash.indexOf('?');
    if (q < 0) return;
    const params = new URLSearchParams(hash.slice(q + 1));
    if (!params.has('token')) return;
    setToken(params.get('token'));
    params.delete('token');
    const rest = params.toString();
    history.replaceState(null, '', location.pathname + location.search + hash.slice(0, q) + (rest ? '?' + rest : ''));
}

export class ApiError extends Error {
    constructor(status, problem) {
        super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
        this.status = status;
        this.problem = problem;
    }
}

export async function api(method, path, body, contentType) {
    const headers = { Authorization: `Bearer ${token()}` };
    if (contentType) headers['Content-Type'] = contentType;
    let r;
    try {
        r = await fetch('/api/v1' + path, { method, headers, body, cache: 'no-store' });
    } catch (e) {
        onConn(false);
        throw new ApiError(0, { title: 'The coordinator is unreachable', detail: 'the coordinator is unreachable; retrying' });
    }
    onConn(true);
    const ct = r.headers.get('content-type') || '';
    const data = ct.includes('json') ? await r.json().catch(() => null) : await r.blob();
    if (r.status === 401) onAuthNeeded('The token was refused.');
    if (!r.ok) throw new ApiError(r.status, data);
    return data;
}

export const get = (p) => api('GET', p);

// Follow /jobs/{id}/events from event @lastId on, through coordinator restarts: on a dropped
// connection it reconnects with Last-Event-ID after a short backoff. onEvent(kind, data, id).
// The stream ends for good when the server ends it for a finished job. Returns stop().
export function followEvents(jobId, lastId, onEvent, onStatus = () => {}) {
    let stopped = false, ctl = null, backoff = 200;
    (async () => {
        while (!stopped) {
            let ended = false;
            try {
                ctl = new AbortController();
                const headers = { Authorization: `Bearer ${token()}`, Accept: 'text/event-stream' };
                if (lastId > 0) headers['Last-Event-ID'] = String(lastId);
                const r = await fetch(`/api/v1/jobs/${jobId}/events`, { headers, signal: ctl.signal, cache: 'no-store' });
                if (r.status === 401) { onAuthNeeded('The token was refused.'); return; }
                if (!r.ok) throw new Error(`HTTP ${r.status}`);
                onStatus('live');
                onConn(true);
                backoff = 200;
                const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
                let buf = '';
                for (;;) {
                    const { value, done } = await reader.read();
                    if (done) break;
                    buf += value;
                    let i;
                    while ((i = buf.indexOf('\n\n')) >= 0) {
                        const block = buf.slice(0, i);
                        buf = buf.slice(i + 2);
                        let id = 0, kind = 'message', data = '';
                        for (const line of block.split('\n')) {
                            if (line.startsWith('id: ')) id = Number(line.slice(4));
                            else if (line.startsWith('event: ')) kind = line.slice(7);
                            else if (line.startsWith('data: ')) data += line.slice(6);
                        }
                        if (!data) continue;
                        if (id) lastId = id;
                        let obj;
                        try { obj = JSON.parse(data); } catch { continue; }
                        onEvent(kind, obj, id);
                    }
                }
                ended = true;
            } catch (e) {
                if (stopped) return;
            }
            if (stopped) return;
            // the server ends the stream of a finished job; ask whether that is why
            if (ended) {
                try {
                    const j = await get(`/jobs/${jobId}`);
                    if (['succeeded', 'failed', 'cancelled'].includes(j.state)) { onStatus('ended'); return; }
                } catch { /* the coordinator is away: reconnect below */ }
            }
            onStatus('reconnecting');
            onConn(false);
            await new Promise((res) => setTimeout(res, backoff));
            backoff = Math.min(backoff * 2, 2000);
        }
    })();
    return () => { stopped = true; if (ctl) ctl.abort(); };
}

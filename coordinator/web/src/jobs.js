// jobs.js: the jobs page: filter by state, progress and latest loss, submit (paste or upload
// YAML; the server's validation error is shown at its line), cancel, pick runs to compare.
import { api, get, ApiError } from './api.js';
import { h, clear, fmtNum, stateBadge, progressCell, fmtAgo } from './dom.js';

const STATES = ['', 'queued', 'running', 'succeeded', 'failed', 'cancelled'];
const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);
const EXAMPLE = `name: my-run
model: {type: mlp, hidden: [256, 256]}
data: {format: synthetic, train_size: 4096, input_dim: 784, classes: 10}
train: {steps: 3000, batch_size: 64, optimizer: {type: sgd, lr: 0.05, momentum: 0.9}, checkpoint_every: 500}
`;

export function jobsPage(main, params) {
    let state = params.get('state') || '';
    const details = new Map(); // id -> full job (kept for finished jobs)
    const picked = new Set();
    let timer = 0, stopped = false;

    const filter = h('select#state-filter', {
        onchange: () => { state = filter.value; location.hash = state ? `#/jobs?state=${state}` : '#/jobs'; },
    }, STATES.map((s) => h('option', { value: s, selected: s === state }, s || 'all states')));
    const compareBtn = h('button#compare-btn', {
        disabled: true,
        onclick: () => { location.hash = `#/compare?ids=${[...picked].join(',')}`; },
    }, 'Compare selected');
    const status = h('span.muted#jobs-status');
    const body = h('tbody#jobs-body');
    const table = h('table.jobs', {},
        h('thead', {}, h('tr', {}, ['', 'ID', 'Name', 'State', 'Progress', 'Loss', 'Workers', 'Priority', 'Reason', ''].map((t) => h('th', {}, t)))),
        body);

    clear(main).append(
        h('section.card', {}, submitPanel(() => refresh())),
        h('section.card', {},
            h('div.toolbar', {}, h('h2', {}, 'Jobs'), h('label', {}, 'State ', filter), compareBtn, status),
            table));

    function row(j) {
        const d = details.get(j.id) || j;
        const loss = d.latest_metrics && d.latest_metrics.loss;
        const workers = (d.placement || []).filter((p) => !p.exited).map((p) => p.worker).filter(Boolean);
        const reason = j.state === 'queued' ? d.pending_reason : j.failure_reason;
        const cb = h('input', {
            type: 'checkbox', 'aria-label': `select job ${j.id}`, checked: picked.has(j.id),
            onchange: () => { cb.checked ? picked.add(j.id) : picked.delete(j.id); compareBtn.disabled = picked.size < 2; },
        });
        return h('tr', { dataset: { id: j.id, state: j.state } },
            h('td', {}, cb),
            h('td', {}, h('a', { href: `#/jobs/${j.id}` }, String(j.id))),
            h('td', {}, h('a', { href: `#/jobs/${j.id}` }, j.name)),
            h('td', {}, stateBadge(j.state)),
            h('td', {}, progressCell(d)),
            h('td.num.loss', {}, loss ? fmtNum(loss.value) : '–'),
            h('td', {}, workers.length ? [...new Set(workers)].join(', ') : '–'),
            h('td.num', {}, String(j.priority)),
            h('td.reason', {}, reason || ''),
            h('td', {}, TERMINAL.has(j.state) ? '' : h('button.danger', {
                onclick: async (ev) => {
                    ev.target.disabled = true;
                    try { await api('POST', `/jobs/${j.id}/cancel`); } catch (e) { alertMsg(e); }
                    refresh();
                },
            }, 'Cancel')));
    }

    async function refresh() {
        clearTimeout(timer);
        try {
            const list = await get(`/jobs?limit=100${state ? `&state=${state}` : ''}`);
            // finished jobs are fetched once; live ones on every refresh
            await Promise.all(list.jobs.filter((j) => !(TERMINAL.has(j.state) && details.get(j.id)?.state === j.state))
                .map((j) => get(`/jobs/${j.id}`).then((d) => details.set(j.id, d)).catch(() => {})));
            if (stopped) return;
            clear(body).append(...list.jobs.map(row));
            if (!list.jobs.length) body.append(h('tr', {}, h('td.muted', { colspan: 10 }, 'No jobs.')));
            status.textContent = `updated ${new Date().toLocaleTimeString('en-GB')}`;
        } catch (e) {
            status.textContent = e.message;
        }
        if (!stopped) timer = setTimeout(refresh, 2000);
    }
    refresh();
    return () => { stopped = true; clearTimeout(timer); };
}

function alertMsg(e) { window.alert(e.message); }

function submitPanel(onSubmitted) {
    const text = h('textarea#spec', { rows: 8, spellcheck: 'false', 'aria-label': 'job spec (YAML)' });
    text.value = EXAMPLE;
    const file = h('input#spec-file', {
        type: 'file', accept: '.yaml,.yml,.json,text/yaml',
        onchange: async () => { if (file.files[0]) text.value = await file.files[0].text(); },
    });
    const out = h('div#submit-result');
    const btn = h('button.primary#submit', {
        onclick: async () => {
            btn.disabled = true;
            clear(out);
            try {
                const r = await api('POST', '/jobs', text.value, 'application/yaml');
                out.append(h('p.ok', {}, 'Submitted ', h('a', { href: `#/jobs/${r.id}` }, `job ${r.id}`), '.'));
                onSubmitted();
            } catch (e) {
                out.append(specError(text, e));
            }
            btn.disabled = false;
        },
    }, 'Submit');
    return h('details.submit', { open: true },
        h('summary', {}, h('h2', {}, 'Submit a job')),
        h('div', {}, text),
        h('div.toolbar', {}, btn, h('label', {}, 'or upload ', file)),
        out);
}

// The server's problem, shown at its line: the spec listed with line numbers, the bad line
// marked and the message under it; the textarea's caret goes to that line.
function specError(text, e) {
    const p = (e instanceof ApiError && e.problem) || {};
    const line = Number.isInteger(p.line) && p.line > 0 ? p.line : 0;
    const box = h('div.spec-error', { role: 'alert' },
        h('p', {}, h('strong', {}, p.title || 'Error'), line ? ` (line ${line}${p.key ? `, key ${p.key}` : ''})` : '', ': ', p.detail || e.message));
    if (!line) return box;
    const lines = text.value.split('\n');
    const list = h('ol.listing', {});
    lines.forEach((l, i) => {
        const n = i + 1;
        if (Math.abs(n - line) > 3) return;
        list.append(h(`li${n === line ? '.bad' : ''}`, { value: n, dataset: { line: n } }, l || ' '));
        if (n === line) list.append(h('li.msg', { value: n }, `↑ ${p.detail || e.message}`));
    });
    box.append(list);
    const start = lines.slice(0, line - 1).reduce((a, l) => a + l.length + 1, 0);
    text.focus();
    text.setSelectionRange(start, start + (lines[line - 1] || '').length);
    return box;
}

export { fmtAgo };

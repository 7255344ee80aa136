// job.js: one job (#/jobs/<id>): live loss, test accuracy and samples/s charts, log tail per
// rank, placement, events timeline, checkpoints with download; cancel.
import { api, get, followEvents, token } from './api.js';
import { h, clear, fmtNum, fmtTime, fmtBytes, stateBadge, progressCell } from './dom.js';
import { MetricChart } from './chart.js';
import { stats } from './stats.js';

const CHARTS = [['loss', 'loss'], ['test_accuracy', 'test accuracy'], ['samples_per_sec', 'samples/s']];
const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);
const LOG_MAX = 500;

export function jobPage(main, params, id) {
    let job = null, stop = null, stopped = false, rank = 0, refreshTimer = 0;
    const allPoints = params.get('points') === 'all';
    const head = h('div.jobhead');
    const live = h('span.live#live', {}, 'connecting…');
    const charts = {};
    const chartBox = h('div.charts');
    const info = h('div#job-info');
    const placement = h('div#placement');
    const incBox = h('div#incarnations');
    const ckpts = h('div#checkpoints');
    const timeline = h('ol.timeline#timeline');
    const logBox = h('pre.log#log');
    const rankSel = h('select#log-rank', { onchange: () => { rank = Number(rankSel.value); loadLogs(); } });

    clear(main).append(
        h('section.card', {}, head, live),
        h('section.card', {}, chartBox),
        h('div.grid2', {},
            h('section.card', {}, h('h3', {}, 'Details'), info, h('h3', {}, 'Placement'), placement,
                h('h3', {}, 'Incarnations'), incBox),
            h('section.card', {}, h('h3', {}, 'Events'), timeline)),
        h('section.card', {}, h('h3', {}, 'Checkpoints'), ckpts),
        h('section.card', {}, h('div.toolbar', {}, h('h3', {}, 'Log tail'), h('label', {}, 'rank ', rankSel)), logBox));

    for (const [name, label] of CHARTS) {
        const el = h(`div.chart#chart-${name}`);
        chartBox.append(el);
        charts[name] = new MetricChart(el, label, Object.keys(charts).length, (step) => {
            if (name === 'loss') stats.drawn(id, step);
        });
        stats.plot(id, name, charts[name].plot);
    }

    // the plan the coordinator placed the job by (GET /jobs/{id} .plan)
    function planText(p) {
        if (p.error) return `not planned: ${p.error}`;
        return `${fmtBytes(p.peak_bytes_per_rank)} per rank at batch ${p.batch}, ${p.mode === 'none' ? 'everything kept' : `${p.mode} recomputation`}` +
            ` (plain ${fmtBytes(p.plain_bytes)}, least with recomputation ${fmtBytes(p.sublinear_bytes)}); ${p.reserved_mb} MiB reserved per worker, placed ${p.placed}`;
    }

    function renderHead() {
        const j = job;
        clear(head).append(
            h('div.toolbar', {},
                h('h2', {}, `Job ${j.id}: `, h('span#job-name', {}, j.name)),
                stateBadge(j.state),
                TERMINAL.has(j.state) ? null : h('button.danger#cancel', {
                    onclick: async (ev) => {
                        ev.target.disabled = true;
                        try { await api('POST', `/jobs/${id}/cancel`); } catch (e) { window.alert(e.message); }
                        refreshJob();
                    },
                }, 'Cancel'),
                h('a.button', { href: `#/compare?ids=${id}` }, 'Compare…')),
            progressCell(j));
        const rows = [
            ['priority', j.priority], ['attempt', j.attempt],
            ['created', fmtTime(j.created_at)], ['started', fmtTime(j.started_at)], ['finished', fmtTime(j.finished_at)],
        ];
        if (j.pending_reason) rows.push(['pending reason', j.pending_reason]);
        if (j.plan) rows.push(['memory plan', planText(j.plan)]);
        if (j.failure_reason) rows.push(['failure reason', j.failure_reason]);
        for (const [k, v] of Object.entries(j.latest_metrics || {})) rows.push([`latest ${k}`, `${fmtNum(v.value)} @ step ${v.step}`]);
        if (j.result) rows.push(['result', `loss ${fmtNum(j.result.final_loss)}, accuracy ${fmtNum(j.result.test_accuracy)}, ${fmtNum(j.result.samples_per_sec)} samples/s`]);
        clear(info).append(h('table.kv', {}, rows.map(([k, v]) => h('tr', {}, h('th', {}, k), h(`td${k === 'failure reason' ? '#failure-reason' : ''}`, {}, String(v))))));
        clear(placement).append(h('table', {},
            h('thead', {}, h('tr', {}, ['rank', 'worker', 'status'].map((t) => h('th', {}, t)))),
            h('tbody', {}, (j.placement || []).map((p) => h('tr', {},
                h('td', {}, String(p.rank)), h('td', {}, p.worker || p.worker_id || '–'),
                h('td', {}, p.exited ? `exited ${p.signal ? `(signal ${p.signal})` : `(code ${p.exit_code ?? '?'})`}` : 'running'))))));
        const incs = j.incarnations || [];
        clear(incBox).append(incs.length ? h('table', {},
            h('thead', {}, h('tr', {}, ['#', 'workers', 'from step', 'started', 'ended', 'how'].map((t) => h('th', {}, t)))),
            h('tbody', {}, incs.map((n) => h('tr', { dataset: { incarnation: n.incarnation } },
                h('td.num', {}, String(n.incarnation)),
                h('td', {}, `${(n.members || []).join(', ') || '–'} (${n.world})`),
                h('td.num', {}, fmtNum(n.start_step)), h('td', {}, fmtTime(n.started_at)),
                h('td', {}, fmtTime(n.ended_at)),
                h('td', {}, n.ended ? `${n.ended}${n.reason ? `: ${n.reason}` : ''}${n.infra ? ' (not counted)' : ''}` : 'running')))))
            : h('p.muted', {}, 'Not started yet.'));
        const ranks = Math.max(1, ...(j.placement || []).map((p) => p.rank + 1));
        if (rankSel.options.length !== ranks) {
            clear(rankSel).append(...Array.from({ length: ranks }, (_, r) => h('option', { value: r, selected: r === rank }, String(r))));
        }
    }

    let terminalShown = false;
    function addTimeline(time, text, kind = 'state') {
        timeline.append(h(`li.${kind}`, {}, h('time', {}, fmtTime(time)), ' ', text));
    }
    function addState(time, state, reason) {
        if (TERMINAL.has(state)) {
            if (terminalShown) return; // seeded from the job, then replayed by the stream
            terminalShown = true;
        }
        addTimeline(time, `${state}${reason ? ` – ${reason}` : ''}`);
    }

    // What happened before the page opened: submission, each incarnation (who ran it, from
    // which step, how it ended) and, for a finished job, how and when it finished.
    function seedTimeline() {
        clear(timeline);
        terminalShown = false;
        addTimeline(job.created_at, 'submitted');
        const incs = job.incarnations || [];
        incs.forEach((n, i) => {
            const prev = incs[i - 1];
            const how = !prev ? 'running' : prev.world !== n.world ? `re-formed ${prev.world} → ${n.world}` : 're-formed';
            addTimeline(n.started_at, `${how}: incarnation ${n.incarnation} on ${(n.members || []).join(', ') || '?'}, from step ${n.start_step}`, 'inc');
            if (n.ended && n.ended_at && (i < incs.length - 1 || !TERMINAL.has(job.state)))
                addTimeline(n.ended_at, `incarnation ${n.incarnation} ended: ${n.ended}${n.reason ? ` – ${n.reason}` : ''}`, 'inc');
        });
        if (!incs.length && job.started_at) addTimeline(job.started_at, `running${job.attempt > 1 ? ` (attempt ${job.attempt})` : ''}`);
        if (TERMINAL.has(job.state)) addState(job.finished_at, job.state, job.failure_reason);
    }

    async function refreshJob() {
        try {
            job = await get(`/jobs/${id}`);
            if (!stopped) renderHead();
        } catch (e) { /* the stream's reconnect shows the state */ }
    }

    async function loadCheckpoints() {
        try {
            const r = await get(`/jobs/${id}/checkpoints`);
            clear(ckpts).append(r.checkpoints.length ? h('table', {},
                h('thead', {}, h('tr', {}, ['name', 'step', 'size', 'worker', 'time', ''].map((t) => h('th', {}, t)))),
                h('tbody', {}, r.checkpoints.map((c) => h('tr', {},
                    h('td', {}, c.name), h('td.num', {}, fmtNum(c.step)), h('td.num', {}, fmtBytes(c.size)),
                    h('td', {}, c.worker || '–'), h('td', {}, fmtTime(c.time)),
                    h('td', {}, h('button.link', { onclick: () => download(id, c.name) }, 'download'))))))
                : h('p.muted', {}, 'No checkpoints yet.'));
        } catch (e) { /* keep what is shown */ }
    }

    function appendLog(l) {
        logBox.append(h(`span.${l.stream === 'stderr' ? 'err' : 'out'}`, {}, l.text + '\n'));
        while (logBox.childNodes.length > LOG_MAX) logBox.removeChild(logBox.firstChild);
        logBox.scrollTop = logBox.scrollHeight;
    }

    async function loadLogs() {
        try {
            const r = await get(`/jobs/${id}/logs?rank=${rank}&tail=200`);
            clear(logBox);
            r.lines.forEach(appendLog);
        } catch (e) { /* keep */ }
    }

    // One request per chart, in parallel; LTTB on the server unless ?points=all.
    async function loadMetrics() {
        const t0 = performance.now();
        const rs = await Promise.all(CHARTS.map(([name]) => get(`/jobs/${id}/metrics?name=${name}${allPoints ? '' : '&max_points=2000'}`)));
        const t1 = performance.now();
        const draws = [];
        let points = 0, total = 0;
        CHARTS.forEach(([name], i) => {
            const ms = rs[i].metrics;
            points += ms.length;
            total += rs[i].total ?? ms.length;
            draws.push(charts[name].set(ms.map((m) => m.step), ms.map((m) => m.value)).then((dt) => [name, ms.length, dt]));
        });
        const drawn = await Promise.all(draws);
        stats.load(id, {
            points, total, fetch_ms: t1 - t0, total_ms: performance.now() - t0,
            draw_ms: Math.max(...drawn.map((d) => d[2])),
            charts: Object.fromEntries(drawn.map(([n, k, dt]) => [n, { points: k, draw_ms: dt }])),
        });
        // the smallest: every chart's stream position is covered
        return Math.min(...rs.map((r) => r.last_event_id || 0));
    }

    function onEvent(kind, d) {
        if (kind === 'metric') {
            if ((d.rank ?? 0) !== 0) return;
            if (typeof d.step !== 'number') return;
            for (const [name] of CHARTS) if (typeof d[name] === 'number') {
                if (name === 'loss') stats.received(id, d.step, d.time);
                charts[name].push(d.step, d[name]);
            }
            if (job) {
                job.latest_metrics ||= {};
                for (const [k, v] of Object.entries(d)) if (typeof v === 'number' && k !== 'step' && k !== 'rank') job.latest_metrics[k] = { step: d.step, value: v };
            }
            if (job && job.progress && d.loss !== undefined) {
                job.progress.step = d.step;
                job.progress.fraction = job.progress.total_steps ? d.step / job.progress.total_steps : 0;
            }
        } else if (kind === 'log') {
            if ((d.rank ?? 0) === rank) appendLog(d);
        } else if (kind === 'state') {
            addState(d.time, d.state || JSON.stringify(d), d.reason);
            refreshJob();
        } else if (kind === 'checkpoint') {
            addTimeline(d.time, `checkpoint ${String(d.text || '').split(' ')[0]}`, 'ckpt');
            loadCheckpoints();
        }
    }

    (async () => {
        try {
            job = await get(`/jobs/${id}`);
        } catch (e) {
            clear(main).append(h('section.card', {}, h('p.error', {}, e.message)));
            return;
        }
        if (stopped) return;
        renderHead();
        seedTimeline();
        const lastId = await loadMetrics().catch(() => 0);
        loadLogs();
        loadCheckpoints();
        if (stopped) return;
        stop = followEvents(id, lastId, onEvent, (s) => {
            live.textContent = s === 'live' ? '● live' : s === 'ended' ? 'finished' : '○ reconnecting…';
            live.className = `live ${s}`;
            if (s === 'live') refreshJob();
        });
        // the header's progress and ETA between state events; a queued job's pending reason
        // (what it waits for, when it may start) is fetched again every 3 s
        let ticks = 0;
        const tick = () => {
            if (job && job.state === 'queued' && ++ticks % 3 === 0) refreshJob();
            else if (job && !TERMINAL.has(job.state)) renderHead();
            refreshTimer = setTimeout(tick, 1000);
        };
        refreshTimer = setTimeout(tick, 1000);
    })();

    return () => {
        stopped = true;
        clearTimeout(refreshTimer);
        if (stop) stop();
        Object.values(charts).forEach((c) => c.destroy());
    };
}

async function download(id, name) {
    const r = await fetch(`/api/v1/jobs/${id}/checkpoints/${encodeURIComponent(name)}`, { headers: { Authorization: `Bearer ${token()}` } });
    if (!r.ok) { window.alert(`download failed: HTTP ${r.status}`); return; }
    const url = URL.createObjectURL(await r.blob());
    const a = h('a', { href: url, download: `job${id}-${name.replace(/[^\w.-]/g, '_')}` });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
}

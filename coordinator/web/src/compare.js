// compare.js: overlay the loss curves of several jobs and list how their specs differ.
import { get } from './api.js';
import { h, clear, stateBadge } from './dom.js';
import { overlayChart } from './chart.js';

const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);

// {"a": {"b": 1}} -> {"a.b": 1}
function flatten(o, prefix = '', out = {}) {
    for (const [k, v] of Object.entries(o || {})) {
        const key = prefix ? `${prefix}.${k}` : k;
        if (v && typeof v === 'object' && !Array.isArray(v)) flatten(v, key, out);
        else out[key] = JSON.stringify(v);
    }
    return out;
}

export function comparePage(main, params) {
    let ids = (params.get('ids') || '').split(',').map(Number).filter((n) => n > 0);
    let chart = null, timer = 0, stopped = false, showAll = false;
    const input = h('input#compare-ids', { value: ids.join(','), placeholder: 'job ids, e.g. 3,4', size: 20 });
    const form = h('form.toolbar', {
        onsubmit: (e) => { e.preventDefault(); location.hash = `#/compare?ids=${input.value.replace(/[^0-9,]/g, '')}`; },
    }, h('h2', {}, 'Compare'), input, h('button', { type: 'submit' }, 'Show'));
    const legend = h('div#compare-jobs');
    const chartEl = h('div.chart#compare-chart');
    const diff = h('div#spec-diff');
    const toggle = h('label', {}, h('input', { type: 'checkbox', onchange: (e) => { showAll = e.target.checked; load(); } }), ' show equal keys too');
    clear(main).append(h('section.card', {}, form, legend, chartEl),
        h('section.card', {}, h('div.toolbar', {}, h('h3', {}, 'Spec differences'), toggle), diff));
    if (ids.length < 1) { legend.append(h('p.muted', {}, 'Pick jobs on the Jobs page, or type their ids.')); return () => {}; }

    async function load() {
        clearTimeout(timer);
        let jobs;
        try {
            jobs = await Promise.all(ids.map((id) => get(`/jobs/${id}`)));
            const metrics = await Promise.all(ids.map((id) => get(`/jobs/${id}/metrics?name=loss&max_points=2000`)));
            if (stopped) return;
            const runs = jobs.map((j, i) => ({
                label: `${j.id} ${j.name}`,
                xs: metrics[i].metrics.map((m) => m.step),
                ys: metrics[i].metrics.map((m) => m.value),
            }));
            if (chart) chart.destroy();
            clear(chartEl);
            chart = overlayChart(chartEl, 'loss', runs);
            chartEl.dataset.series = String(runs.length);
            chartEl.dataset.points = runs.map((r) => r.xs.length).join(',');
            clear(legend).append(h('ul.runs', {}, jobs.map((j) => h('li', {}, h('a', { href: `#/jobs/${j.id}` }, `${j.id} ${j.name}`), ' ', stateBadge(j.state)))));
            renderDiff(jobs);
        } catch (e) {
            clear(legend).append(h('p.error', {}, e.message));
        }
        if (!stopped && jobs && jobs.some((j) => !TERMINAL.has(j.state))) timer = setTimeout(load, 3000);
    }

    function renderDiff(jobs) {
        const flat = jobs.map((j) => flatten(j.spec));
        const keys = [...new Set(flat.flatMap((f) => Object.keys(f)))].sort();
        const rows = keys.filter((k) => showAll || new Set(flat.map((f) => f[k])).size > 1);
        clear(diff).append(rows.length ? h('table.diff', {},
            h('thead', {}, h('tr', {}, h('th', {}, 'key'), jobs.map((j) => h('th', {}, `${j.id} ${j.name}`)))),
            h('tbody', {}, rows.map((k) => {
                const differs = new Set(flat.map((f) => f[k])).size > 1;
                return h(`tr${differs ? '.differs' : ''}`, { dataset: { key: k } }, h('th', {}, k), flat.map((f) => h('td', {}, f[k] ?? '(absent)')));
            })))
            : h('p.muted', {}, 'The specs are the same.'));
    }

    load();
    return () => { stopped = true; clearTimeout(timer); if (chart) chart.destroy(); };
}

// workers.js: workers with their slots, free slots, GPUs, running ranks, last heartbeat; drain and undrain.
import { api, get } from './api.js';
import { h, clear, fmtAgo } from './dom.js';

export function workersPage(main) {
    let timer = 0, stopped = false;
    const body = h('tbody#workers-body');
    const status = h('span.muted');
    clear(main).append(h('section.card', {}, h('div.toolbar', {}, h('h2', {}, 'Workers'), status),
        h('table', {}, h('thead', {}, h('tr', {}, ['Name', 'Host', 'State', 'Slots', 'Free', 'GPUs', 'Running ranks', 'Last heartbeat', 'Version', ''].map((t) => h('th', {}, t)))), body)));

    const slots = (s) => s ? `${s.cpus} CPU · ${s.memory_mb} MB${s.gpus ? ` · ${s.gpus} GPU` : ''}${s.device ? ` (${s.device})` : ''}` : '–';

    // each GPU on a line: "0 · NVIDIA H100 80GB HBM3 · 81559 MiB · free"
    const gpus = (list) => list && list.length
        ? h('ul.gpus', {}, list.map((g) => h('li', { dataset: { gpu: String(g.index), free: String(g.free) } },
            `${g.index} · ${g.name} · ${g.memory_mb} MiB · ${g.free ? 'free' : 'in use'}`)))
        : '–';

    async function refresh() {
        clearTimeout(timer);
        try {
            const r = await get('/workers');
            if (stopped) return;
            clear(body).append(...r.workers.map((w) => h('tr', { dataset: { name: w.name, state: w.state } },
                h('td', {}, w.name), h('td', {}, w.host), h('td', {}, h(`span.badge.w-${/^[a-z]+$/.test(w.state) ? w.state : 'x'}`, {}, w.state)),
                h('td', {}, slots(w.slots)), h('td', {}, slots(w.free)), h('td.gpus', {}, gpus(w.gpus)), h('td.num', {}, String(w.running_ranks)),
                h('td', {}, fmtAgo(w.last_seen)), h('td', {}, w.version),
                h('td', {}, w.state === 'ready' ? h('button', {
                    onclick: async (ev) => {
                        if (!window.confirm(`Drain ${w.name}? Running ranks finish; no new ones are placed there.`)) return;
                        ev.target.disabled = true;
                        try { await api('POST', `/workers/${encodeURIComponent(w.id)}/drain`); } catch (e) { window.alert(e.message); }
                        refresh();
                    },
                }, 'Drain') : w.drain ? h('button.undrain', {
                    onclick: async (ev) => {
                        ev.target.disabled = true;
                        try { await api('POST', `/workers/${encodeURIComponent(w.id)}/undrain`); } catch (e) { window.alert(e.message); }
                        refresh();
                    },
                }, 'Undrain') : ''))));
            if (!r.workers.length) body.append(h('tr', {}, h('td.muted', { colspan: 10 }, 'No workers.')));
            status.textContent = `updated ${new Date().toLocaleTimeString('en-GB')}`;
        } catch (e) { status.textContent = e.message; }
        if (!stopped) timer = setTimeout(refresh, 2000);
    }
    refresh();
    return () => { stopped = true; clearTimeout(timer); };
}

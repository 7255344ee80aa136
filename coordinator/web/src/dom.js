// dom.js: the only way this dashboard makes DOM. Text always goes in as text nodes, never as
// markup, so a log line or a failure reason like "<img src=x onerror=...>" shows as text.

// h('tag#id.class', {attr: v, onclick: fn}, child...): children are nodes or strings (as text).
export function h(spec, attrs, ...children) {
    let tag = 'div';
    const classes = [];
    let id = '';
    for (const [, sigil, name] of spec.matchAll(/([#.]?)([^#.]+)/g)) {
        if (sigil === '.') classes.push(name);
        else if (sigil === '#') id = name;
        else tag = name;
    }
    const el = document.createElement(tag);
    if (id) el.id = id;
    if (classes.length) el.className = classes.join(' ');
    for (const [k, v] of Object.entries(attrs || {})) {
        if (v === undefined || v === null || v === false) continue;
        if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
        else if (k === 'dataset') Object.assign(el.dataset, v);
        else if (k === 'value') el.value = v;
        else el.setAttribute(k, v === true ? '' : String(v));
    }
    append(el, children);
    return el;
}

function append(el, children) {
    for (const c of children) {
        if (c === undefined || c === null || c === false) continue;
        if (Array.isArray(c)) append(el, c);
        else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
}

export function clear(el) {
    while (el.firstChild) el.removeChild(el.firstChild);
    return el;
}

export function fmtNum(v, digits = 4) {
    if (v === undefined || v === null || Number.isNaN(v)) return '–';
    if (typeof v !== 'number') return String(v);
    if (Number.isInteger(v)) return v.toLocaleString('en');
    return Math.abs(v) >= 1000 ? v.toFixed(0) : v.toPrecision(digits);
}

// An axis label: at most ~5 characters (12k, 1.5M, 0.25), so labels are never clipped.
export function fmtShort(v) {
    if (v === null || v === undefined || !isFinite(v)) return '';
    const a = Math.abs(v);
    if (a >= 1e9) return `${+(v / 1e9).toPrecision(3)}G`;
    if (a >= 1e6) return `${+(v / 1e6).toPrecision(3)}M`;
    if (a >= 1e4) return `${+(v / 1e3).toPrecision(3)}k`;
    if (a >= 100 || v === 0) return String(Math.round(v));
    return String(+v.toPrecision(3));
}

export function fmtDuration(sec) {
    if (!isFinite(sec) || sec < 0) return '–';
    if (sec < 60) return `${sec.toFixed(0)} s`;
    if (sec < 3600) return `${Math.floor(sec / 60)} min ${Math.round(sec % 60)} s`;
    return `${Math.floor(sec / 3600)} h ${Math.round((sec % 3600) / 60)} min`;
}

export function fmtAgo(iso) {
    if (!iso) return '–';
    const s = (Date.now() - Date.parse(iso)) / 1000;
    return s < 1 ? 'just now' : `${fmtDuration(s)} ago`;
}

export function fmtTime(iso) {
    if (!iso) return '–';
    const d = new Date(iso);
    return d.toLocaleString('en-GB', { hour12: false });
}

export function fmtBytes(n) {
    if (typeof n !== 'number') return '–';
    const u = ['B', 'KiB', 'MiB', 'GiB'];
    let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return `${i ? n.toFixed(1) : n} ${u[i]}`;
}

export function stateBadge(state) {
    return h(`span.badge.s-${/^[a-z]+$/.test(state) ? state : 'unknown'}`, {}, state);
}

// Progress {step, total_steps, fraction} and the ETA from the time since started_at.
export function progressCell(job) {
    const p = job.progress;
    if (!p) return '–';
    const pct = Math.max(0, Math.min(1, p.fraction || 0));
    let eta = '';
    if (job.state === 'running' && job.started_at && p.step > 0 && p.total_steps > p.step) {
        const el = (Date.now() - Date.parse(job.started_at)) / 1000;
        eta = ` · ETA ${fmtDuration((el / p.step) * (p.total_steps - p.step))}`;
    }
    return h('div.progress', {},
        h('div.bar', {}, h('div.fill', { style: `width:${(pct * 100).toFixed(1)}%` })),
        h('span.small', {}, `${fmtNum(p.step)} / ${fmtNum(p.total_steps)}${eta}`));
}

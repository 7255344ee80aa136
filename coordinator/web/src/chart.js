// chart.js: uPlot line charts: one metric over steps, fed live; and several runs overlaid.
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import { fmtShort } from './dom.js';

const COLORS = ['#2563eb', '#dc2626', '#16a34a', '#9333ea', '#ea580c', '#0891b2', '#4d7c0f', '#be185d'];
export const color = (i) => COLORS[i % COLORS.length];

function size(el) {
    return { width: Math.max(280, el.clientWidth || 600), height: 220 };
}

// The y axis: short labels (12k, not 12,000 clipped to "2,000"), wide enough for the longest.
const yAxis = () => ({
    values: (u, splits) => splits.map(fmtShort),
    size: (u, values) => 14 + 7 * Math.max(3, ...(values || []).map((v) => String(v).length)),
});

// Markers where a series is sparse (an evaluation per epoch): a line needs two points, so a
// one-point series would draw nothing.
const sparsePoints = (c) => ({ show: (u, si, i0, i1) => i1 - i0 < 64, size: 8, fill: c, stroke: c });

// A live chart of one metric. push(step, value) appends (steps only grow); the chart redraws
// at most once per animation frame, then calls onDrawn(lastStep).
export class MetricChart {
    constructor(el, label, colorIdx = 0, onDrawn = () => {}) {
        this.el = el;
        this.xs = [];
        this.ys = [];
        this.pending = false;
        this.onDrawn = onDrawn;
        const opts = {
            ...size(el),
            title: label,
            scales: { x: { time: false } },
            axes: [{ label: 'step' }, yAxis()],
            series: [{ label: 'step' }, { label, stroke: color(colorIdx), width: 1.5, points: sparsePoints(color(colorIdx)) }],
            legend: { live: true },
            cursor: { drag: { x: true, y: false } },
            hooks: { draw: [() => this.afterDraw()] },
        };
        this.waiting = null;
        this.plot = new uPlot(opts, [this.xs, this.ys], el);
        this.ro = new ResizeObserver(() => this.plot.setSize(size(el)));
        this.ro.observe(el);
    }

    afterDraw() {
        if (this.waiting) { this.waiting(); this.waiting = null; }
    }

    // Replace all points (steps ascending). Resolves, once the canvas is drawn, to the time
    // from the call to the end of the draw, in ms (uPlot draws in a microtask).
    set(xs, ys) {
        const t0 = performance.now();
        const done = new Promise((res) => { this.waiting = () => res(performance.now() - t0); });
        this.xs = xs;
        this.ys = ys;
        this.plot.setData([this.xs, this.ys]);
        return Promise.race([done, new Promise((res) => setTimeout(() => res(performance.now() - t0), 2000))]);
    }

    push(step, value) {
        const n = this.xs.length;
        if (!n || step > this.xs[n - 1]) {
            this.xs.push(step);
            this.ys.push(value);
        } else {
            // late (held by a worker while the coordinator was away) or a repeat
            let lo = 0, hi = n;
            while (lo < hi) { const mid = (lo + hi) >> 1; if (this.xs[mid] < step) lo = mid + 1; else hi = mid; }
            if (this.xs[lo] === step) return;
            this.xs.splice(lo, 0, step);
            this.ys.splice(lo, 0, value);
        }
        if (!this.pending) {
            this.pending = true;
            requestAnimationFrame(() => {
                this.pending = false;
                this.plot.setData([this.xs, this.ys]);
                this.onDrawn(this.xs[this.xs.length - 1]);
            });
        }
    }

    get count() { return this.xs.length; }
    destroy() { this.ro.disconnect(); this.plot.destroy(); }
}

// Several runs of one metric overlaid: runs = [{label, xs, ys}].
export function overlayChart(el, title, runs) {
    const data = uPlot.join(runs.map((r) => [r.xs, r.ys]));
    const opts = {
        ...size(el),
        height: 320,
        title,
        scales: { x: { time: false } },
        axes: [{ label: 'step' }, yAxis()],
        series: [{ label: 'step' }, ...runs.map((r, i) => ({
            label: r.label, stroke: color(i), width: 1.5, spanGaps: true, points: sparsePoints(color(i)),
        }))],
        cursor: { drag: { x: true, y: false } },
    };
    const plot = new uPlot(opts, data, el);
    const ro = new ResizeObserver(() => plot.setSize({ width: size(el).width, height: 320 }));
    ro.observe(el);
    return { plot, destroy() { ro.disconnect(); plot.destroy(); } };
}

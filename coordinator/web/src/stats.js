// stats.js: measurements the e2e test reads (window.__mge): per job, when each loss step
// arrived, when it was drawn, and the cost of the first load. Cheap enough to keep on.
const jobs = {};
const of = (id) => (jobs[id] ||= { received: {}, drawn: [], loads: [], plots: {} });

export const stats = {
    // @time: the metric's timestamp from the server (when the worker read the line)
    received(id, step, time) { of(id).received[step] = { t: Date.now(), metricTime: time ? Date.parse(time) : null }; },
    drawn(id, step) {
        const j = of(id), now = Date.now();
        for (const [s, r] of Object.entries(j.received)) {
            if (Number(s) > step) continue;
            j.drawn.push({ step: Number(s), latency_ms: r.metricTime ? now - r.metricTime : null, in_page_ms: now - r.t });
            delete j.received[s];
        }
        if (j.drawn.length > 5000) j.drawn.splice(0, j.drawn.length - 5000);
    },
    load(id, l) { of(id).loads.push(l); },
    // the uPlot of each chart, so the test can read what its axes show
    plot(id, name, u) { of(id).plots[name] = u; },
};
window.__mge = { jobs };

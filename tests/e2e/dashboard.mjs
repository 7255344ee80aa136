// dashboard.mjs BUILD CHROMIUM: end-to-end test of the web dashboard (run by run.sh).
// Real daemons on loopback (mge-coordinator, one mge-worker running the real mge-train),
// Debian's Chromium through playwright-core. Checks: token from the URL fragment, submit
// through the page (and a 422 shown at its line), the loss chart gaining points live, the
// coordinator killed and restarted under the page (the stream reconnects), compare view,
// cancel, hostile text rendered as text, workers page. Measures page weight, metric-to-chart
// latency and the time to render a 100,000-point series. Every wait polls with a deadline.
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { mkdtempSync, mkdirSync, readFileSync, writeFileSync, existsSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

const BUILD = resolve(process.argv[2] || 'build');
const CHROMIUM = process.argv[3] || '/usr/bin/chromium';
const require = createRequire(resolve('coordinator/web/package.json'));
const { chromium } = require('playwright-core');

const ART = join(BUILD, 'e2e-artifacts');
rmSync(ART, { recursive: true, force: true });
mkdirSync(ART, { recursive: true });
const T = mkdtempSync(join(tmpdir(), 'mge-e2e-'));
const TOKEN = 'e2e-admin-token';
writeFileSync(join(T, 'tokens'), `admin ${TOKEN}\n`);
writeFileSync(join(T, 'join'), 'e2e-join\n');
const t0 = Date.now();
const el = () => `${((Date.now() - t0) / 1000).toFixed(1)}s`;

let fails = 0;
const results = {};
const ok = (m) => console.log(`ok   - ${m}`);
const fail = (m) => { console.log(`FAIL - ${m}`); fails++; };
const check = (cond, m) => (cond ? ok(m) : fail(m));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function until(what, fn, timeoutMs = 15000, every = 100) {
    const end = Date.now() + timeoutMs;
    let last;
    while (Date.now() < end) {
        try { last = await fn(); if (last) return last; } catch (e) { last = e; }
        await sleep(every);
    }
    throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last instanceof Error ? `: ${last.message}` : ''}`);
}

// ---- daemons ----
const procs = new Set();
function start(bin, args, log) {
    const out = join(T, log);
    // one OpenMP thread per rank: two cores are shared with Chromium and other ranks
    const p = spawn(join(BUILD, 'bin', bin), args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, OMP_NUM_THREADS: '1' } });
    p.stdout.on('data', (d) => writeFileSync(out, d, { flag: 'a' }));
    p.stderr.on('data', (d) => writeFileSync(out, d, { flag: 'a' }));
    procs.add(p);
    p.on('exit', () => procs.delete(p));
    return p;
}
let coord, worker, URL_, WORKER_URL, HTTP_ADDR = '127.0.0.1:0';
async function startCoord() {
    rmSync(join(T, 'ports'), { force: true });
    coord = start('mge-coordinator', ['--listen', HTTP_ADDR, '--worker-listen', WORKER_URL || 'tcp://127.0.0.1:0',
        '--state-dir', join(T, 'state'), '--token-file', join(T, 'tokens'), '--join-token-file', join(T, 'join'),
        '--ports-file', join(T, 'ports'), '--worker-timeout', '10', '--heartbeat-ms', '500',
        '--cancel-grace-ms', '1000', '--web-root', join(BUILD, 'web')], 'coordinator.log');
    const ports = await until('the coordinator', () => existsSync(join(T, 'ports')) && readFileSync(join(T, 'ports'), 'utf8'), 10000);
    HTTP_ADDR = /http=(\S+)/.exec(ports)[1];
    WORKER_URL = /worker=(\S+)/.exec(ports)[1];
    URL_ = `http://${HTTP_ADDR}`;
}
async function api(method, path, body, ctype) {
    const headers = { Authorization: `Bearer ${TOKEN}` };
    if (ctype) headers['Content-Type'] = ctype;
    const r = await fetch(URL_ + '/api/v1' + path, { method, headers, body });
    return { status: r.status, body: await r.json().catch(() => null) };
}
const jobState = async (id) => (await api('GET', `/jobs/${id}`)).body?.state;
const spec = (name, steps, extra = '') => `name: ${name}
model: {type: mlp, hidden: [64, 64]}
data: {format: synthetic, train_size: 4096, input_dim: 784, classes: 10}
train: {steps: ${steps}, batch_size: 32, optimizer: {type: sgd, lr: ${extra || 0.05}, momentum: 0.9}, checkpoint_every: 500}
`;

let browser;
async function main() {
    await startCoord();
    mkdirSync(join(T, 'w1'));
    worker = start('mge-worker', ['--coordinator', WORKER_URL, '--join-token-file', join(T, 'join'), '--name', 'w1',
        '--cpus', '4', '--memory-mb', '8192', '--work-dir', join(T, 'w1'), '--train-bin', join(BUILD, 'bin', 'mge-train'),
        '--heartbeat-ms', '500'], 'worker.log');
    await until('worker w1 ready', async () => (await api('GET', '/workers')).body?.workers?.some((w) => w.name === 'w1' && w.state === 'ready'), 10000);
    ok(`coordinator ${URL_} and worker w1 up (${el()})`);

    browser = await chromium.launch({
        executablePath: CHROMIUM,
        args: ['--no-sandbox', '--disable-background-networking', '--disable-component-update', '--disable-dev-shm-usage'],
    });
    const ctx = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
    const page = await ctx.newPage();
    const pageErrors = [];
    page.on('pageerror', (e) => pageErrors.push(e.message));
    page.on('dialog', (d) => { pageErrors.push(`dialog: ${d.message()}`); d.accept(); });
    const shot = (name) => page.screenshot({ path: join(ART, `${name}.png`), fullPage: true });

    // ---- first load: the token comes in the fragment and leaves the URL; page weight ----
    await page.goto(`${URL_}/#/jobs?token=${TOKEN}`);
    await page.waitForSelector('#jobs-body', { timeout: 10000 });
    check(!page.url().includes('token'), `the token left the URL (${page.url()})`);
    check(await page.evaluate(() => sessionStorage.getItem('mge.token')) === TOKEN, 'the token is in sessionStorage');
    const weight = await page.evaluate(() => {
        const nav = performance.getEntriesByType('navigation')[0];
        const res = performance.getEntriesByType('resource').filter((r) => !r.name.includes('/api/'));
        return { transfer: nav.encodedBodySize + res.reduce((a, r) => a + r.encodedBodySize, 0), decoded: nav.decodedBodySize + res.reduce((a, r) => a + r.decodedBodySize, 0), files: res.length + 1 };
    });
    results.page_weight = weight;
    check(weight.transfer > 0 && weight.transfer <= 300 * 1024, `first load ${(weight.transfer / 1024).toFixed(1)} KiB transferred (gzip), ${(weight.decoded / 1024).toFixed(1)} KiB decoded, ${weight.files} files (<= 300 KB)`);

    // ---- submit through the page: a bad name first (422 at its line), then a good spec ----
    await page.fill('#spec', 'model: {type: mlp}\nname: "<script>alert(1)</script>"\n');
    await page.click('#submit');
    await page.waitForSelector('.spec-error', { timeout: 5000 });
    const err = await page.evaluate(() => ({ text: document.querySelector('.spec-error').textContent, bad: document.querySelector('.spec-error li.bad')?.dataset.line, scripts: document.querySelectorAll('main script').length }));
    check(err.bad === '2', `the 422 is shown at line 2 (marked line ${err.bad})`);
    check(/name/.test(err.text) && err.text.includes('<script>alert(1)</script>') && err.scripts === 0, 'the name rule holds and the hostile name shows as text, not markup');
    await shot('01-submit-error');

    // job A must still run after the coordinator restart below and end within a minute:
    // a heavier model than the others (about 1 ms a step on one core)
    await page.fill('#spec', spec('e2e-a', 10000).replace('hidden: [64, 64]', 'hidden: [256, 256]'));
    await page.click('#submit');
    const linkA = await page.waitForSelector('#submit-result a', { timeout: 5000 });
    const idA = Number((await linkA.textContent()).replace(/\D/g, ''));
    check(idA > 0, `job ${idA} submitted through the page`);
    await until(`job ${idA} running`, async () => (await jobState(idA)) === 'running', 20000);

    // ---- the job page: the loss chart gains points while it runs ----
    await page.goto(`${URL_}/#/jobs/${idA}`);
    await page.waitForSelector('#live.live', { timeout: 10000 });
    const lossCount = () => page.evaluate(() => {
        const u = document.querySelector('#chart-loss .u-over') && document.querySelector('#chart-loss');
        return u ? (window.__mge.jobs[location.hash.match(/jobs\/(\d+)/)[1]]?.drawn.length ?? 0) : 0;
    });
    const c1 = await until('loss points drawn', async () => { const n = await lossCount(); return n > 20 && n; }, 20000);
    await sleep(1500);
    const c2 = await lossCount();
    check(c2 > c1, `the loss chart gains points live (${c1} -> ${c2} steps drawn)`);
    await shot('02-job-live');

    // ---- the coordinator is killed and restarted under the page ----
    const before = await lossCount();
    const steady = await page.evaluate((id) => window.__mge.jobs[id].drawn.slice(), String(idA));
    coord.kill('SIGKILL');
    await until('the page to notice', () => page.evaluate(() => document.querySelector('#live')?.classList.contains('reconnecting')), 10000);
    ok('the page shows the stream reconnecting after kill -9 of the coordinator');
    await shot('03-coordinator-down');
    await sleep(800);
    await startCoord();
    await until('the stream live again', () => page.evaluate(() => document.querySelector('#live')?.classList.contains('live')), 15000);
    const after = await until('new points after the restart', async () => { const n = await lossCount(); return n > before + 10 && n; }, 20000);
    check(after > before, `after the restart the chart goes on (${before} -> ${after} steps drawn)`);
    await shot('04-after-restart');

    // ---- metric-to-chart latency: the worker's timestamp of the line vs. the draw ----
    // steady: the steps drawn before the kill; overall: with the steps that waited out the restart
    const drawn = await page.evaluate((id) => window.__mge.jobs[id].drawn, String(idA));
    const summary = (rows) => {
        const lat = rows.map((d) => d.latency_ms).filter((x) => x !== null).sort((a, b) => a - b);
        const pct = (p) => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))];
        return { n: lat.length, p50: pct(0.5), p95: pct(0.95), p99: pct(0.99), max: lat[lat.length - 1] };
    };
    const st = summary(steady), all = summary(drawn);
    results.latency_ms = { steady: st, with_restart: all };
    check(st.n > 50 && st.max <= 1000, `metric-to-chart latency (worker's line timestamp -> drawn): p50 ${st.p50} ms, p95 ${st.p95} ms, max ${st.max} ms over ${st.n} steps (max <= 1000 ms)`);
    ok(`with the coordinator restart in between: p50 ${all.p50} ms, p95 ${all.p95} ms, max ${all.max} ms over ${all.n} steps`);

    // ---- a second run for comparison; a hostile data path; a long job to cancel ----
    const idB = (await api('POST', '/jobs', spec('e2e-b', 1500, 0.02), 'application/yaml')).body.id;
    const hostile = '/nonexistent/<img src=x onerror="window.__xss=1">.gz';
    const hostileSpec = `name: e2e-hostile\nmodel: {type: mlp, hidden: [8]}\ndata: {format: idx, train_images: '${hostile}', train_labels: /nonexistent/l.gz}\ntrain: {steps: 10, batch_size: 8, optimizer: {type: sgd, lr: 0.1}}\n`;
    const rh = await api('POST', '/jobs', hostileSpec, 'application/yaml');
    check(rh.status === 201, `a job whose data path carries markup is accepted (${rh.status}${rh.body?.detail ? `: ${rh.body.detail}` : ''})`);
    const idH = rh.body?.id;
    const idC = (await api('POST', '/jobs', spec('e2e-cancel', 200000), 'application/yaml')).body.id;

    // ---- cancel through the jobs page ----
    await page.goto(`${URL_}/#/jobs`);
    const cancelBtn = await page.waitForSelector(`tr[data-id="${idC}"] button.danger`, { timeout: 10000 });
    await until(`job ${idC} running`, async () => (await jobState(idC)) === 'running', 20000);
    await cancelBtn.click();
    await until(`job ${idC} cancelled`, async () => (await jobState(idC)) === 'cancelled', 10000);
    await page.waitForSelector(`tr[data-id="${idC}"][data-state="cancelled"]`, { timeout: 5000 });
    ok(`job ${idC} cancelled from the jobs page`);

    // ---- hostile text renders as text ----
    if (idH) {
        await until(`job ${idH} failed`, async () => (await jobState(idH)) === 'failed', 20000);
        await page.goto(`${URL_}/#/jobs/${idH}`);
        const fr = await page.waitForSelector('#failure-reason', { timeout: 10000 });
        const reason = await fr.textContent();
        await sleep(300);
        const xss = await page.evaluate(() => ({ flag: window.__xss, imgs: document.querySelectorAll('main img').length }));
        check(reason.includes('<img src=x') && xss.flag === undefined && xss.imgs === 0, `the failure reason shows the markup as text: ${JSON.stringify(reason.slice(0, 120))}`);
        await shot('05-hostile-text');
    }

    // ---- compare two runs ----
    await until(`job ${idA} and ${idB} finished`, async () => ['succeeded', 'failed'].includes(await jobState(idA)) && ['succeeded', 'failed'].includes(await jobState(idB)), 60000, 250);
    await page.goto(`${URL_}/#/compare?ids=${idA},${idB}${idH ? `,${idH}` : ''}`);
    await page.waitForSelector('#compare-chart[data-series] .u-over', { timeout: 10000 });
    const cmp = await page.evaluate(() => ({ series: document.querySelector('#compare-chart').dataset.series, points: document.querySelector('#compare-chart').dataset.points, keys: [...document.querySelectorAll('#spec-diff tr.differs')].map((r) => r.dataset.key), imgs: document.querySelectorAll('main img').length }));
    check(cmp.series === String(idH ? 3 : 2) && cmp.keys.includes('train.optimizer.lr') && cmp.keys.includes('train.steps'), `compare overlays ${cmp.series} loss curves (points ${cmp.points}) and lists differing keys: ${cmp.keys.join(', ')}`);
    check(cmp.imgs === 0, 'the hostile data path in the spec diff is text');
    await shot('06-compare');

    // ---- a finished one-epoch job opened afterwards: what its page shows ----
    const epochSpec = `name: e2e-epoch\nmodel: {type: mlp, hidden: [16]}\ndata: {format: synthetic, train_size: 1024, test_size: 256, input_dim: 32, classes: 4}\ntrain: {epochs: 1, batch_size: 32, optimizer: {type: sgd, lr: 0.05}}\n`;
    const idE = (await api('POST', '/jobs', epochSpec, 'application/yaml')).body.id;
    await until(`job ${idE} succeeded`, async () => (await jobState(idE)) === 'succeeded', 30000, 250);
    await page.goto(`${URL_}/#/jobs/${idE}`);
    await page.waitForSelector('#incarnations tr[data-incarnation="1"]', { timeout: 10000 });
    await until('the charts of the finished job', () => page.evaluate((id) => window.__mge.jobs[id]?.loads.length > 0, String(idE)), 10000);
    await sleep(300);
    const fin = await page.evaluate((id) => {
        const rows = Object.fromEntries([...document.querySelectorAll('#job-info tr')].map((r) => [r.cells[0].textContent, r.cells[1].textContent]));
        const items = [...document.querySelectorAll('#timeline li')].map((li) => li.textContent);
        // the test-accuracy chart: pixels in its series colour (#dc2626) on the canvas
        const cv = document.querySelector('#chart-test_accuracy canvas');
        const px = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
        let red = 0;
        for (let i = 0; i < px.length; i += 4) if (px[i] > 180 && px[i + 1] < 90 && px[i + 2] < 90 && px[i + 3] > 200) red++;
        // the samples/s axis: its labels, and whether each fits the axis as drawn
        const u = window.__mge.jobs[id].plots.samples_per_sec;
        const ax = u.axes[1];
        const ctx = document.createElement('canvas').getContext('2d');
        ctx.font = ax.font ? (Array.isArray(ax.font) ? ax.font[0] : ax.font) : '12px system-ui';
        const labels = (ax._values || []).map(String);
        const widest = Math.max(0, ...labels.map((l) => ctx.measureText(l).width));
        return { plan: rows['memory plan'] || '', epoch: rows['latest epoch'], accPoints: window.__mge.jobs[id].loads[0].charts.test_accuracy.points, red, labels, widest, size: ax._size, last: items[items.length - 1] || '', items: items.length, inc: document.querySelector('#incarnations tbody')?.textContent || '' };
    }, String(idE));
    check(/^[0-9.]+ [KMG]i?B per rank at batch 32, everything kept .*MiB reserved per worker, placed as planned$/.test(fin.plan),
        `the job page shows the memory plan it was placed by: "${fin.plan}"`);
    check(/^1 @ step 32$/.test(fin.epoch || ''), `a job after one full epoch shows "latest epoch ${fin.epoch}" (1 @ step 32)`);
    check(fin.accPoints === 1 && fin.red > 20, `a test-accuracy series of ${fin.accPoints} point is drawn (${fin.red} pixels in its colour)`);
    check(fin.labels.length > 1 && fin.labels.every((l) => !l.includes(',') && l.length <= 6) && fin.widest + 8 <= fin.size,
        `the samples/s axis labels fit: ${fin.labels.join(' ')} (widest ${fin.widest.toFixed(0)} px in an axis of ${fin.size} px)`);
    check(/succeeded/.test(fin.last), `the events of a job that ended before the page opened end with its final state ("${fin.last.trim()}", ${fin.items} events)`);
    check(/^1w1 \(1\)0/.test(fin.inc.trim()), `the incarnations table lists incarnation 1 on w1 from step 0: ${fin.inc.trim().slice(0, 100)}`);
    await shot('06b-finished-epoch');

    // ---- workers page ----
    await page.goto(`${URL_}/#/workers`);
    await page.waitForSelector('tr[data-name="w1"]', { timeout: 10000 });
    ok('the workers page lists w1');
    await shot('07-workers');
    // a drained worker offers Undrain; clicking it puts the worker back to work
    await api('POST', '/workers/w1/drain');
    await page.waitForSelector('tr[data-name="w1"][data-state="drained"] button.undrain', { timeout: 10000 });
    await page.click('tr[data-name="w1"] button.undrain');
    await page.waitForSelector('tr[data-name="w1"][data-state="ready"]', { timeout: 10000 });
    const w1 = (await api('GET', '/workers')).body.workers.find((w) => w.name === 'w1');
    check(w1.state === 'ready' && w1.drain === false, `the Undrain button undrains w1 (state ${w1.state}, drain ${w1.drain})`);

    // ---- a job that needs all of w1's 4 CPUs waits behind a long one: its page says why and when
    const blocker = `name: e2e-blocker\nmodel: {type: mlp, hidden: [8]}\ndata: {format: synthetic, train_size: 1024, input_dim: 8, classes: 2}\ntrain: {steps: 400000, batch_size: 1, optimizer: {type: sgd, lr: 0.01}}\n`;
    const idBlock = (await api('POST', '/jobs', blocker, 'application/yaml')).body.id;
    await until(`job ${idBlock} running`, async () => (await jobState(idBlock)) === 'running', 20000, 100);
    // the page opens at once, before the blocker's speed is known: the reason it shows is
    // refreshed while the job waits, without reloading the page
    const waitSpec = `name: e2e-waits\nmodel: {type: mlp, hidden: [8]}\ndata: {format: synthetic, train_size: 64, input_dim: 8, classes: 2}\nresources: {cpus: 4}\ntrain: {steps: 5, batch_size: 8, optimizer: {type: sgd, lr: 0.01}}\n`;
    const idW = (await api('POST', '/jobs', waitSpec, 'application/yaml')).body.id;
    await page.goto(`${URL_}/#/jobs/${idW}`);
    await page.evaluate(() => { window.__samePage = true; });
    const pendingRe = /^needs 1 worker with 4 CPUs, [0-9]+ MiB, 0 free; (about [0-9]+ s \(job [0-9]+ ends\)|no estimate yet \(.*\))$/;
    let pending = '';
    const seen = new Set();
    try {
        await until('the pending reason with its estimate', async () => {
            const now = await page.evaluate(() => {
                const r = [...document.querySelectorAll('#job-info tr')].find((tr) => tr.cells[0].textContent === 'pending reason');
                return r ? r.cells[1].textContent : '';
            });
            if (now) { pending = now; seen.add(now.replace(/[0-9]+ s/, 'N s')); }
            return /about [0-9]+ s/.test(pending);
        }, 30000, 250);
    } catch (e) { /* checked below */ }
    console.log(`     pending reasons shown, in turn: ${[...seen].join(' | ')}`);
    check(pendingRe.test(pending) && /about [0-9]+ s/.test(pending) && await page.evaluate(() => window.__samePage === true),
        `the page's pending reason is refreshed while the job waits, to an estimate: "${pending}"`);
    await api('POST', `/jobs/${idW}/cancel`);
    await api('POST', `/jobs/${idBlock}/cancel`);
    await until(`job ${idBlock} cancelled`, async () => (await jobState(idBlock)) === 'cancelled', 20000, 100);

    // ---- a 100,000-step series: LTTB load, and all points drawn at once ----
    const tiny = `name: e2e-100k\nmodel: {type: mlp, hidden: [8]}\ndata: {format: synthetic, train_size: 1024, input_dim: 8, classes: 2}\ntrain: {steps: 100000, batch_size: 1, optimizer: {type: sgd, lr: 0.01}}\n`;
    const idK = (await api('POST', '/jobs', tiny, 'application/yaml')).body.id;
    const tk = Date.now();
    let kDone = true;
    try {
        await until('the 100,000-step job', async () => (await jobState(idK)) === 'succeeded', 40000, 500);
    } catch (e) { kDone = false; fail(e.message); }
    if (kDone) {
        const n = (await api('GET', `/jobs/${idK}/metrics?name=loss&max_points=3`)).body.total;
        ok(`100,000-step job done in ${((Date.now() - tk) / 1000).toFixed(1)} s, ${n} loss points stored`);
        await page.goto(`${URL_}/#/jobs/${idK}`);
        const ds = await until('the LTTB load', () => page.evaluate((id) => window.__mge.jobs[id]?.loads[0], String(idK)), 10000);
        results.lttb_load = ds;
        check(ds.total_ms <= 2000, `LTTB load of ${ds.total} rows -> ${ds.points} points: ${ds.total_ms.toFixed(0)} ms (fetch ${ds.fetch_ms.toFixed(0)} ms, draw ${ds.draw_ms.toFixed(1)} ms) (guard <= 2000 ms; ~0.8-1 s on this 2-core box)`);
        await shot('08-100k-lttb');
        await page.goto(`${URL_}/#/jobs/${idK}?points=all`);
        await page.reload();
        const all = await until('the full load', () => page.evaluate((id) => window.__mge.jobs[id]?.loads[0], String(idK)), 20000);
        // render of one 100,000-point chart, measured on its own
        const render = await page.evaluate(() => {
            const c = document.querySelector('#chart-loss');
            return new Promise((res) => requestAnimationFrame(() => res(c ? c.querySelectorAll('canvas').length : 0)));
        });
        results.full_load = all;
        const lc = all.charts.loss;
        check(render > 0 && lc.points >= 100000 && lc.draw_ms <= 200, `a ${lc.points}-point loss series rendered in ${lc.draw_ms.toFixed(1)} ms (<= 200 ms); fetch+parse of ${all.points} points ${all.fetch_ms.toFixed(0)} ms`);
        await shot('09-100k-all');
    }

    check(pageErrors.length === 0, `no page errors or dialogs${pageErrors.length ? `: ${pageErrors.join('; ')}` : ''}`);
    writeFileSync(join(ART, 'measurements.json'), JSON.stringify(results, null, 2));
    console.log(`measurements: ${JSON.stringify(results)}`);
}

try {
    await main();
} catch (e) {
    fail(e.stack || e.message);
}
if (browser) await browser.close().catch(() => {});
for (const p of procs) p.kill('SIGTERM');
await sleep(300);
for (const p of procs) p.kill('SIGKILL');
if (fails) {
    console.log(`--- logs kept in ${T}`);
    for (const f of ['coordinator.log', 'worker.log']) {
        try { console.log(`--- ${f}\n${readFileSync(join(T, f), 'utf8').split('\n').slice(-15).join('\n')}`); } catch { /* none */ }
    }
} else {
    rmSync(T, { recursive: true, force: true });
}
console.log(`${fails ? `${fails} failed` : 'all passed'} (${el()}; artifacts in ${ART})`);
process.exit(fails ? 1 : 0);

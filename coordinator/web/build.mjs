// build.mjs: bundle the dashboard (src/) with esbuild into OUTDIR (default ../../build/web),
// write a .gz beside every file (the coordinator sends it to gzip-capable clients) and print
// the first-load weight. Needs only what `npm ci` installed; no network.
import { build } from 'esbuild';
import { mkdirSync, readFileSync, writeFileSync, readdirSync, statSync, rmSync } from 'node:fs';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync, constants } from 'node:zlib';

const here = dirname(fileURLToPath(import.meta.url));
const out = process.argv[2] || join(here, '../../build/web');

rmSync(out, { recursive: true, force: true });
mkdirSync(join(out, 'assets'), { recursive: true });
await build({
    entryPoints: [join(here, 'src/app.js')],
    bundle: true,
    minify: true,
    format: 'esm',
    target: ['chrome100', 'firefox100', 'safari15'],
    outdir: join(out, 'assets'),
    entryNames: '[name]',
    legalComments: 'none',
    logLevel: 'warning',
});
writeFileSync(join(out, 'index.html'), readFileSync(join(here, 'src/index.html')));
// uPlot is MIT: its licence travels with the bundle
writeFileSync(join(out, 'assets/uPlot.LICENSE.txt'), readFileSync(join(here, 'node_modules/uplot/LICENSE')));

let raw = 0, gz = 0;
const walk = (d) => {
    for (const f of readdirSync(d)) {
        const p = join(d, f);
        if (statSync(p).isDirectory()) { walk(p); continue; }
        if (p.endsWith('.gz')) continue;
        const buf = readFileSync(p);
        const z = gzipSync(buf, { level: constants.Z_BEST_COMPRESSION });
        writeFileSync(p + '.gz', z);
        if (!p.endsWith('.txt')) { raw += buf.length; gz += z.length; }
    }
};
walk(out);
console.log(`  WEB     ${out}: first load ${(raw / 1024).toFixed(1)} KiB, ${(gz / 1024).toFixed(1)} KiB gzipped`);

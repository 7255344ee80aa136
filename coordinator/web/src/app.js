// app.js: the mge dashboard: token handling and the hash router (#/jobs, #/jobs/<id>,
// #/compare?ids=a,b, #/workers). Talks only to /api/v1 and its event streams.
import './style.css';
import { setHandlers, setToken, token, takeTokenFromHash, get } from './api.js';
import { h, clear } from './dom.js';
import { jobsPage } from './jobs.js';
import { jobPage } from './job.js';
import { comparePage } from './compare.js';
import { workersPage } from './workers.js';

const main = document.getElementById('main');
const conn = document.getElementById('conn');
let cleanup = () => {};

function loginPage(message) {
    cleanup();
    cleanup = () => {};
    const input = h('input#token', { type: 'password', autocomplete: 'current-password', size: 40, 'aria-label': 'API token' });
    clear(main).append(h('section.card.login', {},
        h('h2', {}, 'Sign in'),
        message ? h('p.error', {}, message) : null,
        h('form', {
            onsubmit: async (e) => {
                e.preventDefault();
                setToken(input.value.trim());
                route();
            },
        }, h('label', {}, 'API token ', input), ' ', h('button.primary', { type: 'submit' }, 'Sign in')),
        h('p.muted', {}, 'The token stays in this tab (sessionStorage) and is sent only in the Authorization header. For scripts: #/jobs/ID?token=T.')));
    input.focus();
}

function route() {
    takeTokenFromHash();
    cleanup();
    cleanup = () => {};
    document.getElementById('logout').hidden = !token();
    if (!token()) { loginPage(); return; }
    const hash = location.hash.replace(/^#/, '') || '/jobs';
    const [path, query] = hash.split('?');
    const params = new URLSearchParams(query || '');
    const parts = path.split('/').filter(Boolean);
    for (const a of document.querySelectorAll('[data-nav]')) a.classList.toggle('active', a.dataset.nav === parts[0]);
    if (parts[0] === 'jobs' && parts[1] && /^\d+$/.test(parts[1])) cleanup = jobPage(main, params, Number(parts[1]));
    else if (parts[0] === 'compare') cleanup = comparePage(main, params);
    else if (parts[0] === 'workers') cleanup = workersPage(main, params);
    else cleanup = jobsPage(main, params);
}

setHandlers((msg) => { setToken(''); loginPage(msg); }, (ok) => {
    conn.textContent = ok ? '' : 'coordinator unreachable, retrying…';
    conn.className = ok ? 'conn' : 'conn down';
});
document.getElementById('logout').addEventListener('click', () => { setToken(''); route(); });
window.addEventListener('hashchange', route);
route();
export { get };

// The gateway status page. Every string that comes from a request (keys, clients, ban reasons)
// goes into the page with textContent or as an attribute value, never as HTML.
'use strict';

const TOKEN_KEY = 'gateway-admin-token';
const REFRESH_MS = 2000;
const TOP_ROWS = 15;  // keys listed: the rest are in GET /status/activity
const SVG_NS = 'http://www.w3.org/2000/svg';
let timer = null;
let lastOk = 0;

const $ = (id) => document.getElementById(id);

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function token() { return sessionStorage.getItem(TOKEN_KEY); }

class Unauthorized extends Error {}

async function api(method, path, body) {
  const headers = { Authorization: 'Bearer ' + token() };
  const init = { method, headers, cache: 'no-store', credentials: 'omit' };
  if (method !== 'GET') {
    headers['Content-Type'] = 'application/json';  // the admin guard's rule for every change
    if (body !== undefined) init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  if (resp.status === 401) throw new Unauthorized();
  let data = null;
  try { data = await resp.json(); } catch (e) { data = null; }
  return { status: resp.status, data, headers: resp.headers };
}

// -- formatting ---------------------------------------------------------------------------------
function rate(n) { return n >= 100 ? n.toFixed(0) : n >= 10 ? n.toFixed(1) : n.toFixed(2); }

function ago(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return s + 's ago';
  if (s < 3600) return Math.floor(s / 60) + 'm ' + (s % 60) + 's ago';
  return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm ago';
}

function duration(s) {
  if (s < 60) return s + 's';
  if (s < 3600) return Math.floor(s / 60) + 'm ' + (s % 60) + 's';
  if (s < 86400) return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm';
  return Math.floor(s / 86400) + 'd ' + Math.floor((s % 86400) / 3600) + 'h';
}

function clock(ms) { return new Date(ms).toLocaleString(); }

function message(text, isError) {
  const m = $('message');
  m.textContent = text || '';
  m.className = isError ? 'error' : '';
}

function emptyRow(tbody, columns, text) {
  const tr = el('tr');
  const td = el('td', 'empty', text);
  td.colSpan = columns;
  tr.appendChild(td);
  tbody.appendChild(tr);
}

// -- rates over the 10 s buckets -----------------------------------------------------------------
// Per second over the last `seconds` (a multiple of the bucket): the current, partial bucket plus
// the part of the older ones that falls in the window, so a flood that began 5 s ago is not
// diluted by the quiet minute before it.
function windowSum(values, body, seconds) {
  const bucketS = body.bucket_s;
  const into = (body.now_ms / 1000) % bucketS;  // seconds of the current bucket elapsed
  const n = values.length;
  let total = values[n - 1] || 0;
  let left = seconds - into;
  for (let i = n - 2; i >= 0 && left > 0; i--) {
    const part = Math.min(1, left / bucketS);
    total += (values[i] || 0) * part;
    left -= bucketS;
  }
  return total;
}

function lastSeconds(values, body, seconds) { return windowSum(values, body, seconds) / seconds; }

// -- zones --------------------------------------------------------------------------------------
function bars(series, nowMs, bucketS) {
  const n = series.passed.length;
  const svg = document.createElementNS(SVG_NS, 'svg');
  svg.setAttribute('class', 'bars');
  svg.setAttribute('viewBox', `0 0 ${n * 10} 100`);
  svg.setAttribute('preserveAspectRatio', 'none');
  let peak = 1;
  for (let i = 0; i < n; i++) peak = Math.max(peak, series.passed[i] + series.delayed[i] + series.rejected[i]);
  for (let i = 0; i < n; i++) {
    let y = 100;
    for (const [name, cls] of [['passed', 'p'], ['delayed', 'd'], ['rejected', 'r']]) {
      const v = series[name][i];
      if (!v) continue;
      const h = Math.max(1.5, (v / peak) * 96);
      y -= h;
      const rect = document.createElementNS(SVG_NS, 'rect');
      rect.setAttribute('class', cls);
      rect.setAttribute('x', String(i * 10 + 1));
      rect.setAttribute('width', '8');
      rect.setAttribute('y', y.toFixed(2));
      rect.setAttribute('height', h.toFixed(2));
      svg.appendChild(rect);
    }
  }
  const title = document.createElementNS(SVG_NS, 'title');
  title.textContent = `peak ${peak} requests in ${bucketS} s`;
  svg.appendChild(title);
  return svg;
}

function renderZones(body) {
  const box = $('zones');
  box.replaceChildren();
  const names = Object.keys(body.zones).sort();
  if (!names.length) {
    box.appendChild(el('p', 'hint', 'No limited requests yet.'));
    return;
  }
  const bucketS = body.bucket_s;
  for (const name of names) {
    const series = body.zones[name];
    const card = el('div', 'zone');
    card.dataset.zone = name;
    card.appendChild(el('h3', null, name));
    const rates = el('div', 'rates');
    for (const [key, cls, label] of [['passed', 'pass', 'pass/s'], ['delayed', 'delay', 'delay/s'], ['rejected', 'reject', 'reject/s']]) {
      const recent = lastSeconds(series[key], body, 10);
      const minute = lastSeconds(series[key], body, 60);
      const box2 = el('div', 'rate ' + cls + (recent === 0 && minute === 0 ? ' zero' : ''));
      box2.dataset.kind = key;
      const now = el('span', 'n ten', rate(recent));
      now.title = 'last 10 s';
      box2.appendChild(now);
      const m = el('span', 'minute', rate(minute) + ' /1m');
      m.title = 'last minute';
      box2.appendChild(m);
      box2.appendChild(el('span', 'l', label));
      rates.appendChild(box2);
    }
    card.appendChild(rates);
    card.appendChild(bars(series, body.now_ms, bucketS));
    box.appendChild(card);
  }
}

// -- keys and bans ------------------------------------------------------------------------------
function renderKeys(body) {
  const tbody = $('keys');
  tbody.replaceChildren();
  if (!body.top_keys.length) return emptyRow(tbody, 6, 'No rejections in the last 10 minutes.');
  for (const item of body.top_keys.slice(0, TOP_ROWS)) {
    const tr = el('tr');
    tr.dataset.key = item.key;
    tr.appendChild(el('td', 'mono', item.zone));
    tr.appendChild(el('td', 'mono key', item.key));
    tr.appendChild(el('td', 'mono client', item.client));
    tr.appendChild(el('td', 'num count', item.count));
    tr.appendChild(el('td', null, ago(item.last_ms)));
    const cell = el('td');
    if (item.client) {
      const button = el('button', 'danger ban', 'Ban 1h');
      button.type = 'button';
      button.dataset.target = item.client;
      button.addEventListener('click', () => ban(item.client, `status page: limited by zone ${item.zone}`, false));
      cell.appendChild(button);
    }
    tr.appendChild(cell);
    tbody.appendChild(tr);
  }
}

function renderBans(list, total) {
  const tbody = $('bans');
  tbody.replaceChildren();
  $('bans-total').textContent = total > list.length ? `${list.length} of ${total} shown` : `${total} in force`;
  if (!list.length) return emptyRow(tbody, 5, 'No bans in force.');
  for (const b of list) {
    const tr = el('tr');
    tr.dataset.target = b.target;
    tr.appendChild(el('td', 'mono nowrap', b.target));
    tr.appendChild(el('td', 'reason', b.reason || '—'));
    const expires = el('td', 'nowrap', b.until_ms === 0 ? 'never' : 'in ' + duration(b.remaining_s));
    if (b.until_ms) expires.title = clock(b.until_ms);
    tr.appendChild(expires);
    tr.appendChild(el('td', null, b.by));
    const cell = el('td');
    const button = el('button', 'unban', 'Unban');
    button.type = 'button';
    button.dataset.target = b.target;
    button.addEventListener('click', () => unban(b.target));
    cell.appendChild(button);
    tr.appendChild(cell);
    tbody.appendChild(tr);
  }
}

// -- routes: is the app failing, or are we limiting? ------------------------------------------------
function renderRoutes(body) {
  const tbody = $('routes');
  tbody.replaceChildren();
  const routes = body.routes || {};
  const names = Object.keys(routes).sort();
  if (!names.length) return emptyRow(tbody, 6, 'No requests in the last 10 minutes.');
  for (const name of names) {
    const r = routes[name];
    const tr = el('tr');
    tr.dataset.route = name;
    tr.appendChild(el('td', 'mono', name === '' ? '(no route)' : name));
    tr.appendChild(el('td', 'num requests', rate(lastSeconds(r.requests, body, 10))));
    tr.appendChild(el('td', 'num', rate(lastSeconds(r.requests, body, 60))));
    const errors10 = lastSeconds(r.app_5xx, body, 10);
    const errors60 = lastSeconds(r.app_5xx, body, 60);
    tr.appendChild(el('td', 'num app5xx' + (errors10 > 0 ? ' bad' : ''), rate(errors10)));
    tr.appendChild(el('td', 'num' + (errors60 > 0 ? ' bad' : ''), rate(errors60)));
    const n = windowSum(r.upstream_n, body, 60);
    const ms = windowSum(r.upstream_ms, body, 60);
    tr.appendChild(el('td', 'num latency', n > 0 ? Math.round(ms / n) + ' ms' : '–'));
    tbody.appendChild(tr);
  }
}

function renderUpstreams(body) {
  const tbody = $('upstreams');
  tbody.replaceChildren();
  const names = Object.keys(body.upstreams || {}).sort();
  if (!names.length) return emptyRow(tbody, 5, 'No upstreams.');
  for (const name of names) {
    for (const s of body.upstreams[name]) {
      const tr = el('tr');
      tr.appendChild(el('td', 'mono', name));
      tr.appendChild(el('td', 'mono', s.server + (s.backup ? ' (backup)' : '')));
      // UP with fails: it failed lately (below max_fails, or its fail_timeout is over and it is retried).
      const state = s.down ? 'DOWN (config)' : !s.up ? 'DOWN' : s.fails ? 'UP · failing' : 'UP';
      tr.appendChild(el('td', !s.up ? 'down' : s.fails ? 'failing' : 'up', state));
      tr.appendChild(el('td', 'num', `${s.fails}/${s.max_fails}`));
      tr.appendChild(el('td', 'num', s.weight));
      tbody.appendChild(tr);
    }
  }
}

function renderHeader(body) {
  const circuit = $('circuit');
  if (body.redis_circuit === null || body.redis_circuit === undefined) {
    circuit.textContent = 'no Redis';
    circuit.className = 'pill';
  } else {
    circuit.textContent = body.redis_circuit.toUpperCase();
    circuit.className = 'pill ' + (body.redis_circuit === 'open' ? 'bad' : 'ok');
  }
  const cfg = body.config || {};
  $('config-hash').textContent = cfg.hash || '–';
  $('config-hash').title = cfg.path || '';
  const when = cfg.reloaded_ms || cfg.loaded_ms;
  let text = when ? `${clock(when)} (${ago(when)})` : '–';
  if (cfg.reloaded_ms) text = 'reload ' + text + (cfg.last_reload_ok === false ? ' FAILED' : '');
  $('config-time').textContent = text;
  $('config-time').className = cfg.last_reload_ok === false ? 'error' : '';
}

// -- actions ------------------------------------------------------------------------------------
async function guarded(work) {
  try {
    await work();
  } catch (e) {
    if (e instanceof Unauthorized) return askToken('The token was refused: enter it again.');
    message('The gateway did not answer: ' + e.message, true);
  }
}

function ban(target, reason, force) {
  return guarded(async () => {
    const r = await api('POST', '/bans', { target, for: '1h', reason, force });
    if (r.status === 201) {
      message(`Banned ${target} for 1h.`);
    } else if (r.status === 409 && !force) {
      message(`Not banned: ${r.data && r.data.reason}. `, true);
      const again = el('button', 'danger', 'Ban anyway');
      again.type = 'button';
      again.addEventListener('click', () => ban(target, reason, true));
      $('message').appendChild(again);
      return;
    } else {
      message(`Ban of ${target} failed: ${(r.data && r.data.error) || r.status}`, true);
    }
    await refresh();
  });
}

function unban(target) {
  return guarded(async () => {
    const r = await api('DELETE', '/bans/' + encodeURIComponent(target));
    if (r.status === 200) message(`Unbanned ${target}.`);
    else message(`Unban of ${target}: ${(r.data && r.data.error) || 'it was not banned'}`, r.status !== 404);
    await refresh();
  });
}

// -- the loop -----------------------------------------------------------------------------------
async function refresh() {
  const [activity, bans] = await Promise.all([api('GET', '/status/activity'), api('GET', '/bans?limit=100')]);
  if (activity.status !== 200) throw new Error((activity.data && activity.data.error) || 'HTTP ' + activity.status);
  const body = activity.data;
  renderHeader(body);
  renderZones(body);
  renderRoutes(body);
  renderKeys(body);
  if (bans.status === 200) renderBans(bans.data, Number(bans.headers.get('X-Total-Count') || bans.data.length));
  renderUpstreams(body);
  lastOk = Date.now();
  const live = $('live');
  live.textContent = 'live · ' + new Date(lastOk).toLocaleTimeString();
  live.className = 'pill ok';
}

async function tick() {
  timer = null;
  try {
    await refresh();
  } catch (e) {
    if (e instanceof Unauthorized) return askToken('The token was refused: enter it again.');
    const live = $('live');
    live.textContent = lastOk ? 'stale since ' + new Date(lastOk).toLocaleTimeString() : 'no answer';
    live.className = 'pill stale';
  }
  if (token()) timer = setTimeout(tick, REFRESH_MS);
}

function askToken(why) {
  if (timer !== null) clearTimeout(timer);
  timer = null;
  sessionStorage.removeItem(TOKEN_KEY);
  $('board').hidden = true;
  $('logout').hidden = true;
  $('login').hidden = false;
  $('login-error').textContent = why || '';
  $('live').textContent = 'not connected';
  $('live').className = 'pill';
  $('token').focus();
}

function start() {
  $('login').hidden = true;
  $('board').hidden = false;
  $('logout').hidden = false;
  tick();
}

document.addEventListener('DOMContentLoaded', () => {
  $('login').addEventListener('submit', (event) => {
    event.preventDefault();
    const value = $('token').value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    $('token').value = '';
    start();
  });
  $('logout').addEventListener('click', () => askToken(''));
  if (token()) start(); else askToken('');
});

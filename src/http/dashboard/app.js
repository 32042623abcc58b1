// cronoq dashboard: polls GET /v1/dashboard every second and redraws.
// Plain DOM, no dependencies; every value from the server is set as text
// (never parsed as HTML). The server pages and aggregates, so a redraw
// touches at most a few hundred rows whatever the installation's size.
"use strict";

(function () {
  const POLL_MS = 1000;
  const PAGE = 50;
  const TASKS = 25;

  const state = { filter: "", offset: 0, paused: false, inFlight: false, timer: null };

  const REASONS = {
    no_group_matches: "no worker carries these labels",
    groups_full: "every matching slot is busy",
    held_for_reservation: "free slots are held for a fixed-start task",
    backoff: "waiting out the retry backoff",
    scheduled: "fixed start in the future",
    quota: "its fairness key holds its quota of these slots",
    concurrency: "its concurrency key is at its limit",
  };

  // The busiest keys a pool shows (the snapshot lists up to 1,000).
  const KEY_ROWS = 20;

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      else if (key.startsWith("data-")) node.setAttribute(key, String(value));
      else node[key] = value;
    }
    for (const child of children.flat()) {
      if (child === undefined || child === null || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  const $ = (id) => document.getElementById(id);

  function labelText(labels, empty) {
    const keys = Object.keys(labels || {}).sort();
    if (keys.length === 0) return empty;
    return keys.map((k) => `${k}=${labels[k]}`).join(",");
  }

  function number(n) {
    return Number(n).toLocaleString("en-US");
  }

  function bar(busy, capacity) {
    const pct = capacity > 0 ? Math.min(100, (100 * busy) / capacity) : busy > 0 ? 100 : 0;
    const fill = el("span");
    fill.style.width = `${pct.toFixed(1)}%`;
    return el("div", { class: "bar", title: `${busy} of ${capacity} slots busy` }, fill);
  }

  function ago(now, then) {
    const s = Math.max(0, (now - then) / 1000);
    if (s < 60) return `${s.toFixed(1)} s ago`;
    if (s < 3600) return `${Math.floor(s / 60)} min ago`;
    return `${Math.floor(s / 3600)} h ago`;
  }

  function renderHeader(view) {
    const leader = view.leader
      ? `leader ${view.leader.id} · epoch ${view.leader.epoch}`
      : "embedded scheduler (no leader)";
    $("leader").textContent = leader;
    const health = $("health");
    health.textContent = view.health.ready ? "ready" : `not ready: ${view.health.detail}`;
    health.className = `badge ${view.health.ready ? "ok" : "bad"}`;
    health.title = view.health.detail;
    $("updated").textContent = `updated ${new Date(view.now).toLocaleTimeString()}` +
      (view.truncated ? " · lists cut to fit" : "");
  }

  function renderPool(pool) {
    const head = el("div", { class: "pool-head" },
      el("h3", {}, `pool ${pool.name}`),
      el("span", {}, `capacity ${number(pool.capacity)}`),
      el("span", {}, `busy ${number(pool.busy)}`),
      el("span", {}, `waiting ${number(pool.waiting)}`),
      pool.scheduled ? el("span", {}, `scheduled ${number(pool.scheduled)}`) : null,
      pool.reserved ? el("span", {}, `reserved ${number(pool.reserved)}`) : null,
      el("span", { class: "muted" },
        `desired ${number(pool.autoscale.desired)} [${number(pool.autoscale.min)}..${pool.autoscale.max >= 4294967295 ? "∞" : number(pool.autoscale.max)}]`),
      pool.deadline_missed ? el("span", { class: "badge warn" }, `${number(pool.deadline_missed)} deadlines missed`) : null,
    );
    const groups = el("table", { class: "groups" },
      el("thead", {}, el("tr", {},
        el("th", {}, "group"), el("th", {}, "busy / capacity"), el("th", { class: "num" }, "workers"))),
      el("tbody", {}, pool.groups.length === 0
        ? el("tr", {}, el("td", { colSpan: 3, class: "muted" }, "no capacity"))
        : pool.groups.map((g) => el("tr", {
            "data-pool": pool.name, "data-group": labelText(g.labels, ""), "data-busy": g.busy, "data-capacity": g.capacity,
          },
          el("td", { class: "labels" }, labelText(g.labels, "(unlabeled)")),
          el("td", {}, bar(g.busy, g.capacity), el("span", { class: "bar-text" }, `${number(g.busy)} / ${number(g.capacity)}`)),
          el("td", { class: "num" }, number(g.workers))))));
    const demand = el("table", { class: "demand" },
      el("thead", {}, el("tr", {},
        el("th", {}, "waiting for labels"), el("th", { class: "num" }, "tasks"), el("th", {}, "why"))),
      el("tbody", {}, pool.demand.length === 0
        ? el("tr", {}, el("td", { colSpan: 3, class: "muted" }, "nothing waits"))
        : pool.demand.map((d) => el("tr", { "data-pool": pool.name, "data-demand": labelText(d.labels, ""), "data-reason": d.reason || "" },
          el("td", { class: "labels" }, labelText(d.labels, "(any group)")),
          el("td", { class: "num" }, number(d.waiting)),
          el("td", { class: "why", title: d.reason || "" }, REASONS[d.reason] || d.reason || "")))));
    // SPEC §9: the busiest fairness and concurrency keys, when tasks name any.
    const fairness = (pool.fairness_keys || []).length === 0 ? null : el("table", { class: "keys fairness" },
      el("thead", {}, el("tr", {},
        el("th", {}, "fairness key"), el("th", { class: "num" }, "running"), el("th", { class: "num" }, "waiting"),
        el("th", { class: "num" }, "weight"), el("th", { class: "num" }, "share"), el("th", {}, "quota"))),
      el("tbody", {}, pool.fairness_keys.slice(0, KEY_ROWS).map((k) => el("tr", { "data-pool": pool.name, "data-fairness-key": k.key },
        el("td", { class: "labels" }, k.key),
        el("td", { class: "num" }, number(k.running)),
        el("td", { class: "num" }, number(k.waiting)),
        el("td", { class: "num" }, k.weight == null ? "per task" : number(k.weight)),
        el("td", { class: "num" }, `${(k.share_permille / 10).toFixed(1)} %`),
        el("td", {}, (k.quotas || []).map((q) => `${labelText(q.labels, "(pool)")}: ${number(q.held)} / ${number(q.max_running)}`).join(", "))))));
    const concurrency = (pool.concurrency_keys || []).length === 0 ? null : el("table", { class: "keys concurrency" },
      el("thead", {}, el("tr", {},
        el("th", {}, "concurrency key"), el("th", { class: "num" }, "running / limit"), el("th", { class: "num" }, "waiting"))),
      el("tbody", {}, pool.concurrency_keys.slice(0, KEY_ROWS).map((k) => el("tr", { "data-pool": pool.name, "data-concurrency-key": k.key },
        el("td", { class: "labels" }, k.key),
        el("td", { class: "num" }, k.limit == null ? number(k.running) : `${number(k.running)} / ${number(k.limit)}`),
        el("td", { class: "num" }, number(k.waiting))))));
    return el("div", { class: "pool", "data-pool": pool.name }, head, el("div", { class: "pool-grid" }, groups, demand),
      fairness || concurrency ? el("div", { class: "pool-grid" }, fairness || el("div"), concurrency || el("div")) : null);
  }

  function renderPools(view) {
    const pools = $("pools");
    if (view.pools.length === 0) {
      pools.replaceChildren(el("p", { class: "muted" }, "no pools yet: start a worker or submit a task"));
      return;
    }
    pools.replaceChildren(...view.pools.map(renderPool));
  }

  function renderWorkers(view) {
    const w = view.workers;
    $("workers-summary").textContent = w.total === 0
      ? (view.leader ? "none registered" : "(the embedded scheduler has no remote workers)")
      : `${number(w.total)} · ${number(w.busy)} of ${number(w.slots)} slots busy · ${number(w.full)} full · ${number(w.draining)} draining`;
    const first = w.rows.length ? w.offset + 1 : 0;
    $("workers-page").textContent = `${number(first)}–${number(w.offset + w.rows.length)} of ${number(w.matching)}` +
      (state.filter ? " matching" : "");
    $("workers-prev").disabled = w.offset === 0;
    $("workers-next").disabled = w.offset + w.rows.length >= w.matching;
    const body = $("workers").tBodies[0];
    body.replaceChildren(...w.rows.map((r) => el("tr", { "data-worker": r.id, "data-busy": r.busy },
      el("td", {}, el("code", {}, r.id)),
      el("td", {}, r.pool),
      el("td", { class: "labels" }, labelText(r.labels, "(unlabeled)")),
      el("td", { class: "num" }, number(r.slots)),
      el("td", {}, bar(r.busy, r.draining ? r.busy : r.slots), el("span", { class: "bar-text" }, `${number(r.busy)} busy`)),
      el("td", {}, ago(view.now, r.last_seen)),
      el("td", {}, r.draining ? el("span", { class: "badge draining" }, "draining") : "active"))));
  }

  function when(now, at) {
    const d = new Date(at);
    const s = (at - now) / 1000;
    const rel = s >= 0
      ? (s < 60 ? `in ${s.toFixed(0)} s` : s < 3600 ? `in ${Math.floor(s / 60)} min` : `in ${Math.floor(s / 3600)} h`)
      : ago(now, at);
    return `${d.toISOString().replace(".000Z", "Z")} (${rel})`;
  }

  function cadence(s) {
    if (s.cron) return `cron ${s.cron}${s.tz && s.tz !== "UTC" ? ` (${s.tz})` : ""}`;
    if (s.every) return `every ${s.every}`;
    return "";
  }

  function renderLastRun(last) {
    if (!last) return el("span", { class: "muted" }, "never");
    const parts = [new Date(last.tick).toISOString().replace(".000Z", "Z")];
    if (last.task !== undefined && last.task !== null) parts.push(`task ${last.task}`);
    const outcome = last.error ? "refused" : (last.outcome || "running");
    return el("span", {},
      `${parts.join(" → ")} · `,
      el("span", { class: `badge state-${last.error ? "failed" : outcome}` }, outcome),
      last.kind && last.kind !== "tick" ? el("span", { class: "muted" }, ` (${last.kind})`) : null,
      last.error ? el("div", { class: "error" }, last.error) : null);
  }

  function renderSchedules(view) {
    const s = view.schedules || { total: 0, paused: 0, rows: [] };
    const err = $("schedules-error");
    err.hidden = !s.error;
    err.textContent = s.error ? `schedules unavailable: ${s.error}` : "";
    $("schedules-summary").textContent = s.total === 0 ? "" :
      `${number(s.total)} · ${number(s.paused)} paused` +
      (s.rows.length < s.total ? ` · the next ${number(s.rows.length)} to fire shown` : "");
    const body = $("schedules").tBodies[0];
    if (s.rows.length === 0) {
      body.replaceChildren(el("tr", {}, el("td", { colSpan: 7, class: "muted" },
        s.error ? "—" : "no schedules: cronoq schedule create NAME --every 1m …")));
      return;
    }
    body.replaceChildren(...s.rows.map((r) => el("tr", {
      "data-schedule": r.name, "data-paused": String(r.paused),
      "data-last-outcome": r.last ? (r.last.error ? "refused" : (r.last.outcome || "running")) : "",
      "data-last-task": r.last && r.last.task != null ? r.last.task : "",
    },
      el("td", {}, el("code", {}, r.name)),
      el("td", { class: "labels" }, cadence(r)),
      el("td", {}, r.pool),
      el("td", { class: "next-fire" }, r.next_fire != null ? when(view.now, r.next_fire) : el("span", { class: "muted" }, "—")),
      el("td", { class: "last-run" }, renderLastRun(r.last)),
      el("td", { class: "num" }, `${number(r.counters.fires)} · ${number(r.counters.skipped)} · ${number(r.counters.missed)}`),
      el("td", {}, r.paused ? el("span", { class: "badge warn" }, "paused") : "active"))));
  }

  function renderAttempt(a) {
    const parts = [`#${a.attempt}`, labelText(a.group, "(unlabeled)")];
    if (a.worker) parts.push(a.worker);
    parts.push(a.outcome || "running");
    return el("span", { class: "attempt" }, parts.join(" · "));
  }

  function renderTasks(view) {
    const body = $("tasks").tBodies[0];
    const tasks = view.tasks;
    if (tasks.length === 0) {
      body.replaceChildren(el("tr", {}, el("td", { colSpan: 5, class: "muted" }, "no tasks yet")));
    } else {
      body.replaceChildren(...tasks.map((t) => el("tr", { "data-task": t.id, "data-state": t.state },
        el("td", { class: "num" }, el("code", {}, t.id)),
        el("td", {}, t.pool),
        el("td", {},
          el("span", { class: `badge state-${t.state}` }, t.state),
          t.reason ? el("div", { class: "why", title: t.reason }, REASONS[t.reason] || t.reason) : null,
          t.deadline_missed ? el("div", { class: "why" }, "deadline missed") : null),
        el("td", {}, t.attempts.length ? t.attempts.map(renderAttempt) : el("span", { class: "muted" }, "not started")),
        el("td", { class: "error" }, t.error || ""))));
    }
    const err = $("tasks-error");
    err.hidden = !view.tasks_error;
    err.textContent = view.tasks_error ? `tasks unavailable: ${view.tasks_error}` : "";
  }

  function render(view) {
    renderHeader(view);
    renderPools(view);
    renderSchedules(view);
    renderWorkers(view);
    renderTasks(view);
  }

  function query() {
    const q = new URLSearchParams({ workers: String(PAGE), tasks: String(TASKS), offset: String(state.offset) });
    if (state.filter) q.set("filter", state.filter);
    return `/v1/dashboard?${q}`;
  }

  async function errorText(response) {
    try {
      const body = await response.json();
      return `${body.message} [${body.code}]`;
    } catch (_) {
      return `HTTP ${response.status}`;
    }
  }

  // The Bearer token of a server that requires credentials: kept in
  // sessionStorage (this tab only, gone when it closes), sent only to this
  // origin's /v1 API, never shown or logged.
  const TOKEN_KEY = "cronoq.token";
  function storedToken() {
    try {
      return sessionStorage.getItem(TOKEN_KEY) || "";
    } catch (_) {
      return "";
    }
  }
  function headers(extra) {
    const h = Object.assign({ Accept: "application/json" }, extra || {});
    const token = storedToken();
    if (token) h.Authorization = `Bearer ${token}`;
    return h;
  }
  function showTokenState() {
    const set = storedToken() !== "";
    $("token-state").textContent = set ? "token set" : "no token";
    $("token-clear").hidden = !set;
  }

  async function poll() {
    if (state.inFlight) return;
    state.inFlight = true;
    try {
      const response = await fetch(query(), { headers: headers(), cache: "no-store" });
      if (response.ok) {
        render(await response.json());
      } else {
        showOffline(await errorText(response));
      }
    } catch (e) {
      showOffline(`no answer (${e.message})`);
    } finally {
      state.inFlight = false;
      schedule();
    }
  }

  function showOffline(why) {
    const health = $("health");
    health.textContent = `disconnected: ${why}`;
    health.className = "badge bad";
  }

  function schedule() {
    clearTimeout(state.timer);
    if (!state.paused) state.timer = setTimeout(poll, POLL_MS);
  }

  function refreshNow() {
    clearTimeout(state.timer);
    poll();
  }

  function parseLabels(text) {
    const labels = {};
    for (const item of text.split(",").map((s) => s.trim()).filter(Boolean)) {
      const at = item.indexOf("=");
      if (at <= 0) throw new Error(`label ${JSON.stringify(item)} is not name=value`);
      labels[item.slice(0, at)] = item.slice(at + 1);
    }
    return labels;
  }

  async function submit(event) {
    event.preventDefault();
    const form = event.target;
    const result = $("submit-result");
    try {
      const body = {
        pool: form.pool.value.trim() || "default",
        labels: parseLabels(form.labels.value),
        payload: form.payload.value,
      };
      const response = await fetch("/v1/tasks", {
        method: "POST",
        headers: headers({ "Content-Type": "application/json" }),
        body: JSON.stringify(body),
      });
      if (response.ok) {
        const { id } = await response.json();
        result.textContent = `task ${id} submitted`;
        result.className = "";
        result.dataset.task = id;
        refreshNow();
      } else {
        result.textContent = `refused: ${await errorText(response)}`;
        result.className = "error";
      }
    } catch (e) {
      result.textContent = `not submitted: ${e.message}`;
      result.className = "error";
    }
  }

  let filterTimer = null;
  $("worker-filter").addEventListener("input", (event) => {
    clearTimeout(filterTimer);
    filterTimer = setTimeout(() => {
      state.filter = event.target.value.trim();
      state.offset = 0;
      refreshNow();
    }, 250);
  });
  $("workers-prev").addEventListener("click", () => {
    state.offset = Math.max(0, state.offset - PAGE);
    refreshNow();
  });
  $("workers-next").addEventListener("click", () => {
    state.offset += PAGE;
    refreshNow();
  });
  $("pause").addEventListener("click", (event) => {
    state.paused = !state.paused;
    event.target.textContent = state.paused ? "resume" : "pause";
    if (state.paused) clearTimeout(state.timer);
    else refreshNow();
  });
  $("submit").addEventListener("submit", submit);
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = event.target.token;
    const token = input.value.trim();
    input.value = "";
    try {
      if (token) sessionStorage.setItem(TOKEN_KEY, token);
      else sessionStorage.removeItem(TOKEN_KEY);
    } catch (_) {
      // No storage (a private window's policy): nothing to keep it in.
    }
    showTokenState();
    refreshNow();
  });
  $("token-clear").addEventListener("click", () => {
    try {
      sessionStorage.removeItem(TOKEN_KEY);
    } catch (_) {}
    showTokenState();
    refreshNow();
  });
  showTokenState();

  poll();
})();

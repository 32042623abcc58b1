// The dashboard in a real browser: Debian's chromium, headless, driven by
// playwright-core, against a real nats-server, `cronoq server` and two
// `cronoq worker` processes (one labeled gpu=a100). The page must show the
// leader, the groups and workers; a labeled task submitted from the page's
// form must show its group busy and the task running, then succeeded; a
// task for labels nobody has must show why it waits. Any JavaScript error
// or console error on the page fails the test.
//
// Nothing waits on the clock: the gpu job holds its slot until the test
// creates a file, and every check polls the page with a deadline.
//
// A second test runs `cronoq dev --embedded` with two schedules: the
// schedules panel must list them with their cadence, next fire, last run
// (tick → task · outcome) and paused state.
//
// Run by scripts/test after the Rust tests (they build the binary):
//   (cd tests/dashboard && npm ci && node --test)
// Env: CRONOQ_BIN (default ../../target/debug/cronoq, or
// $CARGO_TARGET_DIR/debug/cronoq), NATS_SERVER (default nats-server on
// PATH), CHROMIUM (default /usr/bin/chromium), DASHBOARD_SCREENSHOT (a path
// to save a screenshot of the page under load, e.g. docs/dashboard.png).

import { test, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "..", "..");
const targetDir = process.env.CARGO_TARGET_DIR || path.join(repo, "target");
const CRONOQ = process.env.CRONOQ_BIN || path.join(targetDir, "debug", "cronoq");
const NATS = process.env.NATS_SERVER || "nats-server";
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const DEADLINE_MS = 30_000;

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cronoq-dashboard-"));
const children = [];
let context = null;

after(async () => {
  if (context) await context.close().catch(() => {});
  // Workers before the server, the server before NATS.
  for (const child of children.reverse()) await stop(child);
  if (!process.env.TEST_KEEP_DIRS) fs.rmSync(dir, { recursive: true, force: true });
});

function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

function start(name, command, args, env = {}) {
  const log = fs.openSync(path.join(dir, `${name}.log`), "a");
  const child = spawn(command, args, {
    stdio: ["ignore", log, log],
    env: { ...process.env, CRONOQ_LOG: "info,cronoq=debug,async_nats=warn", ...env },
  });
  child.name = name;
  child.on("error", (e) => { child.failed = e; });
  children.push(child);
  return child;
}

function logTail(name) {
  try {
    return fs.readFileSync(path.join(dir, `${name}.log`), "utf8").split("\n").slice(-20).join("\n");
  } catch {
    return "(no log)";
  }
}

async function stop(child) {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
  await exited;
  clearTimeout(timer);
}

/** Polls `check` (which returns a value or throws) until it succeeds. */
async function eventually(what, check) {
  const until = Date.now() + DEADLINE_MS;
  let last = "";
  for (;;) {
    try {
      return await check();
    } catch (e) {
      last = e.message;
    }
    for (const child of children) {
      if (child.failed || (child.exitCode !== null && child.exitCode !== 0)) {
        throw new Error(`${child.name} exited while waiting for ${what}:\n${logTail(child.name)}`);
      }
    }
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}: ${last}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function json(url, init) {
  const response = await fetch(url, init);
  const body = await response.json();
  if (!response.ok) throw new Error(`${url}: ${JSON.stringify(body)}`);
  return body;
}

/** A chromium page that records page errors, console errors and failed
 * requests in `page.problems`. */
async function openPage() {
  if (!context) {
    const profile = fs.mkdtempSync(path.join(dir, "chromium-"));
    context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      viewport: { width: 1360, height: 1000 },
      args: [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
      ],
    });
  }
  const page = context.pages().find((p) => p.url() === "about:blank") || await context.newPage();
  const problems = [];
  page.problems = problems;
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("console", (m) => { if (m.type() === "error") problems.push(`console error: ${m.text()}`); });
  page.on("requestfailed", (r) => problems.push(`request failed: ${r.url()} ${r.failure()?.errorText}`));
  page.setDefaultTimeout(DEADLINE_MS);
  return page;
}

test("the dashboard shows a labeled task make its group busy, then its outcome", async () => {
  assert.ok(fs.existsSync(CRONOQ), `no cronoq binary at ${CRONOQ}: run cargo build first`);
  assert.ok(fs.existsSync(CHROMIUM), `no chromium at ${CHROMIUM}: apt-get install -y chromium`);

  // nats-server with JetStream on a free port.
  const natsPort = await freePort();
  start("nats", NATS, ["-js", "-a", "127.0.0.1", "-p", String(natsPort), "--store_dir", path.join(dir, "store")]);
  const natsUrl = `nats://127.0.0.1:${natsPort}`;
  await eventually("nats-server to listen", () => new Promise((resolve, reject) => {
    const socket = net.connect(natsPort, "127.0.0.1", () => { socket.end(); resolve(); });
    socket.once("error", reject);
  }));

  // A cronoq server with the HTTP API on a free port.
  const httpPort = await freePort();
  const base = `http://127.0.0.1:${httpPort}`;
  const config = path.join(dir, "cronoq.toml");
  fs.writeFileSync(config, '[server]\nworker_timeout = "5s"\n');
  start("server", CRONOQ, ["server", "--config", config, "--nats", natsUrl, "--http", `127.0.0.1:${httpPort}`, "--id", "dash-server"]);
  await eventually("the server to lead", async () => {
    const snap = await json(`${base}/v1/snapshot`);
    assert.equal(snap.leader?.id, "dash-server");
  });

  // Workers: unlabeled (echoes its payload) and gpu=a100 (holds its slot
  // until the file `release-<payload>` exists, then says where it ran).
  const hold = 'p=$(cat); while [ ! -e "$TEST_DIR/release-$p" ]; do sleep 0.05; done; echo "$p done on $CRONOQ_GROUP"';
  start("worker-cpu", CRONOQ, ["worker", "--nats", natsUrl, "--pool", "default", "--id", "cpu-1", "--slots", "2", "--", "sh", "-c", hold], { TEST_DIR: dir });
  start("worker-gpu", CRONOQ, ["worker", "--nats", natsUrl, "--pool", "default", "--id", "gpu-1", "--label", "gpu=a100", "--slots", "2", "--", "sh", "-c", hold], { TEST_DIR: dir });
  await eventually("both workers to register", async () => {
    const snap = await json(`${base}/v1/snapshot`);
    assert.deepEqual(snap.workers.map((w) => w.id).sort(), ["cpu-1", "gpu-1"]);
  });

  // The browser.
  const page = await openPage();

  await page.goto(`${base}/`);
  await page.waitForFunction(() => document.getElementById("leader").textContent.includes("leader dash-server"));
  const gpuGroup = '#pools tr[data-group="gpu=a100"]';
  await page.waitForSelector(`${gpuGroup}[data-capacity="2"][data-busy="0"]`);
  await page.waitForSelector('#workers tr[data-worker="gpu-1"]');
  await page.waitForSelector('#workers tr[data-worker="cpu-1"]');
  assert.match(await page.textContent("#health"), /ready/);

  // Submit a labeled task from the page's form.
  await page.fill('#submit input[name="labels"]', "gpu=a100");
  await page.fill('#submit input[name="payload"]', "train");
  await page.click('#submit button[type="submit"]');
  await page.waitForSelector("#submit-result[data-task]");
  const id = await page.getAttribute("#submit-result", "data-task");
  assert.match(await page.textContent("#submit-result"), new RegExp(`task ${id} submitted`));

  // Busy changes, and the task shows running on the gpu group and worker.
  await page.waitForSelector(`${gpuGroup}[data-busy="1"]`);
  await page.waitForSelector('#workers tr[data-worker="gpu-1"][data-busy="1"]');
  const taskRow = `#tasks tr[data-task="${id}"]`;
  await page.waitForSelector(`${taskRow}[data-state="running"]`);
  assert.match(await page.textContent(taskRow), /#1 · gpu=a100 · gpu-1 · running/);

  // A task for labels nobody has waits, and the page says why.
  await json(`${base}/v1/tasks`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ labels: { gpu: "h100" }, payload: "nobody" }) });
  const h100 = '#pools tr[data-demand="gpu=h100"]';
  await page.waitForSelector(`${h100}[data-reason="no_group_matches"]`);
  assert.match(await page.textContent(h100), /no worker carries these labels/);

  // Some load for the screenshot: every slot busy and a queue behind them.
  for (const [labels, payload] of [[{}, "etl-1"], [{}, "etl-2"], [{}, "etl-3"], [{ gpu: "a100" }, "train-2"], [{ gpu: "a100" }, "train-3"]]) {
    await json(`${base}/v1/tasks`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ labels, payload }) });
  }
  await page.waitForSelector(`${gpuGroup}[data-busy="2"]`);
  await page.waitForSelector('#pools tr[data-group=""][data-busy="2"]');
  await page.waitForSelector('#pools tr[data-demand="gpu=a100"][data-reason="groups_full"]');
  if (process.env.DASHBOARD_SCREENSHOT) {
    await page.screenshot({ path: process.env.DASHBOARD_SCREENSHOT, fullPage: true });
  }

  // Release the first job: it succeeds, and the page shows the outcome.
  fs.writeFileSync(path.join(dir, "release-train"), "");
  await page.waitForSelector(`${taskRow}[data-state="succeeded"]`);
  assert.match(await page.textContent(taskRow), /#1 · gpu=a100 · gpu-1 · succeeded/);
  const task = await json(`${base}/v1/tasks/${id}`);
  assert.equal(task.state, "succeeded");
  assert.equal(task.output, "train done on gpu=a100\n");

  // The worker filter narrows the table.
  await page.fill("#worker-filter", "gpu=a100");
  await page.waitForFunction(() => document.querySelectorAll("#workers tbody tr").length === 1);
  assert.match(await page.textContent("#workers-page"), /1–1 of 1 matching/);

  for (const name of ["etl-1", "etl-2", "etl-3", "train-2", "train-3"]) {
    fs.writeFileSync(path.join(dir, `release-${name}`), "");
  }
  assert.deepEqual(page.problems, [], "the page logged errors");
});

test("the dashboard lists schedules with cadence, next fire, last outcome and paused", async () => {
  assert.ok(fs.existsSync(CRONOQ), `no cronoq binary at ${CRONOQ}: run cargo build first`);
  assert.ok(fs.existsSync(CHROMIUM), `no chromium at ${CHROMIUM}: apt-get install -y chromium`);

  // The embedded scheduler behind the same HTTP API; its demo workers
  // answer after 10 ms.
  const httpPort = await freePort();
  const base = `http://127.0.0.1:${httpPort}`;
  start("dev", CRONOQ, ["dev", "--embedded", "--work", "10ms", "--http", `127.0.0.1:${httpPort}`]);
  await eventually("cronoq dev to answer", () => json(`${base}/v1/snapshot`));

  const post = (body) => json(`${base}/v1/schedules`, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  await post({ name: "beat", every: "1s", overlap: "skip", task: { pool: "default", payload: "tick" } });
  await post({ name: "nightly", cron: "30 2 * * *", tz: "Europe/Berlin", paused: true, task: { pool: "default", labels: { gpu: "a100" } } });

  const page = await openPage();
  await page.goto(`${base}/`);
  const beat = '#schedules tr[data-schedule="beat"]';
  const nightly = '#schedules tr[data-schedule="nightly"]';
  await page.waitForSelector(`${beat}[data-paused="false"]`);
  await page.waitForSelector(`${nightly}[data-paused="true"]`);
  assert.match(await page.textContent(`${beat} td.labels`), /every 1s/);
  assert.match(await page.textContent(`${nightly} td.labels`), /cron 30 2 \* \* \* \(Europe\/Berlin\)/);
  assert.match(await page.textContent(nightly), /paused/);
  assert.match(await page.textContent(`${nightly} td.next-fire`), /—/);
  assert.match(await page.textContent(`${beat} td.next-fire`), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(in \d+ s\)$/);
  assert.match(await page.textContent("#schedules-summary"), /2 · 1 paused/);

  // A tick fires and its run succeeds: the row shows tick → task · outcome,
  // and that task is the schedule's.
  await page.waitForSelector(`${beat}[data-last-outcome="succeeded"]`);
  const task = await page.getAttribute(beat, "data-last-task");
  assert.match(await page.textContent(`${beat} td.last-run`), new RegExp(`Z → task ${task} · succeeded`));
  const info = await json(`${base}/v1/schedules/beat`);
  assert.ok(info.history.some((f) => String(f.task) === task && f.outcome === "succeeded"), JSON.stringify(info.history));

  // Paused from the API: the page follows.
  await json(`${base}/v1/schedules/beat/pause`, { method: "POST" });
  await page.waitForSelector(`${beat}[data-paused="true"]`);
  assert.match(await page.textContent("#schedules-summary"), /2 · 2 paused/);
  assert.deepEqual(page.problems, [], "the page logged errors");
});

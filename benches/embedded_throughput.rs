//! End-to-end throughput of the embedded `Scheduler` against plain tokio.
//!
//! cronoq: 1,000,000 no-op tasks over 8 label groups of 8 slots each (64 in
//! all); 90% of tasks require one group's label (round robin), 10% require
//! nothing. All are submitted from one task, then every handle is awaited.
//! Baseline: 1,000,000 `tokio::spawn`ed tasks, each taking a permit of a
//! 64-permit `tokio::sync::Semaphore`, doing nothing and releasing it; all
//! spawned, then every `JoinHandle` awaited. Both run on one multi-threaded
//! runtime with the default worker count, alternating, several rounds;
//! medians of tasks/s are compared.
//!
//! With free slots, `submit` polls each attempt it starts once (eager
//! start), so these no-op tasks mostly finish inside `submit`. A second
//! figure, "queued", measures the other path: every task is submitted
//! while the pool has no slots, then the slots open and tokio tasks run
//! attempt after attempt; the clock starts when the slots open.
//!
//! Beside each rate it prints the process's CPU time per task (all
//! threads, `CLOCK_PROCESS_CPUTIME_ID`, over the same window): on a shared
//! machine other tenants' load moves the rates, much less the CPU per task.
//!
//! Not a timed test: it prints figures and PASS/FAIL and never fails.
//! `cargo bench --bench embedded_throughput`; `CRONOQ_BENCH_TASKS=100000`
//! for a quick run, `CRONOQ_BENCH_ROUNDS` for more or fewer rounds,
//! `CRONOQ_BENCH_ONLY=cronoq` (or `queued`, `baseline`) to run one side
//! under a profiler, `CRONOQ_BENCH_ONLY=core` for the same shape on the
//! bare core, `CRONOQ_BENCH_PHASES=1` to print how long submitting took.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{env_count, median};
use cronoq::{Labels, Scheduler, Task};
use tokio::sync::Semaphore;

const GROUPS: usize = 8;
const SLOTS_PER_GROUP: u32 = 8;
/// Embedded (eager start) against the baseline (issue 22: 0.9).
const TARGET_RATIO: f64 = 0.9;
/// The queued path against the baseline (issue 22: 0.7).
const QUEUED_TARGET_RATIO: f64 = 0.7;

/// A measured window: wall time and the whole process's CPU time.
#[derive(Clone, Copy)]
struct Window {
    wall: Duration,
    cpu: Duration,
}

impl Window {
    fn rate(&self, n: usize) -> f64 {
        n as f64 / self.wall.as_secs_f64()
    }

    /// CPU µs per task.
    fn cpu_us(&self, n: usize) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / n as f64
    }
}

/// A stopwatch over wall time and the process's CPU time (every thread).
struct Watch {
    wall: Instant,
    cpu: Duration,
}

impl Watch {
    fn start() -> Watch {
        Watch {
            cpu: process_cpu(),
            wall: Instant::now(),
        }
    }

    fn stop(&self) -> Window {
        Window {
            wall: self.wall.elapsed(),
            cpu: process_cpu().saturating_sub(self.cpu),
        }
    }
}

/// CPU time of the whole process so far (zero where there is no such clock).
fn process_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

async fn baseline(n: usize) -> Window {
    let permits = Arc::new(Semaphore::new(GROUPS * SLOTS_PER_GROUP as usize));
    let start = Watch::start();
    let mut handles = Vec::with_capacity(n);
    for _ in 0..n {
        let permits = permits.clone();
        handles.push(tokio::spawn(async move {
            let _permit = permits.acquire().await.expect("semaphore open");
        }));
    }
    for handle in handles {
        handle.await.expect("no-op task");
    }
    start.stop()
}

/// One task per shape: unlabeled, or requiring group `i`'s label.
fn templates() -> (Vec<Labels>, Vec<Task>) {
    let groups: Vec<Labels> = (0..GROUPS)
        .map(|i| Labels::from([("kind", format!("k{i}"))]))
        .collect();
    let mut tasks = vec![Task::new(Bytes::new()).pool("bench")];
    tasks.extend(
        groups
            .iter()
            .map(|labels| Task::new(Bytes::new()).pool("bench").labels(labels)),
    );
    (groups, tasks)
}

async fn cronoq(n: usize) -> Window {
    run_cronoq(n, false).await
}

async fn cronoq_queued(n: usize) -> Window {
    run_cronoq(n, true).await
}

async fn run_cronoq(n: usize, queued: bool) -> Window {
    let sched = Scheduler::new();
    let (groups, tasks) = templates();
    let slots = if queued { 0 } else { SLOTS_PER_GROUP };
    for labels in &groups {
        sched
            .set_group_capacity("bench", labels.clone(), slots)
            .expect("capacity accepted");
    }
    sched
        .executor("bench", |_, _| async { Ok(Bytes::new()) })
        .expect("executor accepted");
    let mut start = Watch::start();
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        // 1 in 10 unlabeled, the rest round robin over the groups.
        let task = if i % 10 == 0 {
            &tasks[0]
        } else {
            &tasks[1 + i % GROUPS]
        };
        handles.push(sched.submit(task.clone()).await.expect("submit accepted"));
    }
    if std::env::var("CRONOQ_BENCH_PHASES").is_ok() {
        eprintln!("submitted in {:?}", start.stop().wall);
    }
    if queued {
        start = Watch::start();
        for labels in groups {
            sched
                .set_group_capacity("bench", labels, SLOTS_PER_GROUP)
                .expect("capacity accepted");
        }
    }
    for handle in handles {
        let outcome = handle.wait().await.expect("task finished");
        debug_assert!(outcome.is_success());
    }
    start.stop()
}

/// The same shape on the bare core, one thread, no executors: submit every
/// task, then end attempts until none runs. Prints ns per task: what the
/// shell adds is the rest of the end-to-end cost.
fn bare_core(n: usize, rounds: usize) {
    use cronoq::core::{Action, AttemptOutcome, Core, Event, Millis, PoolName, TaskId, TaskSpec};
    let pool = PoolName::new("bench").expect("valid pool");
    let (groups, _) = templates();
    let mut core = Core::new();
    let mut out = Vec::new();
    for labels in &groups {
        let event = Event::CapacitySet {
            pool: pool.clone(),
            labels: labels.clone(),
            slots: SLOTS_PER_GROUP,
        };
        core.handle_into(Millis(0), event, &mut out)
            .expect("capacity accepted");
    }
    out.clear();
    let mut next_id = 1;
    for _ in 0..rounds {
        let start = Instant::now();
        let mut running = Vec::new();
        let collect = |out: &mut Vec<Action>, running: &mut Vec<(TaskId, u32)>| {
            for action in out.drain(..) {
                if let Action::Start { task, attempt, .. } = action {
                    running.push((task, attempt));
                }
            }
        };
        for i in 0..n {
            let mut spec = TaskSpec::new(TaskId(next_id), pool.clone());
            next_id += 1;
            if i % 10 != 0 {
                spec.required = groups[i % GROUPS].clone();
            }
            core.handle_into(Millis(0), Event::Submitted(spec), &mut out)
                .expect("submit accepted");
            collect(&mut out, &mut running);
        }
        let submitted = start.elapsed();
        while let Some((task, attempt)) = running.pop() {
            let event = Event::AttemptEnded {
                task,
                attempt,
                outcome: AttemptOutcome::Succeeded,
            };
            core.handle_into(Millis(0), event, &mut out)
                .expect("outcome accepted");
            collect(&mut out, &mut running);
        }
        let per_task = |d: Duration| d.as_nanos() as f64 / n as f64;
        println!(
            "core: {:.0} ns per task ({:.0} ns of it submitting)",
            per_task(start.elapsed()),
            per_task(submitted)
        );
    }
}

/// Runs one side only, for a profiler; prints its rates.
fn profile_one(side: &str, n: usize, rounds: usize) {
    if side == "core" {
        return bare_core(n, rounds);
    }
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    for _ in 0..rounds {
        let w = match side {
            "cronoq" => rt.block_on(cronoq(n)),
            "queued" => rt.block_on(cronoq_queued(n)),
            "baseline" => rt.block_on(baseline(n)),
            other => {
                panic!("CRONOQ_BENCH_ONLY={other:?}: expected cronoq, queued, baseline or core")
            }
        };
        println!(
            "{side}: {:.0} tasks/s, {:.2} µs CPU per task",
            w.rate(n),
            w.cpu_us(n)
        );
    }
}

fn main() {
    let n = env_count("CRONOQ_BENCH_TASKS", 1_000_000);
    let rounds = env_count("CRONOQ_BENCH_ROUNDS", 5);
    let only = std::env::var("CRONOQ_BENCH_ONLY").unwrap_or_default();
    if !only.is_empty() {
        profile_one(&only, n, rounds);
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let workers = rt.metrics().num_workers();

    // Warm-up: allocator, runtime threads, code paths.
    rt.block_on(baseline(n / 10 + 1));
    rt.block_on(cronoq(n / 10 + 1));

    let mut base_rates = Vec::with_capacity(rounds);
    let mut cronoq_rates = Vec::with_capacity(rounds);
    let mut ratios = Vec::with_capacity(rounds);
    let mut queued_rates = Vec::with_capacity(rounds);
    let mut queued_ratios = Vec::with_capacity(rounds);
    let mut cpu = [(); 3].map(|_| Vec::with_capacity(rounds));
    println!();
    println!("embedded_throughput: {n} no-op tasks, end to end (submit all, then wait for all)");
    println!(
        "  cronoq    Scheduler, {GROUPS} label groups x {SLOTS_PER_GROUP} slots, 10% of tasks unlabeled"
    );
    println!(
        "  baseline  tokio::spawn + Semaphore({}) permit each",
        GROUPS * SLOTS_PER_GROUP as usize
    );
    println!("  runtime   tokio multi-thread, {workers} workers");
    for round in 1..=rounds {
        let wb = rt.block_on(baseline(n));
        let wc = rt.block_on(cronoq(n));
        let wq = rt.block_on(cronoq_queued(n));
        let (b, c, q) = (wb.rate(n), wc.rate(n), wq.rate(n));
        println!(
            "  round {round}   baseline {:>10.0} tasks/s   cronoq {:>10.0} tasks/s   ratio {:.3}   queued {:>10.0} tasks/s ({:.3})",
            b,
            c,
            c / b,
            q,
            q / b
        );
        println!(
            "            CPU per task: baseline {:.2} µs, cronoq {:.2} µs, queued {:.2} µs",
            wb.cpu_us(n),
            wc.cpu_us(n),
            wq.cpu_us(n)
        );
        for (all, w) in cpu.iter_mut().zip([wb, wc, wq]) {
            all.push(w.cpu_us(n));
        }
        queued_rates.push(q);
        queued_ratios.push(q / b);
        base_rates.push(b);
        cronoq_rates.push(c);
        ratios.push(c / b);
    }
    let b = median(&mut base_rates);
    let c = median(&mut cronoq_rates);
    let ratio = c / b;
    let verdict = if ratio >= TARGET_RATIO {
        "PASS"
    } else {
        "FAIL"
    };
    println!("  median    baseline {b:.0} tasks/s, cronoq {c:.0} tasks/s");
    println!(
        "  ratio     cronoq / baseline = {ratio:.3} (median of per-round ratios {:.3})",
        median(&mut ratios)
    );
    let [cpu_b, cpu_c, cpu_q] = cpu.map(|mut all| median(&mut all));
    println!(
        "  CPU       per task (medians): baseline {cpu_b:.2} µs, cronoq {cpu_c:.2} µs, queued {cpu_q:.2} µs"
    );
    let q = median(&mut queued_rates);
    let queued_verdict = if q / b >= QUEUED_TARGET_RATIO {
        "PASS"
    } else {
        "FAIL"
    };
    println!(
        "  queued    all submitted before slots open: {q:.0} tasks/s, {:.3} x baseline (median of per-round ratios {:.3})",
        q / b,
        median(&mut queued_ratios)
    );
    println!("  target    ratio >= {TARGET_RATIO}: {verdict}");
    println!("  target    queued ratio >= {QUEUED_TARGET_RATIO}: {queued_verdict}");
    println!(
        "  reproduce cargo bench --bench embedded_throughput   (CRONOQ_BENCH_TASKS=100000 for a quick run)"
    );
    println!();
}

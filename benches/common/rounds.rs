//! One round of the distributed bench, whatever the side: the measured
//! window (counters before the first submit, until the submit stream is
//! empty), the finish line (the n-th task's end), paced or saturating
//! submission, and the NATS chores every side shares.

#![allow(dead_code)]

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures_util::StreamExt;
use tokio::sync::{watch, Notify};

use super::env_count;
use super::measure::{now_ns, Latencies, Nats, Stamps, Usage};

pub const WORKERS: usize = 4;
pub const SLOTS_PER_WORKER: u32 = 16;
pub const IN_FLIGHT_SUBMITS: usize = 256;
pub const POOL: &str = "bench";
/// How long one round may take before the bench gives up on it.
pub const ROUND_DEADLINE: Duration = Duration::from_secs(600);
/// How long the submit stream may take to empty after a round, by default
/// (`CRONOQ_BENCH_SETTLE_S`).
pub const SETTLE_BUDGET_S: usize = 60;

/// With `CRONOQ_BENCH_DUMP=<dir>`, writes `<dir>/<name>.csv`: per task
/// id, submit start and start in ns since the bench began (0: not seen),
/// to find when in a run the slow ones happened.
pub fn dump(name: &str, submitted: &Stamps, started: &Stamps) {
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

/// What one round measured.
pub struct Round {
    pub n: usize,
    /// First submit's start to the last task's end (terminal event / ack).
    pub elapsed: Duration,
    /// First submit's start to an empty submit stream; or the messages
    /// still there when the settle budget ran out.
    pub settled: Result<Duration, u64>,
    /// Submit → handler called (cronoq) or → worker receipt (dispatchers).
    pub to_start: Latencies,
    pub usage: Usage,
}

impl Round {
    pub fn rate(&self) -> f64 {
        self.n as f64 / self.elapsed.as_secs_f64()
    }

    /// CPU of both processes per task: what a round costs whatever else
    /// runs on the machine (time stolen by other tenants is not in it).
    pub fn cpu_per_task(&self) -> f64 {
        (self.usage.self_cpu + self.usage.nats_cpu).as_secs_f64() / self.n as f64
    }

    pub fn settled(&self) -> String {
        match self.settled {
            Ok(d) => format!("settled {:>8.0}/s", self.n as f64 / d.as_secs_f64()),
            Err(left) => format!(
                "NOT settled: {left} left after {}s",
                settle_budget().as_secs()
            ),
        }
    }
}

/// The measured window of a round: from the first submit's start (counters
/// read just before) until the submit stream is empty.
pub struct Window {
    before: Usage,
    begin: u64,
}

impl Window {
    pub fn open(nats: &Nats) -> Window {
        let before = nats.usage();
        Window {
            before,
            begin: now_ns(),
        }
    }

    /// Waits until `stream` is empty and reads the counters: the round
    /// whose last task ended at `end`; dumps its stamps as `name`.
    pub async fn close(
        self,
        nats: &Nats,
        stream: &str,
        end: u64,
        name: &str,
        submitted: &Stamps,
        started: &Stamps,
    ) -> Round {
        let settled = wait_empty(nats, stream).await;
        let usage = nats.usage().since(self.before);
        dump(name, submitted, started);
        Round {
            n: submitted.0.len() - 1,
            elapsed: Duration::from_nanos(end - self.begin),
            settled: settled.map(|t| Duration::from_nanos(t - self.begin)),
            to_start: Stamps::deltas(submitted, started),
            usage,
        }
    }
}

/// Counts finished tasks; notes when the `n`-th finished.
pub struct Finish {
    pub n: usize,
    done: AtomicUsize,
    at: AtomicU64,
    notify: Notify,
}

impl Finish {
    pub fn new(n: usize) -> Arc<Finish> {
        Arc::new(Finish {
            n,
            done: AtomicUsize::new(0),
            at: AtomicU64::new(0),
            notify: Notify::new(),
        })
    }

    pub fn one(&self) {
        if self.done.fetch_add(1, Ordering::Relaxed) + 1 == self.n {
            self.at.store(now_ns(), Ordering::Relaxed);
            self.notify.notify_one();
        }
    }

    /// The time the last task finished (panics after [`ROUND_DEADLINE`]).
    pub async fn wait(&self, side: &str) -> u64 {
        let notified = self.notify.notified();
        if self.done.load(Ordering::Relaxed) < self.n {
            tokio::time::timeout(ROUND_DEADLINE, notified)
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{side}: finished {} of {}",
                        self.done.load(Ordering::Relaxed),
                        self.n
                    )
                });
        }
        self.at.load(Ordering::Relaxed)
    }
}

/// Completes once `rx` reads true.
pub async fn raised(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// Runs `submit(i)` for i in 0..n: `in_flight` at once as fast as they
/// complete, or started at `pace` tasks/s (each its own tokio task, so a
/// slow acknowledgement never holds the pace back).
pub async fn submit_all<F, Fut>(n: usize, pace: Option<f64>, submit: F)
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

pub fn settle_budget() -> Duration {
    Duration::from_secs(env_count("CRONOQ_BENCH_SETTLE_S", SETTLE_BUDGET_S) as u64)
}

/// Polls the monitoring endpoints until stream `name` holds no message on
/// any node: the time it was first seen empty, or what it held when the
/// settle budget ran out.
pub async fn wait_empty(nats: &Nats, name: &str) -> Result<u64, u64> {
    let deadline = Instant::now() + settle_budget();
    loop {
        let messages = tokio::task::block_in_place(|| nats.stream_messages(name))
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
pub async fn delete_stream(js: &jetstream::Context, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while let Err(e) = js.delete_stream(name).await {
        if Instant::now() >= deadline {
            eprintln!("  (could not delete stream {name}: {e})");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn connect(url: &str, name: &str) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .name(name)
        .subscription_capacity(1 << 20)
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"))
}

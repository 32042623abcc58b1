//! Task counters and latency histograms per pool, as the ledger counts
//! them and `/metrics` shows them.
//!
//! The ledger (both shells' per-task bookkeeping) owns a [`Metrics`] and
//! bumps it where it records a submission, an attempt's start or end, or a
//! task's outcome, so the embedded scheduler and the leader count the same
//! way. Sans-IO: durations are differences of the `now`s handed in.
//!
//! **Bounded.** At most [`MAX_METRIC_POOLS`] pools are tracked by name, in
//! the order they are first seen; later pools are counted together under
//! the pool label [`OTHER_POOL`] (`_other`, not a valid pool name, so it
//! never collides). Figures are never forgotten while the process runs:
//! counters must not go backwards.
//!
//! Rendering to the Prometheus text format lives in [`crate::http`].

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::core::{Millis, TaskState};

/// The most pools tracked by name; the rest count under [`OTHER_POOL`].
pub const MAX_METRIC_POOLS: usize = 100;

/// The pool label of the figures of pools past [`MAX_METRIC_POOLS`].
pub const OTHER_POOL: &str = "_other";

/// Upper bounds of the histogram buckets, in milliseconds (0.05 s … 1 h;
/// `+Inf` is implicit).
pub const BUCKETS_MS: [u64; 14] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 300_000, 900_000, 1_800_000,
    3_600_000,
];

/// A latency histogram: counts per bucket (not cumulative; the last entry
/// is `+Inf`), the sum in milliseconds and the count.
///
/// ```
/// let mut h = cronoq::metrics::Histogram::default();
/// h.observe(cronoq::core::Millis(50)); // le="0.05": bounds are inclusive
/// h.observe(cronoq::core::Millis(51)); // le="0.1"
/// assert_eq!(h.cumulative()[..2], [1, 2]);
/// assert_eq!((h.count, h.sum_ms), (2, 101));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Histogram {
    /// Observations per bucket of [`BUCKETS_MS`], then `+Inf`.
    pub buckets: Vec<u64>,
    /// Sum of the observations, in milliseconds.
    pub sum_ms: u64,
    /// Number of observations.
    pub count: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: vec![0; BUCKETS_MS.len() + 1],
            sum_ms: 0,
            count: 0,
        }
    }
}

impl Histogram {
    /// Counts one duration.
    pub fn observe(&mut self, span: Millis) {
        let at = BUCKETS_MS.partition_point(|&le| le < span.0);
        if let Some(b) = self.buckets.get_mut(at) {
            *b += 1;
        }
        self.sum_ms = self.sum_ms.saturating_add(span.0);
        self.count += 1;
    }

    /// Cumulative counts, one per bucket of [`BUCKETS_MS`] then `+Inf`, as
    /// Prometheus' `_bucket{le=…}` series carry them.
    pub fn cumulative(&self) -> Vec<u64> {
        self.buckets
            .iter()
            .scan(0u64, |acc, b| {
                *acc += b;
                Some(*acc)
            })
            .collect()
    }
}

/// The counters and histograms of one pool.
///
/// ```
/// let p = cronoq::metrics::PoolMetrics::new("p");
/// assert_eq!((p.pool.as_str(), p.submitted, p.queue_wait.count), ("p", 0, 0));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolMetrics {
    /// The pool's name, or [`OTHER_POOL`].
    pub pool: String,
    /// Tasks submitted (accepted, or refused and dead-lettered).
    pub submitted: u64,
    /// Attempts started (first attempts and retries).
    pub started: u64,
    /// Attempts started after an earlier attempt of the task.
    pub retried: u64,
    /// Attempts lost (worker gone, lease expired, attempt timeout).
    pub lost: u64,
    /// Tasks finished succeeded.
    pub succeeded: u64,
    /// Tasks finished failed (including refused submissions).
    pub failed: u64,
    /// Tasks cancelled.
    pub cancelled: u64,
    /// Fixed-start tasks that missed their start.
    pub missed: u64,
    /// Submissions refused and copied to the dead-letter stream.
    pub dead_lettered: u64,
    /// Submit → first attempt's start.
    pub queue_wait: Histogram,
    /// An attempt's start → its end.
    pub run: Histogram,
}

impl PoolMetrics {
    /// Zero figures for `pool`.
    pub fn new(pool: &str) -> PoolMetrics {
        PoolMetrics {
            pool: pool.to_string(),
            ..PoolMetrics::default()
        }
    }

    /// The finished count for a terminal state (`None` for a live one).
    pub fn finished_mut(&mut self, state: TaskState) -> Option<&mut u64> {
        match state {
            TaskState::Succeeded => Some(&mut self.succeeded),
            TaskState::Failed => Some(&mut self.failed),
            TaskState::Cancelled => Some(&mut self.cancelled),
            TaskState::Missed => Some(&mut self.missed),
            TaskState::Scheduled | TaskState::Queued | TaskState::Running => None,
        }
    }
}

/// What `/metrics` shows beyond the snapshot: per-pool counters and
/// histograms, and (on a server) election and journal figures.
///
/// ```
/// let m = cronoq::metrics::MetricsSnapshot::default();
/// assert!(m.pools.is_empty() && m.server.is_none());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetricsSnapshot {
    /// Per pool, in the order first seen; [`OTHER_POOL`] last if present.
    pub pools: Vec<PoolMetrics>,
    /// Figures only a distributed server has.
    pub server: Option<ServerMetrics>,
    /// Schedule figures, once the scheduler (or leader) serves schedules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedules: Option<ScheduleMetrics>,
}

/// Schedule figures (issue 23): per schedule counters and the fire lag.
///
/// ```
/// let m = cronoq::metrics::ScheduleMetrics::default();
/// assert!(m.schedules.is_empty() && m.fire_lag.count == 0);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleMetrics {
    /// Per schedule, by name.
    pub schedules: Vec<ScheduleFigures>,
    /// Tick → task accepted, over the fires of ticks (not triggers or
    /// backfills).
    pub fire_lag: Histogram,
}

/// The counters of one schedule.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleFigures {
    /// The schedule's name.
    pub schedule: String,
    /// Runs started.
    pub fires: u64,
    /// Ticks skipped by the overlap policy.
    pub skipped: u64,
    /// Ticks missed (too late, or paused).
    pub missed: u64,
}

/// Election and journal figures of one server process.
///
/// ```
/// let s = cronoq::metrics::ServerMetrics::default();
/// assert_eq!((s.takeovers, s.journal_pending), (0, 0));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerMetrics {
    /// Times this process became leader.
    pub takeovers: u64,
    /// Journal records written but not yet acknowledged by JetStream.
    pub journal_pending: u64,
    /// Stored values (journal, start and leader records) this process
    /// refused as not sealed with the servers' storage key: forged, or
    /// another deployment's.
    #[serde(default)]
    pub storage_refused: u64,
    /// Submissions this leadership dropped unrecorded because no
    /// credential's proof verifies on them (auth on), by error code: an
    /// unsigned or forged publish to the submit subject leaves this count,
    /// not a task record or a dead letter each.
    #[serde(default)]
    pub refused_unattributed: std::collections::BTreeMap<String, u64>,
    /// The last [`REFUSED_SAMPLE`] of them, oldest first.
    #[serde(default)]
    pub refused_sample: Vec<RefusedSubmission>,
}

/// How many unattributed refusals [`ServerMetrics::refused_sample`] keeps.
pub const REFUSED_SAMPLE: usize = 64;

/// One submission dropped because no credential's proof verifies on it.
///
/// ```
/// let r = cronoq::metrics::RefusedSubmission { seq: 7, code: "UNAUTHENTICATED".into(), reason: "no proof".into() };
/// assert_eq!(r.seq, 7);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedSubmission {
    /// Its submit-stream sequence (purged with the finished ones).
    pub seq: u64,
    /// The refusal's code.
    pub code: String,
    /// Why, cut to 200 characters.
    pub reason: String,
}

/// The recorder the ledger owns: figures per pool slot.
#[derive(Default)]
pub(crate) struct Metrics {
    slots: FxHashMap<String, u32>,
    pools: Vec<PoolMetrics>,
    /// The slot of [`OTHER_POOL`], once a pool overflowed.
    other: Option<u32>,
}

impl Metrics {
    /// The slot counting `pool` (created on first use; bounded).
    pub fn slot(&mut self, pool: &str) -> u32 {
        if let Some(&s) = self.slots.get(pool) {
            return s;
        }
        if self.slots.len() < MAX_METRIC_POOLS {
            let s = self.pools.len() as u32;
            self.pools.push(PoolMetrics::new(pool));
            self.slots.insert(pool.to_string(), s);
            return s;
        }
        *self.other.get_or_insert_with(|| {
            self.pools.push(PoolMetrics::new(OTHER_POOL));
            (self.pools.len() - 1) as u32
        })
    }

    /// The figures of a slot from [`Metrics::slot`].
    pub fn at(&mut self, slot: u32) -> &mut PoolMetrics {
        &mut self.pools[slot as usize]
    }

    /// The figures of `pool`.
    pub fn pool(&mut self, pool: &str) -> &mut PoolMetrics {
        let s = self.slot(pool);
        self.at(s)
    }

    /// A copy for `/metrics`, `_other` last.
    pub fn snapshot(&self) -> MetricsSnapshot {
        // `_other` is created only once every named slot is taken: last.
        MetricsSnapshot {
            pools: self.pools.clone(),
            server: None,
            schedules: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_bounds_are_inclusive_and_the_last_is_inf() {
        let mut h = Histogram::default();
        for ms in [0, 50, 51, 100, 3_600_000, 3_600_001, u64::MAX] {
            h.observe(Millis(ms));
        }
        // 0 and 50 in le=0.05; 51 and 100 in le=0.1; 1 h in le=3600; two in +Inf.
        assert_eq!(h.buckets[0], 2);
        assert_eq!(h.buckets[1], 2);
        assert_eq!(h.buckets[BUCKETS_MS.len() - 1], 1);
        assert_eq!(h.buckets[BUCKETS_MS.len()], 2);
        assert_eq!(h.count, 7);
        assert_eq!(*h.cumulative().last().unwrap(), 7);
        assert_eq!(h.sum_ms, u64::MAX);
    }

    #[test]
    fn pools_past_the_bound_count_under_other() {
        let mut m = Metrics::default();
        for i in 0..1_000 {
            m.pool(&format!("p{i}")).submitted += 1;
        }
        let snap = m.snapshot();
        assert_eq!(snap.pools.len(), MAX_METRIC_POOLS + 1);
        let other = snap.pools.last().unwrap();
        assert_eq!(other.pool, OTHER_POOL);
        assert_eq!(other.submitted, (1_000 - MAX_METRIC_POOLS) as u64);
        assert_eq!(m.slot("p0"), 0);
    }
}

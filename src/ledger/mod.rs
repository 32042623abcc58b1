//! The per-task bookkeeping beside the core, shared by both shells.
//!
//! The core decides (placement, retries, timers); it keeps no payloads,
//! outputs or attempt histories. Both shells — the embedded
//! [`Scheduler`](crate::Scheduler) and the leader's driver — need the same
//! records beside it: each live task's payload and attempts (group, worker,
//! times, outcome, error), its output, the idempotency key it holds, and a
//! bounded ring of finished tasks to answer `task` and `wait` after the
//! fact. Before this module each shell kept its own copy and the copies
//! disagreed (a remote attempt stopped for its timeout was `cancelled`, an
//! embedded one `lost`; a key was free again after its task finished in
//! one and not in the other). Now there is one.
//!
//! Sans-IO like the core: every call is handed `now` where it records a
//! time. A shell keeps what only it needs in `X` (waiters and abort handles
//! for embedded, nothing for the driver).
//!
//! **Rules kept here.**
//! - An attempt revoked for its attempt timeout that does not succeed is
//!   `lost` with the error `timeout` (SPEC §2 rule 8; the core counts it
//!   lost and retries it), however the executor or worker reports the stop.
//! - A task that finishes while an attempt is still open (cancelled while
//!   running) closes that attempt as `cancelled` at `now`.
//! - An idempotency key is bound to its task while the task is live and
//!   while its outcome is retained (the last `retain` finished tasks): a
//!   resubmission in that window is the same task, never a second run.
//! - Every task is counted once as submitted, each attempt once as started
//!   (and as retried when it is not the first) and each task once as
//!   finished with its outcome ([`crate::metrics`]); the queue wait is
//!   observed at the first attempt's start, the run time at each attempt's
//!   end (or at the task's end for an attempt closed as cancelled).
//! - Ids only grow (the embedded counter, the submit stream's sequence);
//!   live entries sit in a window indexed by `id - base`.

use std::collections::VecDeque;

use bytes::Bytes;
use rustc_hash::FxHashMap;

use crate::core::{
    AttemptOutcome, Core, Labels, Millis, PoolName, RevokeReason, TaskId, TaskState,
};
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::task::{AttemptRecord, Outcome, TaskStatus};

mod done;
mod entries;

pub(crate) use done::Done;
use done::Retained;
use entries::Entries;

/// The error of an attempt stopped for its attempt timeout.
pub(crate) const TIMEOUT: &str = "timeout";
/// The outcome recorded for an attempt preempted by higher-priority work
/// (SPEC §9).
pub(crate) const PREEMPTED: &str = "preempted";

/// One live task.
pub(crate) struct Entry<X, R> {
    /// What the executor or worker is handed.
    pub payload: Bytes,
    /// The shell's own data, from the start.
    pub extra: X,
    /// Where its figures are counted ([`Metrics::slot`]).
    metrics_slot: u32,
    /// When it was submitted, for the queue wait.
    submitted_at: Millis,
    /// Allocated once the task first starts or holds a key: most tasks in
    /// a busy embedded scheduler make one attempt and need little.
    run: Option<Box<Run<R>>>,
}

#[derive(Default)]
struct Run<R> {
    attempts: Vec<AttemptRecord>,
    output: Option<Bytes>,
    error: Option<String>,
    /// The attempt revoked for running past its timeout, or preempted
    /// (SPEC §9), and which.
    revoked: Option<(u32, RevokeReason)>,
    key: Option<String>,
    /// Other ids that stand for this task (resubmissions with its key).
    aliases: Vec<TaskId>,
    /// The schedule that fired it and its tick (boxed: most tasks have
    /// none).
    schedule: Option<Box<(String, Millis)>>,
    /// The shell's own data, once the task runs.
    extra: R,
}

impl<X, R: Default> Entry<X, R> {
    fn run(&mut self) -> &mut Run<R> {
        self.run.get_or_insert_with(Default::default)
    }

    /// The shell's data kept once the task runs (allocated on first use).
    pub fn run_extra(&mut self) -> &mut R {
        &mut self.run().extra
    }

    /// The schedule that fired it and its tick, if one did.
    pub fn schedule(&self) -> Option<&(String, Millis)> {
        self.run.as_ref()?.schedule.as_deref()
    }
}

/// A task that just finished: its outcome (the caller's own copy, an
/// [`Outcome`] or the compact [`Done`]) and the shell's data.
pub(crate) struct Finished<X, R, O = Outcome> {
    pub outcome: O,
    pub extra: X,
    pub run_extra: R,
}

/// What an id stands for.
pub(crate) enum Found<'a, X, R> {
    Live(TaskId, &'a Entry<X, R>),
    Finished(&'a Done),
}

/// The records of live and recently finished tasks.
pub(crate) struct Ledger<X, R> {
    live: Entries<Entry<X, R>>,
    /// Retained task → its place in the ring (counted from the first entry
    /// ever pushed). Tasks finish roughly in id order, so this is a window
    /// indexed by id like `live`: no hashing per task in the usual case,
    /// and 8-byte values when finishing order strays (queued work).
    finished: Entries<u64>,
    /// How many outcomes the ring holds.
    retained: usize,
    /// Retained outcomes (and their aliases), oldest first.
    ring: VecDeque<Retained>,
    /// The place of the ring's front entry.
    ring_base: u64,
    /// Idempotency key → the task that holds it (live or retained).
    keys: FxHashMap<String, TaskId>,
    /// A resubmission with a known key → the task it duplicates.
    aliases: FxHashMap<TaskId, TaskId>,
    retain: usize,
    /// Counters and histograms per pool.
    metrics: Metrics,
    /// The pool of the last submission and its metrics slot (a pool's
    /// slot never changes): most submissions skip the lookup.
    last_slot: Option<(PoolName, u32)>,
    /// Emptied run records of finished tasks, reused by the next starts:
    /// no malloc/free per task under the shell's lock, and a record still
    /// in cache instead of a fresh one.
    spare_runs: Vec<Box<Run<R>>>,
}

/// How many emptied run records a ledger keeps for reuse.
const SPARE_RUNS: usize = 256;

impl<X, R: Default> Ledger<X, R> {
    /// A ledger that keeps the outcomes of the last `retain` finished tasks.
    pub fn new(retain: usize) -> Ledger<X, R> {
        Ledger {
            live: Entries::default(),
            finished: Entries::default(),
            retained: 0,
            ring: VecDeque::new(),
            ring_base: 0,
            keys: FxHashMap::default(),
            aliases: FxHashMap::default(),
            retain,
            metrics: Metrics::default(),
            last_slot: None,
            spare_runs: Vec::new(),
        }
    }

    /// The task that holds `key`, live or retained.
    pub fn by_key(&self, key: &str) -> Option<TaskId> {
        self.keys.get(key).copied()
    }

    /// The task an id stands for: itself, or the task it duplicated.
    pub fn resolve(&self, id: TaskId) -> TaskId {
        self.aliases.get(&id).copied().unwrap_or(id)
    }

    /// Records that `dup` (a resubmission) stands for `original`, as long
    /// as `original` is live or retained.
    pub fn alias(&mut self, dup: TaskId, original: TaskId) {
        if let Some(entry) = self.live.get_mut(original) {
            entry.run().aliases.push(dup);
            self.aliases.insert(dup, original);
        } else if self.finished.get(original).is_some() {
            // Behind its original in the ring: evicted after it.
            self.aliases.insert(dup, original);
            self.ring.push_back(Retained::Alias(dup));
        }
    }

    /// A new live task of `pool`, submitted at `now`. Its key (if any)
    /// binds to it.
    pub fn accept(
        &mut self,
        id: TaskId,
        pool: &PoolName,
        payload: Bytes,
        key: Option<&str>,
        extra: X,
        now: Millis,
    ) {
        let metrics_slot = match &self.last_slot {
            Some((last, slot)) if last == pool => *slot,
            _ => {
                let slot = self.metrics.slot(pool.as_str());
                self.last_slot = Some((pool.clone(), slot));
                slot
            }
        };
        self.metrics.at(metrics_slot).submitted += 1;
        let mut entry = Entry {
            payload,
            extra,
            metrics_slot,
            submitted_at: now,
            run: None,
        };
        if let Some(key) = key {
            self.keys.insert(key.to_string(), id);
            entry.run().key = Some(key.to_string());
        }
        self.live.insert(id, entry);
    }

    /// Marks a task just accepted as fired by a schedule (name, tick).
    /// No lookup when `schedule` is `None` (every ordinary submission).
    pub fn set_schedule(&mut self, id: TaskId, schedule: Option<(String, Millis)>) {
        let Some(schedule) = schedule else {
            return;
        };
        if let Some(entry) = self.live.get_mut(id) {
            entry.run().schedule = Some(Box::new(schedule));
        }
    }

    /// Takes back an [`accept`](Ledger::accept) the core then refused.
    pub fn unaccept(&mut self, id: TaskId) {
        if let Some(mut entry) = self.live.remove(id) {
            // The refusal that follows counts the submission.
            let m = self.metrics.at(entry.metrics_slot);
            m.submitted = m.submitted.saturating_sub(1);
            if let Some(key) = entry.run().key.take() {
                if self.keys.get(&key) == Some(&id) {
                    self.keys.remove(&key);
                }
            }
        }
    }

    /// What the shell keeps with a live task.
    pub fn extra(&self, id: TaskId) -> Option<&X> {
        self.live.get(id).map(|e| &e.extra)
    }

    pub fn is_live(&self, id: TaskId) -> bool {
        self.live.get(id).is_some()
    }

    pub fn is_finished(&self, id: TaskId) -> bool {
        self.finished.get(self.resolve(id)).is_some()
    }

    /// Room for `additional` more live tasks, allocated now.
    pub fn reserve(&mut self, additional: usize) {
        self.live.reserve(additional);
    }

    /// Known at all (live, retained, or an alias of either).
    pub fn knows(&self, id: TaskId) -> bool {
        self.is_live(id) || self.is_finished(id) || self.aliases.contains_key(&id)
    }

    pub fn get_mut(&mut self, id: TaskId) -> Option<&mut Entry<X, R>> {
        self.live.get_mut(id)
    }

    /// The live entry or the retained outcome that `id` stands for.
    pub fn find(&self, id: TaskId) -> Option<Found<'_, X, R>> {
        let id = self.resolve(id);
        if let Some(done) = self.done(id) {
            return Some(Found::Finished(done));
        }
        self.live.get(id).map(|e| Found::Live(id, e))
    }

    /// The retained record of finished task `id` (not resolved).
    fn done(&self, id: TaskId) -> Option<&Done> {
        let at = self.finished.get(id)?.checked_sub(self.ring_base)?;
        match self.ring.get(usize::try_from(at).ok()?)? {
            Retained::Task(done) => Some(done),
            Retained::Alias(_) | Retained::Replaced => None,
        }
    }

    /// The key retained finished task `id` holds (not resolved): what its
    /// result record carries, so a successor binds it again.
    pub fn retained_key(&self, id: TaskId) -> Option<&str> {
        let at = self.finished.get(id)?.checked_sub(self.ring_base)?;
        match self.ring.get(usize::try_from(at).ok()?)? {
            Retained::Task(done) => done.key(),
            Retained::Alias(_) | Retained::Replaced => None,
        }
    }

    /// A retained outcome (a copy, built now).
    pub fn outcome(&self, id: TaskId) -> Option<Outcome> {
        self.done(self.resolve(id)).map(Done::to_outcome)
    }

    /// A retained outcome in its compact form (a copy without the key).
    pub fn outcome_done(&self, id: TaskId) -> Option<Done> {
        self.done(self.resolve(id)).map(Done::copy)
    }

    /// Attempt `attempt` started in `group` (on `worker`, remotely) at
    /// `now`. Returns the entry, or `None` for a task not live here.
    pub fn started(
        &mut self,
        id: TaskId,
        attempt: u32,
        group: Labels,
        worker: Option<String>,
        credential: Option<String>,
        now: Millis,
    ) -> Option<&mut Entry<X, R>> {
        let entry = self.live.get_mut(id)?;
        if entry.run.is_none() {
            entry.run = self.spare_runs.pop();
        }
        let m = self.metrics.at(entry.metrics_slot);
        m.started += 1;
        if attempt > 1 {
            m.retried += 1;
        } else {
            m.queue_wait.observe(elapsed(entry.submitted_at, now));
        }
        let run = entry.run();
        if run.attempts.capacity() == 0 {
            // Most tasks make one attempt: no room for four (and the direct
            // allocation, not the general growth path).
            run.attempts = Vec::with_capacity(1);
        }
        run.attempts.push(AttemptRecord {
            attempt,
            group,
            worker,
            credential,
            started_at: now,
            ended_at: None,
            outcome: None,
            error: None,
        });
        Some(entry)
    }

    /// Puts back the attempts (and last error) an earlier leadership
    /// journaled for a task just accepted again.
    pub fn restore(&mut self, id: TaskId, attempts: Vec<AttemptRecord>, error: Option<String>) {
        if let Some(entry) = self.live.get_mut(id) {
            // Submitted (and counted) under an earlier leadership.
            let m = self.metrics.at(entry.metrics_slot);
            m.submitted = m.submitted.saturating_sub(1);
            let run = entry.run();
            run.attempts = attempts;
            run.error = error;
        }
    }

    /// Attempt `attempt` was revoked for `reason`: one stopped for its
    /// timeout ends `lost` (error `timeout`), a preempted one `preempted`,
    /// unless it succeeded after all (a cancelled one ends with its task).
    pub fn revoked(&mut self, id: TaskId, attempt: u32, reason: RevokeReason) {
        if reason == RevokeReason::Cancelled {
            return;
        }
        if let Some(entry) = self.live.get_mut(id) {
            entry.run().revoked = Some((attempt, reason));
        }
    }

    /// Attempt `attempt` ended at `now`. Returns the outcome as recorded,
    /// which is what the core must hear: an attempt stopped for its
    /// timeout that did not succeed is `lost` with the error `timeout`.
    pub fn ended(
        &mut self,
        id: TaskId,
        attempt: u32,
        outcome: AttemptOutcome,
        output: Option<Bytes>,
        error: Option<String>,
        now: Millis,
    ) -> AttemptOutcome {
        let Some(entry) = self.live.get_mut(id) else {
            return outcome;
        };
        let m = self.metrics.at(entry.metrics_slot);
        let run = entry.run();
        let revoked = match run.revoked {
            Some((a, reason)) if a == attempt && outcome != AttemptOutcome::Succeeded => {
                Some(reason)
            }
            _ => None,
        };
        let (outcome, error) = match revoked {
            Some(RevokeReason::Timeout) => (AttemptOutcome::Lost, Some(TIMEOUT.to_string())),
            // Not a failure of the task: its error stays as it was.
            Some(RevokeReason::Preempted) => (outcome, None),
            _ => (outcome, error),
        };
        if outcome == AttemptOutcome::Lost {
            m.lost += 1;
        }
        if let Some(record) = run.attempts.iter_mut().rev().find(|a| a.attempt == attempt) {
            if record.ended_at.is_none() {
                m.run.observe(elapsed(record.started_at, now));
            }
            record.ended_at = Some(now);
            record.outcome = Some(match revoked {
                Some(RevokeReason::Preempted) => PREEMPTED.into(),
                _ => outcome.as_str().into(),
            });
            record.error = error.clone();
        }
        if output.is_some() {
            run.output = output;
        }
        if error.is_some() {
            run.error = error;
        }
        outcome
    }

    /// The task finished (the core said so). Its record becomes a retained
    /// outcome; an attempt still open is closed as `cancelled`. Returns the
    /// outcome and the shell's data, or `None` for a task not live here.
    pub fn finish(
        &mut self,
        id: TaskId,
        pool: PoolName,
        state: TaskState,
        deadline_missed: bool,
        now: Millis,
    ) -> Option<Finished<X, R>> {
        let done = self.finish_done(id, pool, state, deadline_missed, now)?;
        Some(Finished {
            outcome: done.outcome.into_outcome(),
            extra: done.extra,
            run_extra: done.run_extra,
        })
    }

    /// [`Ledger::finish`], the caller's copy left compact: a shell that
    /// hands it to another thread builds the [`Outcome`] there (its
    /// attempt list allocated and freed on that thread, not here).
    pub fn finish_done(
        &mut self,
        id: TaskId,
        pool: PoolName,
        state: TaskState,
        deadline_missed: bool,
        now: Millis,
    ) -> Option<Finished<X, R, Done>> {
        let entry = self.live.remove(id)?;
        let m = self.metrics.at(entry.metrics_slot);
        if let Some(n) = m.finished_mut(state) {
            *n += 1;
        }
        let mut run = match entry.run {
            Some(boxed) => boxed,
            None => self.spare_runs.pop().unwrap_or_default(),
        };
        for record in run.attempts.iter_mut().filter(|a| a.outcome.is_none()) {
            m.run.observe(elapsed(record.started_at, now));
            record.ended_at = Some(now);
            record.outcome = Some(AttemptOutcome::Cancelled.as_str().into());
        }
        let done = Done::from_run(id, pool, state, deadline_missed, &mut run);
        let aliases = std::mem::take(&mut run.aliases);
        let run_extra = std::mem::take(&mut run.extra);
        // Emptied for the next start, the attempt list's room kept: what
        // `from_run` and the takes above left is cleared field by field
        // (no drop and rebuild of the whole record).
        run.attempts.clear();
        run.output = None;
        run.revoked = None;
        debug_assert!(run.error.is_none() && run.key.is_none() && run.schedule.is_none());
        debug_assert!(run.aliases.is_empty());
        if self.spare_runs.len() < SPARE_RUNS {
            self.spare_runs.push(run);
        }
        let copy = done.copy();
        self.retire(done, aliases);
        Some(Finished {
            outcome: copy,
            extra: entry.extra,
            run_extra,
        })
    }

    /// Records an outcome decided without the core: a refused submission,
    /// counted as submitted, finished with its state and dead-lettered.
    pub fn record_outcome(&mut self, outcome: &Outcome, key: Option<&str>) {
        if self.finished.get(outcome.id).is_some() {
            return;
        }
        let m = self.metrics.pool(outcome.pool.as_str());
        m.submitted += 1;
        m.dead_lettered += 1;
        if let Some(n) = m.finished_mut(outcome.state) {
            *n += 1;
        }
        self.retain_with_key(outcome, key);
    }

    /// A task an earlier leadership finished, read back at a takeover
    /// before its submission was purged: retained with its key and counted
    /// nowhere (its leader counted it), so a resubmission of the key later
    /// in the stream is this task, not a second run.
    pub fn restore_finished(&mut self, outcome: &Outcome, key: Option<&str>) {
        if self.finished.get(outcome.id).is_some() || self.is_live(outcome.id) {
            return;
        }
        self.retain_with_key(outcome, key);
    }

    /// Binds `key` to a task that was never live here and retains its
    /// outcome.
    fn retain_with_key(&mut self, outcome: &Outcome, key: Option<&str>) {
        if let Some(key) = key {
            self.keys.insert(key.to_string(), outcome.id);
        }
        self.retire(Done::of(outcome, key.map(str::to_string)), Vec::new());
    }

    fn retire(&mut self, done: Done, aliases: Vec<TaskId>) {
        let id = done.id;
        if self.retain == 0 {
            if let Some(key) = done.key() {
                if self.keys.get(key) == Some(&id) {
                    self.keys.remove(key);
                }
            }
            for a in aliases {
                self.aliases.remove(&a);
            }
            return;
        }
        // A lookup first: removing an id that is not there (every finish
        // from the core) costs a good deal more than finding it absent.
        let older = match self.finished.get(id) {
            Some(_) => self.finished.remove(id),
            None => None,
        };
        if let Some(older) = older {
            // Recorded twice (never from the core): the newer record
            // stands, the older leaves the ring.
            self.retained -= 1;
            if let Some(entry) = older
                .checked_sub(self.ring_base)
                .and_then(|at| self.ring.get_mut(at as usize))
            {
                *entry = Retained::Replaced;
            }
        }
        // The oldest leave before the newest comes in: in a full ring the
        // newest then takes the very place the oldest left, which its
        // eviction has just brought into cache (the ring, 96 bytes an
        // entry, is far bigger than the L2 cache).
        while self.retained >= self.retain {
            match self.pop_front() {
                Some(Retained::Task(old)) => {
                    self.finished.remove(old.id);
                    self.retained -= 1;
                    if let Some(key) = old.key() {
                        if self.keys.get(key) == Some(&old.id) {
                            self.keys.remove(key);
                        }
                    }
                }
                Some(Retained::Alias(a)) => {
                    self.aliases.remove(&a);
                }
                Some(Retained::Replaced) => {}
                None => break,
            }
        }
        if self.ring.len() == self.ring.capacity() && self.ring.len() < self.retain {
            // Grown by doubling, but to exactly `retain` at the last step:
            // full, the ring then reuses places instead of moving on.
            let more = self.ring.len().max(4).min(self.retain - self.ring.len());
            self.ring.reserve_exact(more);
        }
        self.finished
            .insert(id, self.ring_base + self.ring.len() as u64);
        self.retained += 1;
        self.ring.push_back(Retained::Task(done));
        // The aliases follow their original in the ring and leave after it
        // (most tasks have none: no extend of an empty list per finish).
        if !aliases.is_empty() {
            self.ring.extend(aliases.into_iter().map(Retained::Alias));
        }
        // Aliases at the front stood for tasks already gone.
        while let Some(Retained::Alias(_) | Retained::Replaced) = self.ring.front() {
            if let Some(Retained::Alias(a)) = self.pop_front() {
                self.aliases.remove(&a);
            }
        }
    }

    fn pop_front(&mut self) -> Option<Retained> {
        let front = self.ring.pop_front()?;
        self.ring_base += 1;
        Some(front)
    }

    /// A live or retained task as `task` shows it; `None` if unknown.
    pub fn status(&self, core: &Core, id: TaskId) -> Option<TaskStatus> {
        match self.find(id)? {
            Found::Finished(done) => Some(TaskStatus::of_outcome(&done.to_outcome())),
            Found::Live(id, entry) => {
                let view = core.task(id)?;
                let run = entry.run.as_deref();
                Some(TaskStatus::live(
                    view,
                    run.map(|r| r.attempts.clone()).unwrap_or_default(),
                    run.and_then(|r| r.error.clone()),
                    run.and_then(|r| r.schedule.as_deref()),
                ))
            }
        }
    }

    /// The newest `limit` tasks, live or retained, highest id first, as
    /// [`TaskStatus::summary`]s: O(`limit`) lookups, not a scan.
    pub fn recent(&self, core: &Core, limit: usize) -> Vec<TaskStatus> {
        let finished = self.ring.iter().rev().filter_map(|r| match r {
            Retained::Task(done) => Some(done.id),
            Retained::Alias(_) | Retained::Replaced => None,
        });
        crate::task::newest_ids(self.live.newest(limit).into_iter(), finished, limit)
            .into_iter()
            .filter_map(|id| self.status(core, id).map(TaskStatus::summary))
            .collect()
    }

    /// The counters and histograms per pool.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }
}

/// The time from `then` to `now` (zero if the clock stood still).
fn elapsed(then: Millis, now: Millis) -> Millis {
    Millis(now.0.saturating_sub(then.0))
}

#[cfg(test)]
mod tests;

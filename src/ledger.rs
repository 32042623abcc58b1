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
use smallvec::SmallVec;

use crate::core::{AttemptOutcome, Core, Labels, Millis, PoolName, TaskId, TaskState};
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::task::{AttemptRecord, Outcome, TaskStatus};

/// The error of an attempt stopped for its attempt timeout.
pub(crate) const TIMEOUT: &str = "timeout";

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
    /// The attempt revoked for running past its timeout.
    timed_out: Option<u32>,
    key: Option<String>,
    /// Other ids that stand for this task (resubmissions with its key).
    aliases: Vec<TaskId>,
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
}

/// A task that just finished: its outcome (the caller's own copy) and the
/// shell's data.
pub(crate) struct Finished<X, R> {
    pub outcome: Outcome,
    pub extra: X,
    pub run_extra: R,
}

/// A retained outcome, kept by value in the ring: no allocation of its own
/// (the usual single attempt sits inline), so retaining and evicting a
/// task costs no malloc/free. An [`Outcome`] is built from it when someone
/// reads it.
pub(crate) struct Done {
    id: TaskId,
    pool: PoolName,
    state: TaskState,
    output: Option<Bytes>,
    error: Option<String>,
    attempts: SmallVec<[AttemptRecord; 1]>,
    deadline_missed: bool,
}

impl Done {
    fn of(outcome: &Outcome) -> Done {
        Done {
            id: outcome.id,
            pool: outcome.pool.clone(),
            state: outcome.state,
            output: outcome.output.clone(),
            error: outcome.error.clone(),
            attempts: outcome.attempts.iter().cloned().collect(),
            deadline_missed: outcome.deadline_missed,
        }
    }

    /// The outcome as [`Scheduler::wait`](crate::Scheduler::wait) and
    /// `task` show it.
    pub fn to_outcome(&self) -> Outcome {
        Outcome {
            id: self.id,
            pool: self.pool.clone(),
            state: self.state,
            output: self.output.clone(),
            error: self.error.clone(),
            attempts: self.attempts.to_vec(),
            deadline_missed: self.deadline_missed,
        }
    }
}

/// An entry of the ring of retained outcomes.
// The ring is a contiguous array of outcomes on purpose: boxing `Done`
// would cost an allocation per finished task, and aliases are rare.
#[allow(clippy::large_enum_variant)]
enum Retained {
    /// A finished task and the key it held.
    Task(Done, Option<String>),
    /// A resubmission that stands for an earlier entry of the ring.
    Alias(TaskId),
    /// A task recorded again since (its newer entry stands).
    Replaced,
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
}

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
            Retained::Task(done, _) => Some(done),
            Retained::Alias(_) | Retained::Replaced => None,
        }
    }

    /// A retained outcome (a copy, built now).
    pub fn outcome(&self, id: TaskId) -> Option<Outcome> {
        self.done(self.resolve(id)).map(Done::to_outcome)
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
        let m = self.metrics.at(entry.metrics_slot);
        m.started += 1;
        if attempt > 1 {
            m.retried += 1;
        } else {
            m.queue_wait.observe(elapsed(entry.submitted_at, now));
        }
        let run = entry.run();
        // Most tasks make one attempt: no room for four.
        run.attempts.reserve_exact(1);
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

    /// Attempt `attempt` was revoked for running past its timeout.
    pub fn timed_out(&mut self, id: TaskId, attempt: u32) {
        if let Some(entry) = self.live.get_mut(id) {
            entry.run().timed_out = Some(attempt);
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
        let (outcome, error) =
            if outcome != AttemptOutcome::Succeeded && run.timed_out == Some(attempt) {
                (AttemptOutcome::Lost, Some(TIMEOUT.to_string()))
            } else {
                (outcome, error)
            };
        if outcome == AttemptOutcome::Lost {
            m.lost += 1;
        }
        if let Some(record) = run.attempts.iter_mut().rev().find(|a| a.attempt == attempt) {
            if record.ended_at.is_none() {
                m.run.observe(elapsed(record.started_at, now));
            }
            record.ended_at = Some(now);
            record.outcome = Some(outcome.as_str().into());
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
        let entry = self.live.remove(id)?;
        let m = self.metrics.at(entry.metrics_slot);
        if let Some(n) = m.finished_mut(state) {
            *n += 1;
        }
        let mut run = entry.run.map(|b| *b).unwrap_or_default();
        for record in run.attempts.iter_mut().filter(|a| a.outcome.is_none()) {
            m.run.observe(elapsed(record.started_at, now));
            record.ended_at = Some(now);
            record.outcome = Some(AttemptOutcome::Cancelled.as_str().into());
        }
        let outcome = Outcome {
            id,
            pool,
            state,
            output: if state == TaskState::Succeeded {
                run.output
            } else {
                None
            },
            error: run.error,
            attempts: run.attempts,
            deadline_missed,
        };
        self.retire(&outcome, run.key, run.aliases);
        Some(Finished {
            outcome,
            extra: entry.extra,
            run_extra: run.extra,
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
        if let Some(key) = key {
            self.keys.insert(key.to_string(), outcome.id);
        }
        self.retire(outcome, key.map(str::to_string), Vec::new());
    }

    fn retire(&mut self, outcome: &Outcome, key: Option<String>, aliases: Vec<TaskId>) {
        let id = outcome.id;
        if self.retain == 0 {
            if let Some(key) = key {
                if self.keys.get(&key) == Some(&id) {
                    self.keys.remove(&key);
                }
            }
            for a in aliases {
                self.aliases.remove(&a);
            }
            return;
        }
        if let Some(older) = self.finished.remove(id) {
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
        self.finished
            .insert(id, self.ring_base + self.ring.len() as u64);
        self.retained += 1;
        self.ring.push_back(Retained::Task(Done::of(outcome), key));
        // The aliases follow their original in the ring and leave after it.
        self.ring.extend(aliases.into_iter().map(Retained::Alias));
        while self.retained > self.retain {
            match self.pop_front() {
                Some(Retained::Task(old, key)) => {
                    let old = old.id;
                    self.finished.remove(old);
                    self.retained -= 1;
                    if let Some(key) = key {
                        if self.keys.get(&key) == Some(&old) {
                            self.keys.remove(&key);
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
                ))
            }
        }
    }

    /// The newest `limit` tasks, live or retained, highest id first, as
    /// [`TaskStatus::summary`]s: O(`limit`) lookups, not a scan.
    pub fn recent(&self, core: &Core, limit: usize) -> Vec<TaskStatus> {
        let finished = self.ring.iter().rev().filter_map(|r| match r {
            Retained::Task(done, _) => Some(done.id),
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

/// Live entries by id. The scheduler hands out ids in order and most tasks
/// finish roughly in order, so live ids mostly fall in a window
/// `[base, base + window.len())`: a deque indexed by `id - base`, with no
/// hashing and 8 bytes of overhead per entry. When finished tasks leave the
/// window more than half empty (a long-running task holds its front), the
/// oldest entries move to a map, so the window never keeps finished tasks
/// alive for long.
pub(crate) struct Entries<T> {
    base: u64,
    window: VecDeque<Option<T>>,
    in_window: usize,
    far: FxHashMap<TaskId, T>,
    /// No id above this is in `far`: a new id (past the window, the usual
    /// miss) costs no hash probe.
    far_max: u64,
}

impl<T> Default for Entries<T> {
    fn default() -> Self {
        Entries {
            base: 0,
            window: VecDeque::new(),
            in_window: 0,
            far: FxHashMap::default(),
            far_max: 0,
        }
    }
}

impl<T> Entries<T> {
    /// Adds the entry of a new task; ids only grow.
    pub(crate) fn insert(&mut self, id: TaskId, entry: T) {
        if self.window.is_empty() {
            self.base = id.0;
        }
        let Some(at) = id.0.checked_sub(self.base) else {
            self.put_far(id, entry);
            return;
        };
        let at = at as usize;
        while self.window.len() < at {
            self.window.push_back(None);
        }
        if at < self.window.len() {
            // An id below the window's end: not from the counter.
            match &mut self.window[at] {
                Some(_) => {
                    self.put_far(id, entry);
                }
                slot => {
                    *slot = Some(entry);
                    self.in_window += 1;
                }
            }
            return;
        }
        self.window.push_back(Some(entry));
        self.in_window += 1;
    }

    fn put_far(&mut self, id: TaskId, entry: T) {
        self.far_max = self.far_max.max(id.0);
        self.far.insert(id, entry);
    }

    fn may_be_far(&self, id: TaskId) -> bool {
        id.0 <= self.far_max && !self.far.is_empty()
    }

    fn index(&self, id: TaskId) -> Option<usize> {
        let at = usize::try_from(id.0.checked_sub(self.base)?).ok()?;
        (at < self.window.len() && self.window[at].is_some()).then_some(at)
    }

    pub(crate) fn get(&self, id: TaskId) -> Option<&T> {
        match self.index(id) {
            Some(at) => self.window[at].as_ref(),
            None if !self.may_be_far(id) => None,
            None => self.far.get(&id),
        }
    }

    pub(crate) fn get_mut(&mut self, id: TaskId) -> Option<&mut T> {
        match self.index(id) {
            Some(at) => self.window[at].as_mut(),
            None if !self.may_be_far(id) => None,
            None => self.far.get_mut(&id),
        }
    }

    /// The ids of the newest `limit` live entries, highest first. The
    /// window is at least half full (see `remove`), so this reads about
    /// `2 * limit` of its slots; the far map holds the few old entries.
    pub(crate) fn newest(&self, limit: usize) -> Vec<TaskId> {
        let mut ids: Vec<TaskId> = self
            .window
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, e)| e.is_some())
            .take(limit)
            .map(|(at, _)| TaskId(self.base + at as u64))
            .collect();
        ids.extend(self.far.keys().copied());
        ids.sort_unstable_by(|a, b| b.cmp(a));
        ids.truncate(limit);
        ids
    }

    pub(crate) fn remove(&mut self, id: TaskId) -> Option<T> {
        let Some(at) = self.index(id) else {
            if !self.may_be_far(id) {
                return None;
            }
            return self.far.remove(&id);
        };
        self.in_window -= 1;
        let entry = self.window[at].take();
        while self.window.front().is_some_and(Option::is_none) {
            self.window.pop_front();
            self.base += 1;
        }
        while self.window.len() > 64 && self.in_window * 2 < self.window.len() {
            if let Some(Some(old)) = self.window.pop_front() {
                self.in_window -= 1;
                self.put_far(TaskId(self.base), old);
            }
            self.base += 1;
        }
        entry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(retain: usize) -> Ledger<(), ()> {
        Ledger::new(retain)
    }

    /// Task `id` of the default pool, accepted at `at` (ms).
    fn accept(l: &mut Ledger<(), ()>, id: u64, key: Option<&str>, at: u64) {
        l.accept(
            TaskId(id),
            &PoolName::default(),
            Bytes::new(),
            key,
            (),
            Millis(at),
        );
    }

    fn finish(l: &mut Ledger<(), ()>, id: u64, state: TaskState) -> Outcome {
        l.finish(TaskId(id), PoolName::default(), state, false, Millis(9))
            .expect("live")
            .outcome
    }

    #[test]
    fn an_attempt_stopped_for_its_timeout_is_lost_with_reason_timeout() {
        let mut l = ledger(10);
        accept(&mut l, 1, None, 0);
        l.started(
            TaskId(1),
            1,
            Labels::new(),
            Some("w".into()),
            None,
            Millis(1),
        );
        l.timed_out(TaskId(1), 1);
        // However the stop is reported (embedded: aborted = cancelled;
        // remote: failed or cancelled), it is lost with reason timeout.
        let told = l.ended(
            TaskId(1),
            1,
            AttemptOutcome::Cancelled,
            None,
            None,
            Millis(5),
        );
        assert_eq!(told, AttemptOutcome::Lost);
        l.started(TaskId(1), 2, Labels::new(), None, None, Millis(6));
        let told = l.ended(
            TaskId(1),
            2,
            AttemptOutcome::Succeeded,
            Some(Bytes::from("ok")),
            None,
            Millis(7),
        );
        assert_eq!(told, AttemptOutcome::Succeeded);
        let done = finish(&mut l, 1, TaskState::Succeeded);
        assert_eq!(done.attempts[0].outcome.as_deref(), Some("lost"));
        assert_eq!(done.attempts[0].error.as_deref(), Some(TIMEOUT));
        assert_eq!(done.attempts[0].ended_at, Some(Millis(5)));
        assert_eq!(done.attempts[1].outcome.as_deref(), Some("succeeded"));
        assert_eq!(done.output.as_deref(), Some(&b"ok"[..]));
    }

    #[test]
    fn a_success_after_the_timeout_revoke_still_counts() {
        let mut l = ledger(10);
        accept(&mut l, 1, None, 0);
        l.started(TaskId(1), 1, Labels::new(), None, None, Millis(1));
        l.timed_out(TaskId(1), 1);
        let told = l.ended(
            TaskId(1),
            1,
            AttemptOutcome::Succeeded,
            None,
            None,
            Millis(2),
        );
        assert_eq!(told, AttemptOutcome::Succeeded);
    }

    #[test]
    fn finishing_closes_an_open_attempt_as_cancelled() {
        let mut l = ledger(10);
        accept(&mut l, 3, None, 0);
        l.started(TaskId(3), 1, Labels::new(), None, None, Millis(1));
        let done = finish(&mut l, 3, TaskState::Cancelled);
        assert_eq!(done.attempts[0].outcome.as_deref(), Some("cancelled"));
        assert_eq!(done.attempts[0].ended_at, Some(Millis(9)));
        assert!(!l.is_live(TaskId(3)) && l.is_finished(TaskId(3)));
    }

    #[test]
    fn a_key_is_bound_while_live_and_retained_then_free() {
        let mut l = ledger(2);
        accept(&mut l, 1, Some("k"), 0);
        assert_eq!(l.by_key("k"), Some(TaskId(1)));
        l.alias(TaskId(2), TaskId(1));
        assert_eq!(l.resolve(TaskId(2)), TaskId(1));
        finish(&mut l, 1, TaskState::Succeeded);
        // Retained: the key and the alias still stand for task 1.
        assert_eq!(l.by_key("k"), Some(TaskId(1)));
        assert!(l.outcome(TaskId(2)).is_some());
        l.alias(TaskId(3), TaskId(1));
        for id in [10, 11] {
            accept(&mut l, id, None, 0);
            finish(&mut l, id, TaskState::Succeeded);
        }
        // Two newer outcomes pushed task 1 out, with its key and aliases.
        assert_eq!(l.by_key("k"), None);
        assert!(!l.knows(TaskId(1)) && !l.knows(TaskId(2)) && !l.knows(TaskId(3)));
        assert!(l.knows(TaskId(10)) && l.knows(TaskId(11)));
    }

    #[test]
    fn with_no_retention_a_key_is_free_once_finished() {
        let mut l = ledger(0);
        accept(&mut l, 1, Some("k"), 0);
        l.alias(TaskId(2), TaskId(1));
        finish(&mut l, 1, TaskState::Failed);
        assert_eq!(l.by_key("k"), None);
        assert!(!l.knows(TaskId(1)) && !l.knows(TaskId(2)));
    }

    #[test]
    fn unaccept_forgets_the_task_and_its_key() {
        let mut l = ledger(5);
        accept(&mut l, 4, Some("k"), 0);
        l.unaccept(TaskId(4));
        assert!(!l.knows(TaskId(4)));
        assert_eq!(l.by_key("k"), None);
    }

    #[test]
    fn the_ring_stays_bounded() {
        let mut l = ledger(3);
        for id in 1..=100 {
            accept(&mut l, id, Some(&format!("k{id}")), 0);
            l.alias(TaskId(1000 + id), TaskId(id));
            finish(&mut l, id, TaskState::Succeeded);
        }
        assert_eq!(l.retained, 3);
        assert!(l.keys.len() <= 3 && l.aliases.len() <= 4 && l.ring.len() <= 7);
    }

    fn figures(l: &Ledger<(), ()>) -> crate::metrics::PoolMetrics {
        l.metrics().pools.into_iter().next().expect("one pool")
    }

    #[test]
    fn a_retried_then_succeeded_task_counts_once_submitted_twice_started() {
        let mut l = ledger(10);
        accept(&mut l, 1, None, 1_000);
        l.started(TaskId(1), 1, Labels::new(), None, None, Millis(1_250));
        let failed = AttemptOutcome::Failed { retryable: true };
        l.ended(
            TaskId(1),
            1,
            failed,
            None,
            Some("boom".into()),
            Millis(1_350),
        );
        l.started(TaskId(1), 2, Labels::new(), None, None, Millis(2_000));
        l.ended(
            TaskId(1),
            2,
            AttemptOutcome::Succeeded,
            None,
            None,
            Millis(7_000),
        );
        finish(&mut l, 1, TaskState::Succeeded);
        let m = figures(&l);
        assert_eq!((m.submitted, m.started, m.retried, m.lost), (1, 2, 1, 0));
        assert_eq!((m.succeeded, m.failed, m.cancelled, m.missed), (1, 0, 0, 0));
        // One queue wait (submit → first start), 0.25 s: in le=0.25.
        assert_eq!((m.queue_wait.count, m.queue_wait.sum_ms), (1, 250));
        assert_eq!(m.queue_wait.buckets[2], 1);
        // Two runs: 0.1 s (le=0.1) and 5 s (le=5).
        assert_eq!((m.run.count, m.run.sum_ms), (2, 5_100));
        assert_eq!((m.run.buckets[1], m.run.buckets[6]), (1, 1));
    }

    #[test]
    fn a_lost_attempt_counts_lost_and_its_run() {
        let mut l = ledger(10);
        accept(&mut l, 1, None, 0);
        l.started(TaskId(1), 1, Labels::new(), None, None, Millis(0));
        l.timed_out(TaskId(1), 1);
        l.ended(
            TaskId(1),
            1,
            AttemptOutcome::Cancelled,
            None,
            None,
            Millis(60_000),
        );
        l.started(TaskId(1), 2, Labels::new(), None, None, Millis(61_000));
        l.ended(
            TaskId(1),
            2,
            AttemptOutcome::Lost,
            None,
            None,
            Millis(3_600_001),
        );
        finish(&mut l, 1, TaskState::Failed);
        let m = figures(&l);
        assert_eq!((m.started, m.retried, m.lost, m.failed), (2, 1, 2, 1));
        // 60 s is le=60 (inclusive); just over 3,539 s is le=3600.
        assert_eq!(m.run.buckets[9], 1);
        assert_eq!(m.run.buckets[13], 1);
    }

    #[test]
    fn a_cancel_counts_cancelled_and_closes_the_run() {
        let mut l = ledger(10);
        accept(&mut l, 1, None, 0);
        accept(&mut l, 2, None, 0);
        l.started(TaskId(1), 1, Labels::new(), None, None, Millis(10));
        finish(&mut l, 1, TaskState::Cancelled); // running: closed at 9… (clock ran back)
        finish(&mut l, 2, TaskState::Cancelled); // waiting: no run
        let m = figures(&l);
        assert_eq!((m.submitted, m.started, m.cancelled), (2, 1, 2));
        assert_eq!((m.run.count, m.run.sum_ms), (1, 0));
        assert_eq!(m.queue_wait.count, 1);
    }

    #[test]
    fn a_refused_submission_counts_once_and_dead_lettered() {
        let mut l = ledger(10);
        let pool = PoolName::new("p").unwrap();
        l.accept(TaskId(1), &pool, Bytes::new(), None, (), Millis(0));
        l.unaccept(TaskId(1));
        l.record_outcome(
            &Outcome {
                id: TaskId(1),
                pool,
                state: TaskState::Failed,
                output: None,
                error: Some("refused".into()),
                attempts: Vec::new(),
                deadline_missed: false,
            },
            None,
        );
        let m = figures(&l);
        assert_eq!(
            (m.pool.as_str(), m.submitted, m.failed, m.dead_lettered),
            ("p", 1, 1, 1)
        );
    }
}

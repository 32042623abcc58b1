//! The book of schedules: many [`Schedule`]s with their states, pure (no
//! clock, no I/O), driven by one shell (the embedded scheduler, or the
//! leader for as long as it leads).
//!
//! **Due schedules only.** The book keeps an ordered set of
//! `(next wakeup, name)`; [`Book::step`] pops the due ones and never scans
//! the rest, so 10,000 schedules cost a set lookup per step plus the work
//! of those due. [`Book::next_wakeup`] is the first entry of that set.
//!
//! **Orders.** What the shell carries out comes back as [`Order`]s, in
//! order: `Fire` (submit this task: it carries the tick's idempotency key,
//! `schedule` and `scheduled_at`) and `Cancel` (cancel the run of an
//! earlier tick, for `cancel_previous`). The shell answers each fire with
//! [`Book::accepted`] (the task id) or [`Book::refused`], and each run's
//! end with [`Book::run_ended`]; the book keeps the map from task id to
//! tick, so the shell keeps none.
//!
//! **Choices the issue leaves open**, decided here:
//! - `trigger` starts a run at once whatever the overlap policy, with its
//!   own key `schedule:<name>:trigger:<ms>`; it is not the schedule's
//!   active run, so `skip` does not skip because of it and
//!   `cancel_previous` does not cancel it.
//! - `backfill` takes ticks `from..=to` with `to` not in the future and at
//!   most [`MAX_BACKFILL_TICKS`] of them, applies the overlap policy to
//!   them in order (with `skip` and a live run, all are skipped; with
//!   `allow`, all fire) and leaves `decided_through` alone. A backfilled
//!   tick submits under the tick's own key, so a tick that already fired
//!   (or fires later) still makes one task while the submit path remembers
//!   its key.
//! - A fire whose submission is refused (the pool was removed, a bound)
//!   is recorded with its error and counts as ended: it does not hold the
//!   overlap policy's active slot.
//! - Pausing or resuming first steps the schedule at that instant under
//!   the old setting (fire.rs), so no tick is decided twice or lost.
//! - History is bounded: the last [`HISTORY`] fires, [`PASSED`] skipped
//!   ticks and [`PASSED`] missed ranges per schedule; counters are not.
//!   A missed range's tick count stops at [`MISS_COUNT_CAP`] for cron
//!   (intervals are counted exactly).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::fire::{Decision, Event, ScheduleState};
use super::record::{FireKind, FireRecord, MissedTicks, ScheduleCounters};
use super::spec::{Schedule, ScheduleSpec};
use super::{schedule_key, Cadence};
use crate::core::{excerpt, ErrorCode, Millis, Rejection, TaskId, TaskState};
use crate::metrics::Histogram;
use crate::task::Task;

/// The default limit on the number of schedules.
pub const DEFAULT_MAX_SCHEDULES: usize = 10_000;
/// Fires kept per schedule.
pub const HISTORY: usize = 20;
/// Skipped ticks, and missed ranges, kept per schedule.
pub const PASSED: usize = 20;
/// The most ticks one backfill fires.
pub const MAX_BACKFILL_TICKS: usize = 1_000;
/// The most orders one [`Book::step`] returns; when more are due,
/// `next_wakeup` is already past and the shell steps again.
pub const MAX_ORDERS_PER_STEP: usize = 4_096;
/// Where counting the ticks of a missed cron range stops.
pub const MISS_COUNT_CAP: u64 = 100_000;

/// A refusal of a book operation: a stable code and a message. Refusals
/// change nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BookError {
    /// The code.
    pub code: ErrorCode,
    /// For people.
    pub message: String,
}

impl BookError {
    fn new(code: ErrorCode, message: impl Into<String>) -> BookError {
        BookError {
            code,
            message: message.into(),
        }
    }

    fn not_found(name: &str) -> BookError {
        BookError::new(
            ErrorCode::NOT_FOUND,
            format!("no schedule named {}", excerpt(name)),
        )
    }
}

impl From<Rejection> for BookError {
    fn from(r: Rejection) -> BookError {
        BookError::new(r.code(), r.to_string())
    }
}

/// What the shell is to do.
#[derive(Clone, Debug)]
pub enum Order {
    /// Submit `task` (it carries the idempotency key, `schedule` and
    /// `scheduled_at`); answer with [`Book::accepted`] or [`Book::refused`].
    Fire {
        /// The schedule.
        name: String,
        /// The tick (for a trigger, the instant it was asked).
        tick: Millis,
        /// How it was started.
        kind: FireKind,
        /// The task to submit.
        task: Box<Task>,
    },
    /// Cancel the run of an earlier tick (`cancel_previous`): by task id
    /// when known, else by the tick's idempotency key.
    Cancel {
        /// The schedule.
        name: String,
        /// The tick whose run to cancel.
        tick: Millis,
        /// Its task, if accepted already.
        task: Option<TaskId>,
        /// Its idempotency key.
        key: String,
    },
}

/// One schedule as the leader stores it (JSON): enough to go on after a
/// failover.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSchedule {
    /// As created (with `paused` as it is now).
    pub spec: ScheduleSpec,
    /// The firing state.
    pub state: ScheduleState,
    /// The creator's credential.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// When it was created.
    pub created_at: Millis,
    /// Counters.
    #[serde(default)]
    pub counters: ScheduleCounters,
    /// The recent fires, oldest first.
    #[serde(default)]
    pub history: Vec<FireRecord>,
    /// The recent skipped ticks, oldest first (stored so a leader change
    /// keeps them as it keeps the counters; issue 34).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<Millis>,
    /// The recent missed ranges, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missed: Vec<MissedTicks>,
}

/// One schedule in the book.
#[derive(Clone, Debug)]
pub struct Entry {
    /// As created (with `paused` as it is now).
    pub spec: ScheduleSpec,
    /// Validated.
    pub schedule: Schedule,
    /// The firing state.
    pub state: ScheduleState,
    /// The creator's credential, owner of its tasks.
    pub owner: Option<String>,
    /// When it was created.
    pub created_at: Millis,
    /// Counters.
    pub counters: ScheduleCounters,
    history: VecDeque<FireRecord>,
    skipped: VecDeque<Millis>,
    missed: VecDeque<MissedTicks>,
    wake: Option<Millis>,
}

impl Entry {
    /// The recent fires, oldest first.
    pub fn history(&self) -> impl DoubleEndedIterator<Item = &FireRecord> + '_ {
        self.history.iter()
    }
    /// The recent skipped ticks, oldest first.
    pub fn skipped(&self) -> impl DoubleEndedIterator<Item = &Millis> + '_ {
        self.skipped.iter()
    }
    /// The recent missed ranges, oldest first.
    pub fn missed(&self) -> impl DoubleEndedIterator<Item = &MissedTicks> + '_ {
        self.missed.iter()
    }
    /// The next `n` fire instants (tick plus jitter); none while paused.
    pub fn next_fires(&self, n: usize) -> Vec<Millis> {
        if self.schedule.paused {
            return Vec::new();
        }
        let ticks = self
            .schedule
            .cadence
            .ticks_after(self.state.decided_through, n);
        ticks.into_iter().map(|t| self.schedule.due_at(t)).collect()
    }
    /// The next fire instant.
    pub fn next_fire(&self) -> Option<Millis> {
        self.schedule.next_wakeup(&self.state)
    }
    /// What the leader stores.
    pub fn stored(&self) -> StoredSchedule {
        StoredSchedule {
            spec: self.spec.clone(),
            state: self.state,
            owner: self.owner.clone(),
            created_at: self.created_at,
            counters: self.counters,
            history: self.history.iter().cloned().collect(),
            skipped: self.skipped.iter().copied().collect(),
            missed: self.missed.iter().copied().collect(),
        }
    }

    fn push_fire(&mut self, record: FireRecord) {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(record);
        self.counters.fires += 1;
    }

    fn record_mut(&mut self, tick: Millis, kind: FireKind) -> Option<&mut FireRecord> {
        self.history
            .iter_mut()
            .rev()
            .find(|r| r.tick == tick && r.kind == kind)
    }

    fn fire(&mut self, name: &str, tick: Millis, kind: FireKind, now: Millis) -> Order {
        self.push_fire(FireRecord {
            tick,
            fired_at: now,
            kind,
            task: None,
            outcome: None,
            error: None,
        });
        let mut task = self
            .schedule
            .template
            .task_at(name, tick)
            .scheduled(name, tick);
        if kind == FireKind::Trigger {
            task = task.idempotency_key(format!("schedule:{name}:trigger:{}", tick.0));
        }
        Order::Fire {
            name: name.to_string(),
            tick,
            kind,
            task: Box::new(task),
        }
    }

    /// Carries out one decision of the firing rules.
    fn apply(
        &mut self,
        name: &str,
        d: Decision,
        kind: FireKind,
        now: Millis,
        out: &mut Vec<Order>,
    ) {
        match d {
            Decision::Fire { tick } => out.push(self.fire(name, tick, kind, now)),
            Decision::CancelThenFire { cancel, tick } => {
                let task = self
                    .history
                    .iter()
                    .rev()
                    .find(|r| r.tick == cancel && r.kind != FireKind::Trigger)
                    .and_then(|r| r.task);
                out.push(Order::Cancel {
                    name: name.to_string(),
                    tick: cancel,
                    task,
                    key: schedule_key(name, cancel),
                });
                out.push(self.fire(name, tick, kind, now));
            }
            Decision::Skip { tick } => {
                if self.skipped.len() == PASSED {
                    self.skipped.pop_front();
                }
                self.skipped.push_back(tick);
                self.counters.skipped += 1;
            }
            Decision::Buffer { .. } => {}
            Decision::Miss {
                first,
                until,
                reason,
            } => {
                let ticks = count_ticks(&self.schedule.cadence, first, until);
                if self.missed.len() == PASSED {
                    self.missed.pop_front();
                }
                self.missed.push_back(MissedTicks {
                    first,
                    until,
                    reason,
                    ticks,
                });
                self.counters.missed += ticks;
            }
        }
    }
}

/// The ticks of `cadence` in `first..until` (`first` is a tick).
fn count_ticks(cadence: &Cadence, first: Millis, until: Millis) -> u64 {
    if until <= first {
        return 0;
    }
    match cadence {
        Cadence::Every(d) => (until.0 - 1 - first.0) / d.0 + 1,
        Cadence::Cron { .. } => {
            let mut n = 1;
            let mut t = first;
            while n < MISS_COUNT_CAP {
                match cadence.next_after(t) {
                    Some(next) if next < until => {
                        n += 1;
                        t = next;
                    }
                    _ => break,
                }
            }
            n
        }
    }
}

/// Many schedules, their states and the order in which they come due.
#[derive(Debug)]
pub struct Book {
    limit: usize,
    entries: BTreeMap<String, Entry>,
    wakeups: BTreeSet<(Millis, String)>,
    /// Runs not yet ended: task → (schedule, tick, kind).
    live: HashMap<TaskId, (String, Millis, FireKind)>,
    /// Fire lag of tick fires: tick → task accepted.
    pub lag: Histogram,
}

impl Default for Book {
    fn default() -> Self {
        Book::new(DEFAULT_MAX_SCHEDULES)
    }
}

impl Book {
    /// An empty book holding at most `limit` schedules.
    pub fn new(limit: usize) -> Book {
        Book {
            limit,
            entries: BTreeMap::new(),
            wakeups: BTreeSet::new(),
            live: HashMap::new(),
            lag: Histogram::default(),
        }
    }

    /// How many schedules it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// One schedule.
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.get(name)
    }

    /// Every schedule, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Entry)> + '_ {
        self.entries.iter()
    }

    /// When the first schedule comes due.
    pub fn next_wakeup(&self) -> Option<Millis> {
        self.wakeups.first().map(|(t, _)| *t)
    }

    /// Creates a schedule at `now`: its first tick is the first after
    /// `now`. `INVALID_ARGUMENT`, `ALREADY_EXISTS` or `RESOURCE_EXHAUSTED`
    /// change nothing.
    pub fn create(
        &mut self,
        spec: ScheduleSpec,
        owner: Option<String>,
        now: Millis,
    ) -> Result<&Entry, BookError> {
        let schedule = spec.validate()?;
        if self.entries.contains_key(&schedule.name) {
            return Err(BookError::new(
                ErrorCode::ALREADY_EXISTS,
                format!("a schedule named {} already exists", excerpt(&spec.name)),
            ));
        }
        if self.entries.len() >= self.limit {
            return Err(BookError::new(
                ErrorCode::RESOURCE_EXHAUSTED,
                format!(
                    "the limit of {} schedules is reached (config max_schedules)",
                    self.limit
                ),
            ));
        }
        let stored = StoredSchedule {
            spec,
            state: ScheduleState::new(now),
            owner,
            created_at: now,
            counters: ScheduleCounters::default(),
            history: Vec::new(),
            skipped: Vec::new(),
            missed: Vec::new(),
        };
        let name = schedule.name.clone();
        self.insert(stored, schedule);
        Ok(&self.entries[&name])
    }

    /// Puts back a stored schedule (a successor leader, a restart); ignores
    /// the limit. `INVALID_ARGUMENT` if the stored spec no longer validates
    /// (a zone the tz database dropped), `ALREADY_EXISTS` on a taken name.
    pub fn restore(&mut self, stored: StoredSchedule) -> Result<(), BookError> {
        let schedule = stored.spec.validate()?;
        if self.entries.contains_key(&schedule.name) {
            return Err(BookError::new(
                ErrorCode::ALREADY_EXISTS,
                format!(
                    "a schedule named {} already exists",
                    excerpt(&schedule.name)
                ),
            ));
        }
        self.insert(stored, schedule);
        Ok(())
    }

    fn insert(&mut self, stored: StoredSchedule, schedule: Schedule) {
        let name = schedule.name.clone();
        for r in &stored.history {
            if let (Some(task), None, None) = (r.task, r.outcome, &r.error) {
                self.live.insert(task, (name.clone(), r.tick, r.kind));
            }
        }
        let entry = Entry {
            spec: stored.spec,
            schedule,
            state: stored.state,
            owner: stored.owner,
            created_at: stored.created_at,
            counters: stored.counters,
            history: stored.history.into_iter().collect(),
            skipped: stored
                .skipped
                .into_iter()
                .rev()
                .take(PASSED)
                .rev()
                .collect(),
            missed: stored.missed.into_iter().rev().take(PASSED).rev().collect(),
            wake: None,
        };
        self.entries.insert(name.clone(), entry);
        self.reschedule(&name);
    }

    /// Deletes a schedule (`NOT_FOUND` if none); its runs go on.
    pub fn delete(&mut self, name: &str) -> Result<StoredSchedule, BookError> {
        let entry = self
            .entries
            .remove(name)
            .ok_or_else(|| BookError::not_found(name))?;
        if let Some(w) = entry.wake {
            self.wakeups.remove(&(w, name.to_string()));
        }
        // Its runs go on, but their ends no longer concern a schedule (nor
        // one re-created under the same name).
        self.live.retain(|_, (n, _, _)| n != name);
        Ok(entry.stored())
    }

    /// Pauses (`paused = true`) or resumes a schedule at `now`: first
    /// steps it under its current setting, then swaps. Setting what is
    /// already set changes nothing. The orders are the ticks due by `now`.
    pub fn set_paused(
        &mut self,
        name: &str,
        paused: bool,
        now: Millis,
    ) -> Result<Vec<Order>, BookError> {
        let entry = self
            .entries
            .get(name)
            .ok_or_else(|| BookError::not_found(name))?;
        let mut out = Vec::new();
        if entry.schedule.paused == paused {
            return Ok(out);
        }
        self.handle(name, now, Event::Time, &mut out);
        let entry = self.entries.get_mut(name).expect("checked above");
        entry.schedule.paused = paused;
        entry.spec.paused = paused;
        self.reschedule(name);
        Ok(out)
    }

    /// One run now, outside the tick sequence (see the module docs).
    pub fn trigger(&mut self, name: &str, now: Millis) -> Result<Order, BookError> {
        let entry = self
            .entries
            .get_mut(name)
            .ok_or_else(|| BookError::not_found(name))?;
        Ok(entry.fire(name, now, FireKind::Trigger, now))
    }

    /// Fires each tick in `from..=to` by the overlap policy (see the module
    /// docs). `INVALID_ARGUMENT` for a range ending after `now` or holding
    /// more than [`MAX_BACKFILL_TICKS`] ticks.
    pub fn backfill(
        &mut self,
        name: &str,
        from: Millis,
        to: Millis,
        now: Millis,
    ) -> Result<(Vec<Order>, Vec<Millis>), BookError> {
        let entry = self
            .entries
            .get_mut(name)
            .ok_or_else(|| BookError::not_found(name))?;
        if from > to {
            return Err(BookError::new(
                ErrorCode::INVALID_ARGUMENT,
                "backfill range is empty: from is after to",
            ));
        }
        if to > now {
            return Err(BookError::new(
                ErrorCode::INVALID_ARGUMENT,
                "backfill range ends in the future: its ticks will fire when due",
            ));
        }
        let mut ticks = Vec::new();
        let mut t = entry.schedule.cadence.next_after(from.minus(Millis(1)));
        while let Some(tick) = t.filter(|t| *t <= to) {
            if ticks.len() == MAX_BACKFILL_TICKS {
                return Err(BookError::new(
                    ErrorCode::INVALID_ARGUMENT,
                    format!("backfill range holds more than {MAX_BACKFILL_TICKS} ticks"),
                ));
            }
            ticks.push(tick);
            t = entry.schedule.cadence.next_after(tick);
        }
        let (mut out, mut skipped) = (Vec::new(), Vec::new());
        let last_fired = entry.state.last_fired;
        for tick in ticks {
            let d = entry.schedule.decide(&mut entry.state, tick);
            if let Decision::Skip { tick } = d {
                skipped.push(tick);
            }
            entry.apply(name, d, FireKind::Backfill, now, &mut out);
        }
        entry.state.last_fired = entry.state.last_fired.max(last_fired);
        Ok((out, skipped))
    }

    /// Decides every schedule due by `now` (at most
    /// [`MAX_ORDERS_PER_STEP`] orders).
    pub fn step(&mut self, now: Millis) -> Vec<Order> {
        self.step_touching(now).0
    }

    /// [`Book::step`], also naming every schedule it stepped (their state
    /// changed: a shell that stores schedules writes these).
    pub fn step_touching(&mut self, now: Millis) -> (Vec<Order>, Vec<String>) {
        let mut out = Vec::new();
        let mut touched = Vec::new();
        while out.len() < MAX_ORDERS_PER_STEP {
            match self.wakeups.first() {
                Some((at, _)) if *at <= now => {}
                _ => break,
            }
            let (_, name) = self.wakeups.pop_first().expect("checked");
            if let Some(e) = self.entries.get_mut(&name) {
                e.wake = None;
            }
            self.handle(&name, now, Event::Time, &mut out);
            touched.push(name);
        }
        (out, touched)
    }

    /// The task of a fire was accepted as `task` at `now`.
    pub fn accepted(
        &mut self,
        name: &str,
        tick: Millis,
        kind: FireKind,
        task: TaskId,
        now: Millis,
    ) {
        let Some(entry) = self.entries.get_mut(name) else {
            return;
        };
        if let Some(r) = entry.record_mut(tick, kind) {
            r.task = Some(task);
        }
        if kind == FireKind::Tick {
            self.lag.observe(now.minus(tick));
        }
        self.live.insert(task, (name.to_string(), tick, kind));
    }

    /// The task of a fire was refused: recorded with `error`, and the run
    /// counts as ended.
    pub fn refused(
        &mut self,
        name: &str,
        tick: Millis,
        kind: FireKind,
        error: &str,
        now: Millis,
    ) -> Vec<Order> {
        let mut out = Vec::new();
        let Some(entry) = self.entries.get_mut(name) else {
            return out;
        };
        if let Some(r) = entry.record_mut(tick, kind) {
            r.error = Some(excerpt(error));
        }
        if kind != FireKind::Trigger {
            self.handle(name, now, Event::RunEnded { tick }, &mut out);
        }
        out
    }

    /// A task of a schedule ended with `outcome` at `now` (tasks the book
    /// did not start are ignored). The orders: a buffered tick's fire.
    pub fn run_ended(&mut self, task: TaskId, outcome: TaskState, now: Millis) -> Vec<Order> {
        self.end_run(task, now, |r| r.outcome = Some(outcome))
    }

    /// A run whose task is gone without a known outcome (a successor
    /// found neither the task nor its result): it ends, its record says
    /// why, its outcome stays unknown.
    pub fn run_gone(&mut self, task: TaskId, now: Millis) -> Vec<Order> {
        self.end_run(task, now, |r| {
            r.error = Some("its task's outcome was not found after a leader change".into())
        })
    }

    fn end_run(
        &mut self,
        task: TaskId,
        now: Millis,
        mark: impl FnOnce(&mut FireRecord),
    ) -> Vec<Order> {
        let mut out = Vec::new();
        let Some((name, tick, kind)) = self.live.remove(&task) else {
            return out;
        };
        let Some(entry) = self.entries.get_mut(&name) else {
            return out;
        };
        if let Some(r) = entry
            .history
            .iter_mut()
            .rev()
            .find(|r| r.task == Some(task))
        {
            mark(r);
        }
        if kind != FireKind::Trigger {
            self.handle(&name, now, Event::RunEnded { tick }, &mut out);
        }
        out
    }

    /// The schedule whose live run `task` is.
    pub fn run_of(&self, task: TaskId) -> Option<&str> {
        self.live.get(&task).map(|(name, _, _)| name.as_str())
    }

    /// Per schedule counters and the fire lag, for `/metrics`.
    pub fn metrics(&self) -> crate::metrics::ScheduleMetrics {
        crate::metrics::ScheduleMetrics {
            schedules: self
                .entries
                .iter()
                .map(|(name, e)| crate::metrics::ScheduleFigures {
                    schedule: name.clone(),
                    fires: e.counters.fires,
                    skipped: e.counters.skipped,
                    missed: e.counters.missed,
                })
                .collect(),
            fire_lag: self.lag.clone(),
        }
    }

    /// The runs the book believes live. After [`Book::restore`] a shell
    /// looks each up and reports those that ended while no one led with
    /// [`Book::run_ended`]; otherwise `skip` would wait on them for ever.
    pub fn live_tasks(&self) -> Vec<TaskId> {
        self.live.keys().copied().collect()
    }

    /// Whether any schedule has a live run.
    pub fn has_live_runs(&self) -> bool {
        !self.live.is_empty()
    }

    /// Whether `task` is a live run of a schedule.
    pub fn is_live(&self, task: TaskId) -> bool {
        self.live.contains_key(&task)
    }

    /// Applies the firing rules to one schedule and puts it back in the
    /// wakeup order.
    fn handle(&mut self, name: &str, now: Millis, event: Event, out: &mut Vec<Order>) {
        let Some(entry) = self.entries.get_mut(name) else {
            return;
        };
        let decisions = entry.schedule.handle(&mut entry.state, now, event);
        for d in decisions {
            entry.apply(name, d, FireKind::Tick, now, out);
        }
        self.reschedule(name);
    }

    fn reschedule(&mut self, name: &str) {
        let Some(entry) = self.entries.get_mut(name) else {
            return;
        };
        let next = entry.schedule.next_wakeup(&entry.state);
        if next == entry.wake {
            return;
        }
        if let Some(w) = entry.wake.take() {
            self.wakeups.remove(&(w, name.to_string()));
        }
        if let Some(w) = next {
            self.wakeups.insert((w, name.to_string()));
        }
        entry.wake = next;
    }
}

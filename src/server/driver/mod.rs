//! The leader's shell around the core: workers, leases, payloads and
//! results. Synchronous and I/O-free like the core: it takes [`Input`]s
//! with `now` and queues [`Output`]s (publishes, results to persist) that
//! the async runner in `server/mod.rs` carries out.
//!
//! **One place for state changes.** Every change of scheduling state goes
//! through [`Driver::apply`], which hands the event to the core and carries
//! out the actions. The per-task records live in the [`Ledger`] (shared
//! with embedded); each turn's changed records come out first in
//! [`Driver::take_outputs_into`], and the runner stores them (the journal)
//! before it announces anything of the turn. Every deadline is in
//! [`Driver::next_wakeup`].
//!
//! By concern: `io.rs` (inputs, outputs, settings), `tasks.rs`
//! (submissions, recovery from the journal, refusals, cancels, the core's
//! actions), `workers.rs` (registration and re-attachment, heartbeats,
//! removal, group capacity), `attempts.rs` (lease claims, renewals,
//! outcomes); this file holds the state, timers and views.
//!
//! Groups in the core are the sum of their workers: a group's capacity is
//! the slots of its registered, non-draining workers (a draining worker
//! keeps one slot per attempt it still runs). A `Start{group}` is
//! leased to the worker of that group with the most free slots (ties: the
//! smallest worker id). A worker silent for `worker_timeout` is removed:
//! its capacity leaves the core first, then its attempts are reported
//! lost, so they are retried elsewhere and never handed back to it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::core::{
    Action, AttemptOutcome, Core, ErrorCode, Event, Labels, LeaderInfo, Millis, PoolConfig,
    PoolName, Rejection, RevokeReason, Snapshot, TaskId, TaskState, WorkerInfo,
};
use crate::ledger::Ledger;
use crate::task::{Outcome, Task, TaskStatus};
use crate::wire::{
    self, Ack, AttemptReport, AttemptResult, Deregister, Heartbeat, HeartbeatReply, Lease,
    Register, RegisterReply, Renew, RenewReply, Revoke, RunningAttempt, Subjects, TaskRecord,
    WireError, PROTOCOL_VERSION,
};

mod floor;
mod io;
mod schedules;

pub(crate) use self::io::*;
pub(crate) use self::schedules::{ScheduleOp, ScheduleReply};

/// How long past its time to live a lease decided but not yet sent (its
/// journal record not yet stored) may wait before it counts as lost.
pub(crate) const UNSENT_LEASE_GRACE: Millis = Millis(60_000);

/// The error of an attempt whose worker did not register again with a new
/// leader within the grace period.
const NOT_REATTACHED: &str = "its worker did not re-attach after a leader change";

/// An attempt of an earlier leadership that may still run: its task waits
/// outside the core until the worker re-attaches it or the grace ends.
struct Parked {
    /// Its journal record as read back (written again as it is when due).
    record: TaskRecord,
    spec: crate::core::TaskSpec,
    attempt: u32,
    /// How many of its attempts were preempted (not counted).
    preempted: u32,
    worker: String,
    /// The credential that registered its worker (journaled): only that
    /// credential may re-attach it.
    credential: Option<String>,
    group: Labels,
}

/// The error of an attempt its worker stopped on a revoke other than its
/// task's cancel.
pub(crate) const REVOKED: &str = "revoked";

/// The most slots one worker may offer.
pub(crate) const MAX_SLOTS_PER_WORKER: u32 = 100_000;
/// The longest `Register::instance` accepted.
const MAX_INSTANCE_LEN: usize = 128;

struct WorkerState {
    /// Its id, shared by the driver's indexes (free slots, silence, leases):
    /// a key moved between them costs a count, not an allocation.
    id: Arc<str>,
    /// Where its leases go (`Subjects::lease`), built once.
    lease_subject: String,
    pool: PoolName,
    labels: Labels,
    slots: u32,
    draining: bool,
    last_seen: Millis,
    instance: Option<String>,
    running: BTreeSet<(TaskId, u32)>,
    /// It takes several leases in one message (`Register::lease_batches`).
    lease_batches: bool,
    /// The credential that registered it (auth on).
    credential: Option<String>,
    /// Revokes its heartbeats may still cause in the current heartbeat
    /// interval (at most its slots an interval): a heartbeat listing
    /// attempts this leader does not know costs one revoke each, and a
    /// worker may not turn one message into unbounded work.
    revoke_budget: u32,
    /// When the current interval began.
    budget_from: Millis,
}

impl WorkerState {
    /// What the worker adds to its group's capacity: its slots, or while
    /// draining one per attempt it still runs (those count as busy in the
    /// core; without their slots the group would look full while its
    /// other workers have free slots).
    fn share(&self) -> u64 {
        if self.draining {
            self.running.len() as u64
        } else {
            u64::from(self.slots)
        }
    }

    /// Its key in the group's free index, if it may take a lease.
    fn free_key(&self) -> Option<std::cmp::Reverse<u32>> {
        let free = self
            .slots
            .saturating_sub(u32::try_from(self.running.len()).unwrap_or(u32::MAX));
        (!self.draining && free > 0).then_some(std::cmp::Reverse(free))
    }
}

/// The workers of one group, summed up incrementally.
#[derive(Default)]
struct GroupState {
    workers: u32,
    /// The sum of the members' shares: `u64`, so it never wraps.
    slots: u64,
    /// Members that may take a lease: most free slots first, then id.
    free: BTreeSet<(std::cmp::Reverse<u32>, Arc<str>)>,
}

impl GroupState {
    /// The capacity the core sees (its slots are `u32`: saturating).
    fn capacity(&self) -> u32 {
        u32::try_from(self.slots).unwrap_or(u32::MAX)
    }
}

struct LeaseState {
    attempt: u32,
    worker: Arc<str>,
    expires: Millis,
    /// Re-attached after a leader change: the worker holds the lease of
    /// an earlier epoch, which is accepted for this attempt only.
    reattached: bool,
}

/// The most live tasks [`Driver::catch_up_first`] makes room for ahead.
const MAX_RESERVED: usize = 1 << 20;

/// The leader's state beside the core.
pub(crate) struct Driver {
    core: Core,
    actions: Vec<Action>,
    subjects: Subjects,
    /// `P.events.`: a task's event subject is this and its id
    /// ([`Driver::event_subject`]), without a format per event.
    events_prefix: String,
    epoch: u64,
    settings: Settings,
    workers: BTreeMap<String, WorkerState>,
    /// Per credential: its registered workers and their slots.
    held_by: FxHashMap<String, (u32, u64)>,
    groups: FxHashMap<(PoolName, Labels), GroupState>,
    leases: FxHashMap<TaskId, LeaseState>,
    /// The driver's own timers beside the core's, in `next_wakeup`: lease
    /// expiries, and when each worker's silence passes `worker_timeout`.
    lease_deadlines: BTreeSet<(Millis, TaskId)>,
    silence_deadlines: BTreeSet<(Millis, Arc<str>)>,
    /// The latest `now` the driver was handed.
    now: Millis,
    /// Payloads, attempts, outputs, keys and finished tasks: the same
    /// records as embedded keeps.
    /// (Beside each task: the trace context given at submit.)
    ledger: Ledger<TaskExtra, ()>,
    cancel_on_arrival: FxHashSet<TaskId>,
    /// Tasks whose attempts changed this turn: their records are journaled
    /// before anything of the turn is announced.
    dirty: FxHashSet<TaskId>,
    /// Attempts of earlier leaderships waiting for their workers.
    parked: FxHashMap<TaskId, Parked>,
    /// Until when they wait.
    reattach_until: Millis,
    /// Reading back what earlier leaderships left: registrations wait
    /// (a worker lists its attempts once, so the journal must be read),
    /// and reports on attempts not known yet are answered UNAVAILABLE.
    catching_up: bool,
    deferred: Vec<(Register, Registrant, Responder)>,
    /// Submit-stream sequences of unfinished tasks (finished ones are
    /// dropped when the floor is read, or by a sweep), and the next
    /// sequence not yet seen: together they bound what may be purged.
    live_seqs: floor::LiveSeqs,
    next_unseen: u64,
    out: Vec<Output>,
    /// This leadership's right to act lapsed ([`Driver::step_down`]).
    deposed: bool,
    /// Unattributed refusals by code, and the last few
    /// ([`Input::Unattributed`]).
    refused_unattributed: BTreeMap<String, u64>,
    refused_sample: std::collections::VecDeque<crate::metrics::RefusedSubmission>,
    /// The schedules this leader fires (`schedules.rs`).
    schedules: schedules::Schedules,
    /// Telemetry on: what a live task's trace needs beside the ledger
    /// (`tasks.rs`, [`TraceNotes`]).
    traces: FxHashMap<TaskId, TraceNotes>,
}

/// What a live task's spans need that the ledger does not keep: when it
/// was submitted and why each of its waits began (only with telemetry on).
#[derive(Default)]
struct TraceNotes {
    submitted_at: Millis,
    waits: Vec<(u32, crate::core::WaitReason)>,
}

fn stale(message: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::FAILED_PRECONDITION, message)
}

impl Driver {
    pub(crate) fn new(subjects: Subjects, epoch: u64, settings: Settings, now: Millis) -> Driver {
        let mut core = Core::with_limits(settings.limits);
        let retain = settings.retain_finished;
        let reattach_until = now.plus(settings.reattach_grace);
        let max_schedules = settings.max_schedules;
        for (pool, config) in &settings.pools {
            core.handle(
                now,
                Event::PoolConfigured {
                    pool: pool.clone(),
                    config: config.clone(),
                },
            )
            .expect("pool settings were validated with the config");
        }
        Driver {
            core,
            actions: Vec::new(),
            events_prefix: format!("{}.events.", subjects.prefix()),
            subjects,
            epoch,
            settings,
            workers: BTreeMap::new(),
            held_by: FxHashMap::default(),
            groups: FxHashMap::default(),
            leases: FxHashMap::default(),
            lease_deadlines: BTreeSet::new(),
            silence_deadlines: BTreeSet::new(),
            now,
            ledger: Ledger::new(retain),
            cancel_on_arrival: FxHashSet::default(),
            dirty: FxHashSet::default(),
            parked: FxHashMap::default(),
            reattach_until,
            catching_up: false,
            deferred: Vec::new(),
            live_seqs: floor::LiveSeqs::default(),
            next_unseen: 1,
            out: Vec::new(),
            deposed: false,
            refused_unattributed: BTreeMap::new(),
            refused_sample: Default::default(),
            schedules: schedules::Schedules::new(max_schedules),
            traces: FxHashMap::default(),
        }
    }

    /// Leads under `epoch`: a successor's driver prepared before the
    /// election ended ([`crate::server::successor`]), built with epoch 0,
    /// gets the one it won. Only before [`Input::CaughtUp`]: the epoch is
    /// read by leases, revokes, worker replies and the snapshot, and a
    /// driver still reading back serves no worker.
    pub(crate) fn set_epoch(&mut self, epoch: u64) {
        debug_assert!(self.catching_up && self.workers.is_empty());
        self.epoch = epoch;
    }

    /// This leadership's right to act lapsed: its last stored renewal is
    /// older than the election timeout allows ([`super::election::may_act`],
    /// judged by the runner's clock at the top of a turn), so a successor
    /// may lead already. From now on the driver acts on nothing: inputs
    /// are dropped unanswered (their responders with them), timers are
    /// not looked at (a paused leader would otherwise find every worker
    /// silent and remove it), and nothing queued goes out.
    #[cfg(test)]
    pub(crate) fn step_down(&mut self) {
        self.deposed = true;
        self.out.clear();
        self.dirty.clear();
    }

    /// The leadership could not renew for a while and acted on nothing
    /// (issue 34, finding 14: the NATS node leading the results stream
    /// was lost, and no renewal could be stored until the stream elected
    /// another), and now renewed again: nobody else led meanwhile. What
    /// the pause made look overdue is not: every worker counts as heard
    /// from at `now`, every lease runs at least a time to live from `now`,
    /// and parked attempts wait at least the re-attach grace again (a
    /// worker that gave its attempt up meanwhile stops renewing, and the
    /// lease expires as usual).
    pub(crate) fn forgive_pause(&mut self, now: Millis) {
        let ids: Vec<String> = self.workers.keys().cloned().collect();
        for id in ids {
            self.touch(&id, now);
        }
        let floor = now.plus(self.settings.lease_ttl);
        let late: Vec<TaskId> = self
            .lease_deadlines
            .iter()
            .take_while(|(at, _)| *at < floor)
            .map(|(_, task)| *task)
            .collect();
        for task in late {
            if let Some(mut lease) = self.drop_lease(task) {
                lease.expires = floor;
                self.put_lease(task, lease);
            }
        }
        self.reattach_until = self
            .reattach_until
            .max(now.plus(self.settings.reattach_grace));
    }

    /// Whether [`Driver::step_down`] was called.
    #[cfg(test)]
    pub(crate) fn deposed(&self) -> bool {
        self.deposed
    }

    /// The core's invariants, and that no trace note outlives its task
    /// (simulation and tests).
    #[cfg(test)]
    pub(crate) fn core_invariants(&self) -> Result<(), String> {
        self.core.check_invariants().map_err(|e| e.to_string())?;
        match self.traces.keys().find(|id| !self.ledger.is_live(**id)) {
            Some(id) => Err(format!("trace notes kept for task {id}, which is not live")),
            None => Ok(()),
        }
    }

    /// [`Driver::take_outputs_into`] a new vector (simulation and tests).
    #[cfg(test)]
    pub(crate) fn take_outputs(&mut self) -> Vec<Output> {
        let mut out = Vec::new();
        self.take_outputs_into(&mut out);
        out
    }

    /// Outputs queued so far, oldest first, then the journal records of
    /// the tasks whose attempts changed (one per task, its latest state).
    /// Each call is one turn. Appended to `out`, a
    /// buffer the caller keeps from turn to turn (no vector allocated per
    /// turn).
    pub(crate) fn take_outputs_into(&mut self, out: &mut Vec<Output>) {
        if self.deposed {
            return;
        }
        // First: a run that ended this turn may fire a buffered tick.
        self.schedule_outputs(self.now);
        out.reserve(self.dirty.len() + self.out.len() + 1);
        // Results (and refusals) first: the other outputs as they are, in
        // order (the queue keeps its allocation).
        out.append(&mut self.out);
        let mut dirty = std::mem::take(&mut self.dirty);
        for id in dirty.drain() {
            // A task that finished meanwhile has its result in `out`.
            if !self.ledger.is_live(id) {
                continue;
            }
            let record = match self.ledger.status(&self.core, id) {
                Some(status) => Some(TaskRecord::of_status(status)),
                // Parked (outside the core) until its worker re-attaches
                // it: the record it was read back with, as it is.
                None => self.parked.get(&id).map(|p| p.record.clone()),
            };
            let Some(mut record) = record else {
                continue;
            };
            record.written_at = Some(self.now);
            record.fit(self.settings.max_record_bytes);
            out.push(Output::Persist {
                seq: id.0,
                record,
                dead_letter: None,
            });
        }
        // Kept for its allocation (nothing above marks a task).
        self.dirty = dirty;
    }

    /// Every submission below this stream sequence belongs to a finished
    /// task or a discarded duplicate: once their results are stored, the
    /// stream may purge them.
    pub(crate) fn purge_floor(&mut self) -> u64 {
        let ledger = &self.ledger;
        self.live_seqs
            .first(|seq| ledger.is_live(TaskId(seq)))
            .unwrap_or(self.next_unseen)
            .min(self.next_unseen)
    }

    /// Every submission below this stream sequence has been handed to the
    /// driver: one it does not know (and whose result is not stored) was
    /// dropped ([`Input::Unattributed`]), not waiting to be read.
    pub(crate) fn consumed_below(&self) -> u64 {
        self.next_unseen
    }

    /// When the runner must call [`Driver::housekeeping`] next at the latest.
    pub(crate) fn next_wakeup(&self) -> Option<Millis> {
        let reattach =
            (!self.parked.is_empty() && !self.catching_up).then_some(self.reattach_until);
        let lease = self.lease_deadlines.first().map(|(at, _)| *at);
        // Silent *past* the timeout: removed a millisecond after.
        let silence = self
            .silence_deadlines
            .first()
            .map(|(at, _)| at.plus(Millis(1)));
        let schedules = self.schedules_wakeup();
        [self.core.next_wakeup(), reattach, lease, silence, schedules]
            .into_iter()
            .flatten()
            .min()
    }

    fn put_lease(&mut self, task: TaskId, lease: LeaseState) {
        self.lease_deadlines.insert((lease.expires, task));
        if let Some(old) = self.leases.insert(task, lease) {
            self.lease_deadlines.remove(&(old.expires, task));
        }
    }

    fn drop_lease(&mut self, task: TaskId) -> Option<LeaseState> {
        let lease = self.leases.remove(&task)?;
        self.lease_deadlines.remove(&(lease.expires, task));
        Some(lease)
    }

    /// A worker was heard from at `now`.
    fn touch(&mut self, worker_id: &str, now: Millis) {
        let timeout = self.settings.worker_timeout;
        let Some(w) = self.workers.get_mut(worker_id) else {
            return;
        };
        let old = w.last_seen.plus(timeout);
        w.last_seen = w.last_seen.max(now);
        let new = w.last_seen.plus(timeout);
        if old != new {
            self.silence_deadlines.remove(&(old, w.id.clone()));
            self.silence_deadlines.insert((new, w.id.clone()));
        }
    }

    fn respond<T: serde::Serialize + Replied>(
        &mut self,
        to: Responder,
        result: Result<T, WireError>,
    ) {
        match to {
            Responder::Nats(Some(subject)) => self.out.push(Output::Publish {
                subject,
                body: wire::encode_reply(&result).into(),
            }),
            Responder::Nats(None) => {}
            Responder::Local(id) => self.out.push(Output::Reply {
                id,
                reply: T::wrap(result),
            }),
        }
    }

    /// `Subjects::events(id)`, from the prefix built once.
    fn event_subject(&self, id: TaskId) -> String {
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        let mut n = id.0;
        loop {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        let digits = std::str::from_utf8(&digits[at..]).expect("ASCII digits");
        let mut subject = String::with_capacity(self.events_prefix.len() + digits.len());
        subject.push_str(&self.events_prefix);
        subject.push_str(digits);
        subject
    }

    fn publish<T: serde::Serialize>(&mut self, subject: String, body: &T) {
        self.out.push(Output::Publish {
            subject,
            body: wire::encode(body).into(),
        });
    }

    /// The one place where scheduling state changes: the core applies the
    /// event, then its actions are carried out.
    fn apply(&mut self, now: Millis, event: Event) -> Result<(), Rejection> {
        let mut actions = std::mem::take(&mut self.actions);
        let result = self.core.handle_into(now, event, &mut actions);
        for action in actions.drain(..) {
            self.carry_out(now, action);
        }
        self.actions = actions;
        result
    }

    /// Reads back an earlier leadership's state before serving workers:
    /// until [`Input::CaughtUp`]. `expected`: how many submissions it may
    /// read back (the submit stream's messages), room made for them now.
    pub(crate) fn catch_up_first(&mut self, expected: usize) {
        self.catching_up = true;
        // Bounded: the stream also holds finished tasks above the purge
        // floor, which need no room.
        let room = expected.min(MAX_RESERVED);
        self.core.make_room(room);
        self.ledger.reserve(room);
    }

    pub(crate) fn handle(&mut self, now: Millis, input: Input) {
        if self.deposed {
            return;
        }
        self.now = self.now.max(now);
        match input {
            Input::CaughtUp => {
                if self.catching_up {
                    self.catching_up = false;
                    // The grace runs from now: workers could not re-attach
                    // before.
                    self.reattach_until = now.plus(self.settings.reattach_grace);
                    tracing::info!(parked = self.parked.len(), "journal read; serving workers");
                    for (r, who, to) in std::mem::take(&mut self.deferred) {
                        let result = self.register(now, r, &who);
                        self.respond(to, result);
                    }
                }
            }
            Input::Register(r, who, to) if self.catching_up => {
                const MAX_DEFERRED: usize = 100_000;
                if self.deferred.len() < MAX_DEFERRED {
                    self.deferred.push((r, who, to));
                } else {
                    let e =
                        WireError::new(ErrorCode::UNAVAILABLE, "the leader is reading its journal");
                    self.respond::<RegisterReply>(to, Err(e));
                }
            }
            Input::Submitted { seq, pool, task } => self.submitted(now, seq, pool, task),
            Input::Batch(inputs) => {
                for input in inputs {
                    self.handle(now, input);
                }
            }
            Input::Unattributed { seq, error } => self.unattributed(seq, error),
            Input::Recovered {
                seq,
                pool,
                task,
                record,
            } => self.recovered(now, seq, pool, task, record),
            Input::Register(r, who, to) => {
                let result = self.register(now, r, &who);
                self.respond(to, result);
            }
            Input::Heartbeat(h, to) => {
                let result = self.heartbeat(now, h);
                self.respond(to, result);
            }
            Input::Deregister(d, to) => {
                let result = self.deregister(now, d);
                self.respond(to, result);
            }
            Input::Renew(r, to) => {
                let result = self.renew(now, r);
                self.respond(to, result);
            }
            Input::Outcome(o, to) => {
                // The reply goes out before the leases the freed slot
                // leads to, so the worker counts its slot free first.
                let mark = self.out.len();
                let result = self.outcome(now, o);
                let before_reply = self.out.len();
                self.respond(to, result);
                if self.out.len() == before_reply + 1 && before_reply > mark {
                    let reply = self.out.pop().expect("just pushed");
                    self.out.insert(mark, reply);
                }
            }
            Input::Outcomes(reports, to) => {
                // As for one outcome: the reply before the leases.
                let mark = self.out.len();
                let refused = reports
                    .into_iter()
                    .map(|o| self.outcome(now, o).err())
                    .collect();
                let before_reply = self.out.len();
                self.respond(
                    to,
                    Ok(wire::AttemptReportsReply {
                        v: wire::PROTOCOL_VERSION,
                        refused,
                    }),
                );
                if self.out.len() == before_reply + 1 && before_reply > mark {
                    let reply = self.out.pop().expect("just pushed");
                    self.out.insert(mark, reply);
                }
            }
            Input::Cancel(id, to) => {
                let result = self.cancel(now, id);
                self.respond(to, result);
            }
            Input::CancelOnArrival(id) => {
                if self.core.task(id).is_some() {
                    let _ = self.cancel(now, id);
                } else if !self.ledger.is_finished(id) {
                    self.cancel_on_arrival.insert(id);
                }
            }
            Input::GetTask(id, to) => {
                let status = self.status(id);
                self.respond(to, Ok(status));
            }
            Input::Owner(id, to) => {
                let found = self.ledger.extra(id).and_then(|x| {
                    let pool = self.core.task(id)?.pool.clone();
                    Some((pool, x.owner.clone()))
                });
                self.respond(to, Ok(found));
            }
            Input::Snapshot(to) => {
                let mut snap = self.snapshot(now);
                if let Responder::Nats(_) = to {
                    // One NATS message must carry it: drop workers (then
                    // demand) from the end until it fits; `truncated` says so.
                    let limit = self.settings.max_reply_bytes;
                    snap.trim_to(limit, |s| wire::encode_reply(&Ok::<_, WireError>(s)).len());
                }
                self.respond(to, Ok(snap));
            }
            Input::Metrics(to) => {
                let mut metrics = self.ledger.metrics();
                metrics.server = Some(crate::metrics::ServerMetrics {
                    refused_unattributed: self.refused_unattributed.clone(),
                    refused_sample: self.refused_sample.iter().cloned().collect(),
                    ..Default::default()
                });
                metrics.schedules = self.schedule_metrics();
                self.respond(to, Ok(metrics));
            }
            Input::Schedule(op, to) => self.schedule_request(now, op, to),
            Input::FirePublished {
                name,
                tick,
                kind,
                result,
            } => self.fire_published(now, name, tick, kind, result),
            Input::FinishedBefore { seq, record } => self.bind_finished(seq, record),
            Input::LeasesSent(sent) => {
                let ttl = self.settings.lease_ttl;
                for (task, attempt) in sent {
                    if self.leases.get(&task).is_some_and(|l| l.attempt == attempt) {
                        if let Some(mut lease) = self.drop_lease(task) {
                            lease.expires = now.plus(ttl);
                            self.put_lease(task, lease);
                        }
                    }
                }
            }
            Input::RecentTasks(limit, to) => {
                let mut tasks = self.recent_tasks(limit);
                if let Responder::Nats(_) = to {
                    // One NATS message must carry it; the reply wraps the
                    // list in a few bytes (`{"ok": {"tasks": …}}`).
                    let limit = self.settings.max_reply_bytes.saturating_sub(64);
                    crate::task::trim_list_to(&mut tasks, limit, |t| wire::encode(&t).len());
                }
                self.respond(to, Ok(wire::TaskList { tasks }));
            }
        }
    }

    /// The newest `limit` tasks, live or recently finished, highest id
    /// first, as summaries.
    fn recent_tasks(&self, limit: usize) -> Vec<TaskStatus> {
        self.ledger.recent(&self.core, limit)
    }

    /// Timers of the core, expired leases, silent workers.
    pub(crate) fn housekeeping(&mut self, now: Millis) {
        if self.deposed {
            return;
        }
        self.now = self.now.max(now);
        let _ = self.apply(now, Event::Tick);
        self.end_reattach_grace(now);
        self.step_schedules(now);
        while let Some(&(at, task)) = self.lease_deadlines.first() {
            if at > now {
                break;
            }
            let Some(LeaseState {
                attempt, worker, ..
            }) = self.drop_lease(task)
            else {
                self.lease_deadlines.pop_first();
                continue;
            };
            tracing::info!(task_id = %task, attempt, worker_id = %worker, "lease expired");
            self.release_slot(now, &worker, task, attempt);
            self.lose(now, task, attempt, Some("lease expired".into()));
        }
        let mut silent = Vec::new();
        for (at, id) in &self.silence_deadlines {
            if *at >= now {
                break;
            }
            silent.push(id.clone());
        }
        for id in silent {
            self.remove_worker(now, &id, "silent past worker_timeout");
        }
    }

    // ---- views ------------------------------------------------------------

    pub(crate) fn snapshot(&self, _now: Millis) -> Snapshot {
        let mut snap = self.core.snapshot();
        snap.leader = Some(LeaderInfo {
            id: self.settings.server_id.clone(),
            epoch: self.epoch,
        });
        for pool in &mut snap.pools {
            for group in &mut pool.groups {
                group.workers = self
                    .groups
                    .get(&(pool.name.clone(), group.labels.clone()))
                    .map_or(0, |m| m.workers);
            }
        }
        snap.workers = self
            .workers
            .iter()
            .map(|(id, w)| WorkerInfo {
                id: id.clone(),
                pool: w.pool.clone(),
                labels: w.labels.clone(),
                slots: if w.draining { 0 } else { w.slots },
                busy: w.running.len() as u32,
                last_seen: w.last_seen,
                draining: w.draining,
            })
            .collect();
        snap
    }
}

mod attempts;
mod tasks;
#[cfg(test)]
mod tests;
mod workers;

//! The leader's shell around the core: workers, leases, payloads and
//! results. Synchronous and I/O-free like the core: it takes [`Input`]s
//! with `now` and queues [`Output`]s (publishes, results to persist) that
//! the async runner in `server/mod.rs` carries out.
//!
//! **One place for state changes.** Every change of scheduling state goes
//! through [`Driver::apply`], which hands the event to the core and carries
//! out the actions. That is where the HA work will make events durable
//! (append to a log before acting) and fence them by epoch.
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
use tokio::sync::oneshot;

use crate::core::{
    Action, AttemptOutcome, Core, ErrorCode, Event, Labels, LeaderInfo, Millis, PoolConfig,
    PoolName, Rejection, RevokeReason, Snapshot, TaskId, TaskState, WorkerInfo,
};
use crate::ledger::Ledger;
use crate::task::{Outcome, Task, TaskStatus};
use crate::wire::{
    self, Ack, AttemptReport, AttemptResult, Deregister, Heartbeat, HeartbeatReply, Lease,
    Register, RegisterReply, Renew, RenewReply, Revoke, RunningAttempt, Subjects, TaskEvent,
    TaskRecord, WireError, PROTOCOL_VERSION,
};

/// Where a reply goes: a NATS reply subject, or a local caller (HTTP).
pub(crate) enum Responder<T> {
    /// Publish the encoded reply here (if the request had a reply subject).
    Nats(Option<String>),
    /// Hand the result to a local caller.
    Local(oneshot::Sender<Result<T, WireError>>),
}

/// Something the driver must react to.
pub(crate) enum Input {
    /// A message of the submit stream, decoded (or refused) by the consumer.
    Submitted {
        seq: u64,
        pool: PoolName,
        task: Result<Task, WireError>,
    },
    /// A submission whose task an earlier leadership started: its journal
    /// record says which attempts ran, and which one may still run.
    Recovered {
        seq: u64,
        pool: PoolName,
        task: Result<Task, WireError>,
        record: TaskRecord,
    },
    /// The consumer delivered every submission stored before this
    /// leadership began: the journal is read.
    CaughtUp,
    Register(Register, Responder<RegisterReply>),
    Heartbeat(Heartbeat, Responder<HeartbeatReply>),
    Deregister(Deregister, Responder<Ack>),
    Renew(Renew, Responder<RenewReply>),
    Outcome(AttemptReport, Responder<Ack>),
    Cancel(TaskId, Responder<Ack>),
    /// A cancel for a task accepted by the stream but not consumed yet.
    CancelOnArrival(TaskId),
    GetTask(TaskId, Responder<Option<TaskStatus>>),
    Snapshot(Responder<Snapshot>),
}

/// Something the runner must do. Writes (`Persist`) and announcements
/// (`Publish`, `Reply`) of one turn are carried out in that order: nobody
/// hears of a state change before it is stored.
pub(crate) enum Output {
    /// Publish on core NATS.
    Publish { subject: String, body: Bytes },
    /// Store a task's record under its sequence in the results bucket (the
    /// journal): a live task's attempts so far, or a finished task's result
    /// (then its submission may be purged). A refused submission is first
    /// copied to the dead-letter stream with its reason.
    Persist {
        seq: u64,
        record: TaskRecord,
        dead_letter: Option<WireError>,
    },
    /// Drop a submission that duplicated another task (no result kept).
    Discard { seq: u64 },
    /// Hand a result to a local caller (HTTP).
    Reply(Box<dyn FnOnce() + Send>),
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Output::Publish { subject, body } => {
                write!(f, "Publish({subject}, {} bytes)", body.len())
            }
            Output::Persist { seq, record, .. } => write!(f, "Persist({seq}, {})", record.state),
            Output::Discard { seq } => write!(f, "Discard({seq})"),
            Output::Reply(_) => f.write_str("Reply"),
        }
    }
}

/// Timing and limits.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub server_id: String,
    pub lease_ttl: Millis,
    pub worker_timeout: Millis,
    pub heartbeat_interval: Millis,
    pub max_payload_bytes: usize,
    /// The largest reply that fits in one NATS message.
    pub max_reply_bytes: usize,
    pub retain_finished: usize,
    pub pools: Vec<(PoolName, PoolConfig)>,
    pub max_workers: usize,
    pub limits: crate::core::Limits,
    /// After a leader change, how long an attempt the journal says runs
    /// waits for its worker to register again before it counts as lost.
    pub reattach_grace: Millis,
}

/// The error of an attempt whose worker did not register again with a new
/// leader within the grace period.
const NOT_REATTACHED: &str = "its worker did not re-attach after a leader change";

/// An attempt of an earlier leadership that may still run: its task waits
/// outside the core until the worker re-attaches it or the grace ends.
struct Parked {
    spec: crate::core::TaskSpec,
    attempt: u32,
    worker: String,
    group: Labels,
}

/// The most slots one worker may offer.
pub(crate) const MAX_SLOTS_PER_WORKER: u32 = 100_000;
/// The longest `Register::instance` accepted.
const MAX_INSTANCE_LEN: usize = 128;

struct WorkerState {
    pool: PoolName,
    labels: Labels,
    slots: u32,
    draining: bool,
    last_seen: Millis,
    instance: Option<String>,
    running: BTreeSet<(TaskId, u32)>,
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
    free: BTreeSet<(std::cmp::Reverse<u32>, String)>,
}

impl GroupState {
    /// The capacity the core sees (its slots are `u32`: saturating).
    fn capacity(&self) -> u32 {
        u32::try_from(self.slots).unwrap_or(u32::MAX)
    }
}

struct LeaseState {
    attempt: u32,
    worker: String,
    expires: Millis,
    /// Re-attached after a leader change: the worker holds the lease of
    /// an earlier epoch, which is accepted for this attempt only.
    reattached: bool,
}

/// The leader's state beside the core.
pub(crate) struct Driver {
    core: Core,
    actions: Vec<Action>,
    subjects: Subjects,
    epoch: u64,
    settings: Settings,
    workers: BTreeMap<String, WorkerState>,
    groups: FxHashMap<(PoolName, Labels), GroupState>,
    leases: FxHashMap<TaskId, LeaseState>,
    /// Payloads, attempts, outputs, keys and finished tasks: the same
    /// records as embedded keeps.
    ledger: Ledger<(), ()>,
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
    deferred: Vec<(Register, Responder<RegisterReply>)>,
    /// Submit-stream sequences of unfinished tasks, and the next sequence
    /// not yet seen: together they bound what may be purged.
    live_seqs: BTreeSet<u64>,
    next_unseen: u64,
    out: Vec<Output>,
}

fn stale(message: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::FAILED_PRECONDITION, message)
}

impl Driver {
    pub(crate) fn new(subjects: Subjects, epoch: u64, settings: Settings, now: Millis) -> Driver {
        let mut core = Core::with_limits(settings.limits);
        let retain = settings.retain_finished;
        let reattach_until = now.plus(settings.reattach_grace);
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
            subjects,
            epoch,
            settings,
            workers: BTreeMap::new(),
            groups: FxHashMap::default(),
            leases: FxHashMap::default(),
            ledger: Ledger::new(retain),
            cancel_on_arrival: FxHashSet::default(),
            dirty: FxHashSet::default(),
            parked: FxHashMap::default(),
            reattach_until,
            catching_up: false,
            deferred: Vec::new(),
            live_seqs: BTreeSet::new(),
            next_unseen: 1,
            out: Vec::new(),
        }
    }

    /// Outputs queued so far, oldest first, after the journal records of
    /// the tasks whose attempts changed (one per task, its latest state).
    pub(crate) fn take_outputs(&mut self) -> Vec<Output> {
        let mut out = Vec::with_capacity(self.dirty.len() + self.out.len());
        for id in self.dirty.drain() {
            // A task that finished meanwhile has its result in `out`.
            if !self.ledger.is_live(id) {
                continue;
            }
            if let Some(status) = self.ledger.status(&self.core, id) {
                out.push(Output::Persist {
                    seq: id.0,
                    record: TaskRecord::of_status(status),
                    dead_letter: None,
                });
            }
        }
        out.append(&mut self.out);
        out
    }

    /// Every submission below this stream sequence belongs to a finished
    /// task or a discarded duplicate: once their results are stored, the
    /// stream may purge them.
    pub(crate) fn purge_floor(&self) -> u64 {
        self.live_seqs
            .first()
            .copied()
            .unwrap_or(self.next_unseen)
            .min(self.next_unseen)
    }

    /// When the runner must call [`Driver::housekeeping`] next at the latest.
    pub(crate) fn next_wakeup(&self) -> Option<Millis> {
        let core = self.core.next_wakeup();
        if self.parked.is_empty() || self.catching_up {
            return core;
        }
        Some(core.map_or(self.reattach_until, |c| c.min(self.reattach_until)))
    }

    fn respond<T: serde::Serialize + Send + 'static>(
        &mut self,
        to: Responder<T>,
        result: Result<T, WireError>,
    ) {
        match to {
            Responder::Nats(Some(subject)) => self.out.push(Output::Publish {
                subject,
                body: wire::encode_reply(&result).into(),
            }),
            Responder::Nats(None) => {}
            Responder::Local(tx) => self.out.push(Output::Reply(Box::new(move || {
                let _ = tx.send(result);
            }))),
        }
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
    /// until [`Input::CaughtUp`].
    pub(crate) fn catch_up_first(&mut self) {
        self.catching_up = true;
    }

    pub(crate) fn handle(&mut self, now: Millis, input: Input) {
        match input {
            Input::CaughtUp => {
                if self.catching_up {
                    self.catching_up = false;
                    // The grace runs from now: workers could not re-attach
                    // before.
                    self.reattach_until = now.plus(self.settings.reattach_grace);
                    tracing::info!(parked = self.parked.len(), "journal read; serving workers");
                    for (r, to) in std::mem::take(&mut self.deferred) {
                        let result = self.register(now, r);
                        self.respond(to, result);
                    }
                }
            }
            Input::Register(r, to) if self.catching_up => {
                const MAX_DEFERRED: usize = 100_000;
                if self.deferred.len() < MAX_DEFERRED {
                    self.deferred.push((r, to));
                } else {
                    let e =
                        WireError::new(ErrorCode::UNAVAILABLE, "the leader is reading its journal");
                    self.respond(to, Err(e));
                }
            }
            Input::Submitted { seq, pool, task } => self.submitted(now, seq, pool, task),
            Input::Recovered {
                seq,
                pool,
                task,
                record,
            } => self.recovered(now, seq, pool, task, record),
            Input::Register(r, to) => {
                let result = self.register(now, r);
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
        }
    }

    // ---- tasks ------------------------------------------------------------

    fn submitted(&mut self, now: Millis, seq: u64, pool: PoolName, task: Result<Task, WireError>) {
        let id = TaskId(seq);
        self.next_unseen = self.next_unseen.max(seq + 1);
        if self.ledger.knows(id) {
            return; // a redelivery after a consumer restart
        }
        let spec = task.and_then(|t| {
            let payload = t.payload().clone();
            let key = t.key().map(str::to_string);
            t.to_spec(id, self.settings.max_payload_bytes)
                .map(|spec| (spec, payload, key))
                .map_err(WireError::from)
        });
        if let Ok((_, _, Some(key))) = &spec {
            if let Some(original) = self.ledger.by_key(key) {
                // The same idempotency key as a task we hold: this is that
                // task (JetStream's Nats-Msg-Id window may have passed).
                tracing::info!(task_id = %id, original = %original, "duplicate idempotency key");
                self.ledger.alias(id, original);
                self.out.push(Output::Discard { seq });
                return;
            }
        }
        let (spec, payload, key) = match spec {
            Ok(x) => x,
            Err(e) => {
                self.refuse_submission(now, id, pool, e);
                return;
            }
        };
        let fixed = spec.fixed_start.is_some();
        let spec_pool = spec.pool.clone();
        // Known before the core answers: a Start it returns reads the payload.
        self.ledger.accept(id, payload, key.as_deref(), ());
        if let Err(e) = self.apply(now, Event::Submitted(spec)) {
            // A limit or a time too far ahead: refused like a malformed
            // submission (recorded failed, dead-lettered), never left queued.
            self.ledger.unaccept(id);
            self.refuse_submission(now, id, spec_pool, e.into());
            return;
        }
        let live = self.ledger.is_live(id);
        if live {
            self.live_seqs.insert(seq);
        }
        tracing::debug!(task_id = %id, "task accepted");
        if live && self.core.task(id).is_some_and(|v| v.attempts == 0) {
            let state = if fixed {
                TaskState::Scheduled
            } else {
                TaskState::Queued
            };
            self.event(now, id, state, 0, None, None, None, None);
        }
        if self.cancel_on_arrival.remove(&id) {
            let _ = self.cancel(now, id);
        }
    }

    /// A task an earlier leadership started. Its attempts come back into
    /// the ledger; an attempt still open waits (parked, outside the core)
    /// for its worker to re-attach it, until `reattach_until`; otherwise
    /// the task waits for its next attempt. The earlier leader accepted
    /// the submission, so its key is not checked again.
    fn recovered(
        &mut self,
        now: Millis,
        seq: u64,
        pool: PoolName,
        task: Result<Task, WireError>,
        record: TaskRecord,
    ) {
        let id = TaskId(seq);
        let (Ok(task), Some(last)) = (&task, record.attempts.last()) else {
            return self.submitted(now, seq, pool, task);
        };
        self.next_unseen = self.next_unseen.max(seq + 1);
        if self.ledger.knows(id) {
            return;
        }
        let spec = match task.to_spec(id, self.settings.max_payload_bytes) {
            Ok(spec) => spec,
            Err(e) => return self.refuse_submission(now, id, pool, e.into()),
        };
        let (attempt, open) = (last.attempt, last.outcome.is_none());
        let running_on = last.worker.clone().zip(Some(last.group.clone()));
        self.ledger
            .accept(id, task.payload().clone(), task.key(), ());
        self.ledger.restore(id, record.attempts, record.error);
        self.live_seqs.insert(seq);
        tracing::info!(task_id = %id, attempts = attempt, open, "task recovered from the journal");
        if open {
            match running_on {
                // While catching up the grace has not started yet (it
                // runs from CaughtUp): a long journal read must not count
                // the attempts read last as lost before any worker could
                // register.
                Some((worker, group)) if self.catching_up || now < self.reattach_until => {
                    self.parked.insert(
                        id,
                        Parked {
                            spec,
                            attempt,
                            worker,
                            group,
                        },
                    );
                    return;
                }
                _ => {
                    self.ended(
                        id,
                        attempt,
                        AttemptOutcome::Lost,
                        None,
                        Some(NOT_REATTACHED.into()),
                        now,
                    );
                }
            }
        }
        self.resume_waiting(now, spec, attempt);
    }

    /// A recovered task waits for attempt `attempts + 1`.
    fn resume_waiting(&mut self, now: Millis, spec: crate::core::TaskSpec, attempts: u32) {
        let (id, pool) = (spec.id, spec.pool.clone());
        let event = Event::Recovered {
            spec,
            attempts,
            running: None,
        };
        if let Err(e) = self.apply(now, event) {
            self.ledger.unaccept(id);
            self.live_seqs.remove(&id.0);
            self.refuse_submission(now, id, pool, e.into());
        }
    }

    /// The grace is over: attempts not re-attached are lost, their tasks
    /// wait for their next attempt.
    fn end_reattach_grace(&mut self, now: Millis) {
        if self.parked.is_empty() || self.catching_up || now < self.reattach_until {
            return;
        }
        let mut parked: Vec<(TaskId, Parked)> = self.parked.drain().collect();
        parked.sort_by_key(|(id, _)| *id);
        for (id, p) in parked {
            tracing::info!(task_id = %id, attempt = p.attempt, worker_id = %p.worker, "attempt lost: its worker did not re-attach");
            self.ended(
                id,
                p.attempt,
                AttemptOutcome::Lost,
                None,
                Some(NOT_REATTACHED.into()),
                now,
            );
            self.resume_waiting(now, p.spec, p.attempt);
        }
    }

    /// Whether `attempt` of `task` waits for `worker` to re-attach it.
    fn is_parked(&self, worker_id: &str, task: TaskId, attempt: u32) -> bool {
        self.parked
            .get(&task)
            .is_some_and(|p| p.attempt == attempt && p.worker == worker_id)
    }

    /// A submission that cannot run: recorded as a failed task with the
    /// reason (so `task` answers and the stream can drop it) and copied to
    /// the dead-letter stream. Never retried: the same bytes would be
    /// refused again.
    pub(crate) fn refuse_submission(
        &mut self,
        now: Millis,
        id: TaskId,
        pool: PoolName,
        e: WireError,
    ) {
        tracing::info!(task_id = %id, pool = %pool, code = %e.code, error = %e.message, "submission refused");
        let outcome = Arc::new(Outcome {
            id,
            pool,
            state: TaskState::Failed,
            output: None,
            error: Some(format!("submission refused: {} [{}]", e.message, e.code)),
            attempts: Vec::new(),
            deadline_missed: false,
        });
        self.ledger.record_outcome(outcome.clone(), None);
        self.record_finished(now, &outcome, Some(e));
    }

    fn cancel(&mut self, now: Millis, id: TaskId) -> Result<Ack, WireError> {
        let id = self.ledger.resolve(id);
        if self.ledger.is_finished(id) {
            return Err(Rejection::AlreadyFinished(id).into());
        }
        self.apply(now, Event::CancelRequested(id))?;
        Ok(Ack::default())
    }

    /// A live or recently finished task; `None` if unknown here.
    pub(crate) fn status(&self, id: TaskId) -> Option<TaskStatus> {
        self.ledger.status(&self.core, id)
    }

    #[allow(clippy::too_many_arguments)]
    fn event(
        &mut self,
        now: Millis,
        id: TaskId,
        state: TaskState,
        attempt: u32,
        group: Option<Labels>,
        worker: Option<String>,
        output: Option<Bytes>,
        error: Option<String>,
    ) {
        let subject = self.subjects.events(id);
        self.publish(
            subject,
            &TaskEvent {
                v: PROTOCOL_VERSION,
                task_id: id,
                state,
                attempt,
                group,
                worker,
                output,
                error,
                at: now,
            },
        );
    }

    /// Announces a finished task (recorded in the ledger) and has its
    /// result stored.
    fn record_finished(&mut self, now: Millis, done: &Outcome, dead_letter: Option<WireError>) {
        let last = done.attempts.last();
        self.event(
            now,
            done.id,
            done.state,
            done.attempts.len() as u32,
            last.map(|a| a.group.clone()),
            last.and_then(|a| a.worker.clone()),
            done.output.clone(),
            done.error.clone(),
        );
        self.out.push(Output::Persist {
            seq: done.id.0,
            record: TaskRecord::of_outcome(done),
            dead_letter,
        });
    }

    fn carry_out(&mut self, now: Millis, action: Action) {
        match action {
            Action::Start {
                task,
                attempt,
                group,
            } => {
                let pool = self.core.group_pool(group).clone();
                let labels = self.core.group_labels(group).clone();
                let Some(worker_id) = self.pick_worker(&pool, &labels) else {
                    // Cannot happen while group capacity is the sum of its
                    // workers' free slots; stay safe if it does.
                    tracing::error!(task_id = %task, pool = %pool, group = %labels, "no worker for a start; counting the attempt lost");
                    let _ = self.apply(
                        now,
                        Event::AttemptEnded {
                            task,
                            attempt,
                            outcome: AttemptOutcome::Lost,
                        },
                    );
                    return;
                };
                let Some(entry) = self.ledger.started(
                    task,
                    attempt,
                    labels.clone(),
                    Some(worker_id.clone()),
                    now,
                ) else {
                    return;
                };
                let payload = entry.payload.clone();
                self.dirty.insert(task);
                let lease = Lease {
                    v: PROTOCOL_VERSION,
                    task_id: task,
                    attempt,
                    pool,
                    group: labels.clone(),
                    payload,
                    ttl: self.settings.lease_ttl,
                    epoch: self.epoch,
                };
                self.update_worker(now, &worker_id, |w| {
                    w.running.insert((task, attempt));
                });
                self.leases.insert(
                    task,
                    LeaseState {
                        attempt,
                        worker: worker_id.clone(),
                        expires: now.plus(self.settings.lease_ttl),
                        reattached: false,
                    },
                );
                tracing::debug!(task_id = %task, attempt, worker_id = %worker_id, group = %labels, "attempt leased");
                self.publish(self.subjects.lease(&worker_id), &lease);
                self.event(
                    now,
                    task,
                    TaskState::Running,
                    attempt,
                    Some(labels),
                    Some(worker_id),
                    None,
                    None,
                );
            }
            Action::Revoke {
                task,
                attempt,
                reason,
                ..
            } => {
                if reason == RevokeReason::Timeout {
                    self.ledger.timed_out(task, attempt);
                }
                if let Some(lease) = self.leases.get(&task) {
                    if lease.attempt == attempt {
                        let subject = self.subjects.revoke(&lease.worker);
                        tracing::debug!(task_id = %task, attempt, worker_id = %lease.worker, ?reason, "attempt revoked");
                        self.publish(
                            subject,
                            &Revoke {
                                v: PROTOCOL_VERSION,
                                task_id: task,
                                attempt,
                                epoch: self.epoch,
                                reason,
                            },
                        );
                    }
                }
            }
            Action::RetryAt { task, attempt, at } => {
                tracing::debug!(task_id = %task, attempt, at = at.0, "retry scheduled");
                let error = self.ledger.last_error(task).map(str::to_string);
                self.event(
                    now,
                    task,
                    TaskState::Queued,
                    attempt - 1,
                    None,
                    None,
                    None,
                    error,
                );
            }
            Action::Finished {
                task,
                pool,
                state,
                attempts: _,
                deadline_missed,
            } => {
                // A running attempt of a cancelled task was revoked and ends
                // with it (the ledger closes it): the worker's late report
                // finds no task to update.
                let Some(done) = self.ledger.finish(task, pool, state, deadline_missed, now) else {
                    return;
                };
                self.live_seqs.remove(&task.0);
                tracing::info!(task_id = %task, state = %state, attempts = done.outcome.attempts.len(), "task finished");
                self.record_finished(now, &done.outcome, None);
            }
        }
    }

    // ---- workers ----------------------------------------------------------

    /// The worker of the group with the most free slots (ties: the smallest
    /// id): the first entry of the group's free index, O(log workers).
    fn pick_worker(&self, pool: &PoolName, labels: &Labels) -> Option<String> {
        let group = self.groups.get(&(pool.clone(), labels.clone()))?;
        group.free.first().map(|(_, id)| id.clone())
    }

    /// Changes a worker with `change`, keeping its group's slot total and
    /// free index right, and tells the core the group's new capacity if it
    /// changed. Every change of a worker's slots, running attempts or
    /// draining goes through here: O(log workers), never a scan.
    fn update_worker(
        &mut self,
        now: Millis,
        worker_id: &str,
        change: impl FnOnce(&mut WorkerState),
    ) {
        let Some(w) = self.workers.get_mut(worker_id) else {
            return;
        };
        let (old_share, old_key) = (w.share(), w.free_key());
        change(w);
        let (new_share, new_key) = (w.share(), w.free_key());
        let key = (w.pool.clone(), w.labels.clone());
        let Some(group) = self.groups.get_mut(&key) else {
            return;
        };
        if old_key != new_key {
            if let Some(k) = old_key {
                group.free.remove(&(k, worker_id.to_string()));
            }
            if let Some(k) = new_key {
                group.free.insert((k, worker_id.to_string()));
            }
        }
        if old_share != new_share {
            group.slots = group.slots - old_share + new_share;
            let slots = group.capacity();
            self.set_capacity(now, &key.0, &key.1, slots);
        }
    }

    /// Tells the core a group's capacity. Registration checked the pool and
    /// labels, so a refusal here is a bug: logged, never a panic.
    fn set_capacity(&mut self, now: Millis, pool: &PoolName, labels: &Labels, slots: u32) {
        let event = Event::CapacitySet {
            pool: pool.clone(),
            labels: labels.clone(),
            slots,
        };
        if let Err(e) = self.apply(now, event) {
            tracing::error!(pool = %pool, group = %labels, error = %e, "capacity refused by the core");
        }
    }

    /// An attempt no longer runs on `worker_id`. A draining worker's
    /// capacity shrinks with it, before the core hears that the attempt
    /// ended, so the freed slot is not offered to a waiter.
    fn release_slot(&mut self, now: Millis, worker_id: &str, task: TaskId, attempt: u32) {
        self.update_worker(now, worker_id, |w| {
            w.running.remove(&(task, attempt));
        });
    }

    fn register(&mut self, now: Millis, r: Register) -> Result<RegisterReply, WireError> {
        wire::validate_worker_id(&r.worker_id)?;
        r.labels.validate()?;
        if r.slots == 0 || r.slots > MAX_SLOTS_PER_WORKER {
            return Err(WireError::new(
                ErrorCode::INVALID_ARGUMENT,
                format!(
                    "slots must be between 1 and {MAX_SLOTS_PER_WORKER}, not {}",
                    r.slots
                ),
            ));
        }
        if let Some(instance) = &r.instance {
            if instance.len() > MAX_INSTANCE_LEN {
                return Err(WireError::new(
                    ErrorCode::INVALID_ARGUMENT,
                    format!("instance is longer than {MAX_INSTANCE_LEN} bytes"),
                ));
            }
        }
        if let Some(w) = self.workers.get(&r.worker_id) {
            let same_process = r.instance.is_some() && w.instance == r.instance;
            if !same_process {
                // Alive (it would have been removed after worker_timeout of
                // silence): a second process must not take over its id.
                return Err(WireError::new(
                    ErrorCode::ALREADY_EXISTS,
                    format!(
                        "worker id {} is held by another live process (last heard {} ms ago); \
                         worker ids must be unique — it is free again once that process \
                         deregisters or stays silent for worker_timeout",
                        r.worker_id,
                        now.0.saturating_sub(w.last_seen.0)
                    ),
                ));
            }
            if w.pool == r.pool && w.labels == r.labels && w.slots == r.slots {
                // The same process again (a retried request): nothing
                // changes, and the reply names again what it listed and
                // this leader counts (the first reply may have come after
                // the worker stopped waiting; an empty list would make it
                // stop attempts this leader re-attached).
                let adopted = r
                    .running
                    .iter()
                    .filter(|a| w.running.contains(&(a.task_id, a.attempt)))
                    .copied()
                    .collect();
                self.update_worker(now, &r.worker_id, |w| w.last_seen = now);
                let mut reply = self.register_reply();
                reply.adopted = adopted;
                return Ok(reply);
            }
            // The same process with new settings: what it ran is lost.
            self.remove_worker(now, &r.worker_id, "registered again");
        }
        self.check_pool(&r.pool)?;
        if self.workers.len() >= self.settings.max_workers {
            return Err(WireError::new(
                ErrorCode::RESOURCE_EXHAUSTED,
                format!("{} workers are registered, the limit", self.workers.len()),
            ));
        }
        tracing::info!(worker_id = %r.worker_id, pool = %r.pool, group = %r.labels, slots = r.slots, "worker registered");
        let key = (r.pool.clone(), r.labels.clone());
        let group = self.groups.entry(key).or_default();
        group.workers += 1;
        self.workers.insert(
            r.worker_id.clone(),
            WorkerState {
                pool: r.pool,
                labels: r.labels,
                slots: 0,
                draining: false,
                last_seen: now,
                instance: r.instance,
                running: BTreeSet::new(),
            },
        );
        let adopted = self.reattach(now, &r.worker_id, &r.running, r.slots);
        let slots = r.slots;
        self.update_worker(now, &r.worker_id, |w| w.slots = slots);
        let mut reply = self.register_reply();
        reply.adopted = adopted;
        Ok(reply)
    }

    /// A worker registering with a new leader lists what it still runs:
    /// the attempts the journal says it runs (parked) are re-attached —
    /// running again in the core, in its group, leased to it — before its
    /// slots are offered, so nothing else takes them. The rest it stops.
    /// At most `slots` attempts; the worker has no share yet.
    fn reattach(
        &mut self,
        now: Millis,
        worker_id: &str,
        running: &[RunningAttempt],
        slots: u32,
    ) -> Vec<RunningAttempt> {
        let mut adopted = Vec::new();
        let Some(w) = self.workers.get(worker_id) else {
            return adopted;
        };
        let (pool, labels) = (w.pool.clone(), w.labels.clone());
        let base = self
            .groups
            .get(&(pool.clone(), labels.clone()))
            .map_or(0, |g| g.slots);
        for a in running.iter().take(slots as usize) {
            let fits = self.parked.get(&a.task_id).is_some_and(|p| {
                p.attempt == a.attempt
                    && p.worker == worker_id
                    && p.group == labels
                    && p.spec.pool == pool
            });
            if !fits {
                continue;
            }
            let p = self.parked.remove(&a.task_id).expect("checked");
            let capacity = base + adopted.len() as u64 + 1;
            let event = Event::Recovered {
                spec: p.spec.clone(),
                attempts: p.attempt,
                running: Some(crate::core::Resumed {
                    labels: labels.clone(),
                    capacity: u32::try_from(capacity).unwrap_or(u32::MAX),
                }),
            };
            if let Err(e) = self.apply(now, event) {
                tracing::warn!(task_id = %a.task_id, attempt = a.attempt, error = %e, "attempt could not be re-attached");
                self.parked.insert(a.task_id, p);
                continue;
            }
            tracing::info!(task_id = %a.task_id, attempt = a.attempt, worker_id, "attempt re-attached");
            if let Some(w) = self.workers.get_mut(worker_id) {
                w.running.insert((a.task_id, a.attempt));
            }
            self.leases.insert(
                a.task_id,
                LeaseState {
                    attempt: a.attempt,
                    worker: worker_id.to_string(),
                    expires: now.plus(self.settings.lease_ttl),
                    reattached: true,
                },
            );
            adopted.push(*a);
        }
        adopted
    }

    /// Whether a worker may join `pool`: declared, or undeclared ones
    /// allowed and room for one more pool.
    fn check_pool(&self, pool: &PoolName) -> Result<(), WireError> {
        if self.core.has_pool(pool) {
            return Ok(());
        }
        let limits = self.core.limits();
        if !limits.allow_undeclared_pools {
            return Err(Rejection::UnknownPool(pool.clone()).into());
        }
        if self.core.pool_count() >= limits.max_pools {
            return Err(WireError::new(
                ErrorCode::RESOURCE_EXHAUSTED,
                format!("{} pools are held, the limit", self.core.pool_count()),
            ));
        }
        Ok(())
    }

    fn register_reply(&self) -> RegisterReply {
        RegisterReply {
            v: PROTOCOL_VERSION,
            epoch: self.epoch,
            heartbeat_interval: self.settings.heartbeat_interval,
            worker_timeout: self.settings.worker_timeout,
            lease_ttl: self.settings.lease_ttl,
            adopted: Vec::new(),
        }
    }

    fn heartbeat(&mut self, now: Millis, h: Heartbeat) -> Result<HeartbeatReply, WireError> {
        let Some(w) = self.workers.get_mut(&h.worker_id) else {
            return Ok(HeartbeatReply {
                v: PROTOCOL_VERSION,
                epoch: self.epoch,
                registered: false,
            });
        };
        w.last_seen = now;
        // A worker runs at most its slots: anything past that in one
        // heartbeat is not a real report, and costs nothing.
        let bound = w.slots as usize + w.running.len();
        let unknown: Vec<RunningAttempt> = h
            .running
            .iter()
            .take(bound)
            .filter(|a| !w.running.contains(&(a.task_id, a.attempt)))
            .copied()
            .collect();
        for a in unknown {
            // Usually an attempt whose outcome crossed this heartbeat (the
            // worker stops nothing then); else one of an older leadership.
            tracing::debug!(worker_id = %h.worker_id, task_id = %a.task_id, attempt = a.attempt, "revoking an attempt this leader did not lease");
            let subject = self.subjects.revoke(&h.worker_id);
            self.publish(
                subject,
                &Revoke {
                    v: PROTOCOL_VERSION,
                    task_id: a.task_id,
                    attempt: a.attempt,
                    epoch: self.epoch,
                    reason: RevokeReason::Cancelled,
                },
            );
        }
        Ok(HeartbeatReply {
            v: PROTOCOL_VERSION,
            epoch: self.epoch,
            registered: true,
        })
    }

    fn deregister(&mut self, now: Millis, d: Deregister) -> Result<Ack, WireError> {
        let Some(w) = self.workers.get_mut(&d.worker_id) else {
            return Ok(Ack::default());
        };
        w.last_seen = now;
        if d.drain {
            if !w.draining {
                tracing::info!(worker_id = %d.worker_id, "worker draining");
                self.update_worker(now, &d.worker_id, |w| w.draining = true);
            }
        } else {
            self.remove_worker(now, &d.worker_id, "deregistered");
        }
        Ok(Ack::default())
    }

    /// Removes a worker: its capacity first, then its attempts are lost.
    fn remove_worker(&mut self, now: Millis, worker_id: &str, why: &str) {
        let Some(w) = self.workers.get(worker_id) else {
            return;
        };
        tracing::info!(worker_id = %worker_id, pool = %w.pool, group = %w.labels, running = w.running.len(), why, "worker removed");
        let key = (w.pool.clone(), w.labels.clone());
        // Its share leaves the group first (no slots, nothing running), so
        // the core never offers its slots again.
        let mut running = BTreeSet::new();
        self.update_worker(now, worker_id, |w| {
            running = std::mem::take(&mut w.running);
            w.slots = 0;
            w.draining = false;
        });
        self.workers.remove(worker_id);
        if let Some(group) = self.groups.get_mut(&key) {
            group.workers -= 1;
            if group.workers == 0 {
                self.groups.remove(&key);
            }
        }
        for (task, attempt) in running {
            self.leases.remove(&task);
            self.ended(task, attempt, AttemptOutcome::Lost, None, None, now);
            let _ = self.apply(
                now,
                Event::AttemptEnded {
                    task,
                    attempt,
                    outcome: AttemptOutcome::Lost,
                },
            );
        }
    }

    /// Checks a worker's claim on a lease.
    fn check_lease(
        &self,
        worker_id: &str,
        task: TaskId,
        attempt: u32,
        epoch: u64,
    ) -> Result<(), WireError> {
        if self.is_parked(worker_id, task, attempt)
            || (self.catching_up && !self.leases.contains_key(&task))
        {
            // A successor that has not seen this worker again yet.
            return Err(WireError::new(
                ErrorCode::UNAVAILABLE,
                format!(
                    "the leader of epoch {} has not re-attached attempt {attempt} of task {task} \
                     yet: {worker_id} registers again first",
                    self.epoch
                ),
            ));
        }
        // An attempt re-attached after a leader change keeps the epoch of
        // the lease it runs under; every other lease is of this epoch.
        match self.leases.get(&task) {
            Some(l) if l.attempt == attempt && l.worker == worker_id => {
                if epoch == self.epoch || (l.reattached && epoch < self.epoch) {
                    Ok(())
                } else {
                    Err(stale(format!(
                        "lease of epoch {epoch} is stale (the leader's epoch is {})",
                        self.epoch
                    )))
                }
            }
            _ => Err(stale(format!(
                "attempt {attempt} of task {task} is not leased to {worker_id}"
            ))),
        }
    }

    fn renew(&mut self, now: Millis, r: Renew) -> Result<RenewReply, WireError> {
        self.check_lease(&r.worker_id, r.task_id, r.attempt, r.epoch)?;
        if let Some(l) = self.leases.get_mut(&r.task_id) {
            l.expires = now.plus(self.settings.lease_ttl);
        }
        if let Some(w) = self.workers.get_mut(&r.worker_id) {
            w.last_seen = now;
        }
        Ok(RenewReply {
            v: PROTOCOL_VERSION,
            ttl: self.settings.lease_ttl,
        })
    }

    /// Records an attempt's end in the ledger (journaled this turn);
    /// returns the outcome the core must hear.
    fn ended(
        &mut self,
        task: TaskId,
        attempt: u32,
        outcome: AttemptOutcome,
        output: Option<Bytes>,
        error: Option<String>,
        now: Millis,
    ) -> AttemptOutcome {
        self.dirty.insert(task);
        self.ledger
            .ended(task, attempt, outcome, output, error, now)
    }

    fn outcome(&mut self, now: Millis, o: AttemptReport) -> Result<Ack, WireError> {
        self.check_lease(&o.worker_id, o.task_id, o.attempt, o.epoch)?;
        self.leases.remove(&o.task_id);
        self.release_slot(now, &o.worker_id, o.task_id, o.attempt);
        if let Some(w) = self.workers.get_mut(&o.worker_id) {
            w.last_seen = now;
        }
        let (outcome, output, error) = match o.result {
            AttemptResult::Succeeded { output } => (AttemptOutcome::Succeeded, Some(output), None),
            AttemptResult::Failed { error, retryable } => {
                (AttemptOutcome::Failed { retryable }, None, Some(error))
            }
            AttemptResult::Cancelled => (AttemptOutcome::Cancelled, None, None),
        };
        // Stopped for its timeout: lost, whatever the worker calls it.
        let outcome = self.ended(o.task_id, o.attempt, outcome, output, error, now);
        self.apply(
            now,
            Event::AttemptEnded {
                task: o.task_id,
                attempt: o.attempt,
                outcome,
            },
        )?;
        Ok(Ack::default())
    }

    /// Timers of the core, expired leases, silent workers.
    pub(crate) fn housekeeping(&mut self, now: Millis) {
        let _ = self.apply(now, Event::Tick);
        self.end_reattach_grace(now);
        let expired: Vec<(TaskId, u32, String)> = self
            .leases
            .iter()
            .filter(|(_, l)| l.expires <= now)
            .map(|(t, l)| (*t, l.attempt, l.worker.clone()))
            .collect();
        for (task, attempt, worker) in expired {
            tracing::info!(task_id = %task, attempt, worker_id = %worker, "lease expired");
            self.leases.remove(&task);
            self.release_slot(now, &worker, task, attempt);
            self.ended(
                task,
                attempt,
                AttemptOutcome::Lost,
                None,
                Some("lease expired".into()),
                now,
            );
            let _ = self.apply(
                now,
                Event::AttemptEnded {
                    task,
                    attempt,
                    outcome: AttemptOutcome::Lost,
                },
            );
        }
        let silent: Vec<String> = self
            .workers
            .iter()
            .filter(|(_, w)| now.0.saturating_sub(w.last_seen.0) > self.settings.worker_timeout.0)
            .map(|(id, _)| id.clone())
            .collect();
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
            })
            .collect();
        snap
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::AttemptRecord;

    fn settings() -> Settings {
        Settings {
            server_id: "s1".into(),
            lease_ttl: Millis(10_000),
            worker_timeout: Millis(5_000),
            heartbeat_interval: Millis(1_000),
            max_payload_bytes: 1024,
            max_reply_bytes: 1 << 20,
            retain_finished: 100,
            pools: Vec::new(),
            max_workers: 1_000_000,
            limits: crate::core::Limits::default(),
            reattach_grace: Millis(3_000),
        }
    }

    fn driver() -> Driver {
        Driver::new(Subjects::default(), 7, settings(), Millis(0))
    }

    /// Hands local callers their replies (the runner does so once the
    /// turn's records are stored); keeps the other outputs for the test.
    fn answer(d: &mut Driver) {
        let mut kept = Vec::new();
        for output in d.take_outputs() {
            match output {
                Output::Reply(reply) => reply(),
                other => kept.push(other),
            }
        }
        d.out = kept;
    }

    fn register(d: &mut Driver, id: &str, labels: &str, slots: u32) {
        let reply = try_register(d, 0, id, "p", labels, slots, Some("i1"));
        assert_eq!(reply.unwrap().epoch, 7);
    }

    fn try_register(
        d: &mut Driver,
        now: u64,
        id: &str,
        pool: &str,
        labels: &str,
        slots: u32,
        instance: Option<&str>,
    ) -> Result<RegisterReply, WireError> {
        let (tx, mut rx) = oneshot::channel();
        d.handle(
            Millis(now),
            Input::Register(
                Register {
                    v: 1,
                    worker_id: id.into(),
                    pool: PoolName::new(pool).unwrap(),
                    labels: Labels::parse(labels).unwrap(),
                    slots,
                    credentials: None,
                    instance: instance.map(str::to_string),
                    running: Vec::new(),
                },
                Responder::Local(tx),
            ),
        );
        answer(d);
        rx.try_recv().unwrap()
    }

    /// A worker's report of an attempt's end; the leader's answer.
    fn report(
        d: &mut Driver,
        now: u64,
        worker: &str,
        task_id: TaskId,
        attempt: u32,
        epoch: u64,
        result: AttemptResult,
    ) -> Result<Ack, WireError> {
        let (tx, mut rx) = oneshot::channel();
        let report = AttemptReport {
            v: 1,
            worker_id: worker.into(),
            task_id,
            attempt,
            epoch,
            result,
        };
        d.handle(Millis(now), Input::Outcome(report, Responder::Local(tx)));
        answer(d);
        rx.try_recv().unwrap()
    }

    fn deregister(d: &mut Driver, now: u64, worker: &str) {
        let (tx, _rx) = oneshot::channel();
        let body = Deregister {
            v: 1,
            worker_id: worker.into(),
            drain: false,
        };
        d.handle(Millis(now), Input::Deregister(body, Responder::Local(tx)));
    }

    fn snapshot(d: &mut Driver) -> Snapshot {
        let (tx, mut rx) = oneshot::channel();
        d.handle(Millis(0), Input::Snapshot(Responder::Local(tx)));
        answer(d);
        rx.try_recv().unwrap().unwrap()
    }

    /// Issue 7 finding 6: a second process with a live worker's id is
    /// refused; the same process again is idempotent; once the first has
    /// timed out the id is free.
    #[test]
    fn a_live_worker_id_cannot_be_taken_by_another_process() {
        let mut d = driver();
        register(&mut d, "dup", "", 2);
        submit(&mut d, 1, 1, "");
        assert_eq!(leases(&mut d).len(), 1);
        let e = try_register(&mut d, 1, "dup", "p", "", 2, Some("other")).unwrap_err();
        assert_eq!(e.code, ErrorCode::ALREADY_EXISTS, "{e:?}");
        let e = try_register(&mut d, 1, "dup", "p", "", 2, None).unwrap_err();
        assert_eq!(e.code, ErrorCode::ALREADY_EXISTS);
        // Nothing changed: one worker, its attempt still leased to it.
        let snap = snapshot(&mut d);
        assert_eq!(snap.workers.len(), 1);
        assert_eq!(snap.workers[0].busy, 1);
        assert_eq!(d.status(TaskId(1)).unwrap().state, TaskState::Running);
        // The same process retrying its registration: accepted, no change.
        try_register(&mut d, 2, "dup", "p", "", 2, Some("i1")).unwrap();
        assert_eq!(snapshot(&mut d).workers[0].busy, 1);
        assert!(leases(&mut d).is_empty());
        // Silent past worker_timeout: removed, and the id is free again.
        d.housekeeping(Millis(10_000));
        try_register(&mut d, 10_001, "dup", "p", "", 2, Some("other")).unwrap();
    }

    /// Issue 7 findings 4 and 5: registration is O(log n) (100,000 workers
    /// into one group would take minutes with the old per-registration
    /// re-sum), and the group total is u64, saturating at u32::MAX for the
    /// core instead of wrapping.
    #[test]
    fn many_big_workers_in_one_group_neither_wrap_nor_rescan() {
        let mut d = driver();
        for i in 0..100_000u32 {
            try_register(&mut d, 0, &format!("w{i}"), "p", "gpu=a100", 100_000, None).unwrap();
        }
        let snap = snapshot(&mut d);
        let group = &snap.pools[0].groups[0];
        assert_eq!(group.capacity, u32::MAX, "saturated, not wrapped");
        assert_eq!(group.workers, 100_000);
        // Removing one keeps the exact u64 total underneath.
        deregister(&mut d, 1, "w0");
        let key = (
            PoolName::new("p").unwrap(),
            Labels::parse("gpu=a100").unwrap(),
        );
        assert_eq!(d.groups[&key].slots, 99_999 * 100_000);
    }

    /// Issue 7 finding 3: a worker of an undeclared pool is refused when
    /// they are not allowed; pools beyond max_pools and workers beyond
    /// max_workers are RESOURCE_EXHAUSTED; nothing registers.
    #[test]
    fn registration_limits() {
        let mut s = settings();
        s.pools = vec![(
            PoolName::new("p").unwrap(),
            crate::core::PoolConfig::default(),
        )];
        s.limits.allow_undeclared_pools = false;
        s.max_workers = 2;
        let mut d = Driver::new(Subjects::default(), 7, s, Millis(0));
        let e = try_register(&mut d, 0, "x", "elsewhere", "", 1, None).unwrap_err();
        assert_eq!(e.code, ErrorCode::NOT_FOUND);
        try_register(&mut d, 0, "a", "p", "", 1, None).unwrap();
        try_register(&mut d, 0, "b", "p", "", 1, None).unwrap();
        let e = try_register(&mut d, 0, "c", "p", "", 1, None).unwrap_err();
        assert_eq!(e.code, ErrorCode::RESOURCE_EXHAUSTED);
        assert_eq!(snapshot(&mut d).workers.len(), 2);

        let mut s = settings();
        s.limits.max_pools = 1;
        let mut d = Driver::new(Subjects::default(), 7, s, Millis(0));
        try_register(&mut d, 0, "a", "p1", "", 1, None).unwrap();
        let e = try_register(&mut d, 0, "b", "p2", "", 1, None).unwrap_err();
        assert_eq!(e.code, ErrorCode::RESOURCE_EXHAUSTED);
        assert_eq!(snapshot(&mut d).pools.len(), 1);
    }

    /// Issue 7 finding 3: an undeclared pool is forgotten once it has no
    /// workers and no tasks, so 10,000 names leave nothing behind.
    #[test]
    fn idle_undeclared_pools_are_forgotten() {
        let mut d = driver();
        for i in 0..10_000u64 {
            let pool = format!("pool{i}");
            d.handle(
                Millis(1),
                Input::Submitted {
                    seq: i + 1,
                    pool: PoolName::new(&pool).unwrap(),
                    task: Ok(Task::new("x")
                        .pool(pool.as_str())
                        .label("k", format!("v{i}"))),
                },
            );
        }
        assert_eq!(d.core.pool_count(), 10_000);
        for i in 0..10_000u64 {
            let (tx, _rx) = oneshot::channel();
            d.handle(
                Millis(2),
                Input::Cancel(TaskId(i + 1), Responder::Local(tx)),
            );
        }
        assert_eq!(d.core.pool_count(), 0);
        assert!(snapshot(&mut d).pools.is_empty());
        // A worker's pool goes when the worker does.
        register(&mut d, "w", "", 1);
        assert_eq!(d.core.pool_count(), 1);
        deregister(&mut d, 3, "w");
        assert_eq!(d.core.pool_count(), 0);
        d.core.check_invariants().unwrap();
    }

    /// Issue 7 finding 1: a submission the core refuses (a deadline more
    /// than 10 years ahead) is recorded failed with its reason and goes to
    /// the dead-letter stream, and the next submission runs as usual.
    #[test]
    fn a_refused_submission_fails_with_its_reason_and_is_dead_lettered() {
        let mut d = driver();
        register(&mut d, "a", "", 1);
        let far = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1 << 40);
        d.handle(
            Millis(1),
            Input::Submitted {
                seq: 1,
                pool: PoolName::new("p").unwrap(),
                task: Ok(Task::new("x").pool("p").deadline(far)),
            },
        );
        let outputs = d.take_outputs();
        let dead = outputs.iter().find_map(|o| match o {
            Output::Persist {
                seq: 1,
                record,
                dead_letter: Some(e),
            } => Some((record.clone(), e.clone())),
            _ => None,
        });
        let (status, reason) = dead.expect("a dead letter for submission 1");
        assert_eq!(status.state, TaskState::Failed);
        assert_eq!(reason.code, ErrorCode::INVALID_ARGUMENT);
        assert!(status.error.unwrap().contains("10 years"));
        submit(&mut d, 2, 2, "");
        assert_eq!(leases(&mut d).len(), 1);
        assert_eq!(d.purge_floor(), 2);
    }

    /// Issue 7 finding 3: the snapshot a NATS request gets fits in one
    /// message however many workers there are.
    #[test]
    fn a_nats_snapshot_reply_fits_in_one_message() {
        let mut s = settings();
        s.max_reply_bytes = 64 * 1024;
        let mut d = Driver::new(Subjects::default(), 7, s, Millis(0));
        for i in 0..5_000u32 {
            try_register(&mut d, 0, &format!("worker-{i:05}"), "p", "", 1, None).unwrap();
        }
        let _ = d.take_outputs();
        d.handle(
            Millis(1),
            Input::Snapshot(Responder::Nats(Some("reply".into()))),
        );
        let out = d.take_outputs();
        let Output::Publish { body, .. } = &out[0] else {
            panic!("{out:?}")
        };
        assert!(body.len() <= 64 * 1024, "{} bytes", body.len());
        let snap: Snapshot = wire::decode_reply(body).unwrap();
        assert!(snap.truncated);
        assert!(!snap.workers.is_empty());
        assert_eq!(snap.pools[0].capacity, 5_000);
    }

    /// Issue 8: an attempt revoked for its timeout is recorded `lost` with
    /// the reason `timeout` (as embedded does and the core counts it),
    /// not `cancelled`, and is retried.
    #[test]
    fn an_attempt_revoked_for_its_timeout_is_lost_with_reason_timeout() {
        let mut d = driver();
        register(&mut d, "a", "", 1);
        d.handle(
            Millis(0),
            Input::Submitted {
                seq: 1,
                pool: PoolName::new("p").unwrap(),
                task: Ok(Task::new("x")
                    .pool("p")
                    .attempt_timeout(std::time::Duration::from_millis(500))),
            },
        );
        assert_eq!(leases(&mut d).len(), 1);
        d.housekeeping(Millis(600));
        let revoked = d
            .take_outputs()
            .into_iter()
            .any(|o| matches!(o, Output::Publish { subject, .. } if subject.ends_with(".revoke")));
        assert!(revoked);
        report(&mut d, 650, "a", TaskId(1), 1, 7, AttemptResult::Cancelled).unwrap();
        let status = d.status(TaskId(1)).unwrap();
        assert_eq!(status.attempts[0].outcome.as_deref(), Some("lost"));
        assert_eq!(status.attempts[0].error.as_deref(), Some("timeout"));
        assert_eq!(status.state, TaskState::Queued, "retried");
    }

    /// Issue 9's heartbeat flood, bounded here: a heartbeat listing 35,000
    /// attempts this leader never leased costs at most its slots' worth of
    /// revocations.
    #[test]
    fn a_heartbeat_listing_thousands_of_attempts_costs_at_most_its_slots() {
        let mut d = driver();
        register(&mut d, "a", "", 2);
        let (tx, _rx) = oneshot::channel();
        d.handle(
            Millis(1),
            Input::Heartbeat(
                Heartbeat {
                    v: 1,
                    worker_id: "a".into(),
                    free_slots: 2,
                    running: (0..35_000)
                        .map(|i| RunningAttempt {
                            task_id: TaskId(i),
                            attempt: 1,
                        })
                        .collect(),
                },
                Responder::Local(tx),
            ),
        );
        // Two revokes at most, and the reply.
        assert!(d.take_outputs().len() <= 3);
    }

    fn submit(d: &mut Driver, now: u64, seq: u64, labels: &str) {
        let mut task = Task::new("x").pool("p");
        for item in labels.split(',').filter(|s| !s.is_empty()) {
            task = task.label_text(item);
        }
        d.handle(
            Millis(now),
            Input::Submitted {
                seq,
                pool: PoolName::new("p").unwrap(),
                task: Ok(task),
            },
        );
    }

    fn leases(d: &mut Driver) -> Vec<(String, Lease)> {
        d.take_outputs()
            .into_iter()
            .filter_map(|o| match o {
                Output::Publish { subject, body } if subject.ends_with(".lease") => {
                    Some((subject, wire::decode::<Lease>(&body).unwrap()))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn labeled_and_unlabeled_go_to_their_workers() {
        let mut d = driver();
        register(&mut d, "cpu", "", 1);
        register(&mut d, "gpu", "gpu=a100", 1);
        submit(&mut d, 1, 1, "");
        submit(&mut d, 1, 2, "gpu=a100");
        let l = leases(&mut d);
        assert_eq!(l[0].0, "cronoq.worker.cpu.lease");
        assert_eq!(l[1].0, "cronoq.worker.gpu.lease");
        assert_eq!(l[1].1.epoch, 7);
    }

    #[test]
    fn silent_worker_is_removed_and_its_attempt_retried_elsewhere() {
        let mut d = driver();
        register(&mut d, "a", "gpu=a100", 1);
        submit(&mut d, 1, 1, "gpu=a100");
        assert_eq!(leases(&mut d)[0].0, "cronoq.worker.a.lease");
        register(&mut d, "b", "gpu=a100", 1);
        // b heartbeats, a stays silent.
        let beat = |d: &mut Driver, at: u64| {
            let (tx, _rx) = oneshot::channel();
            d.handle(
                Millis(at),
                Input::Heartbeat(
                    Heartbeat {
                        v: 1,
                        worker_id: "b".into(),
                        free_slots: 1,
                        running: vec![],
                    },
                    Responder::Local(tx),
                ),
            );
        };
        beat(&mut d, 5_000);
        d.housekeeping(Millis(6_000));
        // The retry waits out its 1 s backoff, then goes to b.
        beat(&mut d, 7_000);
        d.housekeeping(Millis(7_000));
        let l = leases(&mut d);
        assert_eq!(l.len(), 1, "{l:?}");
        assert_eq!(l[0].0, "cronoq.worker.b.lease");
        assert_eq!(l[0].1.attempt, 2);
        let snap = d.snapshot(Millis(7_000));
        assert_eq!(snap.workers.len(), 1);
        assert_eq!(snap.pools[0].groups[0].capacity, 1);
    }

    #[test]
    fn stale_outcome_is_refused() {
        let mut d = driver();
        register(&mut d, "a", "", 1);
        submit(&mut d, 1, 1, "");
        let _ = leases(&mut d);
        let err = report(&mut d, 2, "a", TaskId(1), 1, 6, AttemptResult::Cancelled).unwrap_err();
        assert_eq!(err.code, ErrorCode::FAILED_PRECONDITION);
        assert_eq!(d.status(TaskId(1)).unwrap().state, TaskState::Running);
    }

    #[test]
    fn a_known_idempotency_key_is_the_same_task() {
        let mut d = driver();
        register(&mut d, "a", "", 1);
        for seq in [1, 2] {
            d.handle(
                Millis(1),
                Input::Submitted {
                    seq,
                    pool: PoolName::new("p").unwrap(),
                    task: Ok(Task::new("x").pool("p").idempotency_key("k")),
                },
            );
        }
        let outputs = d.take_outputs();
        let leases = outputs
            .iter()
            .filter(|o| matches!(o, Output::Publish { subject, .. } if subject.ends_with(".lease")))
            .count();
        assert_eq!(leases, 1);
        assert!(outputs
            .iter()
            .any(|o| matches!(o, Output::Discard { seq: 2 })));
        assert_eq!(d.status(TaskId(2)).unwrap().id, TaskId(1));
    }

    #[test]
    fn purge_floor_stays_below_every_unfinished_task() {
        let mut d = driver();
        register(&mut d, "a", "", 1);
        assert_eq!(d.purge_floor(), 1);
        submit(&mut d, 1, 1, "");
        submit(&mut d, 1, 2, "");
        assert_eq!(d.purge_floor(), 1);
        let lease = leases(&mut d).remove(0).1;
        let succeeded = AttemptResult::Succeeded {
            output: Bytes::new(),
        };
        report(&mut d, 2, "a", lease.task_id, 1, 7, succeeded).unwrap();
        // Task 1 finished, task 2 runs now: only submission 1 may go.
        assert_eq!(d.purge_floor(), 2);
    }

    // ---- recovery after a leader change ----------------------------------

    /// The journal record of a task whose attempt `attempt` ran (or runs,
    /// when `open`) on `worker` under an earlier leadership.
    fn journaled(seq: u64, attempt: u32, worker: &str, open: bool) -> TaskRecord {
        let attempts = (1..=attempt)
            .map(|n| AttemptRecord {
                attempt: n,
                group: Labels::new(),
                worker: Some(worker.into()),
                started_at: Millis(1),
                ended_at: (n < attempt || !open).then_some(Millis(2)),
                outcome: (n < attempt || !open).then(|| "lost".into()),
                error: None,
            })
            .collect();
        TaskRecord {
            v: 1,
            id: TaskId(seq),
            pool: PoolName::new("p").unwrap(),
            state: TaskState::Running,
            attempts,
            output: None,
            error: None,
            deadline_missed: false,
        }
    }

    fn recover(d: &mut Driver, now: u64, record: TaskRecord) {
        d.handle(
            Millis(now),
            Input::Recovered {
                seq: record.id.0,
                pool: PoolName::new("p").unwrap(),
                task: Ok(Task::new("x").pool("p")),
                record,
            },
        );
    }

    fn register_running(
        d: &mut Driver,
        now: u64,
        id: &str,
        slots: u32,
        running: &[(u64, u32)],
    ) -> RegisterReply {
        let (tx, mut rx) = oneshot::channel();
        d.handle(
            Millis(now),
            Input::Register(
                Register {
                    v: 1,
                    worker_id: id.into(),
                    pool: PoolName::new("p").unwrap(),
                    labels: Labels::new(),
                    slots,
                    credentials: None,
                    instance: Some("i".into()),
                    running: running
                        .iter()
                        .map(|&(t, attempt)| RunningAttempt {
                            task_id: TaskId(t),
                            attempt,
                        })
                        .collect(),
                },
                Responder::Local(tx),
            ),
        );
        answer(d);
        rx.try_recv().unwrap().unwrap()
    }

    /// Issue 8, re-attachment: a successor (epoch 7 here) learns from the
    /// journal that attempt 1 of task 1 runs on `a`; `a` registers again
    /// listing it: the attempt keeps running there (no new lease, its slot
    /// taken), its report under the old epoch counts, and an attempt the
    /// journal does not know is not adopted.
    #[test]
    fn a_running_attempt_is_reattached_when_its_worker_registers_again() {
        let mut d = driver();
        recover(&mut d, 1, journaled(1, 1, "a", true));
        submit(&mut d, 1, 2, "");
        // Before `a` is back, its reports wait (the worker retries).
        let e = report(&mut d, 2, "a", TaskId(1), 1, 6, AttemptResult::Cancelled).unwrap_err();
        assert_eq!(e.code, ErrorCode::UNAVAILABLE);
        let reply = register_running(&mut d, 3, "a", 1, &[(1, 1), (99, 1)]);
        assert_eq!(
            reply.adopted,
            [RunningAttempt {
                task_id: TaskId(1),
                attempt: 1
            }]
        );
        assert!(
            leases(&mut d).is_empty(),
            "its one slot is the re-attached attempt's"
        );
        assert_eq!(d.status(TaskId(1)).unwrap().state, TaskState::Running);
        assert_eq!(d.status(TaskId(2)).unwrap().state, TaskState::Queued);
        report(
            &mut d,
            4,
            "a",
            TaskId(1),
            1,
            6,
            AttemptResult::Succeeded {
                output: Bytes::from("done"),
            },
        )
        .unwrap();
        let status = d.status(TaskId(1)).unwrap();
        assert_eq!(status.state, TaskState::Succeeded);
        assert_eq!(status.attempts.len(), 1, "one run, one attempt");
        let next = leases(&mut d);
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].1.task_id, TaskId(2));
        assert!(d.core.check_invariants().is_ok());
    }

    /// Issue 8: an attempt whose worker does not come back within the
    /// grace is lost (with its reason) and the task runs as its next
    /// attempt, not as attempt 1 again.
    #[test]
    fn an_attempt_not_reattached_within_the_grace_is_lost_and_retried_as_the_next() {
        let mut d = driver();
        recover(&mut d, 1, journaled(1, 2, "gone", true));
        register(&mut d, "b", "", 1);
        assert!(leases(&mut d).is_empty(), "parked until the grace ends");
        d.housekeeping(Millis(3_001));
        let next = leases(&mut d);
        assert_eq!(next.len(), 1);
        assert_eq!((next[0].1.task_id, next[0].1.attempt), (TaskId(1), 3));
        let status = d.status(TaskId(1)).unwrap();
        assert_eq!(status.attempts.len(), 3);
        assert_eq!(status.attempts[1].outcome.as_deref(), Some("lost"));
        assert_eq!(status.attempts[1].error.as_deref(), Some(NOT_REATTACHED));
        // The records of the turn: the lost attempt and the new one.
        assert!(d.core.check_invariants().is_ok());
    }

    /// Issue 8: a task whose last attempt ended (here: lost) waits for its
    /// next attempt at once.
    #[test]
    fn a_recovered_task_between_attempts_goes_on_with_the_next() {
        let mut d = driver();
        register(&mut d, "b", "", 1);
        recover(&mut d, 1, journaled(1, 1, "x", false));
        let next = leases(&mut d);
        assert_eq!((next[0].1.task_id, next[0].1.attempt), (TaskId(1), 2));
    }

    /// Issue 8, persist before announce: the lease of an attempt goes out
    /// in the same turn as the attempt's journal record, which the runner
    /// stores first; the outcome's record and result likewise.
    #[test]
    fn every_attempt_change_is_journaled_in_its_turn() {
        let mut d = driver();
        register(&mut d, "a", "", 1);
        submit(&mut d, 1, 1, "");
        let outputs = d.take_outputs();
        let record = outputs.iter().find_map(|o| match o {
            Output::Persist { seq: 1, record, .. } => Some(record.clone()),
            _ => None,
        });
        let record = record.expect("the started attempt is journaled");
        assert_eq!(record.state, TaskState::Running);
        assert_eq!(record.attempts[0].worker.as_deref(), Some("a"));
        assert!(record.attempts[0].outcome.is_none());
        let (tx, _rx) = oneshot::channel();
        d.handle(
            Millis(2),
            Input::Outcome(
                AttemptReport {
                    v: 1,
                    worker_id: "a".into(),
                    task_id: TaskId(1),
                    attempt: 1,
                    epoch: 7,
                    result: AttemptResult::Succeeded {
                        output: Bytes::from("ok"),
                    },
                },
                Responder::Local(tx),
            ),
        );
        let outputs = d.take_outputs();
        let finals: Vec<&TaskRecord> = outputs
            .iter()
            .filter_map(|o| match o {
                Output::Persist { seq: 1, record, .. } => Some(record),
                _ => None,
            })
            .collect();
        assert_eq!(finals.len(), 1, "one record per task per turn");
        assert_eq!(finals[0].state, TaskState::Succeeded);
        assert_eq!(finals[0].output.as_deref(), Some(&b"ok"[..]));
    }

    /// Issue 8: a worker that registers with a successor before the
    /// successor has read the journal waits for it (it lists its attempts
    /// once): it is answered after `CaughtUp`, its attempt re-attached.
    #[test]
    fn registrations_wait_until_the_journal_is_read() {
        let mut d = driver();
        d.catch_up_first();
        let (tx, mut rx) = oneshot::channel();
        d.handle(
            Millis(1),
            Input::Register(
                Register {
                    v: 1,
                    worker_id: "a".into(),
                    pool: PoolName::new("p").unwrap(),
                    labels: Labels::new(),
                    slots: 2,
                    credentials: None,
                    instance: Some("i".into()),
                    running: vec![RunningAttempt {
                        task_id: TaskId(5),
                        attempt: 1,
                    }],
                },
                Responder::Local(tx),
            ),
        );
        answer(&mut d);
        assert!(
            rx.try_recv().is_err(),
            "no answer before the journal is read"
        );
        // Its renewal meanwhile is not refused as stale.
        let e = report(&mut d, 1, "a", TaskId(5), 1, 6, AttemptResult::Cancelled).unwrap_err();
        assert_eq!(e.code, ErrorCode::UNAVAILABLE);
        recover(&mut d, 2, journaled(5, 1, "a", true));
        d.handle(Millis(3), Input::CaughtUp);
        answer(&mut d);
        let reply = rx.try_recv().unwrap().unwrap();
        assert_eq!(reply.adopted.len(), 1);
        assert_eq!(d.status(TaskId(5)).unwrap().state, TaskState::Running);
    }
}

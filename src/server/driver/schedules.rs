//! The leader's schedules (issue 23): the pure [`Book`] held by the
//! driver, stepped with the driver's own timers, its fires published by
//! the shell and its state journaled as one record per schedule.
//!
//! - **Requests** ([`ScheduleOp`]) come in as [`Input::Schedule`] and are
//!   answered once the turn's writes are stored, like every reply: a
//!   created schedule is durable before its creator hears of it.
//! - **Fires** go out as [`Output::Fire`]: the committer publishes each
//!   to the submit stream, after its turn is stored, under the tick's key
//!   as `Nats-Msg-Id`, and hands the stream's answer back as
//!   [`Input::FirePublished`] (the task's sequence, also for a duplicate
//!   of an earlier publish of the same tick). Only then is the fire
//!   recorded as accepted and the schedule's record written
//!   ([`Output::PersistSchedule`], key `sched.<name>`). So a record that
//!   says "tick T fired" is stored only after T's task is in the stream;
//!   a leader that dies in between leaves its successor to decide T again,
//!   under the same key — the stream answers with the first task. A
//!   schedule's record is not written at all while any of its fires is
//!   unanswered (`in_flight`): whatever else changed waits with it.
//! - **Run ends** are read from the turn's own results: a terminal record
//!   of a task the book believes live ends its run (`take_outputs_into`).
//! - **Catching up**: the book steps only once the journal is read, so
//!   the first step sees every task earlier leaderships left; runs the
//!   stored records call live but which ended while no one led are ended
//!   then ([`Driver::reconcile_schedules`]).
//! - **Records expire** with the results bucket's max age: each is
//!   written again a third of `results_ttl` after it was last written,
//!   as live task records are.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::*;
use crate::api::{BackfillRange, BackfillReport, FireRecord, ScheduleEntry, ScheduleInfo};
use crate::schedule::{Book, BookError, FireKind, Order, ScheduleSpec, StoredSchedule};

/// A schedule request a client made of the leader.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ScheduleOp {
    /// Create it, its tasks owned by `owner` (the caller's credential).
    Create {
        spec: Box<ScheduleSpec>,
        owner: Option<String>,
    },
    List,
    Get(String),
    /// Pause (`true`) or resume.
    Pause(String, bool),
    Delete(String),
    Trigger(String),
    Backfill(String, BackfillRange),
}

/// The leader's answer to a [`ScheduleOp`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ScheduleReply {
    Info(Box<ScheduleInfo>),
    List(Vec<ScheduleEntry>),
    Fired(FireRecord),
    Backfilled(BackfillReport),
    Deleted,
}

/// A request answered once the fires it started were published.
struct Awaiting {
    to: Responder,
    name: String,
    kind: FireKind,
    /// The fires of this request still waiting for the stream's answer.
    ticks: Vec<Millis>,
    skipped: Vec<Millis>,
    fired_at: Millis,
}

/// The schedules' state beside the book.
pub(super) struct Schedules {
    pub(super) book: Book,
    /// Schedules whose record is written at the end of the turn.
    dirty: BTreeSet<String>,
    /// The book's live runs were checked against the journal read.
    reconciled: bool,
    /// Fires published but not yet answered: to cancel once they are
    /// (`cancel_previous` met a run whose task id is not known yet).
    cancel_on_ack: HashSet<(String, Millis)>,
    awaiting: Vec<Awaiting>,
    /// Fires published and not yet answered, per schedule. A schedule's
    /// record is not written while it has any: the record would say the
    /// tick fired before its task is in the stream, and a leader dying
    /// then would leave its successor a tick that never runs.
    in_flight: HashMap<String, u32>,
}

impl Schedules {
    pub(super) fn new(limit: usize) -> Schedules {
        Schedules {
            book: Book::new(limit),
            dirty: BTreeSet::new(),
            reconciled: false,
            cancel_on_ack: HashSet::new(),
            awaiting: Vec::new(),
            in_flight: HashMap::new(),
        }
    }

    fn next_wakeup(&self) -> Option<Millis> {
        self.book.next_wakeup()
    }
}

/// Room a schedule's record keeps for its bounded history (the last
/// [`crate::schedule::HISTORY`] fires, skipped ticks and missed ranges,
/// each error an excerpt): far more than they take.
const HISTORY_RESERVE: usize = 64 * 1024;

fn book_error(e: BookError) -> WireError {
    WireError::new(e.code, e.message)
}

fn not_found(name: &str) -> WireError {
    book_error(BookError {
        code: ErrorCode::NOT_FOUND,
        message: format!("no schedule named {name}"),
    })
}

impl Driver {
    /// Puts back the schedules an earlier leadership stored (before the
    /// journal is read; they step once it is).
    pub(crate) fn restore_schedules(&mut self, stored: Vec<StoredSchedule>) {
        for s in stored {
            let name = s.spec.name.clone();
            match self.schedules.book.restore(s) {
                Ok(()) => {}
                Err(e) => tracing::warn!(schedule = %name, error = %e, "stored schedule ignored"),
            }
        }
    }

    /// Refuses (`INVALID_ARGUMENT`) a schedule whose record could not be
    /// stored (issue 34): its task payload over the task payload limit,
    /// or the record with its history over one journal record. A record
    /// the journal cannot store would hold every later write behind it.
    fn fits_the_journal(&self, spec: &ScheduleSpec) -> Result<(), WireError> {
        let payload = spec.task.payload.len();
        let limit = self.settings.max_payload_bytes;
        if payload > limit {
            return Err(WireError::new(
                ErrorCode::INVALID_ARGUMENT,
                format!(
                    "the schedule's task payload is {payload} bytes, over the limit of {limit}"
                ),
            ));
        }
        let size = wire::encode(spec).len();
        let room = self
            .settings
            .max_record_bytes
            .saturating_sub(HISTORY_RESERVE);
        if size > room {
            return Err(WireError::new(
                ErrorCode::INVALID_ARGUMENT,
                format!(
                    "the schedule takes {size} bytes stored, over the {room} a schedule's record may take \
                     (its task payload is the most of it)"
                ),
            ));
        }
        Ok(())
    }

    /// Answers a schedule request (deferred until its fires are published
    /// for `trigger` and `backfill`).
    pub(super) fn schedule_request(&mut self, now: Millis, op: ScheduleOp, to: Responder) {
        if self.catching_up {
            let e = WireError::new(ErrorCode::UNAVAILABLE, "the leader is reading its journal");
            return self.respond::<ScheduleReply>(to, Err(e));
        }
        self.reconcile_schedules(now);
        let result = match op {
            ScheduleOp::Trigger(name) => match self.schedules.book.trigger(&name, now) {
                Ok(order) => {
                    self.schedules.dirty.insert(name.clone());
                    self.schedules.awaiting.push(Awaiting {
                        to,
                        name,
                        kind: FireKind::Trigger,
                        ticks: vec![now],
                        skipped: Vec::new(),
                        fired_at: now,
                    });
                    self.carry_out_orders(now, vec![order]);
                    return;
                }
                Err(e) => Err(book_error(e)),
            },
            ScheduleOp::Backfill(name, range) => {
                match self
                    .schedules
                    .book
                    .backfill(&name, range.from, range.to, now)
                {
                    Ok((orders, skipped)) => {
                        self.schedules.dirty.insert(name.clone());
                        let ticks = orders
                            .iter()
                            .filter_map(|o| match o {
                                Order::Fire { tick, .. } => Some(*tick),
                                Order::Cancel { .. } => None,
                            })
                            .collect();
                        self.schedules.awaiting.push(Awaiting {
                            to,
                            name,
                            kind: FireKind::Backfill,
                            ticks,
                            skipped,
                            fired_at: now,
                        });
                        self.carry_out_orders(now, orders);
                        self.answer_awaiting();
                        return;
                    }
                    Err(e) => Err(book_error(e)),
                }
            }
            op => self.schedule_op(now, op),
        };
        self.respond(to, result);
    }

    fn schedule_op(&mut self, now: Millis, op: ScheduleOp) -> Result<ScheduleReply, WireError> {
        let info = |book: &Book, name: &str| {
            book.get(name)
                .map(|e| ScheduleReply::Info(Box::new(ScheduleInfo::of(e))))
                .ok_or_else(|| not_found(name))
        };
        match op {
            ScheduleOp::Create { spec, owner } => {
                if let Some(why) = &self.settings.schedules_refused {
                    return Err(WireError::new(ErrorCode::FAILED_PRECONDITION, why.clone()));
                }
                self.fits_the_journal(&spec)?;
                let entry = self
                    .schedules
                    .book
                    .create(*spec, owner, now)
                    .map_err(book_error)?;
                let reply = ScheduleReply::Info(Box::new(ScheduleInfo::of(entry)));
                let name = entry.spec.name.clone();
                self.schedules.dirty.insert(name);
                Ok(reply)
            }
            ScheduleOp::List => Ok(ScheduleReply::List(
                self.schedules
                    .book
                    .iter()
                    .map(|(_, e)| ScheduleEntry::of(e))
                    .collect(),
            )),
            ScheduleOp::Get(name) => info(&self.schedules.book, &name),
            ScheduleOp::Pause(name, paused) => {
                let orders = self
                    .schedules
                    .book
                    .set_paused(&name, paused, now)
                    .map_err(book_error)?;
                self.schedules.dirty.insert(name.clone());
                self.carry_out_orders(now, orders);
                info(&self.schedules.book, &name)
            }
            ScheduleOp::Delete(name) => {
                self.schedules.book.delete(&name).map_err(book_error)?;
                self.schedules.dirty.insert(name);
                Ok(ScheduleReply::Deleted)
            }
            ScheduleOp::Trigger(_) | ScheduleOp::Backfill(..) => {
                unreachable!("answered by schedule_request")
            }
        }
    }

    /// The stream's answer to a fire: the task it is (`Ok(seq)`, also for
    /// a duplicate of an earlier publish of the tick), or why it was not
    /// taken.
    pub(super) fn fire_published(
        &mut self,
        now: Millis,
        name: String,
        tick: Millis,
        kind: FireKind,
        result: Result<u64, WireError>,
    ) {
        if let Some(n) = self.schedules.in_flight.get_mut(&name) {
            *n -= 1;
            if *n == 0 {
                self.schedules.in_flight.remove(&name);
            }
        }
        let mut orders = Vec::new();
        match result {
            Ok(seq) => {
                let id = TaskId(seq);
                self.schedules.book.accepted(&name, tick, kind, id, now);
                // Consumed and ended before the answer came back (refused
                // on arrival, or a duplicate of a run that ended).
                if let Some(state) = self.ended_state(id) {
                    orders = self.schedules.book.run_ended(id, state, now);
                }
                if self.schedules.cancel_on_ack.remove(&(name.clone(), tick)) {
                    let _ = self.cancel(now, id);
                }
            }
            Err(e) => {
                tracing::warn!(schedule = %name, tick = tick.0, error = %e, "a fire was not published");
                orders = self
                    .schedules
                    .book
                    .refused(&name, tick, kind, &e.message, now);
            }
        }
        self.schedules.dirty.insert(name);
        self.carry_out_orders(now, orders);
        self.answer_awaiting();
    }

    /// The final state of a task this leadership knows ended.
    fn ended_state(&self, id: TaskId) -> Option<TaskState> {
        if self.ledger.is_live(id) {
            return None;
        }
        self.ledger
            .status(&self.core, id)
            .map(|s| s.state)
            .filter(|s| s.is_terminal())
    }

    /// Runs the stored records call live that ended while no one led
    /// (or whose task is gone): ended now, once the journal is read.
    fn reconcile_schedules(&mut self, now: Millis) {
        if self.schedules.reconciled || self.catching_up {
            return;
        }
        self.schedules.reconciled = true;
        let mut orders = Vec::new();
        for id in self.schedules.book.live_tasks() {
            if self.ledger.is_live(id) || self.parked.contains_key(&id) {
                continue;
            }
            if let Some(name) = self.schedules.book.run_of(id).map(str::to_string) {
                self.schedules.dirty.insert(name);
            }
            let ended = match self.ended_state(id) {
                Some(state) => self.schedules.book.run_ended(id, state, now),
                None => self.schedules.book.run_gone(id, now),
            };
            orders.extend(ended);
        }
        self.carry_out_orders(now, orders);
    }

    /// Steps the book (after the journal is read).
    pub(super) fn step_schedules(&mut self, now: Millis) {
        if self.catching_up || self.schedules_held() {
            return;
        }
        // Runs whose tasks ended earlier in this turn end first: a step
        // that still saw them live would skip what is due now.
        self.end_runs_of_turn(now);
        self.reconcile_schedules(now);
        let (orders, touched) = self.schedules.book.step_touching(now);
        self.schedules.dirty.extend(touched);
        self.carry_out_orders(now, orders);
    }

    /// When the schedules next need a step (none while catching up; not
    /// before the re-attach grace ends while they are held).
    pub(super) fn schedules_wakeup(&self) -> Option<Millis> {
        if self.catching_up {
            return None;
        }
        let next = self.schedules.next_wakeup()?;
        Some(if self.schedules_held() {
            next.max(self.reattach_until)
        } else {
            next
        })
    }

    /// Whether the book waits for the re-attach grace after a takeover:
    /// a run an earlier leadership started is still live here (its
    /// attempt parked, or re-attached), and it may have ended while no
    /// server led, which only its worker can tell (re-attaching, then
    /// reporting the end). An `overlap = skip` schedule deciding its
    /// catch-up before hearing so skipped every tick of it (issue 34,
    /// finding 12). Ticks wait at most the grace; runs whose task is gone
    /// are ended at once ([`Driver::reconcile_schedules`]) and hold
    /// nothing.
    fn schedules_held(&self) -> bool {
        self.now < self.reattach_until
            && self.schedules.book.has_live_runs()
            && self
                .schedules
                .book
                .live_tasks()
                .iter()
                .any(|id| self.parked.contains_key(id) || self.ledger.is_live(*id))
    }

    /// Fires go out; cancels are carried out here (or once the fire they
    /// cancel is answered).
    fn carry_out_orders(&mut self, now: Millis, orders: Vec<Order>) {
        let mut orders = std::collections::VecDeque::from(orders);
        while let Some(order) = orders.pop_front() {
            match order {
                Order::Fire {
                    name,
                    tick,
                    kind,
                    mut task,
                } => {
                    task.owner = self.schedules.book.get(&name).and_then(|e| e.owner.clone());
                    self.schedules.dirty.insert(name.clone());
                    // The owner's rights as they are now (issue 34): a
                    // credential removed or narrowed stops its fires,
                    // each recorded refused on the schedule.
                    let allowed = PoolName::new(task.pool_name())
                        .map_err(WireError::from)
                        .and_then(|pool| self.settings.auth.may_fire(task.owner.as_deref(), &pool));
                    if let Err(e) = allowed {
                        tracing::warn!(schedule = %name, tick = tick.0, error = %e, "a fire was refused: its owner's rights");
                        let next = self
                            .schedules
                            .book
                            .refused(&name, tick, kind, &e.message, now);
                        orders.extend(next);
                        self.answer_awaiting();
                        continue;
                    }
                    *self.schedules.in_flight.entry(name.clone()).or_default() += 1;
                    self.out.push(Output::Fire {
                        name,
                        tick,
                        kind,
                        task,
                    });
                }
                Order::Cancel {
                    task: Some(id),
                    name,
                    ..
                } => {
                    self.schedules.dirty.insert(name);
                    let _ = self.cancel(now, id);
                }
                Order::Cancel {
                    task: None,
                    name,
                    tick,
                    ..
                } => {
                    self.schedules.cancel_on_ack.insert((name, tick));
                }
            }
        }
    }

    /// Answers the trigger and backfill requests whose fires were all
    /// answered by the stream.
    fn answer_awaiting(&mut self) {
        let mut i = 0;
        while i < self.schedules.awaiting.len() {
            let a = &self.schedules.awaiting[i];
            let Some(entry) = self.schedules.book.get(&a.name) else {
                // Deleted meanwhile: what was fired is in no record now.
                let a = self.schedules.awaiting.swap_remove(i);
                self.respond::<ScheduleReply>(a.to, Err(not_found(&a.name)));
                continue;
            };
            let records: Vec<FireRecord> = entry
                .history()
                .filter(|r| r.kind == a.kind && r.fired_at == a.fired_at)
                .filter(|r| a.ticks.contains(&r.tick))
                .cloned()
                .collect();
            let answered = records
                .iter()
                .filter(|r| r.task.is_some() || r.error.is_some())
                .count();
            // Fewer records than fires: the history's bound dropped some.
            if answered < records.len() {
                i += 1;
                continue;
            }
            let a = self.schedules.awaiting.swap_remove(i);
            let reply = match a.kind {
                FireKind::Trigger => match records.into_iter().next() {
                    Some(r) => Ok(ScheduleReply::Fired(r)),
                    None => Err(not_found(&a.name)),
                },
                _ => Ok(ScheduleReply::Backfilled(BackfillReport {
                    fired: records,
                    skipped: a.skipped,
                })),
            };
            self.respond(a.to, reply);
        }
    }

    /// Ends the runs whose tasks reach a final state in this turn's
    /// results, and queues the record of every schedule that changed.
    pub(super) fn schedule_outputs(&mut self, now: Millis) {
        if self.schedules.book.is_empty() && self.schedules.dirty.is_empty() {
            return;
        }
        self.end_runs_of_turn(now);
        let mut waiting = BTreeSet::new();
        for name in std::mem::take(&mut self.schedules.dirty) {
            let deleted = self.schedules.book.get(&name).is_none();
            if !deleted && self.schedules.in_flight.contains_key(&name) {
                // Written once its fires are answered.
                waiting.insert(name);
                continue;
            }
            let stored = self.schedules.book.get(&name).map(|e| Box::new(e.stored()));
            self.out.push(Output::PersistSchedule { name, stored });
        }
        self.schedules.dirty = waiting;
    }

    /// Ends the runs whose tasks reach a final state in this turn's
    /// results so far (each once: an ended run is no longer live).
    fn end_runs_of_turn(&mut self, now: Millis) {
        if !self.schedules.book.has_live_runs() {
            return;
        }
        let ended: Vec<(TaskId, TaskState)> = self
            .out
            .iter()
            .filter_map(|o| match o {
                Output::Persist { seq, record, .. }
                    if record.state.is_terminal() && self.schedules.book.is_live(TaskId(*seq)) =>
                {
                    Some((TaskId(*seq), record.state))
                }
                _ => None,
            })
            .collect();
        for (id, state) in ended {
            if let Some(name) = self.schedules.book.run_of(id).map(str::to_string) {
                self.schedules.dirty.insert(name);
            }
            let orders = self.schedules.book.run_ended(id, state, now);
            self.carry_out_orders(now, orders);
        }
    }

    /// One schedule as the book holds it (the simulation's end check).
    #[cfg(test)]
    pub(crate) fn schedule_entry(&self, name: &str) -> Option<&crate::schedule::Entry> {
        self.schedules.book.get(name)
    }

    /// The schedule figures for `/metrics`.
    pub(super) fn schedule_metrics(&self) -> Option<crate::metrics::ScheduleMetrics> {
        (!self.schedules.book.is_empty()).then(|| self.schedules.book.metrics())
    }
}

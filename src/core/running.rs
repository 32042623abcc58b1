//! A task with a slot: starting attempts, their ends, handing a freed slot
//! to the next waiter, finishing, forgetting, and cancelling.
//!
//! `impl Core`, split from `mod.rs` by concern; `waiting.rs` holds the
//! way to a slot.

use super::groups::FreeKey;
use super::timers::TimerKind;
use super::{
    Action, AttemptOutcome, Core, EndReason, GroupId, Millis, Phase, RevokeReason, TaskId,
    TaskState, Tidy, NONE,
};

impl Core {
    // ---- running ----------------------------------------------------------

    /// Starts the next attempt of `t` in group `g`. With `handover` the slot
    /// just freed by another attempt passes straight on, so busy is unchanged.
    pub(super) fn start(&mut self, t: u32, g: u32, handover: bool, out: &mut Vec<Action>) {
        if !handover {
            let busy = self.groups.groups[g as usize].busy;
            self.groups.set_busy(g, busy + 1);
        }
        let now = self.now;
        let rec = &mut self.tasks[t as usize];
        rec.phase = Phase::Running;
        rec.attempt += 1;
        rec.group = g;
        rec.bypass = 0;
        rec.revoked = None;
        out.push(Action::Start {
            task: rec.id,
            attempt: rec.attempt,
            group: GroupId(g),
        });
        self.slot_taken(t, g);
        let rec = &mut self.tasks[t as usize];
        if let Some(extra) = &mut rec.extra {
            extra.preempting = false;
            if extra.attempt_timeout != NONE {
                extra.timer_at = now.0.saturating_add(extra.attempt_timeout);
                self.timers.add(self.timer(t, TimerKind::AttemptTimeout));
            }
        }
    }

    pub(super) fn attempt_ended(
        &mut self,
        t: u32,
        id: TaskId,
        outcome: AttemptOutcome,
        out: &mut Vec<Action>,
    ) {
        self.slot_left(t);
        let rec = &self.tasks[t as usize];
        let (g, phase, revoked, attempt, counted, max_attempts) = (
            rec.group,
            rec.phase,
            rec.revoked,
            rec.attempt,
            rec.counted_attempts(),
            rec.max_attempts,
        );
        if rec.attempt_timeout() != NONE {
            self.timers
                .cancel(&self.timer(t, TimerKind::AttemptTimeout));
        }
        let outcome = match (revoked, outcome) {
            (Some(RevokeReason::Timeout), o) if o != AttemptOutcome::Succeeded => {
                AttemptOutcome::Lost
            }
            (_, o) => o,
        };
        let mut retry_now = false;
        match outcome {
            _ if phase == Phase::Draining => self.release(t),
            o if revoked == Some(RevokeReason::Preempted) && o != AttemptOutcome::Succeeded => {
                return self.preempted_attempt_ended(t, out);
            }
            AttemptOutcome::Succeeded => self.finish(t, TaskState::Succeeded, out),
            AttemptOutcome::Cancelled => self.finish(t, TaskState::Cancelled, out),
            AttemptOutcome::Failed { retryable: false } => self.finish(t, TaskState::Failed, out),
            AttemptOutcome::Failed { retryable: true } | AttemptOutcome::Lost
                if counted >= max_attempts =>
            {
                self.finish(t, TaskState::Failed, out)
            }
            AttemptOutcome::Failed { retryable: true } | AttemptOutcome::Lost => {
                let rec = &mut self.tasks[t as usize];
                let backoff = self.groups.pools[rec.pool as usize].config.backoff;
                let extra = rec.extra_mut(backoff);
                let at = self.now.plus(extra.backoff.delay_after(counted));
                extra.timer_at = at.0;
                rec.phase = Phase::Backoff;
                rec.group = u32::MAX;
                out.push(Action::RetryAt {
                    task: id,
                    attempt: attempt + 1,
                    at,
                });
                if at <= self.now {
                    retry_now = true;
                } else {
                    self.timers.add(self.timer(t, TimerKind::Retry));
                }
            }
        }
        self.release_slot(g, out);
        if retry_now {
            self.enqueue_or_start(t, out);
        }
    }

    /// A slot of `g` is no longer used by its attempt: hand it straight to
    /// the next waiter, or count it free.
    pub(super) fn release_slot(&mut self, g: u32, out: &mut Vec<Action>) {
        let group = &self.groups.groups[g as usize];
        if group.busy <= group.capacity {
            if let Some(w) = self.choose_waiter(g, 1) {
                self.take_chosen(w);
                self.start(w.task, g, true, out);
                return;
            }
        }
        let busy = self.groups.groups[g as usize].busy;
        self.groups.set_busy(g, busy - 1);
        if busy == 1 && self.groups.groups[g as usize].capacity == 0 {
            self.tidy.push(Tidy::Group(g));
        }
        self.refill_if_reserved(self.groups.groups[g as usize].pool);
    }

    /// Gives free slots of `g` to waiters until none is free or none waits.
    pub(super) fn fill_group(&mut self, g: u32, out: &mut Vec<Action>) {
        while self.groups.groups[g as usize].free() > 0 {
            match self.choose_waiter(g, 0) {
                Some(w) => {
                    self.take_chosen(w);
                    self.start(w.task, g, false, out);
                }
                None => break,
            }
        }
    }

    /// A reservation went away without using a slot: free slots of the pool
    /// may now go to waiters. Groups are visited in preference order.
    pub(super) fn fill_pool(&mut self, p: u32, out: &mut Vec<Action>) {
        let all = self.groups.pools[p as usize].reqsets[0];
        let free: Vec<u32> = self.groups.reqsets[all as usize]
            .free_groups
            .iter()
            .map(FreeKey::group)
            .collect();
        for g in free {
            self.fill_group(g, out);
        }
    }

    // ---- ending -----------------------------------------------------------

    pub(super) fn finish(&mut self, t: u32, state: TaskState, out: &mut Vec<Action>) {
        self.finish_with(t, state, None, out);
    }

    /// Ends a task, saying why when a concurrency policy cancelled it.
    pub(super) fn finish_with(
        &mut self,
        t: u32,
        state: TaskState,
        reason: Option<EndReason>,
        out: &mut Vec<Action>,
    ) {
        let now = self.now;
        let rec = &self.tasks[t as usize];
        let deadline_missed = rec.deadline != NONE && now > Millis(rec.deadline);
        if deadline_missed {
            self.groups.pools[rec.pool as usize].deadline_missed += 1;
        }
        out.push(Action::Finished {
            task: rec.id,
            pool: self.groups.pools[rec.pool as usize].name.clone(),
            state,
            attempts: rec.attempt,
            deadline_missed,
            reason,
        });
        self.release(t);
    }

    /// Forgets a task's record.
    pub(super) fn release(&mut self, t: u32) {
        let fair = self.fair_key_of(t);
        let rec = &mut self.tasks[t as usize];
        self.by_id.remove(rec.id);
        rec.phase = Phase::Free;
        let (p, r) = (rec.pool, rec.reqset);
        let conc = rec.conc_key();
        rec.extra = None;
        self.release_keys(fair, conc);
        self.free_slab.push(t);
        self.groups.pools[p as usize].live -= 1;
        self.groups.reqsets[r as usize].live -= 1;
        self.tidy.push(Tidy::ReqSet(r));
        self.tidy.push(Tidy::Pool(p));
    }

    /// Cancels a live task (not already stopping), saying why when a
    /// concurrency policy does it.
    pub(super) fn cancel_with(&mut self, t: u32, reason: Option<EndReason>, out: &mut Vec<Action>) {
        let rec = &self.tasks[t as usize];
        let id = rec.id;
        let p = rec.pool;
        let held = matches!(rec.phase, Phase::Reserved | Phase::Ready);
        match rec.phase {
            Phase::Scheduled => {
                self.timers
                    .cancel(&self.timer(t, TimerKind::ReservationDue));
                self.timers.cancel(&self.timer(t, TimerKind::Miss));
                self.groups.pools[p as usize].scheduled -= 1;
            }
            Phase::Reserved => {
                self.timers.cancel(&self.timer(t, TimerKind::FixedStart));
                self.timers.cancel(&self.timer(t, TimerKind::Miss));
                let key = (rec.start_at(), rec.seq, t);
                let pool = &mut self.groups.pools[p as usize];
                pool.scheduled -= 1;
                pool.reservations.remove(&key);
            }
            Phase::Ready | Phase::Queued | Phase::Parked => self.take_waiter(t),
            Phase::Backoff => self.timers.cancel(&self.timer(t, TimerKind::Retry)),
            Phase::Running => {
                if rec.attempt_timeout() != NONE {
                    self.timers
                        .cancel(&self.timer(t, TimerKind::AttemptTimeout));
                }
                let rec = &mut self.tasks[t as usize];
                out.push(Action::Revoke {
                    task: id,
                    attempt: rec.attempt,
                    group: GroupId(rec.group),
                    reason: RevokeReason::Cancelled,
                });
                rec.phase = Phase::Draining;
                let deadline_missed = rec.deadline != NONE && self.now > Millis(rec.deadline);
                if deadline_missed {
                    self.groups.pools[p as usize].deadline_missed += 1;
                }
                out.push(Action::Finished {
                    task: id,
                    pool: self.groups.pools[p as usize].name.clone(),
                    state: TaskState::Cancelled,
                    attempts: rec.attempt,
                    deadline_missed,
                    reason,
                });
                return;
            }
            Phase::Draining | Phase::Free => unreachable!("checked in check_state"),
        }
        self.finish_with(t, TaskState::Cancelled, reason, out);
        if held {
            self.fill_pool(p, out);
        }
    }
}

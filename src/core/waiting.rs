//! A task's way to a slot: submission and recovery, fixed starts and their
//! reservations, the queues, and the timers that move a task along
//! (reservation due, fixed start, miss, urgency, retry, attempt timeout).
//!
//! `impl Core`, split from `mod.rs` by concern; `running.rs` holds what
//! happens once a task has a slot.

use super::fair::NO_KEY;
use super::placement;
use super::queue::QueueKey;
use super::timers::{Timer, TimerKind};
use super::{
    Action, Core, FairPart, FixedStart, GroupId, Millis, OnMiss, Phase, Resumed, RevokeReason,
    TaskExtra, TaskRec, TaskSpec, TaskState, NONE,
};

impl Core {
    // ---- submission -------------------------------------------------------

    /// A task of an earlier leadership: waiting again, or running where
    /// its worker re-attached (checked by `check_state`).
    pub(super) fn recover(
        &mut self,
        spec: TaskSpec,
        attempts: u32,
        preempted: u32,
        running: Option<Resumed>,
        out: &mut Vec<Action>,
    ) {
        let preempted = preempted.min(attempts);
        let Some(running) = running else {
            // Waiting for its next attempt; never past its last one. The
            // pool's default is read from the pool as `insert` makes it:
            // one not known yet (no worker registered since the takeover)
            // once counted as a budget of 1, so the successor started the
            // retry as attempt 1 again (issue 34, finding 11).
            let max = spec.max_attempts.unwrap_or_else(|| {
                let p = self.groups.pool(&spec.pool);
                self.groups.pools[p as usize].config.max_attempts
            });
            if attempts == 0 {
                self.submit(spec, 0, out);
                return;
            }
            let t = self.insert(spec, attempts);
            self.set_preempted(t, preempted);
            if attempts - preempted >= max {
                // Its last attempt ended (lost, as its worker did not
                // re-attach): the task failed, as it would have on the
                // leader that leased it. Running it once more reused the
                // last attempt's number (`[1 failed, 2 lost, 2]`, found by
                // the simulation's attempt check, issue 34 finding 11).
                self.finish(t, TaskState::Failed, out);
            } else {
                // A fixed start was honoured by its first attempt: a retry
                // waits like any other.
                self.enqueue_or_start(t, out);
            }
            return;
        };
        let t = self.insert(spec, attempts - 1);
        self.set_preempted(t, preempted);
        let p = self.tasks[t as usize].pool;
        let g = self.groups.group(p, &running.labels);
        self.groups.set_capacity(g, running.capacity);
        // As if started now: the slot, the phase, the attempt timeout; the
        // `Start` is not returned (the attempt already runs).
        let mut started = Vec::new();
        self.start(t, g, false, &mut started);
        self.fill_group(g, out);
        self.refill_if_reserved(p);
    }

    /// A recovered task's preempted attempts, which its budget does not
    /// count (lost at a takeover, they once counted: a task preempted
    /// twice had two attempts fewer under its successor).
    fn set_preempted(&mut self, t: u32, preempted: u32) {
        if preempted == 0 {
            return;
        }
        let backoff = self.groups.pools[self.tasks[t as usize].pool as usize]
            .config
            .backoff;
        self.tasks[t as usize].extra_mut(backoff).preempted = preempted;
    }

    pub(super) fn submit(&mut self, spec: TaskSpec, attempts: u32, out: &mut Vec<Action>) {
        let fixed_start = spec.fixed_start;
        let t = self.insert(spec, attempts);
        let p = self.tasks[t as usize].pool;
        let Some(fixed) = fixed_start else {
            self.enqueue_or_start(t, out);
            return;
        };
        let now = self.now;
        let lead = self.groups.pools[p as usize].config.reservation_lead;
        if now > fixed.start_at.plus(fixed.tolerance) {
            self.missed(t, out);
            return;
        }
        self.timers.add(self.timer(t, TimerKind::Miss));
        self.groups.pools[p as usize].scheduled += 1;
        if now >= fixed.start_at.minus(lead) {
            self.reserve(t);
            // A start_at already reached fires at once.
            self.fire_timers(out);
        } else {
            self.tasks[t as usize].phase = Phase::Scheduled;
            self.timers.add(self.timer(t, TimerKind::ReservationDue));
        }
    }

    /// Adds a live task's record (no queue, no timer yet).
    pub(super) fn insert(&mut self, spec: TaskSpec, attempts: u32) -> u32 {
        let p = self.groups.pool(&spec.pool);
        let r = self.groups.reqset(p, &spec.required);
        let (fair, conc) = self.intern_keys(p, &spec);
        let config = &self.groups.pools[p as usize].config;
        let seq = self.next_seq;
        self.next_seq += 1;
        let needs_extra = spec.fixed_start.is_some()
            || spec.est_runtime.is_some()
            || spec.attempt_timeout.is_some()
            || spec.backoff.is_some()
            || conc != NO_KEY
            || !spec.preemptible;
        let extra = needs_extra.then(|| {
            Box::new(TaskExtra {
                fixed: spec.fixed_start,
                est_runtime: spec.est_runtime.map_or(NONE, |d| d.0),
                attempt_timeout: spec.attempt_timeout.map_or(NONE, |d| d.0),
                timer_at: NONE,
                backoff: spec.backoff.unwrap_or(config.backoff),
                conc,
                conc_limit: spec.concurrency_limit,
                preemptible: spec.preemptible,
                preempted: 0,
                started: 0,
                kept_for: None,
                preempting: false,
            })
        });
        let rec = TaskRec {
            id: spec.id,
            seq,
            deadline: spec.deadline.map_or(NONE, |d| d.0),
            extra,
            pool: p,
            reqset: r,
            priority: spec.priority,
            attempt: attempts,
            max_attempts: spec.max_attempts.unwrap_or(config.max_attempts),
            bypass: 0,
            group: u32::MAX,
            phase: Phase::Free,
            urgent: false,
            revoked: None,
        };
        let t = match self.free_slab.pop() {
            Some(t) => {
                self.tasks[t as usize] = rec;
                t
            }
            None => {
                self.tasks.push(rec);
                (self.tasks.len() - 1) as u32
            }
        };
        self.set_fair_part(
            t,
            FairPart {
                tag: NONE,
                fair,
                weight: spec.fairness_weight,
            },
        );
        self.by_id.insert(spec.id, t);
        self.groups.pools[p as usize].live += 1;
        self.groups.reqsets[r as usize].live += 1;

        t
    }

    /// The timer of `kind` for task `t`, computed from its fields.
    pub(super) fn timer(&self, t: u32, kind: TimerKind) -> Timer {
        let rec = &self.tasks[t as usize];
        let pool = &self.groups.pools[rec.pool as usize];
        let fixed = rec.fixed().unwrap_or(FixedStart {
            start_at: Millis::ZERO,
            tolerance: Millis::ZERO,
        });
        let at = match kind {
            TimerKind::ReservationDue => fixed.start_at.minus(pool.config.reservation_lead),
            TimerKind::FixedStart => fixed.start_at,
            TimerKind::Miss => fixed.start_at.plus(fixed.tolerance),
            TimerKind::Urgent => Millis(rec.deadline).minus(pool.config.urgency_window),
            TimerKind::Retry | TimerKind::AttemptTimeout => Millis(rec.timer_at()),
        };
        Timer {
            at,
            kind,
            seq: rec.seq,
            task: t,
        }
    }

    /// Scheduled → Reserved: the pool starts holding a slot back.
    pub(super) fn reserve(&mut self, t: u32) {
        let rec = &mut self.tasks[t as usize];
        rec.phase = Phase::Reserved;
        let key = (rec.start_at(), rec.seq, t);
        let pool = rec.pool;
        self.groups.pools[pool as usize].reservations.insert(key);
        self.timers.add(self.timer(t, TimerKind::FixedStart));
    }

    /// Reserved → Ready at `start_at`: start on the best matching free slot
    /// it may take (the held slot is ours), or wait for one.
    pub(super) fn fixed_start_due(&mut self, t: u32, out: &mut Vec<Action>) {
        let rec = &mut self.tasks[t as usize];
        rec.phase = Phase::Ready;
        let key = (rec.start_at(), rec.seq, t);
        let pool = &mut self.groups.pools[rec.pool as usize];
        pool.scheduled -= 1;
        pool.waiting += 1;
        pool.ready_fixed.insert(key);
        if !self.conc_allows_start(t) {
            return;
        }
        if let Some(g) = self.best_free_group_for(t) {
            self.take_waiter(t);
            self.start(t, g, false, out);
        }
    }

    /// A fixed start that could not happen within its tolerance.
    pub(super) fn missed(&mut self, t: u32, out: &mut Vec<Action>) {
        let p = self.tasks[t as usize].pool;
        match self.groups.pools[p as usize].config.on_miss {
            OnMiss::Skip => self.finish(t, TaskState::Missed, out),
            OnMiss::Run => {
                if let Some(extra) = &mut self.tasks[t as usize].extra {
                    extra.fixed = None;
                }
                self.enqueue_or_start(t, out);
            }
        }
    }

    pub(super) fn queue_key(&self, t: u32) -> QueueKey {
        let rec = &self.tasks[t as usize];
        QueueKey::new(
            rec.urgent.then_some(rec.deadline),
            rec.priority,
            rec.seq,
            self.fair_key_of(t),
        )
    }

    pub(super) fn enqueue(&mut self, t: u32) {
        let now = self.now;
        let rec = &mut self.tasks[t as usize];
        rec.phase = Phase::Queued;
        let window = self.groups.pools[rec.pool as usize].config.urgency_window;
        rec.urgent = rec.deadline != NONE && now >= Millis(rec.deadline).minus(window);
        let (pool, r, seq, est, deadline, urgent) = (
            rec.pool,
            rec.reqset,
            rec.seq,
            rec.est_runtime(),
            rec.deadline,
            rec.urgent,
        );
        let key = self.queue_key(t);
        self.joined_queue(t);
        let tag = self.start_tag(t);
        self.groups.reqsets[r as usize].queue.push(key, t, tag);
        let pool = &mut self.groups.pools[pool as usize];
        pool.waiting += 1;
        if est != NONE {
            pool.backfill.insert((seq, t));
        }
        if deadline != NONE && !urgent {
            self.timers.add(self.timer(t, TimerKind::Urgent));
        }
    }

    /// Takes a waiter that `choose_waiter` picked out of its queue.
    pub(super) fn take_chosen(&mut self, w: placement::Waiter) {
        let Some((r, key)) = w.head else {
            return self.take_waiter(w.task);
        };
        let t = w.task;
        // The queue is left by the key `choose_waiter` read from its head,
        // so the cache misses on the record and on the queue overlap.
        let rec = &self.tasks[t as usize];
        debug_assert_eq!(rec.phase, Phase::Queued);
        debug_assert_eq!(key, self.queue_key(t));
        let (p, seq) = (rec.pool, rec.seq);
        let has_urgent_timer = rec.deadline != NONE && !rec.urgent;
        let backfill = rec.est_runtime() != NONE;
        let removed = self.groups.reqsets[r as usize].queue.remove(&key, t);
        debug_assert!(removed, "queued task not in its queue");
        self.tag_started(p, w.tag);
        let pool = &mut self.groups.pools[p as usize];
        pool.waiting -= 1;
        if backfill {
            pool.backfill.remove(&(seq, t));
        }
        if has_urgent_timer {
            self.timers.cancel(&self.timer(t, TimerKind::Urgent));
        }
        self.left_queue(t, true);
    }

    /// Takes a Queued, Ready or Parked task out of wherever it waits.
    pub(super) fn take_waiter(&mut self, t: u32) {
        if self.tasks[t as usize].phase == Phase::Parked {
            return self.unpark_one(t);
        }
        let key = self.queue_key(t);
        let rec = &self.tasks[t as usize];
        let (p, r, seq, phase) = (rec.pool, rec.reqset, rec.seq, rec.phase);
        let has_urgent_timer = rec.deadline != NONE && !rec.urgent;
        let backfill = rec.est_runtime() != NONE;
        let pool = &mut self.groups.pools[p as usize];
        pool.waiting -= 1;
        match phase {
            Phase::Queued => {
                if backfill {
                    pool.backfill.remove(&(seq, t));
                }
                let removed = self.groups.reqsets[r as usize].queue.remove(&key, t);
                debug_assert!(removed, "queued task not in its queue");
                if has_urgent_timer {
                    self.timers.cancel(&self.timer(t, TimerKind::Urgent));
                }
                // Leaving for a slot or for good: `start` or `finish`
                // follows, and either way a parked task may take the turn
                // only once the attempt is counted.
                self.left_queue(t, false);
            }
            Phase::Ready => {
                let start_at = self.tasks[t as usize].start_at();
                pool.ready_fixed.remove(&(start_at, seq, t));
                pool.reservations.remove(&(start_at, seq, t));
                self.timers.cancel(&self.timer(t, TimerKind::Miss));
                // One reservation fewer: held slots may be released.
                self.refill.push(p);
            }
            other => unreachable!("take_waiter on {other:?}"),
        }
    }

    // ---- time -------------------------------------------------------------

    /// Fires the timers due at `now`; returns whether any was due.
    pub(super) fn fire_timers(&mut self, out: &mut Vec<Action>) -> bool {
        let mut fired = false;
        while let Some(timer) = self.timers.pop_due(self.now) {
            fired = true;
            let t = timer.task;
            let Some(rec) = self.tasks.get(t as usize) else {
                continue;
            };
            if rec.seq != timer.seq || rec.phase == Phase::Free {
                continue;
            }
            let p = rec.pool;
            match (timer.kind, rec.phase) {
                (TimerKind::ReservationDue, Phase::Scheduled) => self.reserve(t),
                (TimerKind::FixedStart, Phase::Reserved) => self.fixed_start_due(t, out),
                (TimerKind::Miss, Phase::Ready) => {
                    let rec = &self.tasks[t as usize];
                    let key = (rec.start_at(), rec.seq, t);
                    let pool = &mut self.groups.pools[p as usize];
                    pool.ready_fixed.remove(&key);
                    pool.reservations.remove(&key);
                    pool.waiting -= 1;
                    self.missed(t, out);
                    self.fill_pool(p, out);
                }
                (TimerKind::Urgent, Phase::Queued) if !rec.urgent => {
                    let old = self.queue_key(t);
                    let r = rec.reqset;
                    self.tasks[t as usize].urgent = true;
                    let new = self.queue_key(t);
                    // A named key's task keeps its tag; the unnamed key's
                    // is placed between its neighbours'.
                    let part = self.fair_part(t);
                    let tag = if part.fair != NO_KEY {
                        part.tag
                    } else {
                        self.groups.pools[p as usize].vt
                    };
                    let queue = &mut self.groups.reqsets[r as usize].queue;
                    queue.remove(&old, t);
                    queue.push(new, t, tag);
                }
                (TimerKind::Retry, Phase::Backoff) if rec.timer_at() == timer.at.0 => {
                    self.enqueue_or_start(t, out)
                }
                (TimerKind::AttemptTimeout, Phase::Running)
                    if rec.timer_at() == timer.at.0 && rec.revoked.is_none() =>
                {
                    let rec = &mut self.tasks[t as usize];
                    rec.revoked = Some(RevokeReason::Timeout);
                    out.push(Action::Revoke {
                        task: rec.id,
                        attempt: rec.attempt,
                        group: GroupId(rec.group),
                        reason: RevokeReason::Timeout,
                    });
                }
                _ => {}
            }
        }
        fired
    }
}

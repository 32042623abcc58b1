//! Tasks: submissions (new and recovered from the journal), refusals,
//! cancels, status, and carrying out the core's actions (leases, revokes,
//! retries, finished tasks with their journal records).

use super::*;

impl Driver {
    // ---- tasks ------------------------------------------------------------

    pub(super) fn submitted(
        &mut self,
        now: Millis,
        seq: u64,
        pool: PoolName,
        task: Result<Task, WireError>,
    ) {
        let id = TaskId(seq);
        self.next_unseen = self.next_unseen.max(seq + 1);
        if self.ledger.knows(id) {
            return; // a redelivery after a consumer restart
        }
        let schedule = task.as_ref().ok().and_then(|t| t.schedule.clone());
        let stored_at = task.as_ref().ok().and_then(|t| t.stored_at);
        let spec = task.and_then(|t| {
            let payload = t.payload().clone();
            let key = t.key().map(str::to_string);
            let extra = TaskExtra {
                traceparent: t.trace_context().map(str::to_string),
                owner: t.owner.clone(),
            };
            t.to_spec(id, self.settings.max_payload_bytes)
                .map(|spec| (spec, payload, key, extra))
                .map_err(WireError::from)
        });
        if let Ok((_, _, Some(key), _)) = &spec {
            if let Some(original) = self.ledger.by_key(key) {
                // The same idempotency key as a task we hold: this is that
                // task (JetStream's Nats-Msg-Id window may have passed).
                tracing::info!(task_id = %id, original = %original, "duplicate idempotency key");
                self.ledger.alias(id, original);
                self.out.push(Output::Discard { seq });
                return;
            }
        }
        let (spec, payload, key, extra) = match spec {
            Ok(x) => x,
            Err(e) => {
                self.refuse_submission(now, id, pool, e);
                return;
            }
        };
        let fixed = spec.fixed_start.is_some();
        let spec_pool = spec.pool.clone();
        // Known before the core answers: a Start it returns reads the payload.
        self.ledger
            .accept(id, &spec_pool, payload, key.as_deref(), extra, now);
        self.ledger.set_schedule(id, schedule);
        if let Err(e) = self.apply(now, Event::Submitted(spec)) {
            // A limit or a time too far ahead: refused like a malformed
            // submission (recorded failed, dead-lettered), never left queued.
            self.ledger.unaccept(id);
            self.refuse_submission(now, id, spec_pool, e.into());
            return;
        }
        let live = self.ledger.is_live(id);
        if live {
            self.insert_live(seq);
            self.trace_wait(id, stored_at.unwrap_or(now));
        }
        tracing::debug!(task_id = %id, "task accepted");
        // A submission read back at takeover was announced by the leader
        // that accepted it: announcing it again would flood every listener
        // with one event per waiting task.
        if live && !self.catching_up && self.core.task(id).is_some_and(|v| v.attempts == 0) {
            let state = if fixed {
                TaskState::Scheduled
            } else {
                TaskState::Queued
            };
            self.event(now, id, &spec_pool, state, 0, None, None);
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
    pub(super) fn recovered(
        &mut self,
        now: Millis,
        seq: u64,
        pool: PoolName,
        task: Result<Task, WireError>,
        record: TaskRecord,
    ) {
        let id = TaskId(seq);
        if record.state.is_terminal() {
            return self.finished_before(seq, pool, task, record);
        }
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
        let preempted = record
            .attempts
            .iter()
            .filter(|a| a.outcome.as_deref() == Some(crate::ledger::PREEMPTED))
            .count() as u32;
        let running_on = last.worker.clone().zip(Some(last.group.clone()));
        let credential = last.credential.clone();
        self.ledger.accept(
            id,
            &spec.pool,
            task.payload().clone(),
            task.key(),
            TaskExtra {
                traceparent: task.trace_context().map(str::to_string),
                owner: task.owner.clone(),
            },
            now,
        );
        self.ledger.set_schedule(id, task.schedule.clone());
        let kept = open.then(|| record.clone());
        let first_start = record.attempts.first().map_or(now, |a| a.started_at);
        let submitted_at = task.stored_at.unwrap_or(now).min(first_start);
        self.ledger.restore(id, record.attempts, record.error);
        self.insert_live(seq);
        tracing::info!(task_id = %id, attempts = attempt, open, "task recovered from the journal");
        if self.settings.trace.is_some() {
            self.traces.entry(id).or_default().submitted_at = submitted_at;
        }
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
                            record: kept.expect("an open attempt's record is kept"),
                            spec,
                            attempt,
                            preempted,
                            worker,
                            credential,
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
        self.resume_waiting(now, spec, attempt, preempted);
        self.trace_wait(id, submitted_at);
    }

    /// Telemetry on: notes when task `id` was submitted (if not noted yet)
    /// and, if it waits now, why its wait began.
    pub(super) fn trace_wait(&mut self, id: TaskId, submitted_at: Millis) {
        if self.settings.trace.is_none() {
            return;
        }
        let Some(view) = self.core.task(id) else {
            return;
        };
        let waiting = view.reason.map(|reason| (view.attempts + 1, reason));
        let notes = self.traces.entry(id).or_insert_with(|| TraceNotes {
            submitted_at,
            waits: Vec::new(),
        });
        if let Some(wait) = waiting {
            notes.waits.push(wait);
        }
    }

    /// Telemetry on: the spans of task `id`, which just finished (`None`
    /// when its submitter's trace context says not sampled).
    fn task_trace(
        &mut self,
        now: Millis,
        outcome: &Outcome,
        traceparent: Option<&str>,
    ) -> Option<crate::telemetry::TaskTrace> {
        let salt = self.settings.trace?;
        let notes = self.traces.remove(&outcome.id);
        let ids = crate::telemetry::TaskTraceIds::of(traceparent, salt, outcome.id)?;
        let first_start = outcome.attempts.first().map_or(now, |a| a.started_at);
        let (submitted_at, waits) = match notes {
            Some(n) => (n.submitted_at.min(first_start), n.waits),
            None => (first_start, Vec::new()),
        };
        Some(crate::telemetry::TaskTrace {
            ids,
            pool: outcome.pool.clone(),
            submitted_at,
            finished_at: now,
            state: outcome.state,
            error: outcome.error.clone(),
            waits,
            attempts: outcome.attempts.clone(),
            schedule: outcome.schedule.as_ref().map(|(name, _)| name.clone()),
        })
    }

    /// A task an earlier leadership finished whose submission the stream
    /// still holds (the purge goes below the oldest unfinished task only),
    /// read back with its submission (the simulation's leaders): its key
    /// is the record's or else the submission's.
    fn finished_before(
        &mut self,
        seq: u64,
        pool: PoolName,
        task: Result<Task, WireError>,
        mut record: TaskRecord,
    ) {
        self.next_unseen = self.next_unseen.max(seq + 1);
        if record.key.is_none() {
            record.key = task.ok().and_then(|t| t.key().map(str::to_string));
        }
        record.pool = pool;
        self.bind_finished(seq, record);
    }

    /// A task an earlier leadership finished, from its result record
    /// ([`Input::FinishedBefore`]): nothing to run, but its idempotency key
    /// stays bound to it, and its outcome retained, as under that
    /// leadership. Otherwise a later submission with the key — one that
    /// leadership discarded, one past JetStream's duplicate window, one
    /// with another `Nats-Msg-Id`, a cancel answered for this task — would
    /// run as a task of its own. Records come here out of stream order
    /// (a warm copy hands its keyed results first), so this does not move
    /// how far the stream was read.
    pub(super) fn bind_finished(&mut self, seq: u64, record: TaskRecord) {
        let id = TaskId(seq);
        if !record.state.is_terminal() || self.ledger.knows(id) {
            return;
        }
        let schedule = record.schedule();
        let outcome = Outcome {
            id,
            pool: record.pool,
            state: record.state,
            output: record.output,
            error: record.error,
            attempts: record.attempts,
            deadline_missed: record.deadline_missed,
            schedule,
        };
        self.ledger
            .restore_finished(&outcome, record.key.as_deref());
    }

    /// `seq`'s task is live: it holds the purge floor until it ends.
    fn insert_live(&mut self, seq: u64) {
        let ledger = &self.ledger;
        self.live_seqs.insert(seq, |s| ledger.is_live(TaskId(s)));
    }

    /// A recovered task waits for attempt `attempts + 1` (`preempted` of
    /// them not counted), or has failed if it used them all.
    pub(super) fn resume_waiting(
        &mut self,
        now: Millis,
        spec: crate::core::TaskSpec,
        attempts: u32,
        preempted: u32,
    ) {
        let (id, pool) = (spec.id, spec.pool.clone());
        let event = Event::Recovered {
            spec,
            attempts,
            preempted,
            running: None,
        };
        if let Err(e) = self.apply(now, event) {
            self.ledger.unaccept(id);
            self.refuse_submission(now, id, pool, e.into());
        }
    }

    /// The grace is over: attempts not re-attached are lost, their tasks
    /// wait for their next attempt.
    pub(super) fn end_reattach_grace(&mut self, now: Millis) {
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
            self.resume_waiting(now, p.spec, p.attempt, p.preempted);
        }
    }

    /// Whether `attempt` of `task` waits for `worker` to re-attach it.
    pub(super) fn is_parked(&self, worker_id: &str, task: TaskId, attempt: u32) -> bool {
        self.parked
            .get(&task)
            .is_some_and(|p| p.attempt == attempt && p.worker == worker_id)
    }

    /// A submission no credential's proof verifies on, with auth on: an
    /// unsigned or forged publish to the submit subject, which any NATS
    /// user allowed to publish there can make by the hundred thousand.
    /// Nobody can be told and nobody asked for it, so it costs one count
    /// by code and a place in the last [`crate::metrics::REFUSED_SAMPLE`]
    /// (`/metrics`, and a warning for the first and every 1,000th) — no
    /// task record, no dead letter, no event — and the stream drops it
    /// with the finished submissions ([`Output::Discard`]). A refusal of a
    /// credential whose proof verifies (a pool or role it may not use) is
    /// recorded and dead-lettered as before: attributable, and bounded by
    /// that NATS user's limits.
    pub(super) fn unattributed(&mut self, seq: u64, error: WireError) {
        self.next_unseen = self.next_unseen.max(seq + 1);
        if self.ledger.knows(TaskId(seq)) {
            return;
        }
        let code = error.code.as_str().to_string();
        let count = self.refused_unattributed.entry(code.clone()).or_insert(0);
        *count += 1;
        let count = *count;
        let mut reason = error.message;
        crate::task::cut_chars(&mut reason, 200);
        if count == 1 || count % 1_000 == 0 {
            tracing::warn!(seq, code = %code, count, reason = %reason, "submissions without a verifying proof dropped");
        } else {
            tracing::debug!(seq, code = %code, "submission without a verifying proof dropped");
        }
        if self.refused_sample.len() == crate::metrics::REFUSED_SAMPLE {
            self.refused_sample.pop_front();
        }
        self.refused_sample
            .push_back(crate::metrics::RefusedSubmission { seq, code, reason });
        self.out.push(Output::Discard { seq });
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
        // Not traced (nothing ran); a recovered task refused again leaves
        // no note behind.
        self.traces.remove(&id);
        let outcome = Outcome {
            id,
            pool,
            state: TaskState::Failed,
            output: None,
            error: Some(format!("submission refused: {} [{}]", e.message, e.code)),
            attempts: Vec::new(),
            deadline_missed: false,
            schedule: None,
        };
        self.ledger.record_outcome(&outcome, None);
        self.record_finished(now, outcome, Some(e));
    }

    pub(super) fn cancel(&mut self, now: Millis, id: TaskId) -> Result<Ack, WireError> {
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

    /// Announces a task's new state on `P.events.<task_id>`: id, pool,
    /// state, attempt, group and worker — never its output or error text
    /// (issue 20: every submitter and reader may subscribe to every
    /// task's events). A waiter reads the task through the API, where
    /// its credential is checked, once the event says it ended.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn event(
        &mut self,
        now: Millis,
        id: TaskId,
        pool: &PoolName,
        state: TaskState,
        attempt: u32,
        group: Option<&Labels>,
        worker: Option<&str>,
    ) {
        if !self.settings.events.announces(state) {
            return;
        }
        let subject = self.event_subject(id);
        self.publish(
            subject,
            &wire::TaskEventRef {
                v: PROTOCOL_VERSION,
                task_id: id,
                pool,
                state,
                attempt,
                group,
                worker,
                at: now,
            },
        );
    }

    /// Announces a finished task (recorded in the ledger) and has its
    /// result stored.
    pub(super) fn record_finished(
        &mut self,
        now: Millis,
        done: Outcome,
        dead_letter: Option<WireError>,
    ) {
        let last = done.attempts.last();
        self.event(
            now,
            done.id,
            &done.pool,
            done.state,
            done.attempts.len() as u32,
            last.map(|a| &a.group),
            last.and_then(|a| a.worker.as_deref()),
        );
        let id = done.id;
        let mut record = TaskRecord::from_outcome(done);
        // Its key goes with its result: a successor binds it again from
        // there (`Input::FinishedBefore`), the submission may be purged.
        record.key = self.ledger.retained_key(id).map(str::to_string);
        if record.fit(self.settings.max_record_bytes) {
            tracing::warn!(task_id = %id, "the task's result was cut to fit one NATS message");
        }
        self.out.push(Output::Persist {
            seq: id.0,
            record,
            dead_letter,
        });
    }

    pub(super) fn carry_out(&mut self, now: Millis, action: Action) {
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
                let (credential, subject, together) = match self.workers.get(&*worker_id) {
                    Some(w) => (
                        w.credential.clone(),
                        w.lease_subject.clone(),
                        w.lease_batches,
                    ),
                    None => (None, self.subjects.lease(&worker_id), false),
                };
                let Some(entry) = self.ledger.started(
                    task,
                    attempt,
                    labels.clone(),
                    Some(worker_id.to_string()),
                    credential,
                    now,
                ) else {
                    return;
                };
                let payload = entry.payload.clone();
                // Telemetry on: the attempt span's own, so the worker's
                // spans (or its command's) hang under it.
                let traceparent = match self.settings.trace.and_then(|salt| {
                    crate::telemetry::TaskTraceIds::of(
                        entry.extra.traceparent.as_deref(),
                        salt,
                        task,
                    )
                }) {
                    Some(ids) => Some(ids.attempt_traceparent(attempt)),
                    None => entry.extra.traceparent.clone(),
                };
                let schedule = entry.schedule().cloned().unzip();
                self.dirty.insert(task);
                let lease = Lease {
                    v: PROTOCOL_VERSION,
                    task_id: task,
                    attempt,
                    pool: pool.clone(),
                    group: labels.clone(),
                    payload,
                    ttl: self.settings.lease_ttl,
                    epoch: self.epoch,
                    traceparent,
                    schedule: schedule.0,
                    scheduled_at: schedule.1,
                };
                self.update_worker(now, &worker_id, |w| {
                    w.running.insert((task, attempt));
                });
                self.put_lease(
                    task,
                    LeaseState {
                        attempt,
                        worker: worker_id.clone(),
                        // Counted from when it is sent (`LeasesSent`): it
                        // waits for its journal record first, which a NATS
                        // restart can hold up for seconds. Until then a
                        // generous bound, should that report never come.
                        expires: now.plus(self.settings.lease_ttl).plus(UNSENT_LEASE_GRACE),
                        reattached: false,
                    },
                );
                tracing::debug!(task_id = %task, attempt, worker_id = %worker_id, group = %labels, "attempt leased");
                self.out.push(Output::Lease {
                    subject,
                    body: wire::encode(&lease).into(),
                    task,
                    attempt,
                    together,
                });
                self.event(
                    now,
                    task,
                    &pool,
                    TaskState::Running,
                    attempt,
                    Some(&labels),
                    Some(&worker_id),
                );
            }
            Action::Revoke {
                task,
                attempt,
                reason,
                ..
            } => {
                self.ledger.revoked(task, attempt, reason);
                if let Some(lease) = self.leases.get(&task) {
                    if lease.attempt == attempt {
                        let subject = self.subjects.revoke(&lease.worker);
                        tracing::debug!(task_id = %task, attempt, worker_id = %lease.worker, ?reason, "attempt revoked");
                        // A preempted command gets SIGTERM and the pool's
                        // grace before SIGKILL (SPEC §9).
                        let grace = (reason == RevokeReason::Preempted)
                            .then(|| {
                                let pool = self.core.task(task)?.pool;
                                Some(self.core.pool_config(&pool)?.preemption_grace)
                            })
                            .flatten();
                        self.publish(
                            subject,
                            &Revoke {
                                v: PROTOCOL_VERSION,
                                task_id: task,
                                attempt,
                                epoch: self.epoch,
                                reason,
                                grace,
                            },
                        );
                    }
                }
            }
            Action::RetryAt { task, attempt, at } => {
                tracing::debug!(task_id = %task, attempt, at = at.0, "retry scheduled");
                self.trace_wait(task, now);
                let pool = self
                    .core
                    .task(task)
                    .map(|t| t.pool.clone())
                    .unwrap_or_default();
                self.event(now, task, &pool, TaskState::Queued, attempt - 1, None, None);
            }
            Action::Preempted { task, attempt } => {
                tracing::debug!(task_id = %task, attempt, "attempt preempted");
                self.trace_wait(task, now);
                let pool = self
                    .core
                    .task(task)
                    .map(|t| t.pool.clone())
                    .unwrap_or_default();
                self.event(now, task, &pool, TaskState::Queued, attempt, None, None);
            }
            Action::Finished {
                task,
                pool,
                state,
                attempts: _,
                deadline_missed,
                reason: _,
            } => {
                // A running attempt of a cancelled task was revoked and ends
                // with it (the ledger closes it): the worker's late report
                // finds no task to update.
                let Some(done) = self.ledger.finish(task, pool, state, deadline_missed, now) else {
                    return;
                };
                tracing::info!(task_id = %task, state = %state, attempts = done.outcome.attempts.len(), "task finished");
                let trace = self.task_trace(now, &done.outcome, done.extra.traceparent.as_deref());
                self.record_finished(now, done.outcome, None);
                if let Some(trace) = trace {
                    self.out.push(Output::Trace(Box::new(trace)));
                }
            }
        }
    }
}

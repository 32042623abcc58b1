//! Attempts under way: the worker's claim on a lease, renewals, and
//! outcomes recorded in the ledger.

use super::*;

impl Driver {
    /// Checks a worker's claim on a lease.
    pub(super) fn check_lease(
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
            Some(l) if l.attempt == attempt && &*l.worker == worker_id => {
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

    pub(super) fn renew(&mut self, now: Millis, r: Renew) -> Result<RenewReply, WireError> {
        self.check_lease(&r.worker_id, r.task_id, r.attempt, r.epoch)?;
        if let Some(mut l) = self.drop_lease(r.task_id) {
            l.expires = now.plus(self.settings.lease_ttl);
            self.put_lease(r.task_id, l);
        }
        self.touch(&r.worker_id, now);
        Ok(RenewReply {
            v: PROTOCOL_VERSION,
            ttl: self.settings.lease_ttl,
        })
    }

    /// An attempt is lost (its worker gone, its lease expired): recorded
    /// with `error`, and the core hears it (a retry, or the task's end).
    pub(super) fn lose(&mut self, now: Millis, task: TaskId, attempt: u32, error: Option<String>) {
        self.ended(task, attempt, AttemptOutcome::Lost, None, error, now);
        let _ = self.apply(
            now,
            Event::AttemptEnded {
                task,
                attempt,
                outcome: AttemptOutcome::Lost,
            },
        );
    }

    /// Records an attempt's end in the ledger (journaled this turn);
    /// returns the outcome the core must hear.
    pub(super) fn ended(
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

    pub(super) fn outcome(&mut self, now: Millis, o: AttemptReport) -> Result<Ack, WireError> {
        self.check_lease(&o.worker_id, o.task_id, o.attempt, o.epoch)?;
        self.drop_lease(o.task_id);
        self.release_slot(now, &o.worker_id, o.task_id, o.attempt);
        self.touch(&o.worker_id, now);
        let (outcome, output, error) = match o.result {
            AttemptResult::Succeeded { output } => (AttemptOutcome::Succeeded, Some(output), None),
            AttemptResult::Failed { error, retryable } => {
                (AttemptOutcome::Failed { retryable }, None, Some(error))
            }
            // A worker says `cancelled` only of an attempt it was told to
            // stop, and a cancel ends its task at once: a live task's
            // attempt ending so was revoked for another reason (its
            // timeout, an earlier leader's revoke this one never heard of)
            // and is lost, never the task's cancel (the failover
            // simulation found a successor cancelling a task that way).
            AttemptResult::Cancelled => (AttemptOutcome::Lost, None, Some(REVOKED.to_string())),
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
}

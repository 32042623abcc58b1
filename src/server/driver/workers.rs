//! Workers: registration (with re-attachment of running attempts after a
//! leader change), heartbeats, draining and removal, and each group's
//! capacity as the sum of its workers' shares.

use super::*;

impl Driver {
    // ---- workers ----------------------------------------------------------

    /// The worker of the group with the most free slots (ties: the smallest
    /// id): the first entry of the group's free index, O(log workers).
    pub(super) fn pick_worker(&self, pool: &PoolName, labels: &Labels) -> Option<Arc<str>> {
        let group = self.groups.get(&(pool.clone(), labels.clone()))?;
        group.free.first().map(|(_, id)| id.clone())
    }

    /// Changes a worker with `change`, keeping its group's slot total and
    /// free index right, and tells the core the group's new capacity if it
    /// changed. Every change of a worker's slots, running attempts or
    /// draining goes through here: O(log workers), never a scan.
    pub(super) fn update_worker(
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
        if old_key == new_key && old_share == new_share {
            return;
        }
        let key = (w.pool.clone(), w.labels.clone());
        let Some(group) = self.groups.get_mut(&key) else {
            return;
        };
        if old_key != new_key {
            if let Some(k) = old_key {
                group.free.remove(&(k, w.id.clone()));
            }
            if let Some(k) = new_key {
                group.free.insert((k, w.id.clone()));
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
    pub(super) fn set_capacity(
        &mut self,
        now: Millis,
        pool: &PoolName,
        labels: &Labels,
        slots: u32,
    ) {
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
    pub(super) fn release_slot(
        &mut self,
        now: Millis,
        worker_id: &str,
        task: TaskId,
        attempt: u32,
    ) {
        self.update_worker(now, worker_id, |w| {
            w.running.remove(&(task, attempt));
        });
    }

    pub(super) fn register(
        &mut self,
        now: Millis,
        r: Register,
        who: &Registrant,
    ) -> Result<RegisterReply, WireError> {
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
            let same_process =
                r.instance.is_some() && w.instance == r.instance && w.credential == who.credential;
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
                self.touch(&r.worker_id, now);
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
        self.check_registrant(&r, who)?;
        tracing::info!(worker_id = %r.worker_id, pool = %r.pool, group = %r.labels, slots = r.slots, "worker registered");
        let key = (r.pool.clone(), r.labels.clone());
        let group = self.groups.entry(key).or_default();
        group.workers += 1;
        let id: Arc<str> = Arc::from(r.worker_id.as_str());
        self.workers.insert(
            r.worker_id.clone(),
            WorkerState {
                id: id.clone(),
                lease_subject: self.subjects.lease(&r.worker_id),
                pool: r.pool,
                labels: r.labels,
                slots: 0,
                draining: false,
                last_seen: now,
                instance: r.instance,
                running: BTreeSet::new(),
                lease_batches: r.lease_batches,
                credential: who.credential.clone(),
                revoke_budget: r.slots.max(1),
                budget_from: now,
            },
        );
        if let Some(c) = &who.credential {
            let held = self.held_by.entry(c.clone()).or_default();
            held.0 += 1;
            held.1 += u64::from(r.slots);
        }
        self.silence_deadlines
            .insert((now.plus(self.settings.worker_timeout), id));
        let adopted = self.reattach(now, &r.worker_id, &who.credential, &r.running, r.slots);
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
    pub(super) fn reattach(
        &mut self,
        now: Millis,
        worker_id: &str,
        credential: &Option<String>,
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
                    && &p.credential == credential
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
                preempted: p.preempted,
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
            let worker = match self.workers.get_mut(worker_id) {
                Some(w) => {
                    w.running.insert((a.task_id, a.attempt));
                    w.id.clone()
                }
                None => Arc::from(worker_id),
            };
            self.put_lease(
                a.task_id,
                LeaseState {
                    attempt: a.attempt,
                    worker,
                    expires: now.plus(self.settings.lease_ttl),
                    reattached: true,
                },
            );
            adopted.push(*a);
        }
        adopted
    }

    /// With auth on: the worker id is not one the journal says another
    /// credential's worker holds (an attempt parked for it across a leader
    /// change), and the credential stays within its bounds on workers and
    /// slots.
    fn check_registrant(&self, r: &Register, who: &Registrant) -> Result<(), WireError> {
        let Some(credential) = &who.credential else {
            return Ok(());
        };
        // (An attempt journaled without a credential — auth was off — is
        // adopted by nobody: it is lost and retried after the grace.)
        let taken = self.parked.values().any(|p| {
            p.worker == r.worker_id && p.credential.as_ref().is_some_and(|c| c != credential)
        });
        if taken {
            return Err(WireError::new(
                ErrorCode::PERMISSION_DENIED,
                format!(
                    "worker id {} ran an attempt for another credential before the leader changed; \
                     it is that credential's until the attempt is re-attached or lost",
                    r.worker_id
                ),
            ));
        }
        let (workers, slots) = self.held_by.get(credential).copied().unwrap_or_default();
        if workers >= who.max_workers {
            return Err(WireError::new(
                ErrorCode::RESOURCE_EXHAUSTED,
                format!(
                    "credential {credential} has {workers} workers registered, its max_workers"
                ),
            ));
        }
        if slots + u64::from(r.slots) > who.max_slots {
            return Err(WireError::new(
                ErrorCode::RESOURCE_EXHAUSTED,
                format!(
                    "credential {credential} would hold {} slots with this worker, above its max_slots of {}",
                    slots + u64::from(r.slots),
                    who.max_slots
                ),
            ));
        }
        Ok(())
    }

    /// Whether a worker may join `pool`: declared, or undeclared ones
    /// allowed and room for one more pool.
    pub(super) fn check_pool(&self, pool: &PoolName) -> Result<(), WireError> {
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

    pub(super) fn register_reply(&self) -> RegisterReply {
        RegisterReply {
            v: PROTOCOL_VERSION,
            epoch: self.epoch,
            heartbeat_interval: self.settings.heartbeat_interval,
            worker_timeout: self.settings.worker_timeout,
            lease_ttl: self.settings.lease_ttl,
            adopted: Vec::new(),
            session: None,
        }
    }

    pub(super) fn heartbeat(
        &mut self,
        now: Millis,
        h: Heartbeat,
    ) -> Result<HeartbeatReply, WireError> {
        if !self.workers.contains_key(&h.worker_id) {
            return Ok(HeartbeatReply {
                v: PROTOCOL_VERSION,
                epoch: self.epoch,
                registered: false,
            });
        }
        self.touch(&h.worker_id, now);
        let interval = self.settings.heartbeat_interval;
        let w = self.workers.get_mut(&h.worker_id).expect("checked");
        if now >= w.budget_from.plus(interval) {
            w.revoke_budget = w.slots.max(1);
            w.budget_from = now;
        }
        // A worker runs at most its slots: anything past that in one
        // heartbeat is not a real report, and costs nothing. Each attempt
        // listed is revoked once, and at most its slots an interval: what
        // one heartbeat can cost is bounded by what its credential may
        // hold (`max_slots`), however it is sent.
        let bound = w.slots as usize + w.running.len();
        let mut listed = FxHashSet::default();
        let mut unknown: Vec<RunningAttempt> = Vec::new();
        for a in h.running.iter().take(bound) {
            if w.revoke_budget == 0 {
                break;
            }
            let key = (a.task_id, a.attempt);
            if w.running.contains(&key) || !listed.insert(key) {
                continue;
            }
            w.revoke_budget -= 1;
            unknown.push(*a);
        }
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
                    grace: None,
                },
            );
        }
        Ok(HeartbeatReply {
            v: PROTOCOL_VERSION,
            epoch: self.epoch,
            registered: true,
        })
    }

    pub(super) fn deregister(&mut self, now: Millis, d: Deregister) -> Result<Ack, WireError> {
        let Some(draining) = self.workers.get(&d.worker_id).map(|w| w.draining) else {
            return Ok(Ack::default());
        };
        self.touch(&d.worker_id, now);
        if d.drain {
            if !draining {
                tracing::info!(worker_id = %d.worker_id, "worker draining");
                self.update_worker(now, &d.worker_id, |w| w.draining = true);
            }
        } else {
            self.remove_worker(now, &d.worker_id, "deregistered");
        }
        Ok(Ack::default())
    }

    /// Removes a worker: its capacity first, then its attempts are lost.
    pub(super) fn remove_worker(&mut self, now: Millis, worker_id: &str, why: &str) {
        let Some(w) = self.workers.get(worker_id) else {
            return;
        };
        tracing::info!(worker_id = %worker_id, pool = %w.pool, group = %w.labels, running = w.running.len(), why, "worker removed");
        let key = (w.pool.clone(), w.labels.clone());
        if let Some(c) = &w.credential {
            if let Some(held) = self.held_by.get_mut(c) {
                held.0 = held.0.saturating_sub(1);
                held.1 = held.1.saturating_sub(u64::from(w.slots));
                if held.0 == 0 {
                    self.held_by.remove(c);
                }
            }
        }
        // Its share leaves the group first (no slots, nothing running), so
        // the core never offers its slots again.
        let mut running = BTreeSet::new();
        self.update_worker(now, worker_id, |w| {
            running = std::mem::take(&mut w.running);
            w.slots = 0;
            w.draining = false;
        });
        if let Some(w) = self.workers.remove(worker_id) {
            self.silence_deadlines
                .remove(&(w.last_seen.plus(self.settings.worker_timeout), w.id));
        }
        if let Some(group) = self.groups.get_mut(&key) {
            group.workers -= 1;
            if group.workers == 0 {
                self.groups.remove(&key);
            }
        }
        for (task, attempt) in running {
            self.drop_lease(task);
            self.lose(now, task, attempt, None);
        }
    }
}

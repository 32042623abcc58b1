//! One run of a worker: connect, subscribe, register, then one loop that
//! owns all state (the current epoch, the running attempts) and reacts to
//! leases, revokes, heartbeat ticks, finished attempts and the stop
//! signal; each attempt runs as its own tokio task that renews its lease
//! and reports its outcome.
//!
//! Registration and heartbeats are awaited inside the loop on purpose:
//! while they are in flight, leases wait in the subscription's buffer, so
//! a lease that the leader sends right after accepting a registration is
//! never checked against the epoch of the registration before.
//!
//! `link.rs` holds the requests to the leader and the outcome reports,
//! `attempt.rs` one attempt's run; this file the loop.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::future::{AbortHandle, Abortable};
use futures_util::{FutureExt, StreamExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use super::{Error, Handler, Validated, WorkerOptions};
use crate::auth::{Credential, Grant, WorkerKeys, WorkerSession};
use crate::core::{ErrorCode, Labels, Millis, PoolName, RevokeReason};
use crate::task::TaskContext;
use crate::wire::{
    self, Ack, AttemptReport, AttemptReports, AttemptReportsReply, AttemptResult, Challenge,
    ChallengeReply, Deregister, Heartbeat, HeartbeatReply, Lease, Register, RegisterReply, Renew,
    RenewReply, Reply, Revoke, RunningAttempt, Subjects, WireError, PROTOCOL_VERSION,
};

mod attempt;
mod link;

use attempt::*;
use link::*;

/// How far the worker has been told to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum StopLevel {
    /// Keep going.
    Run,
    /// Stop taking leases, let running attempts finish within the grace.
    Drain,
    /// Abort what runs and leave.
    Now,
}

/// SIGTERM and SIGINT as one stream.
pub(super) struct Signals {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    pub(super) fn install() -> std::io::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals {
                terminate: signal(SignalKind::terminate())?,
                interrupt: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    pub(super) async fn recv(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Why an attempt was stopped from outside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StopReason {
    /// The leader revoked it: report `cancelled`.
    Revoked,
    /// The grace period ran out: report nothing (the final deregister
    /// makes the leader count it lost).
    Shutdown,
}

/// The loop's record of one attempt it runs.
struct Running {
    /// Set once the handler has returned: the attempt only reports now, and
    /// its slot counts as free (the leader frees it when the report lands,
    /// and may lease the next attempt before the report's reply reaches us).
    /// And why it was stopped from outside, if it was: one allocation
    /// shared with the attempt's task.
    shared: Arc<Shared>,
    abort: AbortHandle,
    join: JoinHandle<()>,
}

/// What the loop and an attempt's task both see of the attempt.
#[derive(Default)]
struct Shared {
    reporting: AtomicBool,
    stop: Mutex<Option<StopReason>>,
    /// Asks its handler to stop gently (a preempted attempt).
    gentle: Arc<crate::worker::command::GentleStop>,
}

impl Running {
    fn stop(&self, reason: StopReason) {
        self.mark(reason);
        self.abort.abort();
    }

    fn mark(&self, reason: StopReason) {
        let mut stop = self.shared.stop.lock().unwrap_or_else(|e| e.into_inner());
        stop.get_or_insert(reason);
    }

    /// A preempted attempt (SPEC §9): a handler that stops gently (a
    /// command: SIGTERM) is asked to and aborted (SIGKILL) only once
    /// `grace` passed; any other is aborted at once.
    fn preempt(&self, grace: Duration) {
        if !self.shared.gentle.listens() {
            return self.stop(StopReason::Revoked);
        }
        self.mark(StopReason::Revoked);
        self.shared.gentle.ask();
        let abort = self.abort.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            abort.abort();
        });
    }
}

/// How many messages to one worker the loop takes in one turn when they
/// are already there (the stop signal is looked at between turns).
const MESSAGES_PER_TURN: usize = 64;

use super::rules::{AttemptKey, LeaseVerdict, RevokeVerdict, Rules};

struct Session {
    link: Arc<Link>,
    handler: Handler,
    pool: PoolName,
    labels: Labels,
    slots: u32,
    grace: Duration,
    heartbeat_interval: Duration,
    /// The handles of the attempts it runs (which ones, under which
    /// epoch, is `rules`' to say).
    running: rustc_hash::FxHashMap<AttemptKey, Running>,
    /// The rules every lease, revoke and registration goes through.
    rules: Rules,
    finished_tx: mpsc::UnboundedSender<(AttemptKey, u64)>,
    /// Outcomes to [`send_reports`].
    reports: mpsc::UnboundedSender<PendingReport>,
}

/// Runs the worker until it is stopped or fails.
pub(super) async fn run(
    options: WorkerOptions,
    worker_id: String,
    handler: Handler,
    validated: Validated,
    mut stop: watch::Receiver<StopLevel>,
) -> Result<(), Error> {
    let Validated {
        pool,
        subjects,
        credential,
        login,
    } = validated;
    let client = connect(&options, &login, &worker_id).await?;
    let own = subjects.worker_all(&worker_id);
    let mut inbox = client
        .subscribe(own.clone())
        .await
        .map_err(|source| Error::Subscribe {
            subject: own.clone(),
            source,
        })?;
    // Every write of the leader record (a takeover, a renewal every
    // election_timeout / 4) is also a plain NATS message: a worker that sees
    // an epoch other than its own heartbeats at once, and so re-registers
    // with a new leader without waiting for its next heartbeat.
    let leader_subject = subjects.leader();
    let mut leader_records = match client.subscribe(leader_subject.clone()).await {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(subject = %leader_subject, error = %e, "cannot follow the leader record; heartbeats alone will find a new leader");
            None
        }
    };
    let mut forced_at = Instant::now();
    let (finished_tx, mut finished_rx) = mpsc::unbounded_channel();
    let (reports_tx, reports_rx) = mpsc::unbounded_channel();
    let own_subjects = OwnSubjects::new(&subjects, &worker_id);
    let mut session = Session {
        link: Arc::new(Link {
            client,
            subjects,
            worker_id,
            instance: new_instance(),
            request_timeout: options.request_timeout,
            credential,
            session: std::sync::Mutex::new(None),
            singles: AtomicBool::new(false),
            max_payload: Default::default(),
            own: own_subjects,
        }),
        handler,
        pool,
        labels: options.labels.clone(),
        slots: options.slots,
        grace: options.grace,
        heartbeat_interval: Duration::ZERO,
        running: Default::default(),
        rules: Rules::default(),
        finished_tx,
        reports: reports_tx,
    };
    tokio::spawn(send_reports(session.link.clone(), reports_rx));

    match session.register(&mut stop).await? {
        Some(reply) => session.accept(reply),
        None => {
            tracing::info!(worker_id = %session.link.worker_id, "stopped before registering");
            return Ok(());
        }
    }

    let mut heartbeat = session.heartbeat_timer();
    let mut drain_until: Option<Instant> = None;
    let mut stop_open = true;
    loop {
        // Read the level here rather than only on change: a registration
        // that waited for the stop signal has already marked it seen.
        let level = *stop.borrow_and_update();
        if level == StopLevel::Now {
            break;
        }
        if level == StopLevel::Drain && drain_until.is_none() {
            tracing::info!(
                worker_id = %session.link.worker_id,
                running = session.running.len(),
                grace_ms = session.grace.as_millis() as u64,
                "draining"
            );
            drain_until = Some(Instant::now() + session.grace);
            session.deregister(true).await;
        }
        if drain_until.is_some() && session.running.is_empty() {
            break;
        }
        tokio::select! {
            biased;
            changed = stop.changed(), if stop_open => {
                stop_open = changed.is_ok();
            }
            () = sleep_until_opt(drain_until) => {
                tracing::warn!(
                    worker_id = %session.link.worker_id,
                    running = session.running.len(),
                    "grace period over, aborting attempts"
                );
                break;
            }
            Some(first) = finished_rx.recv() => {
                // With every other one already there: one turn of the
                // loop (and of its `select!`) for a burst of them.
                let mut next = Some(first);
                while let Some((key, epoch)) = next {
                    // Only the run that ended: a newer leader's lease of
                    // the same attempt may have replaced it meanwhile.
                    if session.rules.ended(key, epoch) {
                        session.running.remove(&key);
                    }
                    next = finished_rx.try_recv().ok();
                }
            }
            message = inbox.next() => {
                let Some(message) = message else {
                    session.abort_all().await;
                    return Err(Error::SubscriptionClosed(own));
                };
                session.on_message(message, drain_until.is_some());
                // Messages already there, up to a bound, in this turn; a
                // closed subscription is seen on the next one.
                for _ in 1..MESSAGES_PER_TURN {
                    let Some(Some(message)) = inbox.next().now_or_never() else {
                        break;
                    };
                    session.on_message(message, drain_until.is_some());
                }
            }
            Some(record) = next_record(&mut leader_records) => {
                #[derive(serde::Deserialize)]
                struct Epoch {
                    #[serde(default)]
                    epoch: u64,
                }
                let epoch = serde_json::from_slice::<Epoch>(&record.payload).map_or(0, |r| r.epoch);
                // Epoch 0 is a takeover write: its leader does not answer
                // yet. Its first renewal, right after, carries the epoch.
                let moved = epoch != 0 && epoch != session.rules.epoch();
                if moved && forced_at.elapsed() >= Duration::from_millis(50) {
                    forced_at = Instant::now();
                    tracing::debug!(worker_id = %session.link.worker_id, epoch, "leader record moved; heartbeating now");
                    if let Err(e) = session.heartbeat(&mut stop, drain_until.is_some()).await {
                        session.abort_all().await;
                        return Err(e);
                    }
                }
            }
            _ = heartbeat.tick() => {
                let before = session.heartbeat_interval;
                if let Err(e) = session.heartbeat(&mut stop, drain_until.is_some()).await {
                    session.abort_all().await;
                    return Err(e);
                }
                if session.heartbeat_interval != before {
                    heartbeat = session.heartbeat_timer();
                }
            }
        }
    }

    session.abort_all().await;
    session.deregister(false).await;
    tracing::info!(worker_id = %session.link.worker_id, "worker stopped");
    Ok(())
}

impl Session {
    fn heartbeat_timer(&self) -> tokio::time::Interval {
        let period = self.heartbeat_interval.max(MIN_HEARTBEAT);
        let mut timer = tokio::time::interval_at(Instant::now() + period, period);
        timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
        timer
    }

    fn accept(&mut self, reply: RegisterReply) {
        // Anything not adopted was stopped already (`stop_all_but`).
        let orphans = self.rules.registered(reply.epoch, &reply.adopted);
        debug_assert!(orphans.is_empty(), "{orphans:?}");
        self.heartbeat_interval = reply.heartbeat_interval.to_duration().max(MIN_HEARTBEAT);
        tracing::info!(
            worker_id = %self.link.worker_id,
            pool = %self.pool,
            group = %self.labels,
            slots = self.slots,
            epoch = reply.epoch,
            heartbeat_ms = reply.heartbeat_interval.0,
            lease_ttl_ms = reply.lease_ttl.0,
            "registered"
        );
    }

    /// Registers, retrying while no leader answers. `None`: told to stop
    /// first.
    async fn register(
        &mut self,
        stop: &mut watch::Receiver<StopLevel>,
    ) -> Result<Option<RegisterReply>, Error> {
        let mut backoff = RETRY_INITIAL;
        loop {
            let mut register = Register {
                lease_batches: true,
                v: PROTOCOL_VERSION,
                worker_id: self.link.worker_id.clone(),
                pool: self.pool.clone(),
                labels: self.labels.clone(),
                slots: self.slots,
                instance: Some(self.link.instance.clone()),
                running: self.running_attempts(),
                xkey: None,
            };
            let call = self.link.register_once(&mut register);
            let result = tokio::select! {
                result = call => result,
                () = stopped(stop) => return Ok(None),
            };
            match result {
                Ok(reply) => return Ok(Some(reply)),
                Err(CallError::Remote(e))
                    if [
                        ErrorCode::INVALID_ARGUMENT,
                        ErrorCode::UNAUTHENTICATED,
                        ErrorCode::PERMISSION_DENIED,
                    ]
                    .contains(&e.code) =>
                {
                    return Err(Error::Refused(e));
                }
                Err(CallError::Malformed(e)) => return Err(Error::Protocol(e)),
                Err(CallError::Remote(e)) if e.code != ErrorCode::UNAVAILABLE => {
                    tracing::warn!(
                        worker_id = %self.link.worker_id,
                        error = %e,
                        retry_in_ms = backoff.as_millis() as u64,
                        "registration refused, retrying"
                    );
                }
                Err(e) => {
                    tracing::info!(
                        worker_id = %self.link.worker_id,
                        error = %e,
                        retry_in_ms = backoff.as_millis() as u64,
                        "no leader yet, retrying registration"
                    );
                }
            }
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = stopped(stop) => return Ok(None),
            }
            backoff = (backoff * 2).min(RETRY_MAX);
        }
    }

    /// What this worker runs (or still reports on).
    fn running_attempts(&self) -> Vec<RunningAttempt> {
        self.rules.running()
    }

    async fn heartbeat(
        &mut self,
        stop: &mut watch::Receiver<StopLevel>,
        draining: bool,
    ) -> Result<(), Error> {
        let running = self.running_attempts();
        let heartbeat = Heartbeat {
            v: PROTOCOL_VERSION,
            worker_id: self.link.worker_id.clone(),
            free_slots: self.free_slots(),
            running,
        };
        let timeout = self.link.request_timeout.min(self.heartbeat_interval);
        match self
            .link
            .call::<_, HeartbeatReply>("heartbeat", &heartbeat, timeout)
            .await
        {
            Ok(reply) if reply.registered => {
                let previous = self.rules.epoch();
                if self.rules.heard_epoch(reply.epoch) {
                    tracing::info!(
                        worker_id = %self.link.worker_id,
                        epoch = reply.epoch,
                        previous_epoch = previous,
                        "leader epoch moved"
                    );
                }
            }
            Ok(reply) if draining => {
                tracing::info!(
                    worker_id = %self.link.worker_id,
                    epoch = reply.epoch,
                    "leader forgot this worker while draining"
                );
            }
            Ok(reply) => {
                tracing::info!(
                    worker_id = %self.link.worker_id,
                    epoch = reply.epoch,
                    running = self.running.len(),
                    "leader does not know this worker, registering again"
                );
                // Removed (silent too long), or a new leader: register
                // again listing what runs here. A new leader re-attaches
                // the attempts its journal says run here; the others it
                // counts lost and retries elsewhere, so they stop now rather
                // than run beside the retry. `None`: told to stop while
                // re-registering; the loop sees the stop signal next.
                if let Some(reply) = self.register(stop).await? {
                    self.stop_all_but(reply.epoch, &reply.adopted).await;
                    self.accept(reply);
                }
            }
            Err(e) => {
                tracing::warn!(worker_id = %self.link.worker_id, error = %e, "heartbeat failed");
            }
        }
        Ok(())
    }

    async fn deregister(&self, drain: bool) {
        let body = Deregister {
            v: PROTOCOL_VERSION,
            worker_id: self.link.worker_id.clone(),
            drain,
        };
        match self
            .link
            .call::<_, Ack>("deregister", &body, self.link.request_timeout)
            .await
        {
            Ok(_) => tracing::info!(
                worker_id = %self.link.worker_id,
                drain,
                running = self.running.len(),
                "deregistered"
            ),
            Err(e) => tracing::warn!(
                worker_id = %self.link.worker_id,
                drain,
                error = %e,
                "deregister failed"
            ),
        }
    }

    fn free_slots(&self) -> u32 {
        let busy = self
            .running
            .values()
            .filter(|r| !r.shared.reporting.load(Ordering::Relaxed))
            .count();
        let busy = u32::try_from(busy).unwrap_or(u32::MAX);
        self.slots.saturating_sub(busy)
    }

    fn on_message(&mut self, message: async_nats::Message, draining: bool) {
        let subject = message.subject.as_str();
        if !self.link.sent_by_leader(&message) {
            // Forged, or from a leader whose session this worker no longer
            // has: not obeyed (a real lease is re-sent or expires).
            tracing::warn!(worker_id = %self.link.worker_id, subject, "message without this session's proof ignored");
            return;
        }
        if subject == self.link.own.lease {
            match wire::decode::<Lease>(&message.payload) {
                Ok(lease) => self.on_lease(lease, draining),
                Err(e) => tracing::warn!(
                    worker_id = %self.link.worker_id,
                    error = %e,
                    "unreadable lease ignored"
                ),
            }
        } else if subject == self.link.own.leases {
            match wire::decode::<wire::Leases>(&message.payload) {
                Ok(leases) => {
                    for lease in leases.leases {
                        self.on_lease(lease, draining);
                    }
                }
                Err(e) => tracing::warn!(
                    worker_id = %self.link.worker_id,
                    error = %e,
                    "unreadable leases ignored"
                ),
            }
        } else if subject == self.link.own.revoke {
            match wire::decode::<Revoke>(&message.payload) {
                Ok(revoke) => self.on_revoke(revoke),
                Err(e) => tracing::warn!(
                    worker_id = %self.link.worker_id,
                    error = %e,
                    "unreadable revoke ignored"
                ),
            }
        } else {
            tracing::debug!(worker_id = %self.link.worker_id, subject, "message ignored");
        }
    }

    fn on_lease(&mut self, lease: Lease, draining: bool) {
        let key = (lease.task_id, lease.attempt);
        let (worker_id, task_id, attempt) = (&self.link.worker_id, lease.task_id, lease.attempt);
        match self.rules.lease(key, lease.epoch, draining) {
            LeaseVerdict::AlreadyRan => {
                tracing::warn!(%worker_id, %task_id, attempt, "lease of an attempt that already ran here ignored");
                return;
            }
            LeaseVerdict::OtherEpoch { worker_epoch } => {
                tracing::warn!(%worker_id, %task_id, attempt, lease_epoch = lease.epoch, epoch = worker_epoch, "lease of another epoch ignored");
                return;
            }
            LeaseVerdict::Draining => {
                tracing::info!(%worker_id, %task_id, attempt, "lease ignored while draining");
                return;
            }
            LeaseVerdict::Duplicate => {
                tracing::debug!(%worker_id, %task_id, attempt, "duplicate lease ignored");
                return;
            }
            LeaseVerdict::Restart { old_epoch } => {
                // The run of the older leadership reports to nobody who
                // listens: stop it and run this lease, rather than let the
                // new leader's lease expire.
                tracing::info!(%worker_id, %task_id, attempt, old_epoch, epoch = lease.epoch, "attempt leased again by a newer leader; restarting it");
                if let Some(old) = self.running.remove(&key) {
                    old.stop(StopReason::Shutdown);
                    old.join.abort();
                }
            }
            LeaseVerdict::Start => {}
        }
        if self.free_slots() == 0 {
            // The leader counts slots; run it rather than lose it.
            tracing::warn!(
                worker_id = %self.link.worker_id,
                task_id = %lease.task_id,
                attempt = lease.attempt,
                slots = self.slots,
                "lease beyond free slots"
            );
        }
        tracing::info!(
            worker_id = %self.link.worker_id,
            task_id = %lease.task_id,
            attempt = lease.attempt,
            pool = %lease.pool,
            group = %lease.group,
            epoch = lease.epoch,
            traceparent = lease.traceparent.as_deref(),
            "attempt started"
        );
        let (abort, registration) = AbortHandle::new_pair();
        let shared = Arc::new(Shared::default());
        let attempt = Attempt {
            link: self.link.clone(),
            handler: self.handler.clone(),
            shared: shared.clone(),
            finished: self.finished_tx.clone(),
            reports: self.reports.clone(),
        };
        let join = tokio::spawn(attempt.run(lease, registration));
        self.running.insert(
            key,
            Running {
                shared,
                abort,
                join,
            },
        );
    }

    fn on_revoke(&mut self, revoke: Revoke) {
        let key = (revoke.task_id, revoke.attempt);
        let (worker_id, task_id, attempt) = (&self.link.worker_id, revoke.task_id, revoke.attempt);
        match self.rules.revoke(key, revoke.epoch) {
            RevokeVerdict::NotRunning => {
                tracing::debug!(%worker_id, %task_id, attempt, "revoke of an attempt not running ignored");
                return;
            }
            RevokeVerdict::OlderEpoch { lease_epoch } => {
                tracing::warn!(%worker_id, %task_id, attempt, revoke_epoch = revoke.epoch, epoch = lease_epoch, "revoke from an older epoch ignored");
                return;
            }
            RevokeVerdict::Stop => {}
        }
        let Some(running) = self.running.get(&key) else {
            return;
        };
        tracing::info!(
            worker_id = %self.link.worker_id,
            task_id = %revoke.task_id,
            attempt = revoke.attempt,
            reason = ?revoke.reason,
            "attempt revoked"
        );
        match (revoke.reason, revoke.grace) {
            (RevokeReason::Preempted, Some(grace)) => running.preempt(grace.to_duration()),
            _ => running.stop(StopReason::Revoked),
        }
    }

    /// Stops every attempt the leader did not re-attach, and waits for
    /// them to end.
    async fn stop_all_but(&mut self, epoch: u64, adopted: &[RunningAttempt]) {
        let orphans = self.rules.registered(epoch, adopted);
        if !adopted.is_empty() {
            tracing::info!(
                worker_id = %self.link.worker_id,
                reattached = adopted.len(),
                "the leader re-attached running attempts"
            );
        }
        if orphans.is_empty() {
            return;
        }
        tracing::warn!(
            worker_id = %self.link.worker_id,
            stopped = orphans.len(),
            "stopping attempts the leader no longer counts"
        );
        let mut stopped = Vec::new();
        for key in orphans {
            if let Some(r) = self.running.remove(&key) {
                r.stop(StopReason::Shutdown);
                r.join.abort();
                stopped.push(r);
            }
        }
        for r in stopped {
            let _ = r.join.await;
        }
    }

    /// Aborts every attempt (handler and any pending report) and waits for
    /// their tasks to end.
    async fn abort_all(&mut self) {
        self.rules.stop_all();
        let running: Vec<Running> = self.running.drain().map(|(_, r)| r).collect();
        for r in &running {
            r.stop(StopReason::Shutdown);
            r.join.abort();
        }
        for r in running {
            let _ = r.join.await;
        }
    }
}

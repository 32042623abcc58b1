//! The leader's API: [`LeaderApi`] answers lookups, snapshots and submissions for one leadership (through the driver, or JetStream for what the driver no longer holds), and its health.

use super::*;
use crate::api::{
    BackfillRange, BackfillReport, CreateScheduleRequest, FireRecord, ScheduleEntry, ScheduleInfo,
};

/// What the HTTP API and NATS requests use to reach the leader.
#[derive(Clone)]
pub struct LeaderApi {
    pub(super) inner: Arc<LeaderInner>,
}

pub(super) struct LeaderInner {
    pub(super) client: async_nats::Client,
    pub(super) js: jetstream::Context,
    pub(super) subjects: Subjects,
    pub(super) inputs: mpsc::Sender<Input>,
    pub(super) results: kv::Store,
    pub(super) stream_name: String,
    pub(super) max_payload_bytes: usize,
    pub(super) driver_alive: AtomicBool,
    /// Wall-clock ms of the last turn of the driver and of the consumer
    /// loop: a loop that stops turning makes the server unready.
    pub(super) driver_beat: AtomicU64,
    pub(super) consumer_beat: AtomicU64,
    /// [`Driver::consumed_below`] after the driver's last turn.
    pub(super) consumed_below: AtomicU64,
    pub(super) allow_undeclared_pools: bool,
    pub(super) declared_pools: BTreeSet<PoolName>,
    pub(super) epoch: u64,
    /// Times this process took the lead (shared by its leaderships).
    pub(super) takeovers: Arc<AtomicU64>,
    /// Journal records being written and not yet acknowledged.
    pub(super) journal_pending: Arc<AtomicU64>,
    /// Wall-clock ms since which the journal has writes under way and has
    /// stored none (0: nothing under way); the committer keeps it.
    pub(super) journal_waiting_since: Arc<AtomicU64>,
    /// Credentials and worker sessions of this leadership.
    pub(super) guard: Arc<Guard>,
    /// The servers' storage key.
    pub(super) seal: seal::Seal,
    /// Which result batch holds a finished task's result.
    /// Local callers waiting on the driver's replies, by request id.
    pub(super) replies: Replies,
}

/// The shell's side of [`Responder::Local`]: request id → the caller
/// waiting on it. The driver addresses a reply by id
/// ([`Output::Reply`]) and the committer hands it over here once the turn
/// is stored. Closed when the leadership's driver or committer stops:
/// every caller still waiting hears "shutting down", as does every later
/// one.
#[derive(Clone, Default)]
pub(crate) struct Replies {
    inner: Arc<std::sync::Mutex<ReplyMap>>,
}

#[derive(Default)]
struct ReplyMap {
    next: driver::RequestId,
    waiting: rustc_hash::FxHashMap<driver::RequestId, oneshot::Sender<driver::Reply>>,
    closed: bool,
}

/// A local caller's wait for the reply to one request.
pub(crate) struct Waiting<T> {
    rx: oneshot::Receiver<driver::Reply>,
    kind: std::marker::PhantomData<fn() -> T>,
}

impl Replies {
    fn map(&self) -> std::sync::MutexGuard<'_, ReplyMap> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new request: where the driver should answer it, and the wait
    /// for that answer (which fails at once if the replies are closed).
    pub(crate) fn open<T>(&self) -> (Responder, Waiting<T>) {
        let (tx, rx) = oneshot::channel();
        let mut map = self.map();
        map.next += 1;
        let id = map.next;
        if !map.closed {
            map.waiting.insert(id, tx);
        }
        let kind = std::marker::PhantomData;
        (Responder::Local(id), Waiting { rx, kind })
    }

    /// Hands `reply` to the caller waiting on `id` (if it still waits).
    pub(crate) fn send(&self, id: driver::RequestId, reply: driver::Reply) {
        if let Some(tx) = self.map().waiting.remove(&id) {
            let _ = tx.send(reply);
        }
    }

    /// Nobody will answer any more: every waiting caller hears so.
    pub(crate) fn close(&self) {
        let mut map = self.map();
        map.closed = true;
        map.waiting.clear();
    }
}

impl<T: driver::Replied> Waiting<T> {
    /// The reply; "shutting down" if nobody will answer.
    pub(crate) async fn reply(self) -> Result<T, WireError> {
        match self.rx.await {
            Ok(reply) => Self::typed(reply),
            Err(_) => Err(unavailable("the server is shutting down")),
        }
    }

    /// The reply if it came (synchronous callers: the simulation, tests).
    #[cfg(test)]
    pub(crate) fn try_recv(
        &mut self,
    ) -> Result<Result<T, WireError>, oneshot::error::TryRecvError> {
        self.rx.try_recv().map(Self::typed)
    }

    fn typed(reply: driver::Reply) -> Result<T, WireError> {
        T::unwrap(reply).unwrap_or_else(|| {
            Err(WireError::new(
                ErrorCode::INTERNAL,
                "the driver answered with another kind of reply",
            ))
        })
    }
}

/// A loop that has not turned for this long is not making progress.
pub(super) const STALL_AFTER: Millis = Millis(10_000);

/// Room left in a NATS message for everything but the payload: the lease
/// or submission envelope (ids, 16 labels of 64+64 bytes, a 256-byte key)
/// and headers. The payload limit is NATS' `max_payload` minus this.
pub const ENVELOPE_RESERVE: usize = 16 * 1024;

/// The payload limit in force: the configured one, lowered to what fits in
/// one NATS message of `nats_max_payload` bytes with its envelope.
///
/// ```
/// use cronoq::server::{effective_payload_limit, ENVELOPE_RESERVE};
/// assert_eq!(effective_payload_limit(1 << 20, 1 << 20), (1 << 20) - ENVELOPE_RESERVE);
/// assert_eq!(effective_payload_limit(1000, 1 << 20), 1000);
/// ```
pub fn effective_payload_limit(configured: usize, nats_max_payload: usize) -> usize {
    configured.min(nats_max_payload.saturating_sub(ENVELOPE_RESERVE))
}

pub(super) fn unavailable(message: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::UNAVAILABLE, message)
}

impl LeaderApi {
    pub(super) async fn ask<T: driver::Replied>(
        &self,
        make: impl FnOnce(Responder) -> Input,
    ) -> Result<T, WireError> {
        let (to, waiting) = self.inner.replies.open::<T>();
        self.inner
            .inputs
            .send(make(to))
            .await
            .map_err(|_| unavailable("the server is shutting down"))?;
        waiting.reply().await
    }

    pub(super) async fn stream(&self) -> Result<stream::Stream, WireError> {
        self.inner
            .js
            .get_stream(&self.inner.stream_name)
            .await
            .map_err(|e| unavailable(format!("submit stream: {e}")))
    }

    /// A finished task's result from the bucket (written there once its
    /// entry is in the log, kept for `results_ttl`): in its block's
    /// messages ([`journal::lookups`]), else under its own id (as servers
    /// before the blocks wrote it).
    pub(super) async fn stored_result(&self, id: TaskId) -> Result<Option<TaskStatus>, WireError> {
        let in_block = super::takeover::block_record(&self.inner.results, &self.inner.seal, id.0)
            .await
            .map_err(|e| unavailable(format!("results bucket: {e}")))?;
        if let Some(record) = in_block {
            return Ok(Some(record.into_status()));
        }
        let key = id.to_string();
        match self.stored(&key).await? {
            Some(body) => Ok(Some(wire::TaskRecord::decode(&body)?.into_status())),
            None => Ok(None),
        }
    }

    /// The body stored under `key` in the results bucket, its seal
    /// checked (one not sealed with the storage key is none).
    async fn stored(&self, key: &str) -> Result<Option<Bytes>, WireError> {
        match self.inner.results.get(key).await {
            Ok(Some(bytes)) => match self.inner.seal.open(key, &bytes) {
                Ok(body) => Ok(Some(bytes.slice_ref(body))),
                Err(why) => {
                    seal::log_refused("stored result", key, why);
                    Ok(None)
                }
            },
            Ok(None) => Ok(None),
            Err(e) => Err(unavailable(format!("results bucket: {e}"))),
        }
    }

    /// Whether the stream holds the submission (accepted, maybe not yet
    /// consumed), and its pool.
    pub(super) async fn accepted(&self, id: TaskId) -> Result<Option<PoolName>, WireError> {
        let stream = self.stream().await?;
        match stream.get_raw_message(id.0).await {
            Ok(m) => Ok(Some(
                self.inner
                    .subjects
                    .pool_of_submit(m.subject.as_str())
                    .unwrap_or_default(),
            )),
            Err(_) => Ok(None),
        }
    }

    /// Submits through the stream: durable before the id is returned.
    /// Checked here as the driver will check it (the task's own checks,
    /// then the core's admission: horizon, declared pools), so a bad
    /// submission is refused at once; the one encoder checks its key.
    pub async fn submit(&self, task: Task) -> Result<TaskId, WireError> {
        let spec = task.to_spec(TaskId(1), self.inner.max_payload_bytes)?;
        let known = self.inner.declared_pools.contains(&spec.pool);
        let allow = self.inner.allow_undeclared_pools;
        crate::core::check_admission(&spec, wall_now(), known, allow)?;
        let (subject, headers, body) = wire::submission(&self.inner.subjects, &task)?;
        let ack = self
            .inner
            .js
            .publish_with_headers(subject, headers, body)
            .await
            .map_err(|e| unavailable(format!("publishing the submission: {e}")))?
            .await
            .map_err(|e| unavailable(format!("submission not acknowledged: {e}")))?;
        Ok(TaskId(ack.sequence))
    }

    /// A task's status: live or recent from the driver, older from the
    /// results bucket, just-accepted from the stream.
    pub async fn task(&self, id: TaskId) -> Result<TaskStatus, WireError> {
        if let Some(status) = self.ask(|to| Input::GetTask(id, to)).await? {
            return Ok(status);
        }
        if let Some(status) = self.stored_result(id).await? {
            return Ok(status);
        }
        // Still in the stream though the driver read past it: dropped
        // (no credential verified on it), and purged with the prefix of
        // finished submissions once the tasks before it end.
        let dropped = id.0 < self.inner.consumed_below.load(Ordering::Relaxed);
        if let Some(pool) = self.accepted(id).await?.filter(|_| !dropped) {
            return Ok(TaskStatus::bare(id, pool, TaskState::Queued));
        }
        Err(WireError::new(
            ErrorCode::NOT_FOUND,
            format!("task {id} not found"),
        ))
    }

    /// The pool and submitter of a task that can still be cancelled: live
    /// here, or accepted and not consumed yet (its submission's proof
    /// names the submitter). `None`: finished or unknown (cancel says so).
    pub(super) async fn pool_and_owner(
        &self,
        id: TaskId,
    ) -> Result<Option<(PoolName, Option<String>)>, WireError> {
        if let Some(found) = self.ask(|to| Input::Owner(id, to)).await? {
            return Ok(Some(found));
        }
        if self.stored_result(id).await?.is_some() {
            return Ok(None);
        }
        let stream = self.stream().await?;
        let Ok(m) = stream.get_raw_message(id.0).await else {
            return Ok(None);
        };
        let pool = self
            .inner
            .subjects
            .pool_of_submit(m.subject.as_str())
            .unwrap_or_default();
        let stored = Millis((m.time.unix_timestamp_nanos() / 1_000_000).max(0) as u64);
        let owner =
            self.inner
                .guard
                .owner_of(m.subject.as_str(), Some(&m.headers), &m.payload, stored);
        Ok(Some((pool, owner)))
    }

    /// Cancels a task (also one accepted but not consumed yet).
    pub async fn cancel(&self, id: TaskId) -> Result<(), WireError> {
        match self.ask::<wire::Ack>(|to| Input::Cancel(id, to)).await {
            Ok(_) => Ok(()),
            Err(e) if e.code == ErrorCode::NOT_FOUND => {
                if self
                    .stored_result(id)
                    .await?
                    .is_some_and(|s| s.state.is_terminal())
                {
                    return Err(crate::core::Rejection::AlreadyFinished(id).into());
                }
                if self.accepted(id).await?.is_some() {
                    self.inner
                        .inputs
                        .send(Input::CancelOnArrival(id))
                        .await
                        .map_err(|_| unavailable("the server is shutting down"))?;
                    return Ok(());
                }
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// The snapshot.
    pub async fn snapshot(&self) -> Result<Snapshot, WireError> {
        self.ask(Input::Snapshot).await
    }

    /// The leader's counters and histograms, with this process's election
    /// and journal figures (see [`Api::metrics`]).
    pub async fn metrics(&self) -> Result<MetricsSnapshot, WireError> {
        let mut m: MetricsSnapshot = self.ask(Input::Metrics).await?;
        let server = m.server.get_or_insert_with(ServerMetrics::default);
        server.takeovers = self.inner.takeovers.load(Ordering::Relaxed);
        server.journal_pending = self.inner.journal_pending.load(Ordering::Relaxed);
        server.storage_refused = seal::refused_total();
        Ok(m)
    }

    /// The newest live and recently finished tasks (see [`Api::recent_tasks`]).
    pub async fn recent_tasks(&self, limit: usize) -> Result<Vec<TaskStatus>, WireError> {
        crate::api::check_recent_limit(limit)?;
        Ok(self
            .ask::<wire::TaskList>(|to| Input::RecentTasks(limit, to))
            .await?
            .tasks)
    }

    pub(super) fn health(&self) -> Health {
        let connected = matches!(
            self.inner.client.connection_state(),
            async_nats::connection::State::Connected
        );
        leader_health(
            wall_now(),
            connected,
            self.inner.driver_alive.load(Ordering::Relaxed),
            Millis(self.inner.driver_beat.load(Ordering::Relaxed)),
            Millis(self.inner.consumer_beat.load(Ordering::Relaxed)),
            Millis(self.inner.journal_waiting_since.load(Ordering::Relaxed)),
        )
    }
}

/// A leader's health from its loops' last turns: not live when the driver
/// stopped or has not turned for [`STALL_AFTER`]; not ready when, besides,
/// NATS is away, the submit consumer has not turned for that long, or the
/// journal has had writes under way and stored none for that long
/// (`journal_waiting_since`, 0 when nothing is under way: a leader whose
/// writes cannot be stored acts on nothing, and must not look ready;
/// issue 34).
pub(super) fn leader_health(
    now: Millis,
    connected: bool,
    driver_alive: bool,
    driver_beat: Millis,
    consumer_beat: Millis,
    journal_waiting_since: Millis,
) -> Health {
    let turning = |beat: Millis| now.0.saturating_sub(beat.0) < STALL_AFTER.0;
    let driving = driver_alive && turning(driver_beat);
    let consuming = turning(consumer_beat);
    let storing = journal_waiting_since.0 == 0 || turning(journal_waiting_since);
    Health {
        live: driving,
        ready: connected && driving && consuming && storing,
        detail: match (connected, driving, consuming, storing) {
            (true, true, true, true) => "leader".into(),
            (false, _, _, _) => "not connected to NATS".into(),
            (_, false, _, _) => "driver stopped or stalled".into(),
            (_, _, false, _) => "submit consumer stalled".into(),
            (_, _, _, false) => format!(
                "journal stalled: no write stored for {} s",
                now.0.saturating_sub(journal_waiting_since.0) / 1_000
            ),
        },
    }
}

/// Schedules (issue 23), answered by the driver once its writes are
/// stored. The `*_as` forms name the caller's credential (`P.api.*`
/// requests with credentials on); the [`Api`] methods act for no one.
impl LeaderApi {
    async fn schedule(&self, op: driver::ScheduleOp) -> Result<driver::ScheduleReply, WireError> {
        self.ask(|to| Input::Schedule(op, to)).await
    }

    /// Creates a schedule whose tasks `owner` owns.
    pub async fn create_schedule_as(
        &self,
        spec: CreateScheduleRequest,
        owner: Option<String>,
    ) -> Result<ScheduleInfo, WireError> {
        let spec = Box::new(spec);
        match self
            .schedule(driver::ScheduleOp::Create { spec, owner })
            .await?
        {
            driver::ScheduleReply::Info(info) => Ok(*info),
            other => Err(unexpected(&other)),
        }
    }

    /// Every schedule, by name.
    pub async fn list_schedules(&self) -> Result<Vec<ScheduleEntry>, WireError> {
        match self.schedule(driver::ScheduleOp::List).await? {
            driver::ScheduleReply::List(list) => Ok(list),
            other => Err(unexpected(&other)),
        }
    }

    async fn schedule_info(&self, op: driver::ScheduleOp) -> Result<ScheduleInfo, WireError> {
        match self.schedule(op).await? {
            driver::ScheduleReply::Info(info) => Ok(*info),
            other => Err(unexpected(&other)),
        }
    }

    /// One schedule (`NOT_FOUND`).
    pub async fn get_schedule(&self, name: String) -> Result<ScheduleInfo, WireError> {
        self.schedule_info(driver::ScheduleOp::Get(name)).await
    }

    /// Pauses (`true`) or resumes a schedule (`NOT_FOUND`).
    pub async fn pause_schedule(
        &self,
        name: String,
        paused: bool,
    ) -> Result<ScheduleInfo, WireError> {
        self.schedule_info(driver::ScheduleOp::Pause(name, paused))
            .await
    }

    /// Deletes a schedule (`NOT_FOUND`); its runs go on.
    pub async fn delete_schedule(&self, name: String) -> Result<(), WireError> {
        match self.schedule(driver::ScheduleOp::Delete(name)).await? {
            driver::ScheduleReply::Deleted => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// One run now; answered once its task is in the stream.
    pub async fn trigger_schedule(&self, name: String) -> Result<FireRecord, WireError> {
        match self.schedule(driver::ScheduleOp::Trigger(name)).await? {
            driver::ScheduleReply::Fired(record) => Ok(record),
            other => Err(unexpected(&other)),
        }
    }

    /// Fires each tick of the range by the overlap policy; answered once
    /// their tasks are in the stream.
    pub async fn backfill_schedule(
        &self,
        name: String,
        range: BackfillRange,
    ) -> Result<BackfillReport, WireError> {
        match self
            .schedule(driver::ScheduleOp::Backfill(name, range))
            .await?
        {
            driver::ScheduleReply::Backfilled(report) => Ok(report),
            other => Err(unexpected(&other)),
        }
    }
}

/// The driver answered a schedule request with the wrong kind of reply
/// (a bug).
fn unexpected(reply: &driver::ScheduleReply) -> WireError {
    WireError::new(
        ErrorCode::INTERNAL,
        format!("unexpected reply to a schedule request: {reply:?}"),
    )
}

impl Api for LeaderApi {
    fn submit(&self, task: Task) -> ApiFuture<'_, TaskId> {
        Box::pin(LeaderApi::submit(self, task))
    }
    fn task(&self, id: TaskId) -> ApiFuture<'_, TaskStatus> {
        Box::pin(LeaderApi::task(self, id))
    }
    fn cancel(&self, id: TaskId) -> ApiFuture<'_, ()> {
        Box::pin(LeaderApi::cancel(self, id))
    }
    fn snapshot(&self) -> ApiFuture<'_, Snapshot> {
        Box::pin(LeaderApi::snapshot(self))
    }
    fn recent_tasks(&self, limit: usize) -> ApiFuture<'_, Vec<TaskStatus>> {
        Box::pin(LeaderApi::recent_tasks(self, limit))
    }
    fn metrics(&self) -> ApiFuture<'_, MetricsSnapshot> {
        Box::pin(LeaderApi::metrics(self))
    }
    fn health(&self) -> Health {
        LeaderApi::health(self)
    }
    fn create_schedule(&self, spec: CreateScheduleRequest) -> ApiFuture<'_, ScheduleInfo> {
        Box::pin(self.create_schedule_as(spec, None))
    }
    fn list_schedules(&self) -> ApiFuture<'_, Vec<ScheduleEntry>> {
        Box::pin(LeaderApi::list_schedules(self))
    }
    fn get_schedule(&self, name: String) -> ApiFuture<'_, ScheduleInfo> {
        Box::pin(LeaderApi::get_schedule(self, name))
    }
    fn pause_schedule(&self, name: String) -> ApiFuture<'_, ScheduleInfo> {
        Box::pin(LeaderApi::pause_schedule(self, name, true))
    }
    fn resume_schedule(&self, name: String) -> ApiFuture<'_, ScheduleInfo> {
        Box::pin(LeaderApi::pause_schedule(self, name, false))
    }
    fn delete_schedule(&self, name: String) -> ApiFuture<'_, ()> {
        Box::pin(LeaderApi::delete_schedule(self, name))
    }
    fn trigger_schedule(&self, name: String) -> ApiFuture<'_, FireRecord> {
        Box::pin(LeaderApi::trigger_schedule(self, name))
    }
    fn backfill_schedule(
        &self,
        name: String,
        range: BackfillRange,
    ) -> ApiFuture<'_, BackfillReport> {
        Box::pin(LeaderApi::backfill_schedule(self, name, range))
    }
}

#[cfg(test)]
mod health_tests {
    use super::*;

    /// Issue 7 finding 1: a stalled submit consumer (a poison message used
    /// to stop it for good) makes the leader unready, not silently "ok".
    #[test]
    fn a_stalled_loop_makes_the_leader_unready() {
        let now = Millis(100_000);
        let fresh = Millis(99_900);
        let stale = now.minus(STALL_AFTER);
        let idle = Millis(0);
        assert!(leader_health(now, true, true, fresh, fresh, idle).ready);
        let h = leader_health(now, true, true, fresh, stale, idle);
        assert!(h.live && !h.ready, "{h:?}");
        assert_eq!(h.detail, "submit consumer stalled");
        let h = leader_health(now, true, true, stale, fresh, idle);
        assert!(!h.live && !h.ready);
        let h = leader_health(now, true, false, fresh, fresh, idle);
        assert!(!h.live && !h.ready);
        assert!(!leader_health(now, false, true, fresh, fresh, idle).ready);
    }

    /// Issue 34, finding 1: a journal write that never gets stored (a
    /// record larger than a NATS message was retried for ever) left the
    /// leader renewing and `/readyz` answering 200 "leader". Writes under
    /// way with none stored for [`STALL_AFTER`] make it unready (still
    /// live: its loops turn); writes under way for less, or none, do not.
    #[test]
    fn a_journal_that_stores_nothing_makes_the_leader_unready() {
        let now = Millis(100_000);
        let fresh = Millis(99_900);
        let h = leader_health(now, true, true, fresh, fresh, now.minus(STALL_AFTER));
        assert!(h.live && !h.ready, "{h:?}");
        assert_eq!(h.detail, "journal stalled: no write stored for 10 s");
        assert!(leader_health(now, true, true, fresh, fresh, Millis(95_000)).ready);
        assert!(leader_health(now, true, true, fresh, fresh, Millis(0)).ready);
    }
}

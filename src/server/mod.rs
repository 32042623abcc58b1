//! `cronoq server`: the NATS shell around the [`driver::Driver`].
//!
//! At start the server connects to NATS (retrying until it can), makes sure
//! the JetStream objects exist (waiting, with a `waiting for jetstream`
//! warning and backoff, while JetStream does not answer: a cluster still
//! electing) — the submit stream (`P_SUBMIT`, capturing
//! `P.submit.>`, file storage, 2-minute duplicate window), the results
//! bucket (`P_RESULTS`) and the state bucket (`P_STATE`, holding the epoch
//! counter, bumped by every start) — and then runs these tasks:
//!
//! * **consumer**: an ordered consumer reads the submit stream from its
//!   first message. The stream holds every accepted, unfinished task: a
//!   finished task's result goes to the results bucket, and once a second
//!   the stream is purged below the oldest unfinished task whose result is
//!   not yet stored. A restarted server reads what is left and skips
//!   submissions whose result is already stored, so it picks up every
//!   accepted task again; a task id is its stream sequence number.
//! * **api**: requests on `P.api.*` are decoded and handed to the driver,
//!   which publishes the replies itself.
//! * **driver**: owns the core and all leader state; one input at a time,
//!   then carries out the outputs (publishes; results to the persister).
//! * **persister**: writes results to the bucket, many at once; the
//!   **purger** then drops finished submissions in one request a second
//!   (deleting them one by one costs nats-server milliseconds each).
//! * **http**: the HTTP API of SPEC §5 over [`LeaderApi`].
//!
//! **Several servers**: every server connects, creates the JetStream
//! objects and serves HTTP ([`NodeApi`]); one leads at a time
//! ([`election`]). Only the leader runs the tasks above; the others stand
//! by, answer HTTP by asking the leader over NATS, and take over when its
//! record stops moving for `election_timeout`. A new leader starts a fresh
//! driver that reads the submit stream again (finished tasks are skipped
//! by their stored result). Results are written fenced on the leader
//! subject, so a deposed leader cannot overwrite them.

mod config;
pub(crate) mod driver;
pub mod election;
mod guard;
mod journal;
pub mod seal;
#[cfg(test)]
mod sim;
mod warm;

pub use config::*;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, kv, stream};
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot, watch};

use crate::api::{Api, ApiError, ApiFuture, Health};
use crate::auth::{Authenticator, Principal};
use crate::core::{ErrorCode, Millis, PoolName, Snapshot, TaskId, TaskState};
use crate::metrics::{MetricsSnapshot, ServerMetrics};
use crate::task::{Task, TaskStatus};
use crate::wire::{self, Subjects, WireError};
use driver::{Driver, Input, Output, Registrant, Responder, Settings};
use guard::Guard;

/// A server error, with a stable code.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad configuration.
    #[error("{0}")]
    Config(#[from] crate::core::Rejection),
    /// NATS or JetStream failed.
    #[error("{context}: {source}")]
    Nats {
        /// What we were doing.
        context: String,
        /// What failed.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The HTTP listener failed.
    #[error("http on {addr}: {source}")]
    Http {
        /// The address.
        addr: String,
        /// What failed.
        source: std::io::Error,
    },
    /// `[auth]` is not usable (an unset token variable, an inline secret, …).
    #[error("[auth]: {}", .0.message)]
    Auth(WireError),
    /// NATS refused the login (`UNAUTHENTICATED`).
    #[error("{0}")]
    Refused(String),
}

impl Error {
    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Config(r) => r.code(),
            Error::Nats { .. } => ErrorCode::UNAVAILABLE,
            Error::Http { .. } => ErrorCode::UNAVAILABLE,
            Error::Auth(e) => e.code.clone(),
            Error::Refused(_) => ErrorCode::UNAUTHENTICATED,
        }
    }
}

fn nats_err<E: std::error::Error + Send + Sync + 'static>(
    context: impl Into<String>,
) -> impl FnOnce(E) -> Error {
    let context = context.into();
    move |e| Error::Nats {
        context,
        source: Box::new(e),
    }
}

fn wall_now() -> Millis {
    Millis(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
    )
}

/// The default server id: host name and process id.
pub fn default_server_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "cronoq".into());
    let host: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("{host}-{}", std::process::id())
}

/// What the HTTP API and NATS requests use to reach the leader.
#[derive(Clone)]
pub struct LeaderApi {
    inner: Arc<LeaderInner>,
}

struct LeaderInner {
    client: async_nats::Client,
    js: jetstream::Context,
    subjects: Subjects,
    inputs: mpsc::Sender<Input>,
    results: kv::Store,
    stream_name: String,
    max_payload_bytes: usize,
    driver_alive: AtomicBool,
    /// Wall-clock ms of the last turn of the driver and of the consumer
    /// loop: a loop that stops turning makes the server unready.
    driver_beat: AtomicU64,
    consumer_beat: AtomicU64,
    /// [`Driver::consumed_below`] after the driver's last turn.
    consumed_below: AtomicU64,
    allow_undeclared_pools: bool,
    declared_pools: BTreeSet<PoolName>,
    epoch: u64,
    /// Times this process took the lead (shared by its leaderships).
    takeovers: Arc<AtomicU64>,
    /// Journal records being written and not yet acknowledged.
    journal_pending: Arc<AtomicU64>,
    /// Credentials and worker sessions of this leadership.
    guard: Arc<Guard>,
    /// The servers' storage key.
    seal: seal::Seal,
}

/// A loop that has not turned for this long is not making progress.
const STALL_AFTER: Millis = Millis(10_000);

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

fn unavailable(message: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::UNAVAILABLE, message)
}

impl LeaderApi {
    async fn ask<T>(&self, make: impl FnOnce(Responder<T>) -> Input) -> Result<T, WireError> {
        let (tx, rx) = oneshot::channel();
        self.inner
            .inputs
            .send(make(Responder::Local(tx)))
            .await
            .map_err(|_| unavailable("the server is shutting down"))?;
        rx.await
            .map_err(|_| unavailable("the server is shutting down"))?
    }

    async fn stream(&self) -> Result<stream::Stream, WireError> {
        self.inner
            .js
            .get_stream(&self.inner.stream_name)
            .await
            .map_err(|e| unavailable(format!("submit stream: {e}")))
    }

    /// A finished task's result from the bucket.
    async fn stored_result(&self, id: TaskId) -> Result<Option<TaskStatus>, WireError> {
        let key = id.to_string();
        match self.inner.results.get(&key).await {
            Ok(Some(bytes)) => match self.inner.seal.open(&key, &bytes) {
                Ok(body) => Ok(Some(wire::TaskRecord::decode(body)?.into_status())),
                Err(why) => {
                    seal::log_refused("stored result", &key, why);
                    Ok(None)
                }
            },
            Ok(None) => Ok(None),
            Err(e) => Err(unavailable(format!("results bucket: {e}"))),
        }
    }

    /// Whether the stream holds the submission (accepted, maybe not yet
    /// consumed), and its pool.
    async fn accepted(&self, id: TaskId) -> Result<Option<PoolName>, WireError> {
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
    /// Checked here as the driver will check it (payload limit, horizon,
    /// declared pools), so a bad submission is refused at once.
    pub async fn submit(&self, task: Task) -> Result<TaskId, WireError> {
        let spec = task.to_spec(TaskId(1), self.inner.max_payload_bytes)?;
        spec.check_horizon(wall_now())?;
        if !self.inner.allow_undeclared_pools && !self.inner.declared_pools.contains(&spec.pool) {
            return Err(crate::core::Rejection::UnknownPool(spec.pool).into());
        }
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
            return Ok(TaskStatus {
                id,
                pool,
                state: TaskState::Queued,
                reason: None,
                attempts: Vec::new(),
                output: None,
                output_base64: None,
                error: None,
                deadline_missed: false,
            });
        }
        Err(WireError::new(
            ErrorCode::NOT_FOUND,
            format!("task {id} not found"),
        ))
    }

    /// The pool and submitter of a task that can still be cancelled: live
    /// here, or accepted and not consumed yet (its submission's proof
    /// names the submitter). `None`: finished or unknown (cancel says so).
    async fn pool_and_owner(
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
        match self.ask(|to| Input::Cancel(id, to)).await {
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
        let mut m = self.ask(Input::Metrics).await?;
        let server = m.server.get_or_insert_with(ServerMetrics::default);
        server.takeovers = self.inner.takeovers.load(Ordering::Relaxed);
        server.journal_pending = self.inner.journal_pending.load(Ordering::Relaxed);
        server.storage_refused = seal::refused_total();
        Ok(m)
    }

    /// The newest live and recently finished tasks (see [`Api::recent_tasks`]).
    pub async fn recent_tasks(&self, limit: usize) -> Result<Vec<TaskStatus>, WireError> {
        crate::api::check_recent_limit(limit)?;
        Ok(self.ask(|to| Input::RecentTasks(limit, to)).await?.tasks)
    }

    fn health(&self) -> Health {
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
        )
    }
}

/// A leader's health from its loops' last turns: not live when the driver
/// stopped or has not turned for [`STALL_AFTER`]; not ready when, besides,
/// NATS is away or the submit consumer has not turned for that long.
fn leader_health(
    now: Millis,
    connected: bool,
    driver_alive: bool,
    driver_beat: Millis,
    consumer_beat: Millis,
) -> Health {
    let turning = |beat: Millis| now.0.saturating_sub(beat.0) < STALL_AFTER.0;
    let driving = driver_alive && turning(driver_beat);
    let consuming = turning(consumer_beat);
    Health {
        live: driving,
        ready: connected && driving && consuming,
        detail: match (connected, driving, consuming) {
            (true, true, true) => "leader".into(),
            (false, _, _) => "not connected to NATS".into(),
            (_, false, _) => "driver stopped or stalled".into(),
            (_, _, false) => "submit consumer stalled".into(),
        },
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
        assert!(leader_health(now, true, true, fresh, fresh).ready);
        let h = leader_health(now, true, true, fresh, stale);
        assert!(h.live && !h.ready, "{h:?}");
        assert_eq!(h.detail, "submit consumer stalled");
        let h = leader_health(now, true, true, stale, fresh);
        assert!(!h.live && !h.ready);
        let h = leader_health(now, true, false, fresh, fresh);
        assert!(!h.live && !h.ready);
        assert!(!leader_health(now, false, true, fresh, fresh).ready);
    }
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
}

/// Connects to NATS, retrying every second until it works or `give_up`.
///
/// `login` is read first: a bad credentials file or inbox prefix fails at
/// once (`INVALID_ARGUMENT`), and so does a login NATS refuses
/// (`UNAUTHENTICATED`: the credentials are wrong, waiting will not help).
/// Permission violations NATS reports later are logged as warnings.
pub async fn connect_nats(
    url: &str,
    name: &str,
    login: &crate::wire::NatsLogin,
    give_up: Option<Duration>,
) -> Result<async_nats::Client, Error> {
    let login = login.load()?;
    let started = tokio::time::Instant::now();
    let mut logged = false;
    loop {
        match login
            .options()
            .name(name)
            .max_reconnects(None)
            .event_callback(|event| async move { log_server_error(&event) })
            .connect(wire::server_list(url))
            .await
        {
            Ok(client) => return Ok(client),
            Err(e) if e.kind() == async_nats::ConnectErrorKind::AuthorizationViolation => {
                return Err(Error::Refused(format!(
                    "connecting to {url}: NATS refused the login ({}): check nats_creds / \
                     --nats-creds against the nats-server's users",
                    if login.has_credentials() {
                        "wrong or unknown credentials"
                    } else {
                        "it requires credentials and none were given"
                    }
                )));
            }
            Err(e) => {
                if give_up.is_some_and(|g| started.elapsed() >= g) {
                    return Err(nats_err(format!("connecting to {url}"))(e));
                }
                if !logged {
                    tracing::warn!(url, error = %e, "cannot reach nats yet; retrying");
                    logged = true;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Logs what NATS reports as an error on a connection (a permission
/// violation: the nats-server's users do not allow a subject cronoq uses).
pub(crate) fn log_server_error(event: &async_nats::Event) {
    if let async_nats::Event::ServerError(e) = event {
        tracing::warn!(error = %e, "nats-server reported an error on this connection");
    }
}

/// A running server's handles, for embedding (tests, `cronoq dev`).
pub struct Running {
    /// The API the HTTP routes serve.
    pub api: NodeApi,
    /// The HTTP address actually bound.
    pub http_addr: std::net::SocketAddr,
}

/// Runs the server until `shutdown` resolves.
pub async fn run(
    config: ServerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let (ready_tx, _ready_rx) = oneshot::channel();
    serve(config, shutdown, ready_tx).await
}

/// Like [`run`], reporting the bound HTTP address once serving.
pub async fn serve(
    config: ServerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ready: oneshot::Sender<Running>,
) -> Result<(), Error> {
    config.check()?;
    let auth = Arc::new(config.authenticator().map_err(Error::Auth)?);
    let s = &config.server;
    let seal = config.seal().map_err(Error::Auth)?;
    if config.auth.required && s.nats_creds.is_none() {
        tracing::warn!(
            "[auth] required = true but this server connects to NATS without credentials ([server] nats_creds): \
             on a NATS without accounts and permissions anyone can read every payload, write to JetStream \
             and delete cronoq's streams; production needs deploy/nats/ (see SECURITY.md)"
        );
    }
    if config.auth.required && !seal.is_set() {
        tracing::warn!(
            "[auth] required = true but no [server] storage_key_env: what the leader stores is not sealed, \
             so anyone who can write to JetStream can forge results and leader records (see SECURITY.md)"
        );
    }
    let subjects = Subjects::new(&s.subject_prefix)?;
    let server_id = s.id.clone().unwrap_or_else(default_server_id);
    let pools = config
        .pools
        .iter()
        .map(PoolSection::to_core)
        .collect::<Result<Vec<_>, _>>()?;

    // One stop signal for start-up, the HTTP server and the election loop.
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });

    let login = s.nats_login();
    let client = connect_nats(
        &s.nats_url,
        &format!("cronoq-server {server_id}"),
        &login,
        None,
    )
    .await?;
    tracing::info!(url = %s.nats_url, server_id = %server_id, "connected to nats");
    let nats_max_payload = client.server_info().max_payload;
    let max_payload_bytes = effective_payload_limit(s.max_payload_bytes, nats_max_payload);
    if max_payload_bytes < s.max_payload_bytes {
        // Expected with the defaults (1 MiB both sides): say so quietly;
        // a configured limit NATS cannot carry deserves a warning.
        let configured = s.max_payload_bytes != ServerSection::default().max_payload_bytes;
        let message =
            "max_payload_bytes lowered to what fits in one NATS message with its envelope";
        if configured {
            tracing::warn!(
                configured = s.max_payload_bytes,
                nats_max_payload,
                limit = max_payload_bytes,
                "{message}"
            );
        } else {
            tracing::info!(nats_max_payload, limit = max_payload_bytes, "{message}");
        }
    }
    let js = jetstream::new(client.clone());
    let submit_config = stream::Config {
        name: subjects.submit_stream(),
        subjects: vec![subjects.submit_all()],
        storage: stream::StorageType::File,
        duplicate_window: Duration::from_secs(120),
        // Headers and body together: JetStream refuses a larger publish.
        max_message_size: i32::try_from(nats_max_payload).unwrap_or(i32::MAX),
        num_replicas: s.replicas,
        ..Default::default()
    };
    // JetStream may not be ready yet (a cluster still electing its meta
    // leader, nats-server started without JetStream for now): every step
    // that needs it waits for it, as the connection waits for NATS.
    let Some(submit_stream) = until_jetstream("the submit stream", &stop_rx, || {
        ensure_stream(&js, submit_config.clone(), "the submit stream")
    })
    .await
    else {
        return Ok(());
    };
    let dead_letter_config = stream::Config {
        name: subjects.dead_letter_stream(),
        subjects: vec![subjects.dead_letter_all()],
        storage: stream::StorageType::File,
        max_age: Duration::from_secs(7 * 24 * 3600),
        max_messages: 100_000,
        discard: stream::DiscardPolicy::Old,
        num_replicas: s.replicas,
        ..Default::default()
    };
    let Some(_) = until_jetstream("the dead-letter stream", &stop_rx, || {
        ensure_stream(&js, dead_letter_config.clone(), "the dead-letter stream")
    })
    .await
    else {
        return Ok(());
    };
    let Some(results) = until_jetstream("the results bucket", &stop_rx, || async {
        match js.get_key_value(subjects.results_bucket()).await {
            Ok(kv) => Ok(kv),
            Err(_) => js
                .create_key_value(kv::Config {
                    bucket: subjects.results_bucket(),
                    history: 1,
                    max_age: s.results_ttl,
                    storage: stream::StorageType::File,
                    num_replicas: s.replicas,
                    ..Default::default()
                })
                .await
                .map_err(nats_err("creating the results bucket")),
        }
    })
    .await
    else {
        return Ok(());
    };
    // One fence check per group commit instead of one per record. Waited
    // for like the rest while JetStream does not answer; a refusal (the
    // stream will not take the setting) means record by record.
    let atomic_batches = if s.journal_in_batches() {
        let results_stream = format!("KV_{}", subjects.results_bucket());
        let version = client.server_info().version;
        let asked = until_jetstream("atomic batches on the results stream", &stop_rx, || async {
            match journal::enable_atomic(&js, &version, &results_stream).await {
                Err(e) if jetstream_not_answering(&e) => Err(Error::Nats {
                    context: "allowing atomic batches".into(),
                    source: e.into(),
                }),
                answer => Ok(answer),
            }
        })
        .await;
        match asked {
            None => return Ok(()),
            Some(Ok(on)) => on,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "cannot allow atomic batches on the results stream");
                false
            }
        }
    } else {
        false
    };
    tracing::info!(
        atomic_batches,
        "journal writes: {}",
        if atomic_batches {
            "atomic batches, one fence check each"
        } else {
            "one fenced write per record"
        }
    );

    let listener = tokio::net::TcpListener::bind(&s.http_addr)
        .await
        .map_err(|e| Error::Http {
            addr: s.http_addr.clone(),
            source: e,
        })?;
    let http_addr = listener.local_addr().map_err(|e| Error::Http {
        addr: s.http_addr.clone(),
        source: e,
    })?;
    let election = election::Election::new(
        js.clone(),
        &subjects,
        server_id.clone(),
        http_addr.to_string(),
        s.election_timeout,
    )
    .with_seal(seal.clone());
    // Also the HTTP API's client with credentials: it checks a payload
    // against the limit in force before publishing it.
    let remote = crate::client::ClientOptions::new()
        .prefix(subjects.prefix())
        .max_payload_bytes(max_payload_bytes)
        .nats_login(login)
        .connect(&s.nats_url)
        .await
        .map_err(nats_err("connecting the follower's client"))?;
    let (seen_tx, seen_rx) = watch::channel(None);
    let node = NodeApi {
        inner: Arc::new(NodeInner {
            client: client.clone(),
            leading: std::sync::RwLock::new(None),
            remote,
            seen: seen_rx,
            election_timeout: s.election_timeout,
            missing: Arc::default(),
        }),
    };

    tracing::info!(addr = %http_addr, "http api listening");
    // With credentials required, the HTTP API calls the leader over NATS
    // as each caller (its Bearer token), so the leader alone enforces.
    let http_auth = config
        .auth
        .required
        .then(|| crate::http::HttpAuth::through(node.inner.remote.clone()));
    let router = crate::http::router_with_auth(Arc::new(node.clone()), http_auth);
    let _ = ready.send(Running {
        api: node.clone(),
        http_addr,
    });
    let limits = crate::http::HttpLimits {
        header_timeout: s.http_header_timeout,
        idle_timeout: s.http_idle_timeout,
        max_connections: s.http_max_connections,
        // Checked when the config was loaded.
        allowed_hosts: config.allowed_hosts().unwrap_or_default(),
        ..Default::default()
    };
    let http = tokio::spawn(crate::http::serve(
        listener,
        router,
        limits,
        stopped(stop_rx.clone()),
    ));

    let assets = tokio::spawn(watch_assets(
        js.clone(),
        vec![
            (subjects.submit_stream(), "the submit stream"),
            (subjects.dead_letter_stream(), "the dead-letter stream"),
            (
                format!("KV_{}", subjects.results_bucket()),
                "the results bucket's stream",
            ),
        ],
        node.inner.missing.clone(),
    ));
    let (warm_paused, warm_paused_rx) = watch::channel(false);
    let base = Base {
        config: config.clone(),
        pools,
        server_id,
        subjects,
        client: client.clone(),
        js,
        submit_stream,
        results,
        max_payload_bytes,
        nats_max_payload,
        atomic_batches,
        takeovers: Arc::default(),
        auth,
        warm: warm::WarmJournal::sealed(seal.clone()),
        warm_paused,
        seal: seal.clone(),
    };
    // Standing by warm: the journal is followed from the start, so a
    // takeover reads it from memory.
    let follower = base.config.server.warm_standby.then(|| {
        tokio::spawn(warm::follow(
            base.results.clone(),
            base.submit_stream.clone(),
            base.warm.clone(),
            warm_paused_rx,
        ))
    });
    loop {
        tracing::info!("standing by");
        let (epoch, sent) = tokio::select! {
            won = election.campaign(&seen_tx) => won,
            () = stopped(stop_rx.clone()) => break,
        };
        tracing::info!(epoch, "leading");
        let renewed = Arc::new(election::AtomicInstant::new(sent));
        let mut leadership = match lead(&base, epoch, &election, renewed.clone()).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(epoch, error = %e, "cannot start leading; standing by");
                base.warm_paused.send_replace(false);
                election.resign(epoch).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        node.set_leading(Some(leadership.api.clone()));
        let mut lost = leadership.lost.clone();
        let why = tokio::select! {
            why = election.hold(epoch, &renewed) => Some(why),
            why = lost.wait_for(|l| l.is_some()) => {
                Some(why.map(|w| w.clone().unwrap_or_default()).unwrap_or_default())
            }
            _ = &mut leadership.driver => Some("the driver stopped".to_string()),
            () = stopped(stop_rx.clone()) => None,
        };
        let Some(why) = why else {
            node.set_leading(None);
            leadership.stop();
            election.resign(epoch).await;
            break;
        };
        tracing::warn!(epoch, why = %why, "lost leadership; standing by");
        node.set_leading(None);
        leadership.stop();
        base.warm_paused.send_replace(false);
        election.fence.store(0, Ordering::SeqCst);
    }
    if let Some(follower) = follower {
        follower.abort();
    }
    assets.abort();
    tracing::info!("shutting down");
    let result = match http.await {
        Ok(r) => r.map_err(|e| Error::Http {
            addr: http_addr.to_string(),
            source: e,
        }),
        Err(_) => Ok(()),
    };
    let _ = client.flush().await;
    result
}

/// Runs a start-up step that needs JetStream until it succeeds, with a
/// warning saying what it waits for and backoff (250 ms doubling to 5 s);
/// `None` if the server is told to stop meanwhile. Every error is waited
/// out: while a JetStream cluster elects its meta leader it answers
/// timeouts, `UNAVAILABLE` and "insufficient resources" alike, and a
/// server that exited then would have to be restarted by hand.
async fn until_jetstream<T, F, Fut>(
    what: &str,
    stop: &watch::Receiver<bool>,
    mut step: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let mut delay = Duration::from_millis(250);
    let mut tries = 0u32;
    loop {
        let result = tokio::select! {
            result = step() => result,
            () = stopped(stop.clone()) => return None,
        };
        match result {
            Ok(value) => {
                if tries > 0 {
                    tracing::info!(what, tries, "jetstream ready");
                }
                return Some(value);
            }
            Err(e) => {
                tries += 1;
                tracing::warn!(
                    what,
                    tries,
                    retry_in_ms = delay.as_millis() as u64,
                    error = %e,
                    "waiting for jetstream"
                );
            }
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = stopped(stop.clone()) => return None,
        }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// An error of a JetStream request that says nothing about the request
/// itself: no answer (yet).
fn jetstream_not_answering(error: &str) -> bool {
    let e = error.to_ascii_lowercase();
    [
        "timed out",
        "timeout",
        "no responders",
        "unavailable",
        "not enabled",
        "10008",
    ]
    .iter()
    .any(|s| e.contains(s))
}

/// Resolves once `stop` turns true.
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// What every leadership of this process shares.
struct Base {
    config: ServerConfig,
    /// `config.pools`, checked and converted once.
    pools: Vec<(PoolName, crate::core::PoolConfig)>,
    server_id: String,
    subjects: Subjects,
    client: async_nats::Client,
    js: jetstream::Context,
    submit_stream: stream::Stream,
    results: kv::Store,
    max_payload_bytes: usize,
    nats_max_payload: usize,
    /// The results stream takes atomic batches ([`journal`]).
    atomic_batches: bool,
    /// Times this process took the lead.
    takeovers: Arc<AtomicU64>,
    /// The credentials `[auth]` allows.
    auth: Arc<Authenticator>,
    /// This process's warm copy of the journal.
    warm: warm::WarmJournal,
    /// The servers' storage key.
    seal: seal::Seal,
    /// True while this process leads: the copy is not followed
    /// ([`warm::follow`]).
    warm_paused: watch::Sender<bool>,
}

/// One leadership's tasks.
struct Leadership {
    api: LeaderApi,
    driver: tokio::task::JoinHandle<()>,
    others: Vec<tokio::task::JoinHandle<()>>,
    /// Set when a fenced write is refused: a successor took over.
    lost: watch::Receiver<Option<String>>,
}

impl Leadership {
    fn stop(self) {
        self.driver.abort();
        for task in self.others {
            task.abort();
        }
    }
}

/// Starts leading with `epoch`: a fresh driver reads the submit stream
/// from its first message, answers `P.api.*`, and writes results fenced on
/// the leader subject.
async fn lead(
    base: &Base,
    epoch: u64,
    election: &election::Election,
    renewed: Arc<election::AtomicInstant>,
) -> Result<Leadership, Error> {
    let s = &base.config.server;
    // The bucket keeps the max age it was created with (or the last
    // leader's): this leader's `results_ttl` governs, and its rewrites of
    // live records keep pace with the max age the bucket has.
    let results_max_age = journal::results_max_age(
        &base.js,
        &format!("KV_{}", base.subjects.results_bucket()),
        s.results_ttl,
    )
    .await;
    let now = wall_now();
    base.takeovers.fetch_add(1, Ordering::Relaxed);
    let journal_pending = Arc::new(AtomicU64::new(0));
    let worker_timeout = Millis::from_duration(s.worker_timeout);
    let mut driver = Driver::new(
        base.subjects.clone(),
        epoch,
        Settings {
            server_id: base.server_id.clone(),
            lease_ttl: Millis::from_duration(s.lease_ttl),
            worker_timeout,
            heartbeat_interval: Millis((worker_timeout.0 / 3).max(100)),
            max_payload_bytes: base.max_payload_bytes,
            max_reply_bytes: base.nats_max_payload.saturating_sub(1024),
            // The fence headers take about 150 bytes of the message.
            max_record_bytes: base.nats_max_payload.saturating_sub(512),
            retain_finished: 10_000,
            pools: base.pools.clone(),
            max_workers: s.max_workers,
            limits: s.limits(),
            // A re-attaching worker registers within a heartbeat of seeing
            // the new leader; one silent this long is gone anyway.
            reattach_grace: worker_timeout,
            events: s.events,
            // No max age: JetStream keeps records for good.
            record_refresh: if results_max_age.is_zero() {
                Millis(u64::MAX / 4)
            } else {
                Millis::from_duration(results_max_age / 3).max(Millis(100))
            },
            // In atomic batches a start record costs no fence check or
            // acknowledgement of its own; a separate start write would
            // compete with the batch for the leader subject (10164 on a
            // replicated stream). Record by record, one write per turn.
            group_starts: !base.atomic_batches,
        },
        now,
    );
    let (inputs, input_rx) = mpsc::channel(65_536);
    let (commit_tx, commit_rx) = mpsc::unbounded_channel::<Turn>();
    let pending: Pending = Arc::default();
    let (floor_tx, floor_rx) = watch::channel(1u64);
    let (lost_tx, lost_rx) = watch::channel(None);
    let guard = Arc::new(Guard::new(
        base.auth.clone(),
        base.subjects.clone(),
        worker_timeout,
    ));
    let api = LeaderApi {
        inner: Arc::new(LeaderInner {
            client: base.client.clone(),
            js: base.js.clone(),
            subjects: base.subjects.clone(),
            inputs: inputs.clone(),
            results: base.results.clone(),
            stream_name: base.subjects.submit_stream(),
            max_payload_bytes: base.max_payload_bytes,
            driver_alive: AtomicBool::new(true),
            driver_beat: AtomicU64::new(now.0),
            consumed_below: AtomicU64::new(0),
            consumer_beat: AtomicU64::new(now.0),
            allow_undeclared_pools: s.allow_undeclared_pools,
            declared_pools: base.pools.iter().map(|(name, _)| name.clone()).collect(),
            epoch,
            takeovers: base.takeovers.clone(),
            journal_pending: journal_pending.clone(),
            guard: guard.clone(),
            seal: base.seal.clone(),
        }),
    };
    let startup = base
        .submit_stream
        .clone()
        .info()
        .await
        .map_err(nats_err("reading the submit stream"))?
        .state
        .clone();
    let startup_last = startup.last_sequence;
    // Submissions left by earlier leaderships: read them (and their journal
    // records) before serving workers, who list their attempts once.
    let catch_up_to = (startup.messages > 0).then_some(startup_last);
    if catch_up_to.is_some() {
        driver.catch_up_first();
    }
    let warm = match catch_up_to {
        Some(_) => warm_journal(base).await,
        None => None,
    };
    // The start records (a few keys: one per recent turn with attempts
    // still running), read from the bucket whether warm or not.
    let starts = match catch_up_to {
        Some(_) => read_starts(&base.results, &base.seal).await?,
        None => wire::StartIndex::default(),
    };
    // The only writer now: no need to follow its own writes.
    base.warm_paused.send_replace(true);
    let consumer = tokio::spawn(consume(
        base.client.clone(),
        base.submit_stream.clone(),
        base.subjects.clone(),
        base.results.clone(),
        Startup {
            last: startup_last,
            warm,
            starts: Arc::new(starts),
            catch_up_to,
        },
        inputs.clone(),
        api.clone(),
    ));
    // Subscribed before the first renewal announces this leadership, so a
    // worker that heartbeats on seeing it finds someone answering.
    let mut requests = futures_util::stream::SelectAll::new();
    for subject in [base.subjects.api("*"), base.subjects.worker_api_all()] {
        requests.push(
            base.client
                .subscribe(subject.clone())
                .await
                .map_err(nats_err(format!("subscribing to {subject}")))?,
        );
    }
    let tenure = Tenure {
        renewed,
        timeout: election.timeout(),
    };
    let api_requests = tokio::spawn(serve_api(
        base.client.clone(),
        api.clone(),
        requests,
        tenure.clone(),
    ));
    let committer = tokio::spawn(commit(
        commit_rx,
        CommitCtx {
            client: client_for(&api),
            inputs: inputs.clone(),
            results: Fenced {
                js: base.js.clone(),
                bucket: base.subjects.results_bucket(),
                subject: election.subject().to_string(),
                fence: election.fence.clone(),
                lost: lost_tx,
                election: election.clone(),
                epoch,
                pending_records: journal_pending,
                atomic: AtomicBool::new(base.atomic_batches),
                batch_max: AtomicUsize::new(journal::MAX_BATCH),
                batches: AtomicU64::new(0),
                client: base.client.clone(),
            },
            pending: pending.clone(),
            js: base.js.clone(),
            submit_stream: base.submit_stream.clone(),
            subjects: base.subjects.clone(),
            guard,
            seal: base.seal.clone(),
            tenure: tenure.clone(),
        },
    ));
    let purger = tokio::spawn(purge(base.submit_stream.clone(), floor_rx, pending.clone()));
    let driver = {
        let api = api.clone();
        tokio::spawn(async move {
            drive(
                driver,
                input_rx,
                commit_tx,
                pending,
                floor_tx,
                &api.inner.driver_beat,
                &api.inner.consumed_below,
                tenure,
            )
            .await;
            api.inner.driver_alive.store(false, Ordering::Relaxed);
        })
    };
    Ok(Leadership {
        api,
        driver,
        others: vec![consumer, api_requests, committer, purger],
        lost: lost_rx,
    })
}

/// The leadership's right to act ([`election::may_act`]): until the
/// election timeout (less a margin) after its last stored renewal was sent
/// (a follower takes over only after seeing no renewal for that long on
/// its own clock). Judged on the monotonic clock when it is about to act:
/// at the top of every driver turn and before every input, before the
/// committer announces a turn, and before a request is answered.
#[derive(Clone)]
struct Tenure {
    renewed: Arc<election::AtomicInstant>,
    timeout: Duration,
}

impl Tenure {
    fn valid(&self) -> bool {
        self.renewed.may_act(self.timeout)
    }

    /// `valid`, and if not, the driver steps down (acts on nothing more;
    /// the election loop sees the driver stop and stands by).
    fn check(&self, driver: &mut Driver) -> bool {
        if self.valid() {
            return true;
        }
        tracing::warn!("leadership not renewed in time: acting on nothing more; the driver stops");
        driver.step_down();
        false
    }
}

/// Results writes fenced on the leader subject.
struct Fenced {
    js: jetstream::Context,
    bucket: String,
    subject: String,
    fence: Arc<AtomicU64>,
    lost: watch::Sender<Option<String>>,
    election: election::Election,
    epoch: u64,
    /// Records being written, not yet acknowledged (the
    /// `cronoq_journal_pending_records` gauge).
    pending_records: Arc<AtomicU64>,
    /// Atomic batches ([`journal`]): the stream allows them. Turned off if
    /// the stream stops allowing them.
    atomic: AtomicBool,
    /// The most records per atomic batch (lowered if NATS refuses ours).
    batch_max: AtomicUsize,
    /// Atomic batches started, for their ids.
    batches: AtomicU64,
    /// For the staged (unacknowledged) messages of a batch.
    client: async_nats::Client,
}

impl Fenced {
    /// Stores `body` under `key` if this server still leads. `Ok(false)`:
    /// refused, a successor took over (and `lost` is set).
    async fn put(&self, key: &str, body: Bytes) -> Result<bool, String> {
        loop {
            let expected = self.fence.load(Ordering::SeqCst);
            if expected == 0 {
                return Ok(false);
            }
            let headers = election::fence_headers(&self.subject, expected);
            let sent = self
                .js
                .publish_with_headers(format!("$KV.{}.{key}", self.bucket), headers, body.clone())
                .await
                .map_err(|e| e.to_string())?;
            match sent.await {
                Ok(_) => return Ok(true),
                // Replicated stream: another fenced write (a renewal, a
                // result) was in flight. Not an answer about leadership.
                Err(e) if election::is_busy(&e) => {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                Err(e)
                    if e.kind()
                        == async_nats::jetstream::context::PublishErrorKind::WrongLastSequence =>
                {
                    if self.refused(expected).await {
                        continue;
                    }
                    return Ok(false);
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// A write expecting `expected` on the leader subject was refused:
    /// `true` if it is still ours to retry (with the fence as it is now),
    /// `false` if someone else wrote the subject (and `lost` is set).
    async fn refused(&self, expected: u64) -> bool {
        // A renewal moved the fence meanwhile: try again with the new one.
        // Unchanged: someone else wrote it.
        if self.fence.load(Ordering::SeqCst) != expected {
            return true;
        }
        // Our own renewal, stored before its acknowledgement reached the
        // renewal loop: still ours.
        // Boxed: rare, and its read of the leader key would otherwise
        // make every record write's future as large as its own.
        if Box::pin(self.election.reclaim_fence(self.epoch, expected)).await {
            return true;
        }
        let _ = self.lost.send(Some(
            "a result write was fenced out: another server leads".into(),
        ));
        false
    }
}

/// The server's API whoever leads: the local leader while this server
/// leads, the leader over NATS while it follows.
#[derive(Clone)]
pub struct NodeApi {
    inner: Arc<NodeInner>,
}

struct NodeInner {
    client: async_nats::Client,
    leading: std::sync::RwLock<Option<LeaderApi>>,
    remote: crate::client::Client,
    seen: watch::Receiver<Option<election::Seen>>,
    /// The election timeout: a leader record that stands still for half of
    /// it means no server leads.
    election_timeout: Duration,
    /// The JetStream streams cronoq needs that are missing (looked at every
    /// couple of seconds by [`watch_assets`]); `None`: all there.
    missing: Arc<std::sync::RwLock<Option<String>>>,
}

impl NodeApi {
    fn set_leading(&self, api: Option<LeaderApi>) {
        *self
            .inner
            .leading
            .write()
            .unwrap_or_else(|e| e.into_inner()) = api;
    }

    fn leader(&self) -> Option<LeaderApi> {
        self.inner
            .leading
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn health(&self) -> Health {
        let missing = self
            .inner
            .missing
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(missing) = missing {
            return Health {
                live: true,
                ready: false,
                detail: missing,
            };
        }
        if let Some(leader) = self.leader() {
            let mut health = leader.health();
            if health.ready {
                health.detail = format!("leader (epoch {})", leader.inner.epoch);
            }
            return health;
        }
        let connected = matches!(
            self.inner.client.connection_state(),
            async_nats::connection::State::Connected
        );
        let seen = self.inner.seen.borrow().clone();
        match (connected, seen) {
            (false, _) => Health {
                live: true,
                ready: false,
                detail: "not connected to NATS".into(),
            },
            (true, Some(seen)) => follower_health(&seen, self.inner.election_timeout),
            (true, None) => Health {
                live: true,
                ready: false,
                detail: "no leader known yet".into(),
            },
        }
    }
}

/// A follower is ready while a server leads: the leader record is one a
/// cronoq server wrote, not resigned, and moved within half the election
/// timeout (a leader renews every quarter of it).
fn follower_health(seen: &election::Seen, election_timeout: Duration) -> Health {
    let o = &seen.observed;
    let unready = |detail: String| Health {
        live: true,
        ready: false,
        detail,
    };
    let Some(record) = &o.record else {
        return unready("no leader known yet".into());
    };
    if let Some(why) = o.not_genuine() {
        return unready(format!(
            "no leader: the leader record was not written by a cronoq server ({why})"
        ));
    }
    if record.resigned {
        return unready("no leader: the last one resigned".into());
    }
    // No figures or ids in a reason: it is a metric label too
    // (`cronoq_unready{reason}`), and whoever can publish on the leader
    // subject chooses the id.
    if seen.since.elapsed() >= election_timeout / 2 {
        return unready(
            "no leader: the leader record has not moved for half the election timeout".into(),
        );
    }
    Health {
        live: true,
        ready: true,
        detail: format!("follower of {} (epoch {})", record.id, o.epoch()),
    }
}

/// Every couple of seconds, whether the JetStream streams cronoq needs
/// (the submit and dead-letter streams, the results bucket's stream)
/// exist; a missing one makes the server unready until it is back
/// (`/readyz` and the `cronoq_unready` metric name it). A stream NATS does
/// not answer about is not called missing.
async fn watch_assets(
    js: jetstream::Context,
    names: Vec<(String, &'static str)>,
    missing: Arc<std::sync::RwLock<Option<String>>>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tick.tick().await;
        let mut gone = Vec::new();
        for (name, what) in &names {
            if let Err(e) = js.get_stream(name).await {
                let text = e.to_string().to_ascii_lowercase();
                if text.contains("not found") || text.contains("10059") {
                    gone.push(format!("{what} {name}"));
                }
            }
        }
        let now = (!gone.is_empty()).then(|| format!("missing in JetStream: {}", gone.join(", ")));
        let mut slot = missing.write().unwrap_or_else(|e| e.into_inner());
        if *slot != now {
            match &now {
                Some(m) => tracing::error!(missing = %m, "a stream cronoq needs is missing"),
                None => tracing::info!("every stream cronoq needs is there again"),
            }
            *slot = now;
        }
    }
}

impl Api for NodeApi {
    /// Through the stream; answered once the leader has decided (a
    /// refusal only it can make, such as `max_pools`, is the answer), or
    /// after [`crate::client::CONFIRM_FOR`] as accepted.
    fn submit(&self, task: Task) -> ApiFuture<'_, TaskId> {
        Box::pin(async move {
            let id = match self.leader() {
                Some(l) => l.submit(task).await?,
                None => Api::submit(&self.inner.remote, task).await?,
            };
            crate::client::leaders_verdict(self, id).await?;
            Ok(id)
        })
    }
    fn task(&self, id: TaskId) -> ApiFuture<'_, TaskStatus> {
        Box::pin(async move {
            match self.leader() {
                Some(l) => l.task(id).await,
                None => Api::task(&self.inner.remote, id).await,
            }
        })
    }
    fn cancel(&self, id: TaskId) -> ApiFuture<'_, ()> {
        Box::pin(async move {
            match self.leader() {
                Some(l) => l.cancel(id).await,
                None => Api::cancel(&self.inner.remote, id).await,
            }
        })
    }
    fn snapshot(&self) -> ApiFuture<'_, Snapshot> {
        Box::pin(async move {
            match self.leader() {
                Some(l) => l.snapshot().await,
                None => Api::snapshot(&self.inner.remote).await,
            }
        })
    }
    fn recent_tasks(&self, limit: usize) -> ApiFuture<'_, Vec<TaskStatus>> {
        Box::pin(async move {
            match self.leader() {
                Some(l) => l.recent_tasks(limit).await,
                None => Api::recent_tasks(&self.inner.remote, limit).await,
            }
        })
    }
    /// Only the leading server counts (and exports counters): a follower
    /// answers with no pools, so `sum(rate(…))` over servers is right.
    fn metrics(&self) -> ApiFuture<'_, MetricsSnapshot> {
        Box::pin(async move {
            match self.leader() {
                Some(l) => l.metrics().await,
                None => Ok(MetricsSnapshot::default()),
            }
        })
    }
    fn health(&self) -> Health {
        NodeApi::health(self)
    }
}

/// Gets or creates a stream, then brings an existing one's limits up to
/// `config` (a `max_message_size` set by an older build, say).
async fn ensure_stream(
    js: &jetstream::Context,
    config: stream::Config,
    what: &str,
) -> Result<stream::Stream, Error> {
    let mut stream = js
        .get_or_create_stream(config.clone())
        .await
        .map_err(nats_err(format!("creating {what}")))?;
    let current = stream
        .info()
        .await
        .map_err(nats_err(format!("reading {what}")))?
        .config
        .clone();
    if current.max_message_size != config.max_message_size
        || current.max_age != config.max_age
        || current.max_messages != config.max_messages
    {
        let updated = stream::Config {
            max_message_size: config.max_message_size,
            max_age: config.max_age,
            max_messages: config.max_messages,
            ..current
        };
        if let Err(e) = js.update_stream(updated).await {
            tracing::warn!(stream = %config.name, error = %e, "cannot update the stream's limits");
        }
    }
    Ok(stream)
}

fn client_for(api: &LeaderApi) -> async_nats::Client {
    api.inner.client.clone()
}

/// Reads the submit stream from its first message, forever; recreates the
/// consumer from the next sequence after errors and after every reconnect
/// (a NATS restart).
/// The driver's input for submission `seq` (with its journal record, if
/// an earlier leadership wrote one). Decoding is checked arithmetic
/// throughout; should anything in it still panic, that message fails alone
/// (refused) — the consumer goes on.
fn submission_input(
    subjects: &Subjects,
    guard: &Guard,
    m: &async_nats::Message,
    seq: u64,
    published: SystemTime,
    journaled: Option<wire::TaskRecord>,
    start_slot: Option<u32>,
) -> Input {
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wire::decode_submission(
            subjects,
            m.subject.as_str(),
            m.headers.as_ref(),
            m.payload.clone(),
            published,
        )
    }));
    let (pool, task) = match decoded {
        // Checked after decoding: the proof covers what was sent, and a
        // refusal is recorded like any refused submission.
        Ok((pool, task)) => {
            let stored = Millis(
                published
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
            );
            let task = task.and_then(|t| {
                guard.submission(
                    m.subject.as_str(),
                    m.headers.as_ref(),
                    &m.payload,
                    stored,
                    &pool,
                    t,
                )
            });
            (pool, task)
        }
        Err(panic) => {
            let why = crate::task::panic_message(&*panic);
            tracing::error!(seq, panic = %why, "decoding a submission panicked; refusing it");
            (
                subjects
                    .pool_of_submit(m.subject.as_str())
                    .unwrap_or_default(),
                Err(WireError::new(
                    ErrorCode::INTERNAL,
                    format!("the submission could not be processed: {why}"),
                )),
            )
        }
    };
    match journaled {
        Some(record) => Input::Recovered {
            seq,
            pool,
            task,
            record,
            start_slot,
        },
        None => match task {
            Err(error) if unattributed(guard, m, published, &error) => {
                Input::Unattributed { seq, error }
            }
            task => Input::Submitted { seq, pool, task },
        },
    }
}

/// Whether a refused submission has nobody to attribute it to: auth is on
/// and no credential's proof verifies on it — the guard refused it
/// `UNAUTHENTICATED`, or it did not even decode and carries no proof that
/// verifies. Such refusals are counted, not recorded
/// ([`Input::Unattributed`]).
fn unattributed(
    guard: &Guard,
    m: &async_nats::Message,
    published: SystemTime,
    error: &WireError,
) -> bool {
    if !guard.required() {
        return false;
    }
    if error.code == ErrorCode::UNAUTHENTICATED {
        return true;
    }
    // Checked only on this rare path: a proof is verified once otherwise.
    let stored = Millis(
        published
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    );
    guard
        .owner_of(m.subject.as_str(), m.headers.as_ref(), &m.payload, stored)
        .is_none()
}

/// This process's warm copy of the journal once it has seen everything
/// the bucket held at this takeover (our own takeover write included, so
/// every write of the deposed leader too); `None` if it does not catch up
/// within [`warm::CATCH_UP_WAIT`]: the takeover then reads the bucket.
async fn warm_journal(base: &Base) -> Option<warm::WarmJournal> {
    if !base.config.server.warm_standby {
        tracing::info!("reading the journal from the bucket ([server] warm_standby = false)");
        return None;
    }
    let name = format!("KV_{}", base.subjects.results_bucket());
    let upto = match base.js.get_stream(&name).await {
        Ok(mut stream) => match stream.info().await {
            Ok(info) => info.state.last_sequence,
            Err(e) => {
                tracing::warn!(error = %e, "journal stream info; reading the journal cold");
                return None;
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "journal stream; reading the journal cold");
            return None;
        }
    };
    if base.warm.caught_up(upto, warm::CATCH_UP_WAIT).await {
        let (live, finished) = base.warm.len();
        tracing::info!(
            upto,
            live,
            finished,
            "reading the journal from the warm copy"
        );
        Some(base.warm.clone())
    } else {
        tracing::warn!(
            upto,
            seen = base.warm.seen(),
            "the warm copy of the journal is behind; reading the journal cold"
        );
        None
    }
}

/// The journal record of submission `seq`, if any. Retries while NATS
/// does not answer (a missing answer must not pass for "no record": the
/// task may have run, or finished); gives up after about 10 s.
///
/// Read from the stream's leader (`STREAM.MSG.GET`), not with a direct get:
/// a KV get is a direct get, which any replica of a replicated bucket may
/// answer, however far behind (nats-server#6557, no read-after-write) — a
/// takeover that missed a stored `succeeded` would run the task again.
async fn journal_record(
    results: &kv::Store,
    seal: &seal::Seal,
    seq: u64,
) -> Result<Option<wire::TaskRecord>, String> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    let subject = format!("{}{seq}", results.prefix);
    let got = read_retrying(|| async {
        match results
            .stream
            .get_last_raw_message_by_subject(&subject)
            .await
        {
            Ok(m) => Ok((!kv_tombstone(Some(&m.headers))).then_some(m.payload)),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
    .map_err(|e| format!("the journal record of task {seq} could not be read: {e}"))?;
    let key = seq.to_string();
    Ok(got.and_then(|bytes| {
        let body = seal
            .open(&key, &bytes)
            .map_err(|why| seal::log_refused("journal record", &key, why))
            .ok()?;
        match wire::TaskRecord::decode(body) {
            Ok(record) => Some(record),
            Err(e) => {
                tracing::warn!(seq, error = %e, "unreadable journal record ignored");
                None
            }
        }
    }))
}

/// Tries `read` while NATS does not answer: 12 tries, 50 ms apart at
/// first and doubling up to 2 s (about 10 s in all); the last error then.
async fn read_retrying<T, F, Fut>(mut read: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let mut delay = Duration::from_millis(50);
    let mut last_error = String::new();
    for _ in 0..12 {
        match read().await {
            Ok(value) => return Ok(value),
            Err(e) => {
                tracing::debug!(error = %e, "reading the journal failed; retrying");
                last_error = e;
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    }
    Err(last_error)
}

/// A key-value message that deletes or purges its key.
fn kv_tombstone(headers: Option<&async_nats::HeaderMap>) -> bool {
    headers
        .and_then(|h| h.get("KV-Operation"))
        .is_some_and(|op| op.as_str() == "DEL" || op.as_str() == "PURGE")
}

/// What the submit stream held when a leadership began.
struct Startup {
    /// Its last sequence: submissions up to it may have journal records.
    last: u64,
    /// The warm copy of the journal, caught up with this takeover (`None`:
    /// read the bucket).
    warm: Option<warm::WarmJournal>,
    /// The start records ([`wire::StartRecords`]) the bucket held.
    starts: Arc<wire::StartIndex>,
    /// When to tell the driver it has read them all (`None`: nothing to
    /// read).
    catch_up_to: Option<u64>,
}

/// Every start record (`s.<n>`) of the results bucket at this takeover,
/// read from the stream's leader (an ordered consumer, last message per
/// key). Retries while NATS does not answer; an error after about 10 s
/// (taking over without them could run an attempt that still runs
/// again).
async fn read_starts(results: &kv::Store, seal: &seal::Seal) -> Result<wire::StartIndex, Error> {
    let index = read_retrying(|| read_starts_once(results, seal))
        .await
        .map_err(|e| Error::Nats {
            context: "reading the journal's start records".into(),
            source: e.into(),
        })?;
    tracing::info!(slots = index.len(), "start records read");
    Ok(index)
}

async fn read_starts_once(
    results: &kv::Store,
    seal: &seal::Seal,
) -> Result<wire::StartIndex, String> {
    let mut index = wire::StartIndex::default();
    let mut consumer = results
        .stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            filter_subject: format!("{}s.>", results.prefix),
            deliver_policy: jetstream::consumer::DeliverPolicy::LastPerSubject,
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    let pending = consumer
        .info()
        .await
        .map_err(|e| e.to_string())?
        .num_pending;
    if pending == 0 {
        return Ok(index);
    }
    let mut messages = consumer.messages().await.map_err(|e| e.to_string())?;
    let mut read = 0u64;
    while read < pending {
        let message = tokio::time::timeout(Duration::from_secs(5), messages.next())
            .await
            .map_err(|_| "timed out".to_string())?
            .ok_or("the consumer ended")?
            .map_err(|e| e.to_string())?;
        read += 1;
        let info = message.info().map_err(|e| e.to_string())?;
        let left = info.pending;
        let key = message
            .subject
            .as_str()
            .strip_prefix(results.prefix.as_str())
            .unwrap_or_default();
        let Some(slot) = wire::parse_start_key(key) else {
            continue;
        };
        if kv_tombstone(message.headers.as_ref()) {
            index.set(slot, None);
        } else {
            match seal.open(key, &message.payload) {
                Err(why) => {
                    seal::log_refused("start record", key, why);
                    index.set(slot, None);
                }
                Ok(body) => match wire::decode::<wire::StartRecords>(body) {
                    Ok(records) => index.set(slot, Some(records)),
                    Err(e) => tracing::warn!(slot, error = %e, "unreadable start record ignored"),
                },
            }
        }
        if left == 0 {
            break;
        }
    }
    Ok(index)
}

async fn consume(
    client: async_nats::Client,
    stream: stream::Stream,
    subjects: Subjects,
    results: kv::Store,
    startup: Startup,
    inputs: mpsc::Sender<Input>,
    api: LeaderApi,
) {
    let beat = || {
        api.inner
            .consumer_beat
            .store(wall_now().0, Ordering::Relaxed)
    };
    let Startup {
        last: startup_last,
        warm,
        starts,
        mut catch_up_to,
    } = startup;
    // Shared, not cloned per submission (a store clone copies its whole
    // stream configuration).
    let results = Arc::new(results);
    let mut next_seq = 1u64;
    loop {
        beat();
        // After a reconnect (a NATS restart) the ephemeral consumer may be
        // gone, and async-nats only notices when its 15 s idle heartbeat
        // is missed: new submissions would wait that long. So watch the
        // connection count and start over from `next_seq` at once.
        let connects = client.statistics().connects.load(Ordering::Relaxed);
        let mut reconnect_check = tokio::time::interval(Duration::from_millis(250));
        let consumer = stream
            .create_consumer(jetstream::consumer::pull::OrderedConfig {
                deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: next_seq,
                },
                ..Default::default()
            })
            .await;
        let messages = match consumer {
            Ok(c) => match c.messages().await {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "submit consumer failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "cannot create the submit consumer; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        // The journal records of submissions older than this leadership
        // are read 128 at a time, in order (one round trip each would make
        // a takeover with many unfinished tasks slow).
        let mut messages = messages
            .map(|message| {
                let results = results.clone();
                let warm = warm.clone();
                let seal = api.inner.seal.clone();
                async move {
                    let seq = message
                        .as_ref()
                        .ok()
                        .and_then(|m| m.info().ok())
                        .map(|i| i.stream_sequence);
                    let record = match seq {
                        Some(seq) if seq <= startup_last => match &warm {
                            Some(warm) => Ok(warm.known(seq)),
                            None => journal_record(&results, &seal, seq)
                                .await
                                .map(warm::Known::of),
                        },
                        _ => Ok(warm::Known::None),
                    };
                    (message, record)
                }
            })
            .buffered(128);
        loop {
            beat();
            let message = tokio::select! {
                message = messages.next() => message,
                _ = reconnect_check.tick() => {
                    if client.statistics().connects.load(Ordering::Relaxed) != connects {
                        tracing::info!("reconnected to nats; recreating the submit consumer");
                        break;
                    }
                    continue;
                }
            };
            let Some((message, record)) = message else {
                break;
            };
            let message = match message {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "submit consumer interrupted; resuming");
                    break;
                }
            };
            let record = match record {
                Ok(record) => record,
                Err(e) => {
                    // Never deliver it as new: it may have run, or finished.
                    tracing::warn!(error = %e, "reading the journal failed; resuming");
                    break;
                }
            };
            let (seq, published) = match message.info() {
                Ok(info) => (info.stream_sequence, SystemTime::from(info.published)),
                Err(e) => {
                    tracing::warn!(error = %e, "submission without metadata skipped");
                    continue;
                }
            };
            next_seq = seq + 1;
            // Its journal record, if an earlier leadership wrote one,
            // with the start that follows it merged in.
            let journaled = match record {
                // Finished before, not yet purged: skip it.
                warm::Known::Finished => None,
                warm::Known::Live(record) => Some(starts.merge(TaskId(seq), Some(*record))),
                warm::Known::None => Some(starts.merge(TaskId(seq), None)),
            };
            let input = journaled.map(|(journaled, start_slot)| {
                submission_input(
                    &subjects,
                    &api.inner.guard,
                    &message.message,
                    seq,
                    published,
                    journaled,
                    start_slot,
                )
            });
            if let Some(input) = input {
                if inputs.send(input).await.is_err() {
                    return;
                }
            }
            if catch_up_to.is_some_and(|last| seq >= last) {
                catch_up_to = None;
                if inputs.send(Input::CaughtUp).await.is_err() {
                    return;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Decodes `P.api.*` requests and hands them to the driver (hot paths) or
/// to [`LeaderApi`] (lookups that may need JetStream).
async fn serve_api(
    client: async_nats::Client,
    api: LeaderApi,
    mut requests: futures_util::stream::SelectAll<async_nats::Subscriber>,
    tenure: Tenure,
) {
    while let Some(msg) = requests.next().await {
        // A deposed leader answers nothing (its successor does): not even
        // the checks answered here, such as a heartbeat's "not registered".
        if !tenure.valid() {
            continue;
        }
        let reply = msg.reply.as_ref().map(|r| r.to_string());
        let input = match api.inner.subjects.parse_worker_api(msg.subject.as_str()) {
            Some((worker_id, verb)) => worker_request(&client, &api, &msg, worker_id, verb),
            None => client_request(&client, &api, &msg),
        };
        match input {
            Ok(Some(input)) => {
                if api.inner.inputs.send(input).await.is_err() {
                    return;
                }
            }
            Ok(None) => {}
            Err(e) => {
                if let Some(reply) = reply {
                    let body: Bytes = wire::encode_reply::<wire::Ack>(&Err(e)).into();
                    let _ = client.publish(reply, body).await;
                }
            }
        }
    }
}

/// Publishes `result` to the reply subject of `msg`, if it has one.
fn answer_later<T, F>(client: &async_nats::Client, msg: &async_nats::Message, work: F)
where
    T: serde::Serialize + Send + 'static,
    F: std::future::Future<Output = Result<T, WireError>> + Send + 'static,
{
    let reply = msg.reply.as_ref().map(|r| r.to_string());
    let client = client.clone();
    tokio::spawn(async move {
        let result = work.await;
        if let Some(reply) = reply {
            let body: Bytes = wire::encode_reply(&result).into();
            let _ = client.publish(reply, body).await;
        }
    });
}

/// A worker's request on `P.w.<worker_id>.<verb>`: the id in the subject
/// must be the body's, and (auth on) the message must prove that worker's
/// session — or, to register, a credential allowed to claim what it claims.
fn worker_request(
    client: &async_nats::Client,
    api: &LeaderApi,
    msg: &async_nats::Message,
    worker_id: &str,
    verb: &str,
) -> Result<Option<Input>, WireError> {
    let guard = &api.inner.guard;
    let now = wall_now();
    let (subject, headers, body) = (msg.subject.as_str(), msg.headers.as_ref(), &msg.payload);
    macro_rules! reply {
        () => {
            Responder::Nats(msg.reply.as_ref().map(|r| r.to_string()))
        };
    }
    let same_id = |id: &str| {
        if id == worker_id {
            Ok(())
        } else {
            Err(WireError::new(
                ErrorCode::INVALID_ARGUMENT,
                format!("worker_id {id:?} does not match the subject's {worker_id:?}"),
            ))
        }
    };
    match verb {
        "challenge" => {
            wire::decode_request::<wire::Challenge>(body)?;
            let nonce = guard.challenge(worker_id, now);
            answer_later(client, msg, async move { nonce });
            Ok(None)
        }
        "register" => {
            let r: wire::Register = wire::decode_request(body)?;
            same_id(&r.worker_id)?;
            // Auth on: the session is open already (see `Guard::register`);
            // a registration the driver refuses settles it back.
            let Some((grant, registrant)) = guard.register(subject, headers, body, &r, now)? else {
                return Ok(Some(Input::Register(r, Registrant::default(), reply!())));
            };
            let (tx, rx) = oneshot::channel();
            let guard = guard.clone();
            let worker_id = r.worker_id.clone();
            answer_later(client, msg, async move {
                let result = rx
                    .await
                    .map_err(|_| unavailable("the server is shutting down"))
                    .and_then(|r: Result<wire::RegisterReply, WireError>| r);
                guard.settle_session(&worker_id, &grant.id, result.is_ok());
                result.map(|mut reply| {
                    reply.session = Some(grant);
                    reply
                })
            });
            Ok(Some(Input::Register(r, registrant, Responder::Local(tx))))
        }
        "heartbeat" => {
            let h: wire::Heartbeat = wire::decode_request(body)?;
            same_id(&h.worker_id)?;
            if let Err(e) = guard.worker(worker_id, subject, headers, body, now) {
                // An unknown session (a new leader, or never registered):
                // "not registered" makes a real worker register again.
                tracing::debug!(worker_id, error = %e, "heartbeat without a valid session");
                let epoch = api.inner.epoch;
                answer_later(client, msg, async move {
                    Ok(wire::HeartbeatReply {
                        v: wire::PROTOCOL_VERSION,
                        epoch,
                        registered: false,
                    })
                });
                return Ok(None);
            }
            Ok(Some(Input::Heartbeat(h, reply!())))
        }
        "deregister" => {
            let d: wire::Deregister = wire::decode_request(body)?;
            same_id(&d.worker_id)?;
            guard.worker(worker_id, subject, headers, body, now)?;
            if !d.drain {
                guard.close(worker_id);
            }
            Ok(Some(Input::Deregister(d, reply!())))
        }
        "renew" => {
            let r: wire::Renew = wire::decode_request(body)?;
            same_id(&r.worker_id)?;
            guard.worker(worker_id, subject, headers, body, now)?;
            Ok(Some(Input::Renew(r, reply!())))
        }
        "outcome" => {
            let o: wire::AttemptReport = wire::decode_request(body)?;
            same_id(&o.worker_id)?;
            guard.worker(worker_id, subject, headers, body, now)?;
            Ok(Some(Input::Outcome(o, reply!())))
        }
        "outcomes" => {
            let o: wire::AttemptReports = wire::decode_request(body)?;
            same_id(&o.worker_id)?;
            if o.reports.len() > wire::MAX_REPORTS {
                return Err(WireError::new(
                    ErrorCode::INVALID_ARGUMENT,
                    format!(
                        "{} reports in one request; at most {}",
                        o.reports.len(),
                        wire::MAX_REPORTS
                    ),
                ));
            }
            for report in &o.reports {
                same_id(&report.worker_id)?;
            }
            guard.worker(worker_id, subject, headers, body, now)?;
            Ok(Some(Input::Outcomes(o.reports, reply!())))
        }
        other => Err(WireError::new(
            ErrorCode::NOT_FOUND,
            format!("unknown worker verb {other:?}"),
        )),
    }
}

/// A client's request on `P.api.<verb>`: (auth on) its caller may read,
/// and may cancel only what its role, pools and ownership allow.
fn client_request(
    client: &async_nats::Client,
    api: &LeaderApi,
    msg: &async_nats::Message,
) -> Result<Option<Input>, WireError> {
    let verb = msg.subject.as_str().rsplit('.').next().unwrap_or("");
    let body = &msg.payload;
    macro_rules! reply {
        () => {
            Responder::Nats(msg.reply.as_ref().map(|r| r.to_string()))
        };
    }
    let caller =
        api.inner
            .guard
            .client(msg.subject.as_str(), msg.headers.as_ref(), body, wall_now())?;
    let restricted = caller != Principal::anonymous();
    match verb {
        "snapshot" => {
            if !body.is_empty() {
                wire::decode_request::<wire::GetSnapshot>(body)?;
            }
            caller.may_read(None)?;
            if !restricted {
                return Ok(Some(Input::Snapshot(reply!())));
            }
            let api = api.clone();
            answer_later(client, msg, async move {
                let mut snap = api.snapshot().await?;
                snap.pools.retain(|p| caller.sees_pool(&p.name));
                snap.workers.retain(|w| caller.sees_pool(&w.pool));
                Ok(snap)
            });
            Ok(None)
        }
        "tasks" => {
            let l: wire::ListTasks = wire::decode_request(body)?;
            let limit = l.limit as usize;
            crate::api::check_recent_limit(limit)?;
            caller.may_read(None)?;
            if !restricted {
                return Ok(Some(Input::RecentTasks(limit, reply!())));
            }
            let api = api.clone();
            answer_later(client, msg, async move {
                let mut tasks = api.recent_tasks(limit).await?;
                tasks.retain(|t| caller.sees_pool(&t.pool));
                Ok(wire::TaskList { tasks })
            });
            Ok(None)
        }
        "task" => {
            let g: wire::GetTask = wire::decode_request(body)?;
            let api = api.clone();
            answer_later(client, msg, async move {
                let status = api.task(g.task_id).await?;
                caller.may_read(Some(&status.pool))?;
                Ok(status)
            });
            Ok(None)
        }
        "cancel" => {
            let c: wire::Cancel = wire::decode_request(body)?;
            let api = api.clone();
            caller.may_cancel_some()?;
            answer_later(client, msg, async move {
                if restricted {
                    if let Some((pool, owner)) = api.pool_and_owner(c.task_id).await? {
                        caller.may_cancel(&pool, owner.as_deref())?;
                    }
                }
                api.cancel(c.task_id).await.map(|_| wire::Ack::default())
            });
            Ok(None)
        }
        other => Err(WireError::new(
            ErrorCode::NOT_FOUND,
            format!("unknown api verb {other:?}"),
        )),
    }
}

/// Results being stored: their submissions must not be purged yet.
type Pending = Arc<std::sync::Mutex<BTreeSet<u64>>>;

/// The driver loop: one input at a time (then whatever else is queued),
/// housekeeping when the next deadline is due (at least once a second), the
/// turn's outputs handed to the committer in order.
// Each argument is one channel or handle the loop owns; a struct around
// them would only rename the list.
#[allow(clippy::too_many_arguments)]
async fn drive(
    mut driver: Driver,
    mut inputs: mpsc::Receiver<Input>,
    commit: mpsc::UnboundedSender<Turn>,
    pending: Pending,
    floor: watch::Sender<u64>,
    beat: &AtomicU64,
    consumed: &AtomicU64,
    tenure: Tenure,
) {
    // Every deadline (the core's timers, lease expiries, silent workers,
    // the re-attach grace) is in `next_wakeup`; the loop also turns once a
    // second so `/readyz` sees it beat.
    let housekeeping_every = Millis(1_000);
    let mut last_housekeeping = wall_now();
    loop {
        let now = wall_now();
        beat.store(now.0, Ordering::Relaxed);
        let due = driver
            .next_wakeup()
            .map_or(last_housekeeping.plus(housekeeping_every), |w| {
                w.min(last_housekeeping.plus(housekeeping_every))
            });
        let wait = Duration::from_millis(due.0.saturating_sub(now.0));
        tokio::select! {
            input = inputs.recv() => {
                let Some(input) = input else { return };
                // The right to act is judged before every input: a pause
                // (SIGSTOP, a stalled VM) can fall between any two.
                if !tenure.check(&mut driver) {
                    return;
                }
                handle_guarded(&mut driver, wall_now(), input);
                for _ in 0..1024 {
                    match inputs.try_recv() {
                        Ok(input) => {
                            if !tenure.check(&mut driver) {
                                return;
                            }
                            handle_guarded(&mut driver, wall_now(), input)
                        }
                        Err(_) => break,
                    }
                }
            }
            _ = tokio::time::sleep(wait) => {}
        }
        // Before the timers too: a leader resumed after a pause past the
        // election timeout finds every worker silent and every lease
        // expired, and must not act on that (a successor leads).
        if !tenure.check(&mut driver) {
            return;
        }
        let now = wall_now();
        if now >= last_housekeeping.plus(housekeeping_every)
            || driver.next_wakeup().is_some_and(|w| w <= now)
        {
            let turn =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| driver.housekeeping(now)));
            if let Err(panic) = turn {
                let why = crate::task::panic_message(&*panic);
                tracing::error!(panic = %why, "housekeeping panicked; going on");
            }
            last_housekeeping = now;
        }
        if !tenure.check(&mut driver) {
            return;
        }
        let mut turn = Turn::default();
        for output in driver.take_outputs() {
            match output {
                Output::Persist {
                    seq,
                    record,
                    dead_letter,
                } => {
                    if record.state.is_terminal() {
                        // Marked before the floor can pass it (below).
                        pending
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(seq);
                    }
                    turn.writes.push(Persisted {
                        seq,
                        record,
                        dead_letter,
                    });
                }
                Output::PersistStarts { slot, record } => turn.starts.push((slot, record)),
                // A discarded duplicate has no result: the purge takes it.
                Output::Discard { .. } => {}
                announce => turn.announce.push(announce),
            }
        }
        turn.number = driver.turn();
        if !(turn.writes.is_empty() && turn.starts.is_empty() && turn.announce.is_empty())
            && commit.send(turn).is_err()
        {
            // The committer stopped: fenced out, a successor leads.
            return;
        }
        let _ = floor.send_if_modified(|f| {
            let new = driver.purge_floor();
            std::mem::replace(f, new) != new
        });
        consumed.store(driver.consumed_below(), Ordering::Relaxed);
    }
}

/// Hands one input to the driver. A panic (a bug: every input is checked)
/// is caught and logged with the submission's sequence; a submission that
/// caused one is refused, so a restart does not meet it again, and the
/// loop goes on.
fn handle_guarded(driver: &mut Driver, now: Millis, input: Input) {
    let submitted = match &input {
        Input::Submitted { seq, pool, .. } | Input::Recovered { seq, pool, .. } => {
            Some((*seq, pool.clone()))
        }
        _ => None,
    };
    let turn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| driver.handle(now, input)));
    if let Err(panic) = turn {
        let why = crate::task::panic_message(&*panic);
        match submitted {
            Some((seq, pool)) => {
                tracing::error!(seq, panic = %why, "a submission panicked the driver; refusing it");
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    driver.refuse_submission(
                        now,
                        TaskId(seq),
                        pool,
                        WireError::new(
                            ErrorCode::INTERNAL,
                            format!("the submission could not be processed: {why}"),
                        ),
                    )
                }));
            }
            None => tracing::error!(panic = %why, "an input panicked the driver; going on"),
        }
    }
}

/// A task's record to store (a live task's attempts, or a finished
/// task's result); a refused submission's dead letter to write first.
struct Persisted {
    seq: u64,
    record: wire::TaskRecord,
    dead_letter: Option<WireError>,
}

/// What one driver turn produced: records to store, then what to announce.
#[derive(Default)]
struct Turn {
    /// The driver's turn number ([`driver::Driver::turn`]).
    number: u64,
    writes: Vec<Persisted>,
    /// Start records, by slot.
    starts: Vec<(u32, wire::StartRecords)>,
    announce: Vec<Output>,
}

/// The most records being written at once; the driver's turns queue up
/// behind them.
const MAX_IN_FLIGHT: usize = 4096;

/// The most atomic batches being written at once. While one is under way
/// the driver's turns queue up, and the next batch takes every queued
/// record (group commit): the busier the journal, the larger its batches.
/// One: a replicated stream admits one fenced write per subject at a time
/// (10164) anyway.
const MAX_BATCHES_IN_FLIGHT: usize = 1;

/// Where the committer stores and announces: shared by its two stages and
/// every write.
struct CommitCtx {
    client: async_nats::Client,
    /// The driver's inputs: which leases went out, and when.
    inputs: mpsc::Sender<Input>,
    results: Fenced,
    pending: Pending,
    js: jetstream::Context,
    submit_stream: stream::Stream,
    subjects: Subjects,
    /// Signs leases and revokes with the worker's session (auth on).
    guard: Arc<Guard>,
    /// Seals every record written (the servers' storage key).
    seal: seal::Seal,
    /// A turn is announced only while the leadership may act: its writes
    /// may have been stored just before a pause, and a lease or reply sent
    /// after it would come from a deposed leader.
    tenure: Tenure,
}

/// One record's write: done with `true` once stored, `false` if fenced out.
type Stored = futures_util::future::Shared<oneshot::Receiver<bool>>;

/// A new write's completion: the sender to finish it, the future to wait on.
fn stored() -> (oneshot::Sender<bool>, Stored) {
    let (done_tx, done_rx) = oneshot::channel();
    (done_tx, futures_util::FutureExt::shared(done_rx))
}

/// An atomic batch being gathered by the committer.
struct Gathered {
    records: Vec<(u64, Bytes)>,
    /// The earlier writes of its tasks, to wait for first.
    before: Vec<Stored>,
    done_tx: oneshot::Sender<bool>,
    done: Stored,
}

impl Gathered {
    fn new() -> Gathered {
        let (done_tx, done) = stored();
        Gathered {
            records: Vec::new(),
            before: Vec::new(),
            done_tx,
            done,
        }
    }

    /// The batch's write (once the earlier writes of its tasks are
    /// stored), for the committer's writer.
    fn write(self, ctx: &Arc<CommitCtx>, permit: tokio::sync::OwnedSemaphorePermit) -> WriteFuture {
        let ctx = ctx.clone();
        Box::pin(async move {
            for before in self.before {
                if !matches!(before.await, Ok(true)) {
                    return; // fenced out: done_tx drops, nothing more stored
                }
            }
            let ok = store_batch(&ctx, self.records).await;
            drop(permit);
            let _ = self.done_tx.send(ok);
        })
    }
}

/// The journal's group commit, pipelined. Stage one takes the driver's
/// turns in order, as many as are queued at once, and starts writing their
/// records at once (fenced on the leader subject; the latest record per
/// task only; a record waits for the previous write of its task, so one
/// task's records land in the order they were made): in atomic batches of
/// up to [`journal::MAX_BATCH`] records, one fence check each, at most
/// [`MAX_BATCHES_IN_FLIGHT`] at once; or, where NATS cannot, one fenced
/// write per record, up to [`MAX_IN_FLIGHT`]. Stage two waits, turn
/// after turn, until every record of a turn — and of the turns before it —
/// is stored, and only then announces what the turn produced, in order:
/// leases, revokes, events, replies. So a worker never holds a lease whose
/// attempt is not journaled, and nobody hears "succeeded" (nor gets an
/// outcome acknowledged) before the result is stored; yet the writes of
/// later turns are already under way (throughput is not one round trip
/// per turn). Fenced out (a successor leads): stops, announcing nothing
/// more.
async fn commit(mut turns: mpsc::UnboundedReceiver<Turn>, ctx: CommitCtx) {
    let ctx = Arc::new(ctx);
    let (staged_tx, mut staged_rx) =
        mpsc::unbounded_channel::<(Vec<(u64, bool, Stored)>, Vec<Output>, u64)>();
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let batch_slots = Arc::new(tokio::sync::Semaphore::new(MAX_BATCHES_IN_FLIGHT));
    // The writes under way (records, start records, atomic batches),
    // polled together here: a tokio task per write would cost a
    // scheduling, and often a thread wake-up, each.
    let (write_tx, mut write_rx) = mpsc::unbounded_channel::<WriteFuture>();
    let writer = async {
        let mut under_way = futures_util::stream::FuturesUnordered::new();
        loop {
            tokio::select! {
                Some(()) = under_way.next(), if !under_way.is_empty() => {}
                write = write_rx.recv() => match write {
                    Some(write) => under_way.push(write),
                    // The launcher is gone: so is the commit.
                    None => std::future::pending::<()>().await,
                },
            }
        }
    };
    let launcher = {
        let ctx = ctx.clone();
        let slots = slots.clone();
        async move {
            let mut last_write: rustc_hash::FxHashMap<u64, Stored> = Default::default();
            while let Some(first) = turns.recv().await {
                let atomic = ctx.results.atomic.load(Ordering::Relaxed);
                // Waiting here for a batch to finish lets the turns queue.
                let mut batch_slot = if atomic {
                    match batch_slots.clone().acquire_owned().await {
                        Ok(permit) => Some(permit),
                        Err(_) => return,
                    }
                } else {
                    None
                };
                let (mut writes, mut announce) = (first.writes, first.announce);
                let (mut starts, mut number) = (first.starts, first.number);
                while writes.len() < MAX_IN_FLIGHT {
                    match turns.try_recv() {
                        Ok(turn) => {
                            writes.extend(turn.writes);
                            starts.extend(turn.starts);
                            announce.extend(turn.announce);
                            number = number.max(turn.number);
                        }
                        Err(_) => break,
                    }
                }
                // The latest record of each task stands for the ones before it.
                let mut latest: rustc_hash::FxHashMap<u64, usize> = Default::default();
                for (i, w) in writes.iter().enumerate() {
                    latest.insert(w.seq, i);
                }
                last_write.retain(|_, w| w.peek().is_none());
                let mut stored_now = Vec::with_capacity(latest.len() + starts.len());
                // Start records: a slot is written again only once the
                // writes covering its entries are stored (the driver
                // waits for `Input::Stored`), so nothing to wait for.
                for (slot, record) in starts {
                    let Ok(permit) = slots.clone().acquire_owned().await else {
                        return;
                    };
                    let (done_tx, done) = stored();
                    stored_now.push((0, false, done));
                    let ctx = ctx.clone();
                    // Encoded here, as task records are (`Encoded`).
                    let key = wire::start_key(slot);
                    let body = ctx.seal.seal(&key, wire::encode(&record).into());
                    let write = async move {
                        let ok = put_counted(&ctx, &key, &body).await;
                        drop(permit);
                        let _ = done_tx.send(ok);
                    };
                    if write_tx.send(Box::pin(write)).is_err() {
                        return;
                    }
                }
                let mut batch = Gathered::new();
                for (i, write) in writes.into_iter().enumerate() {
                    if latest.get(&write.seq) != Some(&i) && write.dead_letter.is_none() {
                        continue;
                    }
                    let terminal = write.record.state.is_terminal();
                    if atomic && write.dead_letter.is_none() {
                        if batch.records.len() == journal::MAX_BATCH {
                            let Some(permit) = batch_slot.take() else {
                                return;
                            };
                            let full = std::mem::replace(&mut batch, Gathered::new());
                            if write_tx.send(full.write(&ctx, permit)).is_err() {
                                return;
                            }
                            batch_slot = match batch_slots.clone().acquire_owned().await {
                                Ok(permit) => Some(permit),
                                Err(_) => return,
                            };
                        }
                        if let Some(before) = last_write.insert(write.seq, batch.done.clone()) {
                            batch.before.push(before);
                        }
                        stored_now.push((write.seq, terminal, batch.done.clone()));
                        let body = ctx
                            .seal
                            .seal(&write.seq.to_string(), wire::encode(&write.record).into());
                        batch.records.push((write.seq, body));
                        continue;
                    }
                    let Ok(permit) = slots.clone().acquire_owned().await else {
                        return;
                    };
                    let (done_tx, done) = stored();
                    let before = last_write.insert(write.seq, done.clone());
                    stored_now.push((write.seq, terminal, done));
                    let ctx = ctx.clone();
                    // Encoded here: the future keeps the bytes, not the record.
                    let encoded = Encoded::of(write, &ctx.seal);
                    let write = async move {
                        if let Some(before) = before {
                            if !matches!(before.await, Ok(true)) {
                                return; // fenced out: done_tx drops, nothing more stored
                            }
                        }
                        let ok = store_record(&ctx, encoded).await;
                        drop(permit);
                        let _ = done_tx.send(ok);
                    };
                    if write_tx.send(Box::pin(write)).is_err() {
                        return;
                    }
                }
                if let Some(permit) = batch_slot {
                    if batch.records.is_empty() {
                        // Nobody waits on an empty batch's `done`.
                        drop(permit);
                    } else {
                        if write_tx.send(batch.write(&ctx, permit)).is_err() {
                            return;
                        }
                    }
                }
                if staged_tx.send((stored_now, announce, number)).is_err() {
                    return;
                }
            }
        }
    };
    let releaser = async {
        while let Some((stored, announce, number)) = staged_rx.recv().await {
            let mut terminal = Vec::new();
            for (seq, is_terminal, done) in stored {
                if !matches!(done.await, Ok(true)) {
                    return;
                }
                if is_terminal {
                    terminal.push(seq);
                }
            }
            if !ctx.tenure.valid() {
                tracing::warn!("leadership not renewed in time: announcing nothing more");
                return;
            }
            {
                let mut pending = ctx.pending.lock().unwrap_or_else(|e| e.into_inner());
                for seq in terminal {
                    pending.remove(&seq);
                }
            }
            let mut leases = Vec::new();
            // The leases of this turn for each worker that takes them
            // together: one message, sent where the first of them stood
            // (so never after a revoke that follows one of them).
            let mut together: HashMap<String, Vec<Bytes>> = HashMap::new();
            for output in &announce {
                if let Output::Lease {
                    subject,
                    body,
                    together: true,
                    ..
                } = output
                {
                    together
                        .entry(subject.clone())
                        .or_default()
                        .push(body.clone());
                }
            }
            for output in announce {
                let (subject, body) = match output {
                    Output::Publish { subject, body } => (subject, body),
                    Output::Lease {
                        subject,
                        body,
                        task,
                        attempt,
                        together: grouped,
                    } => {
                        leases.push((task, attempt));
                        match grouped.then(|| together.remove(&subject)) {
                            None => (subject, body),
                            // Sent with the first of its worker's.
                            Some(None) => continue,
                            Some(Some(group)) if group.len() == 1 => (subject, body),
                            // `P.worker.<id>.lease` → `P.worker.<id>.leases`.
                            Some(Some(group)) => {
                                (format!("{subject}s"), wire::leases_body(&group).into())
                            }
                        }
                    }
                    Output::Reply(reply) => {
                        reply();
                        continue;
                    }
                    Output::Persist { .. }
                    | Output::PersistStarts { .. }
                    | Output::Discard { .. } => continue,
                };
                let sent = match ctx.guard.sign_to_worker(&subject, &body) {
                    Some(headers) => {
                        ctx.client
                            .publish_with_headers(subject, headers, body)
                            .await
                    }
                    None => ctx.client.publish(subject, body).await,
                };
                if let Err(e) = sent {
                    tracing::warn!(error = %e, "publish failed");
                }
            }
            if !leases.is_empty() {
                // Full: the leases keep the time to live counted from the
                // decision (as before), nothing worse.
                let _ = ctx.inputs.try_send(Input::LeasesSent(leases));
            }
            // Full: a later one says as much (slots wait a little longer).
            let _ = ctx.inputs.try_send(Input::Stored(number));
        }
    };
    tokio::select! {
        () = launcher => {}
        () = releaser => {}
        () = writer => {}
    }
}

/// One record write under way in the committer.
type WriteFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Stores one record (a refused submission's dead letter first), retrying
/// while NATS is away; `false` if fenced out — a successor leads and will
/// finish the task itself (the submission stays pending: this server
/// purges nothing past it).
async fn store_record(ctx: &CommitCtx, write: Encoded) -> bool {
    let Encoded {
        seq,
        body,
        dead_letter,
    } = write;
    if let Some(dead_letter) = dead_letter {
        let (pool, reason) = *dead_letter;
        let max_payload = ctx.client.server_info().max_payload;
        // Boxed: the rare path would otherwise make every record's write
        // future as large as its own.
        Box::pin(dead_letter_copy(
            &ctx.js,
            &ctx.submit_stream,
            &ctx.subjects,
            seq,
            &pool,
            &reason,
            max_payload,
        ))
        .await;
    }
    put_counted(ctx, &seq.to_string(), &body).await
}

/// A record write as the committer keeps it while under way: the encoded
/// record, and (rarely) the pool and reason of a dead letter to copy first.
struct Encoded {
    seq: u64,
    body: Bytes,
    dead_letter: Option<Box<(PoolName, WireError)>>,
}

impl Encoded {
    fn of(write: Persisted, seal: &seal::Seal) -> Encoded {
        Encoded {
            seq: write.seq,
            body: seal.seal(&write.seq.to_string(), wire::encode(&write.record).into()),
            dead_letter: write
                .dead_letter
                .map(|reason| Box::new((write.record.pool, reason))),
        }
    }
}

/// One fenced write under `key` ([`put_key_retrying`]), counted in the
/// `cronoq_journal_pending_records` gauge while under way.
async fn put_counted(ctx: &CommitCtx, key: &str, body: &Bytes) -> bool {
    let in_flight = &ctx.results.pending_records;
    in_flight.fetch_add(1, Ordering::Relaxed);
    let stored = put_key_retrying(ctx, key, body).await;
    in_flight.fetch_sub(1, Ordering::Relaxed);
    stored
}

/// Stores a batch of records (none with a dead letter), retrying while
/// NATS is away; `false` if fenced out. Should the stream stop allowing
/// atomic batches, one record after another.
async fn store_batch(ctx: &CommitCtx, records: Vec<(u64, Bytes)>) -> bool {
    let mut delay = Duration::from_millis(100);
    let in_flight = &ctx.results.pending_records;
    let n = records.len() as u64;
    in_flight.fetch_add(n, Ordering::Relaxed);
    let stored = loop {
        match ctx.results.put_batch(&records).await {
            Ok(stored) => break stored,
            Err(journal::BatchError::Disabled) => {
                tracing::warn!(
                    "the results stream no longer allows atomic batches; writing record by record"
                );
                let mut stored = true;
                for (seq, body) in &records {
                    if !put_retrying(ctx, *seq, body).await {
                        stored = false;
                        break;
                    }
                }
                break stored;
            }
            Err(journal::BatchError::Failed(e)) => {
                tracing::warn!(records = n, error = %e, "storing a batch of task records failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(JOURNAL_RETRY_MAX);
            }
        }
    };
    in_flight.fetch_sub(n, Ordering::Relaxed);
    stored
}

/// The longest pause between two tries of a journal write: once NATS is
/// back (a restart), writes resume within it.
const JOURNAL_RETRY_MAX: Duration = Duration::from_secs(1);

/// One fenced record write, retried while NATS is away; `false` if fenced
/// out.
async fn put_retrying(ctx: &CommitCtx, seq: u64, body: &Bytes) -> bool {
    put_key_retrying(ctx, &seq.to_string(), body).await
}

/// One fenced write under `key`, retried while NATS is away; `false` if
/// fenced out.
async fn put_key_retrying(ctx: &CommitCtx, key: &str, body: &Bytes) -> bool {
    let mut delay = Duration::from_millis(100);
    loop {
        match ctx.results.put(key, body.clone()).await {
            Ok(stored) => return stored,
            Err(e) => {
                tracing::warn!(key, error = %e, "storing a journal record failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(JOURNAL_RETRY_MAX);
            }
        }
    }
}

/// Copies submission `seq` to `P.deadletter.<pool>` with its headers and
/// body as they were, plus `Cronoq-Dead-Letter-Code`, `-Reason` (at most
/// 1,000 bytes) and `-Seq`. A few tries; a dead letter that cannot be
/// written is logged, never allowed to block the pipeline.
async fn dead_letter_copy(
    js: &jetstream::Context,
    submit_stream: &stream::Stream,
    subjects: &Subjects,
    seq: u64,
    pool: &PoolName,
    reason: &WireError,
    max_payload: usize,
) {
    let original = match submit_stream.get_raw_message(seq).await {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(seq, error = %e, "dead letter: the submission is gone");
            return;
        }
    };
    let mut headers = async_nats::HeaderMap::new();
    for (name, values) in original.headers.iter() {
        // A copied Nats-Msg-Id would make the stream drop a second letter.
        if name.to_string().eq_ignore_ascii_case("Nats-Msg-Id") {
            continue;
        }
        for value in values {
            headers.append(name.clone(), value.clone());
        }
    }
    headers.insert("Cronoq-Dead-Letter-Code", reason.code.as_str());
    let mut text = reason.message.clone();
    if text.len() > 1_000 {
        let mut end = 1_000;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    // Header values are one line.
    let text: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    headers.insert("Cronoq-Dead-Letter-Reason", text.as_str());
    headers.insert("Cronoq-Dead-Letter-Seq", seq.to_string().as_str());
    // A body that fills the submission's NATS message leaves no room for
    // the reason headers: NATS would close the connection over it. Such a
    // letter keeps the headers and says how long the body was.
    let mut body = original.payload.clone();
    let header_bytes: usize = headers
        .iter()
        .map(|(n, vs)| {
            let name: &str = n.as_ref();
            vs.iter()
                .map(|v| name.len() + v.as_str().len() + 4)
                .sum::<usize>()
        })
        .sum();
    let limit = max_payload.saturating_sub(1024);
    if body.len() + header_bytes > limit {
        headers.insert(
            "Cronoq-Dead-Letter-Body-Dropped",
            body.len().to_string().as_str(),
        );
        body = Bytes::new();
    }
    for attempt in 0..5u32 {
        let sent = js
            .publish_with_headers(subjects.dead_letter(pool), headers.clone(), body.clone())
            .await;
        let acked = match sent {
            Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match acked {
            Ok(()) => {
                tracing::info!(seq, pool = %pool, code = %reason.code, "submission dead-lettered");
                return;
            }
            Err(e) => {
                tracing::warn!(seq, error = %e, attempt, "writing a dead letter failed");
                tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
            }
        }
    }
}

/// Once a second, purges the submissions of finished tasks whose results
/// are stored: everything below the driver's floor and below every result
/// still being written. One request, however many tasks finished —
/// deleting messages one by one costs nats-server milliseconds each.
async fn purge(stream: stream::Stream, floor: watch::Receiver<u64>, pending: Pending) {
    let mut purged_below = 1u64;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let floor = *floor.borrow();
        let oldest_pending = pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .first()
            .copied();
        let bound = oldest_pending.map_or(floor, |p| p.min(floor));
        if bound <= purged_below {
            continue;
        }
        match stream.purge().sequence(bound).await {
            Ok(_) => purged_below = bound,
            Err(e) => {
                tracing::debug!(below = bound, error = %e, "purging finished submissions failed")
            }
        }
    }
}

/// The error a client gets when nothing answers.
pub fn no_server(subject: &str) -> ApiError {
    unavailable(format!("no cronoq server is answering on {subject}"))
}

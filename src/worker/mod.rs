//! The remote worker (SPEC §4): it connects to NATS, registers with the
//! leader, heartbeats, takes leases on `P.worker.<id>.lease`, runs each
//! attempt through a user handler, renews the lease while it runs and
//! reports the outcome; a revoke on `P.worker.<id>.revoke` stops an
//! attempt. On SIGTERM/SIGINT (or a programmatic shutdown) it drains:
//! the leader stops leasing to it, running attempts get a grace period,
//! what is left is aborted and the worker deregisters.
//!
//! What lives here: [`WorkerOptions`] (builder), [`Worker`] (the handle
//! that runs), [`Error`], the command runner used by `cronoq worker -- CMD`
//! ([`run_command`]), worker ids and the nkey signing input. What does not:
//! MessagePack (only `wire` knows it) and any scheduling decision (the
//! leader's core makes them all; a worker runs what it is leased).
//!
//! Protocol choices made here, for the leader side:
//! - a lease is obeyed only under the epoch of the current registration;
//!   a heartbeat reply with `registered: true` and a *higher* epoch moves
//!   the current epoch forward;
//! - a revoke whose epoch is lower than the epoch of the lease it names is
//!   ignored (it comes from a deposed leader);
//! - renewals and outcome reports carry the epoch of the lease;
//! - an attempt stays in the heartbeat's `running` list (and holds a slot
//!   in `free_slots`) until its outcome is acknowledged or refused as
//!   stale;
//! - an attempt aborted because the lease is gone, or because the grace
//!   period ran out, is not reported; after a revoke it is reported
//!   `cancelled` (whatever the revoke's reason);
//! - leases that arrive while draining are ignored;
//! - registration is retried on timeout, no responders and every error
//!   code except `INVALID_ARGUMENT`, `UNAUTHENTICATED` and
//!   `PERMISSION_DENIED`, which end the worker.

pub(crate) mod command;
mod identity;
pub(crate) mod rules;
mod session;
#[cfg(test)]
mod tests;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::auth::Credential;
use crate::core::{ErrorCode, Labels, PoolName, Rejection};
use crate::task::{TaskContext, TaskError};
use crate::wire::{self, Subjects, WireError};

pub use command::{run_command, STDERR_TAIL_BYTES};
pub use identity::generate_worker_id;

/// A worker error, with a stable [`ErrorCode`] (see [`Error::code`]).
///
/// `WireError::from(error)` keeps the code, so the CLI prints
/// `error: … [CODE]`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The options are invalid (labels, pool, id, slots, prefix, nkey
    /// seed): fix them and start again.
    #[error(transparent)]
    InvalidOptions(#[from] Rejection),
    /// The leader refused the registration for good (bad argument, bad or
    /// missing credentials, labels the credential may not claim).
    #[error("leader refused registration: {}", .0.message)]
    Refused(#[source] WireError),
    /// NATS could not be set up (a malformed URL, a bad TLS setup).
    #[error("connecting to {url}: {source}")]
    Connect {
        /// The NATS URL.
        url: String,
        /// What async-nats said.
        #[source]
        source: async_nats::ConnectError,
    },
    /// Subscribing to the worker's own subjects failed.
    #[error("subscribing to {subject}: {source}")]
    Subscribe {
        /// The subject.
        subject: String,
        /// What async-nats said.
        #[source]
        source: async_nats::SubscribeError,
    },
    /// The NATS client closed the worker's subscription.
    #[error("subscription to {0} ended")]
    SubscriptionClosed(String),
    /// The leader answered with something this build cannot read.
    #[error("unreadable reply from the leader: {0}")]
    Protocol(String),
    /// SIGTERM/SIGINT handlers could not be installed.
    #[error("installing signal handlers: {0}")]
    Signal(#[source] std::io::Error),
}

impl Error {
    /// The stable code.
    ///
    /// ```
    /// use cronoq::core::{ErrorCode, Rejection};
    /// use cronoq::worker::Error;
    /// let e = Error::from(Rejection::InvalidArgument("bad label".into()));
    /// assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT);
    /// ```
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::InvalidOptions(r) => r.code(),
            Error::Refused(e) => e.code.clone(),
            Error::Connect { .. } | Error::Subscribe { .. } | Error::SubscriptionClosed(_) => {
                ErrorCode::UNAVAILABLE
            }
            Error::Protocol(_) | Error::Signal(_) => ErrorCode::INTERNAL,
        }
    }
}

impl From<Error> for WireError {
    /// The code and message, as the CLI prints them.
    fn from(error: Error) -> WireError {
        let message = match &error {
            Error::Refused(e) => format!("leader refused registration: {}", e.message),
            other => other.to_string(),
        };
        WireError {
            code: error.code(),
            message,
        }
    }
}

/// How a worker connects and what it offers: pool, labels, slots,
/// credentials. Building never fails; [`Worker::run`] validates before it
/// connects (bad labels are `INVALID_ARGUMENT`).
///
/// ```
/// use std::time::Duration;
/// use cronoq::worker::WorkerOptions;
/// let options = WorkerOptions::new("nats://127.0.0.1:4222")
///     .pool("inference")
///     .label("gpu", "a100")
///     .slots(2)
///     .id("gpu-box-1")
///     .grace(Duration::from_secs(30));
/// assert_eq!(options.labels().to_string(), "gpu=a100");
/// assert_eq!(options.slots_count(), 2);
/// ```
#[derive(Clone)]
pub struct WorkerOptions {
    url: String,
    pool: String,
    labels: Labels,
    label_errors: Vec<String>,
    slots: u32,
    id: Option<String>,
    prefix: String,
    token: Option<String>,
    nkey_seed: Option<String>,
    credential: Option<Credential>,
    grace: Duration,
    request_timeout: Duration,
    login: wire::NatsLogin,
}

impl fmt::Debug for WorkerOptions {
    // Secrets stay out of logs and panics.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerOptions")
            .field("url", &self.url)
            .field("pool", &self.pool)
            .field("labels", &self.labels)
            .field("slots", &self.slots)
            .field("id", &self.id)
            .field("prefix", &self.prefix)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("nkey_seed", &self.nkey_seed.as_ref().map(|_| "<redacted>"))
            .field("credential", &self.credential)
            .field("grace", &self.grace)
            .field("request_timeout", &self.request_timeout)
            .field("login", &self.login)
            .finish()
    }
}

impl WorkerOptions {
    /// A worker of pool `default`, no labels, one slot, subject prefix
    /// `cronoq`, a generated id, a 30 s grace period.
    pub fn new(nats_url: impl Into<String>) -> WorkerOptions {
        WorkerOptions {
            url: nats_url.into(),
            pool: PoolName::DEFAULT.to_string(),
            labels: Labels::new(),
            label_errors: Vec::new(),
            slots: 1,
            id: None,
            prefix: "cronoq".to_string(),
            token: None,
            nkey_seed: None,
            credential: None,
            grace: Duration::from_secs(30),
            request_timeout: Duration::from_secs(5),
            login: wire::NatsLogin::new(),
        }
    }

    /// The pool to serve.
    pub fn pool(mut self, pool: impl Into<String>) -> WorkerOptions {
        self.pool = pool.into();
        self
    }

    /// A label of this worker; the worker joins the group of exactly its
    /// labels.
    pub fn label(mut self, name: impl Into<String>, value: impl Into<String>) -> WorkerOptions {
        self.labels.insert(name, value);
        self
    }

    /// A label given as `name=value` text (as on the command line);
    /// malformed text is refused when the worker starts.
    ///
    /// ```
    /// use cronoq::worker::WorkerOptions;
    /// let o = WorkerOptions::new("nats://localhost").label_text("zone=eu");
    /// assert_eq!(o.labels().get("zone"), Some("eu"));
    /// ```
    pub fn label_text(mut self, item: &str) -> WorkerOptions {
        if let Err(e) = self.labels.insert_parsed(item) {
            self.label_errors.push(e.to_string());
        }
        self
    }

    /// Attempts run at once (default 1).
    pub fn slots(mut self, slots: u32) -> WorkerOptions {
        self.slots = slots;
        self
    }

    /// The worker id: 1–64 characters of `A-Z a-z 0-9 _ -` (default:
    /// `<hostname>-<pid>-<4 hex>`).
    pub fn id(mut self, id: impl Into<String>) -> WorkerOptions {
        self.id = Some(id.into());
        self
    }

    /// The subject prefix of the installation (default `cronoq`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> WorkerOptions {
        self.prefix = prefix.into();
        self
    }

    /// A bearer token presented at registration.
    pub fn token(mut self, token: impl Into<String>) -> WorkerOptions {
        self.token = Some(token.into());
        self
    }

    /// A credential read already (a token or an nkey seed, e.g. by
    /// [`Credential::from_seed_file`]); instead of [`WorkerOptions::token`]
    /// or [`WorkerOptions::nkey_seed`].
    pub fn credential(mut self, credential: Credential) -> WorkerOptions {
        self.credential = Some(credential);
        self
    }

    /// An nkey seed (`SU…`, as `cronoq keygen` writes it): the worker signs
    /// each registration with it (see [`crate::auth`]).
    pub fn nkey_seed(mut self, seed: impl Into<String>) -> WorkerOptions {
        self.nkey_seed = Some(seed.into().trim().to_string());
        self
    }

    /// NATS credentials: a `.creds` file or a file holding an nkey user
    /// seed (`SU…`; the same file as [`WorkerOptions::nkey_seed`]'s seed
    /// works). Read before connecting: a bad file is `INVALID_ARGUMENT`.
    pub fn nats_creds(mut self, path: impl Into<std::path::PathBuf>) -> WorkerOptions {
        self.login = self.login.creds(path);
        self
    }

    /// The inbox prefix of the NATS connection (replaces `_INBOX`), e.g.
    /// `_INBOX.worker.<id>` with `deploy/nats/auth.conf`.
    pub fn nats_inbox_prefix(mut self, prefix: impl Into<String>) -> WorkerOptions {
        self.login = self.login.inbox_prefix(prefix);
        self
    }

    /// On shutdown, how long running attempts may take to finish before
    /// they are aborted (default 30 s).
    pub fn grace(mut self, grace: Duration) -> WorkerOptions {
        self.grace = grace;
        self
    }

    /// How long to wait for the leader's answer to one request (default
    /// 5 s); renewals wait at most a third of the lease's ttl.
    pub fn request_timeout(mut self, timeout: Duration) -> WorkerOptions {
        self.request_timeout = timeout;
        self
    }

    /// The labels given so far.
    pub fn labels(&self) -> &Labels {
        &self.labels
    }

    /// The slots given.
    pub fn slots_count(&self) -> u32 {
        self.slots
    }

    /// Checks everything that can be checked without a server.
    fn validate(&self, worker_id: &str) -> Result<Validated, Error> {
        if let Some(e) = self.label_errors.first() {
            return Err(Rejection::InvalidArgument(e.clone()).into());
        }
        self.labels.validate()?;
        let pool = PoolName::new(&self.pool)?;
        if self.slots == 0 {
            return Err(Rejection::InvalidArgument("slots must be at least 1".into()).into());
        }
        wire::validate_worker_id(worker_id)?;
        let subjects = Subjects::new(&self.prefix)?;
        let given = [
            self.token.is_some(),
            self.nkey_seed.is_some(),
            self.credential.is_some(),
        ];
        if given.iter().filter(|g| **g).count() > 1 {
            return Err(Rejection::InvalidArgument(
                "give one credential: a token or an nkey seed, not both".into(),
            )
            .into());
        }
        let credential = match (&self.token, &self.nkey_seed) {
            (Some(token), _) if token.is_empty() => {
                return Err(Rejection::InvalidArgument("token is empty".into()).into())
            }
            (Some(token), _) => Some(Credential::token(token.clone())),
            (None, Some(seed)) => Some(Credential::nkey_seed(seed).map_err(|e| {
                Rejection::InvalidArgument(format!("nkey seed is not valid: {}", e.message))
            })?),
            (None, None) => self.credential.clone(),
        };
        Ok(Validated {
            pool,
            subjects,
            credential,
            login: self.login.load()?,
        })
    }
}

/// What [`WorkerOptions::validate`] derives.
struct Validated {
    pool: PoolName,
    subjects: Subjects,
    credential: Option<Credential>,
    login: wire::LoadedLogin,
}

type HandlerFuture = Pin<Box<dyn Future<Output = Result<Bytes, TaskError>> + Send>>;
type Handler = Arc<dyn Fn(TaskContext, Bytes) -> HandlerFuture + Send + Sync>;

/// A remote worker: options plus the async handler that runs each attempt.
///
/// The handler gets the attempt's [`TaskContext`] and payload and returns
/// the output, or a [`TaskError`] (retryable or permanent). A panic counts
/// as a retryable failure; an attempt that is revoked, loses its lease or
/// outlives the grace period is dropped at its next `.await`.
///
/// ```no_run
/// # async fn demo() -> Result<(), cronoq::worker::Error> {
/// use bytes::Bytes;
/// use cronoq::TaskContext;
/// use cronoq::worker::{Worker, WorkerOptions};
///
/// let options = WorkerOptions::new("nats://127.0.0.1:4222")
///     .pool("inference")
///     .label("gpu", "a100")
///     .slots(2);
/// let worker = Worker::new(options, |ctx: TaskContext, payload: Bytes| async move {
///     tracing::info!(task_id = %ctx.task_id, group = %ctx.group, "running");
///     Ok(payload)
/// });
/// worker.run().await?; // until SIGTERM or SIGINT
/// # Ok(()) }
/// ```
pub struct Worker {
    options: WorkerOptions,
    id: String,
    handler: Handler,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("id", &self.id)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// A worker that runs `handler` for each leased attempt. The id is
    /// fixed here (given or generated); nothing connects yet.
    ///
    /// ```
    /// use cronoq::worker::{Worker, WorkerOptions};
    /// let worker = Worker::new(
    ///     WorkerOptions::new("nats://127.0.0.1:4222").id("w-1"),
    ///     |_ctx, payload| async move { Ok(payload) },
    /// );
    /// assert_eq!(worker.id(), "w-1");
    /// ```
    pub fn new<F, Fut>(options: WorkerOptions, handler: F) -> Worker
    where
        F: Fn(TaskContext, Bytes) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Bytes, TaskError>> + Send + 'static,
    {
        let id = options.id.clone().unwrap_or_else(generate_worker_id);
        let handler: Handler = Arc::new(move |ctx, payload| Box::pin(handler(ctx, payload)));
        Worker {
            options,
            id,
            handler,
        }
    }

    /// The worker id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Runs until SIGTERM or SIGINT, then drains (see [`Worker::run_until`]).
    /// A second signal skips the rest of the grace period.
    pub async fn run(self) -> Result<(), Error> {
        let (tx, rx) = tokio::sync::watch::channel(session::StopLevel::Run);
        let signals = session::Signals::install().map_err(Error::Signal)?;
        let listener = tokio::spawn(async move {
            let mut signals = signals;
            signals.recv().await;
            tracing::info!("signal received, draining");
            let _ = tx.send(session::StopLevel::Drain);
            signals.recv().await;
            tracing::info!("second signal received, stopping now");
            let _ = tx.send(session::StopLevel::Now);
        });
        let result = self.run_with(rx).await;
        listener.abort();
        result
    }

    /// Runs until `shutdown` completes, then drains: tells the leader to
    /// stop leasing (`Deregister { drain: true }`), waits up to the grace
    /// period for running attempts, aborts the rest and deregisters
    /// (`drain: false`; the leader counts leftovers as lost and retries
    /// them elsewhere). Returns `Ok` after a shutdown, or the error that
    /// stopped the worker (a refused registration, bad options).
    pub async fn run_until(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), Error> {
        let (tx, rx) = tokio::sync::watch::channel(session::StopLevel::Run);
        let trigger = async move {
            shutdown.await;
            let _ = tx.send(session::StopLevel::Drain);
            // Keep the sender alive so the session does not read a closed
            // channel as a stop of its own.
            std::future::pending::<()>().await;
        };
        tokio::select! {
            result = self.run_with(rx) => result,
            () = trigger => unreachable!("the trigger never completes"),
        }
    }

    async fn run_with(
        self,
        stop: tokio::sync::watch::Receiver<session::StopLevel>,
    ) -> Result<(), Error> {
        let validated = self.options.validate(&self.id)?;
        session::run(self.options, self.id, self.handler, validated, stop).await
    }
}

//! The remote client: submit, look up, cancel, snapshot and wait, over NATS
//! ([`Client`]) or over the HTTP API ([`HttpClient`]). Both implement
//! [`Api`], so the CLI and the HTTP router can use either.
//!
//! Over NATS, a submission is a JetStream publish to `P.submit.<pool>`,
//! captured by the stream `P_SUBMIT` that a `cronoq server` creates; the
//! task's id is the stream sequence of the accepted message, so an accepted
//! task is durable before the client hears its id. `Nats-Msg-Id` carries
//! the idempotency key: a resubmission within the stream's duplicate window
//! is answered with the first message's sequence, the same id. Lookups,
//! cancels, snapshots and schedules (`schedules.rs`) are requests on
//! `P.api.*` that the leader answers.
//!
//! Inputs are validated before anything is sent: a refused task publishes
//! nothing. Every error has a stable code ([`Error::code`]); "nobody is
//! there" (no stream, no responders, a timeout, no connection) is
//! `UNAVAILABLE`.
//!
//! Two different secrets can be given, and they are kept apart:
//!
//! - a **cronoq credential** ([`ClientOptions::credential`], or
//!   [`ClientOptions::token`] / [`ClientOptions::token_env`] /
//!   [`ClientOptions::nkey_seed_file`]): the token or nkey of an
//!   `[[auth.tokens]]` / `[[auth.nkeys]]` entry of the server's config.
//!   Over NATS every request and submission carries a `Cronoq-Auth` proof
//!   made with it ([`crate::auth`]; the secret itself never travels); over
//!   HTTP a token is sent as `Authorization: Bearer <token>` (an nkey
//!   cannot be: it is refused `INVALID_ARGUMENT`).
//! - the **NATS connection token** ([`ClientOptions::nats_token`]): what
//!   the NATS server itself asks of a connection (`authorization { token }`
//!   in its config). cronoq does not see it; HTTP does not use it.
//!
//! Without a credential nothing is signed, which is what a server with
//! `[auth] required = false` (and `cronoq dev`) expects; a server that
//! requires credentials answers `UNAUTHENTICATED`. With one, a submission
//! is **confirmed**: the leader checks the proof only when it takes the
//! submission from the stream (the stream cannot), so after the stream's
//! acknowledgement [`Client::submit`] looks the task up for a few seconds
//! and returns the leader's refusal if there is one, with its code
//! (`UNAUTHENTICATED`, `PERMISSION_DENIED`, or a limit only the leader
//! knows: `RESOURCE_EXHAUSTED` …). Secrets are never logged: the
//! `Debug` of options, clients and credentials shows none.
//!
//! NATS credentials ([`ClientOptions::nats_creds`]: a `.creds` file or an
//! nkey user seed) and a private inbox prefix ([`ClientOptions::inbox_prefix`])
//! log in to a nats-server that restricts its users (`deploy/nats/auth.conf`).

use std::time::{Duration, Instant, SystemTime};

use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::api::{Api, ApiFuture, Health};
use crate::auth::{self, Credential};
use crate::core::{ErrorCode, Rejection, Snapshot, TaskId};
use crate::task::{Task, TaskStatus};
use crate::wire::{self, Subjects, WireError};

mod confirm;
mod http_client;
mod options;
mod schedules;

pub use confirm::CONFIRM_FOR;
use confirm::{just_accepted, refusal_of, status_of_event, Pace};
pub(crate) use confirm::{leaders_verdict, wait_by_polling};
pub use http_client::HttpClient;
pub use options::ClientOptions;

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The payload limit a client checks before sending (the embedded default).
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1 << 20;

/// How long a task may be unknown to the server while [`Client::wait`]
/// waits for it: the leader may not have taken a fresh submission from the
/// stream yet.
const NOT_FOUND_GRACE: Duration = Duration::from_secs(10);

/// A client error, with a stable [`ErrorCode`] ([`Error::code`]).
///
/// Converts into a [`WireError`] (code and the whole message), which is
/// what [`Api`] returns and what `cli::error_code` finds.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed (`INVALID_ARGUMENT`); nothing was sent.
    #[error(transparent)]
    Invalid(#[from] Rejection),
    /// The server refused or failed the request, with its code.
    #[error(transparent)]
    Refused(#[from] WireError),
    /// Could not connect to NATS (`UNAVAILABLE`; `UNAUTHENTICATED` when
    /// NATS refused the login).
    #[error("connecting to {url}")]
    Connect {
        /// The URL tried.
        url: String,
        /// Why.
        #[source]
        source: async_nats::ConnectError,
    },
    /// Nobody answered: no server, no submit stream, a timeout, a lost
    /// connection (`UNAVAILABLE`). Try again later.
    #[error("{message}")]
    Unavailable {
        /// What was not there.
        message: String,
        /// The transport's error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// An answer this client cannot read (`INTERNAL`): a version mismatch
    /// or something else on the subject.
    #[error("{0}")]
    Protocol(String),
}

impl Error {
    /// The stable code.
    ///
    /// ```
    /// use cronoq::client::Error;
    /// use cronoq::core::{ErrorCode, Rejection};
    /// let e = Error::from(Rejection::InvalidArgument("bad".into()));
    /// assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT);
    /// ```
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Invalid(r) => r.code(),
            Error::Refused(e) => e.code.clone(),
            Error::Connect { source, .. }
                if source.kind() == async_nats::ConnectErrorKind::AuthorizationViolation =>
            {
                ErrorCode::UNAUTHENTICATED
            }
            Error::Connect { .. } | Error::Unavailable { .. } => ErrorCode::UNAVAILABLE,
            Error::Protocol(_) => ErrorCode::INTERNAL,
        }
    }

    fn unavailable(message: impl Into<String>, source: impl Into<BoxError>) -> Error {
        Error::Unavailable {
            message: message.into(),
            source: Some(source.into()),
        }
    }
}

impl From<Error> for WireError {
    /// The code, and the message with its sources (`a: b: c`).
    fn from(e: Error) -> WireError {
        match e {
            Error::Refused(w) => w,
            other => {
                let mut message = other.to_string();
                let mut source = std::error::Error::source(&other);
                while let Some(s) = source {
                    // Some errors repeat their source in their own text.
                    let text = s.to_string();
                    if !message.ends_with(&text) {
                        message.push_str(": ");
                        message.push_str(&text);
                    }
                    source = s.source();
                }
                WireError::new(other.code(), message)
            }
        }
    }
}

/// A remote client over NATS: cheap to clone, safe to share.
///
/// ```no_run
/// # async fn f() -> Result<(), cronoq::client::Error> {
/// use cronoq::{client::Client, Task};
/// let client = Client::connect("nats://127.0.0.1:4222").await?;
/// let id = client.submit(Task::new("hello").pool("inference").label("gpu", "a100")).await?;
/// let status = client.wait(id).await?;
/// println!("{:?}: {:?}", status.state, status.output);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Client {
    nats: async_nats::Client,
    subjects: Subjects,
    /// `subjects.submit_stream()`, built once: every submission's ack is
    /// checked against it.
    submit_stream: std::sync::Arc<str>,
    url: String,
    /// Signs every request and submission; `None`: anonymous.
    credential: Option<Credential>,
    request_timeout: Duration,
    max_payload_bytes: usize,
    wait_poll_interval: Duration,
    inbox_prefix: String,
    refusals: Refusals,
    server_max: std::sync::Arc<crate::nats::MaxPayload>,
}

/// What nats-server refused on a client's connection (permission
/// violations), the newest [`Refusals::CAP`]. A refused publish or reply
/// subscription shows only as a request that times out; this tells why.
#[derive(Clone, Debug, Default)]
struct Refusals(std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>);

impl Refusals {
    const CAP: usize = 16;

    fn record(&self, error: String) {
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        list.push_back(error.trim_start_matches("nats: ").to_string());
        if list.len() > Self::CAP {
            list.pop_front();
        }
    }

    /// The refusal of a publish to `subject` or of a subscription under
    /// `inbox` (the replies' prefix), taken from the list.
    fn take(&self, subject: &str, inbox: &str) -> Option<String> {
        let publish = format!("publish to \"{subject}\"").to_lowercase();
        let replies = format!("subscription to \"{inbox}.").to_lowercase();
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let at = list.iter().position(|e| {
            let e = e.to_lowercase();
            e.contains(&publish) || e.contains(&replies)
        })?;
        list.remove(at)
    }
}

/// A credential that cannot be used: `INVALID_ARGUMENT`, nothing sent.
fn invalid(e: WireError) -> Error {
    Error::Invalid(Rejection::InvalidArgument(e.message))
}

impl Client {
    /// Connects with the default options.
    pub async fn connect(url: &str) -> Result<Client, Error> {
        ClientOptions::new().connect(url).await
    }

    /// `PERMISSION_DENIED` when nats-server refused publishing to
    /// `subject` or this client's reply subscription (its NATS user may not
    /// do this, or the inbox prefix is not the user's).
    fn refused(&self, subject: &str) -> Option<Error> {
        let violation = self.refusals.take(subject, &self.inbox_prefix)?;
        let why = if violation.to_lowercase().contains("subscription") {
            format!(
                "replies to this client arrive under {}, which its NATS user may not subscribe \
                 to: set the inbox prefix the user is given (--nats-inbox-prefix)",
                self.inbox_prefix
            )
        } else {
            "its NATS user may not publish there".to_string()
        };
        Some(Error::Refused(WireError::new(
            ErrorCode::PERMISSION_DENIED,
            format!("{subject}: nats-server refused it ({violation}): {why}"),
        )))
    }

    /// The subjects this client uses.
    pub fn subjects(&self) -> &Subjects {
        &self.subjects
    }

    /// The underlying NATS connection.
    pub fn nats(&self) -> &async_nats::Client {
        &self.nats
    }

    /// The same connection acting as `credential` (`None`: anonymous): a
    /// cheap clone, so the HTTP API can call the leader as each caller.
    pub fn with_credential(&self, credential: impl Into<Option<Credential>>) -> Client {
        Client {
            credential: credential.into(),
            ..self.clone()
        }
    }

    /// The credential it acts as, if any.
    pub fn credential(&self) -> Option<&Credential> {
        self.credential.as_ref()
    }

    /// `headers` plus, with a credential, its `Cronoq-Auth` proof over
    /// `subject`, `body` and a fresh nonce (the leader accepts each nonce
    /// once).
    fn signed(
        &self,
        subject: &str,
        mut headers: async_nats::HeaderMap,
        body: &[u8],
    ) -> async_nats::HeaderMap {
        if let Some(credential) = &self.credential {
            let nonce = auth::client_nonce(SystemTime::now());
            credential.sign_message(&nonce, subject, &mut headers, body);
        }
        headers
    }

    /// Submits a task; its id (the stream sequence) once the stream holds it.
    ///
    /// The task is validated first, so bad input is refused before anything
    /// is published. Without the submit stream (no `cronoq server` has run)
    /// this fails `UNAVAILABLE`. With an idempotency key, a resubmission
    /// within the stream's duplicate window returns the first id (with a
    /// credential the key is the credential's own: another credential's
    /// same key is another task).
    ///
    /// With a credential, the submission is signed and then confirmed:
    /// the leader checks it when it takes it from the stream, so this looks
    /// the task up (for up to [`CONFIRM_FOR`]) and returns the leader's
    /// refusal with its code as [`Error::Refused`]: `UNAUTHENTICATED` or
    /// `PERMISSION_DENIED` for the credential, or what only the leader
    /// knows (`RESOURCE_EXHAUSTED` for a limit such as `max_pools`,
    /// `NOT_FOUND` for an undeclared pool, `INVALID_ARGUMENT`). A task the
    /// leader has not taken within that time (no leader at the moment, a
    /// backlog) is returned as accepted: the stream holds it, and a
    /// refusal then shows in its status.
    pub async fn submit(&self, task: Task) -> Result<TaskId, Error> {
        let id = self.publish_submission(task).await?;
        if self.credential.is_some() {
            self.confirm(id).await?;
        }
        Ok(id)
    }

    /// Looks a fresh submission up until the leader has taken it; its
    /// refusal for the credential, if any.
    async fn confirm(&self, id: TaskId) -> Result<(), Error> {
        let started = Instant::now();
        let mut pause = Duration::from_millis(10);
        loop {
            match self.get(id).await {
                // In the stream, not taken by the leader yet: undecided.
                Ok(status) if just_accepted(&status) => {}
                Ok(status) => {
                    return refusal_of(&status).map_or(Ok(()), |e| Err(Error::Refused(e)))
                }
                Err(e)
                    if e.code() == ErrorCode::NOT_FOUND || e.code() == ErrorCode::UNAVAILABLE => {}
                // The credential may not even read (unknown, or not this
                // pool): then the leader refused the submission for the
                // same reason.
                Err(Error::Refused(e))
                    if e.code == ErrorCode::UNAUTHENTICATED
                        || e.code == ErrorCode::PERMISSION_DENIED =>
                {
                    return Err(Error::Refused(WireError::new(
                        e.code,
                        format!("task {id} was not confirmed: {}", e.message),
                    )));
                }
                Err(e) => return Err(e),
            }
            if started.elapsed() >= CONFIRM_FOR {
                tracing::debug!(task_id = %id, "submission not taken by a leader yet; returning it as accepted");
                return Ok(());
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(250));
        }
    }

    /// Publishes a task to the submit stream; its id once the stream
    /// holds it.
    async fn publish_submission(&self, task: Task) -> Result<TaskId, Error> {
        task.to_spec(TaskId(1), self.max_payload_bytes)?;
        // Only a credential's proof needs a nonce.
        let signer = self
            .credential
            .as_ref()
            .map(|credential| (credential, auth::client_nonce(SystemTime::now())));
        let scoped_key;
        let msg_id = match (&signer, task.key()) {
            (None, key) => key,
            // Scoped to the credential, so another credential cannot take
            // the key first.
            (Some((credential, _)), Some(key)) => {
                scoped_key = credential.msg_id(key);
                Some(scoped_key.as_str())
            }
            // The nonce: a replayed copy is a duplicate for the stream.
            (Some((_, nonce)), None) => Some(nonce.as_str()),
        };
        // The one encoder (it checks the idempotency key).
        let (subject, mut headers, body) =
            wire::submission_with_msg_id(&self.subjects, &task, msg_id)?;
        let server_max = self.server_max.get(&self.nats);
        if server_max > 0 && body.len() > server_max {
            return Err(Rejection::InvalidArgument(format!(
                "submission of {} bytes is above the NATS server's max_payload of {server_max} bytes",
                body.len()
            ))
            .into());
        }
        // Last: the proof covers `Nats-Msg-Id` and the other headers.
        if let Some((credential, nonce)) = &signer {
            credential.sign_message(nonce, &subject, &mut headers, &body);
        }
        let stream = &*self.submit_stream;
        // A `Subject` holds the string as it is: the publish takes a
        // reference count, not a copy.
        let subject = async_nats::Subject::from(subject);
        // A JetStream publish is a request whose reply is the stream's
        // acknowledgement; sent as a plain request, the acknowledgement is
        // read without the untagged-enum JSON decoding and the boxed
        // future of async-nats' publish (the same protocol, the same
        // errors: no responders is no stream).
        let request = async_nats::Request::new()
            .headers(headers)
            .payload(body)
            .timeout(Some(self.request_timeout));
        let reply = self
            .nats
            .send_request(subject.clone(), request)
            .await
            .map_err(|e| {
                use async_nats::jetstream::context::{PublishError, PublishErrorKind};
                use async_nats::RequestErrorKind as Kind;
                match e.kind() {
                    Kind::NoResponders => Error::unavailable(
                        format!(
                            "no stream captures {subject}: the submit stream {stream} does not \
                             exist, so no cronoq server has created it (start `cronoq server` \
                             against {})",
                            self.url
                        ),
                        PublishError::from(PublishErrorKind::StreamNotFound),
                    ),
                    Kind::TimedOut => self.refused(&subject).unwrap_or_else(|| {
                        Error::unavailable(
                            format!(
                                "no acknowledgement for {subject} within {:?} (is JetStream up \
                                 on {}?)",
                                self.request_timeout, self.url
                            ),
                            PublishError::from(PublishErrorKind::TimedOut),
                        )
                    }),
                    kind @ (Kind::MaxPayloadExceeded | Kind::InvalidSubject) => {
                        refused_by_the_client(kind, &subject)
                    }
                    Kind::Other => Error::unavailable(format!("publishing to {subject}"), e),
                }
            })?;
        let ack = stream_ack(&reply.payload)
            .map_err(|e| Error::unavailable(format!("publishing to {subject}"), e))?;
        if ack.stream != stream {
            return Err(Error::Refused(WireError::new(
                ErrorCode::FAILED_PRECONDITION,
                format!(
                    "{subject} was captured by stream {}, not by the submit stream {stream}",
                    ack.stream
                ),
            )));
        }
        Ok(TaskId(ack.seq))
    }

    async fn request<Q: Serialize, R: DeserializeOwned>(
        &self,
        verb: &str,
        body: &Q,
    ) -> Result<R, Error> {
        use async_nats::RequestErrorKind as Kind;
        let subject = self.subjects.api(verb);
        let body = wire::encode(body);
        let mut request = async_nats::Request::new();
        if self.credential.is_some() {
            request = request.headers(self.signed(&subject, async_nats::HeaderMap::new(), &body));
        }
        let request = request
            .payload(body.into())
            .timeout(Some(self.request_timeout));
        let reply = self
            .nats
            .send_request(subject.clone(), request)
            .await
            .map_err(|e| {
                let nobody = format!(
                    "no cronoq server is answering on {subject} (via {})",
                    self.url
                );
                match e.kind() {
                    Kind::NoResponders => Error::Unavailable {
                        message: nobody,
                        source: None,
                    },
                    Kind::TimedOut => self
                        .refused(&subject)
                        .unwrap_or_else(|| Error::unavailable(nobody, e)),
                    kind @ (Kind::MaxPayloadExceeded | Kind::InvalidSubject) => {
                        refused_by_the_client(kind, &subject)
                    }
                    Kind::Other => Error::unavailable(format!("requesting {subject}"), e),
                }
            })?;
        match wire::decode::<wire::Reply<R>>(&reply.payload) {
            Ok(wire::Reply::Ok(body)) => Ok(body),
            Ok(wire::Reply::Error(e)) => Err(Error::Refused(e)),
            Err(e) => Err(Error::Protocol(format!(
                "unreadable reply on {subject}: {}",
                e.message
            ))),
        }
    }

    /// A task's state, why it waits, its attempts and result. An output
    /// too large for one NATS message is fetched in pages
    /// ([`Client::output`]) and filled in.
    pub async fn get(&self, id: TaskId) -> Result<TaskStatus, Error> {
        let mut status: TaskStatus = self
            .request(
                "task",
                &wire::GetTask {
                    v: wire::PROTOCOL_VERSION,
                    task_id: id,
                },
            )
            .await?;
        if status.output_size.is_some() {
            let output = self.output(id).await?;
            let (text, exact) = crate::task::output_fields(Some(&output));
            status.output = text;
            status.output_base64 = exact;
            status.output_size = None;
        }
        Ok(status)
    }

    /// A task's output, fetched in pages of at most one NATS message each
    /// (`P.api.task_output`): what [`Client::get`] uses when a status
    /// leaves its output out (`TaskStatus::output_size`). Empty for a task
    /// without output.
    pub async fn output(&self, id: TaskId) -> Result<Vec<u8>, Error> {
        let page = (self.nats.server_info().max_payload as u64)
            .saturating_sub(4 * 1024)
            .max(1024);
        let mut out = Vec::new();
        loop {
            let p: wire::TaskOutputPage = self
                .request(
                    "task_output",
                    &wire::GetTaskOutput {
                        v: wire::PROTOCOL_VERSION,
                        task_id: id,
                        offset: out.len() as u64,
                        limit: page,
                    },
                )
                .await?;
            if out.is_empty() {
                out.reserve(p.total.min(1 << 30) as usize);
            }
            if p.data.is_empty() || out.len() as u64 + p.data.len() as u64 > p.total {
                break;
            }
            out.extend_from_slice(&p.data);
            if out.len() as u64 >= p.total {
                break;
            }
        }
        Ok(out)
    }

    /// Cancels a task.
    pub async fn cancel(&self, id: TaskId) -> Result<(), Error> {
        let _: wire::Ack = self
            .request(
                "cancel",
                &wire::Cancel {
                    v: wire::PROTOCOL_VERSION,
                    task_id: id,
                },
            )
            .await?;
        Ok(())
    }

    /// Pools, groups, demand and workers.
    pub async fn snapshot(&self) -> Result<Snapshot, Error> {
        self.request("snapshot", &wire::GetSnapshot::default())
            .await
    }

    /// The newest `limit` tasks (1 to 500), live or recently finished,
    /// highest id first, as summaries (no output).
    pub async fn recent_tasks(&self, limit: usize) -> Result<Vec<TaskStatus>, Error> {
        crate::api::check_recent_limit(limit)?;
        let list: wire::TaskList = self
            .request(
                "tasks",
                &wire::ListTasks {
                    v: wire::PROTOCOL_VERSION,
                    limit: limit as u32,
                },
            )
            .await?;
        Ok(list.tasks)
    }

    /// Waits until the task is finished; its final status.
    ///
    /// Listens to the task's events (subscribed before the first lookup, so
    /// no event falls in between) and looks the task up again every couple
    /// of seconds in case events were lost during a reconnect. A task the
    /// server does not know yet (just submitted) is waited for a few
    /// seconds. A server that does not answer (`UNAVAILABLE`: no responders
    /// while a leader takes over, or no server at all yet) is asked again
    /// with backoff, from the first lookup on, for as long as the wait
    /// lasts: the task is in the stream and a leader will take it. The wait
    /// has no deadline of its own (a task may run for hours); drop the
    /// future, or wrap it in a timeout, to stop waiting.
    pub async fn wait(&self, id: TaskId) -> Result<TaskStatus, Error> {
        let subject = self.subjects.events(id);
        let mut events = self
            .nats
            .subscribe(subject.clone())
            .await
            .map_err(|e| Error::unavailable(format!("subscribing to {subject}"), e))?;
        let started = Instant::now();
        let mut pace = Pace::new(self.wait_poll_interval);
        if let Some(done) = pace.look(self.get(id).await, started)? {
            return Ok(done);
        }
        let mut events_open = true;
        let mut next_look = tokio::time::Instant::now() + pace.pause();
        loop {
            tokio::select! {
                message = events.next(), if events_open => {
                    let Some(message) = message else {
                        events_open = false;
                        continue;
                    };
                    let Ok(event) = wire::decode::<wire::TaskEvent>(&message.payload) else {
                        continue;
                    };
                    if event.task_id != id || !event.state.is_terminal() {
                        continue;
                    }
                    match self.get(id).await {
                        Ok(status) if status.state.is_terminal() => return Ok(status),
                        Ok(_) => {}
                        // Rejected before it existed, or the server went
                        // away: the event is all there is.
                        Err(_) => return Ok(status_of_event(&event)),
                    }
                }
                () = tokio::time::sleep_until(next_look) => {
                    if let Some(done) = pace.look(self.get(id).await, started)? {
                        return Ok(done);
                    }
                    next_look = tokio::time::Instant::now() + pace.pause();
                }
            }
        }
    }
}

/// A stream's acknowledgement of a publish, or its refusal.
#[derive(serde::Deserialize)]
struct StreamAck<'a> {
    #[serde(default, borrow)]
    stream: std::borrow::Cow<'a, str>,
    #[serde(default)]
    seq: u64,
    #[serde(default)]
    error: Option<async_nats::jetstream::Error>,
}

/// Reads a stream's reply to a publish: its stream and sequence, or its
/// error (JetStream's own, or a reply that is not an acknowledgement).
fn stream_ack(payload: &[u8]) -> Result<StreamAck<'_>, BoxError> {
    let ack: StreamAck<'_> = serde_json::from_slice(payload)?;
    match ack.error {
        Some(error) => Err(error.into()),
        None if ack.stream.is_empty() || ack.seq == 0 => Err(format!(
            "not a stream acknowledgement: {}",
            String::from_utf8_lossy(payload)
        )
        .into()),
        None => Ok(ack),
    }
}

impl Api for Client {
    fn submit(&self, task: Task) -> ApiFuture<'_, TaskId> {
        Box::pin(async move { Ok(Client::submit(self, task).await?) })
    }

    fn task(&self, id: TaskId) -> ApiFuture<'_, TaskStatus> {
        Box::pin(async move { Ok(self.get(id).await?) })
    }

    fn cancel(&self, id: TaskId) -> ApiFuture<'_, ()> {
        Box::pin(async move { Ok(Client::cancel(self, id).await?) })
    }

    fn snapshot(&self) -> ApiFuture<'_, Snapshot> {
        Box::pin(async move { Ok(Client::snapshot(self).await?) })
    }

    fn recent_tasks(&self, limit: usize) -> ApiFuture<'_, Vec<TaskStatus>> {
        Box::pin(async move { Ok(Client::recent_tasks(self, limit).await?) })
    }

    fn create_schedule(
        &self,
        spec: crate::api::CreateScheduleRequest,
    ) -> ApiFuture<'_, crate::api::ScheduleInfo> {
        Box::pin(async move { Ok(Client::create_schedule(self, spec).await?) })
    }

    fn list_schedules(&self) -> ApiFuture<'_, Vec<crate::api::ScheduleEntry>> {
        Box::pin(async move { Ok(Client::list_schedules(self).await?) })
    }

    fn get_schedule(&self, name: String) -> ApiFuture<'_, crate::api::ScheduleInfo> {
        Box::pin(async move { Ok(Client::get_schedule(self, &name).await?) })
    }

    fn pause_schedule(&self, name: String) -> ApiFuture<'_, crate::api::ScheduleInfo> {
        Box::pin(async move { Ok(Client::pause_schedule(self, &name).await?) })
    }

    fn resume_schedule(&self, name: String) -> ApiFuture<'_, crate::api::ScheduleInfo> {
        Box::pin(async move { Ok(Client::resume_schedule(self, &name).await?) })
    }

    fn delete_schedule(&self, name: String) -> ApiFuture<'_, ()> {
        Box::pin(async move { Ok(Client::delete_schedule(self, &name).await?) })
    }

    fn trigger_schedule(&self, name: String) -> ApiFuture<'_, crate::api::FireRecord> {
        Box::pin(async move { Ok(Client::trigger_schedule(self, &name).await?) })
    }

    fn backfill_schedule(
        &self,
        name: String,
        range: crate::api::BackfillRange,
    ) -> ApiFuture<'_, crate::api::BackfillReport> {
        Box::pin(async move { Ok(Client::backfill_schedule(self, &name, range).await?) })
    }

    fn health(&self) -> Health {
        let state = self.nats.connection_state();
        let ready = state == async_nats::connection::State::Connected;
        Health {
            live: true,
            ready,
            detail: if ready {
                format!("connected to {}", self.url)
            } else {
                format!("not connected to {} ({state:?})", self.url)
            },
        }
    }
}

/// What async-nats refuses before sending (since 0.49 and 0.47): a
/// message over the server's `max_payload`, a subject NATS would not take.
fn refused_by_the_client(kind: async_nats::RequestErrorKind, subject: &str) -> Error {
    let message = match kind {
        async_nats::RequestErrorKind::MaxPayloadExceeded => {
            format!("the message to {subject} is above the NATS server's max_payload")
        }
        _ => format!("{subject} is not a valid NATS subject"),
    };
    Rejection::InvalidArgument(message).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_ack_is_read_and_anything_else_is_an_error() {
        let ack = stream_ack(br#"{"stream":"CQ_SUBMIT","seq":7,"duplicate":true}"#).unwrap();
        assert_eq!((&*ack.stream, ack.seq), ("CQ_SUBMIT", 7));
        let ack = stream_ack(br#"{"stream":"A\"B","domain":"hub","seq":1}"#).unwrap();
        assert_eq!((&*ack.stream, ack.seq), ("A\"B", 1));
        let refused = stream_ack(
            br#"{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}"#,
        )
        .err()
        .unwrap();
        assert!(
            refused.to_string().contains("maximum messages exceeded"),
            "{refused}"
        );
        for bad in [&b"{}"[..], b"not json", br#"{"stream":"S"}"#, b""] {
            assert!(
                stream_ack(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}

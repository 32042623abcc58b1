//! Message bodies. Each is a MessagePack map with the protocol version `v`.

use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::core::{Backoff, ErrorCode, Labels, Millis, PoolName, RevokeReason, TaskId, TaskState};
use crate::task::Task;

fn v() -> u16 {
    super::PROTOCOL_VERSION
}

/// An error reply: a stable code and a human message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema, thiserror::Error)]
#[error("{message} [{code}]")]
pub struct WireError {
    /// One of the stable codes of `proto-schemas/error-codes.md`.
    pub code: ErrorCode,
    /// What went wrong, for people; never branch on it.
    pub message: String,
}

impl WireError {
    /// An error with a code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> WireError {
        WireError {
            code,
            message: message.into(),
        }
    }
}

/// Every reply: `{"ok": body}` or `{"error": {"code", "message"}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Reply<T> {
    /// Success.
    Ok(T),
    /// Refusal or failure.
    Error(WireError),
}

/// A MessagePack submission to `P.submit.<pool>` (the pool is the subject's
/// last token). Times are ms since the Unix epoch, spans in ms.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Submit {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// Labels the running group must carry.
    #[serde(default)]
    pub labels: Labels,
    /// The payload, as MessagePack bin.
    #[schemars(with = "Vec<u8>")]
    pub payload: Bytes,
    /// Higher runs first.
    #[serde(default)]
    pub priority: i32,
    /// Urgency deadline; never cancels.
    #[serde(default)]
    pub deadline: Option<Millis>,
    /// Fixed start.
    #[serde(default)]
    pub start_at: Option<Millis>,
    /// How late a fixed start may still start.
    #[serde(default)]
    pub tolerance: Option<Millis>,
    /// Declared run time (lets the task backfill reserved slots).
    #[serde(default)]
    pub est_runtime: Option<Millis>,
    /// Attempts in all; the pool's default when absent.
    #[serde(default)]
    pub max_attempts: Option<u32>,
    /// Backoff between attempts.
    #[serde(default)]
    pub backoff: Option<Backoff>,
    /// Longest run of one attempt; past it the attempt counts as lost.
    #[serde(default)]
    pub attempt_timeout: Option<Millis>,
    /// De-duplicates resubmissions (also sent as `Nats-Msg-Id`).
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// The submitter's W3C trace context (`00-<trace id>-<parent id>-<flags>`),
    /// handed to every attempt. Absent when not given (older servers refuse
    /// the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

fn millis_of(t: std::time::SystemTime) -> Millis {
    Millis::from_duration(t.duration_since(UNIX_EPOCH).unwrap_or_default())
}

impl Submit {
    /// The wire form of a [`Task`] (its pool goes in the subject).
    pub fn from_task(task: &Task) -> Submit {
        Submit {
            v: v(),
            labels: task.labels.clone(),
            payload: task.payload.clone(),
            priority: task.priority,
            deadline: task.deadline.map(millis_of),
            start_at: task.start_at.map(millis_of),
            tolerance: task.start_at.map(|_| Millis::from_duration(task.tolerance)),
            est_runtime: task.est_runtime.map(Millis::from_duration),
            max_attempts: task.max_attempts,
            backoff: task.backoff.map(|(initial, max)| Backoff {
                initial: Millis::from_duration(initial),
                max: Millis::from_duration(max),
            }),
            attempt_timeout: task.attempt_timeout.map(Millis::from_duration),
            idempotency_key: task.idempotency_key.clone(),
            traceparent: task.traceparent.clone(),
        }
    }

    /// Back to a [`Task`] for `pool`; a tolerance without a start is
    /// refused as on every other path.
    pub fn into_task(self, pool: &PoolName) -> Result<Task, crate::core::Rejection> {
        if self.start_at.is_none() && self.tolerance.is_some() {
            return Err(super::tolerance_without_start());
        }
        // Saturating: a far time is refused by the core's horizon check,
        // never an overflow here.
        let at = |m: Millis| {
            UNIX_EPOCH
                .checked_add(Duration::from_millis(m.0))
                .unwrap_or(UNIX_EPOCH + Duration::from_secs(i32::MAX as u64 * 1000))
        };
        let mut task = Task::new(self.payload)
            .pool(pool.as_str())
            .labels(&self.labels)
            .priority(self.priority);
        if let Some(d) = self.deadline {
            task = task.deadline(at(d));
        }
        if let Some(s) = self.start_at {
            task = task.start_at(at(s), self.tolerance.unwrap_or_default().to_duration());
        }
        if let Some(e) = self.est_runtime {
            task = task.est_runtime(e.to_duration());
        }
        if let Some(n) = self.max_attempts {
            task = task.max_attempts(n);
        }
        if let Some(b) = self.backoff {
            task = task.backoff(b.initial.to_duration(), b.max.to_duration());
        }
        if let Some(t) = self.attempt_timeout {
            task = task.attempt_timeout(t.to_duration());
        }
        if let Some(k) = self.idempotency_key {
            task = task.idempotency_key(k);
        }
        if let Some(tp) = self.traceparent {
            task = task.traceparent(tp);
        }
        Ok(task)
    }
}

/// Asks the leader for a registration nonce (request on
/// `P.w.<worker_id>.challenge`; only when auth is on).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Challenge {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
}

impl Default for Challenge {
    fn default() -> Self {
        Challenge { v: v() }
    }
}

/// A registration nonce: sign the `Register` over it, within 30 s, once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ChallengeReply {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The nonce to put in the registration's `Cronoq-Auth` proof.
    pub nonce: String,
}

/// A worker session the leader opened at registration (auth on): the
/// worker proves it on every later request, and checks the leader's
/// leases and revokes with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionGrant {
    /// The session id (in `Cronoq-Auth: v1 session <id> …`).
    pub id: String,
    /// The 32-byte session key, sealed to the registration's `xkey`.
    #[schemars(with = "Vec<u8>")]
    pub sealed_key: Bytes,
    /// The leader's curve public key (`X…`) that sealed it.
    pub server_xkey: String,
}

/// A worker joins a pool (request on `P.w.<worker_id>.register`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Register {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// Unique worker id (one subject token).
    pub worker_id: String,
    /// The pool it serves.
    pub pool: PoolName,
    /// Its labels: it joins the group with exactly these.
    #[serde(default)]
    pub labels: Labels,
    /// Attempts it runs at once.
    pub slots: u32,
    /// A curve public key (`X…`) made for this registration: when auth is
    /// on, the leader seals the session key to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xkey: Option<String>,
    /// A value unique to this worker process: a registration of an id
    /// that another live instance holds is refused (`ALREADY_EXISTS`),
    /// one from the same instance is idempotent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Attempts it still runs (registering again with a new leader): the
    /// leader re-attaches those its journal says this worker runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub running: Vec<RunningAttempt>,
    /// It takes several leases in one message (`Leases` on
    /// `P.worker.<worker_id>.leases`); without, one `Lease` per message.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lease_batches: bool,
}

/// The leader accepted a registration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RegisterReply {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The leader's epoch; leases of other epochs are ignored.
    pub epoch: u64,
    /// How often to heartbeat.
    pub heartbeat_interval: Millis,
    /// Silence after which the leader removes the worker.
    pub worker_timeout: Millis,
    /// A lease not renewed within this is lost.
    pub lease_ttl: Millis,
    /// Of the attempts the registration listed, those the leader counts as
    /// running here (their renewals and reports are accepted under their
    /// old epoch); the worker stops the others at once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adopted: Vec<RunningAttempt>,
    /// The worker's session, when auth is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionGrant>,
}

/// An attempt a worker is running.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RunningAttempt {
    /// The task.
    pub task_id: TaskId,
    /// The attempt.
    pub attempt: u32,
}

/// A worker is alive (request on `P.w.<worker_id>.heartbeat`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Heartbeat {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The worker.
    pub worker_id: String,
    /// Slots not running anything.
    pub free_slots: u32,
    /// What it runs.
    #[serde(default)]
    pub running: Vec<RunningAttempt>,
}

/// The leader's answer to a heartbeat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HeartbeatReply {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The leader's epoch.
    pub epoch: u64,
    /// False: the leader does not know this worker (it was removed, or a
    /// new leader took over): register again.
    pub registered: bool,
}

/// A worker leaves (request on `P.w.<worker_id>.deregister`).
///
/// With `drain` the leader stops leasing to it but lets its running
/// attempts finish; without, the worker is removed at once and whatever
/// it still runs counts as lost (and is retried elsewhere).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Deregister {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The worker.
    pub worker_id: String,
    /// Stop new leases only; the final deregister follows.
    #[serde(default)]
    pub drain: bool,
}

/// A bare acknowledgement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Ack {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
}

impl Default for Ack {
    fn default() -> Self {
        Ack { v: v() }
    }
}

/// Run this attempt (leader → `P.worker.<id>.lease`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Lease {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The task.
    pub task_id: TaskId,
    /// The attempt, from 1.
    pub attempt: u32,
    /// The pool.
    pub pool: PoolName,
    /// The group (the worker's labels).
    pub group: Labels,
    /// The payload.
    #[schemars(with = "Vec<u8>")]
    pub payload: Bytes,
    /// Renew before this runs out.
    pub ttl: Millis,
    /// The leader's epoch.
    pub epoch: u64,
    /// The W3C trace context the task was submitted with, if any (older
    /// leaders send none; older workers ignore it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// Keep my lease (request on `P.w.<worker_id>.renew`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Renew {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The worker.
    pub worker_id: String,
    /// The task.
    pub task_id: TaskId,
    /// The attempt.
    pub attempt: u32,
    /// The epoch of the lease.
    pub epoch: u64,
}

/// A renewed lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RenewReply {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The lease now runs this much longer.
    pub ttl: Millis,
}

/// How an attempt ended, as the worker saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AttemptResult {
    /// The handler returned output.
    Succeeded {
        /// The output.
        #[schemars(with = "Vec<u8>")]
        output: Bytes,
    },
    /// The handler failed.
    Failed {
        /// The error.
        error: String,
        /// Whether another attempt may help.
        retryable: bool,
    },
    /// The worker stopped it after a revoke.
    Cancelled,
}

/// An attempt ended (request on `P.w.<worker_id>.outcome`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AttemptReport {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The worker.
    pub worker_id: String,
    /// The task.
    pub task_id: TaskId,
    /// The attempt.
    pub attempt: u32,
    /// The epoch of the lease.
    pub epoch: u64,
    /// How it ended.
    pub result: AttemptResult,
}

/// Several leases for one worker in one message (leader →
/// `P.worker.<worker_id>.leases`), sent to a worker that registered with
/// `lease_batches`: the leases one turn of the leader gave it. Each is
/// taken as if it came alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Leases {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The leases, in the order the leader decided them.
    pub leases: Vec<Lease>,
}

/// The MessagePack body of a [`Leases`] holding these encoded [`Lease`]s
/// as they are (each is a MessagePack value of its own): no decoding and
/// encoding again.
pub fn leases_body(leases: &[bytes::Bytes]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + leases.iter().map(|l| l.len()).sum::<usize>());
    // Writing to a Vec cannot fail.
    let _ = rmp::encode::write_map_len(&mut out, 2);
    let _ = rmp::encode::write_str(&mut out, "v");
    let _ = rmp::encode::write_uint(&mut out, u64::from(super::PROTOCOL_VERSION));
    let _ = rmp::encode::write_str(&mut out, "leases");
    let _ = rmp::encode::write_array_len(&mut out, u32::try_from(leases.len()).unwrap_or(u32::MAX));
    for lease in leases {
        out.extend_from_slice(lease);
    }
    out
}

/// Attempts that ended, reported in one request (on
/// `P.w.<worker_id>.outcomes`): a worker sends what ended while its
/// earlier reports were on the way, so a busy worker sends one report
/// and hears one reply for many attempts. Each report is taken as if it
/// came alone; the reply says, in the same order, which were refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AttemptReports {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The worker (each report's `worker_id` must be the same).
    pub worker_id: String,
    /// At most [`MAX_REPORTS`] reports.
    pub reports: Vec<AttemptReport>,
}

/// The most reports in one [`AttemptReports`].
pub const MAX_REPORTS: usize = 4096;

/// The answer to [`AttemptReports`], sent once every accepted outcome is
/// stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AttemptReportsReply {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// One entry per report, in order: `null` if it was taken (as the
    /// `Ack` of `outcome`), else why it was refused (as the error of
    /// `outcome`: `FAILED_PRECONDITION` for a stale attempt, …).
    pub refused: Vec<Option<WireError>>,
}

/// Stop this attempt (leader → `P.worker.<id>.revoke`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Revoke {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The task.
    pub task_id: TaskId,
    /// The attempt.
    pub attempt: u32,
    /// The leader's epoch.
    pub epoch: u64,
    /// Why.
    pub reason: RevokeReason,
}

/// Cancel a task (request on `P.api.cancel`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Cancel {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The task.
    pub task_id: TaskId,
}

/// Ask for a task's status (request on `P.api.task`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GetTask {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The task.
    pub task_id: TaskId,
}

/// Ask for the snapshot (request on `P.api.snapshot`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GetSnapshot {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
}

impl Default for GetSnapshot {
    fn default() -> Self {
        GetSnapshot { v: v() }
    }
}

/// Ask for the newest tasks, live and recently finished (request on
/// `P.api.tasks`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ListTasks {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// How many, 1 to 500.
    pub limit: u32,
}

/// The newest tasks, highest id first (`GET /v1/tasks`, and the body of
/// the reply to `P.api.tasks`).
///
/// Each task is a summary: no output (`GET /v1/tasks/{id}` has it), errors
/// cut to 200 characters. Over NATS the list is cut to fit one message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TaskList {
    /// The tasks, highest id first.
    pub tasks: Vec<crate::task::TaskStatus>,
}

/// Something happened to a task (leader → `P.events.<task_id>`).
///
/// Ids and states only: no output and no error text. Any NATS user allowed
/// to subscribe to `P.events.>` (every submitter and reader, in the
/// shipped `deploy/nats/auth.conf`) hears every task's events, of every
/// pool; what a task produced is read through the API (`P.api.task`,
/// `GET /v1/tasks/{id}`), where the caller's credential is checked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TaskEvent {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The task.
    pub task_id: TaskId,
    /// Its pool (empty from a leader older than this field).
    #[serde(default)]
    pub pool: PoolName,
    /// Its state now.
    pub state: TaskState,
    /// The attempt concerned (0 before the first).
    pub attempt: u32,
    /// The group of the attempt.
    #[serde(default)]
    pub group: Option<Labels>,
    /// The worker of the attempt.
    #[serde(default)]
    pub worker: Option<String>,
    /// When, ms since the epoch.
    pub at: Millis,
}

/// A task's record in the results bucket, under its decimal id: the
/// leader's journal. Written (fenced on the leader subject) when an attempt
/// starts, when one ends, and when the task finishes — each before anyone
/// hears of the change — so a successor knows which attempts ran, which
/// still run and on which worker, and never runs a task whose success was
/// stored. A live task's record has a non-terminal `state`; a finished
/// one's is the result, kept for `results_ttl`. The output is stored once,
/// as raw bytes (a `TaskStatus` carries it twice, as text and base64, and
/// would not fit one NATS message for a large output).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TaskRecord {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The task.
    pub id: TaskId,
    /// Its pool.
    pub pool: PoolName,
    /// `scheduled`, `queued` or `running` while live; then the outcome.
    pub state: TaskState,
    /// Every attempt so far (a running one has no `outcome` yet).
    pub attempts: Vec<crate::task::AttemptRecord>,
    /// Output of the successful attempt.
    #[serde(default)]
    #[schemars(with = "Option<Vec<u8>>")]
    pub output: Option<Bytes>,
    /// Error of the last failed attempt.
    #[serde(default)]
    pub error: Option<String>,
    /// It finished after its deadline.
    #[serde(default)]
    pub deadline_missed: bool,
    /// When the leader wrote this record of a live task (ms since the
    /// epoch): a successor rewrites it before the bucket's max age
    /// expires it, knowing how old it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_at: Option<Millis>,
}

impl TaskRecord {
    /// The record of a finished task.
    pub fn of_outcome(o: &crate::task::Outcome) -> TaskRecord {
        TaskRecord {
            v: super::PROTOCOL_VERSION,
            id: o.id,
            pool: o.pool.clone(),
            state: o.state,
            attempts: o.attempts.clone(),
            output: o.output.clone(),
            error: o.error.clone(),
            deadline_missed: o.deadline_missed,
            written_at: None,
        }
    }

    /// The record of a live task as `task` shows it (it has no output).
    pub fn of_status(s: crate::task::TaskStatus) -> TaskRecord {
        TaskRecord {
            v: super::PROTOCOL_VERSION,
            id: s.id,
            pool: s.pool,
            state: s.state,
            attempts: s.attempts,
            output: None,
            error: s.error,
            deadline_missed: s.deadline_missed,
            written_at: None,
        }
    }

    /// As `task` shows it.
    pub fn into_status(self) -> crate::task::TaskStatus {
        let (output, output_base64) = crate::task::output_fields(self.output.as_deref());
        crate::task::TaskStatus {
            id: self.id,
            pool: self.pool,
            state: self.state,
            reason: None,
            attempts: self.attempts,
            output,
            output_base64,
            error: self.error,
            deadline_missed: self.deadline_missed,
        }
    }

    /// Decodes a value of the results bucket (also a `TaskStatus`, as
    /// servers before the journal stored).
    pub fn decode(bytes: &[u8]) -> Result<TaskRecord, WireError> {
        match super::decode::<TaskRecord>(bytes) {
            Ok(record) => Ok(record),
            Err(e) => super::decode::<crate::task::TaskStatus>(bytes)
                .map(TaskRecord::of_status_keeping_output)
                .map_err(|_| e),
        }
    }

    /// Makes the record fit one NATS message of `limit` bytes (encoded):
    /// a record NATS refuses as too large would be retried for good and
    /// hold up the journal. Records far below the limit (estimated, not
    /// encoded: the common case costs nothing) are left alone. Otherwise,
    /// step by step until it fits: errors cut to [`RECORD_ERROR_CHARS`]
    /// characters; only the first and the last [`RECORD_KEEP_ATTEMPTS`]
    /// attempts kept (each keeps its number, so attempt counting goes
    /// on); errors dropped and only the last attempt kept; and last the
    /// output dropped, its error saying so. Returns whether it changed.
    pub fn fit(&mut self, limit: usize) -> bool {
        if self.estimated_size() <= limit / 2 {
            return false;
        }
        let fits = |r: &TaskRecord| super::encode(r).len() <= limit;
        if fits(self) {
            return false;
        }
        let cut = |text: &mut String| crate::task::cut_chars(text, RECORD_ERROR_CHARS);
        for a in &mut self.attempts {
            if let Some(e) = &mut a.error {
                cut(e);
            }
        }
        if let Some(e) = &mut self.error {
            cut(e);
        }
        if fits(self) {
            return true;
        }
        if self.attempts.len() > RECORD_KEEP_ATTEMPTS + 1 {
            let last = self
                .attempts
                .split_off(self.attempts.len() - RECORD_KEEP_ATTEMPTS);
            self.attempts.truncate(1);
            self.attempts.extend(last);
        }
        if fits(self) {
            return true;
        }
        let last = self.attempts.pop();
        self.attempts.clear();
        self.attempts.extend(last);
        for a in &mut self.attempts {
            a.error = None;
        }
        self.error = None;
        if fits(self) {
            return true;
        }
        if let Some(output) = self.output.take() {
            self.error = Some(format!(
                "the output ({} bytes) could not be kept: the task's record would not fit one \
                 NATS message",
                output.len()
            ));
        }
        true
    }

    /// Roughly the encoded size.
    fn estimated_size(&self) -> usize {
        let attempts: usize = self
            .attempts
            .iter()
            .map(crate::task::AttemptRecord::estimated_size)
            .sum();
        256 + self.pool.as_str().len()
            + self.output.as_ref().map_or(0, Bytes::len)
            + self.error.as_ref().map_or(0, String::len)
            + attempts
    }

    fn of_status_keeping_output(s: crate::task::TaskStatus) -> TaskRecord {
        let output = s.output_bytes().map(Bytes::from);
        let mut record = TaskRecord::of_status(s);
        record.output = output;
        record
    }
}

/// The longest error a journal record keeps per attempt, in characters,
/// once the record is too large for one NATS message ([`TaskRecord::fit`]).
pub const RECORD_ERROR_CHARS: usize = 1_000;

/// The latest attempts a journal record too large for one NATS message
/// keeps (beside the first).
pub const RECORD_KEEP_ATTEMPTS: usize = 16;

/// The attempts one leader turn started, stored together in the results
/// bucket under a reused key `s.<n>` ([`start_key`]): one journal write
/// for the starts of a turn instead of one per task. An entry counts only
/// while it is the attempt after the last one in its task's own record
/// (attempt 1 if the task has none): [`TaskRecord::with_start`]. The
/// leader writes a task's own record when that attempt ends (or when the
/// record is due to be rewritten), and reuses a key only once every entry
/// in it is covered that way and that write is stored, so a key being
/// overwritten never holds the only trace of a running attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StartRecords {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// When the leader wrote it (ms since the epoch).
    pub written_at: Millis,
    /// The attempts started.
    pub starts: Vec<StartRecord>,
}

/// One attempt in [`StartRecords`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StartRecord {
    /// The task (its submission sequence).
    pub id: TaskId,
    /// Its pool.
    pub pool: PoolName,
    /// The attempt as started (no outcome).
    pub attempt: crate::task::AttemptRecord,
}

/// The results-bucket key of start-record slot `n`.
pub fn start_key(n: u32) -> String {
    format!("s.{n}")
}

/// The slot of a results-bucket key, if it is one (`s.<n>`).
pub fn parse_start_key(key: &str) -> Option<u32> {
    let n = key.strip_prefix("s.")?;
    if n.is_empty() || (n.len() > 1 && n.starts_with('0')) {
        return None;
    }
    n.parse().ok()
}

impl TaskRecord {
    /// A task's journal record with a start from [`StartRecords`] written
    /// at `written_at` merged in: `Some` if `start` is the attempt after
    /// the last one `record` holds (attempt 1 with no record) and that one
    /// has ended; `None` if the start is stale (its end, or a later
    /// attempt, is in `record`), the record is terminal, or it is not the
    /// task's. The merged record is `running`, and carries the older of
    /// the two writes' times (it must be rewritten before either expires).
    pub fn with_start(
        record: Option<&TaskRecord>,
        start: &StartRecord,
        written_at: Millis,
    ) -> Option<TaskRecord> {
        if start.attempt.outcome.is_some() {
            return None;
        }
        match record {
            None => (start.attempt.attempt == 1).then(|| TaskRecord {
                v: super::PROTOCOL_VERSION,
                id: start.id,
                pool: start.pool.clone(),
                state: TaskState::Running,
                attempts: vec![start.attempt.clone()],
                output: None,
                error: None,
                deadline_missed: false,
                written_at: Some(written_at),
            }),
            Some(r) => {
                let last = r.attempts.last();
                let next = last.map_or(1, |a| a.attempt.saturating_add(1));
                let ended = last.map_or(true, |a| a.outcome.is_some());
                if r.id != start.id
                    || r.state.is_terminal()
                    || !ended
                    || next != start.attempt.attempt
                {
                    return None;
                }
                let mut merged = r.clone();
                merged.attempts.push(start.attempt.clone());
                merged.state = TaskState::Running;
                merged.written_at = r.written_at.map(|at| at.min(written_at));
                Some(merged)
            }
        }
    }
}

/// The start records of the results bucket, by task: what a takeover
/// merges into the tasks' own records ([`TaskRecord::with_start`]).
#[derive(Clone, Debug, Default)]
pub struct StartIndex {
    /// Each slot's latest message.
    slots: std::collections::BTreeMap<u32, StartRecords>,
    /// (slot, index in its `starts`) of each task's entries.
    by_task: std::collections::HashMap<TaskId, Vec<(u32, usize)>>,
}

impl StartIndex {
    /// Slot `slot` now holds `records` (`None`: deleted).
    pub fn set(&mut self, slot: u32, records: Option<StartRecords>) {
        if let Some(old) = self.slots.remove(&slot) {
            for s in &old.starts {
                if let Some(entries) = self.by_task.get_mut(&s.id) {
                    entries.retain(|(n, _)| *n != slot);
                    if entries.is_empty() {
                        self.by_task.remove(&s.id);
                    }
                }
            }
        }
        if let Some(records) = records {
            for (i, s) in records.starts.iter().enumerate() {
                self.by_task.entry(s.id).or_default().push((slot, i));
            }
            self.slots.insert(slot, records);
        }
    }

    /// How many slots it holds.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// It holds no slot.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Task `id`'s record (`record`: its own, if any) with the start that
    /// follows it merged in, and the slot that start came from; the record
    /// as it is (and no slot) if no start follows it.
    pub fn merge(
        &self,
        id: TaskId,
        record: Option<TaskRecord>,
    ) -> (Option<TaskRecord>, Option<u32>) {
        let Some(entries) = self.by_task.get(&id) else {
            return (record, None);
        };
        for &(slot, i) in entries {
            let sheet = &self.slots[&slot];
            if let Some(merged) =
                TaskRecord::with_start(record.as_ref(), &sheet.starts[i], sheet.written_at)
            {
                return (Some(merged), Some(slot));
            }
        }
        (record, None)
    }
}

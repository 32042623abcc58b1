//! What a user submits and what they get back, shared by the embedded
//! [`crate::Scheduler`] and (later) the remote client: the [`Task`] builder,
//! [`TaskError`] for executors, [`Outcome`] and [`TaskStatus`].
//!
//! Times are [`SystemTime`]s at this boundary and become [`Millis`] since
//! the Unix epoch inside; nothing here reads a clock.

use std::borrow::Cow;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::core::{
    Backoff, ConcurrencyPolicy, FixedStart, Labels, Millis, PoolName, Rejection, TaskId, TaskSpec,
    TaskState, WaitReason,
};

mod submit;
pub use submit::{
    check_key, parse_duration, parse_rfc3339, parse_time, tolerance_without_start, BackoffRequest,
    SubmitOptions, SubmitRequest,
};

/// A task to submit: payload plus options. Building never fails; the
/// scheduler validates on submit.
///
/// ```
/// use cronoq::Task;
/// use std::time::Duration;
/// let task = Task::new("resize 42.png")
///     .pool("inference")
///     .label("gpu", "a100")
///     .priority(5)
///     .max_attempts(3)
///     .attempt_timeout(Duration::from_secs(30));
/// assert_eq!(task.pool_name(), "inference");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    pub(crate) payload: Bytes,
    pub(crate) pool: String,
    pub(crate) labels: Labels,
    pub(crate) label_errors: Vec<String>,
    pub(crate) priority: i32,
    pub(crate) deadline: Option<SystemTime>,
    pub(crate) start_at: Option<SystemTime>,
    pub(crate) tolerance: Duration,
    pub(crate) est_runtime: Option<Duration>,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) backoff: Option<(Duration, Duration)>,
    pub(crate) attempt_timeout: Option<Duration>,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) traceparent: Option<String>,
    /// Who submitted it (the credential's name), set by the leader once it
    /// verified the submission; never taken from the submitter.
    pub(crate) owner: Option<String>,
    /// The schedule that fired it and the tick it fired for (issue 23);
    /// set by the schedule shells only.
    pub(crate) schedule: Option<(String, Millis)>,
    /// How it shares its pool (SPEC §9), boxed: most tasks carry none, and
    /// a `Task` without it stays as small as before.
    pub(crate) sharing: Option<Box<Sharing>>,
    /// When the submit stream stored it, set by the leader's consumer (a
    /// successor reads the same): where its trace's task span begins.
    pub(crate) stored_at: Option<Millis>,
}

/// A task's SPEC §9 options as given (`None`: not given, today's
/// behaviour). Checked at submit, with the rest of the task.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Sharing {
    pub(crate) fairness_key: Option<String>,
    pub(crate) fairness_weight: Option<u32>,
    pub(crate) concurrency_key: Option<String>,
    pub(crate) concurrency_limit: Option<u32>,
    pub(crate) concurrency_policy: Option<ConcurrencyPolicy>,
    pub(crate) preemptible: Option<bool>,
}

impl Task {
    /// A task for pool `default` with no requirements.
    pub fn new(payload: impl Into<Bytes>) -> Task {
        Task {
            payload: payload.into(),
            pool: PoolName::DEFAULT.to_string(),
            labels: Labels::new(),
            label_errors: Vec::new(),
            priority: 0,
            deadline: None,
            start_at: None,
            tolerance: Duration::ZERO,
            est_runtime: None,
            max_attempts: None,
            backoff: None,
            attempt_timeout: None,
            idempotency_key: None,
            traceparent: None,
            owner: None,
            schedule: None,
            sharing: None,
            stored_at: None,
        }
    }

    fn sharing_mut(&mut self) -> &mut Sharing {
        self.sharing.get_or_insert_with(Box::default)
    }

    /// Its fairness key (SPEC §9, ≤ 64 bytes): among keys with waiting
    /// tasks, a freed slot goes to the key furthest below its weighted
    /// share. With auth on the server sets it (the credential's name) or
    /// checks it against the credential's `fairness_keys`.
    ///
    /// ```
    /// use cronoq::{Task, TaskId};
    /// let task = Task::new("x").fairness_key("team-a").fairness_weight(3);
    /// assert_eq!(task.fairness_key_name(), Some("team-a"));
    /// assert!(task.to_spec(TaskId(1), 1024).is_ok());
    /// assert!(Task::new("x").fairness_weight(0).to_spec(TaskId(1), 1024).is_err());
    /// ```
    pub fn fairness_key(mut self, key: impl Into<String>) -> Task {
        self.sharing_mut().fairness_key = Some(key.into());
        self
    }

    /// Its key's weight, 1 to 1,000 (default 1), unless the pool's
    /// `[[pools.fairness]]` weights the key (and ignored with auth on).
    pub fn fairness_weight(mut self, weight: u32) -> Task {
        self.sharing_mut().fairness_weight = Some(weight);
        self
    }

    /// Its concurrency key (≤ 128 bytes): tasks of one pool with the same
    /// key share a limit ([`Task::concurrency_limit`]).
    ///
    /// ```
    /// use cronoq::{ConcurrencyPolicy, Task, TaskId};
    /// let deploy = Task::new("deploy")
    ///     .concurrency_key("deploy-prod")
    ///     .concurrency_limit(1)
    ///     .concurrency_policy(ConcurrencyPolicy::CancelRunning);
    /// assert!(deploy.to_spec(TaskId(1), 1024).is_ok());
    /// assert!(Task::new("x").concurrency_limit(0).to_spec(TaskId(1), 1024).is_err());
    /// ```
    pub fn concurrency_key(mut self, key: impl Into<String>) -> Task {
        self.sharing_mut().concurrency_key = Some(key.into());
        self
    }

    /// At most this many of its concurrency key's tasks run while it
    /// starts (≥ 1, default 1).
    pub fn concurrency_limit(mut self, limit: u32) -> Task {
        self.sharing_mut().concurrency_limit = Some(limit);
        self
    }

    /// What admission does when its key's limit is full (default
    /// [`ConcurrencyPolicy::Queue`]).
    pub fn concurrency_policy(mut self, policy: ConcurrencyPolicy) -> Task {
        self.sharing_mut().concurrency_policy = Some(policy);
        self
    }

    /// Whether a waiting task of higher priority may preempt its attempt in
    /// a pool with `preemption = "priority"` (default true).
    pub fn preemptible(mut self, preemptible: bool) -> Task {
        self.sharing_mut().preemptible = Some(preemptible);
        self
    }

    /// With auth on (SPEC §9): the fairness key the credential's rights
    /// gave, and no weight of the task's own (only `[[pools.fairness]]`
    /// weighs keys then).
    pub(crate) fn fairness_under_auth(&mut self, key: Option<String>) {
        if key.is_none() && self.sharing.is_none() {
            return;
        }
        let sharing = self.sharing_mut();
        sharing.fairness_key = key;
        sharing.fairness_weight = None;
    }

    /// The fairness key, if one is set.
    pub fn fairness_key_name(&self) -> Option<&str> {
        self.sharing.as_ref()?.fairness_key.as_deref()
    }

    /// The concurrency key, if one is set.
    pub fn concurrency_key_name(&self) -> Option<&str> {
        self.sharing.as_ref()?.concurrency_key.as_deref()
    }

    /// Marks the task as fired by schedule `name` for the tick `at`.
    pub(crate) fn scheduled(mut self, name: &str, at: Millis) -> Task {
        self.schedule = Some((name.to_string(), at));
        self
    }

    /// The schedule that fired it, if one did.
    pub fn schedule_name(&self) -> Option<&str> {
        self.schedule.as_ref().map(|(n, _)| n.as_str())
    }

    /// The tick a schedule fired it for.
    pub fn scheduled_at(&self) -> Option<Millis> {
        self.schedule.as_ref().map(|(_, t)| *t)
    }

    /// The pool to run in.
    pub fn pool(mut self, pool: impl Into<String>) -> Task {
        self.pool = pool.into();
        self
    }

    /// Requires `name=value` of the group that runs it.
    pub fn label(mut self, name: impl Into<String>, value: impl Into<String>) -> Task {
        self.labels.insert(name, value);
        self
    }

    /// Requires every label of `labels`.
    pub fn labels(mut self, labels: &Labels) -> Task {
        for (k, v) in labels.iter() {
            self.labels.insert(k, v);
        }
        self
    }

    /// Requires a label given as `name=value` text (as on the command line);
    /// malformed text is refused at submit.
    pub fn label_text(mut self, item: &str) -> Task {
        if let Err(e) = self.labels.insert_parsed(item) {
            self.label_errors.push(e.to_string());
        }
        self
    }

    /// Higher runs first (default 0).
    pub fn priority(mut self, priority: i32) -> Task {
        self.priority = priority;
        self
    }

    /// Becomes urgent within the pool's urgency window before `deadline`;
    /// never cancels.
    pub fn deadline(mut self, deadline: SystemTime) -> Task {
        self.deadline = Some(deadline);
        self
    }

    /// A fixed start: runs at `start_at`, or within `tolerance` after it.
    pub fn start_at(mut self, start_at: SystemTime, tolerance: Duration) -> Task {
        self.start_at = Some(start_at);
        self.tolerance = tolerance;
        self
    }

    /// Declared run time; lets the task use slots held for a later
    /// reservation.
    pub fn est_runtime(mut self, est: Duration) -> Task {
        self.est_runtime = Some(est);
        self
    }

    /// Attempts in all (default: the pool's, 3).
    pub fn max_attempts(mut self, n: u32) -> Task {
        self.max_attempts = Some(n);
        self
    }

    /// Backoff before retries: `initial * 2^(n-1)` capped at `max`.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Task {
        self.backoff = Some((initial, max));
        self
    }

    /// An attempt running longer is stopped and counts as lost.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Task {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// A resubmission with the same key (while the first is not finished)
    /// returns the first task instead of a new one.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Task {
        self.idempotency_key = Some(key.into());
        self
    }

    /// The W3C trace context of whoever submits (`00-<trace id>-<parent
    /// id>-<flags>`): it travels with the task to every attempt
    /// ([`TaskContext::traceparent`], env `TRACEPARENT` of a worker's
    /// command). Checked at submit ([`check_traceparent`]).
    ///
    /// ```
    /// use cronoq::{Task, TaskId};
    /// let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    /// assert!(Task::new("x").traceparent(tp).to_spec(TaskId(1), 1024).is_ok());
    /// assert!(Task::new("x").traceparent("00-zz").to_spec(TaskId(1), 1024).is_err());
    /// ```
    pub fn traceparent(mut self, traceparent: impl Into<String>) -> Task {
        self.traceparent = Some(traceparent.into());
        self
    }

    /// The trace context, if any.
    pub fn trace_context(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }

    /// The pool name as given.
    pub fn pool_name(&self) -> &str {
        &self.pool
    }

    /// The payload.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// The required labels as given.
    pub fn required_labels(&self) -> &Labels {
        &self.labels
    }

    /// The idempotency key, if any.
    pub fn key(&self) -> Option<&str> {
        self.idempotency_key.as_deref()
    }

    /// Validates and turns the options into the core's [`TaskSpec`].
    pub fn to_spec(&self, id: TaskId, max_payload_bytes: usize) -> Result<TaskSpec, Rejection> {
        if let Some(e) = self.label_errors.first() {
            return Err(Rejection::InvalidArgument(e.clone()));
        }
        if self.payload.len() > max_payload_bytes {
            return Err(Rejection::InvalidArgument(format!(
                "payload of {} bytes is above the limit of {max_payload_bytes} bytes",
                self.payload.len()
            )));
        }
        let pool = PoolName::new(&self.pool)?;
        self.to_spec_in(id, max_payload_bytes, pool)
    }

    /// [`Task::to_spec`] with the pool already validated (an interned
    /// `pool` whose text is this task's pool name): no allocation for it.
    pub(crate) fn to_spec_in(
        &self,
        id: TaskId,
        max_payload_bytes: usize,
        pool: PoolName,
    ) -> Result<TaskSpec, Rejection> {
        let spec = self.spec_in(id, max_payload_bytes, pool)?;
        spec.validate()?;
        Ok(spec)
    }

    /// [`Task::to_spec_in`] without [`TaskSpec::validate`], for a caller
    /// that hands the spec straight to the core, which runs it on every
    /// submission: labels are checked once, not twice, per task.
    pub(crate) fn spec_in(
        &self,
        id: TaskId,
        max_payload_bytes: usize,
        pool: PoolName,
    ) -> Result<TaskSpec, Rejection> {
        debug_assert_eq!(pool.as_str(), self.pool);
        if let Some(e) = self.label_errors.first() {
            return Err(Rejection::InvalidArgument(e.clone()));
        }
        if let Some(tp) = &self.traceparent {
            check_traceparent(tp)?;
        }
        if let Some(key) = &self.idempotency_key {
            if key.len() > crate::core::MAX_KEY_LEN {
                return Err(Rejection::ResourceExhausted(format!(
                    "idempotency key of {} bytes is above the limit of {} bytes",
                    key.len(),
                    crate::core::MAX_KEY_LEN
                )));
            }
        }
        if self.payload.len() > max_payload_bytes {
            return Err(Rejection::InvalidArgument(format!(
                "payload of {} bytes is above the limit of {max_payload_bytes} bytes",
                self.payload.len()
            )));
        }
        let to_millis = |t: SystemTime| -> Result<Millis, Rejection> {
            t.duration_since(UNIX_EPOCH)
                .map(Millis::from_duration)
                .map_err(|_| Rejection::InvalidArgument("time before 1970".into()))
        };
        let spec = TaskSpec {
            id,
            pool,
            required: self.labels.clone(),
            priority: self.priority,
            deadline: self.deadline.map(to_millis).transpose()?,
            fixed_start: self
                .start_at
                .map(|s| {
                    Ok::<_, Rejection>(FixedStart {
                        start_at: to_millis(s)?,
                        tolerance: Millis::from_duration(self.tolerance),
                    })
                })
                .transpose()?,
            est_runtime: self.est_runtime.map(Millis::from_duration),
            max_attempts: self.max_attempts,
            backoff: self.backoff.map(|(initial, max)| Backoff {
                initial: Millis::from_duration(initial),
                max: Millis::from_duration(max),
            }),
            attempt_timeout: self.attempt_timeout.map(Millis::from_duration),
            fairness_key: None,
            fairness_weight: 1,
            concurrency_key: None,
            concurrency_limit: 1,
            concurrency_policy: ConcurrencyPolicy::Queue,
            preemptible: true,
        };
        Ok(match &self.sharing {
            None => spec,
            Some(sharing) => sharing.apply(spec),
        })
    }
}

/// Checks a W3C trace context header (version `00`):
/// `00-<32 lowercase hex: trace id>-<16 lowercase hex: parent id>-<2 hex:
/// flags>`, neither id all zeros. Anything else is `INVALID_ARGUMENT`.
///
/// ```
/// use cronoq::task::check_traceparent;
/// assert!(check_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").is_ok());
/// assert!(check_traceparent("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_err());
/// assert!(check_traceparent("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01").is_err());
/// ```
pub fn check_traceparent(text: &str) -> Result<(), Rejection> {
    let bad = |why: &str| {
        Err(Rejection::InvalidArgument(format!(
            "traceparent {}: {why} (want 00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>, \
             lowercase, ids not all zeros)",
            crate::core::excerpt(text)
        )))
    };
    let parts: Vec<&str> = text.split('-').collect();
    let [version, trace_id, parent_id, flags] = parts[..] else {
        return bad("not four fields separated by '-'");
    };
    let hex = |s: &str, len: usize| {
        s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    if version != "00" {
        return bad("version must be 00");
    }
    if !hex(trace_id, 32) {
        return bad("the trace id must be 32 lowercase hex digits");
    }
    if !hex(parent_id, 16) {
        return bad("the parent id must be 16 lowercase hex digits");
    }
    if !hex(flags, 2) {
        return bad("the flags must be 2 lowercase hex digits");
    }
    if trace_id.bytes().all(|b| b == b'0') || parent_id.bytes().all(|b| b == b'0') {
        return bad("an all-zero id is invalid");
    }
    Ok(())
}

/// What an executor (embedded) or handler (remote worker) sees of the
/// attempt it runs.
#[derive(Clone, Debug)]
pub struct TaskContext {
    /// The task.
    pub task_id: TaskId,
    /// The attempt, from 1.
    pub attempt: u32,
    /// The pool.
    pub pool: PoolName,
    /// The labels of the group this attempt runs in (empty: unlabeled).
    pub group: Labels,
    /// The W3C `traceparent` the task was submitted with, if any.
    pub traceparent: Option<String>,
    /// The schedule that fired the task and the tick it fired for, if one
    /// did (a worker's command sees them as `CRONOQ_SCHEDULE` and
    /// `CRONOQ_SCHEDULED_AT`).
    pub schedule: Option<(String, Millis)>,
}

/// What an executor returns when an attempt fails.
///
/// Any `std::error::Error` converts into a retryable `TaskError` with `?`;
/// [`TaskError::permanent`] ends the task at once.
///
/// ```
/// use cronoq::TaskError;
/// let e: TaskError = std::io::Error::other("disk full").into();
/// assert!(e.is_retryable());
/// assert!(!TaskError::permanent("bad payload").is_retryable());
/// ```
pub struct TaskError {
    message: String,
    retryable: bool,
}

impl TaskError {
    /// A failure another attempt may fix.
    pub fn retryable(message: impl Into<String>) -> TaskError {
        TaskError {
            message: message.into(),
            retryable: true,
        }
    }

    /// A failure no retry will fix: the task fails at once.
    pub fn permanent(message: impl Into<String>) -> TaskError {
        TaskError {
            message: message.into(),
            retryable: false,
        }
    }

    /// Whether the task may be retried.
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for TaskError {
    fn from(e: E) -> TaskError {
        let mut message = e.to_string();
        let mut source = e.source();
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        TaskError::retryable(message)
    }
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TaskError({:?}, retryable: {})",
            self.message, self.retryable
        )
    }
}

/// How one attempt went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// 1-based.
    pub attempt: u32,
    /// The group that ran it.
    pub group: Labels,
    /// The worker that ran it (distributed mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// The credential that registered that worker (auth on): after a
    /// leader change, only a worker of this credential may re-attach the
    /// attempt or report its outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// When it started, ms since the Unix epoch.
    pub started_at: Millis,
    /// When it ended.
    pub ended_at: Option<Millis>,
    /// `succeeded`, `failed`, `lost` or `cancelled`, once ended (borrowed
    /// from a constant when cronoq fills it in: no allocation per attempt).
    pub outcome: Option<Cow<'static, str>>,
    /// The error, for a failed attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl AttemptRecord {
    /// Roughly what it adds to a MessagePack message (field names
    /// included): journal records and start records are kept within one
    /// NATS message by it.
    pub(crate) fn estimated_size(&self) -> usize {
        let labels: usize = self.group.iter().map(|(k, v)| k.len() + v.len() + 4).sum();
        let text = |s: &Option<String>| s.as_ref().map_or(0, String::len);
        128 + labels + text(&self.worker) + text(&self.credential) + text(&self.error)
    }
}

/// A finished task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The task.
    pub id: TaskId,
    /// Its pool.
    pub pool: PoolName,
    /// `succeeded`, `failed`, `cancelled` or `missed`.
    pub state: TaskState,
    /// Output of the successful attempt.
    pub output: Option<Bytes>,
    /// Error of the last failed attempt.
    pub error: Option<String>,
    /// Every attempt, in order.
    pub attempts: Vec<AttemptRecord>,
    /// It finished after its deadline.
    pub deadline_missed: bool,
    /// The schedule that fired it and the tick it fired for, if one did.
    pub schedule: Option<(String, Millis)>,
}

impl Outcome {
    /// The task succeeded.
    pub fn is_success(&self) -> bool {
        self.state == TaskState::Succeeded
    }

    /// The group of the last attempt.
    pub fn group(&self) -> Option<&Labels> {
        self.attempts.last().map(|a| &a.group)
    }
}

/// A task as `GET /v1/tasks/{id}` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskStatus {
    /// The task.
    pub id: TaskId,
    /// Its pool.
    pub pool: PoolName,
    /// Its state.
    pub state: TaskState,
    /// Why it waits, while it does.
    pub reason: Option<WaitReason>,
    /// The key it waits for (SPEC §9): its fairness key when `reason` is
    /// `quota`, its concurrency key when `concurrency`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_key: Option<String>,
    /// Attempts so far.
    pub attempts: Vec<AttemptRecord>,
    /// Output, once succeeded (lossy UTF-8 in JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// The same output, exact: standard base64 (see [`TaskStatus::output_bytes`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_base64: Option<String>,
    /// Error of the last failed attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// It finished after its deadline.
    pub deadline_missed: bool,
    /// The schedule that fired it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// The tick it was fired for (RFC 3339 UTC in JSON, e.g.
    /// `2026-12-05T04:00:00Z`; ms since the epoch are read too).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "rfc3339_millis"
    )]
    pub scheduled_at: Option<Millis>,
    /// Set when the output was left out of this answer because it would
    /// not fit one NATS message (`output`/`output_base64` absent): its
    /// size in bytes. [`crate::client::Client::get`] fetches it in pages
    /// (`P.api.task_output`) and fills it in; over HTTP,
    /// `GET /v1/tasks/{id}` has it whole, `GET /v1/tasks/{id}/output` as
    /// raw bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_size: Option<u64>,
}

/// An instant as RFC 3339 UTC text (`2026-12-05T04:00:00Z`, milliseconds
/// shown only when not zero), as `CRONOQ_SCHEDULED_AT` and `TaskStatus`
/// show a tick.
///
/// ```
/// use cronoq::{core::Millis, task::rfc3339_utc};
/// assert_eq!(rfc3339_utc(Millis(1_796_443_200_000)), "2026-12-05T04:00:00Z");
/// assert_eq!(rfc3339_utc(Millis(1_796_443_200_250)), "2026-12-05T04:00:00.250Z");
/// ```
pub fn rfc3339_utc(at: Millis) -> String {
    let t = UNIX_EPOCH + at.to_duration();
    if at.0 % 1000 == 0 {
        humantime::format_rfc3339_seconds(t).to_string()
    } else {
        humantime::format_rfc3339_millis(t).to_string()
    }
}

/// Serde for an optional instant written as RFC 3339 UTC text and read
/// from that text or from ms since the epoch.
mod rfc3339_millis {
    use super::{rfc3339_utc, Millis, UNIX_EPOCH};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(at: &Option<Millis>, s: S) -> Result<S::Ok, S::Error> {
        match at {
            Some(at) => s.serialize_str(&rfc3339_utc(*at)),
            None => s.serialize_none(),
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Text(String),
        Millis(u64),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Millis>, D::Error> {
        match Option::<Either>::deserialize(d)? {
            None => Ok(None),
            Some(Either::Millis(ms)) => Ok(Some(Millis(ms))),
            Some(Either::Text(text)) => super::parse_rfc3339(&text)
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|d| Some(Millis::from_duration(d)))
                .ok_or_else(|| serde::de::Error::custom(format!("not an RFC 3339 time: {text}"))),
        }
    }
}

/// The `output` and `output_base64` fields of a [`TaskStatus`] for `output`.
///
/// ```
/// let (text, exact) = cronoq::task::output_fields(Some(&b"\xffok"[..]));
/// assert_eq!(text.unwrap(), "\u{fffd}ok");
/// assert_eq!(exact.unwrap(), "/29r");
/// ```
pub fn output_fields(output: Option<&[u8]>) -> (Option<String>, Option<String>) {
    use base64::Engine as _;
    match output {
        Some(bytes) => (
            Some(String::from_utf8_lossy(bytes).into_owned()),
            Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
        ),
        None => (None, None),
    }
}

impl TaskStatus {
    /// The exact output bytes: `output_base64` decoded, or `output` as text
    /// when a sender filled only that.
    ///
    /// ```
    /// # use cronoq::{TaskStatus, TaskState, TaskId, PoolName};
    /// let (output, output_base64) = cronoq::task::output_fields(Some(&[0u8, 255][..]));
    /// let status = TaskStatus {
    ///     id: TaskId(1), pool: PoolName::default(), state: TaskState::Succeeded, reason: None, reason_key: None,
    ///     attempts: vec![], output, output_base64, error: None, deadline_missed: false,
    ///     schedule: None, scheduled_at: None,
    ///     output_size: None,
    /// };
    /// assert_eq!(status.output_bytes().unwrap(), vec![0u8, 255]);
    /// ```
    pub fn output_bytes(&self) -> Option<Vec<u8>> {
        use base64::Engine as _;
        if let Some(b64) = &self.output_base64 {
            if let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(b64) {
                return Some(bytes);
            }
        }
        self.output.as_ref().map(|s| s.clone().into_bytes())
    }
}

/// The longest error a [`TaskStatus::summary`] keeps, in characters.
pub const SUMMARY_ERROR_CHARS: usize = 200;

/// Cuts `text` to `chars` characters, marking the cut with `…`.
pub(crate) fn cut_chars(text: &mut String, chars: usize) {
    if let Some((at, _)) = text.char_indices().nth(chars) {
        text.truncate(at);
        text.push('…');
    }
}

fn cut(text: &mut String) {
    cut_chars(text, SUMMARY_ERROR_CHARS);
}

impl TaskStatus {
    /// The status as a list shows it: without the output (a list of many
    /// tasks must stay small; `GET /v1/tasks/{id}` has it), errors cut to
    /// [`SUMMARY_ERROR_CHARS`] characters.
    ///
    /// ```
    /// # use cronoq::{TaskStatus, TaskState, TaskId, PoolName};
    /// let status = TaskStatus {
    ///     id: TaskId(1), pool: PoolName::default(), state: TaskState::Failed, reason: None, reason_key: None,
    ///     attempts: vec![], output: Some("big".into()), output_base64: Some("Ymln".into()),
    ///     error: Some("x".repeat(10_000)), deadline_missed: false,
    ///     schedule: None, scheduled_at: None,
    ///     output_size: None,
    /// };
    /// let short = status.summary();
    /// assert!(short.output.is_none() && short.output_base64.is_none());
    /// assert!(short.error.unwrap().chars().count() <= 201);
    /// ```
    pub fn summary(mut self) -> TaskStatus {
        self.output = None;
        self.output_base64 = None;
        if let Some(e) = &mut self.error {
            cut(e);
        }
        for a in &mut self.attempts {
            if let Some(e) = &mut a.error {
                cut(e);
            }
        }
        self
    }
}

/// Cuts `list` (from the end, halving) until `size(list) <= max_bytes`,
/// so a list reply fits one NATS message.
pub(crate) fn trim_list_to<T>(list: &mut Vec<T>, max_bytes: usize, size: impl Fn(&[T]) -> usize) {
    while !list.is_empty() && size(list) > max_bytes {
        list.truncate(list.len() / 2);
    }
}

/// The ids a recent-tasks list shows: the newest `limit` of the live ones
/// (`live`, newest first) and the most recently finished (`finished`, most
/// recent first), highest id first, each once.
pub(crate) fn newest_ids(
    live: impl Iterator<Item = TaskId>,
    finished: impl Iterator<Item = TaskId>,
    limit: usize,
) -> Vec<TaskId> {
    let mut ids: Vec<TaskId> = live.take(limit).chain(finished.take(limit)).collect();
    ids.sort_unstable_by(|a, b| b.cmp(a));
    ids.dedup();
    ids.truncate(limit);
    ids
}

/// The text of a caught panic, for the attempt's error.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-text panic".to_string()
    }
}

impl TaskStatus {
    /// The status of a finished task.
    pub fn of_outcome(o: &Outcome) -> TaskStatus {
        let (output, output_base64) = output_fields(o.output.as_deref());
        TaskStatus {
            id: o.id,
            pool: o.pool.clone(),
            state: o.state,
            reason: None,
            reason_key: None,
            attempts: o.attempts.clone(),
            output,
            output_base64,
            error: o.error.clone(),
            deadline_missed: o.deadline_missed,
            schedule: o.schedule.as_ref().map(|(name, _)| name.clone()),
            scheduled_at: o.schedule.as_ref().map(|(_, at)| *at),
            output_size: None,
        }
    }

    /// A status known only by its task, pool and state: nothing ran that
    /// it can tell of (no attempts, output, error or schedule).
    pub(crate) fn bare(id: TaskId, pool: PoolName, state: TaskState) -> TaskStatus {
        TaskStatus {
            id,
            pool,
            state,
            reason: None,
            reason_key: None,
            attempts: Vec::new(),
            output: None,
            output_base64: None,
            error: None,
            deadline_missed: false,
            schedule: None,
            scheduled_at: None,
            output_size: None,
        }
    }

    /// The status of a task the core still holds.
    pub(crate) fn live(
        view: crate::core::TaskView,
        attempts: Vec<AttemptRecord>,
        error: Option<String>,
        schedule: Option<&(String, Millis)>,
    ) -> TaskStatus {
        TaskStatus {
            id: view.id,
            pool: view.pool,
            state: view.state,
            reason: view.reason,
            reason_key: view.reason_key,
            attempts,
            output: None,
            output_base64: None,
            error,
            deadline_missed: false,
            schedule: schedule.map(|(name, _)| name.clone()),
            scheduled_at: schedule.map(|(_, at)| *at),
            output_size: None,
        }
    }
}

impl Sharing {
    /// `spec` with these options (the core validates them on submit).
    fn apply(&self, spec: TaskSpec) -> TaskSpec {
        TaskSpec {
            fairness_key: self.fairness_key.clone(),
            fairness_weight: self.fairness_weight.unwrap_or(1),
            concurrency_key: self.concurrency_key.clone(),
            concurrency_limit: self.concurrency_limit.unwrap_or(1),
            concurrency_policy: self.concurrency_policy.unwrap_or_default(),
            preemptible: self.preemptible.unwrap_or(true),
            ..spec
        }
    }
}

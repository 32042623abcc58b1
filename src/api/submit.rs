//! The JSON of `POST /v1/tasks` ([`SubmitRequest`]) and its answer: what
//! the HTTP API reads and the HTTP client writes, so it sits below both.

use std::time::SystemTime;

use base64::Engine as _;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::core::{Labels, Rejection, TaskId};
use crate::task::Task;
use crate::wire::{parse_duration, parse_time};

/// `POST /v1/tasks`: a task as JSON. Unknown fields are refused.
///
/// Times (`deadline`, `start_at`) are RFC 3339 or a duration from now
/// (`"30s"`); spans (`tolerance`, `attempt_timeout`, `est_runtime`,
/// `backoff`) are durations (`"250ms"`, `"5m"`). Give `payload` (text) or
/// `payload_base64`, not both; neither is an empty payload.
///
/// ```
/// let req: cronoq::api::SubmitRequest = serde_json::from_str(
///     r#"{"pool": "inference", "labels": {"gpu": "a100"}, "payload": "hi", "deadline": "5m"}"#,
/// ).unwrap();
/// let task = req.into_task(std::time::SystemTime::now()).unwrap();
/// assert_eq!(task.pool_name(), "inference");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// The pool (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Labels the running group must carry.
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
    /// The payload as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// The payload as standard base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_base64: Option<String>,
    /// Higher runs first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Urgency deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    /// Fixed start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<String>,
    /// How late a fixed start may still start (needs `start_at`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<String>,
    /// Attempts in all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Longest run of one attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_timeout: Option<String>,
    /// Declared run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub est_runtime: Option<String>,
    /// Backoff between attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<BackoffRequest>,
    /// De-duplicates resubmissions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

/// `"backoff": {"initial": "1s", "max": "1m"}` of a [`SubmitRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackoffRequest {
    /// Delay before the second attempt.
    pub initial: String,
    /// The longest delay.
    pub max: String,
}

/// The answer to `POST /v1/tasks` (and to a cancel).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitResponse {
    /// The task's id.
    pub id: TaskId,
}

fn with_field<T>(field: &str, r: Result<T, Rejection>) -> Result<T, Rejection> {
    r.map_err(|e| Rejection::InvalidArgument(format!("{field}: {e}")))
}

impl SubmitRequest {
    /// The [`Task`] this asks for; relative times count from `now`.
    /// Options are checked here for form only; the scheduler validates the
    /// rest on submit.
    pub fn into_task(self, now: SystemTime) -> Result<Task, Rejection> {
        let payload = match (self.payload, self.payload_base64) {
            (Some(_), Some(_)) => {
                return Err(Rejection::InvalidArgument(
                    "give payload or payload_base64, not both".into(),
                ))
            }
            (Some(text), None) => Bytes::from(text),
            (None, Some(b64)) => base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map(Bytes::from)
                .map_err(|e| Rejection::InvalidArgument(format!("payload_base64: {e}")))?,
            (None, None) => Bytes::new(),
        };
        let mut task = Task::new(payload).labels(&self.labels);
        if let Some(pool) = self.pool {
            task = task.pool(pool);
        }
        if let Some(p) = self.priority {
            task = task.priority(p);
        }
        if let Some(d) = &self.deadline {
            task = task.deadline(with_field("deadline", parse_time(d, now))?);
        }
        let tolerance = self
            .tolerance
            .as_deref()
            .map(|t| with_field("tolerance", parse_duration(t)))
            .transpose()?;
        match (&self.start_at, tolerance) {
            (Some(s), tolerance) => {
                let at = with_field("start_at", parse_time(s, now))?;
                task = task.start_at(at, tolerance.unwrap_or_default());
            }
            (None, Some(_)) => return Err(crate::wire::tolerance_without_start()),
            (None, None) => {}
        }
        if let Some(n) = self.max_attempts {
            task = task.max_attempts(n);
        }
        if let Some(t) = &self.attempt_timeout {
            task = task.attempt_timeout(with_field("attempt_timeout", parse_duration(t))?);
        }
        if let Some(e) = &self.est_runtime {
            task = task.est_runtime(with_field("est_runtime", parse_duration(e))?);
        }
        if let Some(b) = &self.backoff {
            task = task.backoff(
                with_field("backoff.initial", parse_duration(&b.initial))?,
                with_field("backoff.max", parse_duration(&b.max))?,
            );
        }
        if let Some(k) = self.idempotency_key {
            task = task.idempotency_key(k);
        }
        Ok(task)
    }

    /// The request for `task` (what the HTTP client sends):
    /// text payloads as `payload`, others as `payload_base64`; times as
    /// RFC 3339, spans in milliseconds.
    pub fn from_task(task: &Task) -> SubmitRequest {
        let span = |d: std::time::Duration| format!("{}ms", d.as_millis());
        let time = |t: SystemTime| humantime::format_rfc3339_millis(t).to_string();
        let (payload, payload_base64) = match std::str::from_utf8(&task.payload) {
            Ok(text) => (Some(text.to_string()), None),
            Err(_) => (
                None,
                Some(base64::engine::general_purpose::STANDARD.encode(&task.payload)),
            ),
        };
        SubmitRequest {
            pool: Some(task.pool.clone()),
            labels: task.labels.clone(),
            payload,
            payload_base64,
            priority: Some(task.priority),
            deadline: task.deadline.map(time),
            start_at: task.start_at.map(time),
            tolerance: task.start_at.map(|_| span(task.tolerance)),
            max_attempts: task.max_attempts,
            attempt_timeout: task.attempt_timeout.map(span),
            est_runtime: task.est_runtime.map(span),
            backoff: task.backoff.map(|(initial, max)| BackoffRequest {
                initial: span(initial),
                max: span(max),
            }),
            idempotency_key: task.idempotency_key.clone(),
        }
    }
}

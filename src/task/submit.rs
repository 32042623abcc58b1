//! The one way in for a submission: [`SubmitOptions`] (typed options and
//! the payload) and its one conversion to a [`Task`]; [`SubmitRequest`],
//! the text form of the same options (the JSON of `POST /v1/tasks`, and
//! what the CLI's flags and plain-publish headers fill in); the text forms
//! of times and durations; and the idempotency key's rule.
//!
//! Every path (HTTP, CLI, Python, plain-publish headers, MessagePack)
//! builds [`SubmitOptions`] and calls [`SubmitOptions::into_task`], so a
//! bad option is refused with the same code and message on each. The
//! scheduler's own checks (labels, limits, spans, horizon: `Task::to_spec`
//! and the core) run once, where the task is submitted.

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{check_traceparent, Task};
use crate::core::{excerpt, ConcurrencyPolicy, Labels, Millis, Rejection, MAX_HORIZON};

/// A submission's options, typed, with its payload: what every path
/// builds, and turns into a [`Task`] with [`SubmitOptions::into_task`].
///
/// ```
/// use std::time::Duration;
/// let task = cronoq::task::SubmitOptions {
///     pool: Some("inference".into()),
///     backoff: Some((Duration::from_secs(1), Duration::from_secs(60))),
///     ..Default::default()
/// }
/// .into_task()
/// .unwrap();
/// assert_eq!(task.pool_name(), "inference");
/// let e = cronoq::task::SubmitOptions {
///     tolerance: Some(Duration::from_secs(5)),
///     ..Default::default()
/// }
/// .into_task()
/// .unwrap_err();
/// assert_eq!(e.to_string(), "tolerance is given without start_at");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubmitOptions {
    /// The payload.
    pub payload: Bytes,
    /// The pool (default `default`).
    pub pool: Option<String>,
    /// Labels the running group must carry.
    pub labels: Labels,
    /// Higher runs first.
    pub priority: Option<i32>,
    /// Urgency deadline.
    pub deadline: Option<SystemTime>,
    /// Fixed start.
    pub start_at: Option<SystemTime>,
    /// How late a fixed start may still start (needs `start_at`).
    pub tolerance: Option<Duration>,
    /// Attempts in all.
    pub max_attempts: Option<u32>,
    /// Longest run of one attempt.
    pub attempt_timeout: Option<Duration>,
    /// Declared run time.
    pub est_runtime: Option<Duration>,
    /// Backoff between attempts: (initial, max).
    pub backoff: Option<(Duration, Duration)>,
    /// De-duplicates resubmissions (see [`check_key`]).
    pub idempotency_key: Option<String>,
    /// The submitter's W3C trace context (see [`check_traceparent`]).
    pub traceparent: Option<String>,
    /// Its fairness key (SPEC §9).
    pub fairness_key: Option<String>,
    /// Its fairness key's weight, 1 to 1,000.
    pub fairness_weight: Option<u32>,
    /// Its concurrency key.
    pub concurrency_key: Option<String>,
    /// How many of its concurrency key's tasks may run at once (≥ 1).
    pub concurrency_limit: Option<u32>,
    /// What admission does when the limit is full.
    pub concurrency_policy: Option<ConcurrencyPolicy>,
    /// Whether higher-priority work may preempt it (default true).
    pub preemptible: Option<bool>,
}

impl SubmitOptions {
    /// The [`Task`] these options describe. Refused here: a tolerance
    /// without a start, an idempotency key [`check_key`] refuses, a
    /// malformed traceparent. The rest (labels, pool name, limits, spans,
    /// horizon) is the scheduler's, checked once on submit.
    pub fn into_task(self) -> Result<Task, Rejection> {
        if self.start_at.is_none() && self.tolerance.is_some() {
            return Err(tolerance_without_start());
        }
        if let Some(key) = &self.idempotency_key {
            check_key(key)?;
        }
        if let Some(tp) = &self.traceparent {
            check_traceparent(tp)?;
        }
        let mut task = Task::new(self.payload).labels(&self.labels);
        if let Some(pool) = self.pool {
            task = task.pool(pool);
        }
        if let Some(p) = self.priority {
            task = task.priority(p);
        }
        if let Some(d) = self.deadline {
            task = task.deadline(d);
        }
        if let Some(at) = self.start_at {
            task = task.start_at(at, self.tolerance.unwrap_or_default());
        }
        if let Some(n) = self.max_attempts {
            task = task.max_attempts(n);
        }
        if let Some(t) = self.attempt_timeout {
            task = task.attempt_timeout(t);
        }
        if let Some(e) = self.est_runtime {
            task = task.est_runtime(e);
        }
        if let Some((initial, max)) = self.backoff {
            task = task.backoff(initial, max);
        }
        if let Some(k) = self.idempotency_key {
            task = task.idempotency_key(k);
        }
        if let Some(tp) = self.traceparent {
            task = task.traceparent(tp);
        }
        if let Some(k) = self.fairness_key {
            task = task.fairness_key(k);
        }
        if let Some(w) = self.fairness_weight {
            task = task.fairness_weight(w);
        }
        if let Some(k) = self.concurrency_key {
            task = task.concurrency_key(k);
        }
        if let Some(n) = self.concurrency_limit {
            task = task.concurrency_limit(n);
        }
        if let Some(p) = self.concurrency_policy {
            task = task.concurrency_policy(p);
        }
        if let Some(p) = self.preemptible {
            task = task.preemptible(p);
        }
        Ok(task)
    }
}

/// Refuses an idempotency key that cannot become a `Nats-Msg-Id` header:
/// empty, or with a control character (CR, LF, …). Its length is the
/// scheduler's limit ([`crate::core::MAX_KEY_LEN`], checked on submit).
///
/// ```
/// assert!(cronoq::task::check_key("order-42").is_ok());
/// assert!(cronoq::task::check_key("").is_err());
/// assert!(cronoq::task::check_key("a\r\nb").is_err());
/// ```
pub fn check_key(key: &str) -> Result<(), Rejection> {
    if key.is_empty() || key.chars().any(char::is_control) {
        return Err(Rejection::InvalidArgument(format!(
            "idempotency key {} must be non-empty text without control characters",
            excerpt(key)
        )));
    }
    Ok(())
}

/// The refusal of a tolerance given without a fixed start (the same on
/// every path).
pub fn tolerance_without_start() -> Rejection {
    Rejection::InvalidArgument("tolerance is given without start_at".into())
}

/// `POST /v1/tasks`: a task as JSON; also the text form the CLI's flags and
/// plain-publish headers fill in. Unknown fields are refused.
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// The W3C trace context: not a JSON field (over HTTP it is the
    /// `traceparent` header; the CLI's `--traceparent`, a plain publish's
    /// `traceparent` header).
    #[serde(skip)]
    pub traceparent: Option<String>,
    /// Fairness key (SPEC §9): 1 to 64 bytes, no control character. With
    /// auth on, defaults to the credential's name; another key only if the
    /// credential's `fairness_keys` lists it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fairness_key: Option<String>,
    /// Weight of the fairness key, 1 to 1,000 (default 1). Ignored with
    /// auth on and for keys the pool's `[[pools.fairness]]` weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub fairness_weight: Option<u32>,
    /// Concurrency key: 1 to 128 bytes; tasks of one pool with the same
    /// key share a limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// At most this many of the key's tasks run at once (≥ 1, default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub concurrency_limit: Option<u32>,
    /// `queue` (default), `replace_waiting`, `cancel_running` or `skip`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<PolicyName>")]
    pub concurrency_policy: Option<String>,
    /// Whether a waiting task of higher priority may preempt it (default
    /// true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemptible: Option<bool>,
}

/// What admission does when a concurrency key's limit is full (SPEC §9).
// For the JSON schema only: the field is text, parsed by
// `ConcurrencyPolicy::parse`, so every path refuses a bad name alike.
#[derive(schemars::JsonSchema)]
#[schemars(rename = "ConcurrencyPolicy")]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
enum PolicyName {
    Queue,
    ReplaceWaiting,
    CancelRunning,
    Skip,
}

/// `"backoff": {"initial": "1s", "max": "1m"}` of a [`SubmitRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BackoffRequest {
    /// Delay before the second attempt.
    pub initial: String,
    /// The longest delay.
    pub max: String,
}

impl BackoffRequest {
    /// `INITIAL,MAX` (`1s,1m`), as the CLI's `--backoff` and the
    /// `Cronoq-Backoff` header give it.
    ///
    /// ```
    /// let b = cronoq::api::BackoffRequest::parse("1s, 1m").unwrap();
    /// assert_eq!((b.initial.as_str(), b.max.as_str()), ("1s", "1m"));
    /// assert!(cronoq::api::BackoffRequest::parse("1s").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<BackoffRequest, Rejection> {
        match text.split_once(',') {
            Some((initial, max)) => Ok(BackoffRequest {
                initial: initial.trim().to_string(),
                max: max.trim().to_string(),
            }),
            None => Err(Rejection::InvalidArgument(format!(
                "backoff {} is not INITIAL,MAX (e.g. 1s,1m)",
                excerpt(text)
            ))),
        }
    }
}

fn with_field<T>(field: &str, r: Result<T, Rejection>) -> Result<T, Rejection> {
    r.map_err(|e| Rejection::InvalidArgument(format!("{field}: {e}")))
}

/// A span given as text: its form only. How long it may be is the
/// scheduler's rule (one message on every path, typed or text).
fn parse_span(field: &str, text: &str) -> Result<Duration, Rejection> {
    with_field(
        field,
        humantime::parse_duration(text.trim())
            .map_err(|e| Rejection::InvalidArgument(format!("duration {}: {e}", excerpt(text)))),
    )
}

impl SubmitRequest {
    /// The options this asks for, typed; relative times count from `now`.
    /// A value of the wrong form is refused naming its field.
    pub fn into_options(self, now: SystemTime) -> Result<SubmitOptions, Rejection> {
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
        let time = |field: &str, t: Option<String>| {
            t.map(|t| with_field(field, parse_time(&t, now)))
                .transpose()
        };
        let span = |field: &str, t: Option<String>| t.map(|t| parse_span(field, &t)).transpose();
        Ok(SubmitOptions {
            payload,
            pool: self.pool,
            labels: self.labels,
            priority: self.priority,
            deadline: time("deadline", self.deadline)?,
            start_at: time("start_at", self.start_at)?,
            tolerance: span("tolerance", self.tolerance)?,
            max_attempts: self.max_attempts,
            attempt_timeout: span("attempt_timeout", self.attempt_timeout)?,
            est_runtime: span("est_runtime", self.est_runtime)?,
            backoff: match self.backoff {
                Some(b) => Some((
                    parse_span("backoff.initial", &b.initial)?,
                    parse_span("backoff.max", &b.max)?,
                )),
                None => None,
            },
            idempotency_key: self.idempotency_key,
            traceparent: self.traceparent,
            fairness_key: self.fairness_key,
            fairness_weight: self.fairness_weight,
            concurrency_key: self.concurrency_key,
            concurrency_limit: self.concurrency_limit,
            concurrency_policy: self
                .concurrency_policy
                .as_deref()
                .map(ConcurrencyPolicy::parse)
                .transpose()?,
            preemptible: self.preemptible,
        })
    }

    /// The [`Task`] this asks for; relative times count from `now`
    /// ([`SubmitRequest::into_options`], then [`SubmitOptions::into_task`]).
    pub fn into_task(self, now: SystemTime) -> Result<Task, Rejection> {
        self.into_options(now)?.into_task()
    }

    /// The request for `task` (what the HTTP client sends):
    /// text payloads as `payload`, others as `payload_base64`; times as
    /// RFC 3339, spans in milliseconds. The traceparent is left out (it
    /// travels as a header).
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
            traceparent: None,
            ..SubmitRequest::sharing_of(task)
        }
    }

    /// The SPEC §9 fields of `task` (the rest default).
    fn sharing_of(task: &Task) -> SubmitRequest {
        let Some(s) = task.sharing.as_deref() else {
            return SubmitRequest::default();
        };
        SubmitRequest {
            fairness_key: s.fairness_key.clone(),
            fairness_weight: s.fairness_weight,
            concurrency_key: s.concurrency_key.clone(),
            concurrency_limit: s.concurrency_limit,
            concurrency_policy: s.concurrency_policy.map(|p| p.as_str().to_string()),
            preemptible: s.preemptible,
            ..SubmitRequest::default()
        }
    }
}

/// Parses `30s`, `5m`, `1h 30m`, `250ms`; at most 10 years
/// ([`MAX_HORIZON`]).
///
/// ```
/// use cronoq::wire::parse_duration;
/// assert_eq!(parse_duration("90s").unwrap().as_secs(), 90);
/// assert!(parse_duration("300000000000y").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, Rejection> {
    let d = humantime::parse_duration(text.trim())
        .map_err(|e| Rejection::InvalidArgument(format!("duration {}: {e}", excerpt(text))))?;
    if Millis::from_duration(d) > MAX_HORIZON {
        return Err(Rejection::InvalidArgument(format!(
            "duration {} is longer than the limit of 10 years",
            excerpt(text)
        )));
    }
    Ok(d)
}

/// Parses an RFC 3339 time, or a duration meaning "that long after `now`"
/// (at most 10 years; the sum never overflows).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use cronoq::wire::parse_time;
/// let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
/// assert_eq!(parse_time("30s", now).unwrap(), now + Duration::from_secs(30));
/// assert!(parse_time("10000000000000000000s", now).is_err());
/// ```
pub fn parse_time(text: &str, now: SystemTime) -> Result<SystemTime, Rejection> {
    let text = text.trim();
    if let Some(t) = parse_rfc3339(text) {
        return Ok(t);
    }
    match humantime::parse_duration(text) {
        Ok(d) if Millis::from_duration(d) <= MAX_HORIZON => now.checked_add(d).ok_or_else(|| {
            Rejection::InvalidArgument(format!("time {} is out of range", excerpt(text)))
        }),
        Ok(_) => Err(Rejection::InvalidArgument(format!(
            "time {} is more than 10 years ahead",
            excerpt(text)
        ))),
        Err(_) => Err(Rejection::InvalidArgument(format!(
            "time {} is neither RFC 3339 (2026-12-02T16:00:00Z) nor a duration from now (30s)",
            excerpt(text)
        ))),
    }
}

/// An RFC 3339 instant, with `Z` or a numeric offset
/// (`2026-12-02T17:00:00+01:00`), or without a zone meaning UTC
/// (humantime's weak form: `2026-12-02 16:00:00`).
///
/// ```
/// use cronoq::task::parse_rfc3339;
/// assert_eq!(parse_rfc3339("2026-12-02T17:00:00+01:00"), parse_rfc3339("2026-12-02T16:00:00Z"));
/// assert!(parse_rfc3339("2026-12-02 16:00:00").is_some());
/// assert!(parse_rfc3339("soon").is_none());
/// ```
pub fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let text = text.trim();
    if let Ok(ts) = text.parse::<jiff::Timestamp>() {
        return Some(SystemTime::from(ts));
    }
    humantime::parse_rfc3339_weak(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_typed_options_meet_in_one_conversion() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let req = SubmitRequest {
            start_at: Some("30s".into()),
            tolerance: Some("5s".into()),
            backoff: Some(BackoffRequest::parse("1s,1m").unwrap()),
            ..Default::default()
        };
        let task = req.into_task(now).unwrap();
        assert_eq!(task.start_at, Some(now + Duration::from_secs(30)));
        assert_eq!(task.tolerance, Duration::from_secs(5));
        assert_eq!(
            task.backoff,
            Some((Duration::from_secs(1), Duration::from_secs(60)))
        );
        for key in ["", "a\r\nb", "tab\there"] {
            let req = SubmitRequest {
                idempotency_key: Some(key.into()),
                ..Default::default()
            };
            let e = req.into_task(now).unwrap_err();
            assert!(e.to_string().starts_with("idempotency key"), "{e}");
        }
        let e = SubmitRequest {
            attempt_timeout: Some("5 parsecs".into()),
            ..Default::default()
        }
        .into_task(now)
        .unwrap_err();
        assert!(
            e.to_string().starts_with("attempt_timeout: duration"),
            "{e}"
        );
    }

    /// SPEC §9's fields travel from JSON to the spec and back, and a bad
    /// one is refused `INVALID_ARGUMENT` where the task is checked.
    #[test]
    fn sharing_options_reach_the_spec_and_round_trip() {
        use crate::core::{ConcurrencyPolicy, ErrorCode, TaskId};
        let now = SystemTime::UNIX_EPOCH;
        let req: SubmitRequest = serde_json::from_str(
            r#"{"fairness_key": "team-a", "fairness_weight": 3, "concurrency_key": "deploy",
                "concurrency_limit": 2, "concurrency_policy": "cancel_running", "preemptible": false}"#,
        )
        .unwrap();
        let task = req.clone().into_task(now).unwrap();
        let spec = task.to_spec(TaskId(1), 1024).unwrap();
        assert_eq!(spec.fairness_key.as_deref(), Some("team-a"));
        assert_eq!(spec.fairness_weight, 3);
        assert_eq!(spec.concurrency_key.as_deref(), Some("deploy"));
        assert_eq!(spec.concurrency_limit, 2);
        assert_eq!(spec.concurrency_policy, ConcurrencyPolicy::CancelRunning);
        assert!(!spec.preemptible);
        let back = SubmitRequest::from_task(&task);
        assert_eq!(
            (
                back.fairness_key,
                back.fairness_weight,
                back.concurrency_policy
            ),
            (
                req.fairness_key,
                req.fairness_weight,
                req.concurrency_policy
            )
        );
        // No options: today's spec, and no allocation for them.
        let plain = SubmitRequest::default().into_task(now).unwrap();
        assert!(plain.sharing.is_none());
        let spec = plain.to_spec(TaskId(1), 1024).unwrap();
        assert_eq!(
            spec,
            crate::core::TaskSpec::new(TaskId(1), spec.pool.clone())
        );
        for bad in [
            r#"{"fairness_key": ""}"#,
            r#"{"fairness_weight": 0}"#,
            r#"{"fairness_weight": 1001}"#,
            r#"{"concurrency_limit": 0}"#,
            r#"{"concurrency_policy": "Queue"}"#,
            r#"{"fairness_key": "a\u0000b"}"#,
        ] {
            let req: SubmitRequest = serde_json::from_str(bad).unwrap();
            let e = req
                .into_task(now)
                .and_then(|t| t.to_spec(TaskId(1), 1024).map(|_| ()))
                .unwrap_err();
            assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT, "{bad}: {e}");
        }
    }
}

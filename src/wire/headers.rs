//! Plain-publish submissions: raw body = payload, options in `Cronoq-*`
//! headers (the text forms of times and durations, [`parse_time`] and
//! [`parse_duration`], live with the options in [`crate::task`]).
//!
//! | header | value |
//! |---|---|
//! | `Cronoq-Labels` | `gpu=a100,zone=eu` |
//! | `Cronoq-Priority` | integer |
//! | `Cronoq-Deadline` | RFC 3339 time, or a duration from now (`30s`) |
//! | `Cronoq-Start-At` | RFC 3339 time, or a duration from now |
//! | `Cronoq-Tolerance` | duration (`30s`, `5m`) |
//! | `Cronoq-Est-Runtime` | duration |
//! | `Cronoq-Max-Attempts` | integer ≥ 1 |
//! | `Cronoq-Attempt-Timeout` | duration |
//! | `Cronoq-Backoff` | `INITIAL,MAX` durations (`1s,1m`) |
//! | `Cronoq-Idempotency-Key` | text (`Nats-Msg-Id` de-duplicates too) |
//! | `Cronoq-Fairness-Key` | text, ≤ 64 bytes (SPEC §9) |
//! | `Cronoq-Fairness-Weight` | integer 1 to 1,000 |
//! | `Cronoq-Concurrency-Key` | text, ≤ 128 bytes |
//! | `Cronoq-Concurrency-Limit` | integer ≥ 1 |
//! | `Cronoq-Concurrency-Policy` | `queue`, `replace_waiting`, `cancel_running` or `skip` |
//! | `Cronoq-Preemptible` | `true` or `false` |
//! | `traceparent` | W3C trace context, `00-<trace id>-<parent id>-<flags>` |
//!
//! Any other `Cronoq-*` header is refused, so a typo does not pass silently.
//! The headers fill a [`SubmitRequest`], the text form every path shares,
//! so a bad value is refused as it is over HTTP or the CLI.

use std::time::SystemTime;

use bytes::Bytes;

use crate::core::{excerpt, PoolName, Rejection, MAX_LABELS};
use crate::task::{BackoffRequest, SubmitRequest, Task};

/// The `Cronoq-*` headers a plain publish may carry.
pub const SUBMIT_HEADERS: [&str; 16] = [
    "Cronoq-Labels",
    "Cronoq-Priority",
    "Cronoq-Deadline",
    "Cronoq-Start-At",
    "Cronoq-Tolerance",
    "Cronoq-Est-Runtime",
    "Cronoq-Max-Attempts",
    "Cronoq-Attempt-Timeout",
    "Cronoq-Backoff",
    "Cronoq-Idempotency-Key",
    "Cronoq-Fairness-Key",
    "Cronoq-Fairness-Weight",
    "Cronoq-Concurrency-Key",
    "Cronoq-Concurrency-Limit",
    "Cronoq-Concurrency-Policy",
    "Cronoq-Preemptible",
];

/// The W3C trace context header of a plain publish (and of
/// `POST /v1/tasks`): the standard name, not a `Cronoq-*` one.
pub const TRACEPARENT: &str = "traceparent";

/// The header that carries a proof (what it proves, and how it is
/// checked, is the auth layer's; the name is the wire's).
pub const AUTH_HEADER: &str = "Cronoq-Auth";

pub use crate::task::{parse_duration, parse_time, tolerance_without_start};

/// An integer option given as text (a header, a CLI flag): anything else is
/// `INVALID_ARGUMENT` naming the option.
pub fn parse_int<T: std::str::FromStr>(name: &str, text: &str) -> Result<T, Rejection> {
    text.trim().parse().map_err(|_| {
        Rejection::InvalidArgument(format!("{name}: {} is not an integer", excerpt(text)))
    })
}

fn parse_bool(name: &str, text: &str) -> Result<bool, Rejection> {
    match text.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(Rejection::InvalidArgument(format!(
            "{name}: {} is not true or false",
            excerpt(text)
        ))),
    }
}

/// A task from a plain publish: `headers` yields `(name, value)` pairs.
/// The headers fill a [`SubmitRequest`] (as the JSON of `POST /v1/tasks`
/// would), which becomes the task through the one conversion
/// ([`crate::task::SubmitOptions::into_task`]).
pub fn task_from_headers<'a>(
    pool: &PoolName,
    payload: Bytes,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    now: SystemTime,
) -> Result<Task, Rejection> {
    let mut req = SubmitRequest::default();
    let text = |v: &str| Some(v.to_string());
    for (name, value) in headers {
        let known = SUBMIT_HEADERS
            .iter()
            .find(|h| h.eq_ignore_ascii_case(name))
            .copied();
        match known {
            Some("Cronoq-Labels") => {
                let items = value.split(',').map(str::trim).filter(|s| !s.is_empty());
                for (n, item) in items.enumerate() {
                    if n >= MAX_LABELS {
                        return Err(Rejection::ResourceExhausted(format!(
                            "more than {MAX_LABELS} labels"
                        )));
                    }
                    req.labels.insert_parsed(item)?;
                }
            }
            Some("Cronoq-Priority") => req.priority = Some(parse_int(name, value)?),
            Some("Cronoq-Deadline") => req.deadline = text(value),
            Some("Cronoq-Start-At") => req.start_at = text(value),
            Some("Cronoq-Tolerance") => req.tolerance = text(value),
            Some("Cronoq-Est-Runtime") => req.est_runtime = text(value),
            Some("Cronoq-Max-Attempts") => req.max_attempts = Some(parse_int(name, value)?),
            Some("Cronoq-Attempt-Timeout") => req.attempt_timeout = text(value),
            Some("Cronoq-Backoff") => req.backoff = Some(BackoffRequest::parse(value)?),
            Some("Cronoq-Idempotency-Key") => req.idempotency_key = text(value),
            Some("Cronoq-Fairness-Key") => req.fairness_key = text(value),
            Some("Cronoq-Fairness-Weight") => req.fairness_weight = Some(parse_int(name, value)?),
            Some("Cronoq-Concurrency-Key") => req.concurrency_key = text(value),
            Some("Cronoq-Concurrency-Limit") => {
                req.concurrency_limit = Some(parse_int(name, value)?)
            }
            Some("Cronoq-Concurrency-Policy") => req.concurrency_policy = text(value),
            Some("Cronoq-Preemptible") => req.preemptible = Some(parse_bool(name, value)?),
            _ if name.eq_ignore_ascii_case(TRACEPARENT) => req.traceparent = text(value),
            // The submitter's proof: checked by the leader (crate::auth).
            _ if name.eq_ignore_ascii_case(AUTH_HEADER) => {}
            // `get`, not `[..7]`: a non-ASCII header name has no char
            // boundary at 7 bytes, and slicing there panicked (fuzzing).
            _ if name
                .get(..7)
                .is_some_and(|p| p.eq_ignore_ascii_case("cronoq-")) =>
            {
                return Err(Rejection::InvalidArgument(format!(
                    "unknown header {}; known: {}",
                    excerpt(name),
                    SUBMIT_HEADERS.join(", ")
                )))
            }
            _ => {}
        }
    }
    let mut options = req.into_options(now)?;
    options.payload = payload;
    options.pool = Some(pool.as_str().to_string());
    options.into_task()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn headers_become_options() {
        let pool = PoolName::new("p").unwrap();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let task = task_from_headers(
            &pool,
            Bytes::from_static(b"x"),
            [
                ("Cronoq-Labels", "gpu=a100, zone=eu"),
                ("cronoq-priority", "7"),
                ("Cronoq-Deadline", "30s"),
                ("Nats-Msg-Id", "abc"),
            ],
            now,
        )
        .unwrap();
        assert_eq!(task.required_labels().to_string(), "gpu=a100,zone=eu");
        assert_eq!(task.priority, 7);
        assert_eq!(task.deadline, Some(now + Duration::from_secs(30)));
    }

    /// Issue 7 findings 1 and 8: values that used to panic or pass are
    /// refused with a stable code and a short message.
    #[test]
    fn hostile_header_values_are_refused_not_panicked() {
        use crate::core::ErrorCode;
        let pool = PoolName::new("p").unwrap();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let huge = "x".repeat(1 << 20);
        let many_labels: String = (0..10_000).map(|i| format!("k{i}=v,")).collect();
        let long_key = "k".repeat(crate::core::MAX_KEY_LEN + 1);
        let cases: Vec<(&str, &str, ErrorCode)> = vec![
            (
                "Cronoq-Deadline",
                "10000000000000000000s",
                ErrorCode::INVALID_ARGUMENT,
            ),
            (
                "Cronoq-Start-At",
                "300000000000y",
                ErrorCode::INVALID_ARGUMENT,
            ),
            ("Cronoq-Deadline", "11y", ErrorCode::INVALID_ARGUMENT),
            ("Cronoq-Tolerance", "5s", ErrorCode::INVALID_ARGUMENT),
            (
                "Cronoq-Attempt-Timeout",
                "300000000000y",
                ErrorCode::INVALID_ARGUMENT,
            ),
            (
                "Cronoq-Priority",
                huge.as_str(),
                ErrorCode::INVALID_ARGUMENT,
            ),
            (
                "Cronoq-Labels",
                many_labels.as_str(),
                ErrorCode::RESOURCE_EXHAUSTED,
            ),
            (
                "Cronoq-Idempotency-Key",
                long_key.as_str(),
                ErrorCode::RESOURCE_EXHAUSTED,
            ),
        ];
        for (name, value, code) in cases {
            let refused = task_from_headers(&pool, Bytes::new(), [(name, value)], now)
                .and_then(|t| t.to_spec(crate::core::TaskId(1), 1 << 20).map(|_| ()));
            let e = refused.expect_err(name);
            assert_eq!(e.code(), code, "{name}: {e}");
            assert!(
                e.to_string().len() < 300,
                "{name}: a {} byte message",
                e.to_string().len()
            );
        }
        // Far absolute times parse, and the core refuses them (horizon).
        let t = task_from_headers(
            &pool,
            Bytes::new(),
            [("Cronoq-Deadline", "9999-01-01T00:00:00Z")],
            now,
        )
        .unwrap();
        let spec = t.to_spec(crate::core::TaskId(1), 1 << 20).unwrap();
        let e = spec
            .check_horizon(crate::core::Millis(1_800_000_000_000))
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT);
    }

    #[test]
    fn backoff_is_a_header() {
        let pool = PoolName::new("p").unwrap();
        let now = SystemTime::UNIX_EPOCH;
        let task =
            task_from_headers(&pool, Bytes::new(), [("Cronoq-Backoff", "1s, 1m")], now).unwrap();
        assert_eq!(
            task.backoff,
            Some((Duration::from_secs(1), Duration::from_secs(60)))
        );
        let e = task_from_headers(&pool, Bytes::new(), [("Cronoq-Backoff", "1s")], now);
        assert!(e.is_err());
    }

    #[test]
    fn bad_headers_are_refused() {
        let pool = PoolName::new("p").unwrap();
        let now = SystemTime::UNIX_EPOCH;
        for (k, v) in [
            ("Cronoq-Priority", "high"),
            ("Cronoq-Deadline", "tomorrow"),
            ("Cronoq-Tolerence", "5s"),
        ] {
            let r = task_from_headers(&pool, Bytes::new(), [(k, v)], now);
            assert!(r.is_err(), "{k}: {v}");
        }
        assert_eq!(
            parse_time("2026-12-02T16:00:00Z", now).unwrap(),
            humantime::parse_rfc3339("2026-12-02T16:00:00Z").unwrap()
        );
    }

    #[test]
    fn sharing_headers_become_options() {
        use crate::core::{ConcurrencyPolicy, ErrorCode, TaskId};
        let pool = PoolName::new("p").unwrap();
        let now = SystemTime::UNIX_EPOCH;
        let task = task_from_headers(
            &pool,
            Bytes::new(),
            [
                ("Cronoq-Fairness-Key", "team-a"),
                ("Cronoq-Fairness-Weight", "3"),
                ("Cronoq-Concurrency-Key", "deploy"),
                ("Cronoq-Concurrency-Limit", "2"),
                ("cronoq-concurrency-policy", "skip"),
                ("Cronoq-Preemptible", "false"),
            ],
            now,
        )
        .unwrap();
        let spec = task.to_spec(TaskId(1), 16).unwrap();
        assert_eq!(spec.fairness_key.as_deref(), Some("team-a"));
        assert_eq!(spec.fairness_weight, 3);
        assert_eq!(spec.concurrency_key.as_deref(), Some("deploy"));
        assert_eq!(spec.concurrency_limit, 2);
        assert_eq!(spec.concurrency_policy, ConcurrencyPolicy::Skip);
        assert!(!spec.preemptible);
        for (name, value) in [
            ("Cronoq-Fairness-Weight", "heavy"),
            ("Cronoq-Fairness-Weight", "-1"),
            ("Cronoq-Fairness-Weight", "0"),
            ("Cronoq-Concurrency-Limit", "0"),
            ("Cronoq-Concurrency-Policy", "later"),
            ("Cronoq-Preemptible", "no"),
        ] {
            let e = task_from_headers(&pool, Bytes::new(), [(name, value)], now)
                .and_then(|t| t.to_spec(TaskId(1), 16).map(|_| ()))
                .unwrap_err();
            assert_eq!(
                e.code(),
                ErrorCode::INVALID_ARGUMENT,
                "{name}: {value}: {e}"
            );
        }
    }
}

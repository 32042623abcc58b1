//! Plain-publish submissions: raw body = payload, options in `Cronoq-*`
//! headers; and the text forms of times and durations shared with the CLI.
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
//! | `Cronoq-Idempotency-Key` | text (`Nats-Msg-Id` de-duplicates too) |
//!
//! Any other `Cronoq-*` header is refused, so a typo does not pass silently.

use std::time::{Duration, SystemTime};

use bytes::Bytes;

use crate::core::{PoolName, Rejection};
use crate::task::Task;

/// The `Cronoq-*` headers a plain publish may carry.
pub const SUBMIT_HEADERS: [&str; 9] = [
    "Cronoq-Labels",
    "Cronoq-Priority",
    "Cronoq-Deadline",
    "Cronoq-Start-At",
    "Cronoq-Tolerance",
    "Cronoq-Est-Runtime",
    "Cronoq-Max-Attempts",
    "Cronoq-Attempt-Timeout",
    "Cronoq-Idempotency-Key",
];

/// Parses `30s`, `5m`, `1h 30m`, `250ms`.
pub fn parse_duration(text: &str) -> Result<Duration, Rejection> {
    humantime::parse_duration(text.trim())
        .map_err(|e| Rejection::InvalidArgument(format!("duration {text:?}: {e}")))
}

/// Parses an RFC 3339 time, or a duration meaning "that long after `now`".
pub fn parse_time(text: &str, now: SystemTime) -> Result<SystemTime, Rejection> {
    let text = text.trim();
    if let Ok(t) = humantime::parse_rfc3339_weak(text) {
        return Ok(t);
    }
    match humantime::parse_duration(text) {
        Ok(d) => Ok(now + d),
        Err(_) => Err(Rejection::InvalidArgument(format!(
            "time {text:?} is neither RFC 3339 (2026-12-02T16:00:00Z) nor a duration from now (30s)"
        ))),
    }
}

fn parse_int<T: std::str::FromStr>(name: &str, text: &str) -> Result<T, Rejection> {
    text.trim()
        .parse()
        .map_err(|_| Rejection::InvalidArgument(format!("{name}: {text:?} is not an integer")))
}

/// A task from a plain publish: `headers` yields `(name, value)` pairs.
pub fn task_from_headers<'a>(
    pool: &PoolName,
    payload: Bytes,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    now: SystemTime,
) -> Result<Task, Rejection> {
    let mut task = Task::new(payload).pool(pool.as_str());
    let mut start_at = None;
    let mut tolerance = Duration::ZERO;
    for (name, value) in headers {
        let known = SUBMIT_HEADERS
            .iter()
            .find(|h| h.eq_ignore_ascii_case(name))
            .copied();
        match known {
            Some("Cronoq-Labels") => {
                for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    task = task.label_text(item);
                }
            }
            Some("Cronoq-Priority") => task = task.priority(parse_int(name, value)?),
            Some("Cronoq-Deadline") => task = task.deadline(parse_time(value, now)?),
            Some("Cronoq-Start-At") => start_at = Some(parse_time(value, now)?),
            Some("Cronoq-Tolerance") => tolerance = parse_duration(value)?,
            Some("Cronoq-Est-Runtime") => task = task.est_runtime(parse_duration(value)?),
            Some("Cronoq-Max-Attempts") => task = task.max_attempts(parse_int(name, value)?),
            Some("Cronoq-Attempt-Timeout") => task = task.attempt_timeout(parse_duration(value)?),
            Some("Cronoq-Idempotency-Key") => task = task.idempotency_key(value),
            _ if name.len() >= 7 && name[..7].eq_ignore_ascii_case("cronoq-") => {
                return Err(Rejection::InvalidArgument(format!(
                    "unknown header {name}; known: {}",
                    SUBMIT_HEADERS.join(", ")
                )))
            }
            _ => {}
        }
    }
    if let Some(at) = start_at {
        task = task.start_at(at, tolerance);
    }
    Ok(task)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

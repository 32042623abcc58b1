//! The wire: every message cronoq components exchange over NATS, their
//! subjects, and how they are encoded. The only module that knows
//! MessagePack.
//!
//! Bodies are MessagePack maps (`rmp_serde::to_vec_named`), so a reader
//! ignores fields it does not know and defaults fields it misses; every
//! message carries the protocol version `v`. Replies are
//! [`Reply::Ok`] or [`Reply::Error`] with a stable [`ErrorCode`].
//! `proto-schemas/` holds the AsyncAPI document and JSON Schemas generated
//! from these types (their `JsonSchema` impls, [`Subjects`],
//! [`SUBMIT_HEADERS`], `ErrorCode::ALL`) by the `proto_schemas` test's
//! generator (`tests/proto_gen/`), which fails when the checked-in files
//! differ (regenerate with `UPDATE_SCHEMAS=1 cargo test --test
//! proto_schemas`).

mod headers;
mod login;
mod messages;
mod schema;
mod subjects;

pub use headers::*;
pub use login::{check_inbox_prefix, LoadedLogin, NatsLogin};
pub use messages::*;
pub use subjects::*;

pub(crate) use schema::mirrored_schema;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::core::{ErrorCode, Rejection};

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 1;

/// `Content-Type` of a MessagePack [`Submit`] body; a submission without it
/// is a plain publish (raw body = payload, options in `Cronoq-*` headers).
pub const SUBMIT_CONTENT_TYPE: &str = "application/vnd.cronoq.submit+msgpack";

/// The NATS servers of a `--nats` value: one URL, or several separated by
/// commas (the nodes of a cluster; the client picks one and fails over).
///
/// ```
/// let list = cronoq::wire::server_list("nats://a:4222, nats://b:4222");
/// assert_eq!(list, ["nats://a:4222", "nats://b:4222"]);
/// ```
pub fn server_list(urls: &str) -> Vec<String> {
    urls.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_string)
        .collect()
}

/// Encodes a message as a MessagePack map.
pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    // Most messages (a lease, an event, a task record) fit in this: one
    // allocation instead of a doubling from 8 bytes up, message after
    // message on the leader's hot path.
    let mut body = Vec::with_capacity(ENCODE_CAPACITY);
    rmp_serde::encode::write_named(&mut body, message).expect("wire messages always serialize");
    body
}

/// The buffer [`encode`] starts with.
const ENCODE_CAPACITY: usize = 256;

/// Decodes a MessagePack message; a malformed body is `INVALID_ARGUMENT`.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, WireError> {
    rmp_serde::from_slice(body).map_err(|e| WireError {
        code: ErrorCode::INVALID_ARGUMENT,
        message: format!("malformed message: {e}"),
    })
}

/// Decodes a request and refuses a protocol version this build does not
/// speak (`FAILED_PRECONDITION`), so an old leader tells a newer worker
/// why rather than misreading it.
pub fn decode_request<T: DeserializeOwned>(body: &[u8]) -> Result<T, WireError> {
    #[derive(serde::Deserialize)]
    struct Version {
        #[serde(default = "current")]
        v: u16,
    }
    fn current() -> u16 {
        PROTOCOL_VERSION
    }
    // As cronoq encodes a request (`v` first, a version spoken here): one
    // decode. A body that then fails to decode, and every other body, is
    // read the checked way below (the same answer, the same error).
    if first_key_version(body).is_some_and(|v| v != 0 && v <= PROTOCOL_VERSION) {
        if let Ok(request) = rmp_serde::from_slice(body) {
            return Ok(request);
        }
    }
    let version: Version = decode(body)?;
    if version.v == 0 || version.v > PROTOCOL_VERSION {
        return Err(WireError {
            code: ErrorCode::FAILED_PRECONDITION,
            message: format!(
                "protocol version {} is not supported (this server speaks 1..={PROTOCOL_VERSION})",
                version.v
            ),
        });
    }
    decode(body)
}

/// Encodes a reply.
pub fn encode_reply<T: Serialize>(reply: &Result<T, WireError>) -> Vec<u8> {
    match reply {
        Ok(body) => encode(&Reply::Ok(body)),
        Err(e) => encode(&Reply::<&T>::Error(e.clone())),
    }
}

/// Decodes a reply into a result.
pub fn decode_reply<T: DeserializeOwned>(body: &[u8]) -> Result<T, WireError> {
    match decode::<Reply<T>>(body)? {
        Reply::Ok(t) => Ok(t),
        Reply::Error(e) => Err(e),
    }
}

impl From<Rejection> for WireError {
    fn from(r: Rejection) -> WireError {
        WireError {
            code: r.code(),
            message: r.to_string(),
        }
    }
}

/// The subject, headers and body of a MessagePack submission of `task`
/// (`Nats-Msg-Id` = its idempotency key, so JetStream de-duplicates).
/// The task must have been validated (`Task::to_spec`) first.
pub fn submission(
    subjects: &Subjects,
    task: &crate::task::Task,
) -> Result<(String, async_nats::HeaderMap, bytes::Bytes), Rejection> {
    submission_with_msg_id(subjects, task, task.key())
}

/// [`submission`] with `Nats-Msg-Id` as given (a client acting as a
/// credential scopes the key to it): the one encoder of every submission
/// (the leader's own and every client's), so the idempotency key is
/// checked ([`crate::task::check_key`]) before anything is published.
pub fn submission_with_msg_id(
    subjects: &Subjects,
    task: &crate::task::Task,
    msg_id: Option<&str>,
) -> Result<(String, async_nats::HeaderMap, bytes::Bytes), Rejection> {
    let pool = crate::core::PoolName::new(task.pool_name())?;
    if let Some(key) = task.key() {
        crate::task::check_key(key)?;
    }
    let mut headers = async_nats::HeaderMap::new();
    // A static name: no copy of it per submission (the same custom header
    // as the text `"Content-Type"` makes).
    headers.insert(
        async_nats::header::HeaderName::from_static("Content-Type"),
        SUBMIT_CONTENT_TYPE,
    );
    if let Some(id) = msg_id {
        headers.insert("Nats-Msg-Id", id);
    }
    let body = encode(&Submit::from_task(task));
    Ok((subjects.submit(&pool), headers, body.into()))
}

/// Decodes a message of the submit stream: MessagePack when its
/// `Content-Type` says so, else a plain publish (raw payload, `Cronoq-*`
/// headers, relative times counted from `published`).
pub fn decode_submission(
    subjects: &Subjects,
    subject: &str,
    headers: Option<&async_nats::HeaderMap>,
    payload: bytes::Bytes,
    published: std::time::SystemTime,
) -> (crate::core::PoolName, Result<crate::task::Task, WireError>) {
    let pool = match subjects.pool_of_submit(subject) {
        Ok(p) => p,
        Err(e) => return (crate::core::PoolName::default(), Err(e.into())),
    };
    let is_msgpack = headers
        .and_then(|h| h.get("Content-Type"))
        .is_some_and(|v| v.as_str() == SUBMIT_CONTENT_TYPE);
    let task = if is_msgpack {
        decode_request::<Submit>(&payload).and_then(|s| s.into_task(&pool).map_err(WireError::from))
    } else {
        let pairs: Vec<(String, String)> = headers
            .map(|h| {
                h.iter()
                    .flat_map(|(name, values)| {
                        values
                            .iter()
                            .map(move |v| (name.to_string(), v.as_str().to_string()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        task_from_headers(
            &pool,
            payload,
            pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            published,
        )
        .map_err(WireError::from)
    };
    (pool, task)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Millis, TaskId};

    fn attempt(n: u32, ended: bool) -> crate::task::AttemptRecord {
        crate::task::AttemptRecord {
            attempt: n,
            group: crate::core::Labels::new(),
            worker: Some("w".into()),
            credential: None,
            started_at: Millis(n as u64),
            ended_at: ended.then_some(Millis(n as u64 + 1)),
            outcome: ended.then(|| "failed".into()),
            error: None,
        }
    }

    fn record(attempts: Vec<crate::task::AttemptRecord>, written: u64) -> TaskRecord {
        TaskRecord {
            v: PROTOCOL_VERSION,
            id: TaskId(9),
            pool: crate::core::PoolName::default(),
            state: crate::core::TaskState::Queued,
            attempts,
            output: None,
            error: None,
            deadline_missed: false,
            written_at: Some(Millis(written)),
            schedule: None,
            scheduled_at: None,
            key: None,
        }
    }

    /// A MessagePack submission `body` to pool `p`, decoded as the
    /// consumer decodes it.
    fn decode_with(body: Vec<u8>) -> Result<crate::task::Task, WireError> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Content-Type", SUBMIT_CONTENT_TYPE);
        decode_submission(
            &Subjects::default(),
            "cronoq.submit.p",
            Some(&headers),
            body.into(),
            std::time::SystemTime::UNIX_EPOCH,
        )
        .1
    }

    fn start(n: u32) -> StartRecord {
        StartRecord {
            id: TaskId(9),
            pool: crate::core::PoolName::default(),
            attempt: attempt(n, false),
        }
    }

    /// A start counts only as the attempt right after the last one the
    /// task's own record holds, once that one has ended.
    #[test]
    fn a_start_merges_only_after_the_last_ended_attempt() {
        let fresh = TaskRecord::with_start(None, &start(1), Millis(50)).unwrap();
        assert_eq!(fresh.state, crate::core::TaskState::Running);
        assert_eq!(fresh.attempts, vec![attempt(1, false)]);
        assert_eq!(fresh.written_at, Some(Millis(50)));
        assert_eq!(TaskRecord::with_start(None, &start(2), Millis(50)), None);

        let one_ended = record(vec![attempt(1, true)], 40);
        let merged = TaskRecord::with_start(Some(&one_ended), &start(2), Millis(50)).unwrap();
        assert_eq!(merged.attempts, vec![attempt(1, true), attempt(2, false)]);
        assert_eq!(merged.written_at, Some(Millis(40)), "the older write");
        // Stale: its end (or a later attempt) is in the record.
        assert_eq!(
            TaskRecord::with_start(Some(&one_ended), &start(1), Millis(50)),
            None
        );
        assert_eq!(
            TaskRecord::with_start(Some(&one_ended), &start(3), Millis(50)),
            None
        );
        // The record's last attempt still runs: not a successor of it.
        let running = record(vec![attempt(1, false)], 40);
        assert_eq!(
            TaskRecord::with_start(Some(&running), &start(2), Millis(50)),
            None
        );
        let mut done = one_ended.clone();
        done.state = crate::core::TaskState::Failed;
        assert_eq!(
            TaskRecord::with_start(Some(&done), &start(2), Millis(50)),
            None
        );
    }

    /// A journal record too large for one NATS message is cut until it
    /// fits (NATS would refuse it for good and the journal would wait on
    /// it): long errors first, then the attempts between the first and the
    /// last 16 (numbers kept), then all but the last, then the output.
    #[test]
    fn a_record_too_large_for_a_nats_message_is_cut_to_fit() {
        let limit = 1 << 20;
        let failed = |n: u32, error_len: usize| crate::task::AttemptRecord {
            error: Some("e".repeat(error_len)),
            ..attempt(n, true)
        };
        let encoded = |r: &TaskRecord| encode(r).len();

        let mut small = record(vec![failed(1, 10)], 1);
        assert!(!small.fit(limit), "a small record is left alone");

        // Three 400 KB errors: cut to RECORD_ERROR_CHARS each.
        let mut errors = record((1..=3).map(|n| failed(n, 400_000)).collect(), 1);
        assert!(errors.fit(limit));
        assert!(encoded(&errors) <= limit);
        assert_eq!(errors.attempts.len(), 3);
        let kept = errors.attempts[0].error.as_ref().unwrap();
        assert_eq!(
            kept.chars().count(),
            RECORD_ERROR_CHARS + 1,
            "cut, with an ellipsis"
        );

        // 20,000 attempts: the first and the last 16, numbers kept.
        let mut many = record((1..=20_000).map(|n| failed(n, 100)).collect(), 1);
        assert!(many.fit(limit));
        assert!(encoded(&many) <= limit);
        let numbers: Vec<u32> = many.attempts.iter().map(|a| a.attempt).collect();
        assert_eq!(numbers[0], 1);
        assert_eq!(numbers[1..], (19_985..=20_000).collect::<Vec<u32>>()[..]);

        // An output just under the limit beside earlier failures: only the
        // last attempt stays, the output is kept.
        let mut output = record(
            vec![failed(1, 4_000), failed(2, 4_000), attempt(3, true)],
            1,
        );
        output.state = crate::core::TaskState::Succeeded;
        output.output = Some(bytes::Bytes::from(vec![b'x'; limit - 1_000]));
        assert!(output.fit(limit));
        assert!(encoded(&output) <= limit);
        assert_eq!(output.output.as_ref().map(|o| o.len()), Some(limit - 1_000));
        assert_eq!(output.attempts.len(), 1);
        assert_eq!(output.attempts[0].attempt, 3);

        // An output that cannot fit at all: dropped, and the error says so.
        let mut huge = record(vec![attempt(1, true)], 1);
        huge.output = Some(bytes::Bytes::from(vec![b'x'; limit + 1]));
        assert!(huge.fit(limit));
        assert!(encoded(&huge) <= limit);
        assert!(huge.output.is_none());
        assert!(huge.error.as_deref().unwrap().contains("could not be kept"));
    }

    #[test]
    fn the_start_index_follows_each_slots_latest_message() {
        let mut index = StartIndex::default();
        let sheet = |starts| StartRecords {
            v: PROTOCOL_VERSION,
            written_at: Millis(50),
            starts,
        };
        index.set(3, Some(sheet(vec![start(1)])));
        let (merged, slot) = index.merge(TaskId(9), None);
        assert_eq!((merged.map(|r| r.attempts.len()), slot), (Some(1), Some(3)));
        assert_eq!(index.merge(TaskId(8), None), (None, None));
        // Slot 3 written again without task 9: its entry is gone.
        index.set(3, Some(sheet(vec![])));
        assert_eq!(index.merge(TaskId(9), None), (None, None));
        // Two slots name the task: the one that follows its record counts.
        index.set(1, Some(sheet(vec![start(1)])));
        index.set(2, Some(sheet(vec![start(2)])));
        let one_ended = record(vec![attempt(1, true)], 40);
        let (merged, slot) = index.merge(TaskId(9), Some(one_ended));
        assert_eq!((merged.map(|r| r.attempts.len()), slot), (Some(2), Some(2)));
        index.set(2, None);
        assert_eq!(index.len(), 2);
        assert_eq!(parse_start_key(&start_key(17)), Some(17));
        assert!(is_result_key(&result_key(3, 17)));
        for key in ["r.", "r.1", "r.1.", "r..1", "r.a.1", "r.1.1.1", "s.1", "17"] {
            assert!(!is_result_key(key), "{key}");
        }
        for key in ["s.", "s.01", "s.x", "17", "s.-1", "_leader"] {
            assert_eq!(parse_start_key(key), None, "{key}");
        }
    }

    #[test]
    fn requests_of_an_unknown_protocol_version_are_refused() {
        let ok = encode(&Ack::default());
        assert!(decode_request::<Ack>(&ok).is_ok());
        let newer = encode(&Ack {
            v: PROTOCOL_VERSION + 1,
        });
        let err = decode_request::<Ack>(&newer).unwrap_err();
        assert_eq!(err.code, ErrorCode::FAILED_PRECONDITION);
        let garbage = decode_request::<Ack>(b"\xc1").unwrap_err();
        assert_eq!(garbage.code, ErrorCode::INVALID_ARGUMENT);
    }

    /// `schedule` and `scheduled_at` travel in the submission, the lease,
    /// the journal record and the status, absent when not set (so what
    /// older builds wrote still decodes and what they read is unchanged).
    #[test]
    fn schedule_fields_round_trip_and_old_messages_still_decode() {
        let at = Millis(1_796_443_200_000);
        // Submission.
        let fired = crate::task::Task::new("x").scheduled("nightly", at);
        let task = decode_with(encode(&Submit::from_task(&fired))).unwrap();
        assert_eq!(
            (task.schedule_name(), task.scheduled_at()),
            (Some("nightly"), Some(at))
        );
        let plain = Submit::from_task(&crate::task::Task::new("x"));
        assert_eq!(plain.schedule, None);
        let task = decode_with(encode(&plain)).unwrap();
        assert_eq!(task.schedule_name(), None);
        // What an older build sends is exactly the plain encoding: no key.
        assert!(!encode(&plain).windows(8).any(|w| w == b"schedule"));
        // Half given, or a bad name: refused.
        for (schedule, scheduled_at) in [
            (Some("nightly".to_string()), None),
            (None, Some(at)),
            (Some("bad name!".to_string()), Some(at)),
        ] {
            let e = decode_with(encode(&Submit {
                schedule,
                scheduled_at,
                ..plain.clone()
            }))
            .unwrap_err();
            assert_eq!(e.code, ErrorCode::INVALID_ARGUMENT, "{}", e.message);
        }

        // Lease: with the fields, and as an older leader sent it.
        #[derive(serde::Serialize)]
        struct OldLease {
            v: u16,
            task_id: TaskId,
            attempt: u32,
            pool: crate::core::PoolName,
            group: crate::core::Labels,
            payload: bytes::Bytes,
            ttl: Millis,
            epoch: u64,
        }
        let old = OldLease {
            v: PROTOCOL_VERSION,
            task_id: TaskId(3),
            attempt: 1,
            pool: crate::core::PoolName::default(),
            group: crate::core::Labels::new(),
            payload: bytes::Bytes::from_static(b"p"),
            ttl: Millis(1000),
            epoch: 2,
        };
        let lease: Lease = decode(&encode(&old)).unwrap();
        assert_eq!(
            (lease.schedule.as_deref(), lease.scheduled_at),
            (None, None)
        );
        let with = Lease {
            schedule: Some("nightly".into()),
            scheduled_at: Some(at),
            ..lease.clone()
        };
        assert_eq!(decode::<Lease>(&encode(&with)).unwrap(), with);
        assert_eq!(
            encode(&lease).len(),
            encode(&old).len(),
            "nothing added when absent"
        );

        // Journal record and status.
        let mut r = record(vec![attempt(1, true)], 5);
        assert_eq!(decode::<TaskRecord>(&encode(&r)).unwrap().schedule(), None);
        r.schedule = Some("nightly".into());
        r.scheduled_at = Some(at);
        let back = TaskRecord::decode(&encode(&r)).unwrap();
        assert_eq!(back.schedule(), Some(("nightly".to_string(), at)));
        let status = back.into_status();
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["schedule"], "nightly");
        assert_eq!(json["scheduled_at"], "2026-12-05T04:00:00Z");
        let again: crate::task::TaskStatus = serde_json::from_value(json).unwrap();
        assert_eq!(again, status);
        let msgpack: crate::task::TaskStatus = decode(&encode(&status)).unwrap();
        assert_eq!(msgpack, status);
        // Milliseconds are read too; absent fields stay out of the JSON.
        let mut json = serde_json::to_value(&status).unwrap();
        json["scheduled_at"] = serde_json::json!(at.0);
        let from_ms: crate::task::TaskStatus = serde_json::from_value(json).unwrap();
        assert_eq!(from_ms.scheduled_at, Some(at));
        let plain = record(vec![], 5).into_status();
        let json = serde_json::to_string(&plain).unwrap();
        assert!(!json.contains("schedule"), "{json}");
    }

    /// Issue 7 finding 8: a MessagePack submission gets the same checks as
    /// every other path: protocol version, unknown fields, a tolerance
    /// without a start.
    #[test]
    fn msgpack_submissions_are_checked_like_every_other_path() {
        let good = Submit::from_task(&crate::task::Task::new("x"));
        assert!(decode_with(encode(&good)).is_ok());
        for v in [0, PROTOCOL_VERSION + 1] {
            let e = decode_with(encode(&Submit { v, ..good.clone() })).unwrap_err();
            assert_eq!(e.code, ErrorCode::FAILED_PRECONDITION, "v={v}");
        }
        let e = decode_with(encode(&Submit {
            tolerance: Some(crate::core::Millis(5_000)),
            ..good.clone()
        }))
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_ARGUMENT);
        #[derive(serde::Serialize)]
        struct WithExtra {
            v: u16,
            payload: bytes::Bytes,
            surprise: u32,
        }
        let e = decode_with(encode(&WithExtra {
            v: PROTOCOL_VERSION,
            payload: bytes::Bytes::new(),
            surprise: 1,
        }))
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_ARGUMENT);
        assert!(e.message.contains("surprise"), "{}", e.message);
    }
}

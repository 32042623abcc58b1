//! Message bodies. Each is a MessagePack map with the protocol version `v`.
//! Here: errors and replies, submissions and the client API's requests;
//! the worker protocol is in `worker.rs`, what the leader stores in
//! `records.rs`, the schedule requests in `schedules.rs`.

use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::core::{Backoff, ErrorCode, Labels, Millis, PoolName, TaskId, TaskState};
use crate::task::Task;

mod records;
mod schedules;
mod worker;

pub use records::*;
pub use schedules::*;
pub use worker::*;

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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Millis>,
    /// Fixed start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<Millis>,
    /// How late a fixed start may still start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<Millis>,
    /// Declared run time (lets the task backfill reserved slots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub est_runtime: Option<Millis>,
    /// Attempts in all; the pool's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Backoff between attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<Backoff>,
    /// Longest run of one attempt; past it the attempt counts as lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_timeout: Option<Millis>,
    /// De-duplicates resubmissions (also sent as `Nats-Msg-Id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The submitter's W3C trace context (`00-<trace id>-<parent id>-<flags>`),
    /// handed to every attempt. Absent when not given (older servers refuse
    /// the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The schedule that fired it (only the leader fires schedules: with
    /// auth on the submission must carry the leader's fire seal). Absent
    /// when not fired by one; with `scheduled_at` or not at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// The tick it was fired for, ms since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_at: Option<Millis>,
    /// Fairness key (SPEC §9), 1 to 64 bytes. With auth on, defaults to
    /// the credential's name; another key only if the credential's
    /// `fairness_keys` lists it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fairness_key: Option<String>,
    /// Weight of the fairness key, 1 to 1,000 (ignored with auth on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fairness_weight: Option<u32>,
    /// Concurrency key, 1 to 128 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// At most this many of the key's tasks run at once (≥ 1, default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_limit: Option<u32>,
    /// `queue` (default), `replace_waiting`, `cancel_running` or `skip`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_policy: Option<String>,
    /// Whether higher-priority work may preempt it (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemptible: Option<bool>,
}

impl Submit {
    /// The wire form of a [`Task`] (its pool goes in the subject).
    pub fn from_task(task: &Task) -> Submit {
        Submit {
            v: v(),
            labels: task.labels.clone(),
            payload: task.payload.clone(),
            priority: task.priority,
            deadline: task.deadline.map(Millis::since_epoch),
            start_at: task.start_at.map(Millis::since_epoch),
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
            schedule: task.schedule.as_ref().map(|(name, _)| name.clone()),
            scheduled_at: task.schedule.as_ref().map(|(_, at)| *at),
            fairness_key: task.fairness_key_name().map(str::to_string),
            fairness_weight: task.sharing.as_ref().and_then(|s| s.fairness_weight),
            concurrency_key: task.concurrency_key_name().map(str::to_string),
            concurrency_limit: task.sharing.as_ref().and_then(|s| s.concurrency_limit),
            concurrency_policy: task
                .sharing
                .as_ref()
                .and_then(|s| s.concurrency_policy)
                .map(|p| p.as_str().to_string()),
            preemptible: task.sharing.as_ref().and_then(|s| s.preemptible),
        }
    }

    /// Back to a [`Task`] for `pool`, through the one conversion of
    /// submission options ([`crate::task::SubmitOptions::into_task`]), so
    /// a tolerance without a start or a bad key is refused as on every
    /// other path.
    pub fn into_task(self, pool: &PoolName) -> Result<Task, crate::core::Rejection> {
        // Saturating: a far time is refused by the core's horizon check,
        // never an overflow here.
        let at = |m: Millis| {
            UNIX_EPOCH
                .checked_add(Duration::from_millis(m.0))
                .unwrap_or(UNIX_EPOCH + Duration::from_secs(i32::MAX as u64 * 1000))
        };
        let schedule = schedule_fields(self.schedule, self.scheduled_at)?;
        let mut task = crate::task::SubmitOptions {
            payload: self.payload,
            pool: Some(pool.as_str().to_string()),
            labels: self.labels,
            priority: Some(self.priority),
            deadline: self.deadline.map(at),
            start_at: self.start_at.map(at),
            tolerance: self.tolerance.map(Millis::to_duration),
            max_attempts: self.max_attempts,
            attempt_timeout: self.attempt_timeout.map(Millis::to_duration),
            est_runtime: self.est_runtime.map(Millis::to_duration),
            backoff: self
                .backoff
                .map(|b| (b.initial.to_duration(), b.max.to_duration())),
            idempotency_key: self.idempotency_key,
            traceparent: self.traceparent,
            fairness_key: self.fairness_key,
            fairness_weight: self.fairness_weight,
            concurrency_key: self.concurrency_key,
            concurrency_limit: self.concurrency_limit,
            concurrency_policy: self
                .concurrency_policy
                .as_deref()
                .map(crate::core::ConcurrencyPolicy::parse)
                .transpose()?,
            preemptible: self.preemptible,
        }
        .into_task()?;
        task.schedule = schedule;
        Ok(task)
    }
}

/// The schedule fields of a message, checked: both or neither, a valid
/// schedule name.
pub(crate) fn schedule_fields(
    schedule: Option<String>,
    scheduled_at: Option<Millis>,
) -> Result<Option<(String, Millis)>, crate::core::Rejection> {
    match (schedule, scheduled_at) {
        (None, None) => Ok(None),
        (Some(name), Some(at)) => {
            crate::schedule::check_schedule_name(&name)?;
            Ok(Some((name, at)))
        }
        _ => Err(crate::core::Rejection::InvalidArgument(
            "schedule and scheduled_at go together: give both or neither".into(),
        )),
    }
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

/// Ask for a page of a task's output (request on `P.api.task_output`):
/// what a status too large for one NATS message leaves out
/// (`TaskStatus::output_size`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GetTaskOutput {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The task.
    pub task_id: TaskId,
    /// The first byte wanted.
    pub offset: u64,
    /// The most bytes wanted (the leader sends fewer when a page would
    /// not fit one NATS message).
    pub limit: u64,
}

/// A page of a task's output (reply to `P.api.task_output`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TaskOutputPage {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The output's size in bytes.
    pub total: u64,
    /// The bytes from `offset` on (empty past the end).
    #[schemars(with = "Vec<u8>")]
    pub data: bytes::Bytes,
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

/// The protocol version of a request as cronoq encodes it: a MessagePack
/// map whose first key is `v` with a small value. `None` for anything
/// else (the version is then read by a full decode).
pub(crate) fn first_key_version(body: &[u8]) -> Option<u16> {
    let (&marker, rest) = body.split_first()?;
    let rest = match marker {
        0x81..=0x8f => rest,
        0xde => rest.get(2..)?,
        0xdf => rest.get(4..)?,
        _ => return None,
    };
    match rest {
        [0xa1, b'v', v @ 0x00..=0x7f, ..] => Some(u16::from(*v)),
        _ => None,
    }
}

/// A [`TaskEvent`] encoded from borrowed fields: the same MessagePack map
/// (same fields, same order), without cloning the pool, group and worker
/// the leader announces.
#[derive(Serialize)]
pub(crate) struct TaskEventRef<'a> {
    pub v: u16,
    pub task_id: TaskId,
    pub pool: &'a PoolName,
    pub state: TaskState,
    pub attempt: u32,
    pub group: Option<&'a Labels>,
    pub worker: Option<&'a str>,
    pub at: Millis,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_from_an_outcome_moved_equals_one_copied() {
        let attempt = crate::task::AttemptRecord {
            attempt: 1,
            group: Labels::parse("gpu=a100").unwrap(),
            worker: Some("w".into()),
            credential: Some("token:T".into()),
            started_at: Millis(5),
            ended_at: Some(Millis(9)),
            outcome: Some("succeeded".into()),
            error: None,
        };
        for schedule in [None, Some(("nightly".to_string(), Millis(3)))] {
            let outcome = crate::task::Outcome {
                id: TaskId(7),
                pool: PoolName::new("p").unwrap(),
                state: TaskState::Succeeded,
                output: Some(Bytes::from_static(b"out")),
                error: Some("e".into()),
                attempts: vec![attempt.clone()],
                deadline_missed: true,
                schedule,
            };
            assert_eq!(
                TaskRecord::of_outcome(&outcome),
                TaskRecord::from_outcome(outcome)
            );
        }
    }

    #[test]
    fn the_version_is_read_from_a_first_key_v_only() {
        let cancel = Cancel {
            v: 1,
            task_id: TaskId(3),
        };
        assert_eq!(first_key_version(&crate::wire::encode(&cancel)), Some(1));
        let report = AttemptReports {
            v: 1,
            worker_id: "w".into(),
            reports: Vec::new(),
        };
        assert_eq!(first_key_version(&crate::wire::encode(&report)), Some(1));
        // Not first, absent, not a map, empty: read the slow way.
        #[derive(Serialize)]
        struct Late {
            task_id: u64,
            v: u16,
        }
        let late = crate::wire::encode(&Late { task_id: 1, v: 1 });
        assert_eq!(first_key_version(&late), None);
        assert_eq!(first_key_version(&[0x80]), None);
        assert_eq!(first_key_version(&[0x91, 0x01]), None);
        assert_eq!(first_key_version(&[]), None);
        assert_eq!(
            first_key_version(&[0x81, 0xa1, b'v', 0xcd, 0x01, 0x00]),
            None
        );
        // Such bodies still decode the same way.
        let decoded: Cancel = crate::wire::decode_request(&crate::wire::encode(&cancel)).unwrap();
        assert_eq!(decoded, cancel);
    }

    #[test]
    fn a_borrowed_task_event_encodes_as_the_owned_one() {
        let pool = PoolName::new("p").unwrap();
        let labels = Labels::parse("gpu=a100").unwrap();
        for (group, worker) in [
            (None, None),
            (Some(labels.clone()), Some("w-1".to_string())),
        ] {
            let owned = TaskEvent {
                v: crate::wire::PROTOCOL_VERSION,
                task_id: TaskId(42),
                pool: pool.clone(),
                state: TaskState::Running,
                attempt: 3,
                group: group.clone(),
                worker: worker.clone(),
                at: Millis(1_700_000_000_000),
            };
            let borrowed = TaskEventRef {
                v: owned.v,
                task_id: owned.task_id,
                pool: &pool,
                state: owned.state,
                attempt: owned.attempt,
                group: group.as_ref(),
                worker: worker.as_deref(),
                at: owned.at,
            };
            assert_eq!(crate::wire::encode(&owned), crate::wire::encode(&borrowed));
        }
    }
}

//! A task's life as spans, built from what the scheduler recorded — never
//! from a clock read when the span is made.
//!
//! The leader's driver and the embedded scheduler are state machines fed
//! `now`; they create no span. When a task finishes they hand over a
//! [`TaskTrace`] (plain data: submit and finish times, the reason each
//! wait began with, the ledger's attempt records with their times), and
//! the exporter's own task turns it into spans with those timestamps:
//!
//! ```text
//! submitter's span (traceparent)            ← or none: the task span is a root
//! └─ cronoq.task          submitted → finished     cronoq.outcome
//!    ├─ cronoq.queued     before attempt 1         cronoq.wait_reason
//!    ├─ cronoq.attempt    attempt 1: leased → ended (the worker's spans below it)
//!    ├─ cronoq.queued     before attempt 2         (backoff, …)
//!    └─ cronoq.attempt    attempt 2
//! ```
//!
//! **Ids are derived, not drawn.** Each span's id is a hash of the trace
//! id, the task id, what the span is and the attempt number, salted per
//! installation (a leader: the submit stream's creation time; embedded: a
//! random number per scheduler). So the id of attempt 2's span is known
//! when its lease goes out (the worker's span names it as parent, and the
//! worker's command gets it in `TRACEPARENT` if the worker exports
//! nothing), and whichever leader sees the task finish — the one that
//! leased it or a successor — emits the same ids. A task submitted without
//! a traceparent gets a trace id the same way.
//!
//! A submitter's traceparent whose sampled flag is off is obeyed: no span
//! is exported for that task, and its attempts see the submitter's
//! traceparent unchanged.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use sha2::{Digest, Sha256};

use crate::core::{Millis, PoolName, TaskId, TaskState, WaitReason};
use crate::task::AttemptRecord;

/// How spans of one installation are told apart (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceSalt(pub u64);

impl TraceSalt {
    /// A salt from what names an installation (hashed).
    pub fn derive(parts: &[&[u8]]) -> TraceSalt {
        let mut salt = [0; 8];
        salt.copy_from_slice(&digest(parts)[..8]);
        TraceSalt(u64::from_be_bytes(salt))
    }
}

/// A task's trace: the trace it belongs to and the span it hangs under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskTraceIds {
    salt: TraceSalt,
    task: TaskId,
    trace_id: [u8; 16],
    /// The submitter's span; `None`: the task span is a root.
    parent: Option<[u8; 8]>,
}

/// What a span stands for, in the hash of its id.
#[derive(Clone, Copy)]
enum Kind {
    Task = 1,
    Queued = 2,
    Attempt = 3,
}

impl TaskTraceIds {
    /// The ids of task `task`'s spans: under `traceparent` when the
    /// submitter gave one, a root of its own otherwise; `None` when the
    /// submitter's traceparent says not sampled (nothing is exported).
    ///
    /// ```
    /// use cronoq::core::TaskId;
    /// use cronoq::telemetry::{TaskTraceIds, TraceSalt};
    /// let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    /// let ids = TaskTraceIds::of(Some(tp), TraceSalt(7), TaskId(3)).unwrap();
    /// let lease = ids.attempt_traceparent(1);
    /// assert!(lease.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
    /// assert_eq!(lease, TaskTraceIds::of(Some(tp), TraceSalt(7), TaskId(3)).unwrap().attempt_traceparent(1));
    /// let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
    /// assert!(TaskTraceIds::of(Some(unsampled), TraceSalt(7), TaskId(3)).is_none());
    /// ```
    pub fn of(traceparent: Option<&str>, salt: TraceSalt, task: TaskId) -> Option<TaskTraceIds> {
        let (trace_id, parent) = match traceparent.and_then(parse_traceparent) {
            Some((_, _, flags)) if flags & 1 == 0 => return None,
            Some((trace_id, parent, _)) => (trace_id, Some(parent)),
            None => {
                let mut trace_id = [0; 16];
                trace_id.copy_from_slice(
                    &digest(&[b"trace", &salt.0.to_be_bytes(), &task.0.to_be_bytes()])[..16],
                );
                if trace_id == [0; 16] {
                    trace_id[15] = 1;
                }
                (trace_id, None)
            }
        };
        Some(TaskTraceIds {
            salt,
            task,
            trace_id,
            parent,
        })
    }

    /// The task these ids are for.
    pub fn task(&self) -> TaskId {
        self.task
    }

    fn span_id(&self, kind: Kind, attempt: u32) -> [u8; 8] {
        let mut id = [0; 8];
        id.copy_from_slice(
            &digest(&[
                b"span",
                &self.salt.0.to_be_bytes(),
                &self.trace_id,
                &self.task.0.to_be_bytes(),
                &[kind as u8],
                &attempt.to_be_bytes(),
            ])[..8],
        );
        if id == [0; 8] {
            id[7] = 1;
        }
        id
    }

    /// The W3C traceparent of attempt `attempt`'s span: what its lease
    /// carries (the parent of the worker's spans) and what an embedded
    /// executor sees as `ctx.traceparent`.
    pub fn attempt_traceparent(&self, attempt: u32) -> String {
        format!(
            "00-{}-{}-01",
            hex(&self.trace_id),
            hex(&self.span_id(Kind::Attempt, attempt))
        )
    }
}

fn digest(parts: &[&[u8]]) -> [u8; 32] {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u32).to_be_bytes());
        hash.update(part);
    }
    hash.finalize().into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A W3C traceparent's trace id, parent id and flags (any version's first
/// four fields, as the spec lets a reader take them); `None` if malformed.
pub(crate) fn parse_traceparent(text: &str) -> Option<([u8; 16], [u8; 8], u8)> {
    let mut parts = text.trim().split('-');
    let version = parts.next()?;
    let (trace, parent, flags) = (parts.next()?, parts.next()?, parts.next()?);
    if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some()) {
        return None;
    }
    let bytes = |text: &str, out: &mut [u8]| -> Option<()> {
        if text.len() != out.len() * 2 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(())
    };
    let (mut trace_id, mut parent_id, mut flag) = ([0u8; 16], [0u8; 8], [0u8; 1]);
    bytes(trace, &mut trace_id)?;
    bytes(parent, &mut parent_id)?;
    bytes(flags, &mut flag)?;
    (trace_id != [0; 16] && parent_id != [0; 8]).then_some((trace_id, parent_id, flag[0]))
}

/// A finished task's life as the scheduler recorded it (module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct TaskTrace {
    /// Its trace and the ids of its spans.
    pub ids: TaskTraceIds,
    /// Its pool.
    pub pool: PoolName,
    /// When the task was submitted (the stream's time on a leader).
    pub submitted_at: Millis,
    /// When it finished.
    pub finished_at: Millis,
    /// How it ended.
    pub state: TaskState,
    /// The task's error, when it did not succeed.
    pub error: Option<String>,
    /// The reason each wait began with, by the attempt it waited for
    /// (a wait a leader did not see begin has none).
    pub waits: Vec<(u32, WaitReason)>,
    /// Every attempt, with its group, worker, times and outcome.
    pub attempts: Vec<AttemptRecord>,
    /// The schedule that fired it, if one did.
    pub schedule: Option<String>,
}

fn time(at: Millis) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(at.0)
}

fn scope() -> InstrumentationScope {
    InstrumentationScope::builder("cronoq")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

impl TaskTrace {
    /// How many spans [`TaskTrace::spans`] makes (counted when dropped).
    pub fn span_count(&self) -> usize {
        1 + self.attempts.len() + self.wait_windows().len()
    }

    /// Each wait: (the attempt it waited for, from, to).
    fn wait_windows(&self) -> Vec<(u32, Millis, Millis)> {
        let mut windows = Vec::new();
        let mut from = Some(self.submitted_at);
        for record in &self.attempts {
            if let Some(start) = from {
                windows.push((record.attempt, start, record.started_at.max(start)));
            }
            from = record.ended_at;
        }
        // Waiting when it ended (cancelled, missed, or never started).
        if let Some(start) = from {
            if self.finished_at > start || self.attempts.is_empty() {
                let next = self.attempts.last().map_or(1, |a| a.attempt + 1);
                windows.push((next, start, self.finished_at.max(start)));
            }
        }
        windows
    }

    /// The spans, parents first.
    pub fn spans(&self) -> Vec<SpanData> {
        let ids = &self.ids;
        let trace_id = TraceId::from_bytes(ids.trace_id);
        let context = |span: [u8; 8]| {
            SpanContext::new(
                trace_id,
                SpanId::from_bytes(span),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            )
        };
        let task_span = ids.span_id(Kind::Task, 0);
        let common = [
            KeyValue::new("cronoq.task_id", self.ids.task.0 as i64),
            KeyValue::new("cronoq.pool", self.pool.as_str().to_string()),
        ];
        let scope = scope();
        let span = |name: &'static str,
                    id: [u8; 8],
                    parent: Option<[u8; 8]>,
                    remote: bool,
                    (from, to): (Millis, Millis),
                    attributes: Vec<KeyValue>,
                    status: Status| SpanData {
            span_context: context(id),
            parent_span_id: parent.map_or(SpanId::INVALID, SpanId::from_bytes),
            parent_span_is_remote: remote,
            span_kind: SpanKind::Internal,
            name: Cow::Borrowed(name),
            start_time: time(from),
            end_time: time(to.max(from)),
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status,
            instrumentation_scope: scope.clone(),
        };
        let first_start = self
            .attempts
            .first()
            .map_or(self.submitted_at, |a| a.started_at);
        let mut attributes = common.to_vec();
        attributes.push(KeyValue::new("cronoq.outcome", self.state.as_str()));
        attributes.push(KeyValue::new("cronoq.attempts", self.attempts.len() as i64));
        if let Some(schedule) = &self.schedule {
            attributes.push(KeyValue::new("cronoq.schedule", schedule.clone()));
        }
        let status = match (&self.state, &self.error) {
            (TaskState::Failed | TaskState::Missed, error) => Status::error(
                error
                    .clone()
                    .unwrap_or_else(|| self.state.as_str().to_string()),
            ),
            _ => Status::Unset,
        };
        let mut spans = vec![span(
            "cronoq.task",
            task_span,
            ids.parent,
            ids.parent.is_some(),
            (self.submitted_at.min(first_start), self.finished_at),
            attributes,
            status,
        )];
        for (attempt, from, to) in self.wait_windows() {
            let mut attributes = common.to_vec();
            attributes.push(KeyValue::new("cronoq.attempt", i64::from(attempt)));
            if let Some((_, reason)) = self.waits.iter().find(|(n, _)| *n == attempt) {
                attributes.push(KeyValue::new("cronoq.wait_reason", reason.as_str()));
            }
            spans.push(span(
                "cronoq.queued",
                ids.span_id(Kind::Queued, attempt),
                Some(task_span),
                false,
                (from, to),
                attributes,
                Status::Unset,
            ));
        }
        for record in &self.attempts {
            let mut attributes = common.to_vec();
            attributes.push(KeyValue::new("cronoq.attempt", i64::from(record.attempt)));
            attributes.push(KeyValue::new("cronoq.group", record.group.to_string()));
            if let Some(worker) = &record.worker {
                attributes.push(KeyValue::new("cronoq.worker_id", worker.clone()));
            }
            let outcome = record.outcome.as_deref().unwrap_or("lost");
            attributes.push(KeyValue::new("cronoq.outcome", outcome.to_string()));
            let status = match (outcome, &record.error) {
                ("failed" | "lost", error) => {
                    Status::error(error.clone().unwrap_or_else(|| outcome.to_string()))
                }
                _ => Status::Unset,
            };
            spans.push(span(
                "cronoq.attempt",
                ids.span_id(Kind::Attempt, record.attempt),
                Some(task_span),
                false,
                (
                    record.started_at,
                    record.ended_at.unwrap_or(self.finished_at),
                ),
                attributes,
                status,
            ));
        }
        spans
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Labels;
    use opentelemetry::Value;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn attempt(n: u32, from: u64, to: u64, outcome: &'static str) -> AttemptRecord {
        AttemptRecord {
            attempt: n,
            group: Labels::from([("gpu", "a100")]),
            worker: Some(format!("w{n}")),
            credential: None,
            started_at: Millis(from),
            ended_at: Some(Millis(to)),
            outcome: Some(outcome.into()),
            error: (outcome == "failed").then(|| "exit 1".to_string()),
        }
    }

    fn attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| &kv.value)
    }

    #[test]
    fn a_retried_task_is_one_tree_under_the_submitters_span() {
        let ids = TaskTraceIds::of(Some(TP), TraceSalt(1), TaskId(9)).unwrap();
        let trace = TaskTrace {
            ids,
            pool: PoolName::new("p").unwrap(),
            submitted_at: Millis(1_000),
            finished_at: Millis(1_900),
            state: TaskState::Succeeded,
            error: None,
            waits: vec![(1, WaitReason::GroupsFull), (2, WaitReason::Backoff)],
            attempts: vec![
                attempt(1, 1_100, 1_200, "failed"),
                attempt(2, 1_500, 1_900, "succeeded"),
            ],
            schedule: None,
        };
        let spans = trace.spans();
        assert_eq!(spans.len(), trace.span_count());
        let names: Vec<_> = spans.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(
            names,
            [
                "cronoq.task",
                "cronoq.queued",
                "cronoq.queued",
                "cronoq.attempt",
                "cronoq.attempt"
            ]
        );
        let task = &spans[0];
        assert_eq!(
            format!("{:032x}", task.span_context.trace_id()),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(format!("{:016x}", task.parent_span_id), "00f067aa0ba902b7");
        assert!(task.parent_span_is_remote);
        for child in &spans[1..] {
            assert_eq!(child.parent_span_id, task.span_context.span_id());
            assert_eq!(child.span_context.trace_id(), task.span_context.trace_id());
            assert!(child.start_time >= task.start_time && child.end_time <= task.end_time);
        }
        assert_eq!(
            attr(&spans[1], "cronoq.wait_reason").unwrap().as_str(),
            "groups_full"
        );
        assert_eq!(
            attr(&spans[2], "cronoq.wait_reason").unwrap().as_str(),
            "backoff"
        );
        assert_eq!(spans[2].start_time, time(Millis(1_200)));
        assert_eq!(spans[2].end_time, time(Millis(1_500)));
        assert_eq!(
            attr(&spans[3], "cronoq.outcome").unwrap().as_str(),
            "failed"
        );
        assert_eq!(attr(&spans[4], "cronoq.worker_id").unwrap().as_str(), "w2");
        assert_eq!(
            attr(&spans[4], "cronoq.group").unwrap().as_str(),
            "gpu=a100"
        );
        // The attempt spans' ids are the ones the leases carried.
        for (span, n) in spans[3..].iter().zip(1..) {
            let tp = ids.attempt_traceparent(n);
            assert_eq!(
                tp,
                format!(
                    "00-{:032x}-{:016x}-01",
                    span.span_context.trace_id(),
                    span.span_context.span_id()
                )
            );
        }
    }

    #[test]
    fn a_task_without_a_traceparent_is_a_root_with_ids_per_installation() {
        let a = TaskTraceIds::of(None, TraceSalt(1), TaskId(9)).unwrap();
        assert_eq!(a, TaskTraceIds::of(None, TraceSalt(1), TaskId(9)).unwrap());
        assert_ne!(
            a.trace_id,
            TaskTraceIds::of(None, TraceSalt(2), TaskId(9))
                .unwrap()
                .trace_id
        );
        assert_ne!(
            a.trace_id,
            TaskTraceIds::of(None, TraceSalt(1), TaskId(10))
                .unwrap()
                .trace_id
        );
        // A malformed one (never past submit) is no parent either.
        assert_eq!(
            TaskTraceIds::of(Some("00-zz"), TraceSalt(1), TaskId(9)),
            Some(a)
        );
        let trace = TaskTrace {
            ids: a,
            pool: PoolName::default(),
            submitted_at: Millis(5),
            finished_at: Millis(9),
            state: TaskState::Cancelled,
            error: None,
            waits: Vec::new(),
            attempts: Vec::new(),
            schedule: None,
        };
        let spans = trace.spans();
        assert_eq!(spans.len(), 2, "the task and its one wait");
        assert_eq!(spans[0].parent_span_id, SpanId::INVALID);
        assert!(!spans[0].parent_span_is_remote);
        assert_eq!(
            attr(&spans[0], "cronoq.outcome").unwrap().as_str(),
            "cancelled"
        );
    }

    #[test]
    fn traceparents_parse_as_the_w3c_spec_reads_them() {
        assert!(parse_traceparent(TP).is_some());
        assert!(
            parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra")
                .is_some()
        );
        for bad in [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad}");
        }
    }
}

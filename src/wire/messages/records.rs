//! What the leader stores in the results bucket: a task's record (its
//! journal entry, [`TaskRecord`]) and the start-record slots
//! ([`StartRecords`], [`StartIndex`]).

use bytes::Bytes;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::core::{Millis, PoolName, TaskId, TaskState};

use super::{v, WireError};

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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Vec<u8>>")]
    pub output: Option<Bytes>,
    /// Error of the last failed attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// It finished after its deadline.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deadline_missed: bool,
    /// When the leader wrote this record of a live task (ms since the
    /// epoch): a successor rewrites it before the bucket's max age
    /// expires it, knowing how old it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_at: Option<Millis>,
    /// The schedule that fired the task, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// The tick it was fired for, ms since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_at: Option<Millis>,
    /// The idempotency key the task held (as the leader keeps it: scoped
    /// to its credential), on a finished task's record only: a successor
    /// binds it again from here, so a later submission with the key is
    /// this task, even once the submission itself is purged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl TaskRecord {
    /// The record of a finished task.
    pub fn of_outcome(o: &crate::task::Outcome) -> TaskRecord {
        TaskRecord {
            v: crate::wire::PROTOCOL_VERSION,
            id: o.id,
            pool: o.pool.clone(),
            state: o.state,
            attempts: o.attempts.clone(),
            output: o.output.clone(),
            error: o.error.clone(),
            deadline_missed: o.deadline_missed,
            written_at: None,
            schedule: o.schedule.as_ref().map(|(name, _)| name.clone()),
            scheduled_at: o.schedule.as_ref().map(|(_, at)| *at),
            key: None,
        }
    }

    /// [`TaskRecord::of_outcome`] taking the outcome: its attempts,
    /// output and error move instead of being copied.
    pub fn from_outcome(o: crate::task::Outcome) -> TaskRecord {
        let (schedule, scheduled_at) = o.schedule.unzip();
        TaskRecord {
            v: crate::wire::PROTOCOL_VERSION,
            id: o.id,
            pool: o.pool,
            state: o.state,
            attempts: o.attempts,
            output: o.output,
            error: o.error,
            deadline_missed: o.deadline_missed,
            written_at: None,
            schedule,
            scheduled_at,
            key: None,
        }
    }

    /// The record of a live task as `task` shows it (it has no output).
    pub fn of_status(s: crate::task::TaskStatus) -> TaskRecord {
        TaskRecord {
            v: crate::wire::PROTOCOL_VERSION,
            id: s.id,
            pool: s.pool,
            state: s.state,
            attempts: s.attempts,
            output: None,
            error: s.error,
            deadline_missed: s.deadline_missed,
            written_at: None,
            schedule: s.schedule,
            scheduled_at: s.scheduled_at,
            key: None,
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
            reason_key: None,
            attempts: self.attempts,
            output,
            output_base64,
            error: self.error,
            deadline_missed: self.deadline_missed,
            schedule: self.schedule,
            scheduled_at: self.scheduled_at,
            output_size: None,
        }
    }

    /// The schedule that fired the task and its tick, if one did.
    pub fn schedule(&self) -> Option<(String, Millis)> {
        self.schedule.clone().zip(self.scheduled_at)
    }

    /// Decodes a value of the results bucket (also a `TaskStatus`, as
    /// servers before the journal stored).
    pub fn decode(bytes: &[u8]) -> Result<TaskRecord, WireError> {
        match crate::wire::decode::<TaskRecord>(bytes) {
            Ok(record) => Ok(record),
            Err(e) => crate::wire::decode::<crate::task::TaskStatus>(bytes)
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
        let fits = |r: &TaskRecord| crate::wire::encode(r).len() <= limit;
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
    /// Roughly its encoded size (MessagePack with field names).
    pub fn estimated_size(&self) -> usize {
        let attempts: usize = self
            .attempts
            .iter()
            .map(crate::task::AttemptRecord::estimated_size)
            .sum();
        256 + self.pool.as_str().len()
            + self.output.as_ref().map_or(0, Bytes::len)
            + self.error.as_ref().map_or(0, String::len)
            + self.key.as_ref().map_or(0, String::len)
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

/// The results of tasks one leader turn finished, stored together in the
/// results bucket under a key used once, `r.<epoch>.<n>`
/// ([`result_key`]): one journal write for the small results of a turn
/// instead of one per task. A task's result goes here only if the task
/// has no record of its own in the bucket (its attempts, if any, were
/// journaled in start records only), so nothing older under its id can
/// contradict it; like a task's own record it expires with the bucket's
/// max age (`results_ttl`). A takeover reads these before it trusts a
/// task's own key: a task named here is finished.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ResultRecords {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// When the leader wrote it (ms since the epoch).
    pub written_at: Millis,
    /// The finished tasks' records (each terminal).
    pub results: Vec<TaskRecord>,
}

/// The results-bucket key of result batch `n` of the leadership of
/// `epoch`: never written twice.
pub fn result_key(epoch: u64, n: u64) -> String {
    format!("r.{epoch}.{n}")
}

/// Whether a results-bucket key is a result batch's (`r.<epoch>.<n>`).
pub fn is_result_key(key: &str) -> bool {
    key.strip_prefix("r.")
        .and_then(|rest| rest.split_once('.'))
        .is_some_and(|(epoch, n)| {
            let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            digits(epoch) && digits(n)
        })
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
                v: crate::wire::PROTOCOL_VERSION,
                id: start.id,
                pool: start.pool.clone(),
                state: TaskState::Running,
                attempts: vec![start.attempt.clone()],
                output: None,
                error: None,
                deadline_missed: false,
                written_at: Some(written_at),
                schedule: None,
                scheduled_at: None,
                key: None,
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

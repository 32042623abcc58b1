//! What a schedule's run history holds ([`FireRecord`], [`MissedTicks`],
//! [`ScheduleCounters`]): kept by the [`super::Book`], answered by the API
//! (`crate::api` re-exports them), stored with the schedule in
//! distributed mode.

use serde::{Deserialize, Serialize};

use super::MissReason;
use crate::core::{Millis, TaskId, TaskState};

/// How a run was started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FireKind {
    /// A tick of the schedule came due.
    #[default]
    Tick,
    /// `trigger`: one run now, outside the tick sequence.
    Trigger,
    /// `backfill`: a past tick fired on request.
    Backfill,
}

/// One run a schedule started: its tick, its task and how it ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FireRecord {
    /// The scheduled instant (for a trigger: the instant it was asked).
    pub tick: Millis,
    /// When the shell decided the fire.
    pub fired_at: Millis,
    /// How it was started.
    #[serde(default)]
    pub kind: FireKind,
    /// The task, once accepted (`None` if its submission was refused:
    /// see `error`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskId>,
    /// The task's final state, once it ended; `None` while it is queued or
    /// running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<TaskState>,
    /// Why the submission was refused, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A range of ticks passed over without a run: `first..until`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissedTicks {
    /// The first tick passed over.
    pub first: Millis,
    /// Ticks before this instant (exclusive) were passed over.
    pub until: Millis,
    /// Older than the catch-up window, or paused.
    pub reason: MissReason,
    /// How many ticks the range holds (counted up to a bound; see
    /// `crate::schedule` docs).
    pub ticks: u64,
}

/// Per-schedule counters since the schedule was created (kept through
/// failovers in distributed mode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleCounters {
    /// Runs started (ticks, triggers, backfills).
    pub fires: u64,
    /// Ticks skipped by the overlap policy.
    pub skipped: u64,
    /// Ticks missed (too late, or paused).
    pub missed: u64,
}

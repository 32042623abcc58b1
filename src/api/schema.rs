//! JSON Schema descriptions of the schedule API's answers
//! ([`ScheduleInfo`], [`ScheduleEntry`], [`BackfillReport`]) for
//! `proto-schemas/` (the replies of `P.api.schedule_*`), as mirror structs
//! like `wire`'s (the wire sits below these types, so their mirrors are
//! here); `tests/proto_schemas.rs` validates real values against them.

use schemars::JsonSchema;

use super::{BackfillReport, ScheduleEntry, ScheduleInfo};
use crate::core::Millis;
use crate::schedule::{
    FireRecord, MissedTicks, Overlap, ScheduleCounters, ScheduleSpec, ScheduleState,
};
use crate::wire::mirrored_schema;

mirrored_schema!(ScheduleInfo, ScheduleInfoSchema, "ScheduleInfo");
/// Everything about one schedule (`GET /v1/schedules/{name}`).
#[allow(dead_code)]
#[derive(JsonSchema)]
struct ScheduleInfoSchema {
    /// The schedule as created (with `paused` as it is now).
    spec: ScheduleSpec,
    /// The firing state.
    state: ScheduleState,
    /// Whether it is paused.
    paused: bool,
    /// The credential that created it and owns its tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
    /// When it was created.
    created_at: Millis,
    /// The next 5 fire instants; empty while paused.
    next_fires: Vec<Millis>,
    /// The most recent runs, newest first.
    history: Vec<FireRecord>,
    /// The most recent ticks skipped by the overlap policy, newest first.
    skipped: Vec<Millis>,
    /// The most recent ranges of missed ticks, newest first.
    missed: Vec<MissedTicks>,
    /// Counters.
    counters: ScheduleCounters,
}

mirrored_schema!(ScheduleEntry, ScheduleEntrySchema, "ScheduleEntry");
/// One line of the schedule list.
#[allow(dead_code)]
#[derive(JsonSchema)]
struct ScheduleEntrySchema {
    /// The name.
    name: String,
    /// The cron expression, if a cron schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cron: Option<String>,
    /// The interval, if an interval schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    every: Option<String>,
    /// The zone of `cron`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tz: Option<String>,
    /// The overlap policy.
    overlap: Overlap,
    /// The pool its tasks go to.
    pool: String,
    /// Whether it is paused.
    paused: bool,
    /// Its owner, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
    /// The next fire instant (absent while paused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    next_fire: Option<Millis>,
    /// The most recent run, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last: Option<FireRecord>,
    /// Counters.
    counters: ScheduleCounters,
}

mirrored_schema!(BackfillReport, BackfillReportSchema, "BackfillReport");
/// What a backfill did: the runs it started and the ticks it skipped.
#[allow(dead_code)]
#[derive(JsonSchema)]
struct BackfillReportSchema {
    /// Runs started, in tick order.
    fired: Vec<FireRecord>,
    /// Ticks the overlap policy skipped.
    skipped: Vec<Millis>,
}

//! JSON Schema descriptions of the core's data types, so the wire messages
//! can derive theirs (`schemars`); kept here so the core stays serde-only.
//!
//! Scalars get hand-written schemas. The structs of the snapshot and of a
//! task's status (bodies of `P.api.snapshot`, `P.api.task` and the HTTP
//! API) delegate to private mirror structs that derive `JsonSchema` with
//! the same serde field names and attributes; `tests/proto_schemas.rs`
//! validates real values against the result, so a mirror that drifts from
//! its type fails there.

use std::borrow::Cow;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};

use crate::core::{
    Autoscale, AutoscaleAnswer, Backoff, ConcurrencyKeySnapshot, Demand, ErrorCode,
    FairnessKeySnapshot, FleetAutoscale, GroupSnapshot, Labels, LeaderInfo, Millis, PoolName,
    PoolSnapshot, QuotaSnapshot, RevokeReason, Snapshot, TaskId, TaskState, WaitReason, WorkerInfo,
};
use crate::schedule::{
    FireKind, FireRecord, MissReason, MissedTicks, Overlap, ScheduleCounters, ScheduleSpec,
    ScheduleState, TaskTemplate,
};
use crate::task::{AttemptRecord, TaskStatus};

macro_rules! plain_schema {
    ($ty:ty, $name:literal, $($schema:tt)+) => {
        impl JsonSchema for $ty {
            fn schema_name() -> Cow<'static, str> {
                Cow::Borrowed($name)
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!($($schema)+)
            }
        }
    };
}

plain_schema!(Millis, "Millis", {
    "type": "integer", "minimum": 0,
    "description": "milliseconds: an instant since the Unix epoch, or a span"
});
plain_schema!(TaskId, "TaskId", {
    "type": "integer", "minimum": 1,
    "description": "a task id: the submit stream sequence of its submission"
});
plain_schema!(PoolName, "PoolName", {
    "type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$", "description": "a pool name"
});
impl JsonSchema for ErrorCode {
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed("ErrorCode")
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        // The examples are the codes this build knows, from the one list.
        let known: Vec<&str> = ErrorCode::ALL.iter().map(ErrorCode::as_str).collect();
        json_schema!({
            "type": "string",
            "description": "a stable error code; see error-codes.md (unknown codes must be accepted)",
            "examples": known
        })
    }
}
plain_schema!(Labels, "Labels", {
    "type": "object",
    "description": "name=value labels as a map",
    "propertyNames": { "pattern": "^[A-Za-z0-9_./-]{1,64}$" },
    "additionalProperties": { "type": "string", "pattern": "^[A-Za-z0-9_.:/-]{1,64}$" }
});
plain_schema!(TaskState, "TaskState", {
    "type": "string",
    "enum": ["scheduled", "queued", "running", "succeeded", "failed", "cancelled", "missed"]
});
plain_schema!(RevokeReason, "RevokeReason", {
    "type": "string", "enum": ["cancelled", "timeout", "preempted"]
});
plain_schema!(WaitReason, "WaitReason", {
    "type": "string",
    "description": "why a task that is not running waits",
    "enum": ["no_group_matches", "groups_full", "held_for_reservation", "backoff", "scheduled", "quota", "concurrency"]
});

impl JsonSchema for Backoff {
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed("Backoff")
    }
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let millis = generator.subschema_for::<Millis>();
        json_schema!({
            "type": "object",
            "description": "exponential backoff: initial * 2^(attempt-1), capped at max",
            "properties": { "initial": millis, "max": millis },
            "required": ["initial", "max"]
        })
    }
}

/// `impl JsonSchema for $ty` that names the schema `$name` and takes its
/// body from the mirror struct `$mirror` (also used by `api/schema.rs`).
macro_rules! mirrored_schema {
    ($ty:ty, $mirror:ty, $name:literal) => {
        impl ::schemars::JsonSchema for $ty {
            fn schema_name() -> ::std::borrow::Cow<'static, str> {
                ::std::borrow::Cow::Borrowed($name)
            }
            fn json_schema(generator: &mut ::schemars::SchemaGenerator) -> ::schemars::Schema {
                <$mirror as ::schemars::JsonSchema>::json_schema(generator)
            }
        }
    };
}
pub(crate) use mirrored_schema;

// The mirrors: same field names, types and serde attributes as the real
// structs (nested types are the real ones, so each mirror copies only its
// own fields); doc comments become the schema descriptions. Never built.

mirrored_schema!(Snapshot, SnapshotSchema, "Snapshot");
/// The whole scheduler at one instant (`GET /v1/snapshot`, `P.api.snapshot`).
#[allow(dead_code)]
#[derive(JsonSchema)]
struct SnapshotSchema {
    /// The leader, in distributed mode.
    leader: Option<LeaderInfo>,
    /// Every pool, by name.
    pools: Vec<PoolSnapshot>,
    /// Remote workers, in distributed mode.
    workers: Vec<WorkerInfo>,
    /// Lists were cut to fit one message (or a pool's demand past 256
    /// label sets): the totals are whole, the lists not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    truncated: bool,
}

mirrored_schema!(LeaderInfo, LeaderInfoSchema, "LeaderInfo");
/// Who leads, in distributed mode.
#[allow(dead_code)]
#[derive(JsonSchema)]
struct LeaderInfoSchema {
    /// The leader's server id.
    id: String,
    /// Its leadership epoch.
    epoch: u64,
}

mirrored_schema!(WorkerInfo, WorkerInfoSchema, "WorkerInfo");
/// One remote worker.
#[allow(dead_code)]
#[derive(JsonSchema)]
struct WorkerInfoSchema {
    /// Worker id.
    id: String,
    /// Its pool.
    pool: PoolName,
    /// Its labels.
    labels: Labels,
    /// Its slots.
    slots: u32,
    /// Slots running attempts.
    busy: u32,
    /// Last heartbeat, ms since the Unix epoch.
    last_seen: Millis,
    /// It is draining: it takes no new leases and leaves once its running
    /// attempts end (`slots` is then 0).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    draining: bool,
}

mirrored_schema!(PoolSnapshot, PoolSnapshotSchema, "PoolSnapshot");
/// One pool.
#[allow(dead_code)]
#[derive(JsonSchema)]
struct PoolSnapshotSchema {
    /// Pool name.
    name: PoolName,
    /// Sum of its groups' capacity.
    capacity: u64,
    /// Slots running attempts.
    busy: u64,
    /// Tasks waiting for a slot (including fixed-start tasks past `start_at`).
    waiting: u64,
    /// Fixed-start tasks whose `start_at` is in the future.
    scheduled: u64,
    /// Slots held back for due reservations.
    reserved: u64,
    /// Tasks that finished after their deadline, since start.
    deadline_missed: u64,
    /// The autoscaling signal (SPEC §2 rule 10).
    autoscale: Autoscale,
    /// Waiting tasks per required label set.
    demand: Vec<Demand>,
    /// Groups with capacity or running attempts, least specialized first.
    groups: Vec<GroupSnapshot>,
    /// The declared fleets' autoscaling figures, in declaration order
    /// (counted from every waiting task, never from the capped `demand`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    fleets: Vec<FleetAutoscale>,
    /// Waiting tasks and due reservations no declared fleet covers (0
    /// when the pool declares no fleet).
    #[serde(default, skip_serializing_if = "is_zero")]
    waiting_without_fleet: u64,
    /// Its busiest fairness keys (SPEC §9), at most 1,000, busiest first,
    /// then a `_other` row summing the rest; none when no task names a key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    fairness_keys: Vec<FairnessKeySnapshot>,
    /// Its busiest concurrency keys, at most 1,000, busiest first, then a
    /// `_other` row summing the rest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    concurrency_keys: Vec<ConcurrencyKeySnapshot>,
}

mirrored_schema!(
    FairnessKeySnapshot,
    FairnessKeySnapshotSchema,
    "FairnessKeySnapshot"
);
/// One fairness key of a pool (SPEC §9).
#[allow(dead_code)]
#[derive(JsonSchema)]
struct FairnessKeySnapshotSchema {
    /// The key.
    key: String,
    /// Slots its running attempts hold.
    running: u64,
    /// Its tasks not running (waiting, in backoff or before a fixed start).
    waiting: u64,
    /// The weight `[[pools.fairness]]` gives it; absent: each task's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    weight: Option<u32>,
    /// Its share of the pool's busy slots, in thousandths.
    share_permille: u32,
    /// Its quotas: how many slots it holds of each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    quotas: Vec<QuotaSnapshot>,
}

mirrored_schema!(QuotaSnapshot, QuotaSnapshotSchema, "QuotaSnapshot");
/// One quota of a fairness key, and what the key holds of it.
#[allow(dead_code)]
#[derive(JsonSchema)]
struct QuotaSnapshotSchema {
    /// The labels a group carries for its slots to count (`{}`: all).
    labels: Labels,
    /// The most slots the key may hold in such groups.
    max_running: u32,
    /// Slots it holds there now.
    held: u32,
}

mirrored_schema!(
    ConcurrencyKeySnapshot,
    ConcurrencyKeySnapshotSchema,
    "ConcurrencyKeySnapshot"
);
/// One concurrency key of a pool (SPEC §9).
#[allow(dead_code)]
#[derive(JsonSchema)]
struct ConcurrencyKeySnapshotSchema {
    /// The key.
    key: String,
    /// Its tasks running.
    running: u32,
    /// Its tasks waiting (for a slot, or for the limit).
    waiting: u64,
    /// The lowest limit among its tasks waiting for the limit (each task
    /// is held to its own); absent when none waits for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    limit: Option<u32>,
}

/// Named by `skip_serializing_if` above (schemars reads the attribute).
#[allow(dead_code)]
fn is_zero(n: &u64) -> bool {
    *n == 0
}

mirrored_schema!(FleetAutoscale, FleetAutoscaleSchema, "FleetAutoscale");
/// The autoscaling figures of one declared fleet.
#[allow(dead_code)]
#[derive(JsonSchema)]
struct FleetAutoscaleSchema {
    /// The fleet's label set.
    labels: Labels,
    /// Workers the fleet should have: `ceil((busy + waiting + reserved) /
    /// slots_per_worker)`, clamped to `[min, max]`.
    desired: u64,
    /// Waiting tasks that count toward this fleet.
    waiting: u64,
    /// Due fixed-start reservations (not yet started) that count toward
    /// this fleet: their slot is wanted before `start_at`.
    reserved: u64,
    /// Busy slots of the group whose labels equal the fleet's.
    busy: u64,
    /// Slots of that group.
    capacity: u64,
    /// Configured fewest workers.
    min: u64,
    /// Configured most workers.
    max: u64,
    /// Configured slots per worker.
    slots_per_worker: u32,
}

mirrored_schema!(Autoscale, AutoscaleSchema, "Autoscale");
/// `desired = clamp(busy + waiting + due reservations not yet started, min, max)`.
#[allow(dead_code)]
#[derive(JsonSchema)]
struct AutoscaleSchema {
    /// Slots the pool should have.
    desired: u64,
    /// Configured lower bound.
    min: u64,
    /// Configured upper bound.
    max: u64,
}

mirrored_schema!(Demand, DemandSchema, "Demand");
/// Waiting demand for one required label set.
#[allow(dead_code)]
#[derive(JsonSchema)]
struct DemandSchema {
    /// The required labels (empty: any group).
    labels: Labels,
    /// Tasks waiting with exactly these requirements.
    waiting: u64,
    /// Why they wait (`no_group_matches`, `groups_full` or
    /// `held_for_reservation`), as `GET /v1/tasks/{id}` says of each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<WaitReason>,
}

mirrored_schema!(GroupSnapshot, GroupSnapshotSchema, "GroupSnapshot");
/// One label group of a pool.
#[allow(dead_code)]
#[derive(JsonSchema)]
struct GroupSnapshotSchema {
    /// The group's exact label set.
    labels: Labels,
    /// Slots.
    capacity: u32,
    /// Slots running attempts.
    busy: u32,
    /// Remote workers in the group (0 in embedded mode).
    workers: u32,
}

mirrored_schema!(TaskStatus, TaskStatusSchema, "TaskStatus");
/// A task as `GET /v1/tasks/{id}` and `P.api.task` show it.
#[allow(dead_code)]
#[derive(JsonSchema)]
struct TaskStatusSchema {
    /// The task.
    id: TaskId,
    /// Its pool.
    pool: PoolName,
    /// Its state.
    state: TaskState,
    /// Why it waits, while it does.
    reason: Option<WaitReason>,
    /// The key it waits for (SPEC §9): its fairness key when `reason` is
    /// `quota`, its concurrency key when `concurrency`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason_key: Option<String>,
    /// Attempts so far.
    attempts: Vec<AttemptRecord>,
    /// Output, once succeeded (lossy UTF-8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    output: Option<String>,
    /// The same output, exact: standard base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    output_base64: Option<String>,
    /// Error of the last failed attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// It finished after its deadline.
    deadline_missed: bool,
    /// The schedule that fired it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    schedule: Option<String>,
    /// The tick it was fired for: RFC 3339 UTC text (e.g.
    /// `2026-12-05T04:00:00Z`); readers also take ms since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Rfc3339>")]
    scheduled_at: Option<Millis>,
    /// Set when the output was left out of this answer because it would
    /// not fit one NATS message: its size in bytes; fetch it in pages
    /// with `P.api.task_output`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    output_size: Option<u64>,
}

plain_schema!(Rfc3339, "Rfc3339", {
    "type": "string", "format": "date-time",
    "description": "an instant as RFC 3339 UTC text"
});
/// An instant as RFC 3339 text (schema only).
#[allow(dead_code)]
struct Rfc3339;

mirrored_schema!(AttemptRecord, AttemptRecordSchema, "AttemptRecord");
/// How one attempt went.
#[allow(dead_code)]
#[derive(JsonSchema)]
struct AttemptRecordSchema {
    /// 1-based.
    attempt: u32,
    /// The group that ran it.
    group: Labels,
    /// The worker that ran it (distributed mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    worker: Option<String>,
    /// When it started, ms since the Unix epoch.
    started_at: Millis,
    /// When it ended.
    ended_at: Option<Millis>,
    /// `succeeded`, `failed`, `lost` or `cancelled`, once ended.
    outcome: Option<String>,
    /// The error, for a failed attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

// Schedules (issue 23): the spec a client sends on `P.api.schedule_create`
// and the history types of the replies. The API's own answer types
// (`ScheduleInfo`, `ScheduleEntry`, `BackfillReport`) sit above the wire:
// their mirrors are in `api/schema.rs`.

plain_schema!(Overlap, "Overlap", {
    "type": "string",
    "description": "what a tick does while the schedule's previous run is queued or running",
    "enum": ["allow", "skip", "buffer_one", "cancel_previous"]
});
plain_schema!(FireKind, "FireKind", {
    "type": "string", "description": "how a run was started", "enum": ["tick", "trigger", "backfill"]
});
plain_schema!(MissReason, "MissReason", {
    "type": "string", "description": "why ticks passed without a run", "enum": ["too_late", "paused"]
});

mirrored_schema!(TaskTemplate, TaskTemplateSchema, "TaskTemplate");
/// The task each tick submits; durations as text (`30s`, `5m`).
#[allow(dead_code)]
#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
struct TaskTemplateSchema {
    /// The pool (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pool: Option<String>,
    /// Labels the running group must carry.
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    labels: Labels,
    /// Higher runs first.
    #[serde(default)]
    priority: i32,
    /// The payload: MessagePack bin (text in JSON when sent).
    #[serde(default)]
    payload: Vec<u8>,
    /// Attempts in all (default: the pool's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_attempts: Option<u32>,
    /// Longest run of one attempt (`30s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    attempt_timeout: Option<String>,
    /// Urgency deadline, counted from the tick (`10m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    deadline: Option<String>,
}

mirrored_schema!(ScheduleSpec, ScheduleSpecSchema, "ScheduleSpec");
/// A schedule as users give it (`POST /v1/schedules`): exactly one of
/// `cron` and `every`.
#[allow(dead_code)]
#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
struct ScheduleSpecSchema {
    /// Unique name: 1–64 of `A-Z a-z 0-9 _ -`.
    name: String,
    /// A cron expression: 5 fields, 6 with seconds first, or `@daily` & co.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cron: Option<String>,
    /// An interval (`30s`, `5m`): at least 1s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    every: Option<String>,
    /// The IANA zone `cron` is read in (default `UTC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tz: Option<String>,
    /// The overlap policy (default `allow`).
    #[serde(default)]
    overlap: Overlap,
    /// How old a missed tick may be and still fire (default `1m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    catchup_window: Option<String>,
    /// The most a fire may be delayed after its tick.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    jitter: Option<String>,
    /// A paused schedule fires nothing.
    #[serde(default)]
    paused: bool,
    /// The task each tick submits.
    #[serde(default)]
    task: TaskTemplate,
}

mirrored_schema!(ScheduleState, ScheduleStateSchema, "ScheduleState");
/// A schedule's firing state.
#[allow(dead_code)]
#[derive(JsonSchema)]
struct ScheduleStateSchema {
    /// Every tick at or before this instant has been decided.
    decided_through: Millis,
    /// The last tick fired.
    last_fired: Option<Millis>,
    /// The tick of the run queued or running.
    active: Option<Millis>,
    /// A tick waiting behind the active run (`buffer_one`).
    buffered: Option<Millis>,
}

mirrored_schema!(FireRecord, FireRecordSchema, "FireRecord");
/// One run a schedule started: its tick, its task and how it ended.
#[allow(dead_code)]
#[derive(JsonSchema)]
struct FireRecordSchema {
    /// The scheduled instant (for a trigger: when it was asked).
    tick: Millis,
    /// When the fire was decided.
    fired_at: Millis,
    /// How it was started.
    #[serde(default)]
    kind: FireKind,
    /// The task, once accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    task: Option<TaskId>,
    /// The task's final state, once it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    outcome: Option<TaskState>,
    /// Why the submission was refused, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

mirrored_schema!(MissedTicks, MissedTicksSchema, "MissedTicks");
/// A range of ticks passed over without a run: `first..until`.
#[allow(dead_code)]
#[derive(JsonSchema)]
struct MissedTicksSchema {
    /// The first tick passed over.
    first: Millis,
    /// Ticks before this instant were passed over.
    until: Millis,
    /// Why.
    reason: MissReason,
    /// How many ticks (counted up to a bound).
    ticks: u64,
}

mirrored_schema!(ScheduleCounters, ScheduleCountersSchema, "ScheduleCounters");
/// Per-schedule counters since it was created.
#[allow(dead_code)]
#[derive(JsonSchema)]
struct ScheduleCountersSchema {
    /// Runs started.
    fires: u64,
    /// Ticks skipped by the overlap policy.
    skipped: u64,
    /// Ticks missed.
    missed: u64,
}

mirrored_schema!(AutoscaleAnswer, AutoscaleAnswerSchema, "AutoscaleAnswer");
/// The answer of `GET /v1/autoscale?pool=P&labels=…`.
#[allow(dead_code)]
#[derive(JsonSchema)]
struct AutoscaleAnswerSchema {
    /// The pool asked about.
    pool: PoolName,
    /// The label set asked about.
    labels: Labels,
    /// The pool declares a fleet with exactly these labels. When false,
    /// `desired`, `waiting`, `reserved`, `min` and `max` are 0: waiting
    /// tasks count toward declared fleets only.
    declared: bool,
    /// Workers the fleet should have.
    desired: u64,
    /// Waiting tasks that count toward the fleet.
    waiting: u64,
    /// Due reservations that count toward the fleet.
    reserved: u64,
    /// Busy slots of the group with exactly these labels.
    busy: u64,
    /// Slots of that group.
    capacity: u64,
    /// Configured fewest workers.
    min: u64,
    /// Configured most workers.
    max: u64,
    /// Configured slots per worker (0 when not declared).
    slots_per_worker: u32,
}

//! The contents of `proto-schemas/`, generated from the wire types: one
//! JSON Schema (draft-07) per message body and reply, the AsyncAPI 3.0
//! document of every subject, `error-codes.md` and a README.
//!
//! A module of the `proto_schemas` test, not of the library: the library
//! keeps only what this reads (the types' `JsonSchema` impls, `Subjects`,
//! `ErrorCode::ALL`, the header names). Nothing here reads or writes
//! files: [`generate`] returns paths and texts, and `tests/proto_schemas.rs`
//! compares them with the checked-in files (or writes them with
//! `UPDATE_SCHEMAS=1`). The output is
//! deterministic: object keys sorted, lists in a fixed order, every file
//! ending in a newline. What cannot be derived from the types (what a
//! subject is for, what each header and error code means) is written
//! here, beside the tables that make a new header or code fail loudly
//! until it is documented.

use std::fmt::Write as _;

use schemars::generate::SchemaSettings;
use schemars::JsonSchema;
use serde_json::{json, Map, Value};

use cronoq::api::{BackfillReport, FireRecord, ScheduleEntry, ScheduleInfo};
use cronoq::core::{ErrorCode, Snapshot};
use cronoq::task::TaskStatus;
use cronoq::wire::{
    Ack, AttemptReport, AttemptReports, AttemptReportsReply, BackfillSchedule, Cancel, Challenge,
    ChallengeReply, CreateSchedule, Deregister, GetSnapshot, GetTask, GetTaskOutput, Heartbeat,
    HeartbeatReply, Lease, Leases, ListSchedules, ListTasks, Register, RegisterReply, Renew,
    RenewReply, Reply, ResultRecords, Revoke, ScheduleName, SessionGrant, StartRecords, Subjects,
    Submit, TaskEvent, TaskList, TaskOutputPage, TaskRecord, WireError, PROTOCOL_VERSION,
    SUBMIT_CONTENT_TYPE, SUBMIT_HEADERS,
};

/// The reply body of `P.api.schedule_list`: a page of list lines.
type ScheduleList = cronoq::wire::ScheduleList<ScheduleEntry>;

/// Where the generated files live, relative to the crate root.
pub const DIR: &str = "proto-schemas";

/// A note at the top of every generated schema.
const GENERATED: &str =
    "Generated from the Rust types by tests/proto_gen (cronoq::wire); do not edit. \
                         Regenerate: UPDATE_SCHEMAS=1 cargo test --test proto_schemas";

/// One body with a JSON Schema file of its own.
struct Body {
    /// The file stem and AsyncAPI message name.
    name: &'static str,
    /// Where it travels, for the README.
    used_on: &'static str,
    /// Its root schema.
    schema: fn() -> Value,
}

fn root_schema<T: JsonSchema>() -> Value {
    SchemaSettings::draft07()
        .into_generator()
        .into_root_schema_for::<T>()
        .to_value()
}

macro_rules! body {
    ($ty:ty, $used_on:literal) => {
        Body {
            name: stringify!($ty),
            used_on: $used_on,
            schema: root_schema::<$ty>,
        }
    };
}

macro_rules! reply {
    ($ty:ty, $used_on:literal) => {
        Body {
            name: concat!("Reply_", stringify!($ty)),
            used_on: $used_on,
            schema: || {
                let mut schema = root_schema::<Reply<$ty>>();
                schema["title"] = Value::from(concat!("Reply<", stringify!($ty), ">"));
                schema
            },
        }
    };
}

/// Every body, in the order of the subject table (`subjects.rs`), then
/// the replies and the bodies shared with HTTP.
fn bodies() -> Vec<Body> {
    vec![
        body!(Submit, "`P.submit.<pool>` (MessagePack form)"),
        body!(Challenge, "request on `P.w.<worker_id>.challenge`"),
        body!(ChallengeReply, "inside `Reply_ChallengeReply`"),
        body!(Register, "request on `P.w.<worker_id>.register`"),
        body!(RegisterReply, "inside `Reply_RegisterReply`"),
        body!(SessionGrant, "inside `RegisterReply` (auth on)"),
        body!(Heartbeat, "request on `P.w.<worker_id>.heartbeat`"),
        body!(HeartbeatReply, "inside `Reply_HeartbeatReply`"),
        body!(Deregister, "request on `P.w.<worker_id>.deregister`"),
        body!(Ack, "inside `Reply_Ack`"),
        body!(Renew, "request on `P.w.<worker_id>.renew`"),
        body!(RenewReply, "inside `Reply_RenewReply`"),
        body!(AttemptReport, "request on `P.w.<worker_id>.outcome`; one of `AttemptReports`"),
        body!(AttemptReports, "request on `P.w.<worker_id>.outcomes`"),
        body!(AttemptReportsReply, "inside `Reply_AttemptReportsReply`"),
        body!(Cancel, "request on `P.api.cancel`"),
        body!(GetTask, "request on `P.api.task`"),
        body!(GetTaskOutput, "request on `P.api.task_output`"),
        body!(GetSnapshot, "request on `P.api.snapshot`"),
        body!(ListTasks, "request on `P.api.tasks`"),
        body!(CreateSchedule, "request on `P.api.schedule_create`"),
        body!(ListSchedules, "request on `P.api.schedule_list`"),
        body!(
            ScheduleName,
            "request on `P.api.schedule_get`, `.schedule_pause`, `.schedule_resume`, `.schedule_delete`, `.schedule_trigger`"
        ),
        body!(BackfillSchedule, "request on `P.api.schedule_backfill`"),
        body!(Lease, "leader → `P.worker.<worker_id>.lease`; one of `Leases`"),
        body!(Leases, "leader → `P.worker.<worker_id>.leases`"),
        body!(Revoke, "leader → `P.worker.<worker_id>.revoke`"),
        body!(TaskEvent, "leader → `P.events.<task_id>`"),
        body!(
            WireError,
            "the `error` of every reply; the HTTP error body (JSON)"
        ),
        reply!(ChallengeReply, "reply to `P.w.<worker_id>.challenge`"),
        reply!(RegisterReply, "reply to `P.w.<worker_id>.register`"),
        reply!(HeartbeatReply, "reply to `P.w.<worker_id>.heartbeat`"),
        reply!(
            Ack,
            "reply to `P.w.<worker_id>.deregister`, `P.w.<worker_id>.outcome`, `P.api.cancel`, `P.api.schedule_delete`, and to any request the leader cannot decode or refuses"
        ),
        reply!(RenewReply, "reply to `P.w.<worker_id>.renew`"),
        reply!(AttemptReportsReply, "reply to `P.w.<worker_id>.outcomes`"),
        reply!(TaskStatus, "reply to `P.api.task`"),
        reply!(TaskOutputPage, "reply to `P.api.task_output`"),
        reply!(Snapshot, "reply to `P.api.snapshot`"),
        reply!(TaskList, "reply to `P.api.tasks`"),
        reply!(
            ScheduleInfo,
            "reply to `P.api.schedule_create`, `.schedule_get`, `.schedule_pause`, `.schedule_resume`"
        ),
        reply!(ScheduleList, "reply to `P.api.schedule_list`"),
        reply!(FireRecord, "reply to `P.api.schedule_trigger`"),
        reply!(BackfillReport, "reply to `P.api.schedule_backfill`"),
        body!(TaskStatus, "`GET /v1/tasks/{id}` (JSON)"),
        body!(
            TaskRecord,
            "values of the results bucket (MessagePack): the leader's journal"
        ),
        body!(
            StartRecords,
            "values of the results bucket under `s.<n>` (MessagePack): the attempts one leader turn started"
        ),
        body!(
            ResultRecords,
            "values of the results bucket under `r.<epoch>.<n>` (MessagePack): the small results of tasks one leader turn finished"
        ),
        body!(Snapshot, "`GET /v1/snapshot` (JSON)"),
        body!(
            TaskList,
            "`GET /v1/tasks?limit=N` (JSON); inside `Reply_TaskList`"
        ),
    ]
}

/// The files of `proto-schemas/` for subjects under `prefix` (the default
/// of the AsyncAPI `{prefix}` parameter and the base of the JetStream
/// names), as `(path relative to the crate root, content)`, sorted by path.
///
/// # Panics
///
/// If `prefix` is not a valid subject prefix, or a `Cronoq-*` header or
/// error code has no documentation here.
pub fn generate(prefix: &str) -> Vec<(String, String)> {
    let subjects = Subjects::new(prefix).expect("a valid subject prefix");
    let bodies = bodies();
    let mut files = Vec::new();
    for body in &bodies {
        let mut schema = (body.schema)();
        if let Some(map) = schema.as_object_mut() {
            map.insert("$comment".into(), GENERATED.into());
        }
        let text = serde_json::to_string_pretty(&sorted(&schema)).expect("json");
        files.push((
            format!("{DIR}/schemas/{}.json", body.name),
            format!("{text}\n"),
        ));
    }
    files.push((format!("{DIR}/asyncapi.yaml"), asyncapi_yaml(&subjects)));
    files.push((format!("{DIR}/openapi.yaml"), openapi_yaml()));
    files.push((format!("{DIR}/error-codes.md"), error_codes_md()));
    files.push((format!("{DIR}/README.md"), readme_md(&bodies)));
    files.sort();
    files
}

/// `value` with every object's keys in sorted order, whatever the map
/// type of `serde_json` (its `preserve_order` feature may be on).
fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&map[k])))
                    .collect::<Map<String, Value>>(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

// ---- AsyncAPI -------------------------------------------------------------

/// A request the leader answers on `P.api.<verb>`.
struct Request {
    verb: &'static str,
    /// Operation id.
    operation: &'static str,
    request: &'static str,
    reply: &'static str,
    /// `worker` or `client`.
    tag: &'static str,
    summary: &'static str,
    description: &'static str,
}

/// What every schedule verb's description ends with.
macro_rules! schedule_rules {
    ($text:literal) => {
        concat!(
            $text,
            " A malformed body, a bad name or spec is `INVALID_ARGUMENT`; a refusal changes \
             nothing. Auth on: readers list and get (schedules of their pools); creating and \
             changing need `admin` or a `submitter` allowed the schedule's pool."
        )
    };
}

const REQUESTS: [Request; 20] = [
    Request {
        verb: "challenge",
        operation: "challenge",
        request: "Challenge",
        reply: "Reply_ChallengeReply",
        tag: "worker",
        summary: "A worker asks for a registration nonce (auth on).",
        description: "The nonce is good once, for 30 s, at the leader that issued it: the \
            worker signs its `Register` over it (`Cronoq-Auth` header, token HMAC or nkey \
            signature), so a registration cannot be replayed. An unknown or used nonce is \
            refused `FAILED_PRECONDITION`: ask again.",
    },
    Request {
        verb: "register",
        operation: "register",
        request: "Register",
        reply: "Reply_RegisterReply",
        tag: "worker",
        summary: "A worker joins a pool with its labels and slots.",
        description: "The leader adds the worker's slots to the group of exactly its labels and \
            answers with its epoch and timings, or refuses with a stable code \
            (`INVALID_ARGUMENT` for a bad worker id, labels or slot count). Registering an id \
            that is already known replaces it: whatever the old registration ran counts as lost. \
            With auth on, the `Cronoq-Auth` proof must verify (`UNAUTHENTICATED`) and the \
            credential must allow the pool and every label claimed (`PERMISSION_DENIED`; nothing \
            is registered); the reply's `session` is then proved on every later request.",
    },
    Request {
        verb: "heartbeat",
        operation: "heartbeat",
        request: "Heartbeat",
        reply: "Reply_HeartbeatReply",
        tag: "worker",
        summary: "A worker is alive; it lists what it runs.",
        description: "A worker silent for `worker_timeout` is removed: its slots leave the group \
            and its attempts are lost (and retried elsewhere). `registered: false` in the reply \
            means the leader does not know the worker (removed, or a new leader): register \
            again. A running attempt the leader did not lease is revoked on \
            `P.worker.<worker_id>.revoke`.",
    },
    Request {
        verb: "deregister",
        operation: "deregister",
        request: "Deregister",
        reply: "Reply_Ack",
        tag: "worker",
        summary: "A worker leaves, at once or after draining.",
        description: "With `drain` the leader stops leasing to the worker and lets its attempts \
            finish; without, the worker is removed at once and what it still runs is lost. An \
            unknown worker is acknowledged too.",
    },
    Request {
        verb: "renew",
        operation: "renew",
        request: "Renew",
        reply: "Reply_RenewReply",
        tag: "worker",
        summary: "A worker keeps the lease of an attempt it runs.",
        description: "A lease not renewed within its `ttl` is lost. `FAILED_PRECONDITION` means \
            the lease is not the leader's current one (another epoch, worker or attempt): the \
            worker must stop that attempt.",
    },
    Request {
        verb: "outcome",
        operation: "reportOutcome",
        request: "AttemptReport",
        reply: "Reply_Ack",
        tag: "worker",
        summary: "A worker reports how an attempt ended.",
        description: "Accepted only for the current lease (else `FAILED_PRECONDITION`). A failed \
            or lost attempt is retried with backoff until `max_attempts`.",
    },
    Request {
        verb: "outcomes",
        operation: "reportOutcomes",
        request: "AttemptReports",
        reply: "Reply_AttemptReportsReply",
        tag: "worker",
        summary: "A worker reports how several attempts ended, in one request.",
        description: "Each report is taken as `outcome` would take it alone; the reply lists, \
            in order, `null` for each one taken and the error of each one refused. A worker \
            sends the outcomes that ended while its earlier reports were on the way (at most \
            4,096, within the NATS message limit), so one request and one reply serve many \
            attempts. The whole request is refused (`INVALID_ARGUMENT`) if it holds more, or \
            a report of another worker.",
    },
    Request {
        verb: "cancel",
        operation: "cancel",
        request: "Cancel",
        reply: "Reply_Ack",
        tag: "client",
        summary: "A client cancels a task.",
        description: "A waiting task is removed at once; a running one is revoked and ends \
            `cancelled`. A task accepted by the submit stream but not consumed yet is cancelled \
            on arrival. `NOT_FOUND` for an unknown id, `FAILED_PRECONDITION` for a finished task.",
    },
    Request {
        verb: "task",
        operation: "getTask",
        request: "GetTask",
        reply: "Reply_TaskStatus",
        tag: "client",
        summary: "A client asks for a task's status.",
        description: "Live and recently finished tasks come from the leader, older ones from the \
            results bucket, just-accepted ones from the submit stream (`queued`); anything else is \
            `NOT_FOUND`.",
    },
    Request {
        verb: "task_output",
        operation: "getTaskOutput",
        request: "GetTaskOutput",
        reply: "Reply_TaskOutputPage",
        tag: "client",
        summary: "A client asks for a page of a task's output.",
        description: "What a `P.api.task` reply leaves out when the status would not fit one NATS \
            message (its `output_size` is set): the bytes from `offset`, at most `limit` and at \
            most what fits one reply, with the output's `total` size. The same rights as \
            `P.api.task`.",
    },
    Request {
        verb: "snapshot",
        operation: "getSnapshot",
        request: "GetSnapshot",
        reply: "Reply_Snapshot",
        tag: "client",
        summary: "A client asks for the snapshot: pools, groups, demand, workers.",
        description: "The leader does not read the request body; clients send `GetSnapshot`.",
    },
    Request {
        verb: "tasks",
        operation: "listTasks",
        request: "ListTasks",
        reply: "Reply_TaskList",
        tag: "client",
        summary: "A client asks for the newest tasks (the dashboard's list).",
        description: "Live and recently finished tasks the leader holds, highest id first, at \
            most `limit` (1 to 500, else `INVALID_ARGUMENT`); each without its output and with \
            errors cut to 200 characters. The list is cut to fit one NATS message.",
    },
    Request {
        verb: "schedule_create",
        operation: "createSchedule",
        request: "CreateSchedule",
        reply: "Reply_ScheduleInfo",
        tag: "client",
        summary: "A client creates a schedule (issue 23).",
        description: schedule_rules!(
            "Answered once the schedule is stored. `ALREADY_EXISTS` for a taken name, \
             `RESOURCE_EXHAUSTED` past `max_schedules`; auth on without a storage key, \
             `FAILED_PRECONDITION`. The caller's credential owns the schedule's tasks."
        ),
    },
    Request {
        verb: "schedule_list",
        operation: "listSchedules",
        request: "ListSchedules",
        reply: "Reply_ScheduleList",
        tag: "client",
        summary: "A client lists the schedules, one page at a time.",
        description: schedule_rules!(
            "By name, after `after`, as many as fit in one NATS message; `more` says to ask \
             again after the last name."
        ),
    },
    Request {
        verb: "schedule_get",
        operation: "getSchedule",
        request: "ScheduleName",
        reply: "Reply_ScheduleInfo",
        tag: "client",
        summary: "A client asks for one schedule: spec, state, next 5 fires, recent runs.",
        description: schedule_rules!("`NOT_FOUND` for an unknown name."),
    },
    Request {
        verb: "schedule_pause",
        operation: "pauseSchedule",
        request: "ScheduleName",
        reply: "Reply_ScheduleInfo",
        tag: "client",
        summary: "A client pauses a schedule: its ticks pass without runs.",
        description: schedule_rules!("`NOT_FOUND` for an unknown name."),
    },
    Request {
        verb: "schedule_resume",
        operation: "resumeSchedule",
        request: "ScheduleName",
        reply: "Reply_ScheduleInfo",
        tag: "client",
        summary: "A client resumes a schedule; ticks passed while paused do not fire.",
        description: schedule_rules!("`NOT_FOUND` for an unknown name."),
    },
    Request {
        verb: "schedule_delete",
        operation: "deleteSchedule",
        request: "ScheduleName",
        reply: "Reply_Ack",
        tag: "client",
        summary: "A client deletes a schedule; runs already started go on.",
        description: schedule_rules!("`NOT_FOUND` for an unknown name."),
    },
    Request {
        verb: "schedule_trigger",
        operation: "triggerSchedule",
        request: "ScheduleName",
        reply: "Reply_FireRecord",
        tag: "client",
        summary: "A client starts one run of a schedule now, outside the tick sequence.",
        description: schedule_rules!(
            "Answered once the run's task is in the submit stream. `NOT_FOUND` for an \
             unknown name."
        ),
    },
    Request {
        verb: "schedule_backfill",
        operation: "backfillSchedule",
        request: "BackfillSchedule",
        reply: "Reply_BackfillReport",
        tag: "client",
        summary: "A client fires each tick of a schedule in `from..=to`, by its overlap policy.",
        description: schedule_rules!(
            "At most 1,000 ticks, `to` not in the future; a range that runs backwards is \
             `INVALID_ARGUMENT`. Answered once the runs' tasks are in the submit stream."
        ),
    },
];

/// What each plain-publish header means, with an example value.
const HEADER_DOCS: [(&str, &str, &str); 16] = [
    (
        "Cronoq-Labels",
        "Labels the running group must carry: comma-separated `name=value`.",
        "gpu=a100,zone=eu",
    ),
    (
        "Cronoq-Priority",
        "Priority, an i32 (default 0); higher runs first.",
        "5",
    ),
    (
        "Cronoq-Deadline",
        "Urgency deadline (never cancels): RFC 3339, or a duration counted from the stream's \
         timestamp of the message.",
        "2026-12-02T16:00:00Z",
    ),
    (
        "Cronoq-Start-At",
        "Fixed start: RFC 3339, or a duration counted from the stream's timestamp.",
        "10m",
    ),
    (
        "Cronoq-Tolerance",
        "How late a fixed start may still start (with `Cronoq-Start-At`).",
        "30s",
    ),
    (
        "Cronoq-Est-Runtime",
        "Declared run time; lets the task use slots held for a later reservation.",
        "5m",
    ),
    (
        "Cronoq-Max-Attempts",
        "Attempts in all, an integer of at least 1 (default: the pool's).",
        "3",
    ),
    (
        "Cronoq-Attempt-Timeout",
        "Longest run of one attempt; past it the attempt counts as lost.",
        "1h",
    ),
    (
        "Cronoq-Backoff",
        "Backoff between attempts: `INITIAL,MAX` durations, the delay doubling from INITIAL up to MAX (default: the pool's).",
        "1s,1m",
    ),
    (
        "Cronoq-Idempotency-Key",
        "The task's idempotency key. Only `Nats-Msg-Id` makes JetStream drop a resubmission: \
         send the key there too.",
        "order-1234",
    ),
    (
        "Cronoq-Fairness-Key",
        "The task's fairness key (SPEC §9), 1 to 64 bytes: among keys with waiting tasks, a freed \
         slot goes to the key furthest below its weighted share. With auth on it defaults to the \
         credential's name, and another key is refused `PERMISSION_DENIED` unless the \
         credential's `fairness_keys` lists it.",
        "team-a",
    ),
    (
        "Cronoq-Fairness-Weight",
        "The fairness key's weight, an integer from 1 to 1,000 (default 1). Ignored with auth on \
         and for keys the pool's `[[pools.fairness]]` weighs.",
        "3",
    ),
    (
        "Cronoq-Concurrency-Key",
        "The task's concurrency key, 1 to 128 bytes: tasks of one pool with the same key share a limit.",
        "deploy-prod",
    ),
    (
        "Cronoq-Concurrency-Limit",
        "At most this many of the concurrency key's tasks run at once (integer ≥ 1, default 1).",
        "1",
    ),
    (
        "Cronoq-Concurrency-Policy",
        "What admission does when the key's limit is full: `queue` (default, wait), \
         `replace_waiting` (cancel the key's older waiting tasks), `cancel_running` (cancel the \
         key's oldest running tasks beyond the limit) or `skip` (end this task `cancelled`).",
        "cancel_running",
    ),
    (
        "Cronoq-Preemptible",
        "`true` (default) or `false`: whether a waiting task of higher priority may preempt its \
         attempt in a pool with `preemption = \"priority\"`.",
        "false",
    ),
];

const NATS_MSG_ID: &str = "JetStream de-duplication: a second message with the same id within the \
    stream's duplicate window (2 minutes) is not stored again, and its acknowledgement carries \
    the first one's sequence, that is the same task id.";

const TRACEPARENT_DOC: &str = "The submitter's W3C trace context, \
    `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>` (lowercase, ids not all zeros); it \
    travels with the task to every attempt (`Lease.traceparent`, env `TRACEPARENT` of a \
    worker's command). A malformed one fails the submission `INVALID_ARGUMENT`.";

fn channel_ref(channel: &str) -> Value {
    json!({ "$ref": format!("#/channels/{channel}") })
}

fn channel_message_ref(channel: &str, message: &str) -> Value {
    json!({ "$ref": format!("#/channels/{channel}/messages/{message}") })
}

fn message_ref(message: &str) -> Value {
    json!({ "$ref": format!("#/components/messages/{message}") })
}

fn payload_ref(name: &str) -> Value {
    json!({ "$ref": format!("./schemas/{name}.json") })
}

/// The JetStream names, for descriptions.
struct JetStream {
    stream: String,
    results: String,
    state: String,
}

impl JetStream {
    fn of(subjects: &Subjects) -> JetStream {
        JetStream {
            stream: subjects.submit_stream(),
            results: subjects.results_bucket(),
            state: subjects.state_bucket(),
        }
    }
}

fn asyncapi(subjects: &Subjects) -> Value {
    let js = JetStream::of(subjects);
    let prefix = subjects.prefix();
    let bodies = bodies();
    // A message's summary is the first paragraph of its type's doc comment,
    // its description the rest (rustdoc's line breaks undone).
    let docs_of = |name: &str| -> (String, Option<String>) {
        let body = bodies
            .iter()
            .find(|b| b.name == name)
            .expect("a known body");
        let schema = (body.schema)();
        let doc = schema["description"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let mut paragraphs = doc.split("\n\n").map(|p| p.replace('\n', " "));
        let summary = paragraphs.next().unwrap_or_default();
        let rest: Vec<String> = paragraphs.collect();
        (summary, (!rest.is_empty()).then(|| rest.join("\n\n")))
    };
    let message = |name: &str, mut fields: Value| -> Value {
        let (summary, description) = docs_of(name);
        fields["name"] = name.into();
        fields["summary"] = summary.into();
        if let Some(description) = description {
            fields["description"] = description.into();
        }
        if fields.get("payload").is_none() {
            fields["payload"] = payload_ref(name);
        }
        fields
    };
    let parameters = json!({
        "prefix": {
            "default": prefix,
            "description": "The subject prefix of the installation (`server.subject_prefix`): \
                one NATS token of letters, digits, `_` and `-`. `P.` in the descriptions \
                stands for it.",
            "examples": [prefix],
        },
        "pool": {
            "description": "A pool name: 1-64 letters, digits, `_` and `-`.",
            "examples": ["default", "inference"],
        },
        "worker_id": {
            "description": "A worker id: 1-64 letters, digits, `_` and `-`.",
            "examples": ["gpu-node-7"],
        },
        "task_id": {
            "description": "A task id: the decimal sequence number of its submission in the \
                submit stream.",
            "examples": ["42"],
        },
    });
    // `{name}`s of an address, as references to the shared parameters.
    let parameters_of = |address: &str| -> Value {
        let mut out = Map::new();
        for name in ["prefix", "pool", "worker_id", "task_id"] {
            if address.contains(&format!("{{{name}}}")) {
                out.insert(
                    name.into(),
                    json!({ "$ref": format!("#/components/parameters/{name}") }),
                );
            }
        }
        Value::Object(out)
    };

    let mut channels = Map::new();
    let mut operations = Map::new();
    let mut messages = Map::new();

    // Submit: two forms on one subject.
    channels.insert(
        "submit".into(),
        json!({
            "address": "{prefix}.submit.{pool}",
            "title": "Submissions",
            "description": format!(
                "Submissions to one pool. Every subject `{prefix}.submit.>` is captured by the \
                JetStream stream `{stream}` (file storage, 2-minute duplicate window), so an \
                accepted task is durable before the publisher's acknowledgement arrives; the \
                task id is the message's stream sequence. Publish through JetStream to learn the \
                id; a plain core-NATS publish is stored too, without an answer.\n\n\
                Two forms: `Submit`, a MessagePack body marked by `Content-Type: \
                {SUBMIT_CONTENT_TYPE}`; or `PlainSubmit`, any other body, taken as the raw payload \
                with options in `Cronoq-*` headers. A submission the leader refuses (bad labels, \
                an oversized payload, a bad header) ends as a `failed` task whose error starts \
                with `submission refused:`, announced on `{prefix}.events.<task_id>`.",
                stream = js.stream,
            ),
            "parameters": parameters_of("{prefix}.submit.{pool}"),
            "messages": {
                "Submit": message_ref("Submit"),
                "PlainSubmit": message_ref("PlainSubmit"),
            },
        }),
    );
    operations.insert(
        "submit".into(),
        json!({
            "action": "receive",
            "channel": channel_ref("submit"),
            "title": "Accept submissions",
            "summary": "A client submits a task; the leader consumes it from the submit stream.",
            "description": format!(
                "The leader reads `{}` from its first message with an ordered consumer, so a \
                restarted or new leader picks every accepted, unfinished task up again. When a \
                task finishes its status goes to the results bucket and its submission is deleted \
                from the stream.",
                js.stream
            ),
            "tags": [{ "name": "client" }],
            "messages": [
                channel_message_ref("submit", "Submit"),
                channel_message_ref("submit", "PlainSubmit"),
            ],
        }),
    );
    messages.insert(
        "Submit".into(),
        message(
            "Submit",
            json!({
                "title": "Submit (MessagePack)",
                "contentType": SUBMIT_CONTENT_TYPE,
                "headers": {
                    "type": "object",
                    "properties": {
                        "Content-Type": {
                            "type": "string",
                            "const": SUBMIT_CONTENT_TYPE,
                            "description": "Marks the body as a MessagePack `Submit`.",
                        },
                        "Nats-Msg-Id": {
                            "type": "string",
                            "description": format!(
                                "The idempotency key (cronoq's clients send it when the task has \
                                one). {NATS_MSG_ID}"
                            ),
                        },
                    },
                    "required": ["Content-Type"],
                },
            }),
        ),
    );
    let mut header_props = Map::new();
    for name in SUBMIT_HEADERS {
        let (_, description, example) = HEADER_DOCS
            .iter()
            .find(|(n, _, _)| *n == name)
            .unwrap_or_else(|| {
                panic!("header {name} has no documentation in tests/proto_gen/mod.rs")
            });
        header_props.insert(
            name.to_string(),
            json!({ "type": "string", "description": description, "examples": [example] }),
        );
    }
    header_props.insert(
        "Nats-Msg-Id".into(),
        json!({ "type": "string", "description": NATS_MSG_ID }),
    );
    header_props.insert(
        cronoq::auth::AUTH_HEADER.into(),
        json!({
            "type": "string",
            "description": "With `[auth] required = true`: `v1 <token|nkey> <id> <unix ms>.<random> <proof>`, \
                an HMAC-SHA256 keyed with the token (id: its `token_id`) or the nkey's Ed25519 signature \
                (id: the public key), base64url, over the subject, the nonce, the `Cronoq-*` and \
                `Nats-Msg-Id` headers and the body (see `crate::auth`). `Nats-Msg-Id` is then required \
                (the nonce, or a key derived from the credential and the idempotency key). Refused \
                `UNAUTHENTICATED` or `PERMISSION_DENIED` (the task is recorded failed with the reason).",
        }),
    );
    header_props.insert(
        "traceparent".into(),
        json!({
            "type": "string",
            "description": TRACEPARENT_DOC,
            "examples": ["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"],
        }),
    );
    messages.insert(
        "PlainSubmit".into(),
        json!({
            "name": "PlainSubmit",
            "title": "Submit (plain publish)",
            "summary": "A submission from any NATS client: the body is the payload, options are \
                headers.",
            "description": format!(
                "Any message on the subject without `Content-Type: {SUBMIT_CONTENT_TYPE}`. \
                Header names are matched without regard to case; an unknown `Cronoq-*` header \
                refuses the submission, so a typo does not pass silently. Other headers are \
                ignored. Example: `nats pub {prefix}.submit.inference -H 'Cronoq-Labels: \
                gpu=a100' 'resize 42.png'`."
            ),
            "contentType": "application/octet-stream",
            "headers": { "type": "object", "properties": header_props },
            "payload": {
                "type": "string",
                "format": "binary",
                "description": "The task payload, as is.",
            },
        }),
    );

    // Requests on P.api.<verb> (clients) and P.w.<worker_id>.<verb> (workers).
    for r in &REQUESTS {
        let reply_channel = format!("{}Reply", r.verb);
        let title = if r.tag == "worker" {
            format!("P.w.<worker_id>.{}", r.verb)
        } else {
            format!("P.api.{}", r.verb)
        };
        let address = if r.tag == "worker" {
            format!("{{prefix}}.w.{{worker_id}}.{}", r.verb)
        } else {
            format!("{{prefix}}.api.{}", r.verb)
        };
        channels.insert(
            r.verb.into(),
            json!({
                "address": address,
                "title": title,
                "description": format!(
                    "Requests to the leader (core NATS request/reply). {}",
                    r.description
                ),
                "parameters": parameters_of(&address),
                "messages": { r.request: message_ref(r.request) },
            }),
        );
        channels.insert(
            reply_channel.clone(),
            json!({
                "address": null,
                "title": format!("Reply to {title}"),
                "description": "The requester's reply subject (its NATS inbox).",
                "messages": { r.reply: message_ref(r.reply) },
            }),
        );
        operations.insert(
            r.operation.into(),
            json!({
                "action": "receive",
                "channel": channel_ref(r.verb),
                "summary": r.summary,
                "tags": [{ "name": r.tag }],
                "messages": [channel_message_ref(r.verb, r.request)],
                "reply": {
                    "channel": channel_ref(&reply_channel),
                    "messages": [channel_message_ref(&reply_channel, r.reply)],
                },
            }),
        );
        messages.insert(
            r.request.into(),
            message(r.request, json!({ "title": r.request })),
        );
        if !messages.contains_key(r.reply) {
            let inner = r.reply.trim_start_matches("Reply_");
            messages.insert(
                r.reply.into(),
                json!({
                    "name": r.reply,
                    "title": format!("Reply<{inner}>"),
                    "summary": format!(
                        "`{{\"ok\": {inner}}}`, or `{{\"error\": {{\"code\", \"message\"}}}}` \
                        with a stable code (error-codes.md)."
                    ),
                    "payload": payload_ref(r.reply),
                }),
            );
        }
    }

    // Leader → worker, leader → anyone.
    let pushes = [
        (
            "lease",
            "{prefix}.worker.{worker_id}.lease",
            "Lease",
            "worker",
            "The leader hands an attempt to a worker.",
            "Sent to the worker of the attempt's group with the most free slots. The worker runs \
             it, renews it on `P.api.renew` before `ttl` runs out and reports on \
             `P.api.outcome`. A lease of another epoch than the leader's current one is ignored.",
        ),
        (
            "leases",
            "{prefix}.worker.{worker_id}.leases",
            "Leases",
            "worker",
            "The leader hands several attempts to a worker in one message.",
            "Sent instead of one `lease` message each to a worker that registered with \
             `lease_batches`, for the leases one turn of the leader gave it (a lease alone \
             still goes on `lease`). Each is taken as a `lease` message would be.",
        ),
        (
            "revoke",
            "{prefix}.worker.{worker_id}.revoke",
            "Revoke",
            "worker",
            "The leader tells a worker to stop an attempt.",
            "Sent when the task is cancelled, the attempt ran past its timeout, or a heartbeat \
             lists an attempt the leader did not lease. The worker stops the attempt and reports \
             it `cancelled`.",
        ),
        (
            "events",
            "{prefix}.events.{task_id}",
            "TaskEvent",
            "client",
            "The leader announces a task's state changes.",
            "Published (core NATS, not stored) when the task finishes; with `[server] \
             events = \"all\"` also when it is queued or scheduled, when an attempt starts and \
             when a retry is scheduled (`queued` again); with `events = \"none\"` never. An \
             event names the task, its pool, state, attempt, group and worker, never its output \
             or error text (any NATS user allowed to subscribe hears every pool's events): a \
             waiter reads the task through the API once an event says it ended, where its \
             credential is checked. At most once, after the \
             change is stored: an event whose leader died before sending it is not sent \
             again, and a new leader does not announce again the tasks it reads back at \
             takeover. A waiting client subscribes before it looks the task up, and looks \
             again now and then in case it missed an event.",
        ),
    ];
    for (channel, address, name, tag, summary, description) in pushes {
        channels.insert(
            channel.into(),
            json!({
                "address": address,
                "title": address
                    .replace("{prefix}.", "P.")
                    .replace('{', "<")
                    .replace('}', ">"),
                "description": description,
                "parameters": parameters_of(address),
                "messages": { name: message_ref(name) },
            }),
        );
        operations.insert(
            channel.into(),
            json!({
                "action": "send",
                "channel": channel_ref(channel),
                "summary": summary,
                "tags": [{ "name": tag }],
                "messages": [channel_message_ref(channel, name)],
            }),
        );
        messages.insert(name.into(), message(name, json!({ "title": name })));
    }

    let description = format!(
        "The subjects and messages between cronoq's leader (`cronoq server`), its workers and \
        its clients over NATS. Operations are written from the **leader's** side: `receive` is \
        what the leader takes in, `send` what it publishes; a worker or client does the \
        opposite.\n\n\
        **Encoding.** Bodies are MessagePack maps with field names (`rmp_serde::to_vec_named`), \
        described by the JSON Schemas in `schemas/`: a MessagePack `bin` (payload, output) is an \
        array of byte values there, `nil` is `null`, enums are externally tagged \
        (`{{\"failed\": {{…}}}}` or `\"cancelled\"`). Every message carries the protocol version \
        `v` (now {PROTOCOL_VERSION}). A reader ignores fields it does not know and defaults \
        fields it misses, so fields may be added without a new version. Every reply is \
        `{{\"ok\": body}}` or `{{\"error\": {{\"code\", \"message\"}}}}`; the codes are in \
        `error-codes.md`, and a reader must accept codes it does not know.\n\n\
        **JetStream.** The server creates these at start (names for prefix `{prefix}`: the \
        prefix upper-cased, `-` as `_`):\n\n\
        | name | kind | holds |\n\
        |---|---|---|\n\
        | `{stream}` | stream on `{prefix}.submit.>` | accepted, unfinished submissions; file \
        storage, 2-minute duplicate window (`Nats-Msg-Id`); a task id is its sequence |\n\
        | `{results}` | key-value bucket | the journal: each started or finished task's \
        `TaskRecord` (MessagePack, `schemas/TaskRecord.json`) under its decimal id — its \
        attempts while live, its result once finished (kept `results_ttl`); and under \
        `s.<n>` the attempts one leader turn started (`StartRecords`, \
        `schemas/StartRecords.json`), each counting while it follows the last attempt of its \
        task's own record; under `r.<epoch>.<n>` the small results of tasks one leader turn \
        finished that have no record of their own (`ResultRecords`, \
        `schemas/ResultRecords.json`): a task named there is finished; history 1; written only \
        by the leader, fenced on `_leader` |\n\
        | `{state}` | key-value bucket | `epoch`: the leadership epoch as decimal text, bumped \
        (compare-and-set) by every server start |\n\n\
        **Epochs.** Each leadership has an epoch, carried by `RegisterReply`, `HeartbeatReply`, \
        `Lease`, `Renew`, `AttemptReport` and `Revoke`; a renewal or report under another epoch \
        than the leader's is refused with `FAILED_PRECONDITION`.",
        stream = js.stream,
        results = js.results,
        state = js.state,
    );

    json!({
        "asyncapi": "3.0.0",
        "info": {
            "title": "cronoq",
            "version": PROTOCOL_VERSION.to_string(),
            "description": description,
            "license": { "name": "Apache-2.0" },
            "tags": [
                { "name": "client", "description": "Used by clients: submit, look up, cancel, wait." },
                { "name": "worker", "description": "Used by remote workers." },
            ],
        },
        "defaultContentType": "application/msgpack",
        "servers": {
            "nats": {
                "host": "localhost:4222",
                "protocol": "nats",
                "description": "Any NATS server with JetStream enabled; the address is the \
                    deployment's (`--nats`).",
            },
        },
        "channels": channels,
        "operations": operations,
        "components": { "messages": messages, "parameters": parameters },
    })
}

fn asyncapi_yaml(subjects: &Subjects) -> String {
    let document = sorted(&asyncapi(subjects));
    let mut out = String::from("# ");
    out.push_str(GENERATED);
    out.push('\n');
    // The usual order at the top; sorted keys below it.
    for key in [
        "asyncapi",
        "info",
        "defaultContentType",
        "servers",
        "channels",
        "operations",
        "components",
    ] {
        let mut one = Map::new();
        one.insert(key.into(), document[key].clone());
        yaml_value(&mut out, &Value::Object(one), 0);
    }
    out
}

/// The OpenAPI 3.1 document of the HTTP API, as `GET /v1/openapi.json`
/// serves it (generated by the library from the handlers; see
/// `cronoq::http::openapi_document`), in YAML.
fn openapi_yaml() -> String {
    let document = sorted(&cronoq::http::openapi_document());
    let mut out = String::from(
        "# Generated from the HTTP handlers by cronoq::http::openapi_document (served at\n\
         # GET /v1/openapi.json); do not edit. Regenerate: UPDATE_SCHEMAS=1 cargo test --test proto_schemas\n",
    );
    let keys: Vec<&String> = document.as_object().expect("an object").keys().collect();
    let first = ["openapi", "info", "paths", "components"];
    for key in first.iter().map(|k| k.to_string()).chain(
        keys.iter()
            .map(|k| k.to_string())
            .filter(|k| !first.contains(&k.as_str())),
    ) {
        if let Some(value) = document.get(&key) {
            let mut one = Map::new();
            one.insert(key.clone(), value.clone());
            yaml_value(&mut out, &Value::Object(one), 0);
        }
    }
    out
}

// ---- a small YAML emitter -------------------------------------------------
//
// Block style for maps and lists; strings double-quoted as JSON (a JSON
// string is a valid YAML double-quoted scalar), or as literal blocks when
// they span lines and need no escaping. No anchors, tags or plain strings,
// so nothing is read back as another type.

/// Appends `value` (a map or list) at `indent` spaces, line by line.
fn yaml_value(out: &mut String, value: &Value, indent: usize) {
    let pad = " ".repeat(indent);
    match value {
        Value::Object(map) => {
            for (key, item) in map {
                let _ = write!(out, "{pad}{}:", yaml_key(key));
                yaml_item(out, item, indent);
            }
        }
        Value::Array(items) => {
            for item in items {
                if is_block(item) {
                    // The item's first line, indented by two, starts with `- `.
                    let mut nested = String::new();
                    yaml_value(&mut nested, item, indent + 2);
                    let _ = write!(out, "{pad}- {}", &nested[indent + 2..]);
                } else {
                    let _ = write!(out, "{pad}-");
                    yaml_item(out, item, indent);
                }
            }
        }
        scalar => {
            let _ = writeln!(out, "{pad}{}", yaml_scalar(scalar, indent));
        }
    }
}

/// Appends what follows `key:` or `-`: a nested block or ` scalar`.
fn yaml_item(out: &mut String, item: &Value, indent: usize) {
    if is_block(item) {
        out.push('\n');
        yaml_value(out, item, indent + 2);
    } else {
        let _ = writeln!(out, " {}", yaml_scalar(item, indent + 2));
    }
}

fn is_block(value: &Value) -> bool {
    match value {
        Value::Object(map) => !map.is_empty(),
        Value::Array(items) => !items.is_empty(),
        _ => false,
    }
}

fn yaml_key(key: &str) -> String {
    let plain = key
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '$' || c == '_')
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '$' | '_' | '-' | '.'))
        && !matches!(
            key.to_ascii_lowercase().as_str(),
            "y" | "n" | "yes" | "no" | "on" | "off" | "true" | "false" | "null"
        );
    if plain {
        key.to_string()
    } else {
        serde_json::to_string(key).expect("json")
    }
}

/// A scalar or an empty map or list; multi-line text as a literal block
/// whose lines are indented by `indent`.
fn yaml_scalar(value: &Value, indent: usize) -> String {
    match value {
        Value::String(text) if literal_ok(text) => {
            let (chomp, body) = match text.strip_suffix('\n') {
                Some(body) => ("", body),
                None => ("-", text.as_str()),
            };
            let pad = " ".repeat(indent);
            let mut block = format!("|{chomp}");
            for line in body.split('\n') {
                block.push('\n');
                if !line.is_empty() {
                    block.push_str(&pad);
                    block.push_str(line);
                }
            }
            block
        }
        Value::Object(_) => "{}".into(),
        Value::Array(_) => "[]".into(),
        other => serde_json::to_string(other).expect("json"),
    }
}

/// Whether `text` can be a literal block: several lines, no control
/// characters, no leading or trailing blanks that a block would change.
fn literal_ok(text: &str) -> bool {
    let body = text.strip_suffix('\n').unwrap_or(text);
    body.contains('\n')
        && !body.starts_with([' ', '\n'])
        && !body.ends_with('\n')
        && !text.chars().any(|c| c.is_control() && c != '\n')
        && body.split('\n').all(|line| !line.ends_with(' '))
}

// ---- error-codes.md -------------------------------------------------------

/// Per code: HTTP status (`cronoq::http::status_of`, checked by
/// `tests/proto_schemas.rs`), meaning, and when cronoq returns it.
const CODE_DOCS: [(&str, u16, &str, &str, &str); 9] = [
    (
        "INVALID_ARGUMENT",
        400,
        "Bad Request",
        "The request is malformed: a bad name, label, duration, size or body. Sending it again \
         unchanged fails again.",
        "A body that does not decode as its message (`malformed message: …`); a pool name, \
         label, worker id or subject prefix outside the allowed characters or 64-character \
         limit; a bad `Cronoq-*` header value or an unknown `Cronoq-*` header; a payload above \
         the server's `max_payload_bytes`; `Register.slots` outside 1–100000; over HTTP, \
         malformed JSON, an unknown field or a task id that is not a number, and, with their \
         own status, a `POST` with a body or `Content-Type` that is not \
         `application/json` (415), a body over 2 MB (413), too many or too large headers (431), a URI over \
         64 KiB (414) or a malformed request line or header (400). A submission \
         refused after the submit stream stored it becomes a `failed` task (error `submission \
         refused: …`). A worker refused with it at registration stops.",
    ),
    (
        "UNAUTHENTICATED",
        401,
        "Unauthorized",
        "No credentials, or credentials that cannot be verified.",
        "Reserved for worker registration under `auth.required`; this build refuses to start \
         with `auth.required = true`, so it does not return the code yet. A worker refused with \
         it stops.",
    ),
    (
        "PERMISSION_DENIED",
        403,
        "Forbidden",
        "The credentials are valid but do not allow this (a pool or label the credential does \
         not grant), or, over HTTP, the request comes from a host or web page this server does \
         not serve.",
        "Reserved for worker registration under `auth.required`, like `UNAUTHENTICATED`. A \
         worker refused with it stops. Over HTTP, whatever the auth mode: a `Host` that is not \
         an IP address, `localhost` or a name of `http_allowed_hosts` (DNS rebinding; \
         `/healthz`, `/readyz` and `/metrics` excepted), and a `POST` whose `Origin` is another \
         site.",
    ),
    (
        "NOT_FOUND",
        404,
        "Not Found",
        "No such task, route or API verb.",
        "`P.api.task`, `P.api.cancel` and their HTTP routes for an id that is neither live, in \
         the results bucket (kept for `results_ttl`) nor in the submit stream; a request on \
         `P.api.<verb>` with an unknown verb; an unknown HTTP route or method. A client waiting \
         for a task it just submitted tolerates it for a few seconds.",
    ),
    (
        "ALREADY_EXISTS",
        409,
        "Conflict",
        "The thing exists already.",
        "The scheduler core refuses a second task with an id it knows. Clients do not normally \
         see it: the leader skips redelivered submissions, and JetStream absorbs a resubmission \
         with the same `Nats-Msg-Id` (answering with the first task's id).",
    ),
    (
        "RESOURCE_EXHAUSTED",
        429,
        "Too Many Requests",
        "A server-side limit was hit (too many waiting tasks, a quota); retry later, with \
         backoff.",
        "Reserved: no limit of this build returns it yet (an oversized payload is \
         `INVALID_ARGUMENT`).",
    ),
    (
        "FAILED_PRECONDITION",
        409,
        "Conflict",
        "The request is well formed but the current state does not allow it.",
        "Cancelling a task that has finished; `P.api.renew` or `P.api.outcome` for an attempt \
         whose lease is not the leader's current one (another epoch, worker or attempt: the \
         worker drops the attempt); an embedded scheduler with no executor for the task's pool; \
         a submit subject captured by a stream other than the submit stream (checked by the \
         client); a server option this build does not support.",
    ),
    (
        "UNAVAILABLE",
        503,
        "Service Unavailable",
        "Try again later: no leader answering, NATS unreachable, the server shutting down.",
        "No server answers a request on `P.api.*` in time; JetStream does not acknowledge a \
         submission; the submit stream or results bucket cannot be read; the leader's driver \
         has stopped; `/healthz` or `/readyz` when not live or not ready; over HTTP, a request \
         not answered within 30 s, or a connection beyond `http_max_connections` while every \
         open one is in a request with its body read (then closed). \
         Clients and workers \
         retry it.",
    ),
    (
        "INTERNAL",
        500,
        "Internal Server Error",
        "A bug or an unexpected failure; the details are in the log, not in the message.",
        "A reply that cannot be decoded (client and worker side). Over HTTP, a code this version \
         does not know (from a newer server) is answered with 500 too.",
    ),
];

fn error_codes_md() -> String {
    let mut out = String::new();
    let _ = writeln!(out, "<!-- {GENERATED} -->\n");
    out.push_str(
        "# Error codes\n\n\
         Wire and HTTP share one set of stable codes. Over NATS an error is the reply \
         `{\"error\": {\"code\": \"…\", \"message\": \"…\"}}` (MessagePack, \
         `schemas/WireError.json`); over HTTP it is the JSON body \
         `{\"code\": \"…\", \"message\": \"…\"}` with the status below. Branch on the code, \
         never on the message, and accept codes this list does not have yet (a newer server \
         may send them): treat an unknown code like `INTERNAL`.\n\n\
         | code | HTTP status | meaning |\n\
         |---|---|---|\n",
    );
    let docs = |code: &ErrorCode| {
        CODE_DOCS
            .iter()
            .find(|d| d.0 == code.as_str())
            .unwrap_or_else(|| {
                panic!("error code {code} has no documentation in tests/proto_gen/mod.rs")
            })
    };
    for code in ErrorCode::ALL {
        let (name, status, reason, meaning, _) = docs(&code);
        let _ = writeln!(out, "| `{name}` | {status} {reason} | {meaning} |");
    }
    out.push_str("\n## When cronoq returns each code\n");
    for code in ErrorCode::ALL {
        let (name, _, _, _, when) = docs(&code);
        let _ = write!(out, "\n### `{name}`\n\n{when}\n");
    }
    out
}

// ---- README.md ------------------------------------------------------------

fn readme_md(bodies: &[Body]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "<!-- {GENERATED} -->\n");
    out.push_str(
        "# proto-schemas\n\n\
         The contract of cronoq's wire protocol, generated from the Rust types of \
         `src/wire/` (and the core types they carry), so it cannot drift from the code.\n\n\
         | file | what |\n\
         |---|---|\n\
         | `asyncapi.yaml` | AsyncAPI 3.0 document: every NATS subject, who publishes what, \
         request/reply pairs, the plain-publish headers of a submission, the JetStream stream \
         and buckets |\n\
         | `openapi.yaml` | OpenAPI 3.1 document of the HTTP API (`/v1/...`), generated from \
         the handlers' request and answer types; also served at `GET /v1/openapi.json` |\n\
         | `schemas/*.json` | a JSON Schema (draft-07) per message body and reply, below |\n\
         | `error-codes.md` | every stable error code: meaning, HTTP status, when it is returned |\n\n\
         Bodies travel as MessagePack maps with field names; the schemas describe them in \
         JSON terms: a MessagePack `bin` (payload, output, signature) is an array of byte \
         values, `nil` is `null`, times are integer milliseconds since the Unix epoch and \
         spans integer milliseconds. `TaskStatus`, `Snapshot` and `WireError` are also the \
         JSON bodies of the HTTP API. `P.` stands for the subject prefix (`cronoq` by \
         default).\n\n\
         | schema | body of |\n\
         |---|---|\n",
    );
    for body in bodies {
        let _ = writeln!(
            out,
            "| [`{name}`](schemas/{name}.json) | {} |",
            body.used_on,
            name = body.name
        );
    }
    out.push_str(
        "\n## Regenerating\n\n\
         ```sh\n\
         cargo test --test proto_schemas                    # fails if a file here is stale\n\
         UPDATE_SCHEMAS=1 cargo test --test proto_schemas   # rewrites them\n\
         ```\n\n\
         Do not edit these files by hand: change the types (doc comments become \
         descriptions) or the texts in `tests/proto_gen/mod.rs`, then regenerate and commit the \
         result. The same test validates sample values of every type against its schema.\n",
    );
    out
}

mod tests {
    use super::*;

    fn yaml(value: Value) -> String {
        let mut out = String::new();
        yaml_value(&mut out, &value, 0);
        out
    }

    #[test]
    fn yaml_blocks_and_scalars() {
        let text = yaml(json!({
            "a": {"b": [1, "two", {"c": null, "d": true}], "e": {}, "f": []},
            "on": "x: y # z",
            "g": "line one\nline two\n\nline four",
        }));
        let want =
            "a:\n  b:\n    - 1\n    - \"two\"\n    - c: null\n      d: true\n  e: {}\n  f: []\n\
                    \"on\": \"x: y # z\"\n\
                    g: |-\n  line one\n  line two\n\n  line four\n";
        // Key order follows the map; compare line sets to stay independent of it.
        let mut got: Vec<&str> = text.lines().collect();
        let mut expected: Vec<&str> = want.lines().collect();
        got.sort_unstable();
        expected.sort_unstable();
        assert_eq!(got, expected, "{text}");
    }

    /// One row per code of `ErrorCode::ALL`, in its order, and none for a
    /// code it no longer has.
    #[test]
    fn code_docs_follow_the_list_of_codes() {
        let documented: Vec<&str> = CODE_DOCS.iter().map(|row| row.0).collect();
        let known: Vec<&str> = ErrorCode::ALL.iter().map(ErrorCode::as_str).collect();
        assert_eq!(documented, known);
    }

    #[test]
    fn awkward_strings_are_quoted() {
        for text in [
            " leading\nspace",
            "tab\tinside\nx",
            "trailing \nspace",
            "one line",
        ] {
            assert!(!literal_ok(text), "{text:?}");
        }
        assert!(literal_ok("two\nlines\n"));
        assert_eq!(yaml_scalar(&json!("a\nb\n"), 2), "|\n  a\n  b");
    }
}

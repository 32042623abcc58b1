//! `proto-schemas/` against the types it is generated from.
//!
//! * The checked-in files must equal what [`proto_gen::generate`] (the
//!   generator: a module of this test, not of the library) makes now;
//!   `UPDATE_SCHEMAS=1 cargo test --test proto_schemas` rewrites them (and
//!   removes files no longer generated).
//! * Sample values of every body, serialized with serde_json, validate
//!   against their schema made strict (no unknown properties), and every
//!   property of every schema is set by some sample: a hand-written or
//!   mirrored schema (`src/wire/schema.rs`) cannot drift from its type.
//! * The AsyncAPI document names exactly the subjects `Subjects` makes, the
//!   schema files it references exist, and every `Cronoq-*` header and
//!   error code is documented with the status `http::status_of` gives.

mod proto_gen;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use cronoq::core::{
    Autoscale, Backoff, ConcurrencyKeySnapshot, Core, Demand, ErrorCode, Event,
    FairnessKeySnapshot, FleetAutoscale, GroupSnapshot, Labels, LeaderInfo, Millis, PoolName,
    PoolSnapshot, QuotaSnapshot, RevokeReason, Snapshot, TaskId, TaskState, WaitReason, WorkerInfo,
};
use cronoq::task::{AttemptRecord, TaskStatus};
use cronoq::wire::{
    self, Ack, AttemptReport, AttemptReports, AttemptReportsReply, AttemptResult, Cancel,
    Challenge, ChallengeReply, Deregister, GetSnapshot, GetTask, Heartbeat, HeartbeatReply, Lease,
    Leases, Register, RegisterReply, Renew, RenewReply, Reply, Revoke, RunningAttempt,
    SessionGrant, Subjects, Submit, TaskEvent, WireError, PROTOCOL_VERSION,
};
use cronoq::wire::{ListTasks, TaskList};
use cronoq::Task;

const PREFIX: &str = "cronoq";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn generated() -> BTreeMap<String, String> {
    proto_gen::generate(PREFIX).into_iter().collect()
}

/// Every file under `dir`, relative to the crate root.
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else if let Ok(rel) = path.strip_prefix(root()) {
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
    out.sort();
    out
}

/// The first line where `have` and `want` differ, for the failure message.
fn first_difference(have: &str, want: &str) -> String {
    let (mut have_lines, mut want_lines) = (have.lines(), want.lines());
    let mut n = 1;
    loop {
        match (have_lines.next(), want_lines.next()) {
            (Some(h), Some(w)) if h == w => n += 1,
            (None, None) => return "only line endings differ".into(),
            (h, w) => {
                return format!(
                    "line {n}:\n      checked in: {}\n      generated:  {}",
                    h.unwrap_or("<end of file>"),
                    w.unwrap_or("<end of file>")
                )
            }
        }
    }
}

#[test]
fn checked_in_files_match_the_types() {
    let files = generated();
    let dir = root().join(proto_gen::DIR);
    let stale: Vec<String> = files_under(&dir)
        .into_iter()
        .filter(|path| !files.contains_key(path))
        .collect();
    let update = std::env::var("UPDATE_SCHEMAS").is_ok_and(|v| !v.is_empty() && v != "0");
    if update {
        for (path, text) in &files {
            let path: PathBuf = root().join(path);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
            if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
                std::fs::write(&path, text).expect("write a schema file");
                eprintln!("wrote {}", path.display());
            }
        }
        for path in &stale {
            std::fs::remove_file(root().join(path)).expect("remove a stale file");
            eprintln!("removed {path}");
        }
        return;
    }
    let mut problems = Vec::new();
    for (path, want) in &files {
        match std::fs::read_to_string(root().join(path)) {
            Ok(have) if have == *want => {}
            Ok(have) => problems.push(format!(
                "  {path} differs from the types, first at {}",
                first_difference(&have, want)
            )),
            Err(_) => problems.push(format!("  {path} is missing")),
        }
    }
    for path in &stale {
        problems.push(format!("  {path} is not generated any more"));
    }
    assert!(
        problems.is_empty(),
        "proto-schemas/ is out of date with the wire types:\n{}\n\
         regenerate it and review the diff:\n  \
         UPDATE_SCHEMAS=1 cargo test --test proto_schemas && git diff proto-schemas/",
        problems.join("\n")
    );
}

#[test]
fn generation_is_deterministic() {
    let a = proto_gen::generate(PREFIX);
    let b = proto_gen::generate(PREFIX);
    assert_eq!(a, b);
    let mut paths: Vec<&String> = a.iter().map(|(p, _)| p).collect();
    let before = paths.clone();
    paths.sort();
    paths.dedup();
    assert_eq!(paths, before, "paths are sorted and unique");
    for (path, text) in &a {
        assert!(text.ends_with('\n') && !text.ends_with("\n\n"), "{path}");
        assert!(!text.contains('\r') && !text.contains('\t'), "{path}");
        assert!(
            text.lines().all(|l| !l.ends_with(' ')),
            "{path} has trailing blanks"
        );
    }
}

// ---- samples -----------------------------------------------------------

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().copied().collect()
}

fn pool(name: &str) -> PoolName {
    PoolName::new(name).unwrap()
}

fn wire_error() -> WireError {
    WireError::new(
        ErrorCode::PERMISSION_DENIED,
        "worker may not claim gpu=h100",
    )
}

fn submits() -> Vec<Submit> {
    let full = Submit {
        v: PROTOCOL_VERSION,
        labels: labels(&[("gpu", "a100"), ("zone", "eu")]),
        payload: Bytes::from_static(&[0, 1, 255]),
        priority: -3,
        deadline: Some(Millis(1_800_000_000_000)),
        start_at: Some(Millis(1_800_000_060_000)),
        tolerance: Some(Millis(30_000)),
        est_runtime: Some(Millis(5_000)),
        max_attempts: Some(3),
        backoff: Some(Backoff {
            initial: Millis(100),
            max: Millis(10_000),
        }),
        attempt_timeout: Some(Millis(60_000)),
        idempotency_key: Some("order-1234".into()),
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        schedule: None,
        scheduled_at: None,
        fairness_key: Some("team-a".into()),
        fairness_weight: Some(3),
        concurrency_key: Some("deploy-prod".into()),
        concurrency_limit: Some(1),
        concurrency_policy: Some("cancel_running".into()),
        preemptible: Some(false),
    };
    // A schedule's fire, as the leader publishes it (sealed in headers).
    let fire = Submit {
        idempotency_key: Some("schedule:nightly:1796443200000".into()),
        schedule: Some("nightly".into()),
        scheduled_at: Some(Millis(1_796_443_200_000)),
        ..Submit::from_task(&Task::new("nightly report"))
    };
    vec![full, Submit::from_task(&Task::new("resize 42.png")), fire]
}

fn registers() -> Vec<Register> {
    let bare = Register {
        v: PROTOCOL_VERSION,
        worker_id: "gpu-node-7".into(),
        pool: pool("inference"),
        labels: labels(&[("gpu", "a100")]),
        slots: 2,
        xkey: None,
        instance: Some("5f3a9c1e0b7d2a64-4242".into()),
        running: vec![RunningAttempt {
            task_id: TaskId(42),
            attempt: 2,
        }],
        lease_batches: true,
    };
    let signed = Register {
        lease_batches: false,
        xkey: Some(nkeys::XKey::new().public_key()),
        labels: Labels::new(),
        ..bare.clone()
    };
    vec![bare, signed, registers_minimal()]
}

fn registers_minimal() -> Register {
    Register {
        lease_batches: false,
        v: PROTOCOL_VERSION,
        worker_id: "w".into(),
        pool: PoolName::default(),
        labels: Labels::new(),
        slots: 1,
        xkey: None,
        instance: None,
        running: Vec::new(),
    }
}

fn register_reply() -> RegisterReply {
    RegisterReply {
        v: PROTOCOL_VERSION,
        epoch: 7,
        heartbeat_interval: Millis(1_000),
        worker_timeout: Millis(3_000),
        lease_ttl: Millis(10_000),
        adopted: vec![RunningAttempt {
            task_id: TaskId(42),
            attempt: 2,
        }],
        session: Some(SessionGrant {
            id: "s0123456789abcdef01234567".into(),
            sealed_key: Bytes::from_static(&[7; 72]),
            server_xkey: nkeys::XKey::new().public_key(),
        }),
    }
}

fn heartbeats() -> Vec<Heartbeat> {
    vec![
        Heartbeat {
            v: PROTOCOL_VERSION,
            worker_id: "gpu-node-7".into(),
            free_slots: 1,
            running: vec![RunningAttempt {
                task_id: TaskId(42),
                attempt: 2,
            }],
        },
        Heartbeat {
            v: PROTOCOL_VERSION,
            worker_id: "w".into(),
            free_slots: 0,
            running: Vec::new(),
        },
    ]
}

fn heartbeat_reply() -> HeartbeatReply {
    HeartbeatReply {
        v: PROTOCOL_VERSION,
        epoch: 7,
        registered: false,
    }
}

fn deregisters() -> Vec<Deregister> {
    [true, false]
        .map(|drain| Deregister {
            v: PROTOCOL_VERSION,
            worker_id: "gpu-node-7".into(),
            drain,
        })
        .to_vec()
}

fn lease() -> Lease {
    Lease {
        v: PROTOCOL_VERSION,
        task_id: TaskId(42),
        attempt: 1,
        pool: pool("inference"),
        group: labels(&[("gpu", "a100")]),
        payload: Bytes::from_static(b"\x00payload\xff"),
        ttl: Millis(10_000),
        epoch: 7,
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        schedule: Some("nightly".into()),
        scheduled_at: Some(Millis(1_796_443_200_000)),
    }
}

fn leases() -> Vec<Leases> {
    let mut second = lease();
    second.task_id = TaskId(43);
    second.traceparent = None;
    vec![
        Leases {
            v: PROTOCOL_VERSION,
            leases: vec![lease(), second],
        },
        Leases {
            v: PROTOCOL_VERSION,
            leases: Vec::new(),
        },
    ]
}

/// The leader builds a `Leases` body from leases encoded already; it is
/// what encoding the whole would give, as the worker reads it.
#[test]
fn a_leases_body_built_from_encoded_leases_reads_as_leases() {
    for sample in leases() {
        let encoded: Vec<Bytes> = sample
            .leases
            .iter()
            .map(|l| Bytes::from(wire::encode(l)))
            .collect();
        let body = wire::leases_body(&encoded);
        assert_eq!(wire::decode::<Leases>(&body).unwrap(), sample);
        assert_eq!(body, wire::encode(&sample));
    }
    // Past 15 and 65,535 elements the array header grows.
    for n in [16, 70_000] {
        let one = Bytes::from(wire::encode(&lease()));
        let body = wire::leases_body(&vec![one; n]);
        assert_eq!(wire::decode::<Leases>(&body).unwrap().leases.len(), n);
    }
}

fn renew() -> Renew {
    Renew {
        v: PROTOCOL_VERSION,
        worker_id: "gpu-node-7".into(),
        task_id: TaskId(42),
        attempt: 1,
        epoch: 7,
    }
}

fn renew_reply() -> RenewReply {
    RenewReply {
        v: PROTOCOL_VERSION,
        ttl: Millis(10_000),
    }
}

fn reports() -> Vec<AttemptReport> {
    [
        AttemptResult::Succeeded {
            output: Bytes::from_static(&[0, 255]),
        },
        AttemptResult::Failed {
            error: "disk full".into(),
            retryable: true,
        },
        AttemptResult::Cancelled,
    ]
    .into_iter()
    .map(|result| AttemptReport {
        v: PROTOCOL_VERSION,
        worker_id: "gpu-node-7".into(),
        task_id: TaskId(42),
        attempt: 1,
        epoch: 7,
        result,
    })
    .collect()
}

fn report_batches() -> Vec<AttemptReports> {
    vec![
        AttemptReports {
            v: PROTOCOL_VERSION,
            worker_id: "gpu-node-7".into(),
            reports: reports(),
        },
        AttemptReports {
            v: PROTOCOL_VERSION,
            worker_id: "gpu-node-7".into(),
            reports: Vec::new(),
        },
    ]
}

fn reports_reply() -> AttemptReportsReply {
    AttemptReportsReply {
        v: PROTOCOL_VERSION,
        refused: vec![
            None,
            Some(WireError::new(
                ErrorCode::FAILED_PRECONDITION,
                "attempt 1 of task 42 is not current",
            )),
            None,
        ],
    }
}

fn revokes() -> Vec<Revoke> {
    [
        RevokeReason::Cancelled,
        RevokeReason::Timeout,
        RevokeReason::Preempted,
    ]
    .into_iter()
    .map(|reason| Revoke {
        v: PROTOCOL_VERSION,
        task_id: TaskId(42),
        attempt: 1,
        epoch: 7,
        reason,
        grace: (reason == RevokeReason::Preempted).then_some(Millis(30_000)),
    })
    .collect()
}

fn task_events() -> Vec<TaskEvent> {
    vec![
        TaskEvent {
            v: PROTOCOL_VERSION,
            task_id: TaskId(42),
            pool: pool("inference"),
            state: TaskState::Succeeded,
            attempt: 1,
            group: Some(labels(&[("gpu", "a100")])),
            worker: Some("gpu-node-7".into()),
            at: Millis(1_800_000_000_000),
        },
        TaskEvent {
            v: PROTOCOL_VERSION,
            task_id: TaskId(43),
            pool: pool("inference"),
            state: TaskState::Failed,
            attempt: 0,
            group: None,
            worker: None,
            at: Millis(1),
        },
    ]
}

fn task_statuses() -> Vec<TaskStatus> {
    let (output, output_base64) = cronoq::task::output_fields(Some(&b"\xffok"[..]));
    let full = TaskStatus {
        id: TaskId(42),
        pool: pool("inference"),
        state: TaskState::Succeeded,
        reason: Some(WaitReason::Backoff),
        reason_key: None,
        attempts: vec![
            AttemptRecord {
                attempt: 1,
                group: labels(&[("gpu", "a100")]),
                worker: Some("gpu-node-7".into()),
                credential: None,
                started_at: Millis(1_000),
                ended_at: Some(Millis(2_000)),
                outcome: Some("failed".into()),
                error: Some("disk full".into()),
            },
            AttemptRecord {
                attempt: 2,
                group: Labels::new(),
                worker: None,
                credential: None,
                started_at: Millis(3_000),
                ended_at: None,
                outcome: None,
                error: None,
            },
        ],
        output,
        output_base64,
        error: Some("disk full".into()),
        deadline_missed: true,
        schedule: Some("nightly".into()),
        scheduled_at: Some(Millis(1_796_443_200_000)),
        output_size: None,
    };
    // A status too large for one NATS message: its output left out.
    let left_out = TaskStatus {
        output: None,
        output_base64: None,
        output_size: Some(1_000_000),
        ..full.clone()
    };
    let mut statuses = vec![full, left_out];
    for reason in [
        WaitReason::NoGroupMatches,
        WaitReason::GroupsFull,
        WaitReason::HeldForReservation,
        WaitReason::Scheduled,
        WaitReason::Quota,
        WaitReason::Concurrency,
    ] {
        statuses.push(TaskStatus {
            id: TaskId(43),
            pool: PoolName::default(),
            state: TaskState::Queued,
            reason: Some(reason),
            reason_key: match reason {
                WaitReason::Quota => Some("team-b".into()),
                WaitReason::Concurrency => Some("deploy-prod".into()),
                _ => None,
            },
            attempts: Vec::new(),
            output: None,
            output_base64: None,
            error: None,
            deadline_missed: false,
            schedule: None,
            scheduled_at: None,
            output_size: None,
        });
    }
    statuses
}

/// A snapshot built by hand (every field, so a new field fails to compile
/// here) and one from a real core with groups and waiting demand.
fn snapshots() -> Vec<Snapshot> {
    let by_hand = Snapshot {
        leader: Some(LeaderInfo {
            id: "server-1".into(),
            epoch: 7,
        }),
        pools: vec![PoolSnapshot {
            name: pool("inference"),
            capacity: 4,
            busy: 1,
            waiting: 2,
            scheduled: 1,
            reserved: 1,
            deadline_missed: 0,
            autoscale: Autoscale {
                desired: 4,
                min: 0,
                max: u64::from(u32::MAX),
            },
            demand: vec![Demand {
                labels: labels(&[("gpu", "h100")]),
                waiting: 2,
                reason: Some(WaitReason::NoGroupMatches),
            }],
            groups: vec![GroupSnapshot {
                labels: labels(&[("gpu", "a100")]),
                capacity: 4,
                busy: 1,
                workers: 2,
            }],
            fleets: vec![FleetAutoscale {
                labels: labels(&[("gpu", "a100")]),
                desired: 1,
                waiting: 0,
                reserved: 0,
                busy: 1,
                capacity: 4,
                min: 0,
                max: 8,
                slots_per_worker: 2,
            }],
            waiting_without_fleet: 2,
            fairness_keys: vec![FairnessKeySnapshot {
                key: "team-a".into(),
                running: 1,
                waiting: 2,
                weight: Some(3),
                share_permille: 1000,
                quotas: vec![QuotaSnapshot {
                    labels: labels(&[("gpu", "a100")]),
                    max_running: 8,
                    held: 1,
                }],
            }],
            concurrency_keys: vec![ConcurrencyKeySnapshot {
                key: "deploy-prod".into(),
                running: 1,
                waiting: 1,
                limit: Some(1),
            }],
        }],
        workers: vec![WorkerInfo {
            id: "gpu-node-7".into(),
            pool: pool("inference"),
            labels: labels(&[("gpu", "a100")]),
            slots: 2,
            busy: 1,
            last_seen: Millis(1_800_000_000_000),
            draining: true,
        }],
        truncated: true,
    };
    let mut core = Core::new();
    let p = pool("inference");
    core.handle(
        Millis(0),
        Event::CapacitySet {
            pool: p.clone(),
            labels: labels(&[("gpu", "a100")]),
            slots: 1,
        },
    )
    .unwrap();
    for (id, gpu) in [(1, "a100"), (2, "a100"), (3, "h100")] {
        let spec = Task::new("x")
            .pool("inference")
            .label("gpu", gpu)
            .to_spec(TaskId(id), usize::MAX)
            .unwrap();
        core.handle(Millis(0), Event::Submitted(spec)).unwrap();
    }
    let from_core = core.snapshot();
    assert!(!from_core.pools[0].demand.is_empty() && !from_core.pools[0].groups.is_empty());
    vec![by_hand, from_core, Snapshot::default()]
}

/// `(schema name, samples as JSON)` for every generated schema file.
fn samples() -> BTreeMap<String, Vec<Value>> {
    fn each<T: Serialize>(items: impl IntoIterator<Item = T>) -> Vec<Value> {
        items
            .into_iter()
            .map(|t| serde_json::to_value(&t).unwrap())
            .collect()
    }
    fn replies<T: Serialize + Clone>(items: &[T]) -> Vec<Value> {
        let mut out = each(items.iter().cloned().map(Reply::Ok));
        out.extend(each(ErrorCode::ALL.map(|code| {
            Reply::<T>::Error(WireError::new(code, "something went wrong"))
        })));
        out
    }
    let mut all = BTreeMap::new();
    let mut add = |name: &str, values: Vec<Value>| {
        assert!(all.insert(name.to_string(), values).is_none(), "{name}");
    };
    add("Submit", each(submits()));
    add("Challenge", each([Challenge::default()]));
    let challenge_reply = ChallengeReply {
        v: PROTOCOL_VERSION,
        nonce: "n0123456789abcdef0123456789abcdef".into(),
    };
    add("ChallengeReply", each([challenge_reply.clone()]));
    add("Reply_ChallengeReply", replies(&[challenge_reply]));
    add("Register", each(registers()));
    add("RegisterReply", each([register_reply()]));
    add(
        "SessionGrant",
        each([register_reply().session.expect("the example has a session")]),
    );
    add("Heartbeat", each(heartbeats()));
    add("HeartbeatReply", each([heartbeat_reply()]));
    add("Deregister", each(deregisters()));
    add("Ack", each([Ack::default()]));
    add("Renew", each([renew()]));
    add("RenewReply", each([renew_reply()]));
    add("AttemptReport", each(reports()));
    add("AttemptReports", each(report_batches()));
    add("AttemptReportsReply", each([reports_reply()]));
    add(
        "Cancel",
        each([Cancel {
            v: PROTOCOL_VERSION,
            task_id: TaskId(42),
        }]),
    );
    add(
        "GetTask",
        each([GetTask {
            v: PROTOCOL_VERSION,
            task_id: TaskId(42),
        }]),
    );
    add(
        "GetTaskOutput",
        each([cronoq::wire::GetTaskOutput {
            v: PROTOCOL_VERSION,
            task_id: TaskId(42),
            offset: 1_048_000,
            limit: 1_044_480,
        }]),
    );
    add(
        "Reply_TaskOutputPage",
        replies(&[
            cronoq::wire::TaskOutputPage {
                v: PROTOCOL_VERSION,
                total: 3,
                data: bytes::Bytes::from_static(b"\x00ok"),
            },
            cronoq::wire::TaskOutputPage {
                v: PROTOCOL_VERSION,
                total: 0,
                data: bytes::Bytes::new(),
            },
        ]),
    );
    add("GetSnapshot", each([GetSnapshot::default()]));
    add(
        "ListTasks",
        each([ListTasks {
            v: PROTOCOL_VERSION,
            limit: 50,
        }]),
    );
    add("Lease", each([lease()]));
    add("Leases", each(leases()));
    add("Revoke", each(revokes()));
    add("TaskEvent", each(task_events()));
    add(
        "WireError",
        each(ErrorCode::ALL.map(|code| WireError::new(code, "message"))),
    );
    add("Reply_RegisterReply", replies(&[register_reply()]));
    add("Reply_HeartbeatReply", replies(&[heartbeat_reply()]));
    add("Reply_Ack", replies(&[Ack::default()]));
    add("Reply_RenewReply", replies(&[renew_reply()]));
    add("Reply_AttemptReportsReply", replies(&[reports_reply()]));
    add("Reply_TaskStatus", replies(&task_statuses()));
    add("Reply_Snapshot", replies(&snapshots()));
    let lists = [
        TaskList {
            tasks: task_statuses(),
        },
        TaskList { tasks: Vec::new() },
    ];
    add("Reply_TaskList", replies(&lists));
    add("TaskList", each(lists));
    add("TaskStatus", each(task_statuses()));
    add(
        "TaskRecord",
        each(
            task_statuses()
                .into_iter()
                .map(cronoq::wire::TaskRecord::of_status)
                .enumerate()
                .map(|(i, mut record)| {
                    // A live task's record says when it was written.
                    if !record.state.is_terminal() && i % 2 == 0 {
                        record.written_at = Some(Millis(1_764_000_000_000));
                    }
                    // A finished task's record names the key it held.
                    if record.state.is_terminal() && i % 2 == 0 {
                        record.key = Some("nightly-2026-12-05".into());
                    }
                    // A succeeded task's record holds its output (absent
                    // fields are not written).
                    if record.state == TaskState::Succeeded {
                        record.output = Some(bytes::Bytes::from_static(b"\xffok"));
                    }
                    record
                })
                .collect::<Vec<_>>(),
        ),
    );
    let started = |id: u64, worker: Option<&str>, error: Option<&str>| cronoq::wire::StartRecord {
        id: TaskId(id),
        pool: PoolName::new("gpu").unwrap(),
        attempt: cronoq::task::AttemptRecord {
            attempt: 1,
            group: Labels::parse("gpu=a100").unwrap(),
            worker: worker.map(str::to_string),
            credential: None,
            started_at: Millis(1_764_000_000_000),
            ended_at: None,
            outcome: None,
            // The type allows it; a start never carries one.
            error: error.map(str::to_string),
        },
    };
    add(
        "StartRecords",
        each([
            cronoq::wire::StartRecords {
                v: 1,
                written_at: Millis(1_764_000_000_000),
                starts: vec![
                    started(7, Some("worker-1"), None),
                    started(8, None, Some("e")),
                ],
            },
            cronoq::wire::StartRecords {
                v: 1,
                written_at: Millis(1),
                starts: Vec::new(),
            },
        ]),
    );
    let finished = |id: u64, key: Option<&str>| cronoq::wire::TaskRecord {
        key: key.map(str::to_string),
        ..cronoq::wire::TaskRecord::of_outcome(&cronoq::task::Outcome {
            id: TaskId(id),
            pool: PoolName::new("gpu").unwrap(),
            state: TaskState::Succeeded,
            output: Some(bytes::Bytes::from_static(b"ok")),
            error: None,
            attempts: vec![cronoq::task::AttemptRecord {
                ended_at: Some(Millis(1_764_000_000_050)),
                outcome: Some("succeeded".into()),
                ..started(id, Some("worker-1"), None).attempt
            }],
            deadline_missed: false,
            schedule: None,
        })
    };
    add(
        "ResultRecords",
        each([cronoq::wire::ResultRecords {
            v: 1,
            written_at: Millis(1_764_000_000_000),
            results: vec![
                finished(7, None),
                cronoq::wire::TaskRecord {
                    deadline_missed: true,
                    // The type allows it; a result in a batch has none.
                    written_at: Some(Millis(1_764_000_000_060)),
                    schedule: Some("nightly".into()),
                    scheduled_at: Some(Millis(1_764_000_000_000)),
                    ..finished(8, Some("k"))
                },
                cronoq::wire::TaskRecord {
                    state: TaskState::Failed,
                    output: None,
                    error: Some("exit 1".into()),
                    attempts: vec![cronoq::task::AttemptRecord {
                        ended_at: Some(Millis(1_764_000_000_050)),
                        outcome: Some("failed".into()),
                        ..started(9, Some("worker-1"), Some("exit 1")).attempt
                    }],
                    ..finished(9, None)
                },
            ],
        }]),
    );
    add("Snapshot", each(snapshots()));
    schedule_samples(&mut add, replies);
    all
}

/// The schedule verbs' bodies and replies (issue 23): every optional
/// field set by some sample.
fn schedule_samples(add: &mut impl FnMut(&str, Vec<Value>), replies: fn(&[Value]) -> Vec<Value>) {
    use cronoq::api::{BackfillReport, FireKind, FireRecord, MissedTicks, ScheduleCounters};
    use cronoq::api::{ScheduleEntry, ScheduleInfo};
    use cronoq::schedule::{MissReason, ScheduleSpec, ScheduleState};
    use cronoq::wire::{BackfillSchedule, CreateSchedule, ListSchedules, ScheduleName};
    fn value<T: Serialize>(t: T) -> Value {
        serde_json::to_value(t).unwrap()
    }
    let specs: Vec<ScheduleSpec> = [
        json!({"name": "nightly", "cron": "30 2 * * *", "tz": "Europe/Berlin",
               "overlap": "buffer_one", "catchup_window": "10m", "jitter": "30s", "paused": true,
               "task": {"pool": "reports", "labels": {"gpu": "a100"}, "priority": 3,
                        "payload": "build", "max_attempts": 2, "attempt_timeout": "20m",
                        "deadline": "1h"}}),
        json!({"name": "beat", "every": "1m"}),
    ]
    .into_iter()
    .map(|j| serde_json::from_value(j).unwrap())
    .collect();
    let fires = vec![
        FireRecord {
            tick: Millis(1_764_000_000_000),
            fired_at: Millis(1_764_000_000_010),
            kind: FireKind::Backfill,
            task: Some(TaskId(7)),
            outcome: Some(TaskState::Succeeded),
            error: None,
        },
        FireRecord {
            tick: Millis(1_764_000_060_000),
            fired_at: Millis(1_764_000_060_010),
            kind: FireKind::Trigger,
            task: None,
            outcome: None,
            error: Some("pool reports is full [RESOURCE_EXHAUSTED]".into()),
        },
    ];
    let counters = ScheduleCounters {
        fires: 2,
        skipped: 1,
        missed: 3,
    };
    let infos: Vec<Value> = specs
        .iter()
        .map(|spec| {
            value(ScheduleInfo {
                spec: spec.clone(),
                state: ScheduleState {
                    decided_through: Millis(1_764_000_060_000),
                    last_fired: Some(Millis(1_764_000_060_000)),
                    active: Some(Millis(1_764_000_060_000)),
                    buffered: Some(Millis(1_764_000_120_000)),
                },
                paused: spec.paused,
                owner: spec.paused.then(|| "token:OPS".into()),
                created_at: Millis(1_764_000_000_000),
                next_fires: vec![Millis(1_764_000_120_000); 5],
                history: fires.clone(),
                skipped: vec![Millis(1_764_000_030_000)],
                missed: vec![MissedTicks {
                    first: Millis(1_763_000_000_000),
                    until: Millis(1_763_000_180_000),
                    reason: MissReason::TooLate,
                    ticks: 3,
                }],
                counters,
            })
        })
        .collect();
    let entry = |spec: &ScheduleSpec, last: Option<FireRecord>| ScheduleEntry {
        name: spec.name.clone(),
        cron: spec.cron.clone(),
        every: spec.every.clone(),
        tz: spec.tz.clone(),
        overlap: spec.overlap,
        pool: "default".into(),
        paused: spec.paused,
        owner: last.as_ref().map(|_| "token:OPS".into()),
        next_fire: last.as_ref().map(|_| Millis(1_764_000_120_000)),
        last,
        counters,
    };
    let lists = vec![
        value(cronoq::wire::ScheduleList {
            schedules: vec![
                entry(&specs[0], Some(fires[0].clone())),
                entry(&specs[1], Some(fires[1].clone())),
                entry(&specs[1], None),
            ],
            more: true,
        }),
        value(cronoq::wire::ScheduleList::<ScheduleEntry> {
            schedules: Vec::new(),
            more: false,
        }),
    ];
    let reports = vec![value(BackfillReport {
        fired: fires.clone(),
        skipped: vec![Millis(1_764_000_030_000)],
    })];
    add(
        "CreateSchedule",
        specs
            .iter()
            .cloned()
            .map(CreateSchedule::new)
            .map(value)
            .collect(),
    );
    add(
        "ListSchedules",
        vec![
            value(ListSchedules::after(None)),
            value(ListSchedules::after(Some("beat".into()))),
        ],
    );
    add("ScheduleName", vec![value(ScheduleName::new("nightly"))]);
    add(
        "BackfillSchedule",
        vec![value(BackfillSchedule::new(
            "nightly",
            Millis(1_764_000_000_000),
            Millis(1_764_003_600_000),
        ))],
    );
    add("Reply_ScheduleInfo", replies(&infos));
    add("Reply_ScheduleList", replies(&lists));
    add(
        "Reply_FireRecord",
        replies(&fires.into_iter().map(value).collect::<Vec<_>>()),
    );
    add("Reply_BackfillReport", replies(&reports));
}

/// `schema` where every object schema with properties refuses others, so
/// a field the type has and the schema lacks fails validation.
fn strict(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => {
            let mut out: serde_json::Map<String, Value> =
                map.iter().map(|(k, v)| (k.clone(), strict(v))).collect();
            if out.contains_key("properties") && !out.contains_key("additionalProperties") {
                out.insert("additionalProperties".into(), Value::Bool(false));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(strict).collect()),
        other => other.clone(),
    }
}

/// Records `(definition, property)` for every property `instance` sets,
/// following `$ref`s, combinators and items of `schema`.
fn cover(
    root: &Value,
    context: &str,
    schema: &Value,
    instance: &Value,
    seen: &mut BTreeSet<(String, String)>,
) {
    if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
        let name = reference
            .strip_prefix("#/definitions/")
            .expect("local definition refs only");
        cover(root, name, &root["definitions"][name], instance, seen);
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        for branch in schema
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            cover(root, context, branch, instance, seen);
        }
    }
    if let (Some(properties), Some(object)) = (
        schema.get("properties").and_then(Value::as_object),
        instance.as_object(),
    ) {
        for (name, value) in object {
            if let Some(property) = properties.get(name) {
                seen.insert((context.to_string(), name.clone()));
                cover(root, context, property, value, seen);
            }
        }
    }
    if let (Some(items), Some(array)) = (schema.get("items"), instance.as_array()) {
        for item in array {
            cover(root, context, items, item, seen);
        }
    }
}

/// Every `(definition, property)` a schema declares.
fn declared(name: &str, schema: &Value) -> BTreeSet<(String, String)> {
    fn walk(context: &str, schema: &Value, out: &mut BTreeSet<(String, String)>) {
        match schema {
            Value::Object(map) => {
                if let Some(Value::Object(properties)) = map.get("properties") {
                    for (property, sub) in properties {
                        out.insert((context.to_string(), property.clone()));
                        walk(context, sub, out);
                    }
                }
                for (key, sub) in map {
                    if key != "properties" && key != "definitions" {
                        walk(context, sub, out);
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|i| walk(context, i, out)),
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    walk(name, schema, &mut out);
    if let Some(Value::Object(definitions)) = schema.get("definitions") {
        for (def, sub) in definitions {
            walk(def, sub, &mut out);
        }
    }
    out
}

fn schema_files() -> BTreeMap<String, Value> {
    generated()
        .into_iter()
        .filter_map(|(path, text)| {
            let name = path
                .strip_prefix("proto-schemas/schemas/")?
                .strip_suffix(".json")?
                .to_string();
            Some((name, serde_json::from_str(&text).expect("a schema is JSON")))
        })
        .collect()
}

#[test]
fn samples_validate_against_their_schemas() {
    let schemas = schema_files();
    let samples = samples();
    assert_eq!(
        schemas.keys().collect::<Vec<_>>(),
        samples.keys().collect::<Vec<_>>(),
        "every schema file has samples, and every sampled type a schema file"
    );
    let mut problems = Vec::new();
    for (name, schema) in &schemas {
        if let Err(e) = jsonschema::meta::validate(schema) {
            problems.push(format!("{name}.json is not a valid JSON Schema: {e}"));
            continue;
        }
        let validator = jsonschema::draft7::new(&strict(schema)).expect("a schema compiles");
        let mut seen = BTreeSet::new();
        for (i, sample) in samples[name].iter().enumerate() {
            for error in validator.iter_errors(sample) {
                problems.push(format!(
                    "{name}: sample {i} fails at `{}`: {error}",
                    error.instance_path
                ));
            }
            cover(schema, name, schema, sample, &mut seen);
        }
        for (context, property) in declared(name, schema).difference(&seen) {
            problems.push(format!(
                "{name}: no sample sets {context}.{property}: does the type have it? \
                 (else add a sample that sets it)"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn schemas_refuse_wrong_bodies() {
    let schemas = schema_files();
    let refuse = |name: &str, body: Value| {
        let validator = jsonschema::draft7::new(&schemas[name]).unwrap();
        assert!(!validator.is_valid(&body), "{name} accepted {body}");
    };
    refuse("Register", json!({"v": 1, "pool": "p", "slots": 1}));
    refuse(
        "Register",
        json!({"worker_id": "w", "pool": "a.b", "slots": 1}),
    );
    refuse("Lease", json!({"task_id": 0}));
    refuse(
        "Reply_Ack",
        json!({"ok": {"v": 1}, "error": {"code": "INTERNAL", "message": ""}}),
    );
    refuse("TaskStatus", json!({"id": 1, "pool": "p", "state": "lost"}));
    refuse(
        "AttemptReport",
        json!({"worker_id": "w", "task_id": 1, "attempt": 1, "epoch": 1, "result": "lost"}),
    );
    refuse(
        "Submit",
        json!({"payload": [1], "labels": {"gpu": "a 100"}}),
    );
    refuse("Submit", json!({"payload": [256]}));
}

/// Messages survive MessagePack both ways (what actually travels).
#[test]
fn samples_round_trip_through_message_pack() {
    fn check<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(items: Vec<T>) {
        for item in items {
            let back: T = wire::decode(&wire::encode(&item)).unwrap();
            assert_eq!(back, item);
        }
    }
    check(submits());
    check(registers());
    check(heartbeats());
    check(deregisters());
    check(reports());
    check(report_batches());
    check(vec![reports_reply()]);
    check(revokes());
    check(task_events());
    check(task_statuses());
    check(snapshots());
    check(vec![lease()]);
    check(leases());
    check(vec![
        Reply::Ok(register_reply()),
        Reply::Error(wire_error()),
    ]);
}

// ---- AsyncAPI and error codes -------------------------------------------

fn file(path: &str) -> String {
    generated()
        .remove(path)
        .unwrap_or_else(|| panic!("{path} is generated"))
}

/// The `address:` values of the AsyncAPI document.
fn addresses(yaml: &str) -> BTreeSet<String> {
    yaml.lines()
        .filter_map(|l| l.trim_start().strip_prefix("address: "))
        .filter(|a| *a != "null")
        .map(|a| serde_json::from_str::<String>(a).expect("a quoted address"))
        .collect()
}

#[test]
fn asyncapi_names_every_subject() {
    let yaml = file("proto-schemas/asyncapi.yaml");
    assert!(yaml.contains("\nasyncapi: \"3.0.0\"\n"));
    assert!(yaml.contains("\ndefaultContentType: \"application/msgpack\"\n"));
    let subjects = Subjects::new(PREFIX).unwrap();
    let fill = |address: &str| {
        address
            .replace("{prefix}", PREFIX)
            .replace("{pool}", "inference")
            .replace("{worker_id}", "w1")
            .replace("{task_id}", "42")
    };
    let documented: BTreeSet<String> = addresses(&yaml).iter().map(|a| fill(a)).collect();
    let mut expected: BTreeSet<String> = [
        "cancel",
        "task",
        "task_output",
        "snapshot",
        "tasks",
        "schedule_create",
        "schedule_list",
        "schedule_get",
        "schedule_pause",
        "schedule_resume",
        "schedule_delete",
        "schedule_trigger",
        "schedule_backfill",
    ]
    .iter()
    .map(|verb| subjects.api(verb))
    .collect();
    for verb in [
        "challenge",
        "register",
        "heartbeat",
        "deregister",
        "renew",
        "outcome",
        "outcomes",
    ] {
        expected.insert(subjects.worker_api("w1", verb));
    }
    expected.insert(subjects.submit(&pool("inference")));
    expected.insert(subjects.lease("w1"));
    expected.insert(subjects.leases("w1"));
    expected.insert(subjects.revoke("w1"));
    expected.insert(subjects.events(TaskId(42)));
    assert_eq!(documented, expected);

    for name in schema_files().keys() {
        // Bare replies travel inside `Reply_*`; the HTTP bodies stand alone.
        let inner = [
            "ChallengeReply",
            "SessionGrant",
            "RegisterReply",
            "HeartbeatReply",
            "Ack",
            "RenewReply",
            "AttemptReportsReply",
            "WireError",
            "TaskStatus",
            "Snapshot",
            "TaskList",
            // Stored in the results bucket, never sent on a subject.
            "TaskRecord",
            "StartRecords",
            "ResultRecords",
        ];
        if !inner.contains(&name.as_str()) {
            assert!(
                yaml.contains(&format!("$ref: \"./schemas/{name}.json\"")),
                "asyncapi.yaml does not use {name}"
            );
        }
    }
    let files = generated();
    for reference in yaml
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("$ref: \"./"))
    {
        let path = format!("proto-schemas/{}", reference.trim_end_matches('"'));
        assert!(
            files.contains_key(&path),
            "{path} is referenced but not generated"
        );
    }
    for header in wire::SUBMIT_HEADERS {
        assert!(
            yaml.contains(&format!("{header}:")),
            "{header} undocumented"
        );
    }
    for name in [
        subjects.submit_stream(),
        subjects.results_bucket(),
        "CRONOQ_STATE".into(),
    ] {
        assert!(yaml.contains(&name), "{name} undocumented");
    }
}

#[test]
fn error_codes_carry_the_http_status() {
    let text = file("proto-schemas/error-codes.md");
    for code in ErrorCode::ALL {
        let status = cronoq::http::status_of(&code);
        let row = format!(
            "| `{code}` | {} {} |",
            status.as_u16(),
            status.canonical_reason().unwrap()
        );
        assert!(text.contains(&row), "error-codes.md lacks the row {row}");
        assert!(text.contains(&format!("### `{code}`")), "{code}");
    }
}

/// The README's "Errors" section names the codes of `ErrorCode::ALL`, no
/// more and no fewer.
#[test]
fn the_readme_names_every_error_code() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let section = readme
        .split("\n## Errors\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("README.md has an `## Errors` section");
    let named: BTreeSet<&str> = section
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|word| word.len() > 4 && word.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .collect();
    let known: BTreeSet<&str> = ErrorCode::ALL.iter().map(ErrorCode::as_str).collect();
    assert_eq!(named, known, "README.md `## Errors` against ErrorCode::ALL");
}

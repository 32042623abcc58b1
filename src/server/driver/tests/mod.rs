//! The driver's unit tests.

use super::*;
use crate::server::{Replies, Waiting};
use crate::task::AttemptRecord;
use crate::wire::TaskEvent;

thread_local! {
    /// The test's local callers, as the shell keeps them.
    static REPLIES: Replies = Replies::default();
}

/// A local request: where the driver answers it, and its caller's wait.
fn local<T>() -> (Responder, Waiting<T>) {
    REPLIES.with(|r| r.open())
}

fn settings() -> Settings {
    Settings {
        server_id: "s1".into(),
        lease_ttl: Millis(10_000),
        worker_timeout: Millis(5_000),
        heartbeat_interval: Millis(1_000),
        max_payload_bytes: 1024,
        max_reply_bytes: 1 << 20,
        max_record_bytes: 1 << 20,
        retain_finished: 100,
        pools: Vec::new(),
        max_workers: 1_000_000,
        limits: crate::core::Limits::default(),
        reattach_grace: Millis(3_000),
        events: crate::server::config::Events::All,
        max_schedules: crate::schedule::DEFAULT_MAX_SCHEDULES,
        schedules_refused: None,
        auth: Default::default(),
        trace: None,
    }
}

fn driver() -> Driver {
    driver_with(7, settings())
}

/// A driver of `epoch` with `settings`, started at 0.
fn driver_with(epoch: u64, settings: Settings) -> Driver {
    Driver::new(Subjects::default(), epoch, settings, Millis(0))
}

/// Hands local callers their replies (the runner does so once the
/// turn's records are stored); keeps the other outputs for the test.
fn answer(d: &mut Driver) {
    let mut kept = Vec::new();
    for output in d.take_outputs() {
        match output {
            Output::Reply { id, reply } => REPLIES.with(|r| r.send(id, reply)),
            other => kept.push(other),
        }
    }
    d.out = kept;
}

fn register(d: &mut Driver, id: &str, labels: &str, slots: u32) {
    let reply = try_register(d, 0, id, "p", labels, slots, Some("i1"));
    assert_eq!(reply.unwrap().epoch, 7);
}

fn try_register(
    d: &mut Driver,
    now: u64,
    id: &str,
    pool: &str,
    labels: &str,
    slots: u32,
    instance: Option<&str>,
) -> Result<RegisterReply, WireError> {
    send_register(
        d,
        now,
        Register {
            lease_batches: false,
            v: 1,
            worker_id: id.into(),
            pool: PoolName::new(pool).unwrap(),
            labels: Labels::parse(labels).unwrap(),
            slots,
            xkey: None,
            instance: instance.map(str::to_string),
            running: Vec::new(),
        },
    )
}

/// Hands `register` to the driver; its answer.
fn send_register(d: &mut Driver, now: u64, register: Register) -> Result<RegisterReply, WireError> {
    let (tx, mut rx) = local();
    d.handle(
        Millis(now),
        Input::Register(register, Default::default(), tx),
    );
    answer(d);
    rx.try_recv().unwrap()
}

/// A worker's report of an attempt's end; the leader's answer.
fn report(
    d: &mut Driver,
    now: u64,
    worker: &str,
    task_id: TaskId,
    attempt: u32,
    epoch: u64,
    result: AttemptResult,
) -> Result<Ack, WireError> {
    let (tx, mut rx) = local();
    let report = AttemptReport {
        v: 1,
        worker_id: worker.into(),
        task_id,
        attempt,
        epoch,
        result,
    };
    d.handle(Millis(now), Input::Outcome(report, tx));
    answer(d);
    rx.try_recv().unwrap()
}

fn deregister(d: &mut Driver, now: u64, worker: &str) {
    let (tx, _rx) = local::<()>();
    let body = Deregister {
        v: 1,
        worker_id: worker.into(),
        drain: false,
    };
    d.handle(Millis(now), Input::Deregister(body, tx));
}

fn snapshot(d: &mut Driver) -> Snapshot {
    let (tx, mut rx) = local();
    d.handle(Millis(0), Input::Snapshot(tx));
    answer(d);
    rx.try_recv().unwrap().unwrap()
}

/// Issue 7 finding 6: a second process with a live worker's id is
/// refused; the same process again is idempotent; once the first has
/// timed out the id is free.
#[test]
fn a_live_worker_id_cannot_be_taken_by_another_process() {
    let mut d = driver();
    register(&mut d, "dup", "", 2);
    submit(&mut d, 1, 1, "");
    assert_eq!(leases(&mut d).len(), 1);
    let e = try_register(&mut d, 1, "dup", "p", "", 2, Some("other")).unwrap_err();
    assert_eq!(e.code, ErrorCode::ALREADY_EXISTS, "{e:?}");
    let e = try_register(&mut d, 1, "dup", "p", "", 2, None).unwrap_err();
    assert_eq!(e.code, ErrorCode::ALREADY_EXISTS);
    // Nothing changed: one worker, its attempt still leased to it.
    let snap = snapshot(&mut d);
    assert_eq!(snap.workers.len(), 1);
    assert_eq!(snap.workers[0].busy, 1);
    assert_eq!(d.status(TaskId(1)).unwrap().state, TaskState::Running);
    // The same process retrying its registration: accepted, no change.
    try_register(&mut d, 2, "dup", "p", "", 2, Some("i1")).unwrap();
    assert_eq!(snapshot(&mut d).workers[0].busy, 1);
    assert!(leases(&mut d).is_empty());
    // Silent past worker_timeout: removed, and the id is free again.
    d.housekeeping(Millis(10_000));
    try_register(&mut d, 10_001, "dup", "p", "", 2, Some("other")).unwrap();
}

/// Issue 7 findings 4 and 5: registration is O(log n) (100,000 workers
/// into one group would take minutes with the old per-registration
/// re-sum), and the group total is u64, saturating at u32::MAX for the
/// core instead of wrapping.
#[test]
fn many_big_workers_in_one_group_neither_wrap_nor_rescan() {
    let mut d = driver();
    for i in 0..100_000u32 {
        try_register(&mut d, 0, &format!("w{i}"), "p", "gpu=a100", 100_000, None).unwrap();
    }
    let snap = snapshot(&mut d);
    let group = &snap.pools[0].groups[0];
    assert_eq!(group.capacity, u32::MAX, "saturated, not wrapped");
    assert_eq!(group.workers, 100_000);
    // Removing one keeps the exact u64 total underneath.
    deregister(&mut d, 1, "w0");
    let key = (
        PoolName::new("p").unwrap(),
        Labels::parse("gpu=a100").unwrap(),
    );
    assert_eq!(d.groups[&key].slots, 99_999 * 100_000);
}

/// Issue 7 finding 3: a worker of an undeclared pool is refused when
/// they are not allowed; pools beyond max_pools and workers beyond
/// max_workers are RESOURCE_EXHAUSTED; nothing registers.
#[test]
fn registration_limits() {
    let mut s = settings();
    s.pools = vec![(
        PoolName::new("p").unwrap(),
        crate::core::PoolConfig::default(),
    )];
    s.limits.allow_undeclared_pools = false;
    s.max_workers = 2;
    let mut d = Driver::new(Subjects::default(), 7, s, Millis(0));
    let e = try_register(&mut d, 0, "x", "elsewhere", "", 1, None).unwrap_err();
    assert_eq!(e.code, ErrorCode::NOT_FOUND);
    try_register(&mut d, 0, "a", "p", "", 1, None).unwrap();
    try_register(&mut d, 0, "b", "p", "", 1, None).unwrap();
    let e = try_register(&mut d, 0, "c", "p", "", 1, None).unwrap_err();
    assert_eq!(e.code, ErrorCode::RESOURCE_EXHAUSTED);
    assert_eq!(snapshot(&mut d).workers.len(), 2);

    let mut s = settings();
    s.limits.max_pools = 1;
    let mut d = Driver::new(Subjects::default(), 7, s, Millis(0));
    try_register(&mut d, 0, "a", "p1", "", 1, None).unwrap();
    let e = try_register(&mut d, 0, "b", "p2", "", 1, None).unwrap_err();
    assert_eq!(e.code, ErrorCode::RESOURCE_EXHAUSTED);
    assert_eq!(snapshot(&mut d).pools.len(), 1);
}

/// Issue 7 finding 3: an undeclared pool is forgotten once it has no
/// workers and no tasks, so 10,000 names leave nothing behind.
#[test]
fn idle_undeclared_pools_are_forgotten() {
    let mut d = driver();
    for i in 0..10_000u64 {
        let pool = format!("pool{i}");
        d.handle(
            Millis(1),
            Input::Submitted {
                seq: i + 1,
                pool: PoolName::new(&pool).unwrap(),
                task: Ok(Task::new("x")
                    .pool(pool.as_str())
                    .label("k", format!("v{i}"))),
            },
        );
    }
    assert_eq!(d.core.pool_count(), 10_000);
    for i in 0..10_000u64 {
        let (tx, _rx) = local::<()>();
        d.handle(Millis(2), Input::Cancel(TaskId(i + 1), tx));
    }
    assert_eq!(d.core.pool_count(), 0);
    assert!(snapshot(&mut d).pools.is_empty());
    // A worker's pool goes when the worker does.
    register(&mut d, "w", "", 1);
    assert_eq!(d.core.pool_count(), 1);
    deregister(&mut d, 3, "w");
    assert_eq!(d.core.pool_count(), 0);
    d.core.check_invariants().unwrap();
}

/// Issue 20 finding 4: submissions no credential verifies on are counted
/// by code, the last 64 kept, and dropped with the purge — no record, no
/// dead letter, no event — and the next valid submission runs.
#[test]
fn unattributed_submissions_are_counted_and_dropped_not_recorded() {
    let mut d = driver();
    register(&mut d, "a", "", 1);
    let _ = d.take_outputs();
    for seq in 1..=100 {
        d.handle(
            Millis(1),
            Input::Unattributed {
                seq,
                error: WireError::new(ErrorCode::UNAUTHENTICATED, "no proof"),
            },
        );
    }
    let outputs = d.take_outputs();
    assert_eq!(outputs.len(), 100, "{outputs:?}");
    assert!(outputs.iter().all(|o| matches!(o, Output::Discard { .. })));
    assert_eq!(d.purge_floor(), 101);
    assert_eq!(d.consumed_below(), 101);
    assert!(d.status(TaskId(1)).is_none());
    let (tx, mut rx) = local::<crate::metrics::MetricsSnapshot>();
    d.handle(Millis(2), Input::Metrics(tx));
    answer(&mut d);
    let server = rx.try_recv().unwrap().unwrap().server.unwrap();
    assert_eq!(server.refused_unattributed["UNAUTHENTICATED"], 100);
    assert_eq!(server.refused_sample.len(), crate::metrics::REFUSED_SAMPLE);
    assert_eq!(server.refused_sample.last().map(|r| r.seq), Some(100));
    submit(&mut d, 3, 101, "");
    assert_eq!(leases(&mut d).len(), 1);
}

/// Issue 7 finding 1: a submission the core refuses (a deadline more
/// than 10 years ahead) is recorded failed with its reason and goes to
/// the dead-letter stream, and the next submission runs as usual.
#[test]
fn a_refused_submission_fails_with_its_reason_and_is_dead_lettered() {
    let mut d = driver();
    register(&mut d, "a", "", 1);
    let far = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1 << 40);
    d.handle(
        Millis(1),
        Input::Submitted {
            seq: 1,
            pool: PoolName::new("p").unwrap(),
            task: Ok(Task::new("x").pool("p").deadline(far)),
        },
    );
    let outputs = d.take_outputs();
    let dead = outputs.iter().find_map(|o| match o {
        Output::Persist {
            seq: 1,
            record,
            dead_letter: Some(e),
        } => Some((record.clone(), e.clone())),
        _ => None,
    });
    let (status, reason) = dead.expect("a dead letter for submission 1");
    assert_eq!(status.state, TaskState::Failed);
    assert_eq!(reason.code, ErrorCode::INVALID_ARGUMENT);
    assert!(status.error.unwrap().contains("10 years"));
    submit(&mut d, 2, 2, "");
    assert_eq!(leases(&mut d).len(), 1);
    assert_eq!(d.purge_floor(), 2);
}

/// Issue 7 finding 3: the snapshot a NATS request gets fits in one
/// message however many workers there are.
#[test]
fn a_nats_snapshot_reply_fits_in_one_message() {
    let mut s = settings();
    s.max_reply_bytes = 64 * 1024;
    let mut d = Driver::new(Subjects::default(), 7, s, Millis(0));
    for i in 0..5_000u32 {
        try_register(&mut d, 0, &format!("worker-{i:05}"), "p", "", 1, None).unwrap();
    }
    let _ = d.take_outputs();
    d.handle(
        Millis(1),
        Input::Snapshot(Responder::Nats(Some("reply".into()))),
    );
    let out = d.take_outputs();
    let Output::Publish { body, .. } = &out[0] else {
        panic!("{out:?}")
    };
    assert!(body.len() <= 64 * 1024, "{} bytes", body.len());
    let snap: Snapshot = wire::decode_reply(body).unwrap();
    assert!(snap.truncated);
    assert!(!snap.workers.is_empty());
    assert_eq!(snap.pools[0].capacity, 5_000);
}

/// Issue 8: an attempt revoked for its timeout is recorded `lost` with
/// the reason `timeout` (as embedded does and the core counts it),
/// not `cancelled`, and is retried.
#[test]
fn an_attempt_revoked_for_its_timeout_is_lost_with_reason_timeout() {
    let mut d = driver();
    register(&mut d, "a", "", 1);
    d.handle(
        Millis(0),
        Input::Submitted {
            seq: 1,
            pool: PoolName::new("p").unwrap(),
            task: Ok(Task::new("x")
                .pool("p")
                .attempt_timeout(std::time::Duration::from_millis(500))),
        },
    );
    assert_eq!(leases(&mut d).len(), 1);
    d.housekeeping(Millis(600));
    let revoked = d
        .take_outputs()
        .into_iter()
        .any(|o| matches!(o, Output::Publish { subject, .. } if subject.ends_with(".revoke")));
    assert!(revoked);
    report(&mut d, 650, "a", TaskId(1), 1, 7, AttemptResult::Cancelled).unwrap();
    let status = d.status(TaskId(1)).unwrap();
    assert_eq!(status.attempts[0].outcome.as_deref(), Some("lost"));
    assert_eq!(status.attempts[0].error.as_deref(), Some("timeout"));
    assert_eq!(status.state, TaskState::Queued, "retried");
}

/// Issue 9's heartbeat flood, bounded here: a heartbeat listing 35,000
/// attempts this leader never leased costs at most its slots' worth of
/// revocations.
#[test]
fn a_heartbeat_listing_thousands_of_attempts_costs_at_most_its_slots() {
    let mut d = driver();
    register(&mut d, "a", "", 2);
    // Two revokes at most.
    assert!(heartbeat_listing(&mut d, 1, "a", 0..35_000) <= 2);
}

fn submit(d: &mut Driver, now: u64, seq: u64, labels: &str) {
    let mut task = Task::new("x").pool("p");
    for item in labels.split(',').filter(|s| !s.is_empty()) {
        task = task.label_text(item);
    }
    d.handle(
        Millis(now),
        Input::Submitted {
            seq,
            pool: PoolName::new("p").unwrap(),
            task: Ok(task),
        },
    );
}

fn leases(d: &mut Driver) -> Vec<(String, Lease)> {
    d.take_outputs()
        .into_iter()
        .filter_map(|o| match o {
            Output::Lease { subject, body, .. } => {
                Some((subject, wire::decode::<Lease>(&body).unwrap()))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn labeled_and_unlabeled_go_to_their_workers() {
    let mut d = driver();
    register(&mut d, "cpu", "", 1);
    register(&mut d, "gpu", "gpu=a100", 1);
    submit(&mut d, 1, 1, "");
    submit(&mut d, 1, 2, "gpu=a100");
    let l = leases(&mut d);
    assert_eq!(l[0].0, "cronoq.worker.cpu.lease");
    assert_eq!(l[1].0, "cronoq.worker.gpu.lease");
    assert_eq!(l[1].1.epoch, 7);
}

#[test]
fn a_batch_of_inputs_is_taken_as_each_input_alone_in_order() {
    let input = |seq: u64, labels: &str| Input::Submitted {
        seq,
        pool: PoolName::new("p").unwrap(),
        task: Ok(Task::new(format!("t{seq}")).pool("p").label_text(labels)),
    };
    let run = |batched: bool| {
        let mut d = driver();
        d.catch_up_first(3);
        let inputs = vec![
            input(1, "gpu=a100"),
            input(2, "gpu=h100"),
            input(3, "gpu=a100"),
        ];
        if batched {
            d.handle(Millis(1), Input::Batch(inputs));
        } else {
            for i in inputs {
                d.handle(Millis(1), i);
            }
        }
        d.handle(Millis(1), Input::CaughtUp);
        register(&mut d, "a", "gpu=a100", 2);
        leases(&mut d)
            .into_iter()
            .map(|(subject, lease)| (subject, lease.task_id, lease.payload))
            .collect::<Vec<_>>()
    };
    let alone = run(false);
    assert_eq!(alone.len(), 2, "{alone:?}");
    assert_eq!(alone[0].1, TaskId(1));
    assert_eq!(alone[1].1, TaskId(3));
    assert_eq!(run(true), alone);
}

#[test]
fn silent_worker_is_removed_and_its_attempt_retried_elsewhere() {
    let mut d = driver();
    register(&mut d, "a", "gpu=a100", 1);
    submit(&mut d, 1, 1, "gpu=a100");
    assert_eq!(leases(&mut d)[0].0, "cronoq.worker.a.lease");
    register(&mut d, "b", "gpu=a100", 1);
    // b heartbeats, a stays silent.
    let beat = |d: &mut Driver, at: u64| {
        let (tx, _rx) = local::<()>();
        d.handle(
            Millis(at),
            Input::Heartbeat(
                Heartbeat {
                    v: 1,
                    worker_id: "b".into(),
                    free_slots: 1,
                    running: vec![],
                },
                tx,
            ),
        );
    };
    beat(&mut d, 5_000);
    d.housekeeping(Millis(6_000));
    // The retry waits out its 1 s backoff, then goes to b.
    beat(&mut d, 7_000);
    d.housekeeping(Millis(7_000));
    let l = leases(&mut d);
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(l[0].0, "cronoq.worker.b.lease");
    assert_eq!(l[0].1.attempt, 2);
    let snap = d.snapshot(Millis(7_000));
    assert_eq!(snap.workers.len(), 1);
    assert_eq!(snap.pools[0].groups[0].capacity, 1);
}

#[test]
fn stale_outcome_is_refused() {
    let mut d = driver();
    register(&mut d, "a", "", 1);
    submit(&mut d, 1, 1, "");
    let _ = leases(&mut d);
    let err = report(&mut d, 2, "a", TaskId(1), 1, 6, AttemptResult::Cancelled).unwrap_err();
    assert_eq!(err.code, ErrorCode::FAILED_PRECONDITION);
    assert_eq!(d.status(TaskId(1)).unwrap().state, TaskState::Running);
}

/// Outcomes reported together are each taken as alone: the reply says
/// which were refused, in order, and comes before the leases of the
/// slots they freed.
#[test]
fn outcomes_in_one_request_are_each_taken_and_answered_in_order() {
    let mut d = driver();
    register(&mut d, "a", "", 2);
    for seq in 1..=3 {
        submit(&mut d, 1, seq, "");
    }
    let leased = leases(&mut d);
    assert_eq!(leased.len(), 2);
    let report = |task: u64, attempt: u32, epoch: u64| AttemptReport {
        v: 1,
        worker_id: "a".into(),
        task_id: TaskId(task),
        attempt,
        epoch,
        result: AttemptResult::Succeeded {
            output: Bytes::from_static(b"ok"),
        },
    };
    let reports = vec![report(1, 1, 7), report(2, 1, 6), report(3, 2, 7)];
    d.handle(
        Millis(2),
        Input::Outcomes(reports, Responder::Nats(Some("reply.here".into()))),
    );
    let out = d.take_outputs();
    let reply = out
        .iter()
        .position(|o| matches!(o, Output::Publish { subject, .. } if subject == "reply.here"))
        .expect("one reply");
    let lease = out
        .iter()
        .position(|o| matches!(o, Output::Lease { task, .. } if *task == TaskId(3)))
        .expect("task 3 leased to the freed slot");
    assert!(reply < lease, "{out:?}");
    let Output::Publish { body, .. } = &out[reply] else {
        unreachable!()
    };
    let answer: wire::AttemptReportsReply = wire::decode_reply(body).unwrap();
    let codes: Vec<_> = answer
        .refused
        .iter()
        .map(|e| e.as_ref().map(|e| e.code.clone()))
        .collect();
    // Task 1 taken; task 2's epoch is stale; task 3 has no attempt 2.
    assert_eq!(codes[0], None);
    assert_eq!(codes[1], Some(ErrorCode::FAILED_PRECONDITION));
    assert!(codes[2].is_some(), "{codes:?}");
    assert_eq!(d.status(TaskId(1)).unwrap().state, TaskState::Succeeded);
    assert_eq!(d.status(TaskId(2)).unwrap().state, TaskState::Running);
}

#[test]
fn a_known_idempotency_key_is_the_same_task() {
    let mut d = driver();
    register(&mut d, "a", "", 1);
    for seq in [1, 2] {
        d.handle(
            Millis(1),
            Input::Submitted {
                seq,
                pool: PoolName::new("p").unwrap(),
                task: Ok(Task::new("x").pool("p").idempotency_key("k")),
            },
        );
    }
    let outputs = d.take_outputs();
    let leases = outputs
        .iter()
        .filter(|o| matches!(o, Output::Lease { .. }))
        .count();
    assert_eq!(leases, 1);
    assert!(outputs
        .iter()
        .any(|o| matches!(o, Output::Discard { seq: 2 })));
    assert_eq!(d.status(TaskId(2)).unwrap().id, TaskId(1));
}

/// Seed 244 of the failover simulation: a successor read a finished
/// task's submission back (not yet purged) without its key, so the
/// duplicates an earlier leader had discarded as that task ran as tasks of
/// their own, and a cancel acknowledged for one of them was followed by
/// another run of the key.
#[test]
fn a_key_read_back_finished_at_takeover_still_binds_its_duplicates() {
    let mut d = driver();
    register(&mut d, "a", "", 1);
    let mut done = journaled(1, 1, "w0", false);
    done.state = TaskState::Succeeded;
    done.attempts[0].outcome = Some("succeeded".into());
    d.handle(
        Millis(1),
        Input::Recovered {
            seq: 1,
            pool: PoolName::new("p").unwrap(),
            task: Ok(Task::new("x").pool("p").idempotency_key("k")),
            record: done,
        },
    );
    d.handle(
        Millis(1),
        Input::Submitted {
            seq: 2,
            pool: PoolName::new("p").unwrap(),
            task: Ok(Task::new("x").pool("p").idempotency_key("k")),
        },
    );
    let (to, mut cancelled) = local::<Ack>();
    d.handle(Millis(2), Input::Cancel(TaskId(2), to));
    answer(&mut d);
    let outputs = d.take_outputs();
    assert!(
        !outputs
            .iter()
            .any(|o| matches!(o, Output::Lease { .. } | Output::Persist { .. })),
        "{outputs:?}"
    );
    assert!(outputs
        .iter()
        .any(|o| matches!(o, Output::Discard { seq: 2 })));
    let status = d.status(TaskId(2)).unwrap();
    assert_eq!((status.id, status.state), (TaskId(1), TaskState::Succeeded));
    assert!(
        matches!(cancelled.try_recv(), Ok(Err(_))),
        "the cancel is refused: finished"
    );
    assert_eq!(d.purge_floor(), 3);
}

/// Submits a task of pool `p` with idempotency key `key`.
fn submit_keyed(d: &mut Driver, now: u64, seq: u64, key: &str) {
    d.handle(
        Millis(now),
        Input::Submitted {
            seq,
            pool: PoolName::new("p").unwrap(),
            task: Ok(Task::new("x").pool("p").idempotency_key(key)),
        },
    );
}

/// The real consumer hands a successor a finished task's result record,
/// not its submission (skipped, or purged long ago): the record names the
/// key, and the key binds to that task again, outcome and all.
#[test]
fn a_finished_result_names_its_key_and_binds_it_in_a_successor() {
    let mut a = driver();
    register(&mut a, "w", "", 1);
    submit_keyed(&mut a, 1, 1, "k");
    submit(&mut a, 1, 2, ""); // unkeyed
    let lease = leases(&mut a).remove(0).1;
    let ok = |out: &str| AttemptResult::Succeeded {
        output: Bytes::from(out.to_string()),
    };
    report(&mut a, 2, "w", lease.task_id, 1, 7, ok("first")).unwrap();
    let mut outputs = a.take_outputs();
    let lease = outputs
        .iter()
        .find_map(|o| match o {
            Output::Lease { body, .. } => Some(wire::decode::<Lease>(body).unwrap()),
            _ => None,
        })
        .unwrap();
    report(&mut a, 3, "w", lease.task_id, 1, 7, ok("")).unwrap();
    outputs.extend(a.take_outputs());
    let finished: Vec<(u64, TaskRecord)> = outputs
        .into_iter()
        .filter_map(|o| match o {
            Output::Persist { seq, record, .. } if record.state.is_terminal() => {
                Some((seq, record))
            }
            _ => None,
        })
        .collect();
    let keys: Vec<_> = finished.iter().map(|(s, r)| (*s, r.key.clone())).collect();
    assert_eq!(keys, vec![(1, Some("k".to_string())), (2, None)]);

    let mut b = driver();
    b.catch_up_first(0);
    let (_, record) = finished[0].clone();
    b.handle(Millis(10), Input::FinishedBefore { seq: 1, record });
    // Out of stream order: how far the stream was read does not move.
    assert_eq!((b.purge_floor(), b.consumed_below()), (1, 1));
    submit_keyed(&mut b, 11, 5, "k");
    b.handle(Millis(11), Input::CaughtUp);
    register(&mut b, "w", "", 1);
    let outputs = b.take_outputs();
    assert!(
        !outputs.iter().any(|o| matches!(o, Output::Lease { .. })),
        "{outputs:?}"
    );
    assert!(outputs
        .iter()
        .any(|o| matches!(o, Output::Discard { seq: 5 })));
    let status = b.status(TaskId(5)).unwrap();
    assert_eq!((status.id, status.state), (TaskId(1), TaskState::Succeeded));
    assert_eq!(status.output.as_deref(), Some("first"));
    // A live record, or one already known, binds nothing.
    let mut live = journaled(6, 1, "w", true);
    live.key = Some("j".into());
    b.handle(
        Millis(12),
        Input::FinishedBefore {
            seq: 6,
            record: live,
        },
    );
    assert!(b.status(TaskId(6)).is_none());
}

#[test]
fn purge_floor_stays_below_every_unfinished_task() {
    let mut d = driver();
    register(&mut d, "a", "", 1);
    assert_eq!(d.purge_floor(), 1);
    submit(&mut d, 1, 1, "");
    submit(&mut d, 1, 2, "");
    assert_eq!(d.purge_floor(), 1);
    let lease = leases(&mut d).remove(0).1;
    let succeeded = AttemptResult::Succeeded {
        output: Bytes::new(),
    };
    report(&mut d, 2, "a", lease.task_id, 1, 7, succeeded).unwrap();
    // Task 1 finished, task 2 runs now: only submission 1 may go.
    assert_eq!(d.purge_floor(), 2);
}

// ---- recovery after a leader change ----------------------------------

/// The journal record of a task whose attempt `attempt` ran (or runs,
/// when `open`) on `worker` under an earlier leadership.
fn journaled(seq: u64, attempt: u32, worker: &str, open: bool) -> TaskRecord {
    let attempts = (1..=attempt)
        .map(|n| AttemptRecord {
            attempt: n,
            group: Labels::new(),
            worker: Some(worker.into()),
            credential: None,
            started_at: Millis(1),
            ended_at: (n < attempt || !open).then_some(Millis(2)),
            outcome: (n < attempt || !open).then(|| "lost".into()),
            error: None,
        })
        .collect();
    TaskRecord {
        pool: PoolName::new("p").unwrap(),
        attempts,
        ..crate::server::log::tests::record(seq, TaskState::Running)
    }
}

/// Task `record.id` of pool `p` read back with its journal `record`.
fn recovered(record: TaskRecord) -> Input {
    Input::Recovered {
        seq: record.id.0,
        pool: PoolName::new("p").unwrap(),
        task: Ok(Task::new("x").pool("p")),
        record,
    }
}

fn recover(d: &mut Driver, now: u64, record: TaskRecord) {
    d.handle(Millis(now), recovered(record));
}

fn register_running(
    d: &mut Driver,
    now: u64,
    id: &str,
    slots: u32,
    running: &[(u64, u32)],
) -> RegisterReply {
    let register = Register {
        lease_batches: false,
        v: 1,
        worker_id: id.into(),
        pool: PoolName::new("p").unwrap(),
        labels: Labels::new(),
        slots,
        xkey: None,
        instance: Some("i".into()),
        running: running
            .iter()
            .map(|&(t, attempt)| RunningAttempt {
                task_id: TaskId(t),
                attempt,
            })
            .collect(),
    };
    send_register(d, now, register).unwrap()
}

/// Issue 8, re-attachment: a successor (epoch 7 here) learns from the
/// journal that attempt 1 of task 1 runs on `a`; `a` registers again
/// listing it: the attempt keeps running there (no new lease, its slot
/// taken), its report under the old epoch counts, and an attempt the
/// journal does not know is not adopted.
#[test]
fn a_running_attempt_is_reattached_when_its_worker_registers_again() {
    let mut d = driver();
    recover(&mut d, 1, journaled(1, 1, "a", true));
    submit(&mut d, 1, 2, "");
    // Before `a` is back, its reports wait (the worker retries).
    let e = report(&mut d, 2, "a", TaskId(1), 1, 6, AttemptResult::Cancelled).unwrap_err();
    assert_eq!(e.code, ErrorCode::UNAVAILABLE);
    let reply = register_running(&mut d, 3, "a", 1, &[(1, 1), (99, 1)]);
    assert_eq!(
        reply.adopted,
        [RunningAttempt {
            task_id: TaskId(1),
            attempt: 1
        }]
    );
    assert!(
        leases(&mut d).is_empty(),
        "its one slot is the re-attached attempt's"
    );
    assert_eq!(d.status(TaskId(1)).unwrap().state, TaskState::Running);
    assert_eq!(d.status(TaskId(2)).unwrap().state, TaskState::Queued);
    report(
        &mut d,
        4,
        "a",
        TaskId(1),
        1,
        6,
        AttemptResult::Succeeded {
            output: Bytes::from("done"),
        },
    )
    .unwrap();
    let status = d.status(TaskId(1)).unwrap();
    assert_eq!(status.state, TaskState::Succeeded);
    assert_eq!(status.attempts.len(), 1, "one run, one attempt");
    let next = leases(&mut d);
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].1.task_id, TaskId(2));
    assert!(d.core.check_invariants().is_ok());
}

/// Issue 8: an attempt whose worker does not come back within the
/// grace is lost (with its reason) and the task runs as its next
/// attempt, not as attempt 1 again.
#[test]
fn an_attempt_not_reattached_within_the_grace_is_lost_and_retried_as_the_next() {
    let mut d = driver();
    recover(&mut d, 1, journaled(1, 2, "gone", true));
    register(&mut d, "b", "", 1);
    assert!(leases(&mut d).is_empty(), "parked until the grace ends");
    d.housekeeping(Millis(3_001));
    let next = leases(&mut d);
    assert_eq!(next.len(), 1);
    assert_eq!((next[0].1.task_id, next[0].1.attempt), (TaskId(1), 3));
    let status = d.status(TaskId(1)).unwrap();
    assert_eq!(status.attempts.len(), 3);
    assert_eq!(status.attempts[1].outcome.as_deref(), Some("lost"));
    assert_eq!(status.attempts[1].error.as_deref(), Some(NOT_REATTACHED));
    // The records of the turn: the lost attempt and the new one.
    assert!(d.core.check_invariants().is_ok());
}

/// Issue 8: a task whose last attempt ended (here: lost) waits for its
/// next attempt at once.
#[test]
fn a_recovered_task_between_attempts_goes_on_with_the_next() {
    let mut d = driver();
    register(&mut d, "b", "", 1);
    recover(&mut d, 1, journaled(1, 1, "x", false));
    let next = leases(&mut d);
    assert_eq!((next[0].1.task_id, next[0].1.attempt), (TaskId(1), 2));
}

/// Issue 8, persist before announce: the lease of an attempt goes out
/// in the same turn as the attempt's journal record, which the runner
/// stores first; the outcome's record and result likewise.
#[test]
fn every_attempt_change_is_journaled_in_its_turn() {
    let mut d = driver();
    register(&mut d, "a", "", 1);
    submit(&mut d, 1, 1, "");
    let outputs = d.take_outputs();
    let record = outputs.iter().find_map(|o| match o {
        Output::Persist { seq: 1, record, .. } => Some(record.clone()),
        _ => None,
    });
    let record = record.expect("the started attempt is journaled");
    assert_eq!(record.state, TaskState::Running);
    assert_eq!(record.attempts[0].worker.as_deref(), Some("a"));
    assert!(record.attempts[0].outcome.is_none());
    let (tx, _rx) = local::<()>();
    d.handle(
        Millis(2),
        Input::Outcome(
            AttemptReport {
                v: 1,
                worker_id: "a".into(),
                task_id: TaskId(1),
                attempt: 1,
                epoch: 7,
                result: AttemptResult::Succeeded {
                    output: Bytes::from("ok"),
                },
            },
            tx,
        ),
    );
    let outputs = d.take_outputs();
    let finals: Vec<&TaskRecord> = outputs
        .iter()
        .filter_map(|o| match o {
            Output::Persist { seq: 1, record, .. } => Some(record),
            _ => None,
        })
        .collect();
    assert_eq!(finals.len(), 1, "one record per task per turn");
    assert_eq!(finals[0].state, TaskState::Succeeded);
    assert_eq!(finals[0].output.as_deref(), Some(&b"ok"[..]));
}

/// Issue 8: a worker that registers with a successor before the
/// successor has read the journal waits for it (it lists its attempts
/// once): it is answered after `CaughtUp`, its attempt re-attached.
#[test]
fn registrations_wait_until_the_journal_is_read() {
    let mut d = driver();
    d.catch_up_first(0);
    let (tx, mut rx) = local::<RegisterReply>();
    d.handle(
        Millis(1),
        Input::Register(
            Register {
                lease_batches: false,
                v: 1,
                worker_id: "a".into(),
                pool: PoolName::new("p").unwrap(),
                labels: Labels::new(),
                slots: 2,
                xkey: None,
                instance: Some("i".into()),
                running: vec![RunningAttempt {
                    task_id: TaskId(5),
                    attempt: 1,
                }],
            },
            Default::default(),
            tx,
        ),
    );
    answer(&mut d);
    assert!(
        rx.try_recv().is_err(),
        "no answer before the journal is read"
    );
    // Its renewal meanwhile is not refused as stale.
    let e = report(&mut d, 1, "a", TaskId(5), 1, 6, AttemptResult::Cancelled).unwrap_err();
    assert_eq!(e.code, ErrorCode::UNAVAILABLE);
    recover(&mut d, 2, journaled(5, 1, "a", true));
    d.handle(Millis(3), Input::CaughtUp);
    answer(&mut d);
    let reply = rx.try_recv().unwrap().unwrap();
    assert_eq!(reply.adopted.len(), 1);
    assert_eq!(d.status(TaskId(5)).unwrap().state, TaskState::Running);
}

/// Submissions read back at takeover were announced by the leader that
/// accepted them: no `queued` event again (one per waiting task would
/// flood every listener); a submission after the catch-up is announced.
#[test]
fn submissions_read_back_at_takeover_are_not_announced_again() {
    fn events(d: &mut Driver) -> Vec<String> {
        d.take_outputs()
            .into_iter()
            .filter_map(|o| match o {
                Output::Publish { subject, .. } if subject.contains(".events.") => Some(subject),
                _ => None,
            })
            .collect()
    }
    let mut d = driver();
    d.catch_up_first(0);
    submit(&mut d, 1, 1, "gpu=none");
    submit(&mut d, 1, 2, "gpu=none");
    assert_eq!(events(&mut d), Vec::<String>::new());
    d.handle(Millis(2), Input::CaughtUp);
    submit(&mut d, 3, 3, "gpu=none");
    let announced = events(&mut d);
    assert_eq!(announced.len(), 1, "{announced:?}");
    assert!(announced[0].ends_with(".events.3"), "{announced:?}");
}

/// `[server] events`: by default only the terminal event goes out (what
/// waiting clients listen for); `all` adds queued and running; `none`
/// publishes nothing on `P.events.>`.
#[test]
fn the_events_setting_chooses_which_task_events_go_out() {
    use crate::server::config::Events;
    fn states(d: &mut Driver) -> Vec<TaskState> {
        d.take_outputs()
            .into_iter()
            .filter_map(|o| match o {
                Output::Publish { subject, body } if subject.contains(".events.") => {
                    Some(wire::decode::<wire::TaskEvent>(&body).unwrap().state)
                }
                _ => None,
            })
            .collect()
    }
    for (events, expected) in [
        (
            Events::All,
            vec![TaskState::Queued, TaskState::Running, TaskState::Succeeded],
        ),
        (Events::Finished, vec![TaskState::Succeeded]),
        (Events::None, vec![]),
    ] {
        let mut d = Driver::new(
            Subjects::default(),
            7,
            Settings {
                events,
                ..settings()
            },
            Millis(0),
        );
        let mut seen = Vec::new();
        submit(&mut d, 1, 1, "");
        seen.extend(states(&mut d));
        register(&mut d, "w", "", 1);
        let mut outputs = d.take_outputs();
        let lease = outputs
            .iter()
            .find_map(|o| match o {
                Output::Lease { body, .. } => Some(wire::decode::<Lease>(body).unwrap()),
                _ => None,
            })
            .expect("leased");
        outputs.retain(
            |o| matches!(o, Output::Publish { subject, .. } if subject.contains(".events.")),
        );
        for o in outputs {
            let Output::Publish { body, .. } = o else {
                unreachable!()
            };
            seen.push(wire::decode::<wire::TaskEvent>(&body).unwrap().state);
        }
        let (tx, _rx) = local::<()>();
        let report = AttemptReport {
            v: 1,
            worker_id: "w".into(),
            task_id: lease.task_id,
            attempt: lease.attempt,
            epoch: lease.epoch,
            result: AttemptResult::Succeeded {
                output: Bytes::new(),
            },
        };
        d.handle(Millis(3), Input::Outcome(report, tx));
        seen.extend(states(&mut d));
        assert_eq!(seen, expected, "{events:?}");
    }
}

/// Issue 8, deliverable 1: lease expiries and worker silence are
/// deadlines in `next_wakeup`, not found by a periodic scan.
#[test]
fn lease_and_silence_deadlines_are_in_next_wakeup() {
    let mut d = driver();
    assert_eq!(d.next_wakeup(), None);
    register(&mut d, "a", "", 1);
    // Silent past worker_timeout (5 s) from its registration at 0.
    assert_eq!(d.next_wakeup(), Some(Millis(5_001)));
    submit(&mut d, 1, 1, "");
    let lease = leases(&mut d);
    assert_eq!(lease.len(), 1);
    d.housekeeping(Millis(5_000));
    assert_eq!(
        snapshot(&mut d).workers.len(),
        1,
        "not silent past the timeout yet"
    );
    d.housekeeping(Millis(5_001));
    assert!(snapshot(&mut d).workers.is_empty());
    assert_eq!(
        d.status(TaskId(1)).unwrap().attempts[0].outcome.as_deref(),
        Some("lost")
    );
    // Nothing left of its deadlines.
    assert!(d.lease_deadlines.is_empty() && d.silence_deadlines.is_empty());
}

/// Found by the chaos test: a lease's time to live ran from the decision,
/// so a lease held up behind a slow journal write (a NATS restart) expired
/// at the leader before the worker got it, and its task ran twice. It now
/// runs from when the lease was published.
#[test]
fn a_lease_lives_its_ttl_from_when_it_was_sent() {
    let mut d = driver();
    register(&mut d, "a", "", 1);
    submit(&mut d, 1, 1, "");
    assert_eq!(leases(&mut d).len(), 1);
    // Published 8 s after the decision (ttl 10 s).
    d.handle(Millis(8_000), Input::LeasesSent(vec![(TaskId(1), 1)]));
    d.handle(
        Millis(8_000),
        Input::Heartbeat(
            Heartbeat {
                v: 1,
                worker_id: "a".into(),
                free_slots: 0,
                running: vec![RunningAttempt {
                    task_id: TaskId(1),
                    attempt: 1,
                }],
            },
            Responder::Nats(None),
        ),
    );
    d.housekeeping(Millis(12_000));
    assert_eq!(d.status(TaskId(1)).unwrap().state, TaskState::Running);
    // Next due: the worker's silence (heard at 8 s), before the lease (18 s).
    assert_eq!(d.next_wakeup(), Some(Millis(13_001)));
    d.housekeeping(Millis(18_000));
    let status = d.status(TaskId(1)).unwrap();
    assert_eq!(status.attempts[0].error.as_deref(), Some("lease expired"));
}

/// Issue 34, finding 14: a leadership that could not renew for a while
/// (a stream electing its leader) acted on nothing; once renewed, what the
/// pause made look overdue is not: the running attempt's lease and its
/// worker are counted from the end of the pause.
#[test]
fn a_pause_the_leadership_survived_expires_no_lease_and_no_worker() {
    let mut d = driver();
    register(&mut d, "a", "", 1);
    submit(&mut d, 1, 1, "");
    assert_eq!(leases(&mut d).len(), 1);
    d.handle(Millis(0), Input::LeasesSent(vec![(TaskId(1), 1)]));
    // 30 s of pause: past the lease's ttl (10 s) and the worker's timeout.
    d.forgive_pause(Millis(30_000));
    d.housekeeping(Millis(30_000));
    assert_eq!(d.status(TaskId(1)).unwrap().state, TaskState::Running);
    assert_eq!(d.snapshot(Millis(30_000)).workers.len(), 1);
    // Nothing renewed after it: the lease expires a ttl after the pause.
    d.housekeeping(Millis(45_000));
    let status = d.status(TaskId(1)).unwrap();
    assert_ne!(status.state, TaskState::Running);
}

/// Worker `w`'s report (epoch 7), its outputs left for the test (unlike
/// [`report`], which answers the local callers).
fn end_attempt(d: &mut Driver, now: u64, task: u64, attempt: u32, result: AttemptResult) {
    let (tx, _rx) = local::<()>();
    let report = AttemptReport {
        v: 1,
        worker_id: "w".into(),
        task_id: TaskId(task),
        attempt,
        epoch: 7,
        result,
    };
    d.handle(Millis(now), Input::Outcome(report, tx));
}

#[test]
fn task_events_carry_no_output() {
    let mut d = driver();
    register(&mut d, "w", "", 1);
    submit(&mut d, 1, 1, "");
    submit(&mut d, 1, 2, "");
    let _ = d.take_outputs();
    let events = |d: &mut Driver| -> Vec<(TaskEvent, Bytes)> {
        d.take_outputs()
            .into_iter()
            .filter_map(|o| match o {
                Output::Publish { subject, body } if subject.contains(".events.") => {
                    Some((wire::decode::<TaskEvent>(&body).unwrap(), body))
                }
                _ => None,
            })
            .collect()
    };
    let finish = |d: &mut Driver, task: u64, output: Bytes| {
        end_attempt(d, 2, task, 1, AttemptResult::Succeeded { output })
    };
    finish(&mut d, 1, Bytes::from(vec![b'x'; 1 << 20]));
    let big: Vec<_> = events(&mut d)
        .into_iter()
        .filter(|(e, _)| e.state.is_terminal())
        .collect();
    assert_eq!(big.len(), 1);
    assert_eq!(big[0].0.state, TaskState::Succeeded);
    assert_eq!(big[0].0.pool.as_str(), "p");
    assert!(big[0].1.len() < 200, "{} bytes", big[0].1.len());
    // The result keeps it.
    assert_eq!(
        d.status(TaskId(1))
            .and_then(|s| s.output_bytes())
            .map(|o| o.len()),
        Some(1 << 20)
    );
    finish(&mut d, 2, Bytes::from_static(b"the-secret"));
    let small = events(&mut d);
    assert!(!small.is_empty());
    for (event, body) in small {
        assert!(!body.windows(10).any(|w| w == b"the-secret"), "{event:?}");
    }
}

fn registrant(credential: &str, max_workers: u32, max_slots: u64) -> Registrant {
    Registrant {
        credential: Some(credential.into()),
        max_workers,
        max_slots,
    }
}

fn register_as(
    d: &mut Driver,
    now: u64,
    id: &str,
    slots: u32,
    who: &Registrant,
    running: &[(u64, u32)],
) -> Result<RegisterReply, WireError> {
    let register = Register {
        lease_batches: false,
        v: 1,
        worker_id: id.into(),
        pool: PoolName::new("p").unwrap(),
        labels: Labels::new(),
        slots,
        xkey: None,
        instance: Some(format!("{id}-{}", who.credential.as_deref().unwrap_or(""))),
        running: running
            .iter()
            .map(|&(t, attempt)| RunningAttempt {
                task_id: TaskId(t),
                attempt,
            })
            .collect(),
    };
    let (tx, mut rx) = local();
    d.handle(Millis(now), Input::Register(register, who.clone(), tx));
    answer(d);
    rx.try_recv().unwrap()
}

fn heartbeat_listing(d: &mut Driver, now: u64, worker: &str, tasks: std::ops::Range<u64>) -> usize {
    let (tx, _rx) = local::<()>();
    d.handle(
        Millis(now),
        Input::Heartbeat(
            Heartbeat {
                v: 1,
                worker_id: worker.into(),
                free_slots: 0,
                running: tasks
                    .map(|i| RunningAttempt {
                        task_id: TaskId(i),
                        attempt: 1,
                    })
                    .collect(),
            },
            tx,
        ),
    );
    d.take_outputs()
        .iter()
        .filter(|o| matches!(o, Output::Publish { subject, .. } if subject.ends_with(".revoke")))
        .count()
}

/// Issue 20 finding 1: heartbeats listing attempts this leader does not
/// know cost one revoke per distinct attempt, at most the worker's slots
/// per heartbeat interval however many heartbeats come — not one revoke
/// per listed entry per heartbeat.
#[test]
fn revokes_for_unknown_attempts_are_bounded_per_interval_and_deduplicated() {
    let mut d = driver();
    register(&mut d, "a", "", 4);
    // The same attempt listed many times: one revoke.
    let (tx, _rx) = local::<()>();
    d.handle(
        Millis(1),
        Input::Heartbeat(
            Heartbeat {
                v: 1,
                worker_id: "a".into(),
                free_slots: 0,
                running: vec![
                    RunningAttempt {
                        task_id: TaskId(9),
                        attempt: 1
                    };
                    4
                ],
            },
            tx,
        ),
    );
    let revokes = d
        .take_outputs()
        .iter()
        .filter(|o| matches!(o, Output::Publish { subject, .. } if subject.ends_with(".revoke")))
        .count();
    assert_eq!(revokes, 1);
    // Many heartbeats within one interval: at most its slots in all.
    let mut total = 0;
    for i in 0..100 {
        total += heartbeat_listing(&mut d, 2 + i, "a", i * 10..i * 10 + 10);
    }
    assert!(total <= 3, "{total} revokes within one interval");
    // The next interval grants its slots again.
    assert_eq!(heartbeat_listing(&mut d, 1_500, "a", 5_000..5_010), 4);
}

/// Issue 20 finding 1 and 11: a credential holds at most its
/// `max_workers` workers and `max_slots` slots; others are not affected,
/// and a removed worker gives its share back.
#[test]
fn a_credential_holds_at_most_its_workers_and_slots() {
    let mut d = driver();
    let gpu = registrant("token:GPU", 2, 10);
    register_as(&mut d, 0, "g1", 6, &gpu, &[]).unwrap();
    let e = register_as(&mut d, 0, "g2", 5, &gpu, &[]).unwrap_err();
    assert_eq!(e.code, ErrorCode::RESOURCE_EXHAUSTED, "{e:?}");
    assert!(e.message.contains("max_slots"), "{}", e.message);
    register_as(&mut d, 0, "g2", 4, &gpu, &[]).unwrap();
    let e = register_as(&mut d, 0, "g3", 1, &registrant("token:GPU", 2, 100), &[]).unwrap_err();
    assert_eq!(e.code, ErrorCode::RESOURCE_EXHAUSTED);
    assert!(e.message.contains("max_workers"), "{}", e.message);
    // Another credential is not affected.
    register_as(&mut d, 0, "o1", 10, &registrant("token:OTHER", 2, 10), &[]).unwrap();
    deregister(&mut d, 1, "g1");
    register_as(&mut d, 1, "g3", 6, &gpu, &[]).unwrap();
    assert_eq!(snapshot(&mut d).workers.len(), 3);
}

/// Issue 20 finding 2: after a leader change, a worker id whose attempt
/// the journal recorded under credential A cannot be taken by credential
/// B (refused while the attempt is parked), nor can B adopt the attempt;
/// A's worker re-attaches it.
#[test]
fn only_the_journaled_credential_reattaches_an_attempt() {
    let mut d = driver();
    let mut record = journaled(1, 1, "vw1", true);
    record.attempts[0].credential = Some("token:GPU1".into());
    recover(&mut d, 1, record);
    let thief = registrant("token:GPU2", 10, 100);
    let e = register_as(&mut d, 2, "vw1", 1, &thief, &[(1, 1)]).unwrap_err();
    assert_eq!(e.code, ErrorCode::PERMISSION_DENIED, "{e:?}");
    assert!(snapshot(&mut d).workers.is_empty(), "nothing registered");
    let owner = registrant("token:GPU1", 10, 100);
    let reply = register_as(&mut d, 3, "vw1", 1, &owner, &[(1, 1)]).unwrap();
    assert_eq!(reply.adopted.len(), 1);
    // An attempt journaled without a credential (auth off then) is not
    // adopted by a credential now: it is lost and retried instead.
    let mut d = driver();
    recover(&mut d, 1, journaled(1, 1, "vw2", true));
    let reply = register_as(&mut d, 2, "vw2", 1, &owner, &[(1, 1)]).unwrap();
    assert!(reply.adopted.is_empty());
}

/// Issue 20 finding 2: the attempts a worker starts are journaled with
/// the credential that registered it.
#[test]
fn an_attempt_is_journaled_with_its_workers_credential() {
    let mut d = driver();
    register_as(&mut d, 0, "a", 1, &registrant("token:GPU1", 10, 100), &[]).unwrap();
    submit(&mut d, 1, 1, "");
    assert_eq!(leases(&mut d).len(), 1);
    let status = d.status(TaskId(1)).unwrap();
    assert_eq!(status.attempts[0].credential.as_deref(), Some("token:GPU1"));
}

/// Issue 21: the driver's inputs and outputs are plain data (a local
/// caller's reply is addressed by request id, not a closure). A run's
/// inputs are recorded with their times, replayed into a fresh driver,
/// and give equal outputs, turn by turn.
#[test]
fn a_recorded_run_replays_into_a_fresh_driver_with_equal_outputs() {
    /// One step of a run: an input at a time, timers, or the end of a turn.
    #[derive(Clone, Debug)]
    #[allow(clippy::large_enum_variant)]
    enum Step {
        Input(u64, Input),
        Housekeeping(u64),
        Turn,
    }
    let task = |labels: &str| {
        let mut t = Task::new("x").pool("p");
        for item in labels.split(',').filter(|s| !s.is_empty()) {
            t = t.label_text(item);
        }
        t
    };
    let register = Register {
        lease_batches: true,
        v: 1,
        worker_id: "w".into(),
        pool: PoolName::new("p").unwrap(),
        labels: Labels::new(),
        slots: 2,
        xkey: None,
        instance: Some("i".into()),
        running: Vec::new(),
    };
    let report = |task_id: u64, result: AttemptResult| AttemptReport {
        v: 1,
        worker_id: "w".into(),
        task_id: TaskId(task_id),
        attempt: 1,
        epoch: 7,
        result,
    };
    let submitted = |seq: u64| Input::Submitted {
        seq,
        pool: PoolName::new("p").unwrap(),
        task: Ok(task("")),
    };
    let script = vec![
        Step::Input(
            0,
            Input::Register(register, Default::default(), Responder::Local(1)),
        ),
        Step::Turn,
        Step::Input(1, submitted(1)),
        Step::Input(1, submitted(2)),
        Step::Input(1, submitted(3)),
        Step::Turn,
        Step::Input(2, Input::LeasesSent(vec![(TaskId(1), 1), (TaskId(2), 1)])),
        Step::Input(
            3,
            Input::Outcome(
                report(
                    1,
                    AttemptResult::Succeeded {
                        output: "ok".into(),
                    },
                ),
                Responder::Nats(Some("reply.1".into())),
            ),
        ),
        Step::Input(
            3,
            Input::Outcomes(
                vec![report(
                    2,
                    AttemptResult::Failed {
                        error: "boom".into(),
                        retryable: true,
                    },
                )],
                Responder::Local(2),
            ),
        ),
        Step::Input(4, Input::Cancel(TaskId(3), Responder::Local(3))),
        Step::Input(4, Input::GetTask(TaskId(1), Responder::Local(4))),
        Step::Turn,
        Step::Input(5, Input::Snapshot(Responder::Local(5))),
        Step::Input(5, Input::Metrics(Responder::Local(6))),
        Step::Turn,
        // Leases expire, the worker falls silent.
        Step::Housekeeping(60_000),
        Step::Turn,
    ];
    // The run, its inputs recorded as they go in.
    let mut recorded = Vec::new();
    let mut first = Vec::new();
    let mut d = driver();
    for step in script {
        recorded.push(step.clone());
        match step {
            Step::Input(now, input) => d.handle(Millis(now), input),
            Step::Housekeeping(now) => d.housekeeping(Millis(now)),
            Step::Turn => first.push(d.take_outputs()),
        }
    }
    // The replay into a fresh driver.
    let mut again = Vec::new();
    let mut d = driver();
    for step in recorded {
        match step {
            Step::Input(now, input) => d.handle(Millis(now), input),
            Step::Housekeeping(now) => d.housekeeping(Millis(now)),
            Step::Turn => again.push(d.take_outputs()),
        }
    }
    assert_eq!(first, again);
    let all: Vec<&Output> = first.iter().flatten().collect();
    let replies: Vec<u64> = all
        .iter()
        .filter_map(|o| match o {
            Output::Reply { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(replies, [1, 2, 3, 4, 5, 6], "{all:?}");
    assert!(all.iter().any(|o| matches!(o, Output::Lease { .. })));
    assert!(all.iter().any(|o| matches!(o, Output::Persist { .. })));
    assert!(all
        .iter()
        .any(|o| matches!(o, Output::Publish { subject, .. } if subject == "reply.1")));
}

/// The shell's reply map: a reply reaches the caller waiting on its id;
/// closed, it answers every waiting and later caller "shutting down".
#[test]
fn replies_reach_their_callers_and_closing_answers_the_rest() {
    let replies = Replies::default();
    let (Responder::Local(id), mut first) = replies.open::<Ack>() else {
        panic!("a local responder");
    };
    let (_, mut second) = replies.open::<Ack>();
    replies.send(id, Reply::Ack(Ok(Ack::default())));
    assert_eq!(first.try_recv().unwrap(), Ok(Ack::default()));
    // The wrong kind of reply is an internal error, not a panic.
    let (Responder::Local(id), mut wrong) = replies.open::<Snapshot>() else {
        panic!("a local responder");
    };
    replies.send(id, Reply::Ack(Ok(Ack::default())));
    assert_eq!(
        wrong.try_recv().unwrap().unwrap_err().code,
        ErrorCode::INTERNAL
    );
    replies.close();
    assert!(second.try_recv().is_err());
    let (_, mut later) = replies.open::<Ack>();
    assert!(later.try_recv().is_err());
}

mod schedules;

#[test]
fn an_event_subject_is_the_one_subjects_builds() {
    for prefix in ["cronoq", "x_y-1"] {
        let subjects = Subjects::new(prefix).unwrap();
        let d = Driver::new(subjects.clone(), 1, settings(), Millis(0));
        for id in [0, 1, 9, 10, 99, 12_345, u64::MAX] {
            assert_eq!(d.event_subject(TaskId(id)), subjects.events(TaskId(id)));
        }
    }
}

/// A takeover's read-back taken in earlier, with the catch-up and the
/// first timers at the takeover, leads as one read at the takeover: the
/// same refusals and records, the same attempts re-attached, the same
/// leases to the first worker, the same queues. (What a standby that
/// admits its copies ahead of its election would rely on; only
/// timestamps of what the catch-up itself writes may differ.)
#[test]
fn a_read_back_taken_in_earlier_leads_as_one_taken_at_the_takeover() {
    use std::time::{Duration, UNIX_EPOCH};
    let pool = || PoolName::new("p").unwrap();
    let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
    let written = |mut r: TaskRecord| {
        r.written_at = Some(Millis(1_000));
        r
    };
    let inputs = || {
        let submitted = |seq, task: Task| Input::Submitted {
            seq,
            pool: pool(),
            task: Ok(task),
        };
        vec![
            submitted(1, Task::new("a").pool("p")),
            submitted(2, Task::new("b").pool("p").priority(5)),
            submitted(3, Task::new("c").pool("p").label_text("gpu=a")),
            // Refused: recorded failed and dead-lettered.
            submitted(4, Task::new("d").pool("p").label_text("not a label")),
            // Its deadline passes between the two read times.
            submitted(5, Task::new("e").pool("p").deadline(at(5_000))),
            // Its fixed start comes between them.
            submitted(
                6,
                Task::new("f")
                    .pool("p")
                    .start_at(at(6_000), Duration::from_secs(60)),
            ),
            submitted(7, Task::new("g").pool("p").idempotency_key("k")),
            // A duplicate of 7's key.
            submitted(8, Task::new("h").pool("p").idempotency_key("k")),
            // Running on w1 under the earlier leader: re-attached.
            recovered(written(journaled(9, 1, "w1", true))),
            // Its first attempt was lost: it waits for the second.
            recovered(written(journaled(10, 1, "w9", false))),
        ]
    };
    let takeover = 10_000;
    let lead = |read_at: u64| {
        let mut d = driver();
        d.catch_up_first(16);
        for input in inputs() {
            d.handle(Millis(read_at), input);
        }
        d.handle(Millis(takeover), Input::CaughtUp);
        d.housekeeping(Millis(takeover));
        let reply = register_running(&mut d, takeover, "w1", 3, &[(9, 1)]);
        d.housekeeping(Millis(takeover + 1));
        let outputs: Vec<String> = d
            .take_outputs()
            .iter()
            .map(|o| match o {
                // Events carry times; their subjects say which task.
                Output::Publish { subject, .. } => format!("Publish({subject})"),
                other => format!("{other:?}"),
            })
            .collect();
        let tasks: Vec<String> = (1..=10)
            .map(|id| {
                let status = d.status(TaskId(id));
                format!("{:?}", status.map(|s| (s.state, s.attempts.len())))
            })
            .collect();
        let snapshot = d.snapshot(Millis(takeover)).pools;
        (reply.adopted, outputs, tasks, format!("{snapshot:?}"))
    };
    let at_takeover = lead(takeover);
    assert!(!at_takeover.1.is_empty(), "the catch-up wrote nothing");
    assert_eq!(lead(2_000), at_takeover);
}

/// A driver with telemetry on (salt 3), a worker "w" of one slot in pool
/// "p", and task 1 (with `traceparent`) submitted before it registered.
fn traced_driver(traceparent: &str) -> Driver {
    let mut d = driver_with(
        7,
        Settings {
            trace: Some(crate::telemetry::TraceSalt(3)),
            ..settings()
        },
    );
    d.handle(
        Millis(0),
        Input::Submitted {
            seq: 1,
            pool: PoolName::new("p").unwrap(),
            task: Ok(Task::new("x").pool("p").traceparent(traceparent)),
        },
    );
    register(&mut d, "w", "", 1);
    d
}

fn traces(outputs: &[Output]) -> Vec<crate::telemetry::TaskTrace> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Trace(t) => Some((**t).clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn with_telemetry_leases_carry_their_attempt_span_and_a_finished_task_comes_out_traced() {
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut d = traced_driver(tp);
    let ids =
        crate::telemetry::TaskTraceIds::of(Some(tp), crate::telemetry::TraceSalt(3), TaskId(1))
            .unwrap();
    let first = leases(&mut d);
    assert_eq!(
        first[0].1.traceparent.as_deref(),
        Some(&*ids.attempt_traceparent(1))
    );
    let failed = AttemptResult::Failed {
        error: "exit 1".into(),
        retryable: true,
    };
    end_attempt(&mut d, 100, 1, 1, failed);
    assert!(traces(&d.take_outputs()).is_empty(), "not finished yet");
    d.housekeeping(Millis(5_000));
    let second = leases(&mut d);
    assert_eq!(second[0].1.attempt, 2);
    assert_eq!(
        second[0].1.traceparent.as_deref(),
        Some(&*ids.attempt_traceparent(2))
    );
    succeed(&mut d, 5_100, 1, 2);
    let traced = traces(&d.take_outputs());
    assert_eq!(traced.len(), 1);
    let t = &traced[0];
    assert_eq!(t.ids, ids);
    assert_eq!((t.submitted_at, t.finished_at), (Millis(0), Millis(5_100)));
    assert_eq!(t.state, TaskState::Succeeded);
    use crate::core::WaitReason;
    assert_eq!(
        t.waits,
        [(1, WaitReason::NoGroupMatches), (2, WaitReason::Backoff)]
    );
    assert_eq!(t.attempts.len(), 2);
    assert_eq!(t.attempts[1].worker.as_deref(), Some("w"));
    assert!(d.traces.is_empty(), "nothing kept for a finished task");
}

#[test]
fn an_unsampled_traceparent_goes_to_the_worker_as_it_came_and_exports_nothing() {
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
    let mut d = traced_driver(tp);
    assert_eq!(leases(&mut d)[0].1.traceparent.as_deref(), Some(tp));
    succeed(&mut d, 100, 1, 1);
    assert!(traces(&d.take_outputs()).is_empty());
    assert!(d.traces.is_empty());
}

#[test]
fn without_telemetry_the_lease_carries_the_submitters_traceparent_and_nothing_is_noted() {
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut d = driver();
    d.handle(
        Millis(0),
        Input::Submitted {
            seq: 1,
            pool: PoolName::new("p").unwrap(),
            task: Ok(Task::new("x").pool("p").traceparent(tp)),
        },
    );
    register(&mut d, "w", "", 1);
    assert_eq!(leases(&mut d)[0].1.traceparent.as_deref(), Some(tp));
    assert!(d.traces.is_empty());
    succeed(&mut d, 100, 1, 1);
    assert!(traces(&d.take_outputs()).is_empty());
}

fn succeed(d: &mut Driver, now: u64, task: u64, attempt: u32) {
    let output = Bytes::new();
    end_attempt(d, now, task, attempt, AttemptResult::Succeeded { output });
}

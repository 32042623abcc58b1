//! The leader's schedules in the driver (`driver/schedules.rs`): fires go
//! out once per tick, come back as the stream's answer, runs end from the
//! turn's own results, records are written when a schedule changes, a
//! successor re-decides only what was not stored, and every refusal
//! changes nothing.

use super::*;
use crate::schedule::{FireKind, StoredSchedule};

fn spec(json: &str) -> Box<crate::schedule::ScheduleSpec> {
    Box::new(serde_json::from_str(json).unwrap())
}

fn every_second() -> Box<crate::schedule::ScheduleSpec> {
    spec(r#"{"name": "tick", "every": "1s", "task": {"pool": "p", "payload": "run"}}"#)
}

/// A schedule request; its answer (given once the turn is "stored").
fn ask(d: &mut Driver, now: u64, op: ScheduleOp) -> Result<ScheduleReply, WireError> {
    let (to, mut rx) = local();
    d.handle(Millis(now), Input::Schedule(op, to));
    answer(d);
    rx.try_recv().unwrap()
}

/// The turn's outputs: fires `(name, tick, task)` and stored schedules.
#[allow(clippy::type_complexity)]
fn turn(
    d: &mut Driver,
) -> (
    Vec<(String, Millis, Task)>,
    Vec<(String, Option<StoredSchedule>)>,
) {
    let (mut fires, mut stored) = (Vec::new(), Vec::new());
    for o in d.take_outputs() {
        match o {
            Output::Fire {
                name, tick, task, ..
            } => fires.push((name, tick, *task)),
            Output::PersistSchedule { name, stored: s } => stored.push((name, s.map(|s| *s))),
            _ => {}
        }
    }
    (fires, stored)
}

fn published(d: &mut Driver, now: u64, tick: u64, seq: u64) {
    d.handle(
        Millis(now),
        Input::FirePublished {
            name: "tick".into(),
            tick: Millis(tick),
            kind: FireKind::Tick,
            result: Ok(seq),
        },
    );
}

fn info(d: &mut Driver) -> crate::api::ScheduleInfo {
    match ask(d, 0, ScheduleOp::Get("tick".into())).unwrap() {
        ScheduleReply::Info(info) => *info,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_tick_fires_once_is_accepted_as_its_task_and_its_run_ends_in_the_record() {
    let mut d = driver();
    register(&mut d, "a", "", 1);
    let created = ask(
        &mut d,
        0,
        ScheduleOp::Create {
            spec: every_second(),
            owner: Some("token:ops".into()),
        },
    )
    .unwrap();
    assert!(matches!(created, ScheduleReply::Info(_)));
    let (fires, stored) = turn(&mut d);
    assert!(fires.is_empty());
    assert_eq!(stored.len(), 1, "the new schedule is written");
    // Its first tick: one fire, under the tick's key, owned by its creator.
    d.housekeeping(Millis(1_000));
    let (fires, _) = turn(&mut d);
    assert_eq!(fires.len(), 1, "{fires:?}");
    let (name, tick, task) = &fires[0];
    assert_eq!((name.as_str(), *tick), ("tick", Millis(1_000)));
    assert_eq!(task.idempotency_key.as_deref(), Some("schedule:tick:1000"));
    assert_eq!(task.owner.as_deref(), Some("token:ops"));
    assert_eq!(task.schedule, Some(("tick".into(), Millis(1_000))));
    // Stepping again within the same second fires nothing more.
    d.housekeeping(Millis(1_500));
    assert!(turn(&mut d).0.is_empty());
    // The stream took it as task 1: recorded and written.
    published(&mut d, 1_010, 1_000, 1);
    let (_, stored) = turn(&mut d);
    let record = stored[0].1.as_ref().unwrap();
    assert_eq!(record.history.last().unwrap().task, Some(TaskId(1)));
    // The task arrives through the consumer, runs, and succeeds: the run
    // ends in the schedule's record.
    d.handle(
        Millis(1_020),
        Input::Submitted {
            seq: 1,
            pool: PoolName::new("p").unwrap(),
            task: Ok(task.clone()),
        },
    );
    assert_eq!(leases(&mut d).len(), 1);
    report(
        &mut d,
        1_030,
        "a",
        TaskId(1),
        1,
        7,
        AttemptResult::Succeeded {
            output: Bytes::new(),
        },
    )
    .unwrap();
    let last = info(&mut d).history[0].clone();
    assert_eq!(last.outcome, Some(TaskState::Succeeded));
    assert_eq!(info(&mut d).counters.fires, 1);
}

#[test]
fn a_successor_decides_again_only_the_ticks_whose_fire_was_not_stored() {
    let mut d = driver();
    ask(
        &mut d,
        0,
        ScheduleOp::Create {
            spec: every_second(),
            owner: None,
        },
    )
    .unwrap();
    let (_, stored) = turn(&mut d);
    let written = stored[0].1.clone().unwrap();
    // The leader decides tick 1000 and dies before the stream answers:
    // it stored no record saying the tick fired — not even when something
    // else changed the schedule meanwhile (a pause and resume).
    d.housekeeping(Millis(1_000));
    let (fires, stored) = turn(&mut d);
    assert_eq!(fires.len(), 1);
    assert!(stored.is_empty(), "{stored:?}");
    ask(&mut d, 1_001, ScheduleOp::Pause("tick".into(), true)).unwrap();
    ask(&mut d, 1_002, ScheduleOp::Pause("tick".into(), false)).unwrap();
    assert!(turn(&mut d).1.is_empty());

    let mut successor = driver();
    successor.catch_up_first(0);
    successor.restore_schedules(vec![written]);
    // Nothing fires while the journal is read.
    successor.housekeeping(Millis(1_400));
    assert!(turn(&mut successor).0.is_empty());
    successor.handle(Millis(1_400), Input::CaughtUp);
    successor.housekeeping(Millis(1_400));
    let (fires, _) = turn(&mut successor);
    assert_eq!(fires.len(), 1, "the tick is decided again");
    assert_eq!(
        fires[0].2.idempotency_key.as_deref(),
        Some("schedule:tick:1000"),
        "under the same key: the stream answers with the first task"
    );
    published(&mut successor, 1_410, 1_000, 1);
    let (_, stored) = turn(&mut successor);
    let written = stored[0].1.clone().unwrap();
    assert_eq!(written.history.last().unwrap().task, Some(TaskId(1)));

    // A third leader reading that record does not fire tick 1000 again.
    let mut third = driver();
    third.restore_schedules(vec![written]);
    third.housekeeping(Millis(1_900));
    assert!(turn(&mut third).0.is_empty());
    third.housekeeping(Millis(2_000));
    let (fires, _) = turn(&mut third);
    assert_eq!(fires.len(), 1);
    assert_eq!(fires[0].1, Millis(2_000));
}

#[test]
fn a_run_that_ended_while_no_one_led_is_ended_once_the_journal_is_read() {
    let mut d = driver();
    ask(
        &mut d,
        0,
        ScheduleOp::Create {
            spec: spec(
                r#"{"name": "tick", "every": "1s", "overlap": "skip", "task": {"pool": "p"}}"#,
            ),
            owner: None,
        },
    )
    .unwrap();
    d.housekeeping(Millis(1_000));
    turn(&mut d);
    published(&mut d, 1_001, 1_000, 1);
    let (_, stored) = turn(&mut d);
    let written = stored[0].1.clone().unwrap();
    // Task 1 finished and was purged while no one led: the successor's
    // journal has no trace of it. Without ending the run, `skip` would
    // skip every tick for ever.
    let mut successor = driver();
    successor.restore_schedules(vec![written]);
    successor.housekeeping(Millis(2_000));
    let (fires, _) = turn(&mut successor);
    assert_eq!(fires.len(), 1, "tick 2000 fires: the old run is over");
    let info = info(&mut successor);
    let old = info
        .history
        .iter()
        .find(|r| r.tick == Millis(1_000))
        .unwrap();
    assert!(old.error.as_deref().unwrap().contains("not found"));
}

#[test]
fn trigger_is_answered_with_its_task_once_the_stream_took_it() {
    let mut d = driver();
    ask(
        &mut d,
        0,
        ScheduleOp::Create {
            spec: every_second(),
            owner: None,
        },
    )
    .unwrap();
    let (to, mut rx) = local::<ScheduleReply>();
    d.handle(
        Millis(500),
        Input::Schedule(ScheduleOp::Trigger("tick".into()), to),
    );
    answer(&mut d);
    assert!(
        rx.try_recv().is_err(),
        "not answered before the stream's answer"
    );
    let (fires, _) = turn(&mut d);
    assert_eq!(fires.len(), 1);
    d.handle(
        Millis(510),
        Input::FirePublished {
            name: "tick".into(),
            tick: Millis(500),
            kind: FireKind::Trigger,
            result: Ok(9),
        },
    );
    answer(&mut d);
    match rx.try_recv().unwrap().unwrap() {
        ScheduleReply::Fired(record) => assert_eq!(record.task, Some(TaskId(9))),
        other => panic!("{other:?}"),
    }
}

#[test]
fn refused_schedule_requests_change_nothing() {
    let mut d = driver();
    let create = || ScheduleOp::Create {
        spec: every_second(),
        owner: None,
    };
    ask(&mut d, 0, create()).unwrap();
    turn(&mut d);
    let cases: Vec<(ScheduleOp, ErrorCode)> = vec![
        (create(), ErrorCode::ALREADY_EXISTS),
        (
            ScheduleOp::Create {
                spec: spec(r#"{"name": "bad", "cron": "0 0 30 2 *", "task": {}}"#),
                owner: None,
            },
            ErrorCode::INVALID_ARGUMENT,
        ),
        (ScheduleOp::Get("nope".into()), ErrorCode::NOT_FOUND),
        (ScheduleOp::Pause("nope".into(), true), ErrorCode::NOT_FOUND),
        (ScheduleOp::Delete("nope".into()), ErrorCode::NOT_FOUND),
        (ScheduleOp::Trigger("nope".into()), ErrorCode::NOT_FOUND),
    ];
    for (op, code) in cases {
        let e = ask(&mut d, 1, op).unwrap_err();
        assert_eq!(e.code, code, "{e:?}");
        let (fires, stored) = turn(&mut d);
        assert!(fires.is_empty() && stored.is_empty(), "{stored:?}");
    }
    // No storage key with credentials on: creating is refused.
    let mut s = settings();
    s.schedules_refused = Some("no storage key".into());
    let mut refusing = driver_with(7, s);
    let e = ask(&mut refusing, 0, create()).unwrap_err();
    assert_eq!(e.code, ErrorCode::FAILED_PRECONDITION);
    // While the journal is read: UNAVAILABLE.
    let mut reading = driver();
    reading.catch_up_first(0);
    let e = ask(&mut reading, 0, create()).unwrap_err();
    assert_eq!(e.code, ErrorCode::UNAVAILABLE);
    assert!(turn(&mut reading).1.is_empty());
}

//! Tests of the [`Book`]: each operation, its refusals (code, and that
//! nothing changed), and properties: each tick is decided once, never two
//! fires for one tick, and the book decides what the per-schedule rules
//! decide.

use proptest::prelude::*;

use super::*;
use crate::core::{ErrorCode, Millis, TaskId, TaskState};

const S: u64 = 1_000;

fn spec(name: &str, every: &str, overlap: Overlap) -> ScheduleSpec {
    ScheduleSpec {
        name: name.into(),
        every: Some(every.into()),
        overlap,
        ..Default::default()
    }
}

/// The (name, tick, kind) of each fire order.
fn fires(orders: &[Order]) -> Vec<(String, u64, FireKind)> {
    orders
        .iter()
        .filter_map(|o| match o {
            Order::Fire {
                name, tick, kind, ..
            } => Some((name.clone(), tick.0, *kind)),
            Order::Cancel { .. } => None,
        })
        .collect()
}

/// Accepts every fire as the next task id.
fn accept_all(book: &mut Book, orders: &[Order], next_id: &mut u64, now: Millis) -> Vec<TaskId> {
    let mut ids = Vec::new();
    for o in orders {
        if let Order::Fire {
            name, tick, kind, ..
        } = o
        {
            *next_id += 1;
            book.accepted(name, *tick, *kind, TaskId(*next_id), now);
            ids.push(TaskId(*next_id));
        }
    }
    ids
}

#[test]
fn a_book_fires_due_schedules_in_order_with_keys_and_schedule_fields() {
    let mut book = Book::default();
    book.create(spec("a", "10s", Overlap::Allow), None, Millis(0))
        .unwrap();
    book.create(
        spec("b", "15s", Overlap::Allow),
        Some("ops".into()),
        Millis(0),
    )
    .unwrap();
    assert_eq!(book.next_wakeup(), Some(Millis(10 * S)));
    assert!(book.step(Millis(9 * S)).is_empty());
    let orders = book.step(Millis(10 * S));
    assert_eq!(fires(&orders), vec![("a".into(), 10 * S, FireKind::Tick)]);
    let Order::Fire { task, .. } = &orders[0] else {
        panic!()
    };
    assert_eq!(task.key(), Some("schedule:a:10000"));
    assert_eq!(task.schedule_name(), Some("a"));
    assert_eq!(task.scheduled_at(), Some(Millis(10 * S)));
    assert_eq!(book.next_wakeup(), Some(Millis(15 * S)));
    // A late step: schedules in order of their first due tick, each with
    // all its due ticks in order.
    let orders = book.step(Millis(30 * S));
    assert_eq!(
        fires(&orders),
        vec![
            ("b".into(), 15 * S, FireKind::Tick),
            ("b".into(), 30 * S, FireKind::Tick),
            ("a".into(), 20 * S, FireKind::Tick),
            ("a".into(), 30 * S, FireKind::Tick),
        ]
    );
    assert_eq!(book.get("a").unwrap().counters.fires, 3);
}

#[test]
fn bad_creates_are_refused_with_their_code_and_change_nothing() {
    let mut book = Book::new(2);
    book.create(spec("a", "10s", Overlap::Allow), None, Millis(0))
        .unwrap();
    let before = format!("{book:?}");
    let cases = [
        (spec("a", "20s", Overlap::Skip), ErrorCode::ALREADY_EXISTS),
        (spec("b", "0s", Overlap::Allow), ErrorCode::INVALID_ARGUMENT),
        (
            ScheduleSpec {
                name: "c".into(),
                cron: Some("0 0 30 2 *".into()),
                ..Default::default()
            },
            ErrorCode::INVALID_ARGUMENT,
        ),
    ];
    for (s, code) in cases {
        let e = book.create(s.clone(), None, Millis(1)).unwrap_err();
        assert_eq!(e.code, code, "{s:?}: {e}");
        assert_eq!(format!("{book:?}"), before);
    }
    book.create(spec("b", "10s", Overlap::Allow), None, Millis(0))
        .unwrap();
    let before = format!("{book:?}");
    let e = book
        .create(spec("c", "10s", Overlap::Allow), None, Millis(0))
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::RESOURCE_EXHAUSTED);
    assert_eq!(format!("{book:?}"), before);
    for e in [
        book.delete("zz").unwrap_err(),
        book.set_paused("zz", true, Millis(0)).unwrap_err(),
        book.trigger("zz", Millis(0)).unwrap_err(),
        book.backfill("zz", Millis(0), Millis(0), Millis(0))
            .unwrap_err(),
    ] {
        assert_eq!(e.code, ErrorCode::NOT_FOUND);
    }
    for (from, to) in [(5 * S, 4 * S), (0, 100 * S), (0, 100_000 * S)] {
        let e = book
            .backfill("a", Millis(from), Millis(to), Millis(50 * S))
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_ARGUMENT, "{e}");
    }
    assert_eq!(format!("{book:?}"), before);
}

#[test]
fn skip_holds_while_the_run_lives_and_a_run_end_frees_it() {
    let mut book = Book::default();
    book.create(spec("s", "10s", Overlap::Skip), None, Millis(0))
        .unwrap();
    let mut id = 0;
    let o = book.step(Millis(10 * S));
    let ids = accept_all(&mut book, &o, &mut id, Millis(10 * S));
    assert!(fires(&book.step(Millis(20 * S))).is_empty());
    assert_eq!(book.get("s").unwrap().counters.skipped, 1);
    assert!(book
        .run_ended(ids[0], TaskState::Succeeded, Millis(25 * S))
        .is_empty());
    let e = book.get("s").unwrap();
    assert_eq!(
        e.history().next_back().unwrap().outcome,
        Some(TaskState::Succeeded)
    );
    assert_eq!(fires(&book.step(Millis(30 * S))).len(), 1);
}

#[test]
fn buffer_one_fires_the_buffered_tick_when_the_run_ends() {
    let mut book = Book::default();
    book.create(spec("s", "10s", Overlap::BufferOne), None, Millis(0))
        .unwrap();
    let mut id = 0;
    let o = book.step(Millis(10 * S));
    let ids = accept_all(&mut book, &o, &mut id, Millis(10 * S));
    assert!(book.step(Millis(30 * S)).is_empty());
    let o = book.run_ended(ids[0], TaskState::Failed, Millis(31 * S));
    assert_eq!(fires(&o), vec![("s".into(), 20 * S, FireKind::Tick)]);
    assert_eq!(book.get("s").unwrap().counters.skipped, 1);
}

#[test]
fn cancel_previous_names_the_live_task() {
    let mut book = Book::default();
    book.create(spec("s", "10s", Overlap::CancelPrevious), None, Millis(0))
        .unwrap();
    let mut id = 0;
    let o = book.step(Millis(10 * S));
    accept_all(&mut book, &o, &mut id, Millis(10 * S));
    let o = book.step(Millis(20 * S));
    assert!(
        matches!(&o[0], Order::Cancel { name, tick: Millis(10_000), task: Some(TaskId(1)), key }
            if name == "s" && key == "schedule:s:10000"),
        "{o:?}"
    );
    assert_eq!(fires(&o), vec![("s".into(), 20 * S, FireKind::Tick)]);
}

#[test]
fn trigger_runs_outside_the_sequence_with_its_own_key() {
    let mut book = Book::default();
    book.create(spec("s", "10s", Overlap::Skip), None, Millis(0))
        .unwrap();
    let o = book.trigger("s", Millis(3 * S)).unwrap();
    let Order::Fire { task, kind, .. } = &o else {
        panic!()
    };
    assert_eq!(*kind, FireKind::Trigger);
    assert_eq!(task.key(), Some("schedule:s:trigger:3000"));
    book.accepted(
        "s",
        Millis(3 * S),
        FireKind::Trigger,
        TaskId(9),
        Millis(3 * S),
    );
    // A live trigger run does not make the next tick a skip.
    assert_eq!(fires(&book.step(Millis(10 * S))).len(), 1);
    assert!(book
        .run_ended(TaskId(9), TaskState::Succeeded, Millis(11 * S))
        .is_empty());
}

#[test]
fn backfill_fires_each_tick_in_range_by_the_overlap_policy() {
    let mut book = Book::default();
    book.create(spec("a", "10s", Overlap::Allow), None, Millis(100 * S))
        .unwrap();
    book.create(spec("k", "10s", Overlap::Skip), None, Millis(100 * S))
        .unwrap();
    let (o, skipped) = book
        .backfill("a", Millis(20 * S), Millis(50 * S), Millis(100 * S))
        .unwrap();
    assert_eq!(
        fires(&o).iter().map(|f| f.1).collect::<Vec<_>>(),
        vec![20 * S, 30 * S, 40 * S, 50 * S]
    );
    assert!(skipped.is_empty());
    assert!(fires(&o).iter().all(|f| f.2 == FireKind::Backfill));
    let (o, skipped) = book
        .backfill("k", Millis(20 * S), Millis(50 * S), Millis(100 * S))
        .unwrap();
    assert_eq!(fires(&o).len(), 1);
    assert_eq!(skipped.len(), 3);
    // decided_through did not move: the next tick is still 110s.
    assert_eq!(book.get("k").unwrap().next_fire(), Some(Millis(110 * S)));
}

#[test]
fn pause_and_resume_pass_the_ticks_between_without_firing_them() {
    let mut book = Book::default();
    book.create(spec("s", "10s", Overlap::Allow), None, Millis(0))
        .unwrap();
    assert!(book
        .set_paused("s", true, Millis(5 * S))
        .unwrap()
        .is_empty());
    assert_eq!(book.next_wakeup(), None);
    assert!(book.step(Millis(40 * S)).is_empty());
    assert!(book
        .set_paused("s", true, Millis(41 * S))
        .unwrap()
        .is_empty());
    assert!(book
        .set_paused("s", false, Millis(45 * S))
        .unwrap()
        .is_empty());
    let e = book.get("s").unwrap();
    assert_eq!(e.counters.missed, 4);
    assert_eq!(e.next_fire(), Some(Millis(50 * S)));
    // Pausing with a tick due fires it first.
    let o = book.set_paused("s", true, Millis(50 * S)).unwrap();
    assert_eq!(fires(&o), vec![("s".into(), 50 * S, FireKind::Tick)]);
}

#[test]
fn a_stored_schedule_restores_its_state_and_live_runs() {
    let mut book = Book::default();
    book.create(spec("s", "10s", Overlap::Skip), None, Millis(0))
        .unwrap();
    let o = book.step(Millis(10 * S));
    accept_all(&mut book, &o, &mut 0, Millis(10 * S));
    let stored = book.get("s").unwrap().stored();
    let json = serde_json::to_string(&stored).unwrap();
    let mut successor = Book::default();
    successor
        .restore(serde_json::from_str(&json).unwrap())
        .unwrap();
    assert!(successor.is_live(TaskId(1)));
    assert_eq!(successor.live_tasks(), vec![TaskId(1)]);
    assert!(fires(&successor.step(Millis(20 * S))).is_empty());
    successor.run_ended(TaskId(1), TaskState::Succeeded, Millis(21 * S));
    assert_eq!(fires(&successor.step(Millis(30 * S))).len(), 1);
}

#[test]
fn a_deleted_schedule_forgets_its_runs() {
    let mut book = Book::default();
    book.create(spec("s", "10s", Overlap::Skip), None, Millis(0))
        .unwrap();
    let o = book.step(Millis(10 * S));
    accept_all(&mut book, &o, &mut 0, Millis(10 * S));
    let stored = book.delete("s").unwrap();
    assert_eq!(stored.history.len(), 1);
    assert!(!book.is_live(TaskId(1)));
    assert_eq!(book.next_wakeup(), None);
    // Re-created under the same name: the old run's end changes nothing.
    book.create(spec("s", "10s", Overlap::Skip), None, Millis(15 * S))
        .unwrap();
    assert!(book
        .run_ended(TaskId(1), TaskState::Succeeded, Millis(16 * S))
        .is_empty());
    assert!(book.get("s").unwrap().history().next().is_none());
}

#[test]
fn ten_thousand_schedules_step_only_the_due_ones() {
    let mut book = Book::default();
    for i in 0..10_000u64 {
        let mut s = spec(&format!("s{i}"), "1m", Overlap::Allow);
        s.every = Some(format!("{}s", 60 + i));
        book.create(s, None, Millis(0)).unwrap();
    }
    let e = book.create(spec("one-more", "1m", Overlap::Allow), None, Millis(0));
    assert_eq!(e.unwrap_err().code, ErrorCode::RESOURCE_EXHAUSTED);
    // Each step takes the due ones only.
    assert_eq!(book.step(Millis(60 * S)).len(), 1);
    assert_eq!(book.step(Millis(61 * S)).len(), 1);
    assert_eq!(book.next_wakeup(), Some(Millis(62 * S)));
}

/// A random run: schedules every 1–7 s with random overlap, stepped at
/// random increasing instants, random runs ending in between.
#[derive(Debug, Clone)]
struct Run {
    schedules: Vec<(u64, Overlap)>,
    steps: Vec<(u64, bool)>,
}

fn run_strategy() -> impl Strategy<Value = Run> {
    let overlap = prop_oneof![
        Just(Overlap::Allow),
        Just(Overlap::Skip),
        Just(Overlap::BufferOne),
        Just(Overlap::CancelPrevious),
    ];
    (
        prop::collection::vec((1u64..8, overlap), 1..6),
        prop::collection::vec((1u64..120_000, any::<bool>()), 1..40),
    )
        .prop_map(|(schedules, steps)| Run { schedules, steps })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn the_book_decides_what_the_per_schedule_rules_decide_and_each_tick_once(run in run_strategy()) {
        let mut book = Book::default();
        let mut model: Vec<(Schedule, ScheduleState, Vec<u64>)> = Vec::new();
        for (i, (secs, overlap)) in run.schedules.iter().enumerate() {
            let s = spec(&format!("s{i}"), &format!("{secs}s"), *overlap);
            model.push((s.validate().unwrap(), ScheduleState::new(Millis(0)), Vec::new()));
            book.create(s, None, Millis(0)).unwrap();
        }
        let mut now = 0u64;
        let mut next_id = 0u64;
        let mut book_fires: Vec<Vec<u64>> = vec![Vec::new(); model.len()];
        for (gap, end_one) in &run.steps {
            now += gap;
            // End the oldest live run of the first schedule that has one.
            if *end_one {
                if let Some((i, (sched, state, _))) = model.iter_mut().enumerate().find(|(_, m)| m.1.active.is_some()) {
                    let tick = state.active.unwrap();
                    let d = sched.handle(state, Millis(now), Event::RunEnded { tick });
                    for x in d { if let Decision::Fire { tick } | Decision::CancelThenFire { tick, .. } = x { model[i].2.push(tick.0) } }
                    let task = book.get(&format!("s{i}")).unwrap().history()
                        .rev().find(|r| r.tick == tick).and_then(|r| r.task).unwrap();
                    let o = book.run_ended(task, TaskState::Succeeded, Millis(now));
                    for f in fires(&o) { book_fires[f.0[1..].parse::<usize>().unwrap()].push(f.1) }
                    accept_all(&mut book, &o, &mut next_id, Millis(now));
                }
            }
            for (sched, state, fired) in model.iter_mut() {
                loop {
                    let d = sched.handle(state, Millis(now), Event::Time);
                    let done = d.len() < MAX_DECISIONS_PER_STEP;
                    for x in d { if let Decision::Fire { tick } | Decision::CancelThenFire { tick, .. } = x { fired.push(tick.0) } }
                    if done { break }
                }
            }
            loop {
                let o = book.step(Millis(now));
                for f in fires(&o) { book_fires[f.0[1..].parse::<usize>().unwrap()].push(f.1) }
                accept_all(&mut book, &o, &mut next_id, Millis(now));
                if book.next_wakeup().is_none_or(|w| w > Millis(now)) { break }
            }
        }
        for (i, (_, state, fired)) in model.iter().enumerate() {
            let e = book.get(&format!("s{i}")).unwrap();
            prop_assert_eq!(&e.state, state);
            prop_assert_eq!(&book_fires[i], fired);
            // Never two fires for one tick; ticks in order.
            prop_assert!(fired.windows(2).all(|w| w[0] < w[1]), "{:?}", fired);
            // Each tick up to decided_through was decided exactly once:
            // fired, skipped, missed or still buffered.
            let every = run.schedules[i].0 * S;
            let ticks = e.state.decided_through.0 / every;
            let buffered = u64::from(e.state.buffered.is_some());
            prop_assert_eq!(e.counters.fires + e.counters.skipped + e.counters.missed + buffered, ticks);
        }
    }
}

use super::fire::MAX_DECISIONS_PER_STEP;

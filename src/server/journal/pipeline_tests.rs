//! Unit tests of the journal pipeline's ordering.

use super::*;

type P = Pipeline<&'static str, &'static str>;

fn limits(max_records: usize) -> Limits {
    Limits {
        max_records,
        max_batches: 1,
        max_batch: 3,
    }
}

fn rec(task: u64, body: &'static str) -> Record<&'static str> {
    Record {
        task: Some(task),
        terminal: false,
        finished: Vec::new(),
        alone: false,
        body,
    }
}

fn done(task: u64, body: &'static str) -> Record<&'static str> {
    Record {
        terminal: true,
        finished: Vec::new(),
        ..rec(task, body)
    }
}

fn slot(body: &'static str) -> Record<&'static str> {
    Record {
        task: None,
        terminal: false,
        finished: Vec::new(),
        alone: false,
        body,
    }
}

fn turn(
    number: u64,
    records: Vec<Record<&'static str>>,
    announce: Vec<&'static str>,
) -> Turn<&'static str, &'static str> {
    Turn {
        number,
        records,
        announce,
    }
}

fn bodies(writes: &[Write<&'static str>]) -> Vec<Vec<&'static str>> {
    writes
        .iter()
        .map(|w| w.records.iter().map(|r| r.body).collect())
        .collect()
}

#[test]
fn a_turn_is_announced_only_once_it_and_every_earlier_turn_are_stored() {
    let mut p = P::new(limits(100));
    let first = p.push(vec![turn(1, vec![rec(1, "a1")], vec!["lease 1"])], false);
    let second = p.push(vec![turn(2, vec![rec(2, "b1")], vec!["lease 2"])], false);
    assert_eq!(bodies(&first), [["a1"]]);
    assert_eq!(bodies(&second), [["b1"]]);
    // The later turn's write lands first: nothing may be announced yet.
    assert!(p.stored(second[0].id).is_empty());
    assert_eq!(p.release(), None);
    p.stored(first[0].id);
    let r1 = p.release().expect("turn 1");
    assert_eq!((r1.number, r1.announce), (1, vec!["lease 1"]));
    let r2 = p.release().expect("turn 2");
    assert_eq!((r2.number, r2.announce), (2, vec!["lease 2"]));
    assert_eq!(p.release(), None);
    assert_eq!(p.turns_waiting(), 0);
}

#[test]
fn a_turn_without_writes_waits_for_the_turns_before_it() {
    let mut p = P::new(limits(100));
    let w = p.push(vec![turn(1, vec![rec(1, "a1")], vec!["x"])], false);
    p.push(vec![turn(2, vec![], vec!["reply"])], false);
    assert_eq!(p.release(), None);
    p.stored(w[0].id);
    assert_eq!(p.release().unwrap().number, 1);
    assert_eq!(p.release().unwrap().announce, ["reply"]);
}

#[test]
fn a_tasks_records_land_in_order() {
    let mut p = P::new(limits(100));
    let first = p.push(
        vec![turn(1, vec![rec(1, "a1"), rec(2, "b1")], vec![])],
        false,
    );
    assert_eq!(first.len(), 2);
    // Task 1 again: its write waits for the first one; task 3 goes at once.
    let second = p.push(
        vec![turn(2, vec![rec(1, "a2"), rec(3, "c1")], vec![])],
        false,
    );
    assert_eq!(bodies(&second), [["c1"]]);
    // Task 2's write does not free it.
    assert!(p.stored(first[1].id).is_empty());
    let now = p.stored(first[0].id);
    assert_eq!(bodies(&now), [["a2"]]);
    // A third write of task 1 waits for the second.
    let third = p.push(vec![turn(3, vec![done(1, "a3")], vec![])], false);
    assert!(third.is_empty());
    assert_eq!(bodies(&p.stored(now[0].id)), [["a3"]]);
}

#[test]
fn in_one_group_commit_the_latest_record_of_a_task_stands_for_the_others() {
    let mut p = P::new(limits(100));
    let writes = p.push(
        vec![
            turn(1, vec![rec(1, "a1"), rec(2, "b1")], vec!["one"]),
            turn(2, vec![done(1, "a2")], vec!["two"]),
        ],
        false,
    );
    assert_eq!(bodies(&writes), [["b1"], ["a2"]]);
    for w in &writes {
        p.stored(w.id);
    }
    let r = p.release().unwrap();
    assert_eq!(r.number, 2);
    assert_eq!(r.announce, ["one", "two"]);
    assert_eq!(r.terminal, [1]);
}

#[test]
fn a_record_that_goes_alone_is_never_left_out() {
    let mut p = P::new(limits(100));
    let refused = Record {
        alone: true,
        ..done(1, "dead letter")
    };
    let writes = p.push(
        vec![turn(
            1,
            vec![refused, done(1, "again"), rec(2, "b1")],
            vec![],
        )],
        true,
    );
    // Alone, then task 1's latest waits for it (in the batch with task 2).
    assert_eq!(bodies(&writes), [["dead letter"]]);
    assert!(!writes[0].batch);
    let batch = p.stored(writes[0].id);
    assert_eq!(bodies(&batch), [["again", "b1"]]);
    assert!(batch[0].batch);
}

#[test]
fn start_records_wait_for_nothing_and_hold_up_only_their_turn() {
    let mut p = P::new(limits(100));
    let writes = p.push(
        vec![turn(
            1,
            vec![slot("s.1"), rec(1, "a1"), slot("s.2")],
            vec!["lease"],
        )],
        false,
    );
    assert_eq!(bodies(&writes), [["s.1"], ["a1"], ["s.2"]]);
    p.stored(writes[1].id);
    p.stored(writes[0].id);
    assert_eq!(p.release(), None, "s.2 is not stored yet");
    p.stored(writes[2].id);
    assert_eq!(p.release().unwrap().announce, ["lease"]);
}

#[test]
fn at_most_max_records_are_under_way_and_no_turn_is_taken_while_writes_wait_for_room() {
    let mut p = P::new(limits(2));
    let writes = p.push(
        vec![turn(1, vec![rec(1, "a"), rec(2, "b"), rec(3, "c")], vec![])],
        false,
    );
    assert_eq!(bodies(&writes), [["a"], ["b"]]);
    assert_eq!(p.under_way(), 2);
    assert!(!p.accepting(false));
    assert_eq!(bodies(&p.stored(writes[0].id)), [["c"]]);
    assert!(p.accepting(false));
    assert_eq!(p.under_way(), 2);
}

#[test]
fn batches_hold_at_most_max_batch_records_and_go_one_at_a_time() {
    let mut p = P::new(limits(100));
    let records = (1..=7).map(|t| rec(t, "r")).collect();
    let first = p.push(vec![turn(1, records, vec!["all"])], true);
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].records.len(), 3);
    assert!(!p.accepting(true), "a batch is under way");
    let second = p.stored(first[0].id);
    assert_eq!(second[0].records.len(), 3);
    let third = p.stored(second[0].id);
    assert_eq!(third[0].records.len(), 1);
    assert_eq!(p.release(), None);
    assert!(p.stored(third[0].id).is_empty());
    assert_eq!(p.release().unwrap().announce, ["all"]);
    assert!(p.accepting(true));
}

#[test]
fn a_batch_waits_for_the_earlier_writes_of_its_tasks() {
    let mut p = P::new(Limits {
        max_records: 100,
        max_batches: 2,
        max_batch: 10,
    });
    let first = p.push(
        vec![turn(1, vec![rec(1, "a1"), rec(2, "b1")], vec![])],
        true,
    );
    let second = p.push(
        vec![turn(2, vec![rec(2, "b2"), rec(3, "c1")], vec![])],
        true,
    );
    assert!(second.is_empty(), "task 2's earlier write is under way");
    assert_eq!(bodies(&p.stored(first[0].id)), [["b2", "c1"]]);
}

/// Whatever order writes land in, each task's records land in the order
/// they were made, and turns are announced in order, each only after all
/// its writes and the earlier turns' are stored.
#[test]
fn random_landing_orders_keep_both_rules() {
    for seed in 0..300u64 {
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let batches = seed % 3 == 0;
        let mut p: Pipeline<(u64, u64), u64> = Pipeline::new(Limits {
            max_records: 1 + next(4) as usize,
            max_batches: 1 + next(2) as usize,
            max_batch: 1 + next(4) as usize,
        });
        let mut made: FxHashMap<u64, u64> = FxHashMap::default();
        let mut landed: FxHashMap<u64, u64> = FxHashMap::default();
        let mut under_way: Vec<Write<(u64, u64)>> = Vec::new();
        let mut queued: VecDeque<Turn<(u64, u64), u64>> = VecDeque::new();
        let mut announced = 0;
        let mut turn_no = 0;
        for _ in 0..200 {
            if next(3) > 0 {
                turn_no += 1;
                let records = (0..next(4))
                    .map(|_| {
                        let task = 1 + next(5);
                        let n = made.entry(task).or_default();
                        *n += 1;
                        Record {
                            task: Some(task),
                            terminal: false,
                            finished: Vec::new(),
                            alone: next(10) == 0,
                            body: (task, *n),
                        }
                    })
                    .collect();
                queued.push_back(Turn {
                    number: turn_no,
                    records,
                    announce: vec![turn_no],
                });
            }
            if p.accepting(batches) && !queued.is_empty() {
                let group: Vec<_> = queued.drain(..).collect();
                under_way.extend(p.push(group, batches));
            }
            if !under_way.is_empty() && next(2) == 0 {
                let w = under_way.swap_remove(next(under_way.len() as u64) as usize);
                for r in &w.records {
                    let (task, n) = r.body;
                    let before = landed.insert(task, n).unwrap_or(0);
                    assert!(
                        n > before,
                        "seed {seed}: task {task} record {n} after {before}"
                    );
                }
                under_way.extend(p.stored(w.id));
            }
            while let Some(r) = p.release() {
                for a in r.announce {
                    assert!(a > announced, "seed {seed}: turn {a} after {announced}");
                    announced = a;
                }
            }
        }
        // Drain: everything lands, everything is announced.
        while !under_way.is_empty() || !queued.is_empty() {
            if p.accepting(batches) && !queued.is_empty() {
                let group: Vec<_> = queued.drain(..).collect();
                under_way.extend(p.push(group, batches));
            }
            if let Some(w) = under_way.pop() {
                under_way.extend(p.stored(w.id));
            }
            while let Some(r) = p.release() {
                announced = r.number.max(announced);
            }
        }
        assert_eq!(announced, turn_no, "seed {seed}");
        assert_eq!(p.turns_waiting(), 0);
    }
}

/// A result batch names the tasks it finishes: once stored, their
/// submissions may be purged (`terminal`); in batch mode it joins the
/// atomic batch like a task's record, while a record of neither kind (a
/// schedule's) goes by itself.
#[test]
fn a_result_batch_releases_its_tasks_and_joins_the_atomic_batch() {
    let results = Record {
        finished: vec![7, 8],
        ..slot("results")
    };
    for batches in [false, true] {
        let mut p = P::new(limits(10));
        let writes = p.push(
            vec![turn(
                1,
                vec![results.clone(), rec(2, "b1"), slot("schedule")],
                vec!["lease"],
            )],
            batches,
        );
        let mut shapes = bodies(&writes);
        shapes.sort();
        if batches {
            assert_eq!(shapes, [vec!["results", "b1"], vec!["schedule"]]);
        } else {
            assert_eq!(shapes, [vec!["b1"], vec!["results"], vec!["schedule"]]);
        }
        let mut next = Vec::new();
        for w in &writes {
            next.extend(p.stored(w.id));
        }
        assert!(next.is_empty());
        let released = p.release().expect("stored");
        assert_eq!(released.announce, ["lease"]);
        assert_eq!(released.terminal, [7, 8]);
    }
}

//! Tests of the ledger: the timeout rule, keys and aliases while live and
//! retained, the bounded ring, and the counters and histograms.

use super::*;

fn ledger(retain: usize) -> Ledger<(), ()> {
    Ledger::new(retain)
}

/// Task `id` of the default pool, accepted at `at` (ms).
fn accept(l: &mut Ledger<(), ()>, id: u64, key: Option<&str>, at: u64) {
    l.accept(
        TaskId(id),
        &PoolName::default(),
        Bytes::new(),
        key,
        (),
        Millis(at),
    );
}

fn finish(l: &mut Ledger<(), ()>, id: u64, state: TaskState) -> Outcome {
    l.finish(TaskId(id), PoolName::default(), state, false, Millis(9))
        .expect("live")
        .outcome
}

#[test]
fn an_attempt_stopped_for_its_timeout_is_lost_with_reason_timeout() {
    let mut l = ledger(10);
    accept(&mut l, 1, None, 0);
    l.started(
        TaskId(1),
        1,
        Labels::new(),
        Some("w".into()),
        None,
        Millis(1),
    );
    l.revoked(TaskId(1), 1, crate::core::RevokeReason::Timeout);
    // However the stop is reported (embedded: aborted = cancelled;
    // remote: failed or cancelled), it is lost with reason timeout.
    let told = l.ended(
        TaskId(1),
        1,
        AttemptOutcome::Cancelled,
        None,
        None,
        Millis(5),
    );
    assert_eq!(told, AttemptOutcome::Lost);
    l.started(TaskId(1), 2, Labels::new(), None, None, Millis(6));
    let told = l.ended(
        TaskId(1),
        2,
        AttemptOutcome::Succeeded,
        Some(Bytes::from("ok")),
        None,
        Millis(7),
    );
    assert_eq!(told, AttemptOutcome::Succeeded);
    let done = finish(&mut l, 1, TaskState::Succeeded);
    assert_eq!(done.attempts[0].outcome.as_deref(), Some("lost"));
    assert_eq!(done.attempts[0].error.as_deref(), Some(TIMEOUT));
    assert_eq!(done.attempts[0].ended_at, Some(Millis(5)));
    assert_eq!(done.attempts[1].outcome.as_deref(), Some("succeeded"));
    assert_eq!(done.output.as_deref(), Some(&b"ok"[..]));
}

#[test]
fn a_success_after_the_timeout_revoke_still_counts() {
    let mut l = ledger(10);
    accept(&mut l, 1, None, 0);
    l.started(TaskId(1), 1, Labels::new(), None, None, Millis(1));
    l.revoked(TaskId(1), 1, crate::core::RevokeReason::Timeout);
    let told = l.ended(
        TaskId(1),
        1,
        AttemptOutcome::Succeeded,
        None,
        None,
        Millis(2),
    );
    assert_eq!(told, AttemptOutcome::Succeeded);
}

#[test]
fn finishing_closes_an_open_attempt_as_cancelled() {
    let mut l = ledger(10);
    accept(&mut l, 3, None, 0);
    l.started(TaskId(3), 1, Labels::new(), None, None, Millis(1));
    let done = finish(&mut l, 3, TaskState::Cancelled);
    assert_eq!(done.attempts[0].outcome.as_deref(), Some("cancelled"));
    assert_eq!(done.attempts[0].ended_at, Some(Millis(9)));
    assert!(!l.is_live(TaskId(3)) && l.is_finished(TaskId(3)));
}

#[test]
fn a_key_is_bound_while_live_and_retained_then_free() {
    let mut l = ledger(2);
    accept(&mut l, 1, Some("k"), 0);
    assert_eq!(l.by_key("k"), Some(TaskId(1)));
    l.alias(TaskId(2), TaskId(1));
    assert_eq!(l.resolve(TaskId(2)), TaskId(1));
    finish(&mut l, 1, TaskState::Succeeded);
    // Retained: the key and the alias still stand for task 1.
    assert_eq!(l.by_key("k"), Some(TaskId(1)));
    assert!(l.outcome(TaskId(2)).is_some());
    l.alias(TaskId(3), TaskId(1));
    for id in [10, 11] {
        accept(&mut l, id, None, 0);
        finish(&mut l, id, TaskState::Succeeded);
    }
    // Two newer outcomes pushed task 1 out, with its key and aliases.
    assert_eq!(l.by_key("k"), None);
    assert!(!l.knows(TaskId(1)) && !l.knows(TaskId(2)) && !l.knows(TaskId(3)));
    assert!(l.knows(TaskId(10)) && l.knows(TaskId(11)));
}

#[test]
fn with_no_retention_a_key_is_free_once_finished() {
    let mut l = ledger(0);
    accept(&mut l, 1, Some("k"), 0);
    l.alias(TaskId(2), TaskId(1));
    finish(&mut l, 1, TaskState::Failed);
    assert_eq!(l.by_key("k"), None);
    assert!(!l.knows(TaskId(1)) && !l.knows(TaskId(2)));
}

#[test]
fn unaccept_forgets_the_task_and_its_key() {
    let mut l = ledger(5);
    accept(&mut l, 4, Some("k"), 0);
    l.unaccept(TaskId(4));
    assert!(!l.knows(TaskId(4)));
    assert_eq!(l.by_key("k"), None);
}

#[test]
fn the_ring_stays_bounded() {
    let mut l = ledger(3);
    for id in 1..=100 {
        accept(&mut l, id, Some(&format!("k{id}")), 0);
        l.alias(TaskId(1000 + id), TaskId(id));
        finish(&mut l, id, TaskState::Succeeded);
    }
    assert_eq!(l.retained, 3);
    assert!(l.keys.len() <= 3 && l.aliases.len() <= 4 && l.ring.len() <= 7);
}

#[test]
fn a_full_ring_reuses_its_places_and_keeps_the_newest() {
    let mut l = ledger(1_000);
    for id in 1..=5_000 {
        accept(&mut l, id, None, 0);
        finish(&mut l, id, TaskState::Succeeded);
    }
    // Grown to exactly the bound: the newest takes the place the oldest
    // left.
    assert_eq!(
        (l.retained, l.ring.len(), l.ring.capacity()),
        (1_000, 1_000, 1_000)
    );
    assert!(l.outcome(TaskId(4_000)).is_none());
    assert!((4_001..=5_000).all(|id| l.outcome(TaskId(id)).is_some()));
}

fn figures(l: &Ledger<(), ()>) -> crate::metrics::PoolMetrics {
    l.metrics().pools.into_iter().next().expect("one pool")
}

#[test]
fn a_retried_then_succeeded_task_counts_once_submitted_twice_started() {
    let mut l = ledger(10);
    accept(&mut l, 1, None, 1_000);
    l.started(TaskId(1), 1, Labels::new(), None, None, Millis(1_250));
    let failed = AttemptOutcome::Failed { retryable: true };
    l.ended(
        TaskId(1),
        1,
        failed,
        None,
        Some("boom".into()),
        Millis(1_350),
    );
    l.started(TaskId(1), 2, Labels::new(), None, None, Millis(2_000));
    l.ended(
        TaskId(1),
        2,
        AttemptOutcome::Succeeded,
        None,
        None,
        Millis(7_000),
    );
    finish(&mut l, 1, TaskState::Succeeded);
    let m = figures(&l);
    assert_eq!((m.submitted, m.started, m.retried, m.lost), (1, 2, 1, 0));
    assert_eq!((m.succeeded, m.failed, m.cancelled, m.missed), (1, 0, 0, 0));
    // One queue wait (submit → first start), 0.25 s: in le=0.25.
    assert_eq!((m.queue_wait.count, m.queue_wait.sum_ms), (1, 250));
    assert_eq!(m.queue_wait.buckets[2], 1);
    // Two runs: 0.1 s (le=0.1) and 5 s (le=5).
    assert_eq!((m.run.count, m.run.sum_ms), (2, 5_100));
    assert_eq!((m.run.buckets[1], m.run.buckets[6]), (1, 1));
}

#[test]
fn a_lost_attempt_counts_lost_and_its_run() {
    let mut l = ledger(10);
    accept(&mut l, 1, None, 0);
    l.started(TaskId(1), 1, Labels::new(), None, None, Millis(0));
    l.revoked(TaskId(1), 1, crate::core::RevokeReason::Timeout);
    l.ended(
        TaskId(1),
        1,
        AttemptOutcome::Cancelled,
        None,
        None,
        Millis(60_000),
    );
    l.started(TaskId(1), 2, Labels::new(), None, None, Millis(61_000));
    l.ended(
        TaskId(1),
        2,
        AttemptOutcome::Lost,
        None,
        None,
        Millis(3_600_001),
    );
    finish(&mut l, 1, TaskState::Failed);
    let m = figures(&l);
    assert_eq!((m.started, m.retried, m.lost, m.failed), (2, 1, 2, 1));
    // 60 s is le=60 (inclusive); just over 3,539 s is le=3600.
    assert_eq!(m.run.buckets[9], 1);
    assert_eq!(m.run.buckets[13], 1);
}

#[test]
fn a_cancel_counts_cancelled_and_closes_the_run() {
    let mut l = ledger(10);
    accept(&mut l, 1, None, 0);
    accept(&mut l, 2, None, 0);
    l.started(TaskId(1), 1, Labels::new(), None, None, Millis(10));
    finish(&mut l, 1, TaskState::Cancelled); // running: closed at 9… (clock ran back)
    finish(&mut l, 2, TaskState::Cancelled); // waiting: no run
    let m = figures(&l);
    assert_eq!((m.submitted, m.started, m.cancelled), (2, 1, 2));
    assert_eq!((m.run.count, m.run.sum_ms), (1, 0));
    assert_eq!(m.queue_wait.count, 1);
}

#[test]
fn a_refused_submission_counts_once_and_dead_lettered() {
    let mut l = ledger(10);
    let pool = PoolName::new("p").unwrap();
    l.accept(TaskId(1), &pool, Bytes::new(), None, (), Millis(0));
    l.unaccept(TaskId(1));
    l.record_outcome(
        &Outcome {
            id: TaskId(1),
            pool,
            state: TaskState::Failed,
            output: None,
            error: Some("refused".into()),
            attempts: Vec::new(),
            deadline_missed: false,
            schedule: None,
        },
        None,
    );
    let m = figures(&l);
    assert_eq!(
        (m.pool.as_str(), m.submitted, m.failed, m.dead_lettered),
        ("p", 1, 1, 1)
    );
}

#[test]
fn a_task_recorded_twice_is_retained_once_with_its_newer_outcome() {
    let mut l = ledger(2);
    let earlier = Outcome {
        id: TaskId(1),
        pool: PoolName::default(),
        state: TaskState::Failed,
        output: None,
        error: Some("earlier".into()),
        attempts: Vec::new(),
        deadline_missed: false,
        schedule: None,
    };
    l.restore_finished(&earlier, None);
    // The same id live again (never from the core) and finished: the newer
    // record stands and the older one no longer counts toward the bound.
    accept(&mut l, 1, None, 0);
    l.started(TaskId(1), 1, Labels::new(), None, None, Millis(1));
    finish(&mut l, 1, TaskState::Succeeded);
    assert_eq!(
        l.outcome(TaskId(1)).expect("kept").state,
        TaskState::Succeeded
    );
    accept(&mut l, 2, None, 0);
    finish(&mut l, 2, TaskState::Cancelled);
    assert!(l.is_finished(TaskId(1)) && l.is_finished(TaskId(2)));
    // A run record emptied at a finish is reused, with nothing of its task.
    accept(&mut l, 3, Some("k3"), 0);
    l.started(TaskId(3), 1, Labels::new(), None, None, Millis(1));
    let done = finish(&mut l, 3, TaskState::Succeeded);
    assert_eq!(done.attempts.len(), 1);
    assert!(!l.is_finished(TaskId(1)), "evicted: the bound is 2");
    accept(&mut l, 4, None, 0);
    l.started(TaskId(4), 1, Labels::new(), None, None, Millis(2));
    let done = finish(&mut l, 4, TaskState::Succeeded);
    assert_eq!(done.attempts.len(), 1);
    assert_eq!(done.attempts[0].started_at, Millis(2));
    assert_eq!(l.by_key("k3"), Some(TaskId(3)));
}

/// The compact retained form gives back exactly what finished, whatever
/// its shape: the usual single attempt kept inline, and everything rarer
/// (errors, workers, several attempts, a schedule, an attempt left open,
/// none at all) behind its box; a reused run record starts empty.
#[test]
fn the_compact_outcome_gives_back_what_finished() {
    let mut l = ledger(10);
    let group = Labels::from([("gpu", "a100")]);
    /// An attempt: its worker, outcome and error.
    type Attempt<'a> = (Option<&'a str>, AttemptOutcome, Option<&'a str>);
    let shapes: [(Option<&str>, &[Attempt], TaskState); 6] = [
        (
            None,
            &[(None, AttemptOutcome::Succeeded, None)],
            TaskState::Succeeded,
        ),
        (
            Some("k"),
            &[(None, AttemptOutcome::Succeeded, None)],
            TaskState::Succeeded,
        ),
        (
            None,
            &[(Some("w"), AttemptOutcome::Succeeded, None)],
            TaskState::Succeeded,
        ),
        (
            None,
            &[
                (
                    None,
                    AttemptOutcome::Failed { retryable: true },
                    Some("boom"),
                ),
                (
                    None,
                    AttemptOutcome::Failed { retryable: false },
                    Some("again"),
                ),
            ],
            TaskState::Failed,
        ),
        (None, &[], TaskState::Cancelled),
        (None, &[], TaskState::Succeeded),
    ];
    for (i, (key, attempts, state)) in shapes.iter().enumerate() {
        let id = i as u64 + 1;
        accept(&mut l, id, *key, 0);
        if i == 1 {
            l.set_schedule(TaskId(id), Some(("nightly".into(), Millis(3))));
        }
        for (n, (worker, outcome, error)) in attempts.iter().enumerate() {
            let n = n as u32 + 1;
            let worker = worker.map(str::to_string);
            l.started(TaskId(id), n, group.clone(), worker, None, Millis(1));
            let output = (*outcome == AttemptOutcome::Succeeded).then(|| Bytes::from("out"));
            let error = error.map(str::to_string);
            l.ended(TaskId(id), n, *outcome, output, error, Millis(2));
        }
        if i == 5 {
            // Still running when it finishes: closed as cancelled.
            l.started(TaskId(id), 1, group.clone(), None, None, Millis(1));
        }
        let got = finish(&mut l, id, *state);
        assert_eq!(l.outcome(TaskId(id)).as_ref(), Some(&got), "shape {i}");
        assert_eq!(got.state, *state);
        assert_eq!(got.attempts.len(), attempts.len().max(usize::from(i == 5)));
        if i == 1 {
            assert_eq!(got.schedule, Some(("nightly".into(), Millis(3))));
            assert_eq!(l.retained_key(TaskId(id)), Some("k"));
        }
        if i == 3 {
            assert_eq!(got.error.as_deref(), Some("again"));
            assert_eq!(got.attempts[0].error.as_deref(), Some("boom"));
        }
        if i == 5 {
            assert_eq!(got.attempts[0].outcome.as_deref(), Some("cancelled"));
        }
    }
    // A run record reused by the next task carries nothing over.
    accept(&mut l, 99, None, 0);
    l.started(TaskId(99), 1, Labels::new(), None, None, Millis(1));
    let got = finish(&mut l, 99, TaskState::Cancelled);
    assert_eq!((got.error, got.output, got.schedule), (None, None, None));
    assert_eq!(got.attempts.len(), 1);
    assert_eq!(l.retained_key(TaskId(99)), None);
}

mod entries_window {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        /// Live entries answer like a map of id → entry however ids
        /// arrive (rising, or below the window) and finish.
        #[test]
        fn entries_answer_like_an_ordered_map(ops in proptest::collection::vec((0u8..10, 0u64..1_000), 1..600)) {
            let mut entries: Entries<u64> = Entries::default();
            let mut model: BTreeMap<u64, u64> = BTreeMap::new();
            let mut next = 1_000u64;
            for (op, n) in ops {
                match op {
                    // A new id from the counter, sometimes after a gap.
                    0..=4 => {
                        next += 1 + n % 3;
                        entries.insert(TaskId(next), next * 10);
                        model.insert(next, next * 10);
                    }
                    // An old id (below or inside the window) not held.
                    5 => {
                        let id = n + 1;
                        if let std::collections::btree_map::Entry::Vacant(e) = model.entry(id) {
                            e.insert(id * 10);
                            entries.insert(TaskId(id), id * 10);
                        }
                    }
                    // Finish one: mostly an old one.
                    _ => {
                        let held: Vec<u64> = model.keys().copied().collect();
                        if !held.is_empty() {
                            let id = held[(n as usize * n as usize) % held.len()];
                            prop_assert_eq!(entries.remove(TaskId(id)), model.remove(&id));
                        }
                    }
                }
                for (&id, &v) in &model {
                    prop_assert_eq!(entries.get(TaskId(id)), Some(&v));
                }
                prop_assert_eq!(entries.get(TaskId(next + 1)), None);
            }
        }
    }
}

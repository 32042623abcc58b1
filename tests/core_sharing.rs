//! SPEC §9, "Sharing a fleet", rule by rule: fair share, quotas,
//! concurrency limits and their policies, preemption, and the refusals of
//! bad values — all through the `Sim` harness of `tests/common`, which
//! checks the core's invariants (rule 4 as §9 restates it among them)
//! after every accepted event and that a refused event changes nothing.
//!
//! Times are plain milliseconds from 0; pool `p` unless a test says so.

mod common;

use common::*;
use cronoq::core::{
    ErrorCode, Event, FairnessWeight, Labels, PoolConfig, Preemption, QuotaConfig, TaskId, TaskSpec,
};

/// The task ids of the `start` lines, in order.
fn started(lines: &[String]) -> Vec<u64> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("start t"))
        .map(|l| l.split('#').next().unwrap().parse().unwrap())
        .collect()
}

/// Ends the running attempt of each task started, one by one, `n` times:
/// the ids that start, in order (one slot: one start per end).
fn run_one_slot(s: &mut Sim, first: u64, n: usize) -> Vec<u64> {
    let mut order = vec![first];
    for _ in 0..n {
        let last = *order.last().unwrap();
        let next = started(&s.end(last, OK));
        assert_eq!(next.len(), 1, "one slot, one start");
        order.push(next[0]);
    }
    order
}

// ---- (c) fair share ---------------------------------------------------------

#[test]
fn fair_share_alternates_keys_under_contention() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    assert_eq!(s.submit(task(1).fair("a", 1)), ["start t1#1 {}"]);
    for id in 2..=10 {
        assert_eq!(s.submit(task(id).fair("a", 1)), NOTHING);
    }
    for id in 11..=13 {
        assert_eq!(s.submit(task(id).fair("b", 1)), NOTHING);
    }
    // a has had one start (tag 0) and queued tags 1..9; b comes in at the
    // pool's virtual time (0): b's first, then turns by tag, then a alone.
    assert_eq!(
        run_one_slot(&mut s, 1, 9),
        [1, 11, 2, 12, 3, 13, 4, 5, 6, 7]
    );
}

#[test]
fn fair_share_follows_the_pools_weights_over_the_tasks_own() {
    let mut s = Sim::new();
    s.configure("p", |c| {
        c.fairness = vec![FairnessWeight {
            key: "a".into(),
            weight: 3,
        }]
    });
    s.capacity("p", "", 1);
    s.submit(task(1).fair("x", 1));
    // a's tasks claim weight 1; the pool weights a 3.
    for i in 0..40 {
        s.submit(task(100 + i).fair("a", 1));
        s.submit(task(200 + i).fair("b", 1));
    }
    let order = run_one_slot(&mut s, 1, 40);
    let a = order[1..]
        .iter()
        .filter(|&&t| (100..200).contains(&t))
        .count();
    let b = order[1..]
        .iter()
        .filter(|&&t| (200..300).contains(&t))
        .count();
    assert_eq!((a, b), (30, 10), "3:1 within one task: {order:?}");
}

#[test]
fn fair_share_uses_a_tasks_own_weight_when_the_pool_sets_none() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    s.submit(task(1).fair("x", 1));
    for i in 0..20 {
        s.submit(task(100 + i).fair("a", 4));
        s.submit(task(200 + i).fair("b", 1));
    }
    let order = run_one_slot(&mut s, 1, 25);
    let a = order[1..]
        .iter()
        .filter(|&&t| (100..200).contains(&t))
        .count();
    assert!((19..=21).contains(&a), "4:1 of 25 is 20 for a: {order:?}");
}

#[test]
fn fair_share_an_idle_key_earns_no_burst() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    // a runs 20 tasks alone (b idle), then both wait.
    s.submit(task(1).fair("a", 1));
    for id in 2..=30 {
        s.submit(task(id).fair("a", 1));
    }
    let alone = run_one_slot(&mut s, 1, 19);
    assert_eq!(alone, (1..=20).collect::<Vec<_>>());
    for id in 101..=110 {
        s.submit(task(id).fair("b", 1));
    }
    // b comes in at the pool's virtual time (a's last start), not at its
    // own idle 0: turns alternate, no run of b's ten.
    let next = run_one_slot(&mut s, 20, 8);
    assert_eq!(next[1..], [101, 21, 102, 22, 103, 23, 104, 24]);
}

#[test]
fn fair_share_comes_after_urgency_and_need() {
    let mut s = Sim::new();
    s.capacity("p", "gpu=a100", 1);
    s.submit(task(1).fair("a", 1).labels("gpu=a100"));
    // a has run once; b is behind on service but asks for no label, and
    // a's later task has a higher priority.
    s.submit(task(2).fair("b", 1));
    s.submit(task(3).fair("a", 1).labels("gpu=a100"));
    s.submit(task(4).fair("a", 1).priority(5));
    // (a) priority, then (b) need: the labeled a task before b's.
    assert_eq!(run_one_slot(&mut s, 1, 3), [1, 4, 3, 2]);
}

#[test]
fn fair_share_orders_across_label_sets_of_equal_need() {
    let mut s = Sim::new();
    s.capacity("p", "gpu=a100,zone=eu", 1);
    s.submit(task(1).fair("a", 1).labels("gpu=a100"));
    s.submit(task(2).fair("a", 1).labels("gpu=a100"));
    s.submit(task(3).fair("a", 1).labels("zone=eu"));
    s.submit(task(4).fair("b", 1).labels("zone=eu"));
    s.submit(task(5).fair("b", 1).labels("gpu=a100"));
    // Heads of both queues compared on start tags (a: 0 1 2, b: 0 1), then
    // submission order.
    assert_eq!(run_one_slot(&mut s, 1, 4), [1, 4, 2, 5, 3]);
}

#[test]
fn fair_share_without_keys_is_submission_order() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    for id in 1..=6 {
        s.submit(task(id));
    }
    assert_eq!(run_one_slot(&mut s, 1, 5), [1, 2, 3, 4, 5, 6]);
}

#[test]
fn fair_share_unkeyed_tasks_share_one_key() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    s.submit(task(1));
    for id in 2..=4 {
        s.submit(task(id));
    }
    for id in 11..=13 {
        s.submit(task(id).fair("a", 1));
    }
    assert_eq!(run_one_slot(&mut s, 1, 6), [1, 11, 2, 12, 3, 13, 4]);
}

// ---- eligibility: quotas ----------------------------------------------------

fn quota(key: &str, labels_text: &str, max_running: u32) -> QuotaConfig {
    QuotaConfig {
        key: key.into(),
        labels: labels(labels_text),
        max_running,
    }
}

#[test]
fn quota_bounds_a_keys_slots_in_groups_carrying_its_labels_and_blocks_nobody() {
    let mut s = Sim::new();
    s.configure("p", |c| c.quotas = vec![quota("b", "gpu=a100", 1)]);
    s.capacity("p", "gpu=a100", 2);
    s.capacity("p", "", 1);
    assert_eq!(
        s.submit(task(1).fair("b", 1).labels("gpu=a100")),
        ["start t1#1 {gpu=a100}"]
    );
    // A free a100 slot, but b holds its quota there.
    assert_eq!(s.submit(task(2).fair("b", 1).labels("gpu=a100")), NOTHING);
    assert_eq!(s.state(2), "queued/quota/b");
    // b's unlabeled task may use the unlabeled group (no quota there).
    assert_eq!(s.submit(task(3).fair("b", 1)), ["start t3#1 {}"]);
    // ...and blocks nobody: a takes the free a100 slot.
    assert_eq!(
        s.submit(task(4).fair("a", 1).labels("gpu=a100")),
        ["start t4#1 {gpu=a100}"]
    );
    assert_eq!(
        s.end(1, OK),
        ["finish t1 succeeded attempts=1", "start t2#1 {gpu=a100}"]
    );
}

#[test]
fn quota_with_no_labels_bounds_the_whole_pool() {
    let mut s = Sim::new();
    s.configure("p", |c| c.quotas = vec![quota("b", "", 2)]);
    s.capacity("p", "", 2);
    s.capacity("p", "gpu=a100", 2);
    s.submit(task(1).fair("b", 1));
    s.submit(task(2).fair("b", 1));
    assert_eq!(s.submit(task(3).fair("b", 1)), NOTHING);
    assert_eq!(s.state(3), "queued/quota/b");
    assert_eq!(s.submit(task(4)), ["start t4#1 {gpu=a100}"]);
    // Freeing a b slot lets b's waiter in.
    assert_eq!(
        s.end(2, OK),
        ["finish t2 succeeded attempts=1", "start t3#1 {}"]
    );
}

#[test]
fn quota_freed_in_one_group_lets_the_key_use_a_free_slot_of_another() {
    let mut s = Sim::new();
    s.configure("p", |c| c.quotas = vec![quota("b", "gpu=a100", 1)]);
    s.capacity("p", "gpu=a100,zone=eu", 1);
    s.capacity("p", "gpu=a100,zone=us", 1);
    s.submit(task(1).fair("b", 1).labels("gpu=a100,zone=eu"));
    assert_eq!(s.submit(task(2).fair("b", 1).labels("zone=us")), NOTHING);
    assert_eq!(s.state(2), "queued/quota/b");
    // t1's slot frees; nobody wants it, but b's quota has room again, so
    // t2 takes the free us slot it was kept from.
    assert_eq!(
        s.end(1, OK),
        [
            "finish t1 succeeded attempts=1",
            "start t2#1 {gpu=a100,zone=us}"
        ]
    );
}

#[test]
fn quota_lowered_by_config_takes_effect_on_the_next_start() {
    let mut s = Sim::new();
    s.capacity("p", "", 3);
    for id in 1..=3 {
        s.submit(task(id).fair("b", 1));
    }
    s.configure("p", |c| c.quotas = vec![quota("b", "", 1)]);
    s.submit(task(4).fair("b", 1));
    s.end(1, OK);
    s.end(2, OK);
    assert_eq!(s.state(4), "queued/quota/b", "b still holds 1 of 1");
    assert_eq!(
        s.end(3, OK),
        ["finish t3 succeeded attempts=1", "start t4#1 {}"]
    );
}

// ---- eligibility: concurrency limits ------------------------------------------

#[test]
fn concurrency_queue_waits_for_the_limit_and_blocks_nobody() {
    let mut s = Sim::new();
    s.capacity("p", "", 3);
    assert_eq!(
        s.submit(task(1).conc("deploy", 1, "queue")),
        ["start t1#1 {}"]
    );
    assert_eq!(s.submit(task(2).conc("deploy", 1, "queue")), NOTHING);
    assert_eq!(s.state(2), "queued/concurrency/deploy");
    assert_eq!(s.submit(task(3)), ["start t3#1 {}"]);
    assert_eq!(
        s.end(1, OK),
        ["finish t1 succeeded attempts=1", "start t2#1 {}"]
    );
}

#[test]
fn concurrency_each_task_is_checked_against_its_own_limit() {
    let mut s = Sim::new();
    s.capacity("p", "", 4);
    assert_eq!(s.submit(task(1).conc("k", 2, "queue")), ["start t1#1 {}"]);
    assert_eq!(s.submit(task(2).conc("k", 1, "queue")), NOTHING);
    assert_eq!(s.submit(task(3).conc("k", 2, "queue")), ["start t3#1 {}"]);
    assert_eq!(s.submit(task(4).conc("k", 3, "queue")), ["start t4#1 {}"]);
    assert_eq!(s.state(2), "queued/concurrency/k");
    s.end(1, OK);
    s.end(3, OK);
    assert_eq!(s.state(2), "queued/concurrency/k", "one still runs");
    assert_eq!(
        s.end(4, OK),
        ["finish t4 succeeded attempts=1", "start t2#1 {}"]
    );
}

#[test]
fn concurrency_limit_counts_a_retry_waiting_in_backoff_as_not_running() {
    let mut s = Sim::new();
    s.capacity("p", "", 2);
    s.submit(task(1).conc("k", 1, "queue").backoff(10, 10));
    s.submit(task(2).conc("k", 1, "queue"));
    assert_eq!(s.end(1, FAIL), ["retry t1#2 @10", "start t2#1 {}"]);
    // t1's retry finds the limit full and waits for it.
    assert_eq!(s.advance(10), NOTHING);
    assert_eq!(s.state(1), "queued/concurrency/k");
    assert_eq!(
        s.end(2, OK),
        ["finish t2 succeeded attempts=1", "start t1#2 {}"]
    );
}

#[test]
fn concurrency_replace_waiting_cancels_the_keys_older_waiters() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    s.submit(task(1).conc("k", 1, "queue"));
    s.submit(task(2).conc("k", 1, "queue"));
    s.submit(task(3).conc("k", 1, "replace_waiting"));
    assert_eq!(s.state(2), "gone");
    assert_eq!(s.state(3), "queued/concurrency/k");
    assert_eq!(
        s.submit(task(4).conc("k", 1, "replace_waiting")),
        ["finish t3 cancelled attempts=0 replaced"]
    );
    assert_eq!(
        s.end(1, OK),
        ["finish t1 succeeded attempts=1", "start t4#1 {}"]
    );
}

#[test]
fn concurrency_cancel_running_cancels_the_oldest_beyond_limit_minus_one() {
    let mut s = Sim::new();
    s.capacity("p", "", 3);
    s.submit(task(1).conc("k", 2, "queue"));
    s.submit(task(2).conc("k", 2, "queue"));
    assert_eq!(
        s.submit(task(3).conc("k", 2, "cancel_running")),
        [
            "revoke t1#1 {} cancelled",
            "finish t1 cancelled attempts=1 concurrency"
        ]
    );
    // t1 still stops: t3 waits for its slot under the limit.
    assert_eq!(s.state(3), "queued/concurrency/k");
    assert_eq!(s.end(1, STOPPED), ["start t3#1 {}"]);
}

#[test]
fn concurrency_skip_cancels_the_newcomer_while_the_limit_is_full() {
    let mut s = Sim::new();
    s.capacity("p", "", 2);
    s.submit(task(1).conc("k", 1, "skip"));
    assert_eq!(
        s.submit(task(2).conc("k", 1, "skip")),
        ["finish t2 cancelled attempts=0 concurrency"]
    );
    s.end(1, OK);
    assert_eq!(s.submit(task(3).conc("k", 1, "skip")), ["start t3#1 {}"]);
}

#[test]
fn concurrency_cancelling_a_waiter_lets_the_next_in() {
    let mut s = Sim::new();
    s.capacity("p", "", 2);
    s.submit(task(1).conc("k", 2, "queue").labels("gpu=a100"));
    s.submit(task(2).conc("k", 2, "queue").labels("gpu=a100"));
    // Two of k wait in the queue for a GPU; a third waits for the limit.
    assert_eq!(s.submit(task(3).conc("k", 2, "queue")), NOTHING);
    assert_eq!(s.state(3), "queued/concurrency/k");
    assert_eq!(
        s.cancel(1),
        ["finish t1 cancelled attempts=0", "start t3#1 {}"]
    );
}

// ---- preemption -----------------------------------------------------------------

fn preemptive(s: &mut Sim) {
    s.configure("p", |c| c.preemption = Preemption::Priority);
}

#[test]
fn preemption_is_off_by_default() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    s.submit(task(1));
    assert_eq!(s.submit(task(2).priority(9)), NOTHING);
}

#[test]
fn preemption_revokes_a_lower_priority_attempt_and_keeps_its_slot() {
    let mut s = Sim::new();
    preemptive(&mut s);
    s.capacity("p", "", 1);
    s.submit(task(1).max_attempts(2));
    assert_eq!(s.submit(task(3).priority(9)), ["revoke t1#1 {} preempted"]);
    assert_eq!(
        s.submit(task(2).priority(5)),
        NOTHING,
        "t3 already preempts t1"
    );
    assert_eq!(s.state(1), "running");
    // The slot goes to t3 (kept for it), and t1 waits again in its place.
    assert_eq!(s.end(1, STOPPED), ["preempted t1#1", "start t3#1 {}"]);
    assert_eq!(s.state(1), "queued/groups_full");
    assert_eq!(
        s.end(3, OK),
        ["finish t3 succeeded attempts=1", "start t2#1 {}"]
    );
    assert_eq!(
        s.end(2, OK),
        ["finish t2 succeeded attempts=1", "start t1#2 {}"]
    );
    // A preempted attempt does not count (nor lengthen the backoff): its
    // first failure leaves t1 (max_attempts 2) one more attempt.
    assert_eq!(s.end(1, FAIL), ["retry t1#3 @1000"]);
    assert_eq!(s.at(1_000), ["start t1#3 {}"]);
    assert_eq!(s.end(1, FAIL), ["finish t1 failed attempts=3"]);
}

#[test]
fn preemption_needs_strictly_lower_priority_and_a_preemptible_task() {
    let mut s = Sim::new();
    preemptive(&mut s);
    s.capacity("p", "", 2);
    s.submit(task(1).priority(5));
    s.submit(task(2).not_preemptible());
    assert_eq!(s.submit(task(3).priority(5)), NOTHING);
    assert_eq!(s.state(3), "queued/groups_full");
}

#[test]
fn preemption_picks_the_lowest_priority_then_the_latest_started() {
    let mut s = Sim::new();
    preemptive(&mut s);
    s.capacity("p", "", 3);
    s.submit(task(1).priority(1));
    s.submit(task(2));
    s.submit(task(3));
    assert_eq!(s.submit(task(4).priority(2)), ["revoke t3#1 {} preempted"]);
    assert_eq!(s.submit(task(5).priority(2)), ["revoke t2#1 {} preempted"]);
    assert_eq!(s.submit(task(6).priority(2)), ["revoke t1#1 {} preempted"]);
}

#[test]
fn preemption_only_in_groups_matching_the_preempting_task() {
    let mut s = Sim::new();
    preemptive(&mut s);
    s.capacity("p", "", 1);
    s.capacity("p", "gpu=a100", 1);
    s.submit(task(1));
    s.submit(task(2).labels("gpu=a100").priority(1));
    // t3 needs a100: t1 (lower) runs in the unlabeled group, out of reach.
    assert_eq!(
        s.submit(task(3).labels("gpu=a100").priority(5)),
        ["revoke t2#1 {gpu=a100} preempted"]
    );
}

#[test]
fn preemption_a_victim_that_succeeds_anyway_succeeds() {
    let mut s = Sim::new();
    preemptive(&mut s);
    s.capacity("p", "", 1);
    s.submit(task(1));
    s.submit(task(2).priority(1));
    assert_eq!(
        s.end(1, OK),
        ["finish t1 succeeded attempts=1", "start t2#1 {}"]
    );
}

#[test]
fn preemption_stops_after_max_preemptions_anti_thrashing() {
    let mut s = Sim::new();
    preemptive(&mut s);
    s.capacity("p", "", 1);
    s.submit(task(1));
    for round in 0..3u64 {
        let hi = 10 + round;
        assert_eq!(
            s.submit(task(hi).priority(5)),
            [format!("revoke t1#{} {{}} preempted", round + 1)]
        );
        s.end(1, STOPPED);
        assert_eq!(
            s.end(hi, OK),
            [
                format!("finish t{hi} succeeded attempts=1"),
                format!("start t1#{} {{}}", round + 2)
            ]
        );
    }
    // Preempted three times: not chosen again.
    assert_eq!(s.submit(task(20).priority(5)), NOTHING);
    assert_eq!(s.state(20), "queued/groups_full");
}

// ---- bad values -----------------------------------------------------------------

#[test]
fn bad_sharing_values_are_invalid_argument_and_change_nothing() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    let bad: Vec<TaskSpec> = vec![
        task(1).fair("", 1).0,
        task(1).fair(&"k".repeat(65), 1).0,
        task(1).fair("a\tb", 1).0,
        task(1).fair("a", 0).0,
        task(1).fair("a", 1001).0,
        task(1).conc(&"k".repeat(129), 1, "queue").0,
        task(1).conc("k", 0, "queue").0,
    ];
    for spec in bad {
        let refused = s.try_step(Event::Submitted(spec.clone())).unwrap_err();
        assert_eq!(refused.code(), ErrorCode::INVALID_ARGUMENT, "{spec:?}");
    }
    assert!(s.view(1).is_none());
    // The limits themselves are fine.
    s.submit(
        task(2)
            .fair(&"k".repeat(64), 1000)
            .conc(&"c".repeat(128), 1, "queue"),
    );
    let weight = |key: &str, weight| FairnessWeight {
        key: key.into(),
        weight,
    };
    let configs = [
        PoolConfig {
            fairness: vec![weight("a", 0)],
            ..PoolConfig::default()
        },
        PoolConfig {
            fairness: vec![weight("a", 1001)],
            ..PoolConfig::default()
        },
        PoolConfig {
            fairness: vec![weight("a", 2), weight("a", 3)],
            ..PoolConfig::default()
        },
        PoolConfig {
            quotas: vec![quota("", "", 1)],
            ..PoolConfig::default()
        },
        PoolConfig {
            quotas: vec![QuotaConfig {
                key: "a".into(),
                labels: Labels::from([("bad key", "v")]),
                max_running: 1,
            }],
            ..PoolConfig::default()
        },
    ];
    for config in configs {
        let refused = s
            .try_step(Event::PoolConfigured {
                pool: pool("p"),
                config: config.clone(),
            })
            .unwrap_err();
        assert_eq!(refused.code(), ErrorCode::INVALID_ARGUMENT, "{config:?}");
    }
    assert!(s.core.task(TaskId(2)).is_some());
}

// ---- properties -----------------------------------------------------------------

mod properties {
    use std::collections::{BTreeMap, HashMap};

    use cronoq::core::{
        Action, AttemptOutcome, ConcurrencyPolicy, Core, Event, FairnessWeight, GroupId, Labels,
        Millis, PoolConfig, Preemption, QuotaConfig, RevokeReason, TaskId, TaskSpec, TaskState,
    };
    use proptest::prelude::*;

    use super::common::pool;

    const GROUPS: [&str; 3] = ["", "gpu=a100", "gpu=a100,zone=eu"];
    const REQUIRED: [&str; 3] = ["", "gpu=a100", "zone=eu"];
    const KEYS: [&str; 3] = ["a", "b", "c"];

    fn labels(text: &str) -> Labels {
        super::common::labels(text)
    }

    #[derive(Clone, Debug)]
    struct Submit {
        key: Option<usize>,
        weight: u32,
        conc: Option<(usize, u32, ConcurrencyPolicy)>,
        priority: i32,
        required: usize,
        preemptible: bool,
        max_attempts: u32,
    }

    #[derive(Clone, Debug)]
    enum Op {
        Submit(Submit),
        End {
            pick: usize,
            outcome: AttemptOutcome,
        },
        Cancel {
            pick: usize,
        },
        Capacity {
            group: usize,
            slots: u32,
        },
        Advance {
            ms: u64,
        },
    }

    fn policy() -> impl Strategy<Value = ConcurrencyPolicy> {
        prop_oneof![
            3 => Just(ConcurrencyPolicy::Queue),
            1 => Just(ConcurrencyPolicy::ReplaceWaiting),
            1 => Just(ConcurrencyPolicy::CancelRunning),
            1 => Just(ConcurrencyPolicy::Skip),
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        let submit = (
            prop::option::weighted(0.8, 0..KEYS.len()),
            1..=3u32,
            prop::option::weighted(0.5, (0..2usize, 1..=3u32, policy())),
            -1..=1i32,
            0..REQUIRED.len(),
            prop::bool::weighted(0.8),
            1..=3u32,
        )
            .prop_map(
                |(key, weight, conc, priority, required, preemptible, max_attempts)| {
                    Op::Submit(Submit {
                        key,
                        weight,
                        conc,
                        priority,
                        required,
                        preemptible,
                        max_attempts,
                    })
                },
            );
        let outcome = prop_oneof![
            3 => Just(AttemptOutcome::Succeeded),
            2 => Just(AttemptOutcome::Failed { retryable: true }),
            1 => Just(AttemptOutcome::Failed { retryable: false }),
            1 => Just(AttemptOutcome::Lost),
            1 => Just(AttemptOutcome::Cancelled),
        ];
        prop_oneof![
            5 => submit,
            4 => (any::<usize>(), outcome).prop_map(|(pick, outcome)| Op::End { pick, outcome }),
            1 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
            1 => (0..GROUPS.len(), 0..=3u32).prop_map(|(group, slots)| Op::Capacity { group, slots }),
            1 => (0..50u64).prop_map(|ms| Op::Advance { ms }),
        ]
    }

    fn config() -> impl Strategy<Value = PoolConfig> {
        (
            prop::collection::vec((0..KEYS.len(), 1..=4u32), 0..3),
            prop::collection::vec((0..KEYS.len(), 0..2usize, 0..=3u32), 0..3),
            any::<bool>(),
        )
            .prop_map(|(weights, quotas, preempt)| {
                let mut fairness: Vec<FairnessWeight> = Vec::new();
                for (k, weight) in weights {
                    if fairness.iter().all(|f| f.key != KEYS[k]) {
                        fairness.push(FairnessWeight {
                            key: KEYS[k].into(),
                            weight,
                        });
                    }
                }
                PoolConfig {
                    fairness,
                    quotas: quotas
                        .into_iter()
                        .map(|(k, l, max_running)| QuotaConfig {
                            key: KEYS[k].into(),
                            labels: labels(["", "gpu=a100"][l]),
                            max_running,
                        })
                        .collect(),
                    preemption: if preempt {
                        Preemption::Priority
                    } else {
                        Preemption::Off
                    },
                    backoff: cronoq::core::Backoff {
                        initial: Millis(5),
                        max: Millis(20),
                    },
                    ..PoolConfig::default()
                }
            })
    }

    /// What the shell learns from the actions, and what it asked.
    #[derive(Default)]
    struct Model {
        specs: HashMap<u64, Submit>,
        /// Attempts holding a slot: task -> (attempt, group).
        live: BTreeMap<u64, (u32, GroupId)>,
        revoked: HashMap<(u64, u32), RevokeReason>,
        preempted: HashMap<u64, u32>,
        /// The last outcome each task's attempt was reported with.
        last: HashMap<u64, AttemptOutcome>,
        finished: HashMap<u64, u32>,
        /// Started attempts that ended preempted, the one just ended.
        ended: Option<(u64, u32)>,
    }

    impl Model {
        fn apply(&mut self, core: &Core, config: &PoolConfig, actions: &[Action]) {
            for action in actions {
                match *action {
                    Action::Start {
                        task,
                        attempt,
                        group,
                    } => {
                        let spec = &self.specs[&task.0];
                        let glabels = core.group_labels(group);
                        // Quotas never exceeded.
                        if let Some(k) = spec.key {
                            for q in config.quotas.iter().filter(|q| q.key == KEYS[k]) {
                                let carries =
                                    |l: &Labels| q.labels.iter().all(|(n, v)| l.get(n) == Some(v));
                                if !carries(glabels) {
                                    continue;
                                }
                                let held = self
                                    .live
                                    .iter()
                                    .filter(|(t, (_, g))| {
                                        self.specs[t].key == Some(k)
                                            && carries(core.group_labels(*g))
                                    })
                                    .count() as u32;
                                assert!(
                                    held < q.max_running,
                                    "t{task} starts with key {} holding {held} of its quota {}",
                                    KEYS[k],
                                    q.max_running
                                );
                            }
                        }
                        // Concurrency limits never exceeded.
                        if let Some((c, limit, _)) = spec.conc {
                            let running = self
                                .live
                                .keys()
                                .filter(|t| self.specs[t].conc.map(|x| x.0) == Some(c))
                                .count() as u32;
                            assert!(
                                running < limit,
                                "t{task} starts with {running} of its key running, limit {limit}"
                            );
                        }
                        assert!(self.live.insert(task.0, (attempt, group)).is_none());
                    }
                    Action::Revoke {
                        task,
                        attempt,
                        reason,
                        ..
                    } => {
                        assert_eq!(self.live.get(&task.0).map(|a| a.0), Some(attempt));
                        if reason == RevokeReason::Preempted {
                            let spec = &self.specs[&task.0];
                            assert!(spec.preemptible, "t{task} is not preemptible");
                            assert_eq!(config.preemption, Preemption::Priority);
                        }
                        self.revoked.insert((task.0, attempt), reason);
                    }
                    Action::Preempted { task, attempt } => {
                        assert_eq!(self.ended, Some((task.0, attempt)));
                        assert_eq!(
                            self.revoked.get(&(task.0, attempt)),
                            Some(&RevokeReason::Preempted),
                            "preempted without a revoke for it"
                        );
                        *self.preempted.entry(task.0).or_default() += 1;
                    }
                    Action::RetryAt { .. } => {}
                    Action::Finished {
                        task,
                        state,
                        attempts,
                        ..
                    } => {
                        let n = self.finished.entry(task.0).or_default();
                        *n += 1;
                        assert_eq!(*n, 1, "t{task} finished twice");
                        // A preempted attempt never counts toward max_attempts.
                        let retryable = matches!(
                            self.last.get(&task.0),
                            Some(AttemptOutcome::Failed { retryable: true } | AttemptOutcome::Lost)
                        );
                        if state == TaskState::Failed && retryable {
                            let counted =
                                attempts - self.preempted.get(&task.0).copied().unwrap_or(0);
                            assert_eq!(counted, self.specs[&task.0].max_attempts, "t{task}");
                        }
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Random submissions with keys, weights, limits and policies,
        /// ends, cancels and capacity changes under a random pool config:
        /// the core's invariants (rule 4 among them) after every event;
        /// quotas and limits never exceeded; preemption only of preemptible
        /// tasks, only where configured; a preempted attempt never counted.
        #[test]
        fn quotas_limits_and_preemption_hold_under_random_events(
            config in config(),
            ops in prop::collection::vec(op(), 1..120),
        ) {
            let mut core = Core::new();
            let mut model = Model::default();
            let mut now = 0u64;
            let p = pool("p");
            core.handle(Millis(0), Event::PoolConfigured { pool: p.clone(), config: config.clone() }).unwrap();
            let mut next = 1u64;
            for op in ops {
                model.ended = None;
                let event = match op {
                    Op::Submit(sub) => {
                        let id = next;
                        next += 1;
                        let mut spec = TaskSpec::new(TaskId(id), p.clone());
                        spec.required = labels(REQUIRED[sub.required]);
                        spec.priority = sub.priority;
                        spec.fairness_key = sub.key.map(|k| KEYS[k].to_string());
                        spec.fairness_weight = sub.weight;
                        if let Some((c, limit, policy)) = sub.conc {
                            spec.concurrency_key = Some(["x", "y"][c].to_string());
                            spec.concurrency_limit = limit;
                            spec.concurrency_policy = policy;
                        }
                        spec.preemptible = sub.preemptible;
                        spec.max_attempts = Some(sub.max_attempts);
                        model.specs.insert(id, sub);
                        Event::Submitted(spec)
                    }
                    Op::End { pick, outcome } => {
                        if model.live.is_empty() {
                            continue;
                        }
                        let (&task, &(attempt, _)) = model.live.iter().nth(pick % model.live.len()).unwrap();
                        model.live.remove(&task);
                        model.last.insert(task, outcome);
                        model.ended = Some((task, attempt));
                        Event::AttemptEnded { task: TaskId(task), attempt, outcome }
                    }
                    Op::Cancel { pick } => {
                        if next == 1 {
                            continue;
                        }
                        Event::CancelRequested(TaskId(1 + pick as u64 % (next - 1)))
                    }
                    Op::Capacity { group, slots } => Event::CapacitySet {
                        pool: p.clone(),
                        labels: labels(GROUPS[group]),
                        slots,
                    },
                    Op::Advance { ms } => {
                        now += ms;
                        Event::Tick
                    }
                };
                let Ok(actions) = core.handle(Millis(now), event) else {
                    continue; // a cancel of a finished or stopping task
                };
                model.apply(&core, &config, &actions);
                if let Err(broken) = core.check_invariants() {
                    panic!("invariant broken: {broken}");
                }
            }
        }

        /// Keys with random weights all backlogged on 1–3 slots: after every
        /// start, each key's service over its weight is within one task of
        /// every other's (start-time fair queuing: `|S_i/w_i - S_j/w_j| <=
        /// max(1/w_i, 1/w_j)`); with two keys, each is within one task of
        /// its weighted share.
        #[test]
        fn shares_follow_weights_within_one_task_under_contention(
            weights in prop::collection::vec(1..=6u32, 2..=4),
            slots in 1..=3u32,
            order in prop::collection::vec(any::<prop::sample::Index>(), 400),
            by_config in any::<bool>(),
        ) {
            let mut core = Core::new();
            let p = pool("p");
            if by_config {
                let fairness = weights
                    .iter()
                    .enumerate()
                    .map(|(k, &weight)| FairnessWeight { key: format!("k{k}"), weight })
                    .collect();
                core.handle(Millis(0), Event::PoolConfigured {
                    pool: p.clone(),
                    config: PoolConfig { fairness, ..PoolConfig::default() },
                }).unwrap();
            }
            core.handle(Millis(0), Event::CapacitySet { pool: p.clone(), labels: Labels::new(), slots }).unwrap();
            let mut running = Vec::new();
            let mut next = 1u64;
            // Fillers without a key take every slot, then the keys flood.
            for _ in 0..slots {
                core.handle(Millis(0), Event::Submitted(TaskSpec::new(TaskId(next), p.clone()))).unwrap();
                running.push(next);
                next += 1;
            }
            let n = weights.len();
            let mut key_of = HashMap::new();
            for pick in order {
                let k = pick.index(n);
                let mut spec = TaskSpec::new(TaskId(next), p.clone());
                spec.fairness_key = Some(format!("k{k}"));
                spec.fairness_weight = if by_config { 1 } else { weights[k] };
                key_of.insert(next, k);
                prop_assert!(core.handle(Millis(0), Event::Submitted(spec)).unwrap().is_empty());
                next += 1;
            }
            let per_key: Vec<usize> = (0..n).map(|k| key_of.values().filter(|&&x| x == k).count()).collect();
            let mut served = vec![0u32; n];
            // Serve while every key stays backlogged.
            let rounds = per_key.iter().min().copied().unwrap_or(0).min(60);
            for _ in 0..rounds {
                let task = running.remove(0);
                let actions = core.handle(Millis(0), Event::AttemptEnded {
                    task: TaskId(task), attempt: 1, outcome: AttemptOutcome::Succeeded,
                }).unwrap();
                for a in actions {
                    if let Action::Start { task, .. } = a {
                        running.push(task.0);
                        served[key_of[&task.0]] += 1;
                    }
                }
                core.check_invariants().unwrap();
                for i in 0..n {
                    for j in 0..n {
                        let (wi, wj) = (f64::from(weights[i]), f64::from(weights[j]));
                        let gap = f64::from(served[i]) / wi - f64::from(served[j]) / wj;
                        prop_assert!(
                            gap <= (1.0 / wi).max(1.0 / wj) + 1e-9,
                            "keys {i} and {j} (weights {wi}, {wj}) served {served:?}"
                        );
                    }
                }
                if n == 2 {
                    let total: u32 = served.iter().sum();
                    let w: u32 = weights.iter().sum();
                    for k in 0..n {
                        let ideal = f64::from(total) * f64::from(weights[k]) / f64::from(w);
                        prop_assert!((f64::from(served[k]) - ideal).abs() <= 1.0 + 1e-9, "{served:?}");
                    }
                }
            }
        }
    }
}

// ---- starvation (issue 36, item 6) --------------------------------------------

/// One key floods 100,000 tasks, another submits 10 behind them: the 10
/// start within the next 20 starts. Counted in starts, not time, on the
/// bare core (no invariant check per event: it would be quadratic here), so
/// the machine's speed cannot change the answer.
#[test]
fn starvation_a_flood_of_one_key_does_not_hold_back_another() {
    use cronoq::core::{Action, AttemptOutcome, Core, Millis};
    const SLOTS: u32 = 4;
    let mut core = Core::new();
    let pool = pool("p");
    core.handle(
        Millis(0),
        Event::CapacitySet {
            pool: pool.clone(),
            labels: Labels::new(),
            slots: SLOTS,
        },
    )
    .unwrap();
    let spec = |id: u64, key: &str| TaskSpec {
        fairness_key: Some(key.into()),
        ..TaskSpec::new(TaskId(id), pool.clone())
    };
    let mut running = std::collections::VecDeque::new();
    let note = |actions: Vec<Action>, running: &mut std::collections::VecDeque<(u64, u32)>| {
        let mut started = Vec::new();
        for a in actions {
            if let Action::Start { task, attempt, .. } = a {
                running.push_back((task.0, attempt));
                started.push(task.0);
            }
        }
        started
    };
    for id in 1..=100_000 {
        let actions = core
            .handle(Millis(0), Event::Submitted(spec(id, "flood")))
            .unwrap();
        note(actions, &mut running);
    }
    assert_eq!(running.len(), SLOTS as usize);
    let few: Vec<u64> = (100_001..=100_010).collect();
    for &id in &few {
        let actions = core
            .handle(Millis(1), Event::Submitted(spec(id, "few")))
            .unwrap();
        assert!(note(actions, &mut running).is_empty(), "every slot is busy");
    }
    let mut next_starts = Vec::new();
    while next_starts.len() < 20 {
        let (task, attempt) = running.pop_front().expect("something runs");
        let actions = core
            .handle(
                Millis(2),
                Event::AttemptEnded {
                    task: TaskId(task),
                    attempt,
                    outcome: AttemptOutcome::Succeeded,
                },
            )
            .unwrap();
        next_starts.extend(note(actions, &mut running));
    }
    let late: Vec<&u64> = few
        .iter()
        .filter(|id| !next_starts[..20].contains(id))
        .collect();
    assert!(
        late.is_empty(),
        "{late:?} did not start within the next 20 starts: {next_starts:?}"
    );
}

/// The snapshot lists a pool's busiest 1,000 fairness keys, then one
/// `_other` row summing the rest (so totals stay whole and /metrics stays
/// bounded).
#[test]
fn snapshot_lists_the_busiest_keys_then_the_rest_as_other() {
    use cronoq::core::{Millis, MAX_KEY_ROWS, OTHER_KEYS};
    let mut core = cronoq::core::Core::new();
    let pool = pool("p");
    core.handle(
        Millis(0),
        Event::CapacitySet {
            pool: pool.clone(),
            labels: Labels::new(),
            slots: 1,
        },
    )
    .unwrap();
    let n = MAX_KEY_ROWS as u64 + 5;
    for id in 1..=n {
        let spec = TaskSpec {
            fairness_key: Some(format!("k{id:05}")),
            ..TaskSpec::new(TaskId(id), pool.clone())
        };
        core.handle(Millis(0), Event::Submitted(spec)).unwrap();
    }
    let snap = core.snapshot();
    let keys = &snap.pools[0].fairness_keys;
    assert_eq!(keys.len(), MAX_KEY_ROWS + 1);
    assert!(snap.truncated);
    let other = keys.last().unwrap();
    assert_eq!(other.key, OTHER_KEYS);
    let total: u64 = keys.iter().map(|k| k.running + k.waiting).sum();
    assert_eq!(total, n);
    assert_eq!(other.running + other.waiting, 5);
}

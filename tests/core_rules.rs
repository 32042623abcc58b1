//! The placement rules of SPEC §2, one or more named tests per rule, plus
//! capacity changes, stale reports, wait reasons and bad input — all through
//! the `Sim` harness in `tests/common`, which checks the core's invariants
//! (rule 4 among them) after every accepted event.
//!
//! Times are plain milliseconds from 0; pool `p` unless a test says so.

mod common;

use common::*;
use cronoq::core::{
    ErrorCode, Event, Labels, Millis, PoolConfig, PoolName, Rejection, TaskId, TaskSpec,
};

// ---- rule 1: match ----------------------------------------------------------

#[test]
fn rule1_match_requires_superset() {
    let mut s = Sim::new();
    s.capacity("p", "gpu=a100", 1);
    s.capacity("p", "gpu=h100,zone=eu", 1);

    // Nobody carries both gpu=a100 and zone=eu.
    assert_eq!(s.submit(task(1).labels("gpu=a100,zone=eu")), NOTHING);
    assert_eq!(s.state(1), "queued/no_group_matches");
    // A group may carry more labels than required.
    assert_eq!(
        s.submit(task(2).labels("zone=eu")),
        ["start t2#1 {gpu=h100,zone=eu}"]
    );
    assert_eq!(
        s.submit(task(3).labels("gpu=a100")),
        ["start t3#1 {gpu=a100}"]
    );
    // Same name, other value: no match.
    assert_eq!(s.submit(task(4).labels("gpu=v100")), NOTHING);
    assert_eq!(s.state(4), "queued/no_group_matches");
    assert_eq!(s.submit(task(5).labels("gpu=h100")), NOTHING);
    assert_eq!(s.state(5), "queued/groups_full");
    assert_eq!(
        s.end(2, OK),
        [
            "finish t2 succeeded attempts=1",
            "start t5#1 {gpu=h100,zone=eu}"
        ]
    );
}

#[test]
fn rule1_unlabeled_task_matches_every_group() {
    let mut s = Sim::new();
    s.capacity("p", "gpu=a100,zone=eu", 1);
    assert_eq!(s.submit(task(1)), ["start t1#1 {gpu=a100,zone=eu}"]);
}

#[test]
fn rule1_pools_do_not_share_groups() {
    let mut s = Sim::new();
    s.capacity("q", "", 5);
    assert_eq!(s.submit(task(1).pool("p")), NOTHING);
    assert_eq!(s.state(1), "queued/no_group_matches");
    assert_eq!(s.submit(task(2).pool("q")), ["start t2#1 {}"]);
    assert_eq!(s.capacity("p", "", 1), ["start t1#1 {}"]);
}

// ---- rule 2: least specialized first ------------------------------------------

#[test]
fn rule2_unlabeled_prefers_least_specialized() {
    let mut s = Sim::new();
    s.capacity("p", "disk=ssd,zone=eu", 5);
    s.capacity("p", "gpu=a100", 1);
    s.capacity("p", "", 1);
    // Fewest labels wins over most free slots.
    assert_eq!(s.submit(task(1)), ["start t1#1 {}"]);
    assert_eq!(s.submit(task(2)), ["start t2#1 {gpu=a100}"]);
    assert_eq!(s.submit(task(3)), ["start t3#1 {disk=ssd,zone=eu}"]);
}

#[test]
fn rule2_labeled_task_prefers_least_specialized_matching_group() {
    let mut s = Sim::new();
    s.capacity("p", "gpu=a100,zone=eu", 3);
    s.capacity("p", "gpu=a100", 1);
    s.capacity("p", "", 4);
    assert_eq!(
        s.submit(task(1).labels("gpu=a100")),
        ["start t1#1 {gpu=a100}"]
    );
    assert_eq!(
        s.submit(task(2).labels("gpu=a100")),
        ["start t2#1 {gpu=a100,zone=eu}"]
    );
}

#[test]
fn rule2_tie_break_most_free_then_oldest() {
    let mut s = Sim::new();
    s.capacity("p", "zone=eu", 1);
    s.capacity("p", "zone=us", 3);
    // Same label count: most free slots.
    assert_eq!(s.submit(task(1)), ["start t1#1 {zone=us}"]);
    assert_eq!(s.submit(task(2)), ["start t2#1 {zone=us}"]);
    // One free slot each: the group that appeared first.
    assert_eq!(s.submit(task(3)), ["start t3#1 {zone=eu}"]);
    assert_eq!(s.submit(task(4)), ["start t4#1 {zone=us}"]);
    assert_eq!(s.submit(task(5)), NOTHING);
}

// ---- rule 3: no head-of-line blocking -------------------------------------------

#[test]
fn rule3_no_head_of_line_blocking() {
    let mut s = Sim::new();
    s.capacity("p", "gpu=a100", 1);
    s.capacity("p", "", 1);
    assert_eq!(
        s.submit(task(1).labels("gpu=a100")),
        ["start t1#1 {gpu=a100}"]
    );
    // t2 waits for the busy GPU group and holds nothing...
    assert_eq!(s.submit(task(2).labels("gpu=a100")), NOTHING);
    assert_eq!(s.state(2), "queued/groups_full");
    assert_eq!(s.groups("p"), ["{} 0/1", "{gpu=a100} 1/1"]);
    // ...so a later task that matches a free slot runs at once.
    assert_eq!(s.submit(task(3)), ["start t3#1 {}"]);
    assert_eq!(s.submit(task(4).labels("zone=eu")), NOTHING);
    assert_eq!(s.capacity("p", "zone=eu", 1), ["start t4#1 {zone=eu}"]);
}

// ---- rule 5: order among waiters ----------------------------------------------------

#[test]
fn rule5a_priority_then_urgency_by_deadline() {
    let mut s = Sim::new();
    s.configure("p", |c| c.urgency_window = Millis(1_000));
    s.capacity("p", "", 1);
    s.submit(task(1));
    for t in [
        task(2),
        task(3).priority(5),
        task(4).priority(-1).deadline(10_000),
        task(5).priority(-2).deadline(9_500),
        task(6),
    ] {
        assert_eq!(s.submit(t), NOTHING);
    }
    // Nobody urgent yet: higher priority first.
    assert_eq!(
        s.end(1, OK),
        ["finish t1 succeeded attempts=1", "start t3#1 {}"]
    );
    assert!(!s.view(4).unwrap().urgent);
    // Within the urgency window both deadline tasks pass everyone,
    // earliest deadline first, whatever their priority.
    assert_eq!(s.at(9_000), NOTHING);
    assert!(s.view(4).unwrap().urgent && s.view(5).unwrap().urgent);
    assert_eq!(
        s.end(3, OK),
        ["finish t3 succeeded attempts=1", "start t5#1 {}"]
    );
    assert_eq!(
        s.end(5, OK),
        ["finish t5 succeeded attempts=1", "start t4#1 {}"]
    );
    assert_eq!(
        s.end(4, OK),
        ["finish t4 succeeded attempts=1", "start t2#1 {}"]
    );
    assert_eq!(
        s.end(2, OK),
        ["finish t2 succeeded attempts=1", "start t6#1 {}"]
    );
}

#[test]
fn rule5a_urgent_unlabeled_passes_labeled_waiter() {
    let mut s = Sim::new();
    s.configure("p", |c| c.urgency_window = Millis(100));
    s.capacity("p", "gpu=a100", 1);
    s.submit(task(1));
    s.submit(task(2).labels("gpu=a100"));
    s.submit(task(3).deadline(1_000));
    s.at(950);
    // Urgency comes before need.
    assert_eq!(
        s.end(1, OK),
        ["finish t1 succeeded attempts=1", "start t3#1 {gpu=a100}"]
    );
}

#[test]
fn rule5a_urgent_task_is_urgent_when_submitted_inside_window() {
    let mut s = Sim::new();
    s.configure("p", |c| c.urgency_window = Millis(1_000));
    s.capacity("p", "", 1);
    s.submit(task(1));
    s.submit(task(2).priority(10));
    s.at(500);
    s.submit(task(3).deadline(1_200));
    assert!(s.view(3).unwrap().urgent);
    assert_eq!(
        s.end(1, OK),
        ["finish t1 succeeded attempts=1", "start t3#1 {}"]
    );
}

#[test]
fn rule5b_labeled_waiter_gets_freed_gpu_slot() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    s.capacity("p", "gpu=a100", 1);
    assert_eq!(s.submit(task(1)), ["start t1#1 {}"]);
    // With {} full, CPU work may borrow the GPU slot...
    assert_eq!(s.submit(task(2)), ["start t2#1 {gpu=a100}"]);
    assert_eq!(s.submit(task(3)), NOTHING);
    assert_eq!(s.submit(task(4).labels("gpu=a100")), NOTHING);
    // ...but once freed it goes to the GPU waiter, though t3 is older.
    assert_eq!(
        s.end(2, OK),
        ["finish t2 succeeded attempts=1", "start t4#1 {gpu=a100}"]
    );
    assert_eq!(
        s.end(1, OK),
        ["finish t1 succeeded attempts=1", "start t3#1 {}"]
    );
}

#[test]
fn rule5b_need_ranks_below_priority() {
    let mut s = Sim::new();
    s.capacity("p", "gpu=a100", 1);
    s.submit(task(1));
    s.submit(task(2).labels("gpu=a100"));
    s.submit(task(3).priority(1));
    assert_eq!(
        s.end(1, OK),
        ["finish t1 succeeded attempts=1", "start t3#1 {gpu=a100}"]
    );
}

#[test]
fn rule5_no_starvation_after_max_bypass() {
    let mut s = Sim::new();
    s.configure("p", |c| c.max_bypass = 2);
    s.capacity("p", "gpu=a100", 1);
    s.submit(task(1).labels("gpu=a100"));
    s.submit(task(2));
    for id in 3..=6 {
        s.submit(task(id).labels("gpu=a100"));
    }
    // t2 is passed over by need three times (more than max_bypass = 2)...
    assert_eq!(
        s.end(1, OK),
        ["finish t1 succeeded attempts=1", "start t3#1 {gpu=a100}"]
    );
    assert_eq!(
        s.end(3, OK),
        ["finish t3 succeeded attempts=1", "start t4#1 {gpu=a100}"]
    );
    assert_eq!(
        s.end(4, OK),
        ["finish t4 succeeded attempts=1", "start t5#1 {gpu=a100}"]
    );
    // ...then takes the next slot it matches.
    assert_eq!(
        s.end(5, OK),
        ["finish t5 succeeded attempts=1", "start t2#1 {gpu=a100}"]
    );
    assert_eq!(
        s.end(2, OK),
        ["finish t2 succeeded attempts=1", "start t6#1 {gpu=a100}"]
    );
}

#[test]
fn rule5_bypass_by_a_newer_task_only_counts() {
    // A labeled task submitted *before* the unlabeled one wins on submission
    // order anyway: that is not a bypass.
    let mut s = Sim::new();
    s.configure("p", |c| c.max_bypass = 0);
    s.capacity("p", "gpu=a100", 1);
    s.submit(task(1).labels("gpu=a100"));
    s.submit(task(2).labels("gpu=a100"));
    s.submit(task(3));
    s.submit(task(4).labels("gpu=a100"));
    assert_eq!(
        s.end(1, OK),
        ["finish t1 succeeded attempts=1", "start t2#1 {gpu=a100}"]
    );
    // t3 not yet bypassed: t4 (newer, labeled) wins by need, bypass = 1.
    assert_eq!(
        s.end(2, OK),
        ["finish t2 succeeded attempts=1", "start t4#1 {gpu=a100}"]
    );
    s.submit(task(5).labels("gpu=a100"));
    // 1 > max_bypass = 0: t3 goes first now.
    assert_eq!(
        s.end(4, OK),
        ["finish t4 succeeded attempts=1", "start t3#1 {gpu=a100}"]
    );
}

#[test]
fn rule5c_submission_order() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    s.submit(task(1));
    for id in [7, 3, 5] {
        s.submit(task(id));
    }
    // Ids mean nothing: submission order does.
    assert_eq!(
        s.end(1, OK),
        ["finish t1 succeeded attempts=1", "start t7#1 {}"]
    );
    assert_eq!(
        s.end(7, OK),
        ["finish t7 succeeded attempts=1", "start t3#1 {}"]
    );
    assert_eq!(
        s.end(3, OK),
        ["finish t3 succeeded attempts=1", "start t5#1 {}"]
    );
}

#[test]
fn rule5c_submission_order_across_label_sets_of_equal_need() {
    let mut s = Sim::new();
    s.capacity("p", "gpu=a100,zone=eu", 1);
    s.submit(task(1));
    s.submit(task(2).labels("zone=eu"));
    s.submit(task(3).labels("gpu=a100"));
    s.submit(task(4).labels("gpu=a100,zone=eu"));
    assert_eq!(
        s.end(1, OK),
        [
            "finish t1 succeeded attempts=1",
            "start t2#1 {gpu=a100,zone=eu}"
        ]
    );
    assert_eq!(
        s.end(2, OK),
        [
            "finish t2 succeeded attempts=1",
            "start t3#1 {gpu=a100,zone=eu}"
        ]
    );
    assert_eq!(
        s.end(3, OK),
        [
            "finish t3 succeeded attempts=1",
            "start t4#1 {gpu=a100,zone=eu}"
        ]
    );
}

#[test]
fn rule5_deadline_never_cancels_and_counts_deadline_missed() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    assert_eq!(s.submit(task(1).deadline(2_000)), ["start t1#1 {}"]);
    assert_eq!(s.submit(task(2).deadline(1_000)), NOTHING);
    // Deadlines pass: nobody is revoked, nobody is dropped.
    assert_eq!(s.at(5_000), NOTHING);
    assert_eq!(s.state(1), "running");
    assert_eq!(s.state(2), "queued/groups_full");
    assert_eq!(
        s.end(1, OK),
        [
            "finish t1 succeeded attempts=1 deadline_missed",
            "start t2#1 {}"
        ]
    );
    assert_eq!(
        s.end(2, FATAL),
        ["finish t2 failed attempts=1 deadline_missed"]
    );
    // In time: not counted.
    assert_eq!(s.submit(task(3).deadline(9_000)), ["start t3#1 {}"]);
    assert_eq!(s.end(3, OK), ["finish t3 succeeded attempts=1"]);
    assert_eq!(s.snapshot().pools[0].deadline_missed, 2);
}

// ---- rule 6: labels nobody has --------------------------------------------------------

#[test]
fn rule6_waits_for_labels_nobody_has_until_capacity_appears() {
    let mut s = Sim::new();
    s.capacity("p", "", 2);
    s.capacity("p", "gpu=h100", 0);
    assert_eq!(s.submit(task(1).labels("gpu=h100")), NOTHING);
    assert_eq!(s.state(1), "queued/no_group_matches");
    // An hour later it still waits: never dropped.
    assert_eq!(s.advance(3_600_000), NOTHING);
    assert_eq!(s.state(1), "queued/no_group_matches");
    assert_eq!(s.core.next_wakeup(), None);
    assert_eq!(
        s.capacity("p", "gpu=h100,zone=eu", 1),
        ["start t1#1 {gpu=h100,zone=eu}"]
    );
}

#[test]
fn rule6_cancel_is_the_only_way_out() {
    let mut s = Sim::new();
    s.submit(task(1).labels("gpu=h100"));
    s.advance(1_000_000);
    assert_eq!(s.cancel(1), ["finish t1 cancelled attempts=0"]);
    assert_eq!(s.state(1), "gone");
}

// ---- rule 7: fixed-start reservations ------------------------------------------------------

#[test]
fn rule7_reservation_holds_slot_per_pool() {
    let mut s = Sim::new();
    s.configure("p", |c| c.reservation_lead = Millis(1_000));
    s.capacity("p", "", 2);
    assert_eq!(s.submit(task(1).start_at(5_000, 1_000)), NOTHING);
    assert_eq!(s.state(1), "scheduled/scheduled");
    assert_eq!(s.snapshot().pools[0].scheduled, 1);
    assert_eq!(s.snapshot().pools[0].reserved, 0);
    // Not due yet: nothing held.
    assert_eq!(s.submit(task(2)), ["start t2#1 {}"]);
    assert_eq!(s.end(2, OK), ["finish t2 succeeded attempts=1"]);
    assert_eq!(s.at(4_000), NOTHING);
    assert_eq!(s.snapshot().pools[0].reserved, 1);
    // Two free, one held: one other task may run, the next may not.
    assert_eq!(s.submit(task(3)), ["start t3#1 {}"]);
    assert_eq!(s.submit(task(4)), NOTHING);
    assert_eq!(s.state(4), "queued/held_for_reservation");
    assert_eq!(s.at(5_000), ["start t1#1 {}"]);
    assert_eq!(s.state(4), "queued/groups_full");
    assert_eq!(s.snapshot().pools[0].reserved, 0);
    assert_eq!(
        s.end(3, OK),
        ["finish t3 succeeded attempts=1", "start t4#1 {}"]
    );
}

#[test]
fn rule7_freed_slot_is_held_while_free_slots_do_not_exceed_reservations() {
    let mut s = Sim::new();
    s.configure("p", |c| c.reservation_lead = Millis(1_000));
    s.capacity("p", "", 1);
    s.submit(task(1));
    s.submit(task(2).start_at(5_000, 1_000));
    s.submit(task(3));
    s.at(4_000);
    // The slot frees after the reservation is due: t3 may not take it.
    assert_eq!(s.end(1, OK), ["finish t1 succeeded attempts=1"]);
    assert_eq!(s.state(3), "queued/held_for_reservation");
    assert_eq!(s.at(5_000), ["start t2#1 {}"]);
    assert_eq!(
        s.end(2, OK),
        ["finish t2 succeeded attempts=1", "start t3#1 {}"]
    );
}

#[test]
fn rule7_reservation_counts_per_pool_not_per_group() {
    let mut s = Sim::new();
    s.configure("p", |c| c.reservation_lead = Millis(1_000));
    s.capacity("p", "", 1);
    s.capacity("p", "gpu=a100", 1);
    assert_eq!(
        s.submit(task(1).labels("gpu=a100")),
        ["start t1#1 {gpu=a100}"]
    );
    assert_eq!(
        s.submit(task(2).labels("gpu=a100").start_at(5_000, 10_000)),
        NOTHING
    );
    assert_eq!(s.at(4_000), NOTHING);
    // The pool holds one slot, and its only free slot is {}: held, though
    // the reservation could never use it.
    assert_eq!(s.submit(task(3)), NOTHING);
    assert_eq!(s.state(3), "queued/held_for_reservation");
    // At start_at t2 needs a slot *matching its labels*: it waits.
    assert_eq!(s.at(5_000), NOTHING);
    assert_eq!(s.state(2), "queued/groups_full");
    // The GPU slot frees: t2 takes it, the reservation is spent, and the
    // {} slot is no longer held.
    assert_eq!(
        s.end(1, OK),
        [
            "finish t1 succeeded attempts=1",
            "start t2#1 {gpu=a100}",
            "start t3#1 {}"
        ]
    );
}

#[test]
fn rule7_reservation_starts_on_capacity_that_appears_late() {
    let mut s = Sim::new();
    s.configure("p", |c| c.reservation_lead = Millis(1_000));
    s.submit(task(1).start_at(5_000, 1_000));
    assert_eq!(s.at(5_500), NOTHING);
    assert_eq!(s.state(1), "queued/no_group_matches");
    assert_eq!(s.capacity("p", "", 1), ["start t1#1 {}"]);
}

#[test]
fn rule7_backfill_with_est_runtime() {
    let mut s = Sim::new();
    s.configure("p", |c| c.reservation_lead = Millis(1_000));
    s.capacity("p", "", 1);
    s.submit(task(1).start_at(5_000, 1_000));
    s.at(4_000);
    // Ends by 4_500 <= 5_000: may use the held slot.
    assert_eq!(s.submit(task(2).est(500)), ["start t2#1 {}"]);
    s.at(4_500);
    assert_eq!(s.end(2, OK), ["finish t2 succeeded attempts=1"]);
    // Would end at 5_300, past start_at; and no estimate at all: held.
    assert_eq!(s.submit(task(3).est(800)), NOTHING);
    assert_eq!(s.submit(task(4)), NOTHING);
    assert_eq!(s.state(3), "queued/held_for_reservation");
    assert_eq!(s.state(4), "queued/held_for_reservation");
    // A shorter one submitted later still backfills.
    assert_eq!(s.submit(task(5).est(100)), ["start t5#1 {}"]);
    assert_eq!(s.end(5, OK), ["finish t5 succeeded attempts=1"]);
    assert_eq!(s.at(5_000), ["start t1#1 {}"]);
}

#[test]
fn rule7_backfill_waiter_takes_freed_held_slot() {
    let mut s = Sim::new();
    s.configure("p", |c| c.reservation_lead = Millis(1_000));
    s.capacity("p", "", 1);
    s.submit(task(1));
    s.submit(task(2).start_at(5_000, 1_000));
    s.at(4_000);
    s.submit(task(3));
    s.submit(task(4).est(300));
    assert_eq!(
        s.end(1, OK),
        ["finish t1 succeeded attempts=1", "start t4#1 {}"]
    );
}

#[test]
fn rule7_missed_skip() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    s.submit(task(1));
    assert_eq!(s.submit(task(2).start_at(1_000, 500)), NOTHING);
    assert_eq!(s.at(1_000), NOTHING);
    assert_eq!(s.state(2), "queued/groups_full");
    assert_eq!(s.at(1_499), NOTHING);
    assert_eq!(s.at(1_500), ["finish t2 missed attempts=0"]);
    assert_eq!(s.state(2), "gone");
    assert_eq!(s.end(1, OK), ["finish t1 succeeded attempts=1"]);
}

#[test]
fn rule7_missed_skip_when_submitted_too_late() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    s.at(2_000);
    assert_eq!(
        s.submit(task(1).start_at(1_000, 500)),
        ["finish t1 missed attempts=0"]
    );
    // Within tolerance: starts at once.
    assert_eq!(s.submit(task(2).start_at(1_000, 1_000)), ["start t2#1 {}"]);
}

#[test]
fn rule7_missed_run() {
    let mut s = Sim::new();
    s.configure("p", |c| c.on_miss = on_miss("run"));
    s.capacity("p", "", 1);
    s.submit(task(1));
    s.submit(task(3));
    s.submit(task(2).start_at(1_000, 500));
    assert_eq!(s.at(1_500), NOTHING);
    // Now an ordinary waiter, after t3 in submission order.
    assert_eq!(s.state(2), "queued/groups_full");
    assert_eq!(s.snapshot().pools[0].reserved, 0);
    assert_eq!(
        s.end(1, OK),
        ["finish t1 succeeded attempts=1", "start t3#1 {}"]
    );
    assert_eq!(
        s.end(3, OK),
        ["finish t3 succeeded attempts=1", "start t2#1 {}"]
    );
}

#[test]
fn rule7_ready_fixed_start_takes_freed_slot_before_other_waiters() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    s.submit(task(1));
    s.submit(task(2).priority(100));
    s.submit(task(3).start_at(1_000, 5_000));
    s.at(1_000);
    assert_eq!(
        s.end(1, OK),
        ["finish t1 succeeded attempts=1", "start t3#1 {}"]
    );
}

// ---- rule 8: attempts --------------------------------------------------------------------

#[test]
fn rule8_retry_with_backoff_placed_afresh_in_other_group() {
    let mut s = Sim::new();
    s.capacity("p", "gpu=a100", 1);
    s.capacity("p", "gpu=a100,zone=eu", 1);
    assert_eq!(
        s.submit(task(1).labels("gpu=a100").backoff(100, 1_000)),
        ["start t1#1 {gpu=a100}"]
    );
    assert_eq!(
        s.submit(task(2).labels("gpu=a100")),
        ["start t2#1 {gpu=a100,zone=eu}"]
    );
    s.submit(task(3).labels("gpu=a100"));
    // The failed attempt's slot goes to t3 while t1 waits out its backoff.
    assert_eq!(s.end(1, FAIL), ["retry t1#2 @100", "start t3#1 {gpu=a100}"]);
    assert_eq!(s.state(1), "queued/backoff");
    assert_eq!(s.core.next_wakeup(), Some(Millis(100)));
    assert_eq!(s.end(2, OK), ["finish t2 succeeded attempts=1"]);
    assert_eq!(s.advance(99), NOTHING);
    assert_eq!(s.advance(1), ["start t1#2 {gpu=a100,zone=eu}"]);
    assert_eq!(
        s.view(1).unwrap().group,
        Some(Labels::from([("gpu", "a100"), ("zone", "eu")]))
    );
    assert_eq!(s.end(1, OK), ["finish t1 succeeded attempts=2"]);
}

#[test]
fn rule8_backoff_doubles_up_to_its_max() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    s.submit(task(1).backoff(100, 250).max_attempts(4));
    assert_eq!(s.end(1, FAIL), ["retry t1#2 @100"]);
    assert_eq!(s.at(100), ["start t1#2 {}"]);
    assert_eq!(s.end(1, LOST), ["retry t1#3 @300"]);
    assert_eq!(s.at(300), ["start t1#3 {}"]);
    assert_eq!(s.end(1, FAIL), ["retry t1#4 @550"]);
}

#[test]
fn rule8_max_attempts_then_failed() {
    let mut s = Sim::new();
    s.capacity("p", "", 2);
    s.submit(task(1).max_attempts(2).backoff(10, 10));
    assert_eq!(s.end(1, FAIL), ["retry t1#2 @10"]);
    assert_eq!(s.advance(10), ["start t1#2 {}"]);
    assert_eq!(s.end(1, LOST), ["finish t1 failed attempts=2"]);
    // A failure that is not retryable ends the task at once.
    s.submit(task(2).max_attempts(5));
    assert_eq!(s.end(2, FATAL), ["finish t2 failed attempts=1"]);
    // The pool's default applies when the task names none.
    s.configure("p", |c| c.max_attempts = 1);
    s.submit(task(3));
    assert_eq!(s.end(3, FAIL), ["finish t3 failed attempts=1"]);
}

#[test]
fn rule8_attempt_timeout_revokes_and_counts_lost() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    s.submit(task(1).timeout(500).backoff(100, 100).max_attempts(2));
    s.submit(task(2));
    assert_eq!(s.advance(499), NOTHING);
    assert_eq!(s.advance(1), ["revoke t1#1 {} timeout"]);
    // Revoked, but the slot stays busy until the attempt reports.
    assert_eq!(s.state(1), "running");
    assert_eq!(s.groups("p"), ["{} 1/1"]);
    // However it ends, it counts as lost: a retry.
    assert_eq!(s.end(1, STOPPED), ["retry t1#2 @600", "start t2#1 {}"]);
    assert_eq!(s.end(2, OK), ["finish t2 succeeded attempts=1"]);
    assert_eq!(s.at(600), ["start t1#2 {}"]);
    assert_eq!(s.at(1_100), ["revoke t1#2 {} timeout"]);
    assert_eq!(s.end(1, FAIL), ["finish t1 failed attempts=2"]);
}

#[test]
fn rule8_attempt_that_succeeds_after_timeout_revoke_still_succeeds() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    s.submit(task(1).timeout(500));
    assert_eq!(s.at(500), ["revoke t1#1 {} timeout"]);
    assert_eq!(s.end(1, OK), ["finish t1 succeeded attempts=1"]);
}

#[test]
fn rule8_attempt_ending_in_time_cancels_its_timeout() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    s.submit(task(1).timeout(500).backoff(1_000, 1_000));
    assert_eq!(s.core.next_wakeup(), Some(Millis(500)));
    assert_eq!(s.end(1, FAIL), ["retry t1#2 @1000"]);
    assert_eq!(s.at(1_000), ["start t1#2 {}"]);
    assert_eq!(s.core.next_wakeup(), Some(Millis(1_500)));
    assert_eq!(s.end(1, OK), ["finish t1 succeeded attempts=2"]);
    assert_eq!(s.at(10_000), NOTHING);
}

// ---- rule 9: cancel ---------------------------------------------------------------------------

#[test]
fn rule9_cancel_waiting_and_running() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    s.submit(task(1));
    s.submit(task(2));
    assert_eq!(s.cancel(2), ["finish t2 cancelled attempts=0"]);
    assert_eq!(s.state(2), "gone");
    assert_eq!(
        s.cancel(1),
        ["revoke t1#1 {} cancelled", "finish t1 cancelled attempts=1"]
    );
    // The attempt still holds its slot until it reports.
    assert_eq!(s.state(1), "cancelled");
    assert_eq!(s.groups("p"), ["{} 1/1"]);
    assert_eq!(s.submit(task(3)), NOTHING);
    let again = s.try_step(Event::CancelRequested(TaskId(1))).unwrap_err();
    assert_eq!(again.code(), ErrorCode::FAILED_PRECONDITION);
    // Its report frees the slot and finishes nothing a second time.
    assert_eq!(s.end(1, STOPPED), ["start t3#1 {}"]);
    assert_eq!(s.state(1), "gone");
}

#[test]
fn rule9_cancelled_attempt_that_succeeds_anyway_stays_cancelled() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    s.submit(task(1));
    s.cancel(1);
    assert_eq!(s.end(1, OK), NOTHING);
    assert_eq!(s.groups("p"), ["{} 0/1"]);
}

#[test]
fn rule9_cancel_scheduled_reserved_and_backoff() {
    let mut s = Sim::new();
    s.configure("p", |c| c.reservation_lead = Millis(1_000));
    s.capacity("p", "", 1);
    s.submit(task(1).start_at(10_000, 0));
    assert_eq!(s.cancel(1), ["finish t1 cancelled attempts=0"]);
    s.submit(task(2).backoff(500, 500));
    assert_eq!(s.end(2, FAIL), ["retry t2#2 @500"]);
    assert_eq!(s.cancel(2), ["finish t2 cancelled attempts=1"]);
    assert_eq!(s.at(500), NOTHING);
    // A due reservation: cancelling it frees the held slot at once.
    s.submit(task(3).start_at(5_000, 0));
    s.at(4_500);
    s.submit(task(4));
    assert_eq!(s.state(4), "queued/held_for_reservation");
    assert_eq!(
        s.cancel(3),
        ["finish t3 cancelled attempts=0", "start t4#1 {}"]
    );
    assert_eq!(s.core.next_wakeup(), None);
}

#[test]
fn rule9_cancel_unknown_task_is_not_found() {
    let mut s = Sim::new();
    let e = s.try_step(Event::CancelRequested(TaskId(9))).unwrap_err();
    assert_eq!(e, Rejection::UnknownTask(TaskId(9)));
    assert_eq!(e.code(), ErrorCode::NOT_FOUND);
}

// ---- rule 10: autoscaling signal -------------------------------------------------------------

#[test]
fn rule10_autoscale_desired_and_demand_per_label_set() {
    let mut s = Sim::new();
    s.configure("p", |c| {
        c.autoscale_min = 1;
        c.autoscale_max = 10;
    });
    s.capacity("p", "", 1);
    s.capacity("p", "gpu=a100", 1);
    s.submit(task(1));
    s.submit(task(2).labels("gpu=a100"));
    s.submit(task(3).labels("gpu=a100"));
    s.submit(task(4).labels("gpu=a100"));
    s.submit(task(5));
    s.submit(task(6).labels("gpu=h100"));
    let pool = &s.snapshot().pools[0];
    assert_eq!((pool.busy, pool.waiting), (2, 4));
    assert_eq!(pool.autoscale.desired, 6);
    let demand: Vec<String> = pool
        .demand
        .iter()
        .map(|d| format!("{{{}}} {}", d.labels, d.waiting))
        .collect();
    assert_eq!(demand, ["{} 1", "{gpu=a100} 2", "{gpu=h100} 1"]);

    // A due reservation counts too (lead defaults to 30s).
    s.submit(task(7).start_at(20_000, 0));
    let pool = &s.snapshot().pools[0];
    assert_eq!((pool.reserved, pool.scheduled), (1, 1));
    assert_eq!(pool.autoscale.desired, 7);

    // Clamped to [min, max].
    s.configure("p", |c| c.autoscale_max = 5);
    assert_eq!(s.snapshot().pools[0].autoscale.desired, 5);
    s.configure("q", |c| c.autoscale_min = 2);
    let q = &s.snapshot().pools[1];
    assert_eq!((q.name.as_str(), q.autoscale.desired), ("q", 2));
}

#[test]
fn rule10_ready_fixed_start_counts_once() {
    let mut s = Sim::new();
    s.submit(task(1).start_at(1_000, 10_000).labels("gpu=a100"));
    assert_eq!(s.snapshot().pools[0].autoscale.desired, 1);
    s.at(1_000);
    let pool = &s.snapshot().pools[0];
    assert_eq!((pool.waiting, pool.reserved, pool.scheduled), (1, 1, 0));
    assert_eq!(pool.autoscale.desired, 1);
    assert_eq!(pool.demand.len(), 1);
    assert_eq!(pool.demand[0].labels.to_string(), "gpu=a100");
}

// ---- capacity changes ---------------------------------------------------------------------

#[test]
fn capacity_shrinking_below_busy_lets_running_attempts_finish() {
    let mut s = Sim::new();
    s.capacity("p", "", 3);
    for id in 1..=3 {
        s.submit(task(id));
    }
    assert_eq!(s.capacity("p", "", 1), NOTHING);
    assert_eq!(s.groups("p"), ["{} 3/1"]);
    assert_eq!(s.submit(task(4)), NOTHING);
    assert_eq!(s.state(4), "queued/groups_full");
    // No new start until busy < capacity.
    assert_eq!(s.end(1, OK), ["finish t1 succeeded attempts=1"]);
    assert_eq!(s.end(2, OK), ["finish t2 succeeded attempts=1"]);
    assert_eq!(s.groups("p"), ["{} 1/1"]);
    assert_eq!(
        s.end(3, OK),
        ["finish t3 succeeded attempts=1", "start t4#1 {}"]
    );
}

#[test]
fn capacity_zero_drops_idle_group_from_snapshot() {
    let mut s = Sim::new();
    s.capacity("p", "gpu=a100", 1);
    s.submit(task(1).labels("gpu=a100"));
    s.capacity("p", "gpu=a100", 0);
    assert_eq!(s.groups("p"), ["{gpu=a100} 1/0"]);
    s.submit(task(2).labels("gpu=a100"));
    assert_eq!(s.end(1, OK), ["finish t1 succeeded attempts=1"]);
    assert_eq!(s.groups("p"), NOTHING);
    assert_eq!(s.state(2), "queued/no_group_matches");
}

#[test]
fn capacity_growth_fills_waiters_in_order() {
    let mut s = Sim::new();
    for id in 1..=3 {
        s.submit(task(id));
    }
    assert_eq!(s.capacity("p", "", 2), ["start t1#1 {}", "start t2#1 {}"]);
    assert_eq!(s.capacity("p", "", 5), ["start t3#1 {}"]);
}

// ---- stale reports --------------------------------------------------------------------------

#[test]
fn stale_attempt_outcome_is_failed_precondition() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    s.submit(task(1).backoff(100, 100));
    s.end(1, FAIL);
    // Attempt 1 already ended; attempt 2 is not started yet.
    for attempt in [1, 2] {
        let e = s.end_attempt(1, attempt, OK).unwrap_err();
        assert_eq!(
            e,
            Rejection::StaleAttempt {
                task: TaskId(1),
                attempt
            }
        );
        assert_eq!(e.code(), ErrorCode::FAILED_PRECONDITION);
    }
    s.at(100);
    for attempt in [1, 3] {
        let e = s.end_attempt(1, attempt, OK).unwrap_err();
        assert_eq!(e.code(), ErrorCode::FAILED_PRECONDITION);
    }
    assert_eq!(s.state(1), "running");
    assert_eq!(
        s.end_attempt(1, 2, OK).unwrap(),
        ["finish t1 succeeded attempts=2"]
    );
    // Once finished the core has forgotten the task.
    let e = s.end_attempt(1, 2, OK).unwrap_err();
    assert_eq!(e.code(), ErrorCode::NOT_FOUND);
    let e = s
        .try_step(Event::AttemptStarted {
            task: TaskId(1),
            attempt: 2,
        })
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::NOT_FOUND);
}

#[test]
fn stale_report_at_a_timer_instant_loses_no_action() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    s.submit(task(1).backoff(100, 100));
    s.end(1, FAIL);
    s.now = 100;
    // The retry is due at this very instant; the stale report is refused
    // and must not swallow the start of attempt 2.
    let e = s.end_attempt(1, 1, OK).unwrap_err();
    assert_eq!(e.code(), ErrorCode::FAILED_PRECONDITION);
    assert_eq!(s.advance(0), ["start t1#2 {}"]);
}

#[test]
fn cancel_at_the_instant_a_fixed_start_is_missed() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    s.submit(task(1));
    s.submit(task(2).start_at(1_000, 0));
    s.now = 1_000;
    // The miss fires first; the cancel then has nothing left to do.
    assert_eq!(s.cancel(2), ["finish t2 missed attempts=0"]);
    assert_eq!(s.state(2), "gone");
}

#[test]
fn attempt_started_acknowledgement_changes_nothing() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    s.submit(task(1));
    let ack = Event::AttemptStarted {
        task: TaskId(1),
        attempt: 1,
    };
    assert_eq!(s.step(ack), NOTHING);
    let stale = Event::AttemptStarted {
        task: TaskId(1),
        attempt: 2,
    };
    assert_eq!(
        s.try_step(stale).unwrap_err().code(),
        ErrorCode::FAILED_PRECONDITION
    );
}

// ---- wait reasons ---------------------------------------------------------------------------

#[test]
fn task_view_wait_reasons() {
    let mut s = Sim::new();
    s.configure("p", |c| c.reservation_lead = Millis(1_000));
    s.capacity("p", "", 1);
    s.capacity("p", "gpu=a100", 1);
    s.submit(task(1).labels("gpu=h100"));
    assert_eq!(s.state(1), "queued/no_group_matches");
    s.submit(task(2).labels("gpu=a100").backoff(5_000, 5_000));
    assert_eq!(s.state(2), "running");
    assert_eq!(
        s.view(2).unwrap().group,
        Some(Labels::from([("gpu", "a100")]))
    );
    s.submit(task(3).labels("gpu=a100"));
    assert_eq!(s.state(3), "queued/groups_full");
    s.submit(task(4).start_at(3_000, 0));
    assert_eq!(s.state(4), "scheduled/scheduled");
    s.end(2, FAIL);
    assert_eq!(s.state(2), "queued/backoff");
    assert_eq!(s.state(3), "running");
    s.at(2_000);
    // Due but not yet at start_at: still "scheduled" to the user.
    assert_eq!(s.state(4), "scheduled/scheduled");
    s.submit(task(5));
    assert_eq!(s.state(5), "queued/held_for_reservation");
    let view = s.view(5).unwrap();
    assert_eq!(view.pool.as_str(), "p");
    assert_eq!(view.attempts, 0);
    assert_eq!(view.group, None);
}

// ---- bad input -----------------------------------------------------------------------------

/// A core with some state, to show that refused events change none of it.
fn busy_sim() -> Sim {
    let mut s = Sim::new();
    s.capacity("p", "gpu=a100", 1);
    s.submit(task(1).labels("gpu=a100"));
    s.submit(task(2).labels("gpu=a100").deadline(500));
    s.submit(task(3).start_at(10_000, 0));
    s
}

/// Feeds `event`, expects `code`, and checks that no view moved.
fn refused(s: &mut Sim, event: Event, code: ErrorCode) {
    let views: Vec<_> = (1..=5).map(|t| s.view(t)).collect();
    let snapshot = s.snapshot();
    let wakeup = s.core.next_wakeup();
    let e = s.try_step(event.clone()).unwrap_err();
    assert_eq!(e.code(), code, "{event:?}: {e}");
    assert_eq!(s.snapshot(), snapshot);
    assert_eq!((1..=5).map(|t| s.view(t)).collect::<Vec<_>>(), views);
    assert_eq!(s.core.next_wakeup(), wakeup);
}

#[test]
fn bad_pool_names_are_invalid_argument() {
    for name in ["", "a.b", "cronoq.submit", &"x".repeat(65), "a b", "é"] {
        let e = PoolName::new(name).unwrap_err();
        assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT, "{name:?}");
    }
    assert!(PoolName::new("x".repeat(64)).is_ok());
    assert!(PoolName::new("gpu-pool_2").is_ok());
    // A pool name arriving as data is checked too.
    let mut spec = serde_json::to_value(TaskSpec::new(TaskId(1), pool("p"))).unwrap();
    spec["pool"] = "a.b".into();
    assert!(serde_json::from_value::<TaskSpec>(spec).is_err());
}

#[test]
fn bad_labels_are_invalid_argument_and_change_nothing() {
    for text in ["gpu", "=x", "gpu=", "gpu=a100,gpu=h100", "g pu=a100"] {
        let e = Labels::parse(text).unwrap_err();
        assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT, "{text:?}");
    }
    let long = format!("gpu={}", "a".repeat(65));
    let bad_sets = [
        labels("gpu"),
        labels("=x"),
        labels("gpu=a100,gpu=h100"),
        labels(&long),
        labels("gpu=a 100"),
    ];
    let mut s = busy_sim();
    for bad in bad_sets {
        refused(
            &mut s,
            Event::CapacitySet {
                pool: pool("p"),
                labels: bad.clone(),
                slots: 4,
            },
            ErrorCode::INVALID_ARGUMENT,
        );
        refused(
            &mut s,
            Event::Submitted(task(4).0.clone().tap(|t| t.required = bad)),
            ErrorCode::INVALID_ARGUMENT,
        );
    }
}

#[test]
fn bad_task_options_are_invalid_argument_and_change_nothing() {
    let mut s = busy_sim();
    for spec in [
        task(4).max_attempts(0),
        task(4).timeout(0),
        task(4).backoff(1_000, 10),
    ] {
        refused(
            &mut s,
            Event::Submitted(spec.0),
            ErrorCode::INVALID_ARGUMENT,
        );
    }
    assert_eq!(s.view(4), None);
}

#[test]
fn bad_pool_config_is_invalid_argument_and_changes_nothing() {
    let mut s = busy_sim();
    let bad: [fn(&mut PoolConfig); 3] = [
        |c| c.max_attempts = 0,
        |c| {
            c.autoscale_min = 5;
            c.autoscale_max = 4;
        },
        |c| {
            c.backoff.initial = Millis(10_000);
            c.backoff.max = Millis(1);
        },
    ];
    for change in bad {
        let mut config = PoolConfig::default();
        change(&mut config);
        for name in ["p", "new"] {
            refused(
                &mut s,
                Event::PoolConfigured {
                    pool: pool(name),
                    config: config.clone(),
                },
                ErrorCode::INVALID_ARGUMENT,
            );
        }
    }
    assert_eq!(s.snapshot().pools.len(), 1);
}

#[test]
fn duplicate_and_unknown_tasks() {
    let mut s = busy_sim();
    refused(
        &mut s,
        Event::Submitted(task(1).0),
        ErrorCode::ALREADY_EXISTS,
    );
    // Also while it waits, and while it is scheduled.
    refused(
        &mut s,
        Event::Submitted(task(2).pool("other").0),
        ErrorCode::ALREADY_EXISTS,
    );
    refused(
        &mut s,
        Event::Submitted(task(3).0),
        ErrorCode::ALREADY_EXISTS,
    );
    refused(
        &mut s,
        Event::CancelRequested(TaskId(9)),
        ErrorCode::NOT_FOUND,
    );
    refused(
        &mut s,
        Event::AttemptEnded {
            task: TaskId(9),
            attempt: 1,
            outcome: OK,
        },
        ErrorCode::NOT_FOUND,
    );
    // A finished task's id may be used again.
    s.end(1, OK);
    assert_eq!(s.submit(task(1)), NOTHING);
}

#[test]
fn rejected_event_does_not_move_the_clock() {
    let mut s = busy_sim();
    s.now = 5_000;
    refused(
        &mut s,
        Event::CancelRequested(TaskId(9)),
        ErrorCode::NOT_FOUND,
    );
    assert_eq!(s.core.now(), Millis(0));
}

/// `value.tap(|v| …)`: change a value in an expression.
trait Tap: Sized {
    fn tap(mut self, change: impl FnOnce(&mut Self)) -> Self {
        change(&mut self);
        self
    }
}
impl<T> Tap for T {}

// ---- recovery after a leader change ------------------------------------------

#[test]
fn a_recovered_running_attempt_keeps_its_slot_and_is_not_started_again() {
    let mut s = Sim::new();
    s.submit(task(9));
    // Its worker re-attached with 2 slots: the resumed attempt takes one,
    // a waiter the other; no Start for the resumed attempt.
    let lines = s
        .recover(task(1).labels("gpu=a100"), 2, Some(("gpu=a100", 2)))
        .unwrap();
    assert_eq!(lines, ["start t9#1 {gpu=a100}"]);
    assert_eq!(s.state(1), "running");
    assert_eq!(s.view(1).unwrap().attempts, 2);
    assert_eq!(s.end(1, OK), ["finish t1 succeeded attempts=2"]);
}

#[test]
fn a_recovered_waiting_task_goes_on_counting_its_attempts() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    let lines = s.recover(task(1).max_attempts(3), 2, None).unwrap();
    assert_eq!(lines, ["start t1#3 {}"]);
    assert_eq!(s.end(1, FAIL), ["finish t1 failed attempts=3"]);
    // Never past its last attempt: one whose attempts are all used (the
    // last lost as its worker did not re-attach) has failed. It once ran
    // again under the last attempt's number (`t2#2` after attempts 1 and
    // 2: the simulation's attempt check, issue 34 finding 11).
    let lines = s.recover(task(2).max_attempts(2), 2, None).unwrap();
    assert_eq!(lines, ["finish t2 failed attempts=2"]);
    let lines = s.recover(task(3).max_attempts(2), 5, None).unwrap();
    assert_eq!(lines, ["finish t3 failed attempts=5"]);
    assert_eq!(s.state(2), "gone");
}

/// Preempted attempts do not count toward `max_attempts`, also once a
/// successor recovers the task (they once counted there: a task
/// preempted twice had two attempts fewer under the new leader).
#[test]
fn a_recovered_task_keeps_its_preempted_attempts_uncounted() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    // Attempts 1 and 2 preempted, attempt 3 lost: one of two used.
    let lines = s
        .try_step(Event::Recovered {
            spec: task(1).max_attempts(2).0,
            attempts: 3,
            preempted: 2,
            running: None,
        })
        .unwrap();
    assert_eq!(lines, ["start t1#4 {}"]);
    assert_eq!(s.end(1, FAIL), ["finish t1 failed attempts=4"]);
}

/// Issue 34, finding 11: a task with the pool's default attempt budget,
/// recovered waiting (attempt 1 lost) before any worker of its pool has
/// registered with the new leader, started its retry as attempt 1 again:
/// the pool was not known yet and its budget counted as 1. The fault
/// probe's history read `[[1,wA,lost],[1,wB,lost],[2,wC,succeeded]]`.
#[test]
fn a_recovered_task_of_a_pool_not_seen_yet_keeps_its_attempt_count() {
    let mut s = Sim::new();
    // No capacity, no configuration: the pool is new to this core.
    let lines = s.recover(task(1).pool("fresh"), 1, None).unwrap();
    assert_eq!(lines, Vec::<String>::new());
    assert_eq!(s.view(1).unwrap().attempts, 1);
    assert_eq!(s.capacity("fresh", "", 1), ["start t1#2 {}"]);
    // The default budget (3) holds: one more after this, then failed.
    assert_eq!(s.end(1, LOST), ["retry t1#3 @2000"]);
}

#[test]
fn a_recovered_fixed_start_retry_is_not_missed() {
    let mut s = Sim::new();
    s.capacity("p", "", 1);
    s.at(10_000);
    // Its start (long past) was honoured by attempt 1.
    let lines = s.recover(task(1).start_at(100, 10), 1, None).unwrap();
    assert_eq!(lines, ["start t1#2 {}"]);
}

#[test]
fn a_recovery_that_cannot_hold_is_refused_and_changes_nothing() {
    let mut s = Sim::new();
    s.capacity("p", "gpu=a100", 1);
    s.submit(task(5).labels("gpu=a100"));
    let e = s
        .recover(task(1).labels("gpu=h100"), 1, Some(("gpu=a100", 2)))
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT);
    let e = s.recover(task(1), 0, Some(("", 1))).unwrap_err();
    assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT);
    // The group is full: a capacity that does not add the slot is refused.
    let e = s.recover(task(1), 1, Some(("gpu=a100", 1))).unwrap_err();
    assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT);
    let e = s.recover(task(5), 1, None).unwrap_err();
    assert_eq!(e.code(), ErrorCode::ALREADY_EXISTS);
}

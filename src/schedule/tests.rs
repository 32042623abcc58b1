//! The schedule rules checked against a reference table of daylight-saving
//! edge days, and as properties: ticks strictly increase, no tick fires
//! twice, every tick is decided exactly once.
//!
//! The table's instants were derived by hand from the zones' rules (tzdb
//! 2024+), not printed by the code under test:
//! - Europe/Berlin: CET +01 / CEST +02; 2026 springs forward on Sunday
//!   29 March at 01:00Z (02:00 → 03:00) and falls back on Sunday 25 October
//!   at 01:00Z (03:00 → 02:00).
//! - America/New_York: EST −05 / EDT −04; 2026 springs forward on Sunday
//!   8 March at 07:00Z (02:00 → 03:00), falls back on Sunday 1 November at
//!   06:00Z (02:00 → 01:00).
//! - Australia/Lord_Howe: +10:30 / +11, a 30-minute shift; 2026 falls back
//!   on Sunday 5 April at 15:00Z the day before (02:00 → 01:30) and springs
//!   forward on Sunday 4 October at 15:30Z the day before (02:00 → 02:30).
//! - America/Sao_Paulo: −03 / −02 until Brazil abolished DST in 2019; its
//!   last spring-forward was Sunday 4 November 2018 at 03:00Z (00:00 →
//!   01:00). In 2026 the same Sunday is an ordinary day at −03.
//! - Asia/Tehran: +03:30 / +04:30 until Iran abolished DST after 2022; in
//!   2022 it began on 22 March at 00:00 (21 March 20:30Z). Since 2023,
//!   +03:30 all year.

use jiff::Timestamp;
use proptest::prelude::*;

use super::*;

fn ms(rfc3339: &str) -> Millis {
    let t: Timestamp = rfc3339.parse().expect("an RFC 3339 instant");
    Millis(t.as_millisecond() as u64)
}

fn utc(t: Millis) -> String {
    Timestamp::from_millisecond(t.0 as i64)
        .expect("in range")
        .to_string()
}

/// One row: `expr` in `tz`, the ticks strictly after `from`.
struct Row {
    why: &'static str,
    expr: &'static str,
    tz: &'static str,
    from: &'static str,
    want: &'static [&'static str],
}

const DST_TABLE: &[Row] = &[
    Row {
        why: "Berlin spring-forward: 02:30 does not exist; a fixed time fires once, right after the jump (03:00 CEST)",
        expr: "30 2 * * *",
        tz: "Europe/Berlin",
        from: "2026-03-28T12:00:00Z",
        want: &["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"],
    },
    Row {
        why: "Berlin fall-back: 02:30 happens twice; a fixed time fires once, on the first pass (CEST)",
        expr: "30 2 * * *",
        tz: "Europe/Berlin",
        from: "2026-10-24T12:00:00Z",
        want: &["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"],
    },
    Row {
        why: "Berlin spring-forward: a wildcard expression follows real time; 02:00 and 02:30 do not exist",
        expr: "*/30 * * * *",
        tz: "Europe/Berlin",
        from: "2026-03-29T00:00:00Z",
        want: &["2026-03-29T00:30:00Z", "2026-03-29T01:00:00Z", "2026-03-29T01:30:00Z"],
    },
    Row {
        why: "Berlin fall-back: a wildcard expression ticks on both passes of the repeated hour",
        expr: "*/30 * * * *",
        tz: "Europe/Berlin",
        from: "2026-10-25T00:00:00Z",
        want: &[
            "2026-10-25T00:30:00Z",
            "2026-10-25T01:00:00Z",
            "2026-10-25T01:30:00Z",
            "2026-10-25T02:00:00Z",
        ],
    },
    Row {
        why: "Berlin fall-back: @hourly ticks every real hour, 02:00 twice",
        expr: "@hourly",
        tz: "Europe/Berlin",
        from: "2026-10-24T23:30:00Z",
        want: &["2026-10-25T00:00:00Z", "2026-10-25T01:00:00Z", "2026-10-25T02:00:00Z"],
    },
    Row {
        why: "Berlin spring-forward: @hourly ticks every real hour, no 02:00",
        expr: "@hourly",
        tz: "Europe/Berlin",
        from: "2026-03-28T23:30:00Z",
        want: &["2026-03-29T00:00:00Z", "2026-03-29T01:00:00Z", "2026-03-29T02:00:00Z"],
    },
    Row {
        why: "Berlin: six fields, seconds first, across the jump",
        expr: "15 30 2 * * *",
        tz: "Europe/Berlin",
        from: "2026-03-28T12:00:00Z",
        want: &["2026-03-29T01:00:00Z", "2026-03-30T00:30:15Z"],
    },
    Row {
        why: "New York spring-forward: 02:30 does not exist; fires at 03:00 EDT",
        expr: "30 2 * * *",
        tz: "America/New_York",
        from: "2026-03-07T12:00:00Z",
        want: &["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"],
    },
    Row {
        why: "New York fall-back: 01:30 happens twice; fires once, at 01:30 EDT",
        expr: "30 1 * * *",
        tz: "America/New_York",
        from: "2026-10-31T12:00:00Z",
        want: &["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"],
    },
    Row {
        why: "New York: midnight moves from 04:00Z to 05:00Z",
        expr: "@daily",
        tz: "America/New_York",
        from: "2026-10-31T12:00:00Z",
        want: &["2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"],
    },
    Row {
        why: "Lord Howe spring-forward by 30 minutes: 02:15 does not exist; fires at 02:30 (+11)",
        expr: "15 2 * * *",
        tz: "Australia/Lord_Howe",
        from: "2026-10-03T00:00:00Z",
        want: &["2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z"],
    },
    Row {
        why: "Lord Howe fall-back by 30 minutes: 01:45 happens twice; fires once, at +11",
        expr: "45 1 * * *",
        tz: "Australia/Lord_Howe",
        from: "2026-04-04T00:00:00Z",
        want: &["2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"],
    },
    Row {
        why: "Lord Howe fall-back: a wildcard expression ticks every real 15 minutes through the repeated half hour",
        expr: "*/15 * * * *",
        tz: "Australia/Lord_Howe",
        from: "2026-04-04T14:30:00Z",
        want: &[
            "2026-04-04T14:45:00Z",
            "2026-04-04T15:00:00Z",
            "2026-04-04T15:15:00Z",
            "2026-04-04T15:30:00Z",
        ],
    },
    Row {
        why: "Sao Paulo 2018, with DST: 00:30 did not exist on 4 November; fired at 01:00 (−02)",
        expr: "30 0 * * *",
        tz: "America/Sao_Paulo",
        from: "2018-11-02T12:00:00Z",
        want: &["2018-11-03T03:30:00Z", "2018-11-04T03:00:00Z", "2018-11-05T02:30:00Z"],
    },
    Row {
        why: "Sao Paulo 2026, DST abolished: the first Sunday of November is an ordinary day at −03",
        expr: "30 0 * * *",
        tz: "America/Sao_Paulo",
        from: "2026-10-31T12:00:00Z",
        want: &["2026-11-01T03:30:00Z", "2026-11-02T03:30:00Z", "2026-11-03T03:30:00Z"],
    },
    Row {
        why: "Tehran 2022, with DST: 00:30 did not exist on 22 March (00:00 +03:30 → 01:00 +04:30); fired at 01:00",
        expr: "30 0 * * *",
        tz: "Asia/Tehran",
        from: "2022-03-20T12:00:00Z",
        want: &["2022-03-20T21:00:00Z", "2022-03-21T20:30:00Z", "2022-03-22T20:00:00Z"],
    },
    Row {
        why: "Tehran 2026, DST abolished: 22 March is an ordinary day at +03:30",
        expr: "30 0 * * *",
        tz: "Asia/Tehran",
        from: "2026-03-20T12:00:00Z",
        want: &["2026-03-20T21:00:00Z", "2026-03-21T21:00:00Z", "2026-03-22T21:00:00Z"],
    },
];

#[test]
fn dst_reference_table() {
    let mut failures = Vec::new();
    for row in DST_TABLE {
        let cadence = Cadence::cron(row.expr, row.tz).expect(row.why);
        let got: Vec<String> = cadence
            .ticks_after(ms(row.from), row.want.len())
            .into_iter()
            .map(utc)
            .collect();
        if got != row.want {
            failures.push(format!(
                "{}\n  {:?} in {} after {}\n  want {:?}\n  got  {:?}",
                row.why, row.expr, row.tz, row.from, row.want, got
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn next_after_starts_from_the_exact_instant_inside_a_repeated_hour() {
    // From the second pass of Berlin's repeated 02:00–03:00 (01:10Z is
    // 02:10 CET), a fixed 02:30 job has already fired on the first pass:
    // its next tick is the next day, not 01:30Z.
    let fixed = Cadence::cron("30 2 * * *", "Europe/Berlin").unwrap();
    assert_eq!(
        utc(fixed.next_after(ms("2026-10-25T01:10:00Z")).unwrap()),
        "2026-10-26T01:30:00Z"
    );
    // From the first pass (00:40Z is 02:40 CEST), a wildcard job's next
    // tick is the second pass's 02:00 (01:00Z).
    let wild = Cadence::cron("0 * * * *", "Europe/Berlin").unwrap();
    assert_eq!(
        utc(wild.next_after(ms("2026-10-25T00:40:00Z")).unwrap()),
        "2026-10-25T01:00:00Z"
    );
}

#[test]
fn a_schedule_fires_a_skipped_hour_tick_once_after_the_jump_and_a_repeated_hour_tick_once() {
    let s = ScheduleSpec {
        name: "nightly".into(),
        cron: Some("30 2 * * *".into()),
        tz: Some("Europe/Berlin".into()),
        ..Default::default()
    }
    .validate()
    .unwrap();
    for (created, days) in [
        ("2026-03-28T12:00:00Z", "2026-03-31T12:00:00Z"),
        ("2026-10-24T12:00:00Z", "2026-10-27T12:00:00Z"),
    ] {
        let mut state = ScheduleState::new(ms(created));
        let end = ms(days);
        let mut fired = Vec::new();
        // Wake exactly when asked, as a shell does.
        while let Some(at) = s.next_wakeup(&state).filter(|w| *w <= end) {
            for d in s.handle(&mut state, at, Event::Time) {
                match d {
                    Decision::Fire { tick } => {
                        fired.push(utc(tick));
                        s.handle(&mut state, at, Event::RunEnded { tick });
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        assert_eq!(fired.len(), 3, "{created}: {fired:?}");
    }
}

/// Expressions and zones the properties draw from.
const EXPRS: &[&str] = &[
    "*/7 * * * *",
    "30 2 * * *",
    "0 * * * *",
    "15 1,2,3 * * *",
    "*/20 * * * * *",
    "0 0 29 2 *",
    "0 9 * * MON-FRI",
    "@weekly",
    "45 1 1 * *",
];
const ZONES: &[&str] = &[
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "America/Sao_Paulo",
    "Asia/Tehran",
];

fn any_cadence() -> impl Strategy<Value = Cadence> {
    prop_oneof![
        (0..EXPRS.len(), 0..ZONES.len())
            .prop_map(|(e, z)| Cadence::cron(EXPRS[e], ZONES[z]).unwrap()),
        (1u64..7_200).prop_map(|s| Cadence::every(Millis(s * 1_000)).unwrap()),
    ]
}

/// 1990-01-01 .. 2060-01-01, in ms.
fn any_instant() -> impl Strategy<Value = Millis> {
    (631_152_000_000u64..2_840_140_800_000).prop_map(Millis)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn next_fire_is_strictly_increasing(cadence in any_cadence(), from in any_instant()) {
        let ticks = cadence.ticks_after(from, 12);
        prop_assert_eq!(ticks.len(), 12);
        let mut last = from;
        for t in ticks {
            prop_assert!(t > last, "{:?}: {} after {}", cadence, utc(t), utc(last));
            // Whole seconds, and next_after from just before a tick finds it.
            prop_assert_eq!(t.0 % 1_000, 0);
            prop_assert_eq!(cadence.next_after(Millis(t.0 - 1)), Some(t));
            last = t;
        }
    }

    #[test]
    fn jitter_never_moves_a_fire_past_the_next_tick(
        cadence in any_cadence(),
        from in any_instant(),
        jitter_s in 0u64..86_400,
        name in "[a-z]{1,8}",
    ) {
        let s = Schedule {
            name,
            cadence,
            overlap: Overlap::Allow,
            catchup_window: DEFAULT_CATCHUP_WINDOW,
            jitter: Millis(jitter_s * 1_000),
            paused: false,
            template: TaskTemplate::default().validate().unwrap(),
        };
        for tick in s.cadence.ticks_after(from, 4) {
            let due = s.due_at(tick);
            prop_assert!(due >= tick && due.minus(tick) <= s.jitter);
            prop_assert!(due < s.cadence.next_after(tick).unwrap());
        }
    }
}

/// One step of the firing simulation.
#[derive(Clone, Debug)]
enum Step {
    /// Wake at the next wakeup (as a shell does).
    Wake,
    /// Time jumps ahead (a leader down for a while).
    Jump(u64),
    /// The live run ends.
    End,
}

fn any_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => Just(Step::Wake),
        1 => (1u64..3_600_000).prop_map(Step::Jump),
        3 => Just(Step::End),
    ]
}

fn any_overlap() -> impl Strategy<Value = Overlap> {
    prop_oneof![
        Just(Overlap::Allow),
        Just(Overlap::Skip),
        Just(Overlap::BufferOne),
        Just(Overlap::CancelPrevious),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Through wakeups, downtime and run ends, under every overlap policy:
    /// no tick fires twice, ticks are decided in order, and every tick of
    /// the cadence is decided exactly once (by a decision or a miss range).
    #[test]
    fn never_two_fires_for_one_tick_and_every_tick_decided_once(
        cadence in any_cadence(),
        overlap in any_overlap(),
        window_s in 0u64..600,
        jitter_s in prop_oneof![Just(0u64), 0u64..120],
        created in any_instant(),
        steps in proptest::collection::vec(any_step(), 1..60),
    ) {
        let s = Schedule {
            name: "prop".into(),
            cadence,
            overlap,
            catchup_window: Millis(window_s * 1_000),
            jitter: Millis(jitter_s * 1_000),
            paused: false,
            template: TaskTemplate::default().validate().unwrap(),
        };
        let mut state = ScheduleState::new(created);
        let mut now = created;
        let mut fired = std::collections::BTreeSet::new();
        let mut decided: Vec<Millis> = Vec::new();
        let mut missed: Vec<(Millis, Millis)> = Vec::new();
        let mut buffered_seen = std::collections::BTreeSet::new();
        for step in steps {
            let (at, event) = match step {
                Step::Wake => match s.next_wakeup(&state) {
                    Some(w) => (w.max(now), Event::Time),
                    None => continue,
                },
                Step::Jump(d) => (now.plus(Millis(d)), Event::Time),
                Step::End => match state.active {
                    Some(tick) => (now, Event::RunEnded { tick }),
                    None => continue,
                },
            };
            now = at;
            let buffered_before = match event {
                Event::RunEnded { tick } if state.active == Some(tick) => state.buffered,
                _ => None,
            };
            for (i, d) in s.handle(&mut state, now, event).into_iter().enumerate() {
                match d {
                    Decision::Fire { tick } if i == 0 && buffered_before == Some(tick) => {
                        // The buffered tick, decided (buffered) before.
                        prop_assert!(buffered_seen.contains(&tick));
                        prop_assert!(fired.insert(tick), "tick {} fired twice", utc(tick));
                    }
                    Decision::Fire { tick } | Decision::CancelThenFire { tick, .. } => {
                        prop_assert!(fired.insert(tick), "tick {} fired twice", utc(tick));
                        prop_assert!(s.due_at(tick) <= now);
                        prop_assert!(decided.last().map_or(true, |l| *l < tick));
                        decided.push(tick);
                    }
                    Decision::Skip { tick } => {
                        prop_assert!(decided.last().map_or(true, |l| *l < tick));
                        decided.push(tick);
                    }
                    Decision::Buffer { tick } => {
                        prop_assert!(decided.last().map_or(true, |l| *l < tick));
                        prop_assert!(buffered_seen.insert(tick));
                        decided.push(tick);
                    }
                    Decision::Miss { first, until, reason } => {
                        prop_assert_eq!(reason, MissReason::TooLate);
                        prop_assert!(first < until);
                        prop_assert!(until.plus(s.catchup_window).plus(s.jitter) <= now);
                        prop_assert!(decided.last().map_or(true, |l| *l < first));
                        missed.push((first, until));
                    }
                }
            }
        }
        // Coverage: the cadence's ticks up to decided_through, each decided
        // once or inside one miss range (checked when they are few).
        let mut t = created;
        let mut count = 0;
        while let Some(next) = s.cadence.next_after(t) {
            if next > state.decided_through || count > 5_000 {
                break;
            }
            count += 1;
            let in_miss = missed.iter().filter(|(a, b)| *a <= next && next < *b).count();
            let in_decided = decided.iter().filter(|d| **d == next).count();
            prop_assert_eq!(in_miss + in_decided, 1, "tick {} decided {} times", utc(next), in_miss + in_decided);
            t = next;
        }
    }
}

#[test]
fn tick_keys_are_distinct_per_schedule_and_instant() {
    assert_ne!(
        schedule_key("a", Millis(1_000)),
        schedule_key("a", Millis(2_000))
    );
    assert_ne!(
        schedule_key("a", Millis(1_000)),
        schedule_key("b", Millis(1_000))
    );
    // The longest name still makes a key below the idempotency key limit.
    let long = "x".repeat(crate::core::MAX_NAME_LEN);
    assert!(schedule_key(&long, Millis::MAX).len() <= crate::core::MAX_KEY_LEN);
}

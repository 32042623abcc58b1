//! The firing rules: a pure state machine from a [`Schedule`], its
//! [`ScheduleState`] and `now` to [`Decision`]s, plus `next_wakeup`. The
//! shells (embedded, leader) feed it and carry out what it says; it reads
//! no clock.
//!
//! **One decision per tick.** `state.decided_through` is the instant up to
//! which every tick has been decided (fired, skipped, buffered or missed);
//! a tick is only ever decided once, in order. The journal stores this
//! state, so a successor leader goes on from the last tick its predecessor
//! stored. A fire decided but not yet stored when the leader died is
//! decided again by the successor with the same tick, hence the same
//! idempotency key ([`super::schedule_key`]), and the submit path returns
//! the first task: exactly one task per tick.
//!
//! **Catch-up.** A tick whose due time passed while no leader ran fires
//! late if it is at most `catchup_window` (plus the jitter) old; *every*
//! such tick fires, once each and in order (as Temporal does, not only the
//! latest as Kubernetes CronJobs do): the window bounds the burst, and the
//! overlap policy still applies between them (with `skip`, the first
//! catch-up fire makes the others skips). Older ticks are recorded as one
//! [`Decision::Miss`] range, decided in constant time however long the
//! downtime. A step decides at most [`MAX_DECISIONS_PER_STEP`] ticks; when
//! more are due, `next_wakeup` is already past and the shell steps again.
//!
//! **Jitter** delays a tick's fire by a deterministic amount in
//! `0..=jitter`: a hash (SHA-256) of the schedule name and the tick, so a
//! successor leader computes the same delay. The delay is capped below the
//! gap to the next tick, so fires stay in tick order and a fire never
//! moves past the next tick. The task still carries the tick as
//! `scheduled_at`.
//!
//! **Pause.** A paused schedule decides its due ticks as one
//! [`MissReason::Paused`] range and never wakes. Ticks that passed during a
//! pause do not fire on resume: the shell steps the schedule at the
//! instant of each pause or resume under the spec that held until then,
//! then swaps in the new one.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::spec::{Overlap, Schedule};
use crate::core::Millis;

/// The most decisions one step returns.
pub const MAX_DECISIONS_PER_STEP: usize = 256;

/// What the journal keeps per schedule between steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleState {
    /// Every tick at or before this instant has been decided. A new
    /// schedule starts at its creation instant: its first tick is the first
    /// one after it.
    pub decided_through: Millis,
    /// The last tick fired, if any.
    pub last_fired: Option<Millis>,
    /// The tick of the last run this schedule started, while that run is
    /// queued or running (the shell reports its end).
    pub active: Option<Millis>,
    /// A tick waiting behind the active run (`buffer_one`).
    pub buffered: Option<Millis>,
}

impl ScheduleState {
    /// The state of a schedule created at `created_at`.
    pub fn new(created_at: Millis) -> ScheduleState {
        ScheduleState {
            decided_through: created_at,
            last_fired: None,
            active: None,
            buffered: None,
        }
    }
}

/// What happened, besides time passing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Only time passed (a wakeup, a takeover, a spec swap).
    Time,
    /// The run of `tick` finished (succeeded, failed, cancelled).
    RunEnded {
        /// The tick whose task ended.
        tick: Millis,
    },
}

/// Why ticks were passed over without a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissReason {
    /// Older than the catch-up window when a leader came to decide them.
    TooLate,
    /// The schedule was paused.
    Paused,
}

/// What the shell is to do, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Decision {
    /// Submit the task of `tick` (idempotency key `schedule_key(name,
    /// tick)`).
    Fire {
        /// The tick.
        tick: Millis,
    },
    /// Cancel the run of tick `cancel`, then submit the task of `tick`.
    CancelThenFire {
        /// The tick of the run to cancel.
        cancel: Millis,
        /// The tick to fire.
        tick: Millis,
    },
    /// No run for `tick`: the previous run is still queued or running.
    Skip {
        /// The tick.
        tick: Millis,
    },
    /// `tick` waits behind the running one; it fires when that ends.
    Buffer {
        /// The tick.
        tick: Millis,
    },
    /// Every tick in `first..until` passed without a run.
    Miss {
        /// The first tick passed over.
        first: Millis,
        /// Ticks before this (exclusive) are passed over.
        until: Millis,
        /// Why.
        reason: MissReason,
    },
}

impl Schedule {
    /// Applies `event` at `now`, then decides the ticks due by `now`.
    ///
    /// ```
    /// use cronoq::core::Millis;
    /// use cronoq::schedule::{Decision, Event, ScheduleSpec, ScheduleState};
    /// let s = ScheduleSpec { name: "s".into(), every: Some("10s".into()), ..Default::default() }
    ///     .validate().unwrap();
    /// let mut state = ScheduleState::new(Millis(5_000));
    /// assert_eq!(s.next_wakeup(&state), Some(Millis(10_000)));
    /// assert_eq!(s.handle(&mut state, Millis(10_000), Event::Time), vec![Decision::Fire { tick: Millis(10_000) }]);
    /// assert_eq!(s.handle(&mut state, Millis(10_001), Event::Time), vec![]);
    /// ```
    pub fn handle(&self, state: &mut ScheduleState, now: Millis, event: Event) -> Vec<Decision> {
        let mut out = Vec::new();
        if let Event::RunEnded { tick } = event {
            if state.active == Some(tick) {
                state.active = None;
                if let Some(buffered) = state.buffered.take() {
                    state.active = Some(buffered);
                    state.last_fired = Some(buffered);
                    out.push(Decision::Fire { tick: buffered });
                }
            }
        }
        let Some(first) = self.cadence.next_after(state.decided_through) else {
            return out;
        };
        if self.paused {
            if first <= now {
                out.push(Decision::Miss {
                    first,
                    until: now.plus(Millis(1)),
                    reason: MissReason::Paused,
                });
                state.decided_through = now;
            }
            return out;
        }
        // Lateness counts from the tick; the jitter widens the window so a
        // fire is never missed merely for its own delay.
        let cutoff = now.minus(self.catchup_window).minus(self.jitter);
        if first < cutoff {
            out.push(Decision::Miss {
                first,
                until: cutoff,
                reason: MissReason::TooLate,
            });
            state.decided_through = cutoff.minus(Millis(1));
        }
        while out.len() < MAX_DECISIONS_PER_STEP {
            let Some(tick) = self.cadence.next_after(state.decided_through) else {
                break;
            };
            if self.due_at(tick) > now {
                break;
            }
            state.decided_through = tick;
            out.push(self.decide(state, tick));
        }
        out
    }

    /// When the next tick is due (its tick plus its jitter), or `None`
    /// while paused or when no tick is left. At or before the last `now`
    /// when a step stopped at [`MAX_DECISIONS_PER_STEP`].
    pub fn next_wakeup(&self, state: &ScheduleState) -> Option<Millis> {
        if self.paused {
            return None;
        }
        self.cadence
            .next_after(state.decided_through)
            .map(|tick| self.due_at(tick))
    }

    /// When `tick` fires: the tick plus its jitter delay.
    pub fn due_at(&self, tick: Millis) -> Millis {
        tick.plus(self.jitter_delay(tick))
    }

    /// The deterministic delay of `tick` in `0..=jitter`, below the gap to
    /// the next tick (so fires stay in tick order).
    ///
    /// ```
    /// use cronoq::core::Millis;
    /// use cronoq::schedule::ScheduleSpec;
    /// let s = ScheduleSpec { name: "s".into(), every: Some("10s".into()),
    ///     jitter: Some("1h".into()), ..Default::default() }.validate().unwrap();
    /// let d = s.jitter_delay(Millis(10_000));
    /// assert!(d < Millis(10_000));
    /// assert_eq!(d, s.jitter_delay(Millis(10_000)));
    /// ```
    pub fn jitter_delay(&self, tick: Millis) -> Millis {
        if self.jitter == Millis::ZERO {
            return Millis::ZERO;
        }
        let mut hash = Sha256::new();
        hash.update(self.name.as_bytes());
        hash.update([0]);
        hash.update(tick.0.to_be_bytes());
        let digest = hash.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        let delay = u64::from_be_bytes(first) % (self.jitter.0 + 1);
        let room = match self.cadence.next_after(tick) {
            Some(next) => next.0 - tick.0 - 1,
            None => u64::MAX,
        };
        Millis(delay.min(room))
    }

    /// The overlap policy applied to one due tick (a backfill applies it
    /// to past ticks without moving `decided_through`).
    pub(crate) fn decide(&self, state: &mut ScheduleState, tick: Millis) -> Decision {
        match (self.overlap, state.active) {
            (_, None) | (Overlap::Allow, Some(_)) => {
                state.active = Some(tick);
                state.last_fired = Some(tick);
                Decision::Fire { tick }
            }
            (Overlap::Skip, Some(_)) => Decision::Skip { tick },
            (Overlap::BufferOne, Some(_)) => {
                if state.buffered.is_none() {
                    state.buffered = Some(tick);
                    Decision::Buffer { tick }
                } else {
                    Decision::Skip { tick }
                }
            }
            (Overlap::CancelPrevious, Some(previous)) => {
                state.active = Some(tick);
                state.last_fired = Some(tick);
                Decision::CancelThenFire {
                    cancel: previous,
                    tick,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::ScheduleSpec;

    const S: u64 = 1_000;

    fn every(secs: u64, overlap: Overlap) -> Schedule {
        ScheduleSpec {
            name: "s".into(),
            every: Some(format!("{secs}s")),
            overlap,
            ..Default::default()
        }
        .validate()
        .unwrap()
    }

    fn fire(tick: u64) -> Decision {
        Decision::Fire { tick: Millis(tick) }
    }

    #[test]
    fn a_tick_fires_once_when_due_and_not_before() {
        let s = every(10, Overlap::Allow);
        let mut st = ScheduleState::new(Millis(0));
        assert_eq!(s.handle(&mut st, Millis(9_999), Event::Time), vec![]);
        assert_eq!(
            s.handle(&mut st, Millis(10 * S), Event::Time),
            vec![fire(10 * S)]
        );
        assert_eq!(s.handle(&mut st, Millis(10 * S), Event::Time), vec![]);
        assert_eq!(st.last_fired, Some(Millis(10 * S)));
        assert_eq!(s.next_wakeup(&st), Some(Millis(20 * S)));
    }

    #[test]
    fn creation_instant_itself_is_not_a_tick() {
        let s = every(10, Overlap::Allow);
        let mut st = ScheduleState::new(Millis(10 * S));
        assert_eq!(s.handle(&mut st, Millis(10 * S), Event::Time), vec![]);
        assert_eq!(s.next_wakeup(&st), Some(Millis(20 * S)));
    }

    #[test]
    fn catch_up_fires_every_tick_within_the_window_in_order_and_misses_older_ones() {
        // Window 1 minute, a tick every 10s, the leader back after 5 minutes.
        let s = every(10, Overlap::Allow);
        let mut st = ScheduleState::new(Millis(0));
        let now = Millis(300 * S + 500);
        let got = s.handle(&mut st, now, Event::Time);
        let mut want = vec![Decision::Miss {
            first: Millis(10 * S),
            until: Millis(240 * S + 500),
            reason: MissReason::TooLate,
        }];
        want.extend((25..=30).map(|k| fire(k * 10 * S)));
        assert_eq!(got, want);
        assert_eq!(st.decided_through, Millis(300 * S));
    }

    #[test]
    fn a_tick_exactly_catchup_window_old_still_fires() {
        let s = every(10, Overlap::Allow);
        let mut st = ScheduleState::new(Millis(0));
        let got = s.handle(&mut st, Millis(70 * S), Event::Time);
        assert_eq!(got.first(), Some(&fire(10 * S)));
    }

    #[test]
    fn skip_records_ticks_while_the_previous_run_is_live() {
        let s = every(10, Overlap::Skip);
        let mut st = ScheduleState::new(Millis(0));
        assert_eq!(
            s.handle(&mut st, Millis(10 * S), Event::Time),
            vec![fire(10 * S)]
        );
        assert_eq!(
            s.handle(&mut st, Millis(20 * S), Event::Time),
            vec![Decision::Skip {
                tick: Millis(20 * S)
            }]
        );
        // The run of an older tick ending is not this schedule's live run.
        assert_eq!(
            s.handle(
                &mut st,
                Millis(21 * S),
                Event::RunEnded {
                    tick: Millis(20 * S)
                }
            ),
            vec![]
        );
        assert_eq!(
            s.handle(
                &mut st,
                Millis(25 * S),
                Event::RunEnded {
                    tick: Millis(10 * S)
                }
            ),
            vec![]
        );
        assert_eq!(
            s.handle(&mut st, Millis(30 * S), Event::Time),
            vec![fire(30 * S)]
        );
    }

    #[test]
    fn buffer_one_keeps_one_tick_waiting_and_fires_it_when_the_run_ends() {
        let s = every(10, Overlap::BufferOne);
        let mut st = ScheduleState::new(Millis(0));
        s.handle(&mut st, Millis(10 * S), Event::Time);
        assert_eq!(
            s.handle(&mut st, Millis(20 * S), Event::Time),
            vec![Decision::Buffer {
                tick: Millis(20 * S)
            }]
        );
        assert_eq!(
            s.handle(&mut st, Millis(30 * S), Event::Time),
            vec![Decision::Skip {
                tick: Millis(30 * S)
            }]
        );
        assert_eq!(
            s.handle(
                &mut st,
                Millis(35 * S),
                Event::RunEnded {
                    tick: Millis(10 * S)
                }
            ),
            vec![fire(20 * S)]
        );
        assert_eq!(st.active, Some(Millis(20 * S)));
        assert_eq!(st.buffered, None);
        assert_eq!(
            s.handle(&mut st, Millis(40 * S), Event::Time),
            vec![Decision::Buffer {
                tick: Millis(40 * S)
            }]
        );
    }

    #[test]
    fn cancel_previous_cancels_the_live_run_then_fires() {
        let s = every(10, Overlap::CancelPrevious);
        let mut st = ScheduleState::new(Millis(0));
        s.handle(&mut st, Millis(10 * S), Event::Time);
        assert_eq!(
            s.handle(&mut st, Millis(20 * S), Event::Time),
            vec![Decision::CancelThenFire {
                cancel: Millis(10 * S),
                tick: Millis(20 * S)
            }]
        );
        // The cancelled run's end changes nothing.
        assert_eq!(
            s.handle(
                &mut st,
                Millis(21 * S),
                Event::RunEnded {
                    tick: Millis(10 * S)
                }
            ),
            vec![]
        );
        assert_eq!(st.active, Some(Millis(20 * S)));
        s.handle(
            &mut st,
            Millis(22 * S),
            Event::RunEnded {
                tick: Millis(20 * S),
            },
        );
        assert_eq!(
            s.handle(&mut st, Millis(30 * S), Event::Time),
            vec![fire(30 * S)]
        );
    }

    #[test]
    fn a_paused_schedule_passes_its_ticks_and_does_not_fire_them_on_resume() {
        let mut spec = ScheduleSpec {
            name: "s".into(),
            every: Some("10s".into()),
            paused: true,
            ..Default::default()
        };
        let paused = spec.validate().unwrap();
        spec.paused = false;
        let running = spec.validate().unwrap();
        let mut st = ScheduleState::new(Millis(0));
        assert_eq!(paused.next_wakeup(&st), None);
        // Resumed at 45s: stepped once under the paused spec, then swapped.
        assert_eq!(
            paused.handle(&mut st, Millis(45 * S), Event::Time),
            vec![Decision::Miss {
                first: Millis(10 * S),
                until: Millis(45 * S + 1),
                reason: MissReason::Paused
            }]
        );
        assert_eq!(running.handle(&mut st, Millis(45 * S), Event::Time), vec![]);
        assert_eq!(running.next_wakeup(&st), Some(Millis(50 * S)));
    }

    #[test]
    fn jitter_delays_deterministically_and_never_past_the_next_tick() {
        let s = ScheduleSpec {
            name: "jittery".into(),
            every: Some("10s".into()),
            jitter: Some("1h".into()),
            ..Default::default()
        }
        .validate()
        .unwrap();
        let delays: Vec<Millis> = (1..50)
            .map(|k| s.jitter_delay(Millis(k * 10 * S)))
            .collect();
        assert!(delays.iter().all(|d| *d < Millis(10 * S)));
        assert!(delays.iter().any(|d| *d > Millis(0)), "{delays:?}");
        // A successor computes the same.
        let again = s.clone();
        assert_eq!(again.jitter_delay(Millis(70 * S)), delays[6]);
        let mut st = ScheduleState::new(Millis(0));
        let due = s.due_at(Millis(10 * S));
        assert_eq!(s.next_wakeup(&st), Some(due));
        if due > Millis(10 * S) {
            assert_eq!(s.handle(&mut st, due.minus(Millis(1)), Event::Time), vec![]);
        }
        assert_eq!(s.handle(&mut st, due, Event::Time), vec![fire(10 * S)]);
    }

    #[test]
    fn a_successor_from_the_stored_state_decides_the_same_ticks_with_the_same_keys() {
        let s = ScheduleSpec {
            name: "s".into(),
            every: Some("10s".into()),
            jitter: Some("5s".into()),
            ..Default::default()
        }
        .validate()
        .unwrap();
        let mut stored = ScheduleState::new(Millis(0));
        s.handle(&mut stored, Millis(15 * S), Event::Time);
        // The leader decides the next tick and dies before storing it.
        let mut leader = stored;
        let decided = s.handle(&mut leader, Millis(30 * S), Event::Time);
        // Its successor, with the spec and the stored state only.
        let mut successor = stored;
        let again = s
            .clone()
            .handle(&mut successor, Millis(30 * S), Event::Time);
        assert_eq!(again, decided);
        assert_eq!(successor, leader);
        let keys = |ds: &[Decision]| -> Vec<String> {
            ds.iter()
                .filter_map(|d| match d {
                    Decision::Fire { tick } => Some(crate::schedule::schedule_key(&s.name, *tick)),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(keys(&again), keys(&decided));
        assert!(!keys(&again).is_empty());
    }

    #[test]
    fn a_long_catch_up_is_decided_in_bounded_steps() {
        let s = ScheduleSpec {
            name: "s".into(),
            every: Some("1s".into()),
            catchup_window: Some("10m".into()),
            ..Default::default()
        }
        .validate()
        .unwrap();
        let mut st = ScheduleState::new(Millis(0));
        let now = Millis(600 * S);
        let mut fired = 0;
        let mut steps = 0;
        while s.next_wakeup(&st).is_some_and(|w| w <= now) {
            let out = s.handle(&mut st, now, Event::Time);
            assert!(out.len() <= MAX_DECISIONS_PER_STEP);
            fired += out.len();
            steps += 1;
        }
        assert_eq!(fired, 600);
        assert_eq!(steps, 3);
    }
}

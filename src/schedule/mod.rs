//! Schedules (issue 23): cron expressions and intervals that submit a task
//! once per tick. Pure, like `core`: no clock reads, no I/O, no runtime;
//! every instant is a [`Millis`] since the Unix epoch handed in by a shell.
//!
//! - `spec.rs`: [`ScheduleSpec`] as users give it and its `validate()`
//!   into a [`Schedule`] (name, [`Cadence`], [`Overlap`], catch-up window,
//!   jitter, pause, task [`Template`]).
//! - `cadence.rs`: when a schedule ticks — cron read in an IANA zone with
//!   Vixie cron's daylight-saving rules (croner + jiff, tz database
//!   compiled in), or an interval anchored to the Unix epoch.
//! - `fire.rs`: the firing rules as a state machine:
//!   `Schedule::handle(state, now, Event) -> Vec<Decision>` and
//!   `next_wakeup`; catch-up, overlap policies, deterministic jitter.
//!
//! - `book.rs`: the [`Book`] of many schedules: create, pause, resume,
//!   delete, trigger, backfill, and `step(now)` over the due ones only
//!   (an ordered set of wakeups); run history and counters per schedule.
//! - `record.rs`: what the history holds ([`FireRecord`] & co).
//!
//! A tick's identity is the schedule's name plus its scheduled instant;
//! [`schedule_key`] turns it into the task's idempotency key, which is
//! what makes "exactly one task per tick" hold through a failover.
//!
//! The shells that drive the book live elsewhere: the embedded one in
//! `crate::embedded` (`schedules.rs`), the leader's in `crate::server`.

mod book;
#[cfg(test)]
mod book_tests;
mod cadence;
mod fire;
mod record;
mod spec;
#[cfg(test)]
mod tests;

pub use book::{
    Book, BookError, Entry, Order, StoredSchedule, DEFAULT_MAX_SCHEDULES, HISTORY,
    MAX_BACKFILL_TICKS, MAX_ORDERS_PER_STEP, MISS_COUNT_CAP, PASSED,
};
pub use record::{FireKind, FireRecord, MissedTicks, ScheduleCounters};

pub use cadence::{Cadence, MIN_EVERY};
pub use fire::{Decision, Event, MissReason, ScheduleState, MAX_DECISIONS_PER_STEP};
pub use spec::{
    check_schedule_name, parse_span, Overlap, Schedule, ScheduleSpec, TaskTemplate, Template,
    DEFAULT_CATCHUP_WINDOW, MAX_WINDOW,
};

use crate::core::Millis;

/// The idempotency key of a tick: `schedule:<name>:<tick in ms since the
/// epoch>`. Two fires of one tick (a successor leader deciding it again)
/// submit under the same key and so yield one task.
///
/// ```
/// use cronoq::core::Millis;
/// use cronoq::schedule::schedule_key;
/// assert_eq!(schedule_key("nightly", Millis(1_774_746_000_000)), "schedule:nightly:1774746000000");
/// ```
pub fn schedule_key(name: &str, tick: Millis) -> String {
    format!("schedule:{name}:{}", tick.0)
}

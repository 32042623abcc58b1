//! Timers as data: what the core must do at which instant.
//!
//! The core never sleeps. It keeps an ordered set of `(when, kind, task)`
//! and the shell asks [`crate::core::Core::next_wakeup`] when to call back.
//! Entries are removed eagerly when their reason goes away, and checked
//! again when they fire (a slab slot may have been reused: the task's
//! submission sequence number tells).

use std::collections::BTreeSet;

use super::model::Millis;

/// What a timer does when it fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum TimerKind {
    /// A fixed-start task's reservation becomes due (`start_at - lead`).
    ReservationDue,
    /// A fixed-start task may start (`start_at`).
    FixedStart,
    /// A fixed-start task's tolerance has run out.
    Miss,
    /// A queued task's deadline enters the urgency window.
    Urgent,
    /// Backoff is over: the next attempt may be placed.
    Retry,
    /// The running attempt has run too long.
    AttemptTimeout,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Timer {
    pub at: Millis,
    pub kind: TimerKind,
    pub seq: u64,
    pub task: u32,
}

#[derive(Default, Debug)]
pub(crate) struct Timers {
    set: BTreeSet<Timer>,
}

impl Timers {
    pub(crate) fn add(&mut self, timer: Timer) {
        self.set.insert(timer);
    }

    pub(crate) fn cancel(&mut self, timer: &Timer) {
        self.set.remove(timer);
    }

    pub(crate) fn next(&self) -> Option<Millis> {
        self.set.first().map(|t| t.at)
    }

    /// Takes the earliest timer due at or before `now`.
    pub(crate) fn pop_due(&mut self, now: Millis) -> Option<Timer> {
        match self.set.first() {
            Some(t) if t.at <= now => self.set.pop_first(),
            _ => None,
        }
    }
}

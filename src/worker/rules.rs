//! The worker's rules, pure: which lease to obey, which revoke to act on,
//! what to stop when a leader registers it, and which epoch it serves. No
//! I/O, no clock: the worker's session ([`super::session`]) carries the
//! verdicts out (spawns, stops, logs), and the failover simulation
//! (`server/sim.rs`) decides through the same rules, so a seed that fails
//! there replays this code.
//!
//! - A lease is obeyed only under the epoch this worker registered with (or
//!   heard of in a heartbeat reply), never while draining, never twice for
//!   an attempt that ran here (the last [`DoneAttempts::CAP`] are
//!   remembered; a replayed lease older than that is refused by its
//!   session count, `crate::auth::ReplayWindow`), and a duplicate of a
//!   running one is ignored — unless a newer leader leases the same
//!   attempt again: the old run reports to nobody who listens, so it is
//!   restarted under the new lease.
//! - A revoke stops a running attempt unless it comes from an older epoch
//!   than the attempt's lease.
//! - Registering with a leader stops every attempt it did not adopt.

use std::collections::VecDeque;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::core::{ErrorCode, Millis, TaskId};
use crate::wire::RunningAttempt;

/// How often a lease of `ttl` is renewed: a third of it (at least 20 ms),
/// so two renewals may be lost before it expires.
pub(crate) fn renew_every(ttl: Millis) -> Millis {
    Millis((ttl.0 / 3).max(20))
}

/// How soon a renewal that went unanswered (or was refused for a reason
/// that does not mean the lease is gone) is asked again: a quarter of
/// [`renew_every`], not a whole one, so that a short outage (nats-server
/// restarting, a connection's reconnect) costs no lease: the renewal
/// that fails just after it does not leave the lease a period short.
pub(crate) fn renew_retry(ttl: Millis) -> Millis {
    Millis((renew_every(ttl).0 / 4).max(20))
}

/// Whether a renewal refused with `code` means the lease is gone (the
/// leader no longer knows the attempt, or knows a newer one): the attempt
/// stops and reports nothing. Any other refusal is asked again.
pub(crate) fn lease_lost(code: &ErrorCode) -> bool {
    *code == ErrorCode::FAILED_PRECONDITION || *code == ErrorCode::NOT_FOUND
}

/// An attempt: (task, attempt number).
pub(crate) type AttemptKey = (TaskId, u32);

/// The last [`DoneAttempts::CAP`] attempts that ran here.
#[derive(Default, Debug)]
pub(crate) struct DoneAttempts {
    order: VecDeque<AttemptKey>,
    /// Fx: a lookup per lease and an insert and a removal per finished
    /// attempt; keys are the leader's task ids, not chosen by a caller.
    set: FxHashSet<AttemptKey>,
}

impl DoneAttempts {
    pub(crate) const CAP: usize = 4096;

    pub(crate) fn insert(&mut self, key: AttemptKey) {
        if self.set.insert(key) {
            self.order.push_back(key);
            if self.order.len() > Self::CAP {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }

    pub(crate) fn contains(&self, key: &AttemptKey) -> bool {
        self.set.contains(key)
    }
}

/// What to do with a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LeaseVerdict {
    /// Run it.
    Start,
    /// A newer leader leased a running attempt again: stop the old run
    /// (of `old_epoch`), run this one.
    Restart { old_epoch: u64 },
    /// The attempt ran here already.
    AlreadyRan,
    /// Not this worker's epoch.
    OtherEpoch { worker_epoch: u64 },
    /// The worker is draining.
    Draining,
    /// The same attempt runs under this or a newer lease.
    Duplicate,
}

/// What to do with a revoke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RevokeVerdict {
    /// Stop the attempt.
    Stop,
    /// Nothing runs under that key.
    NotRunning,
    /// It comes from an older epoch than the attempt's lease.
    OlderEpoch { lease_epoch: u64 },
}

/// One worker's state as the rules see it.
#[derive(Default, Debug)]
pub(crate) struct Rules {
    epoch: u64,
    /// Running attempts, with the epoch of their lease.
    running: FxHashMap<AttemptKey, u64>,
    done: DoneAttempts,
}

impl Rules {
    /// The epoch it serves.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// What runs, sorted (for registrations and heartbeats).
    pub(crate) fn running(&self) -> Vec<RunningAttempt> {
        let mut out: Vec<RunningAttempt> = self
            .running
            .keys()
            .map(|&(task_id, attempt)| RunningAttempt { task_id, attempt })
            .collect();
        out.sort_by_key(|a| (a.task_id, a.attempt));
        out
    }

    /// A leader took the registration under `epoch`, adopting `adopted`:
    /// the attempts to stop (every other one; they count as ran here).
    pub(crate) fn registered(&mut self, epoch: u64, adopted: &[RunningAttempt]) -> Vec<AttemptKey> {
        self.epoch = epoch;
        let keep: FxHashSet<AttemptKey> = adopted.iter().map(|a| (a.task_id, a.attempt)).collect();
        let mut orphans: Vec<AttemptKey> = self
            .running
            .keys()
            .filter(|k| !keep.contains(k))
            .copied()
            .collect();
        orphans.sort();
        for key in &orphans {
            self.running.remove(key);
            self.done.insert(*key);
        }
        orphans
    }

    /// A heartbeat reply named `epoch`: `true` if it moved forward.
    pub(crate) fn heard_epoch(&mut self, epoch: u64) -> bool {
        if epoch > self.epoch {
            self.epoch = epoch;
            true
        } else {
            false
        }
    }

    /// A lease for `key` under `epoch` (see the module docs); on `Start`
    /// and `Restart` the attempt counts as running under it.
    pub(crate) fn lease(&mut self, key: AttemptKey, epoch: u64, draining: bool) -> LeaseVerdict {
        if self.done.contains(&key) {
            return LeaseVerdict::AlreadyRan;
        }
        if epoch != self.epoch {
            return LeaseVerdict::OtherEpoch {
                worker_epoch: self.epoch,
            };
        }
        if draining {
            return LeaseVerdict::Draining;
        }
        let verdict = match self.running.get(&key) {
            Some(&old) if old >= epoch => return LeaseVerdict::Duplicate,
            Some(&old) => LeaseVerdict::Restart { old_epoch: old },
            None => LeaseVerdict::Start,
        };
        self.running.insert(key, epoch);
        verdict
    }

    /// A revoke of `key` from `epoch`.
    pub(crate) fn revoke(&self, key: AttemptKey, epoch: u64) -> RevokeVerdict {
        match self.running.get(&key) {
            None => RevokeVerdict::NotRunning,
            Some(&lease_epoch) if epoch < lease_epoch => RevokeVerdict::OlderEpoch { lease_epoch },
            Some(_) => RevokeVerdict::Stop,
        }
    }

    /// The run of `key` under `epoch` ended (reported, or given up):
    /// `true` if that run was the current one (then it ran here).
    pub(crate) fn ended(&mut self, key: AttemptKey, epoch: u64) -> bool {
        if self.running.get(&key) == Some(&epoch) {
            self.running.remove(&key);
            self.done.insert(key);
            true
        } else {
            false
        }
    }

    /// Every attempt stops (the worker stops or fails).
    pub(crate) fn stop_all(&mut self) -> Vec<AttemptKey> {
        let keys: Vec<AttemptKey> = self.running.drain().map(|(k, _)| k).collect();
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(t: u64, a: u32) -> AttemptKey {
        (TaskId(t), a)
    }

    #[test]
    fn a_failed_renewal_is_asked_again_within_a_quarter_period() {
        // The chaos test's lease: renewed every second; after a renewal
        // lost to a restarting nats-server, the next goes 250 ms later, so
        // three more may fail before the lease (3 s) runs out.
        assert_eq!(renew_every(Millis(3000)), Millis(1000));
        assert_eq!(renew_retry(Millis(3000)), Millis(250));
        assert_eq!(renew_retry(Millis(30)), Millis(20));
    }

    #[test]
    fn a_lease_is_obeyed_once_under_the_registered_epoch() {
        let mut r = Rules::default();
        r.registered(7, &[]);
        assert_eq!(
            r.lease(key(1, 1), 6, false),
            LeaseVerdict::OtherEpoch { worker_epoch: 7 }
        );
        assert_eq!(r.lease(key(1, 1), 7, true), LeaseVerdict::Draining);
        assert_eq!(r.lease(key(1, 1), 7, false), LeaseVerdict::Start);
        assert_eq!(r.lease(key(1, 1), 7, false), LeaseVerdict::Duplicate);
        assert!(r.ended(key(1, 1), 7));
        assert_eq!(r.lease(key(1, 1), 7, false), LeaseVerdict::AlreadyRan);
    }

    #[test]
    fn a_newer_leader_leasing_a_running_attempt_again_restarts_it() {
        let mut r = Rules::default();
        r.registered(7, &[]);
        assert_eq!(r.lease(key(1, 1), 7, false), LeaseVerdict::Start);
        // The worker hears of epoch 9 and is registered again adopting it.
        assert!(r.heard_epoch(9));
        assert!(r
            .registered(
                9,
                &[RunningAttempt {
                    task_id: TaskId(1),
                    attempt: 1
                }]
            )
            .is_empty());
        assert_eq!(
            r.lease(key(1, 1), 9, false),
            LeaseVerdict::Restart { old_epoch: 7 }
        );
        // The old run's end no longer counts; the new one's does.
        assert!(!r.ended(key(1, 1), 7));
        assert!(r.ended(key(1, 1), 9));
    }

    #[test]
    fn revokes_and_registrations_stop_what_they_should() {
        let mut r = Rules::default();
        r.registered(5, &[]);
        r.lease(key(1, 1), 5, false);
        r.lease(key(2, 1), 5, false);
        assert_eq!(r.revoke(key(3, 1), 5), RevokeVerdict::NotRunning);
        assert_eq!(
            r.revoke(key(1, 1), 4),
            RevokeVerdict::OlderEpoch { lease_epoch: 5 }
        );
        assert_eq!(r.revoke(key(1, 1), 6), RevokeVerdict::Stop);
        let orphans = r.registered(
            8,
            &[RunningAttempt {
                task_id: TaskId(2),
                attempt: 1,
            }],
        );
        assert_eq!(orphans, vec![key(1, 1)]);
        assert_eq!(r.lease(key(1, 1), 8, false), LeaseVerdict::AlreadyRan);
        assert_eq!(
            r.running(),
            vec![RunningAttempt {
                task_id: TaskId(2),
                attempt: 1
            }]
        );
        assert!(!r.heard_epoch(8));
    }

    #[test]
    fn the_memory_of_attempts_is_bounded() {
        let mut d = DoneAttempts::default();
        for t in 0..(DoneAttempts::CAP as u64 + 10) {
            d.insert(key(t, 1));
        }
        assert!(!d.contains(&key(0, 1)));
        assert!(d.contains(&key(DoneAttempts::CAP as u64 + 9, 1)));
    }
}

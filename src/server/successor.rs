//! A successor prepared before the election ends (issue 22: "kill -9 →
//! first lease under 1 s whatever the state size").
//!
//! A takeover admits every unfinished task into a fresh driver before it
//! serves workers: about half a microsecond each, 200 ms for 400,000
//! waiting tasks, after an election that already takes the election
//! timeout. A standby does that work while it waits instead: once the
//! leader record has stood still for half the election timeout (two
//! renewals missed: the leader is probably gone), it builds the
//! successor's driver from its warm copies — the journal's records and
//! the submit stream, decoded — exactly as a takeover would
//! ([`consumer::hand_ahead`]), and holds it, outputs and all, without
//! acting on anything. If it wins the election it leads with that driver
//! under its new epoch and reads only what came after; if the record
//! moves (the leader was slow, not gone) the prepared driver is dropped.
//!
//! **Why this is the same state a takeover builds.** The driver reads a
//! takeover's submissions the same way whenever they are admitted, as
//! long as [`Input::CaughtUp`] comes at the takeover
//! (`driver::tests::takeover::a_read_back_taken_in_earlier_leads_as_one_taken_at_the_takeover`),
//! and the epoch is read only by leases, revokes, worker replies and the
//! snapshot, none of which a read-back produces ([`Driver::set_epoch`]).
//! What it read can only have changed by a write of the deposed leader
//! after the copies were read, so the takeover keeps the prepared driver
//! only if ([`unusable`]), once its warm journal has seen everything up to
//! its own takeover write (which follows every write of the deposed
//! leader, fenced on the same subject):
//! - the journal took no record since (its last revision other than an
//!   election renewal is the one the preparation read);
//! - the submit stream's first sequence is the same (nothing was purged)
//!   and its last is not below the one read;
//! - the results bucket's max age is the one the driver was set up with.
//!
//! Otherwise it takes over as before, from the copies or cold: preparing
//! is an optimization, never a second truth. Tested by
//! `tests/leaders.rs::a_successor_prepared_ahead_leads_with_it_or_drops_it`.

use std::sync::Mutex;

use super::*;
use crate::server::election::Seen;

/// How long a takeover waits for a preparation still under way.
const CLAIM_WAIT: Duration = Duration::from_secs(5);

/// How long a preparation waits for the warm journal to catch up.
const CATCH_UP_WAIT: Duration = Duration::from_millis(250);

/// What a prepared driver was built from, or what a takeover finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Basis {
    /// The submit stream's first and last sequences.
    pub(super) submit_first: u64,
    pub(super) submit_last: u64,
    /// The warm journal's last revision other than an election renewal
    /// ([`warm::WarmJournal::records_seen`]).
    pub(super) journal_records: u64,
    /// The results bucket's max age (the driver's record refresh follows
    /// it).
    pub(super) max_age: Duration,
}

/// Why a driver prepared on `prepared` cannot lead on what a takeover
/// found (`now`); `None`: it can.
pub(super) fn unusable(prepared: &Basis, now: &Basis) -> Option<&'static str> {
    if now.journal_records != prepared.journal_records {
        Some("the journal took a record after it was prepared")
    } else if now.submit_first != prepared.submit_first {
        Some("the submit stream was purged after it was prepared")
    } else if now.submit_last < prepared.submit_last {
        Some("the submit stream holds less than when it was prepared")
    } else if now.max_age != prepared.max_age {
        Some("the results bucket's max age is not the one it was prepared with")
    } else {
        None
    }
}

/// A successor's driver with the read-back admitted, not yet leading.
pub(super) struct Prepared {
    pub(super) driver: Driver,
    pub(super) basis: Basis,
    /// The last submission handed to it: the takeover hands over the
    /// copy's from the next one on.
    pub(super) handed: u64,
    /// How many submissions it holds, and when it was ready (for the log).
    pub(super) held: usize,
    pub(super) ready: tokio::time::Instant,
}

/// Builds a successor's driver from this standby's warm copies, as a
/// takeover would (`None`: no warm copies, nothing to admit, or the copies
/// are behind). Acts on nothing: its outputs stay in the driver.
async fn prepare(base: Arc<Base>, lent: Arc<AtomicBool>) -> Option<Prepared> {
    let started = tokio::time::Instant::now();
    // The journal first: a record names a submission stored before it,
    // so the submit stream read next holds every one the journal names.
    let journal_last = journal_last(&base).await.ok()?;
    if !base.warm.caught_up(journal_last, CATCH_UP_WAIT).await {
        tracing::debug!("not preparing a successor: the warm journal is behind");
        return None;
    }
    let journal_records = base.warm.records_seen();
    let submit = base.submit_stream.clone().info().await.ok()?.state.clone();
    if submit.messages == 0 {
        return None;
    }
    // What the takeover makes it (`journal::results_max_age`).
    let max_age = base.config.server.results_ttl;
    let basis = Basis {
        submit_first: submit.first_sequence,
        submit_last: submit.last_sequence,
        journal_records,
        max_age,
    };
    let mut driver = new_driver(&base, 0, max_age, wall_now());
    driver.catch_up_first(usize::try_from(submit.messages).unwrap_or(usize::MAX));
    driver.restore_schedules(base.warm.schedules());
    let Some(copied) = base.submissions.lend(submit.first_sequence) else {
        tracing::debug!("not preparing a successor: the submissions' copy is still lent");
        return None;
    };
    lent.store(true, Ordering::SeqCst);
    let held = copied.submissions.len();
    // The driver admits on its own task while this one decodes and looks
    // up (two threads on a multi-threaded runtime), as at a takeover.
    let (inputs, mut rx) = mpsc::channel(64);
    let holder = tokio::spawn(async move {
        while let Some(input) = rx.recv().await {
            driver.handle(wall_now(), input);
        }
        driver
    });
    let ahead = Ahead {
        results: &base.results,
        warm: &base.warm,
        seal: &base.seal,
    };
    let handed = beside_the_driver(hand_ahead(ahead, submit.last_sequence, copied, &inputs)).await;
    drop(inputs);
    let driver = holder.await.ok()?;
    let Some(handed) = handed else {
        drop_later(driver);
        return None;
    };
    tracing::info!(
        held,
        handed,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "successor prepared while the leader is silent"
    );
    Some(Prepared {
        driver,
        basis,
        handed,
        held,
        ready: tokio::time::Instant::now(),
    })
}

/// A preparation under way or done.
struct Preparation {
    /// The leader record it was begun for.
    seq: u64,
    task: tokio::task::JoinHandle<Option<Prepared>>,
    /// It was lent the copy of the submit stream
    /// ([`warm_submits::WarmSubmissions::lend`]): unless it leads, the
    /// copy must be reset.
    lent: Arc<AtomicBool>,
}

impl Preparation {
    /// Stops it (if under way) and drops what it built; resets the copy
    /// of the submit stream it was lent, once it has surely ended.
    async fn drop_all(self, base: &Base) {
        let Preparation { task, lent, .. } = self;
        task.abort();
        if let Ok(Some(prepared)) = task.await {
            drop_later(prepared);
        }
        reset_if_lent(&lent, base);
    }
}

/// Resets the copy of the submit stream if a preparation that has ended
/// without leading was lent it (the copy has a hole).
fn reset_if_lent(lent: &AtomicBool, base: &Base) {
    if lent.load(Ordering::SeqCst) {
        base.submissions.reset();
    }
}

#[derive(Default)]
struct Held {
    /// A takeover claimed it: no preparation starts until this process
    /// stands by again ([`Successor::reopen`]).
    claimed: bool,
    preparing: Option<Preparation>,
}

/// This process's successor in preparation, shared by the watch
/// ([`Successor::watch`]) and the takeover ([`Successor::claim`]).
#[derive(Clone, Default)]
pub(super) struct Successor {
    held: Arc<Mutex<Held>>,
}

impl Successor {
    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The leader record the preparation was begun for.
    fn preparing_for(&self) -> Option<u64> {
        self.lock().preparing.as_ref().map(|p| p.seq)
    }

    /// Drops the preparation (the record moved: the leader lives).
    fn discard(&self, base: &Arc<Base>) {
        let Some(preparation) = self.lock().preparing.take() else {
            return;
        };
        tracing::info!(
            leader_seq = preparation.seq,
            "the leader record moved: the prepared successor is dropped"
        );
        let base = base.clone();
        tokio::spawn(async move { preparation.drop_all(&base).await });
    }

    /// Begins preparing for leader record `seq`, unless claimed.
    fn begin(&self, base: &Arc<Base>, seq: u64) {
        let mut held = self.lock();
        if held.claimed || held.preparing.is_some() {
            return;
        }
        tracing::info!(
            leader_seq = seq,
            "the leader record stood still for half the election timeout: preparing a successor"
        );
        let lent = Arc::new(AtomicBool::new(false));
        held.preparing = Some(Preparation {
            seq,
            task: tokio::spawn(prepare(base.clone(), lent.clone())),
            lent,
        });
    }

    /// The prepared successor, for a takeover that just won (waiting for
    /// a preparation under way, at most [`CLAIM_WAIT`]); none begins
    /// afterwards until [`Successor::reopen`].
    pub(super) async fn claim(&self, base: &Base) -> Option<Prepared> {
        let mut preparation = {
            let mut held = self.lock();
            held.claimed = true;
            held.preparing.take()
        }?;
        match tokio::time::timeout(CLAIM_WAIT, &mut preparation.task).await {
            Ok(Ok(Some(prepared))) => return Some(prepared),
            // Ended without a driver (a panic, copies behind).
            Ok(_) => reset_if_lent(&preparation.lent, base),
            Err(_) => {
                tracing::warn!(
                    "the successor's preparation did not end in time; taking over without it"
                );
                preparation.drop_all(base).await;
            }
        }
        None
    }

    /// This process stands by again: preparations may begin.
    pub(super) fn reopen(&self) {
        self.lock().claimed = false;
    }

    /// Prepares a successor whenever the leader record (another
    /// process's, not resigned) stands still for half of `timeout` while
    /// this process stands by, and drops it when the record moves. Runs
    /// for the life of the process.
    pub(super) async fn watch(
        self,
        base: Arc<Base>,
        mut seen: watch::Receiver<Option<Seen>>,
        instance: String,
        timeout: Duration,
    ) {
        let mut leading = base.warm_paused.subscribe();
        // Counted from when this process last began to stand by, like the
        // election's own count (a campaign starts counting afresh).
        let mut standing_since = tokio::time::Instant::now();
        let mut was_leading = false;
        loop {
            let suspect = {
                let current = seen.borrow_and_update();
                current.as_ref().and_then(|s| {
                    let other = s
                        .observed
                        .record
                        .as_ref()
                        .is_some_and(|r| !r.resigned && r.instance != instance);
                    other.then_some((s.observed.seq, s.since))
                })
            };
            let standing_by = !*leading.borrow_and_update();
            if standing_by && was_leading {
                standing_since = tokio::time::Instant::now();
            }
            was_leading = !standing_by;
            let mut due = None;
            match suspect {
                Some((seq, since)) if standing_by => {
                    if self.preparing_for().is_some_and(|s| s != seq) {
                        self.discard(&base);
                    }
                    let at = since.max(standing_since) + timeout / 2;
                    if tokio::time::Instant::now() >= at {
                        self.begin(&base, seq);
                    } else {
                        due = Some(at);
                    }
                }
                _ => {
                    if standing_by {
                        self.discard(&base);
                    }
                }
            }
            let sleep = async {
                match due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = seen.changed() => if changed.is_err() { return },
                changed = leading.changed() => if changed.is_err() { return },
                () = sleep => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basis() -> Basis {
        Basis {
            submit_first: 10,
            submit_last: 500,
            journal_records: 77,
            max_age: Duration::from_secs(3600),
        }
    }

    #[test]
    fn a_prepared_driver_leads_only_on_what_it_read() {
        let prepared = basis();
        assert_eq!(unusable(&prepared, &prepared), None);
        // Submissions arrived since (no record for them: the driver's
        // consumer reads them on).
        let more = Basis {
            submit_last: 900,
            ..prepared
        };
        assert_eq!(unusable(&prepared, &more), None);
        for (now, why) in [
            (
                Basis {
                    journal_records: 78,
                    ..more
                },
                "journal took a record",
            ),
            (
                Basis {
                    submit_first: 11,
                    ..more
                },
                "purged",
            ),
            (
                Basis {
                    submit_last: 499,
                    ..prepared
                },
                "holds less",
            ),
            (
                Basis {
                    max_age: Duration::from_secs(60),
                    ..more
                },
                "max age",
            ),
        ] {
            let refused = unusable(&prepared, &now).unwrap_or_default();
            assert!(refused.contains(why), "{now:?}: {refused}");
        }
    }
}

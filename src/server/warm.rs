//! This process's copy of the log state ([`WarmJournal`]): every server
//! that stands by follows the log ([`follow`]) and applies each entry with
//! the one apply function ([`crate::server::log::LogState::apply`]); the
//! leader applies its own entries as they are stored. So a standby holds
//! the leader's state by construction, and a takeover only reads the
//! tail. With `[server] warm_standby = false` nothing is followed: the
//! takeover loads the newest snapshot and reads the log after it
//! ([`WarmJournal::load`]), the same code a restarted standby starts with.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;

use super::log::{Entry, LogState};
use super::log_store::{
    apply_message, apply_stored, Appender, LogError, LogStore, ReadError, Reader,
};
use crate::wire::TaskRecord;

/// How long a takeover waits for the copy to catch up with the log
/// before it reads the rest itself.
pub(crate) const CATCH_UP_WAIT: Duration = Duration::from_secs(2);

/// What the log says of a submission.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Known {
    /// No record.
    None,
    /// Finished: nothing to run (its key, if it held one, was bound
    /// before: [`WarmJournal::keyed_finished`]).
    Finished(Option<Box<TaskRecord>>),
    /// Its latest record.
    Live(Box<TaskRecord>),
}

/// A copy of the log state, shared by the follower, the takeover and the
/// committer.
#[derive(Clone)]
pub(crate) struct WarmJournal {
    reader: Arc<Mutex<Reader>>,
    /// The servers' storage key: a message not sealed with it is none.
    seal: super::seal::Seal,
}

impl Default for WarmJournal {
    fn default() -> Self {
        WarmJournal::sealed(super::seal::Seal::none())
    }
}

impl WarmJournal {
    /// An empty copy that takes only messages sealed with `seal`.
    pub(crate) fn sealed(seal: super::seal::Seal) -> WarmJournal {
        WarmJournal {
            reader: Arc::new(Mutex::new(Reader {
                state: LogState::default(),
                assembler: Default::default(),
                read: 0,
            })),
            seal,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Reader> {
        self.reader.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the log says of submission `seq`.
    pub(crate) fn known(&self, seq: u64) -> Known {
        match self.lock().state.known(seq) {
            super::log::Known::None => Known::None,
            super::log::Known::Finished => Known::Finished(None),
            super::log::Known::Live(record) => Known::Live(record),
        }
    }

    /// The finished tasks that held a key, up to submission `upto`,
    /// oldest first (the record when it was small).
    pub(crate) fn keyed_finished(&self, upto: u64) -> Vec<(u64, Option<Box<TaskRecord>>)> {
        self.lock().state.keyed_finished(upto)
    }

    /// Every schedule's record.
    pub(crate) fn schedules(&self) -> Vec<crate::schedule::StoredSchedule> {
        self.lock().state.schedules().cloned().collect()
    }

    /// The last log sequence read.
    pub(crate) fn seen(&self) -> u64 {
        self.lock().read
    }

    /// The same: the log holds nothing but the leader's entries (a
    /// successor prepared ahead stays good while it does not move).
    pub(crate) fn records_seen(&self) -> u64 {
        self.seen()
    }

    /// Forgets what is below the submit stream's first sequence.
    pub(crate) fn prune_below(&self, first: u64) {
        self.lock().state.prune_below(first);
    }

    /// The state's snapshot bytes and the log sequence they cover.
    pub(crate) fn snapshot(&self) -> (u64, Vec<u8>) {
        let reader = self.lock();
        (reader.state.applied(), reader.state.snapshot())
    }

    /// Applies the log's message at `seq`, if it is the next one the copy
    /// reads ([`follow`], and the failover simulation's standbys).
    pub(crate) fn follow_message(&self, seq: u64, body: &[u8]) -> Followed {
        let mut reader = self.lock();
        if seq <= reader.read {
            return Followed::Behind;
        }
        if seq > reader.read + 1 {
            return Followed::Gap;
        }
        apply_message(&mut reader, &self.seal, seq, body);
        Followed::Applied
    }

    /// Replaces the copy with `reader` (a snapshot and the log after it).
    pub(crate) fn replace(&self, reader: Reader) {
        *self.lock() = reader;
    }

    /// Works on the copy's reader (the simulation's takeover).
    #[cfg(test)]
    pub(crate) fn with_reader<T>(&self, f: impl FnOnce(&mut Reader) -> T) -> T {
        f(&mut self.lock())
    }

    /// Applies an entry this process's leadership stored.
    pub(crate) fn apply_stored(&self, seq: u64, entry: &Entry) {
        apply_stored(&mut self.lock(), seq, entry);
    }

    /// Whether the copy has read the log up to `upto` within `wait`.
    pub(crate) async fn caught_up(&self, upto: u64, wait: Duration) -> bool {
        poll_until(wait, || self.seen() >= upto).await
    }

    /// Live records, finished tasks, keyed results.
    pub(crate) fn len(&self) -> (usize, usize, usize) {
        let (live, finished, _, keyed) = self.lock().state.len();
        (live, finished as usize, keyed)
    }

    /// Replaces the copy with the newest snapshot and the log after it.
    pub(crate) async fn load(&self, log: &LogStore) -> Result<(), LogError> {
        self.replace(log.load().await?);
        Ok(())
    }

    /// Takes over as leadership `epoch`: reads the log to its end and
    /// appends the takeover entry there (fenced). Returns the appender and
    /// the log sequence read before the takeover entry.
    pub(crate) async fn take_over(
        &self,
        log: &LogStore,
        epoch: u64,
        server: &str,
    ) -> Result<(Appender, u64), LogError> {
        // Worked on outside the lock (the follower is paused), then put
        // back.
        let mut reader = std::mem::replace(
            &mut *self.lock(),
            Reader {
                state: LogState::default(),
                assembler: Default::default(),
                read: 0,
            },
        );
        let taken = log.take_over(&mut reader, epoch, server).await;
        *self.lock() = reader;
        taken
    }
}

/// Where a message read from the log stands against the copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Followed {
    /// The next one: applied.
    Applied,
    /// Read already.
    Behind,
    /// Past the next one: the log was purged past the copy (a snapshot
    /// covers what it missed).
    Gap,
}

/// Polls `done` every 5 ms until it holds (`true`) or `wait` passes.
pub(crate) async fn poll_until(wait: Duration, done: impl Fn() -> bool) -> bool {
    let until = tokio::time::Instant::now() + wait;
    loop {
        if done() {
            return true;
        }
        if tokio::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Follows the log into `warm` while `paused` is false (it is true while
/// this process leads: the committer applies its own entries), from the
/// newest snapshot on; every minute, forgets what the submit stream no
/// longer holds. A log purged past the copy (a snapshot covers what it
/// missed) loads the snapshot again.
pub(crate) async fn follow(
    log: LogStore,
    submit_stream: jetstream::stream::Stream,
    warm: WarmJournal,
    mut paused: tokio::sync::watch::Receiver<bool>,
) {
    let mut prune = tokio::time::interval(Duration::from_secs(60));
    prune.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut loaded = false;
    loop {
        if *paused.borrow_and_update() {
            if paused.wait_for(|p| !*p).await.is_err() {
                return;
            }
            continue;
        }
        if !loaded {
            match warm.load(&log).await {
                Ok(()) => loaded = true,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot load the log; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            }
        }
        let from = warm.seen() + 1;
        let mut messages = match log.messages_from(from).await {
            Ok(m) => m,
            Err(ReadError::Gap) => {
                loaded = false;
                continue;
            }
            Err(ReadError::Nats(e)) => {
                tracing::debug!(error = %e, "cannot follow the log; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        loop {
            tokio::select! {
                message = futures_util::StreamExt::next(&mut messages) => match message {
                    Some(Ok((seq, body))) => match warm.follow_message(seq, &body) {
                        Followed::Applied => {}
                        // Read meanwhile by a takeover: go on from where
                        // the copy is.
                        Followed::Behind => break,
                        // Purged past us: load the snapshot again.
                        Followed::Gap => {
                            loaded = false;
                            break;
                        }
                    },
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "following the log interrupted; resuming");
                        break;
                    }
                    None => break,
                },
                _ = paused.changed() => break,
                _ = prune.tick() => {
                    let mut stream = submit_stream.clone();
                    if let Ok(info) = stream.info().await {
                        warm.prune_below(info.state.first_sequence);
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

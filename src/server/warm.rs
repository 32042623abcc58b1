//! A standby's warm copy of the journal (issue 8: "the others standing by
//! with state warm"). Every server, leader or not, watches the results
//! bucket from its start and keeps the latest record of each unfinished
//! task, and a mark for each finished one. At takeover the new leader
//! waits until its copy has seen the bucket up to its own takeover write
//! (the deposed leader's writes all come before it: they are fenced on the
//! same stream), then reads records from memory instead of one lookup per
//! unfinished submission. If the copy is not caught up within
//! [`CATCH_UP_WAIT`] (a watch that broke, say), the takeover reads the
//! bucket as before: warm is an optimization, never a second truth.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use futures_util::StreamExt;

use crate::wire::TaskRecord;

/// How long a takeover waits for the warm copy to catch up.
pub(crate) const CATCH_UP_WAIT: Duration = Duration::from_secs(2);

/// What the watch has seen.
#[derive(Default)]
struct Copy {
    /// The latest record of each unfinished task, by submission sequence.
    live: BTreeMap<u64, TaskRecord>,
    /// Tasks whose record is terminal.
    finished: BTreeSet<u64>,
    /// The last bucket revision (stream sequence) applied.
    seen: u64,
}

/// What the journal says of a submission (the warm copy, or a lookup).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Known {
    /// No record.
    None,
    /// Finished: skip it.
    Finished,
    /// Its latest record.
    Live(Box<TaskRecord>),
}

impl Known {
    /// What a record looked up in the bucket says.
    pub(crate) fn of(record: Option<TaskRecord>) -> Known {
        match record {
            None => Known::None,
            Some(r) if r.state.is_terminal() => Known::Finished,
            Some(r) => Known::Live(Box::new(r)),
        }
    }
}

/// A warm copy of the journal, shared by the watch and the takeover.
#[derive(Clone, Default)]
pub(crate) struct WarmJournal {
    copy: Arc<Mutex<Copy>>,
    /// The servers' storage key: an entry not sealed with it is none.
    seal: super::seal::Seal,
}

impl WarmJournal {
    /// An empty copy that takes only entries sealed with `seal`.
    pub(crate) fn sealed(seal: super::seal::Seal) -> WarmJournal {
        WarmJournal {
            seal,
            ..WarmJournal::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Copy> {
        self.copy.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies one bucket entry (keys that are not submission sequences,
    /// such as the leader key, only move `seen`).
    fn apply(&self, entry: &kv::Entry) {
        let mut copy = self.lock();
        copy.seen = copy.seen.max(entry.revision);
        let Ok(seq) = entry.key.parse::<u64>() else {
            return;
        };
        let body = match entry.operation {
            kv::Operation::Put => match self.seal.open(&entry.key, &entry.value) {
                Ok(body) => Some(body),
                // Forged over a record: keep the one this copy had.
                Err(why) => {
                    super::seal::log_refused("journal record", &entry.key, why);
                    return;
                }
            },
            _ => None,
        };
        match entry.operation {
            kv::Operation::Put => match TaskRecord::decode(body.unwrap_or_default()) {
                Ok(record) if record.state.is_terminal() => {
                    copy.live.remove(&seq);
                    copy.finished.insert(seq);
                }
                Ok(record) => {
                    copy.live.insert(seq, record);
                }
                Err(e) => {
                    // As a cold read would: an unreadable record is none.
                    tracing::warn!(seq, error = %e, "unreadable journal record ignored");
                    copy.live.remove(&seq);
                }
            },
            kv::Operation::Delete | kv::Operation::Purge => {
                copy.live.remove(&seq);
                copy.finished.remove(&seq);
            }
        }
    }

    /// The record of submission `seq`, as the bucket held it at the last
    /// revision seen.
    pub(crate) fn known(&self, seq: u64) -> Known {
        let copy = self.lock();
        if copy.finished.contains(&seq) {
            Known::Finished
        } else if let Some(record) = copy.live.get(&seq) {
            Known::Live(Box::new(record.clone()))
        } else {
            Known::None
        }
    }

    /// The last revision applied.
    pub(crate) fn seen(&self) -> u64 {
        self.lock().seen
    }

    /// Forgets tasks below `first` (purged from the submit stream: never
    /// read again).
    fn prune_below(&self, first: u64) {
        let mut copy = self.lock();
        copy.live = copy.live.split_off(&first);
        copy.finished = copy.finished.split_off(&first);
    }

    /// Waits until the copy has seen revision `upto`; false after `wait`.
    pub(crate) async fn caught_up(&self, upto: u64, wait: Duration) -> bool {
        let until = tokio::time::Instant::now() + wait;
        loop {
            if self.seen() >= upto {
                return true;
            }
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// How many tasks it holds (live, finished).
    pub(crate) fn len(&self) -> (usize, usize) {
        let copy = self.lock();
        (copy.live.len(), copy.finished.len())
    }
}

/// Keeps `warm` up to date with the results bucket, for the life of the
/// process: resumes after the last revision seen when the watch breaks,
/// and forgets tasks purged from the submit stream every minute.
///
/// While `paused` is true (this process leads: it is the journal's only
/// writer and has no use for a copy of what it writes), the watch is
/// dropped and the copy left as it was (the takeover may still be reading
/// it). Once `paused` is false again the watch resumes after the last
/// revision the copy saw, as after a broken watch: it delivers the latest
/// of every entry written since (the leadership's own records among
/// them), so the copy is whole again without reading the bucket from its
/// start. Following its own writes
/// cost a leader two deliveries, a decode and an insert per record: a
/// fifth of its throughput (`cargo bench --bench distributed`).
pub(crate) async fn follow(
    results: kv::Store,
    submit_stream: jetstream::stream::Stream,
    warm: WarmJournal,
    mut paused: tokio::sync::watch::Receiver<bool>,
) {
    let mut prune = tokio::time::interval(Duration::from_secs(60));
    prune.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if *paused.borrow_and_update() {
            if paused.wait_for(|p| !*p).await.is_err() {
                return;
            }
            continue;
        }
        let from = warm.seen() + 1;
        let mut watch = match results.watch_all_from_revision(from).await {
            Ok(w) => w,
            Err(e) => {
                tracing::debug!(error = %e, "cannot watch the journal; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        loop {
            tokio::select! {
                entry = watch.next() => match entry {
                    Some(Ok(entry)) => warm.apply(&entry),
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "journal watch interrupted; resuming");
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
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{PoolName, TaskId, TaskState};

    fn entry(key: &str, revision: u64, value: Option<&TaskRecord>) -> kv::Entry {
        kv::Entry {
            bucket: "B".into(),
            key: key.into(),
            value: value
                .map(|r| crate::wire::encode(r).into())
                .unwrap_or_default(),
            revision,
            delta: 0,
            created: time::OffsetDateTime::UNIX_EPOCH,
            operation: if value.is_some() {
                kv::Operation::Put
            } else {
                kv::Operation::Delete
            },
            seen_current: false,
        }
    }

    fn record(seq: u64, state: TaskState) -> TaskRecord {
        TaskRecord {
            v: crate::wire::PROTOCOL_VERSION,
            id: TaskId(seq),
            pool: PoolName::default(),
            state,
            attempts: Vec::new(),
            output: None,
            error: None,
            deadline_missed: false,
            written_at: None,
            schedule: None,
            scheduled_at: None,
        }
    }

    #[test]
    fn the_copy_keeps_the_latest_record_and_marks_finished_tasks() {
        let warm = WarmJournal::default();
        assert_eq!(warm.known(1), Known::None);
        warm.apply(&entry("1", 1, Some(&record(1, TaskState::Running))));
        warm.apply(&entry("_leader", 2, None));
        warm.apply(&entry("2", 3, Some(&record(2, TaskState::Running))));
        assert_eq!(warm.seen(), 3);
        assert!(matches!(warm.known(1), Known::Live(r) if r.state == TaskState::Running));
        warm.apply(&entry("1", 4, Some(&record(1, TaskState::Succeeded))));
        assert_eq!(warm.known(1), Known::Finished);
        warm.apply(&entry("2", 5, None));
        assert_eq!(warm.known(2), Known::None);
        assert_eq!(warm.len(), (0, 1));
        warm.prune_below(2);
        assert_eq!(warm.known(1), Known::None);
    }
}

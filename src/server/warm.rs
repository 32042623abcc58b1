//! A standby's warm copy of the journal (issue 8: "the others standing by
//! with state warm"). Every server, leader or not, watches the results
//! bucket from its start and keeps the latest record of each unfinished
//! task, and a mark for each finished one (and, for the newest
//! [`KEYED_KEPT`] finished tasks that held an idempotency key, that they
//! did: their keys bind again at takeover). At takeover the new leader
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

/// How many finished keyed tasks the copy remembers (the newest), also
/// once their submissions are purged: as many as a leader retains
/// finished tasks (`retain_finished`), so a successor binds the keys its
/// predecessor still held.
pub(crate) const KEYED_KEPT: usize = 10_000;

/// A finished keyed task's result is kept whole when its encoded body is
/// at most this large (so at most [`KEYED_KEPT`] × 4 KiB, 40 MiB, in
/// all), and handed over at takeover without a lookup; a larger one (a
/// large output) is kept as its id and read back then.
pub(crate) const KEPT_RECORD_BYTES: usize = 4096;

/// The key of the election's leader record in the results bucket
/// ([`crate::wire::Subjects::leader`]).
const LEADER_KEY: &str = "_leader";

/// What the watch has seen.
#[derive(Default)]
struct Copy {
    /// The latest record of each unfinished task, by submission sequence.
    live: BTreeMap<u64, TaskRecord>,
    /// Tasks whose record is terminal.
    finished: BTreeSet<u64>,
    /// The newest [`KEYED_KEPT`] of those whose record names a key; not
    /// pruned with the submit stream (their results outlive their
    /// submissions, and so must their keys).
    keyed: BTreeMap<u64, Option<Box<TaskRecord>>>,
    /// The last bucket revision (stream sequence) applied.
    seen: u64,
    /// The last revision applied that was not the leader's record (an
    /// election renewal): a journal record, whatever its key. A successor
    /// prepared while the leader was silent stays good while it does not
    /// move ([`super::successor`]).
    records_seen: u64,
}

impl Copy {
    /// Task `record.id` is finished (`whole`: keep its record if it names
    /// a key, else only its id).
    fn finish(&mut self, record: TaskRecord, whole: bool) {
        let seq = record.id.0;
        self.live.remove(&seq);
        self.finished.insert(seq);
        if record.key.is_some() {
            self.keyed.insert(seq, whole.then(|| Box::new(record)));
            if self.keyed.len() > KEYED_KEPT {
                self.keyed.pop_first();
            }
        }
    }
}

/// Result batch `key` as stored (`value`), its seal checked and its
/// results indexed; `None` (logged) if it is not sealed with the storage
/// key or cannot be read. The one reading of a batch for the watch and
/// for a cold takeover.
pub(crate) fn open_result_batch(
    seal: &super::seal::Seal,
    index: &super::result_index::ResultIndex,
    key: &str,
    value: &[u8],
) -> Option<crate::wire::ResultRecords> {
    let body = match seal.open(key, value) {
        Ok(body) => body,
        Err(why) => {
            super::seal::log_refused("result batch", key, why);
            return None;
        }
    };
    let batch = match crate::wire::decode::<crate::wire::ResultRecords>(body) {
        Ok(batch) => batch,
        Err(e) => {
            tracing::warn!(key, error = %e, "unreadable result batch ignored");
            return None;
        }
    };
    index.add(
        key,
        batch.written_at,
        batch.results.iter().map(|r| r.id.0).collect(),
    );
    Some(batch)
}

/// What the journal says of a submission (the warm copy, or a lookup).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Known {
    /// No record.
    None,
    /// Finished: nothing to run. The record when it names a key (read
    /// from the bucket; a warm copy hands its keyed results up front:
    /// [`WarmJournal::keyed_finished`]).
    Finished(Option<Box<TaskRecord>>),
    /// Its latest record.
    Live(Box<TaskRecord>),
}

impl Known {
    /// What a record looked up in the bucket says.
    pub(crate) fn of(record: Option<TaskRecord>) -> Known {
        match record {
            None => Known::None,
            Some(r) if r.state.is_terminal() => {
                Known::Finished(r.key.is_some().then(|| Box::new(r)))
            }
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
    /// Fed the result batches the watch sees (lookups once leading).
    index: super::result_index::ResultIndex,
}

impl WarmJournal {
    /// An empty copy that takes only entries sealed with `seal`, and
    /// indexes the result batches it sees in `index`.
    pub(crate) fn sealed(
        seal: super::seal::Seal,
        index: super::result_index::ResultIndex,
    ) -> WarmJournal {
        WarmJournal {
            seal,
            index,
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
        if entry.key != LEADER_KEY {
            copy.records_seen = copy.records_seen.max(entry.revision);
        }
        if crate::wire::is_result_key(&entry.key) {
            if entry.operation == kv::Operation::Put {
                self.apply_results(&mut copy, &entry.key, &entry.value);
            }
            return;
        }
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
                    let small = body.is_some_and(|b| b.len() <= KEPT_RECORD_BYTES);
                    copy.finish(record, small);
                }
                // A task finished in a result batch has no record of its
                // own to come; never let one undo the mark.
                Ok(record) if copy.finished.contains(&seq) => {
                    tracing::warn!(seq, state = %record.state, "live record of a finished task ignored");
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
                copy.keyed.remove(&seq);
            }
        }
    }

    /// Applies a result batch (`r.<epoch>.<n>`): each task in it is
    /// finished; the batch is indexed for lookups.
    fn apply_results(&self, copy: &mut Copy, key: &str, value: &[u8]) {
        let Some(batch) = open_result_batch(&self.seal, &self.index, key, value) else {
            return;
        };
        for record in batch.results {
            if record.state.is_terminal() {
                // Small by the leader's rule: kept whole.
                copy.finish(record, true);
            }
        }
    }

    /// The record of submission `seq`, as the bucket held it at the last
    /// revision seen.
    pub(crate) fn known(&self, seq: u64) -> Known {
        let copy = self.lock();
        if copy.finished.contains(&seq) || copy.keyed.contains_key(&seq) {
            Known::Finished(None)
        } else if let Some(record) = copy.live.get(&seq) {
            Known::Live(Box::new(record.clone()))
        } else {
            Known::None
        }
    }

    /// The finished tasks up to `upto` whose records name a key, oldest
    /// first (at most [`KEYED_KEPT`]), each with its record when kept
    /// whole (else a takeover reads it): their keys bind before anything
    /// else.
    pub(crate) fn keyed_finished(&self, upto: u64) -> Vec<(u64, Option<Box<TaskRecord>>)> {
        let copy = self.lock();
        copy.keyed
            .range(..=upto)
            .map(|(seq, record)| (*seq, record.clone()))
            .collect()
    }

    /// The last revision applied.
    pub(crate) fn seen(&self) -> u64 {
        self.lock().seen
    }

    /// The last revision applied that was not an election renewal.
    pub(crate) fn records_seen(&self) -> u64 {
        self.lock().records_seen
    }

    /// Forgets tasks below `first` (purged from the submit stream: never
    /// read again).
    fn prune_below(&self, first: u64) {
        let mut copy = self.lock();
        copy.live = copy.live.split_off(&first);
        copy.finished = copy.finished.split_off(&first);
        // `keyed` stays: bounded by count, and read at takeover.
    }

    /// Waits until the copy has seen revision `upto`; false after `wait`.
    pub(crate) async fn caught_up(&self, upto: u64, wait: Duration) -> bool {
        poll_until(wait, || self.seen() >= upto).await
    }

    /// How many tasks it holds (live, finished, finished with a key).
    pub(crate) fn len(&self) -> (usize, usize, usize) {
        let copy = self.lock();
        (copy.live.len(), copy.finished.len(), copy.keyed.len())
    }
}

/// Whether `done` holds within `wait` (checked every 5 ms).
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
            key: None,
        }
    }

    fn keyed(seq: u64, key: &str) -> TaskRecord {
        TaskRecord {
            key: Some(key.into()),
            ..record(seq, TaskState::Succeeded)
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
        // The leader's renewals move `seen` only.
        assert_eq!(warm.records_seen(), 3);
        warm.apply(&entry("_leader", 4, None));
        assert_eq!((warm.seen(), warm.records_seen()), (4, 3));
        assert!(matches!(warm.known(1), Known::Live(r) if r.state == TaskState::Running));
        warm.apply(&entry("1", 5, Some(&record(1, TaskState::Succeeded))));
        assert_eq!(warm.known(1), Known::Finished(None));
        warm.apply(&entry("2", 6, None));
        assert_eq!(warm.records_seen(), 6);
        assert_eq!(warm.known(2), Known::None);
        assert_eq!(warm.len(), (0, 1, 0));
        warm.prune_below(2);
        assert_eq!(warm.known(1), Known::None);
    }

    /// The ids `keyed_finished` names.
    fn ids(kept: &[(u64, Option<Box<TaskRecord>>)]) -> Vec<u64> {
        kept.iter().map(|(seq, _)| *seq).collect()
    }

    #[test]
    fn finished_keyed_tasks_outlive_the_purge_of_their_submissions_up_to_a_bound() {
        let warm = WarmJournal::default();
        warm.apply(&entry("3", 1, Some(&keyed(3, "k3"))));
        warm.apply(&entry("4", 2, Some(&record(4, TaskState::Succeeded))));
        let mut big = keyed(5, "k5");
        big.output = Some(vec![b'x'; KEPT_RECORD_BYTES].into());
        warm.apply(&entry("5", 3, Some(&big)));
        assert_eq!(warm.known(3), Known::Finished(None));
        assert_eq!(
            warm.keyed_finished(10),
            vec![(3, Some(Box::new(keyed(3, "k3")))), (5, None)],
            "a small result kept whole, a large one as its id"
        );
        assert_eq!(
            ids(&warm.keyed_finished(4)),
            vec![3],
            "only up to the takeover's last"
        );
        // The submit stream purged them all: the keyed ones stay.
        warm.prune_below(6);
        assert_eq!(warm.len(), (0, 0, 2));
        assert_eq!(ids(&warm.keyed_finished(10)), vec![3, 5]);
        // A deleted record takes its mark along.
        warm.apply(&entry("3", 4, None));
        assert_eq!(ids(&warm.keyed_finished(10)), vec![5]);
        // Bounded: the oldest go first.
        for seq in 10..10 + KEYED_KEPT as u64 {
            warm.apply(&entry(&seq.to_string(), seq, Some(&keyed(seq, "k"))));
        }
        let kept = warm.keyed_finished(u64::MAX);
        assert_eq!(kept.len(), KEYED_KEPT);
        assert_eq!(kept[0].0, 10);
    }

    #[test]
    fn a_result_batch_finishes_each_of_its_tasks_and_is_indexed() {
        let index = crate::server::result_index::ResultIndex::new(None);
        let warm = WarmJournal::sealed(crate::server::seal::Seal::default(), index.clone());
        warm.apply(&entry("3", 1, Some(&record(3, TaskState::Running))));
        let batch = crate::wire::ResultRecords {
            v: crate::wire::PROTOCOL_VERSION,
            written_at: crate::core::Millis(5),
            results: vec![record(3, TaskState::Succeeded), keyed(4, "k4")],
        };
        let mut e = entry("r.7.1", 2, None);
        e.value = crate::wire::encode(&batch).into();
        e.operation = kv::Operation::Put;
        warm.apply(&e);
        assert_eq!(warm.seen(), 2);
        assert_eq!(warm.known(3), Known::Finished(None));
        assert_eq!(warm.known(4), Known::Finished(None));
        assert_eq!(
            warm.keyed_finished(10),
            vec![(4, Some(Box::new(keyed(4, "k4"))))],
            "kept whole: a takeover binds its key without a lookup"
        );
        assert_eq!(index.lookup(3).as_deref(), Some("r.7.1"));
        assert_eq!(index.lookup(4).as_deref(), Some("r.7.1"));
        // A live record under its id afterwards does not undo it.
        warm.apply(&entry("3", 3, Some(&record(3, TaskState::Running))));
        assert_eq!(warm.known(3), Known::Finished(None));
        // An unreadable batch changes nothing but `seen`.
        let mut bad = entry("r.7.2", 4, None);
        bad.value = bytes::Bytes::from_static(b"\xc1 not a batch");
        bad.operation = kv::Operation::Put;
        warm.apply(&bad);
        assert_eq!(warm.seen(), 4);
        assert_eq!(warm.len(), (0, 2, 1));
    }

    #[test]
    fn a_record_read_cold_hands_over_a_finished_task_only_with_its_key() {
        assert_eq!(
            Known::of(Some(record(1, TaskState::Failed))),
            Known::Finished(None)
        );
        assert_eq!(
            Known::of(Some(keyed(1, "k"))),
            Known::Finished(Some(Box::new(keyed(1, "k"))))
        );
    }
}

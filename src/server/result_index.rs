//! Where a finished task's result lies when it is in a result batch
//! (`r.<epoch>.<n>`, [`crate::wire::ResultRecords`]) rather than under its
//! own id: an index from task id to batch key, for lookups of results the
//! leader no longer retains in memory. Pure (no I/O, no clock): the leader
//! feeds it the batches it writes, a standby the ones it watches, a cold
//! takeover the ones it reads; each says when it was written, and batches
//! older than the bucket's max age (`results_ttl`) are dropped as JetStream
//! drops them.
//!
//! Compact: a batch's ids are kept as runs of nearby ids (at most
//! [`GAP`] apart, spanning at most [`SPAN`]), each run a `u16` per id
//! beside its first id, so about 2 bytes per result plus a few dozen per
//! run (results finish roughly in submission order, so a turn's batch is
//! a few runs). A lookup scans the runs starting within [`SPAN`] below the
//! id.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use crate::core::Millis;

/// The largest gap between two ids of one run.
const GAP: u64 = 64;

/// The widest run: a lookup scans the runs starting this far below the id.
const SPAN: u64 = 4096;

struct Run {
    key: Arc<str>,
    /// Sorted offsets of its ids from the run's first id.
    offsets: Box<[u16]>,
}

#[derive(Default)]
struct Index {
    /// Runs by first id.
    runs: BTreeMap<u64, Run>,
    /// Batches oldest first: when written, and the first ids of their runs.
    batches: VecDeque<(Millis, Arc<str>, Vec<u64>)>,
    ids: usize,
}

/// The index, shared by the watch, the committer and the leader's API.
#[derive(Clone, Default)]
pub(crate) struct ResultIndex {
    inner: Arc<Mutex<Index>>,
    /// The bucket's max age: batches older than this are gone (`None`:
    /// kept for good).
    max_age: Option<Millis>,
}

impl ResultIndex {
    /// An index whose batches expire after `max_age` (`None`: never).
    pub(crate) fn new(max_age: Option<Millis>) -> ResultIndex {
        ResultIndex {
            inner: Arc::default(),
            max_age,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Batch `key`, written at `written_at`, holds the results of `ids`.
    /// Batches older than the max age at that time are dropped. Adding a
    /// batch again (a watch that resumed) changes nothing.
    pub(crate) fn add(&self, key: &str, written_at: Millis, mut ids: Vec<u64>) {
        ids.sort_unstable();
        ids.dedup();
        let mut index = self.lock();
        if let Some(max_age) = self.max_age {
            index.expire(Millis(written_at.0.saturating_sub(max_age.0)));
        }
        // Its lowest id starts one of its runs.
        let again = ids
            .first()
            .and_then(|first| index.runs.get(first))
            .is_some_and(|run| &*run.key == key);
        if ids.is_empty() || again {
            return;
        }
        let key: Arc<str> = key.into();
        let mut firsts = Vec::new();
        let mut i = 0;
        while i < ids.len() {
            let first = ids[i];
            let mut offsets = vec![0u16];
            let mut last = first;
            i += 1;
            while i < ids.len() && ids[i] - last <= GAP && ids[i] - first < SPAN {
                offsets.push((ids[i] - first) as u16);
                last = ids[i];
                i += 1;
            }
            index.ids += offsets.len();
            firsts.push(first);
            index.runs.insert(
                first,
                Run {
                    key: key.clone(),
                    offsets: offsets.into_boxed_slice(),
                },
            );
        }
        index.batches.push_back((written_at, key, firsts));
    }

    /// The key of the batch holding task `id`'s result, if one does.
    pub(crate) fn lookup(&self, id: u64) -> Option<Arc<str>> {
        let index = self.lock();
        index
            .runs
            .range(id.saturating_sub(SPAN - 1)..=id)
            .rev()
            .find_map(|(first, run)| {
                let offset = u16::try_from(id - first).ok()?;
                run.offsets
                    .binary_search(&offset)
                    .is_ok()
                    .then(|| run.key.clone())
            })
    }

    /// Results indexed (tests, logs).
    pub(crate) fn len(&self) -> usize {
        self.lock().ids
    }
}

impl Index {
    /// Drops the batches written before `before`.
    fn expire(&mut self, before: Millis) {
        while self.batches.front().is_some_and(|(at, _, _)| *at < before) {
            let (_, key, firsts) = self.batches.pop_front().expect("a batch");
            for first in firsts {
                if self.runs.get(&first).is_some_and(|r| r.key == key) {
                    let run = self.runs.remove(&first).expect("a run");
                    self.ids -= run.offsets.len();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_id_finds_its_batch_and_no_other() {
        let index = ResultIndex::new(None);
        index.add("r.1.1", Millis(10), vec![5, 3, 4, 200, 100_000]);
        index.add("r.1.2", Millis(11), vec![6, 7, 201, 5_000]);
        for (id, key) in [
            (3, Some("r.1.1")),
            (4, Some("r.1.1")),
            (5, Some("r.1.1")),
            (200, Some("r.1.1")),
            (100_000, Some("r.1.1")),
            (6, Some("r.1.2")),
            (7, Some("r.1.2")),
            (201, Some("r.1.2")),
            (5_000, Some("r.1.2")),
            (1, None),
            (8, None),
            (199, None),
            (4_999, None),
            (99_999, None),
            (100_001, None),
        ] {
            assert_eq!(index.lookup(id).as_deref(), key, "id {id}");
        }
        assert_eq!(index.len(), 9);
        // Again (a resumed watch): nothing changes.
        index.add("r.1.2", Millis(11), vec![6, 7, 201, 5_000]);
        assert_eq!(index.len(), 9);
    }

    #[test]
    fn a_run_is_at_most_span_wide_and_ids_far_apart_start_new_runs() {
        let index = ResultIndex::new(None);
        let ids: Vec<u64> = (0..3 * SPAN).step_by(GAP as usize).collect();
        index.add("r.1.1", Millis(1), ids.clone());
        let sparse: Vec<u64> = (0..100).map(|i| 1_000_000 + i * (GAP + 1)).collect();
        index.add("r.1.2", Millis(1), sparse.clone());
        for id in ids {
            assert_eq!(index.lookup(id).as_deref(), Some("r.1.1"), "id {id}");
            assert_eq!(index.lookup(id + 1), None);
        }
        for id in sparse {
            assert_eq!(index.lookup(id).as_deref(), Some("r.1.2"), "id {id}");
        }
    }

    #[test]
    fn batches_older_than_the_max_age_are_dropped() {
        let index = ResultIndex::new(Some(Millis(100)));
        index.add("r.1.1", Millis(1_000), vec![1, 2]);
        index.add("r.1.2", Millis(1_050), vec![3]);
        index.add("r.2.1", Millis(1_101), vec![4]);
        assert_eq!(index.lookup(1), None, "written 101 ms before the newest");
        assert_eq!(index.lookup(3).as_deref(), Some("r.1.2"));
        assert_eq!(index.lookup(4).as_deref(), Some("r.2.1"));
        assert_eq!(index.len(), 2);
        let forever = ResultIndex::new(None);
        forever.add("r.1.1", Millis(0), vec![1]);
        forever.add("r.1.2", Millis(u64::MAX / 2), vec![2]);
        assert_eq!(forever.lookup(1).as_deref(), Some("r.1.1"));
    }
}

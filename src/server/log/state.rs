//! The state the log describes, and the one function that applies an
//! entry to it ([`LogState::apply`]). The leader applies each of its
//! entries once it is stored; a standby applies each entry it reads; a
//! takeover loads the newest snapshot and applies the tail. So every
//! server that has read the log to the same entry holds the same state,
//! and nothing in it expires: a finished task stays finished while its
//! submission is in the submit stream ([`LogState::prune_below`] forgets
//! it only once the submission is purged).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Entry, Item};
use crate::schedule::StoredSchedule;
use crate::wire::TaskRecord;

/// How many finished tasks that held an idempotency key the state
/// remembers (the newest), also once their submissions are purged: as
/// many as a leader retains finished tasks, so a successor binds the keys
/// its predecessor still held.
pub(crate) const KEYED_KEPT: usize = 10_000;

/// A finished keyed task's result is kept whole when its encoded record
/// is at most this large (at most [`KEYED_KEPT`] × 4 KiB, 40 MiB, in
/// all); a larger one (a large output) is kept as its id, its result read
/// from the results bucket when asked for.
pub(crate) const KEPT_RECORD_BYTES: usize = 4096;

/// What the log says of a submission.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Known {
    /// Nothing: it waits to be admitted.
    None,
    /// Finished: nothing to run.
    Finished,
    /// Its latest record (attempts so far).
    Live(Box<TaskRecord>),
}

/// Sequences in runs: `start → end` (both included), runs apart. A
/// million tasks finished one after another are one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Runs(BTreeMap<u64, u64>);

impl Runs {
    pub(crate) fn contains(&self, seq: u64) -> bool {
        self.0
            .range(..=seq)
            .next_back()
            .is_some_and(|(_, &end)| seq <= end)
    }

    pub(crate) fn insert(&mut self, seq: u64) {
        if self.contains(seq) {
            return;
        }
        let before = self
            .0
            .range(..seq)
            .next_back()
            .filter(|(_, &end)| end + 1 == seq)
            .map(|(&start, _)| start);
        let after = seq.checked_add(1).and_then(|next| self.0.remove(&next));
        match (before, after) {
            (Some(start), Some(end)) => {
                self.0.insert(start, end);
            }
            (Some(start), None) => {
                self.0.insert(start, seq);
            }
            (None, Some(end)) => {
                self.0.insert(seq, end);
            }
            (None, None) => {
                self.0.insert(seq, seq);
            }
        }
    }

    /// Forgets every sequence below `first`.
    pub(crate) fn remove_below(&mut self, first: u64) {
        let mut kept = self.0.split_off(&first);
        if let Some((&start, &end)) = self.0.iter().next_back() {
            if start < first && end >= first {
                kept.insert(first, end);
            }
        }
        self.0 = kept;
    }

    /// How many sequences.
    pub(crate) fn count(&self) -> u64 {
        self.0.iter().map(|(s, e)| e - s + 1).sum()
    }

    /// How many runs.
    pub(crate) fn runs(&self) -> usize {
        self.0.len()
    }
}

/// The leader's durable state as the log describes it.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct LogState {
    /// The latest record of each unfinished task that has one, by
    /// submission sequence.
    live: BTreeMap<u64, TaskRecord>,
    /// Finished tasks whose submissions may still be in the submit stream.
    finished: Runs,
    /// The newest [`KEYED_KEPT`] finished tasks that held a key: the
    /// record when small, else only that it did. Kept past the floor.
    keyed: BTreeMap<u64, Option<Box<TaskRecord>>>,
    /// Every schedule's record, by name.
    schedules: BTreeMap<String, StoredSchedule>,
    /// The current leadership and its last entry applied (`None`: only
    /// its takeover… not even that).
    epoch: u64,
    last_n: Option<u64>,
    /// The log sequence of the last message applied.
    applied: u64,
    /// Submissions below it are purged: nothing below is kept.
    floor: u64,
}

impl LogState {
    /// Applies `entry`, whose last message has log sequence `seq`. The
    /// one way state changes, on every server alike.
    pub(crate) fn apply(&mut self, seq: u64, entry: &Entry) {
        self.applied = self.applied.max(seq);
        if entry.epoch != self.epoch {
            self.epoch = entry.epoch;
        }
        self.last_n = Some(entry.n);
        for item in &entry.items {
            match item {
                Item::Task(record) => self.apply_task(record),
                Item::Schedule(name, Some(stored)) => {
                    self.schedules.insert(name.clone(), (**stored).clone());
                }
                Item::Schedule(name, None) => {
                    self.schedules.remove(name);
                }
                Item::Takeover { .. } => {}
            }
        }
    }

    fn apply_task(&mut self, record: &TaskRecord) {
        let seq = record.id.0;
        if record.state.is_terminal() {
            self.live.remove(&seq);
            if seq >= self.floor {
                self.finished.insert(seq);
            }
            if record.key.is_some() {
                let small = crate::wire::encode(record).len() <= KEPT_RECORD_BYTES;
                self.keyed
                    .insert(seq, small.then(|| Box::new(record.clone())));
                if self.keyed.len() > KEYED_KEPT {
                    self.keyed.pop_first();
                }
            }
        } else if seq >= self.floor && !self.finished.contains(seq) {
            // A finished task never lives again (a deposed leader's
            // record after a successor's result cannot be in the log; a
            // forged one is not applied).
            self.live.insert(seq, record.clone());
        }
    }

    /// The submit stream's first sequence is now `first`: forget what is
    /// below it (the keyed results stay: their keys outlive their
    /// submissions).
    pub(crate) fn prune_below(&mut self, first: u64) {
        if first <= self.floor {
            return;
        }
        self.floor = first;
        self.live = self.live.split_off(&first);
        self.finished.remove_below(first);
    }

    /// What the log says of submission `seq`.
    pub(crate) fn known(&self, seq: u64) -> Known {
        if self.finished.contains(seq) || self.keyed.contains_key(&seq) {
            Known::Finished
        } else if let Some(record) = self.live.get(&seq) {
            Known::Live(Box::new(record.clone()))
        } else {
            Known::None
        }
    }

    /// The finished tasks that held a key, up to submission `upto`,
    /// oldest first, with their records when kept whole.
    pub(crate) fn keyed_finished(&self, upto: u64) -> Vec<(u64, Option<Box<TaskRecord>>)> {
        self.keyed
            .range(..=upto)
            .map(|(seq, record)| (*seq, record.clone()))
            .collect()
    }

    /// Every schedule's record.
    pub(crate) fn schedules(&self) -> impl Iterator<Item = &StoredSchedule> {
        self.schedules.values()
    }

    /// The log sequence of the last message applied.
    pub(crate) fn applied(&self) -> u64 {
        self.applied
    }

    /// The current leadership, and the number of its last entry applied.
    pub(crate) fn position(&self) -> (u64, Option<u64>) {
        (self.epoch, self.last_n)
    }

    /// Live records, finished tasks (and their runs), keyed results.
    pub(crate) fn len(&self) -> (usize, u64, usize, usize) {
        (
            self.live.len(),
            self.finished.count(),
            self.finished.runs(),
            self.keyed.len(),
        )
    }

    /// The state as a snapshot's bytes.
    pub(crate) fn snapshot(&self) -> Vec<u8> {
        crate::wire::encode(&Snapshot {
            v: 1,
            applied: self.applied,
            epoch: self.epoch,
            last_n: self.last_n,
            floor: self.floor,
            live: self.live.values().collect(),
            finished: self.finished.0.iter().map(|(s, e)| (*s, *e)).collect(),
            keyed: self
                .keyed
                .iter()
                .map(|(seq, r)| (*seq, r.as_deref()))
                .collect(),
            schedules: self.schedules.values().collect(),
        })
    }

    /// The state a snapshot's bytes describe.
    pub(crate) fn from_snapshot(bytes: &[u8]) -> Result<LogState, String> {
        let s: SnapshotOwned = crate::wire::decode(bytes).map_err(|e| e.message)?;
        if s.v != 1 {
            return Err(format!("snapshot version {} is not known", s.v));
        }
        Ok(LogState {
            live: s.live.into_iter().map(|r| (r.id.0, r)).collect(),
            finished: Runs(s.finished.into_iter().collect()),
            keyed: s
                .keyed
                .into_iter()
                .map(|(seq, r)| (seq, r.map(Box::new)))
                .collect(),
            schedules: s
                .schedules
                .into_iter()
                .map(|s| (s.spec.name.clone(), s))
                .collect(),
            epoch: s.epoch,
            last_n: s.last_n,
            applied: s.applied,
            floor: s.floor,
        })
    }
}

/// A snapshot as written (borrowing the state).
#[derive(Serialize)]
struct Snapshot<'a> {
    v: u16,
    applied: u64,
    epoch: u64,
    last_n: Option<u64>,
    floor: u64,
    live: Vec<&'a TaskRecord>,
    finished: Vec<(u64, u64)>,
    keyed: Vec<(u64, Option<&'a TaskRecord>)>,
    schedules: Vec<&'a StoredSchedule>,
}

/// A snapshot as read.
#[derive(Deserialize)]
struct SnapshotOwned {
    v: u16,
    applied: u64,
    epoch: u64,
    last_n: Option<u64>,
    floor: u64,
    live: Vec<TaskRecord>,
    finished: Vec<(u64, u64)>,
    keyed: Vec<(u64, Option<TaskRecord>)>,
    schedules: Vec<StoredSchedule>,
}

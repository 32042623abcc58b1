//! The committer's rules without its I/O (issue 35): what a driver turn
//! stores and announces ([`turn_of`], the runner's part), one group
//! commit's log entry ([`group`]), and which groups may be announced once
//! an entry is stored ([`Announcer`]). The committer (`committer.rs`) and
//! the failover simulation (`server::sim`) both run this code; the shell
//! only sends, awaits and publishes.

use std::collections::VecDeque;

use crate::core::PoolName;
use crate::server::driver::Output;
use crate::server::log::Item as LogItem;
use crate::wire::{self, TaskRecord, WireError};

/// A task's record to store (a live task's attempts, or a finished
/// task's result); a refused submission's dead letter to write first.
pub(in crate::server) struct Persisted {
    pub(in crate::server) seq: u64,
    pub(in crate::server) record: TaskRecord,
    pub(in crate::server) dead_letter: Option<WireError>,
}

/// What one turn stores.
// Task records are nearly every item: boxing them would cost an
// allocation per record written.
#[allow(clippy::large_enum_variant)]
pub(in crate::server) enum Item {
    /// A task's record.
    Task(Persisted),
    /// A schedule's record; `None`: deleted.
    Schedule(String, Option<Box<crate::schedule::StoredSchedule>>),
}

/// What one driver turn produced: records to store, then what to announce.
#[derive(Default)]
pub(in crate::server) struct Turn {
    pub(in crate::server) records: Vec<Item>,
    pub(in crate::server) announce: Vec<Output>,
}

impl Turn {
    /// Nothing to store or announce.
    pub(in crate::server) fn is_empty(&self) -> bool {
        self.records.is_empty() && self.announce.is_empty()
    }
}

/// A turn's outputs as what it stores and what it announces, in the
/// driver's order. `finished(seq)` hears of every result stored (its
/// submission must not be purged before it is); a discarded duplicate
/// has no result (the purge takes it).
pub(in crate::server) fn turn_of(
    outputs: impl ExactSizeIterator<Item = Output>,
    mut finished: impl FnMut(u64),
) -> Turn {
    let mut turn = Turn {
        records: Vec::new(),
        announce: Vec::with_capacity(outputs.len()),
    };
    for output in outputs {
        match output {
            Output::Persist {
                seq,
                record,
                dead_letter,
            } => {
                if record.state.is_terminal() {
                    finished(seq);
                }
                turn.records.push(Item::Task(Persisted {
                    seq,
                    record,
                    dead_letter,
                }));
            }
            Output::PersistSchedule { name, stored } => {
                turn.records.push(Item::Schedule(name, stored))
            }
            Output::Discard { .. } => {}
            announce => turn.announce.push(announce),
        }
    }
    turn
}

/// A stored group's turn, ready to announce.
pub(in crate::server) struct Released {
    pub(in crate::server) announce: Vec<Output>,
    /// Tasks whose results it stored.
    pub(in crate::server) terminal: Vec<u64>,
}

/// One group commit waiting for its entry (or, with nothing to store, for
/// the entries before it).
pub(in crate::server) struct Queued {
    stored: bool,
    pub(in crate::server) turns: Vec<Released>,
    /// Finished tasks' records, encoded, for the results bucket (lookups
    /// only) once stored.
    pub(in crate::server) results: Vec<(u64, Vec<u8>)>,
}

/// One group commit: its entry's items (none: it stores nothing), the
/// refused submissions to copy to the dead-letter stream before the entry
/// is appended, and what it announces once stored.
pub(in crate::server) struct Group {
    pub(in crate::server) items: Vec<LogItem>,
    pub(in crate::server) dead_letters: Vec<(u64, PoolName, WireError)>,
    pub(in crate::server) queued: Queued,
}

/// The turns of one group commit, in order, as one log entry.
pub(in crate::server) fn group(turns: Vec<Turn>) -> Group {
    let items = turns.iter().map(|t| t.records.len()).sum();
    let mut entry = Vec::with_capacity(items);
    let mut dead_letters = Vec::new();
    let mut queued = Queued {
        stored: false,
        turns: Vec::with_capacity(turns.len()),
        results: Vec::new(),
    };
    for turn in turns {
        let mut terminal = Vec::new();
        for item in turn.records {
            match item {
                Item::Task(p) => {
                    if let Some(reason) = p.dead_letter {
                        dead_letters.push((p.seq, p.record.pool.clone(), reason));
                    }
                    if p.record.state.is_terminal() {
                        terminal.push(p.seq);
                        queued.results.push((p.seq, wire::encode(&p.record)));
                    }
                    entry.push(LogItem::Task(p.record));
                }
                Item::Schedule(name, stored) => entry.push(LogItem::Schedule(name, stored)),
            }
        }
        queued.turns.push(Released {
            announce: turn.announce,
            terminal,
        });
    }
    queued.stored = !entry.is_empty();
    Group {
        items: entry,
        dead_letters,
        queued,
    }
}

/// Which group commits may be announced: each once its entry and every
/// earlier one are stored (a group that stores nothing, once the entries
/// before it are).
#[derive(Default)]
pub(in crate::server) struct Announcer {
    queue: VecDeque<Queued>,
}

impl Announcer {
    /// A group built (its entry, if any, sent): returned at once when it
    /// stores nothing and no entry is awaited before it.
    pub(in crate::server) fn push(&mut self, queued: Queued) -> Option<Queued> {
        if !queued.stored && self.queue.is_empty() {
            return Some(queued);
        }
        self.queue.push_back(queued);
        None
    }

    /// The next entry sent is stored: its group, then every group queued
    /// behind it that stores nothing.
    pub(in crate::server) fn stored(&mut self) -> Vec<Queued> {
        let mut out = Vec::new();
        while let Some(q) = self.queue.front() {
            if q.stored && !out.is_empty() {
                break;
            }
            out.push(self.queue.pop_front().expect("front"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::TaskState;

    fn record(seq: u64, state: TaskState) -> Output {
        Output::Persist {
            seq,
            record: crate::server::log::tests::record(seq, state),
            dead_letter: None,
        }
    }

    fn reply() -> Output {
        Output::Publish {
            subject: "x".into(),
            body: bytes::Bytes::new(),
        }
    }

    #[test]
    fn a_turn_announces_once_its_entry_and_every_earlier_one_are_stored() {
        let mut finished = Vec::new();
        let one = turn_of(
            vec![record(1, TaskState::Running), reply()].into_iter(),
            |s| finished.push(s),
        );
        let two = turn_of(
            vec![record(2, TaskState::Succeeded), Output::Discard { seq: 3 }].into_iter(),
            |s| finished.push(s),
        );
        assert_eq!(finished, [2]);
        let first = group(vec![one, two]);
        assert_eq!(first.items.len(), 2);
        assert_eq!(first.queued.results.len(), 1);
        let mut announcer = Announcer::default();
        assert!(
            announcer.push(first.queued).is_none(),
            "waits for its entry"
        );
        // Nothing to store, but an entry before it is awaited.
        let quiet = group(vec![turn_of(vec![reply()].into_iter(), |_| {})]);
        assert!(quiet.items.is_empty());
        assert!(announcer.push(quiet.queued).is_none());
        let second = group(vec![turn_of(
            vec![record(4, TaskState::Running)].into_iter(),
            |_| {},
        )]);
        assert!(announcer.push(second.queued).is_none());
        // The first entry's two turns, then the quiet one behind it.
        let released: Vec<usize> = announcer.stored().iter().map(|q| q.turns.len()).collect();
        assert_eq!(released, [2, 1]);
        assert_eq!(announcer.stored().len(), 1);
        // Nothing awaited: at once.
        let quiet = group(vec![turn_of(vec![reply()].into_iter(), |_| {})]);
        assert!(announcer.push(quiet.queued).is_some());
    }
}

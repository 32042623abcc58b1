//! The committer's ordering as a pure state machine (no I/O, no clock):
//! which journal writes may start, and which turns may be announced.
//!
//! Two rules make "a state change is stored before anyone hears of it":
//!
//! - **a task's records land in order**: a write waits until every earlier
//!   write of its tasks is stored (within one group commit the latest
//!   record of a task stands for the ones before it);
//! - **a turn is announced only when it and every earlier turn are
//!   stored**: turns are released oldest first, each once all its writes
//!   are stored.
//!
//! Start records rely on the second: the shell tells the driver a turn is
//! stored ([`crate::server::driver::Input::Stored`]) only when the
//! pipeline releases it, and the driver writes a start-record slot again
//! only after the turn that covered its last entry is stored; so a slot
//! write never waits on anything here, and nothing waits on it.
//!
//! Writes are either one record each (at most `max_records` started at
//! once) or, in batch mode, atomic batches of up to `max_batch` records (at
//! most `max_batches` started at once; a record that must go alone, such as
//! a refused submission's, is still written by itself). While writes wait
//! for room the pipeline takes no new turns ([`Pipeline::accepting`]): the
//! turns queue in front of it and the next group commit takes them all.
//!
//! The committer (`committer.rs`) carries the writes out against
//! JetStream; the failover simulation (`server/sim/`) lands them, or not,
//! in whatever order the pipeline allows.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

/// A write's number, unique in one pipeline.
pub(crate) type WriteId = u64;

/// One record of a turn.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Record<W> {
    /// The task it belongs to (`None`: start records, which no task's
    /// order involves).
    pub(crate) task: Option<u64>,
    /// The task's result: once stored, its submission may be purged.
    pub(crate) terminal: bool,
    /// Other tasks whose results it stores (a result batch's): once
    /// stored, their submissions may be purged.
    pub(crate) finished: Vec<u64>,
    /// Written by itself and never left out for a later record of its
    /// task (a refused submission's: its dead letter goes first).
    pub(crate) alone: bool,
    pub(crate) body: W,
}

/// What one driver turn hands the committer: records to store, then what
/// to announce.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Turn<W, A> {
    /// The driver's turn number.
    pub(crate) number: u64,
    pub(crate) records: Vec<Record<W>>,
    pub(crate) announce: Vec<A>,
}

impl<W, A> Default for Turn<W, A> {
    fn default() -> Self {
        Turn {
            number: 0,
            records: Vec::new(),
            announce: Vec::new(),
        }
    }
}

/// A write the shell must carry out now.
#[derive(Debug, PartialEq)]
pub(crate) struct Write<W> {
    pub(crate) id: WriteId,
    /// An atomic batch (all or none), else one record.
    pub(crate) batch: bool,
    pub(crate) records: Vec<Record<W>>,
}

/// A turn (or a group of turns taken together) whose writes, and every
/// earlier turn's, are stored: announce it.
#[derive(Debug, PartialEq)]
pub(crate) struct Released<A> {
    /// The newest turn number of the group.
    pub(crate) number: u64,
    pub(crate) announce: Vec<A>,
    /// Tasks whose results it stored.
    pub(crate) terminal: Vec<u64>,
}

/// How writes are made and how many may be under way.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Single-record writes under way at most.
    pub(crate) max_records: usize,
    /// Atomic batches under way at most.
    pub(crate) max_batches: usize,
    /// Records in one atomic batch at most.
    pub(crate) max_batch: usize,
}

struct Planned<W> {
    write: Write<W>,
    /// Earlier writes of its tasks not yet stored.
    waits: usize,
    group: u64,
}

struct Group<A> {
    id: u64,
    number: u64,
    /// Its writes not yet stored.
    left: usize,
    announce: Vec<A>,
    terminal: Vec<u64>,
}

/// The committer's ordering; see the module docs.
pub(crate) struct Pipeline<W, A> {
    limits: Limits,
    next_write: WriteId,
    next_group: u64,
    /// Writes planned and not started: waiting for earlier writes of their
    /// tasks, or for room.
    planned: FxHashMap<WriteId, Planned<W>>,
    /// Started and not yet stored: write → its group and tasks (one, but
    /// for a batch: kept inline).
    under_way: FxHashMap<WriteId, (u64, bool, SmallVec<[u64; 1]>)>,
    /// Writes whose earlier writes are stored, waiting for room.
    ready_records: VecDeque<WriteId>,
    ready_batches: VecDeque<WriteId>,
    records_under_way: usize,
    batches_under_way: usize,
    /// Each task's newest write not yet stored.
    last_write: FxHashMap<u64, WriteId>,
    /// Who waits for a write.
    dependents: FxHashMap<WriteId, Vec<WriteId>>,
    groups: VecDeque<Group<A>>,
}

impl<W, A> Pipeline<W, A> {
    pub(crate) fn new(limits: Limits) -> Self {
        Pipeline {
            limits,
            next_write: 0,
            next_group: 0,
            planned: FxHashMap::default(),
            under_way: FxHashMap::default(),
            ready_records: VecDeque::new(),
            ready_batches: VecDeque::new(),
            records_under_way: 0,
            batches_under_way: 0,
            last_write: FxHashMap::default(),
            dependents: FxHashMap::default(),
            groups: VecDeque::new(),
        }
    }

    /// Whether to take the next turns now: no write waits for room (so
    /// turns queue while the journal is busy, and the next group commit
    /// takes them all); in batch mode, no batch under way either.
    pub(crate) fn accepting(&self, batches: bool) -> bool {
        self.ready_records.is_empty()
            && self.ready_batches.is_empty()
            && (!batches || self.batches_under_way < self.limits.max_batches)
    }

    /// Writes started and not yet stored.
    #[cfg(test)]
    pub(crate) fn under_way(&self) -> usize {
        self.under_way.len()
    }

    /// Turns not yet released.
    #[cfg(test)]
    pub(crate) fn turns_waiting(&self) -> usize {
        self.groups.len()
    }

    /// Takes a group commit: these turns, in order, their records written
    /// one by one or (`batches`) in atomic batches. Returns the writes to
    /// start now.
    pub(crate) fn push(&mut self, turns: Vec<Turn<W, A>>, batches: bool) -> Vec<Write<W>> {
        let group = self.next_group;
        self.next_group += 1;
        let mut number = 0;
        let mut announce = Vec::new();
        let mut records = Vec::new();
        for turn in turns {
            number = number.max(turn.number);
            if announce.is_empty() {
                announce = turn.announce;
            } else {
                announce.extend(turn.announce);
            }
            records.extend(turn.records);
        }
        // The latest record of each task stands for the ones before it.
        let mut latest: FxHashMap<u64, usize> = FxHashMap::default();
        for (i, r) in records.iter().enumerate() {
            if let Some(task) = r.task {
                latest.insert(task, i);
            }
        }
        let mut terminal = Vec::new();
        let mut writes: Vec<Write<W>> = Vec::new();
        let mut batch: Option<Write<W>> = None;
        for (i, record) in records.into_iter().enumerate() {
            let keep = record.alone || record.task.map_or(true, |t| latest.get(&t) == Some(&i));
            if !keep {
                continue;
            }
            if record.terminal {
                terminal.extend(record.task);
            }
            terminal.extend_from_slice(&record.finished);
            // A task's record or a result batch joins the atomic batch; a
            // record that must go alone, or one of neither kind (a
            // schedule's), goes by itself.
            let joins = record.task.is_some() || !record.finished.is_empty();
            if batches && !record.alone && joins {
                let full = batch
                    .as_ref()
                    .is_some_and(|b| b.records.len() >= self.limits.max_batch.max(1));
                if full {
                    writes.extend(batch.take());
                }
                let b = batch.get_or_insert_with(|| Write {
                    id: 0,
                    batch: true,
                    records: Vec::new(),
                });
                b.records.push(record);
                continue;
            }
            writes.push(Write {
                id: 0,
                batch: false,
                records: vec![record],
            });
        }
        writes.extend(batch);
        self.groups.push_back(Group {
            id: group,
            number,
            left: writes.len(),
            announce,
            terminal,
        });
        for mut write in writes {
            self.next_write += 1;
            let id = self.next_write;
            write.id = id;
            let mut waits = 0;
            for task in write.records.iter().filter_map(|r| r.task) {
                if let Some(before) = self.last_write.insert(task, id) {
                    if before != id {
                        self.dependents.entry(before).or_default().push(id);
                        waits += 1;
                    }
                }
            }
            if waits == 0 {
                self.ready(id, write.batch);
            }
            self.planned.insert(
                id,
                Planned {
                    write,
                    waits,
                    group,
                },
            );
        }
        self.start()
    }

    fn ready(&mut self, id: WriteId, batch: bool) {
        if batch {
            self.ready_batches.push_back(id);
        } else {
            self.ready_records.push_back(id);
        }
    }

    /// The ready writes there is room for.
    fn start(&mut self) -> Vec<Write<W>> {
        let mut started = Vec::new();
        while self.records_under_way < self.limits.max_records.max(1) {
            let Some(id) = self.ready_records.pop_front() else {
                break;
            };
            self.records_under_way += 1;
            started.push(self.launch(id));
        }
        while self.batches_under_way < self.limits.max_batches.max(1) {
            let Some(id) = self.ready_batches.pop_front() else {
                break;
            };
            self.batches_under_way += 1;
            started.push(self.launch(id));
        }
        started
    }

    fn launch(&mut self, id: WriteId) -> Write<W> {
        let planned = self.planned.remove(&id).expect("a planned write");
        let tasks = planned
            .write
            .records
            .iter()
            .filter_map(|r| r.task)
            .collect();
        self.under_way
            .insert(id, (planned.group, planned.write.batch, tasks));
        planned.write
    }

    /// Write `id` is stored. Returns the writes that may start now.
    pub(crate) fn stored(&mut self, id: WriteId) -> Vec<Write<W>> {
        let Some((group, batch, tasks)) = self.under_way.remove(&id) else {
            return Vec::new();
        };
        if batch {
            self.batches_under_way -= 1;
        } else {
            self.records_under_way -= 1;
        }
        for task in tasks {
            if self.last_write.get(&task) == Some(&id) {
                self.last_write.remove(&task);
            }
        }
        for next in self.dependents.remove(&id).unwrap_or_default() {
            let Some(p) = self.planned.get_mut(&next) else {
                continue;
            };
            p.waits -= 1;
            if p.waits == 0 {
                let batch = p.write.batch;
                self.ready(next, batch);
            }
        }
        // Groups are numbered in order: the oldest left is at the front.
        let front = self.groups.front().map_or(0, |g| g.id);
        if let Some(g) = self.groups.get_mut((group - front) as usize) {
            g.left -= 1;
        }
        self.start()
    }

    /// The oldest turn (group), if it and every earlier one are stored.
    pub(crate) fn release(&mut self) -> Option<Released<A>> {
        if self.groups.front()?.left > 0 {
            return None;
        }
        let g = self.groups.pop_front()?;
        Some(Released {
            number: g.number,
            announce: g.announce,
            terminal: g.terminal,
        })
    }
}

#[cfg(test)]
#[path = "pipeline_tests.rs"]
mod tests;

//! The simulation's JetStream: the log stream with its rules (an append
//! carries `Nats-Expected-Last-Sequence` and lands only if the stream is
//! there; purged below a snapshot), the snapshot store (newest whole one
//! wins), and a leadership's pipelined appends as `log_store::Appender`
//! makes them — the real pieces ([`pieces`]) and seal, sent N, N+1, N+2…,
//! arriving in order or lost, acknowledgements lost, and read back
//! (`log::read_back`, as the real appender judges: "ours there: stored;
//! a successor's: fenced out; empty, or a deposed leader's stray: sent
//! again").

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;

use crate::server::log::{pieces, read_back, AtPlace, Entry, Item, ReadBack, SEAL_KEY};
use crate::server::seal::Seal;

/// The log stream.
#[derive(Default)]
pub(super) struct Log {
    messages: BTreeMap<u64, Bytes>,
    /// The last sequence ever stored (a purge keeps it).
    pub(super) last: u64,
    /// Snapshots as stored: `(at, bytes)`, oldest first (a few kept).
    pub(super) snapshots: Vec<(u64, Vec<u8>)>,
}

/// Why an append was refused.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct WrongLastSequence;

impl Log {
    /// An append with `Nats-Expected-Last-Sequence: expected`.
    pub(super) fn append(&mut self, expected: u64, body: Bytes) -> Result<u64, WrongLastSequence> {
        if expected != self.last {
            return Err(WrongLastSequence);
        }
        self.last += 1;
        self.messages.insert(self.last, body);
        Ok(self.last)
    }

    /// The first sequence it holds (`last + 1` when empty).
    pub(super) fn first(&self) -> u64 {
        self.messages
            .keys()
            .next()
            .copied()
            .unwrap_or(self.last + 1)
    }

    pub(super) fn get(&self, seq: u64) -> Option<&Bytes> {
        self.messages.get(&seq)
    }

    /// Purges everything below `seq`.
    pub(super) fn purge_below(&mut self, seq: u64) {
        self.messages = self.messages.split_off(&seq);
    }

    /// Stores a snapshot (the manifest names `at`; the last four kept).
    pub(super) fn store_snapshot(&mut self, at: u64, bytes: Vec<u8>) {
        self.snapshots.push((at, bytes));
        if self.snapshots.len() > 4 {
            self.snapshots.remove(0);
        }
    }

    /// The newest snapshot (the highest `at`), as `LogStore::load_snapshot`
    /// chooses.
    pub(super) fn newest_snapshot(&self) -> Option<&(u64, Vec<u8>)> {
        self.snapshots.iter().max_by_key(|(at, _)| *at)
    }
}

/// What is known of a piece's acknowledgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ack {
    /// Sent; on its way (or its answer is).
    Flying,
    /// Answered: stored at its place.
    Stored,
    /// Lost, refused, or its answer lost: read back.
    Unknown,
}

struct Sent {
    at: u64,
    body: Bytes,
    ends: Option<Entry>,
    ack: Ack,
}

/// What came of the next entry.
pub(super) enum Next {
    Stored(u64, Entry),
    /// Still waiting for answers.
    Waiting,
    /// Another's piece where ours should be: a successor leads.
    Fenced,
}

/// A leadership's pipelined appends.
pub(super) struct Appender {
    epoch: u64,
    next_n: u64,
    sent_upto: u64,
    under_way: VecDeque<Sent>,
    seal: Seal,
    max_message: usize,
}

impl Appender {
    /// Appends leadership `epoch`'s takeover entry after `read` (the last
    /// sequence its reader applied): `Err` when the log moved past it.
    pub(super) fn take_over(
        log: &mut Log,
        seal: &Seal,
        max_message: usize,
        epoch: u64,
        read: u64,
        server: &str,
    ) -> Result<(Appender, u64, Entry), WrongLastSequence> {
        let entry = Entry {
            epoch,
            n: 0,
            items: vec![Item::Takeover {
                server: server.to_string(),
            }],
        };
        let mut at = read;
        for body in pieces(&entry, max_message) {
            at = log.append(at, seal.seal(SEAL_KEY, body.into()))?;
        }
        Ok((
            Appender {
                epoch,
                next_n: 1,
                sent_upto: at,
                under_way: VecDeque::new(),
                seal: seal.clone(),
                max_message,
            },
            at,
            entry,
        ))
    }

    /// Entries sent and not yet known stored.
    pub(super) fn pending(&self) -> usize {
        self.under_way.iter().filter(|s| s.ends.is_some()).count()
    }

    /// Sends the next entry of this leadership.
    pub(super) fn send(&mut self, items: Vec<Item>) {
        let entry = Entry {
            epoch: self.epoch,
            n: self.next_n,
            items,
        };
        self.next_n += 1;
        let bodies = pieces(&entry, self.max_message);
        let last = bodies.len() - 1;
        let mut entry = Some(entry);
        for (i, body) in bodies.into_iter().enumerate() {
            self.sent_upto += 1;
            self.under_way.push_back(Sent {
                at: self.sent_upto,
                body: self.seal.seal(SEAL_KEY, body.into()),
                ends: if i == last { entry.take() } else { None },
                ack: Ack::Flying,
            });
        }
    }

    /// Pieces on their way, oldest first.
    pub(super) fn flying(&self) -> usize {
        self.under_way
            .iter()
            .filter(|s| s.ack == Ack::Flying)
            .count()
    }

    /// The oldest piece on its way reaches the stream (fenced by the
    /// sequence it expects): `Some(stored)`; its answer is `answered`
    /// (else lost). `lost`: it never reaches the stream.
    pub(super) fn arrive(&mut self, log: &mut Log, lost: bool, answered: bool) -> Option<bool> {
        let sent = self.under_way.iter_mut().find(|s| s.ack == Ack::Flying)?;
        if lost {
            sent.ack = Ack::Unknown;
            return Some(false);
        }
        let stored = log.append(sent.at - 1, sent.body.clone()).is_ok();
        sent.ack = if stored && answered {
            Ack::Stored
        } else {
            Ack::Unknown
        };
        Some(stored)
    }

    /// The next entry sent, once it is known stored (in the order sent).
    /// An unknown piece is read back once nothing is on its way: ours at
    /// its place is stored, another leadership's is `Fenced`, an empty
    /// place or a deposed leader's stray piece (and everything after) is
    /// sent again. `read_back_count` counts pieces found stored,
    /// `strays_skipped` strays sent again after.
    pub(super) fn next_stored(
        &mut self,
        log: &Log,
        read_back_count: &mut u64,
        strays_skipped: &mut u64,
    ) -> Next {
        loop {
            let Some(front) = self.under_way.front() else {
                return Next::Waiting;
            };
            match front.ack {
                Ack::Stored => {
                    let sent = self.under_way.pop_front().expect("front");
                    if let Some(entry) = sent.ends {
                        return Next::Stored(sent.at, entry);
                    }
                }
                Ack::Flying => return Next::Waiting,
                Ack::Unknown => {
                    if self.under_way.iter().any(|s| s.ack == Ack::Flying) {
                        return Next::Waiting;
                    }
                    // Judged as the real appender judges each place
                    // (`log::read_back`); from the first not stored, every
                    // piece goes out again, one after another.
                    let mut send_from = None;
                    for i in 0..self.under_way.len() {
                        let sent = &self.under_way[i];
                        if sent.ack == Ack::Stored {
                            continue;
                        }
                        let found = if sent.at > log.last {
                            AtPlace::Nothing
                        } else if sent.at < log.first() {
                            AtPlace::Purged
                        } else {
                            AtPlace::Holds(log.get(sent.at).expect("held"))
                        };
                        match read_back(&self.seal, self.epoch, &sent.body, log.last, found) {
                            ReadBack::Stored => {
                                *read_back_count += 1;
                                self.under_way[i].ack = Ack::Stored;
                            }
                            ReadBack::SendFrom(at) => {
                                if at != sent.at {
                                    *strays_skipped += 1;
                                }
                                send_from = Some((i, at));
                                break;
                            }
                            ReadBack::Fenced => return Next::Fenced,
                        }
                    }
                    if let Some((from, mut at)) = send_from {
                        for sent in self.under_way.iter_mut().skip(from) {
                            sent.at = at;
                            sent.ack = Ack::Flying;
                            at += 1;
                        }
                        self.sent_upto = at - 1;
                    }
                }
            }
        }
    }
}

impl Appender {
    /// The entries sent and not yet known stored, each with the sequence
    /// its last piece would land at (the mutation check's snapshot).
    pub(super) fn unstored(&self) -> Vec<(u64, Entry)> {
        self.under_way
            .iter()
            .filter_map(|s| s.ends.clone().map(|e| (s.at, e)))
            .collect()
    }
}

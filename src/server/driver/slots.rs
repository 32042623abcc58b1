//! Start records: the attempts one turn starts, journaled together under a reused key `s.<n>` of the results bucket; which slots hold entries not yet covered by their tasks' own records, and which may be written again.

use super::*;

/// The most starts in one [`StartRecords`] write (a turn that starts more
/// uses several slots).
pub(crate) const MAX_STARTS_PER_RECORD: usize = 512;

/// The most bytes (roughly) of one [`StartRecords`] write: well inside a
/// NATS message (a write NATS refuses as too large would be retried
/// forever and hold up the journal). Half the largest reply, at most
/// 256 KiB.
pub(super) fn start_record_budget(max_reply_bytes: usize) -> usize {
    (max_reply_bytes / 2).clamp(4 * 1024, 256 * 1024)
}

/// Roughly what one start adds to a [`StartRecords`] message (MessagePack
/// with field names).
pub(super) fn start_size(start: &StartRecord) -> usize {
    16 + start.pool.as_str().len() + start.attempt.estimated_size()
}

/// A result larger than this (roughly, encoded) is written as its task's
/// own record rather than in a result batch: a standby keeps small results
/// of keyed tasks whole, and a batch stays well inside one message.
pub(super) const MAX_BATCHED_RESULT_BYTES: usize = crate::server::warm::KEPT_RECORD_BYTES;

/// Splits a turn's starts (or results) into writes of at most
/// [`MAX_STARTS_PER_RECORD`] entries and about `budget` bytes (a single
/// larger entry goes alone).
pub(super) fn chunks<T>(items: Vec<T>, budget: usize, size: impl Fn(&T) -> usize) -> Vec<Vec<T>> {
    let mut chunks = Vec::new();
    let mut rest = items;
    while !rest.is_empty() {
        // The first chunk's length; a turn's entries usually make one
        // chunk, which is then `rest` itself (no copy).
        let mut total = 0;
        let mut len = 0;
        for item in &rest {
            let more = size(item);
            if len > 0 && (total + more > budget || len == MAX_STARTS_PER_RECORD) {
                break;
            }
            total += more;
            len += 1;
        }
        let tail = rest.split_off(len);
        chunks.push(rest);
        rest = tail;
    }
    chunks
}

/// What the journal holds of a live task, as far as this leader wrote or
/// read it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Journaled {
    /// The attempts in the task's own record.
    pub(super) attempts: u32,
    /// The last of them is running (a start merges only after an ended
    /// attempt: [`TaskRecord::with_start`]).
    pub(super) open: bool,
    /// The start-record slot holding its running attempt, not yet covered
    /// by its own record.
    pub(super) slot: Option<u32>,
}

/// Start-record slots (`s.<n>`): which hold entries not yet covered by
/// their tasks' own records, which wait for a covering write to be stored,
/// which may be written again.
#[derive(Default)]
pub(super) struct Slots {
    pub(super) held: FxHashMap<u32, SlotUse>,
    /// Slots whose entries are all covered, each with the turn whose
    /// writes must be stored first.
    pub(super) freeing: std::collections::VecDeque<(u64, u32)>,
    pub(super) free: BTreeSet<u32>,
    pub(super) next: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SlotUse {
    /// Entries not yet covered.
    Held(u32),
    /// All covered, the covering writes not yet known stored.
    Freeing,
}

impl Slots {
    /// A slot to write (the smallest free one, or a new one).
    pub(super) fn take(&mut self, entries: u32) -> u32 {
        let n = match self.free.pop_first() {
            Some(n) => n,
            None => loop {
                let n = self.next;
                self.next += 1;
                if !self.held.contains_key(&n) {
                    break n;
                }
            },
        };
        self.held.insert(n, SlotUse::Held(entries));
        n
    }

    /// Slot `n` holds one more entry (read back by a takeover).
    pub(super) fn hold(&mut self, n: u32) {
        self.free.remove(&n);
        let held = self.held.entry(n).or_insert(SlotUse::Held(0));
        *held = match *held {
            SlotUse::Held(k) => SlotUse::Held(k + 1),
            SlotUse::Freeing => SlotUse::Held(1),
        };
    }

    /// One entry of slot `n` is covered by a write of turn `turn`.
    pub(super) fn cover(&mut self, n: u32, turn: u64) {
        if let Some(SlotUse::Held(k)) = self.held.get_mut(&n) {
            *k = k.saturating_sub(1);
            if *k == 0 {
                self.held.insert(n, SlotUse::Freeing);
                self.freeing.push_back((turn, n));
            }
        }
    }

    /// The writes of every turn up to `turn` are stored.
    pub(super) fn stored(&mut self, turn: u64) {
        while let Some(&(t, n)) = self.freeing.front() {
            if t > turn {
                break;
            }
            self.freeing.pop_front();
            if self.held.get(&n) == Some(&SlotUse::Freeing) {
                self.held.remove(&n);
                self.free.insert(n);
            }
        }
    }

    /// Slots in use (held or freeing).
    #[cfg(test)]
    pub(super) fn in_use(&self) -> usize {
        self.held.len()
    }
}

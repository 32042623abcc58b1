//! The journal as a log of turns (issue 35): what the leader decided, in
//! the order it decided it, appended to one JetStream stream per log
//! instance and compacted by snapshots.
//!
//! - this file: an entry ([`Entry`]: the durable items of the turns of one
//!   group commit) and its messages ([`pieces`]: an entry too large for
//!   one message is cut into parts; [`Assembler`] puts them together
//!   again and drops what is not the log's);
//! - `state.rs`: the state the log describes ([`LogState`]) and the one
//!   function that applies an entry to it, used by the leader (after its
//!   entry is stored), by every standby (as it follows the log) and by a
//!   takeover (the tail after the snapshot); its snapshot.
//!
//! Nothing here reads a clock or does I/O: the failover simulation runs
//! the same code over an in-memory log with JetStream's rules.

use serde::{Deserialize, Serialize};

use crate::schedule::StoredSchedule;
use crate::wire::TaskRecord;

pub(crate) mod state;

pub(crate) use state::{Known, LogState};

/// One thing a turn decided that must outlive its leader.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) enum Item {
    /// A task's record: a live task's attempts so far, or its result.
    Task(TaskRecord),
    /// A schedule's record; `None`: deleted.
    Schedule(String, Option<Box<StoredSchedule>>),
    /// A leadership began. Its entry is the first of its epoch (number 0):
    /// appended at the log's last sequence, it fences out every later
    /// append of the leadership before.
    Takeover {
        /// The server that took over.
        server: String,
    },
}

/// What one append stores: the items of the turns of one group commit,
/// in the order the driver made them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Entry {
    /// The leadership that appended it.
    pub epoch: u64,
    /// Its number within that leadership: 0 for the takeover, then 1, 2…
    pub n: u64,
    pub items: Vec<Item>,
}

/// The seal's name for every message of the log (each piece names its
/// entry inside the sealed body).
pub(crate) const SEAL_KEY: &str = "log";

/// One message of the log: an entry whole, or one part of one too large
/// for a message.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Piece {
    pub epoch: u64,
    pub n: u64,
    /// From 0.
    pub part: u32,
    pub parts: u32,
    pub data: bytes::Bytes,
}

/// What a piece costs beyond its data, with room to spare (MessagePack
/// framing of five fields, and the seal).
pub(crate) const PIECE_OVERHEAD: usize = 128;

/// `entry` as the bodies of the messages that store it, in order, each
/// at most `max_message` bytes once sealed.
pub(crate) fn pieces(entry: &Entry, max_message: usize) -> Vec<Vec<u8>> {
    let data = crate::wire::encode(entry);
    let room = max_message.saturating_sub(PIECE_OVERHEAD).max(1);
    let parts = data.len().div_ceil(room).max(1);
    let mut out = Vec::with_capacity(parts);
    for (part, chunk) in data.chunks(room).enumerate() {
        out.push(crate::wire::encode(&Piece {
            epoch: entry.epoch,
            n: entry.n,
            part: part as u32,
            parts: parts as u32,
            data: bytes::Bytes::copy_from_slice(chunk),
        }));
    }
    if out.is_empty() {
        out.push(crate::wire::encode(&Piece {
            epoch: entry.epoch,
            n: entry.n,
            part: 0,
            parts: 1,
            data: bytes::Bytes::new(),
        }));
    }
    out
}

/// What a leadership finds at the place of a piece it sent and has no
/// acknowledgement for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum AtPlace<'a> {
    /// Nothing yet: the log ends before it.
    Nothing,
    /// Purged: a snapshot covers it, which only a successor can have
    /// written past this leadership's unstored pieces.
    Purged,
    /// This message.
    Holds(&'a [u8]),
}

/// What that tells the leadership of epoch `epoch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadBack {
    /// Its piece is stored there.
    Stored,
    /// This piece and every one after it go out again, from this place
    /// on: the place is free, or a deposed leader's stray piece took it
    /// (every reader drops that one, and any of ours that landed after
    /// it out of place: see [`Assembler`]).
    SendFrom(u64),
    /// Another leadership's piece: a successor leads.
    Fenced,
}

/// Judges one unacknowledged place, `ours` being the sealed body sent
/// there and `last` the log's last sequence. The appender and the
/// failover simulation both judge with it. A deposed leader's pipelined
/// piece can land right after a successor's takeover entry (it expected
/// the sequence the takeover entry took): that stray once cost the new
/// leadership its lead.
pub(crate) fn read_back(
    seal: &crate::server::seal::Seal,
    epoch: u64,
    ours: &[u8],
    last: u64,
    found: AtPlace<'_>,
) -> ReadBack {
    match found {
        AtPlace::Nothing => ReadBack::SendFrom(last + 1),
        AtPlace::Purged => ReadBack::Fenced,
        AtPlace::Holds(body) if body == ours => ReadBack::Stored,
        AtPlace::Holds(body) => {
            let older = seal
                .open(SEAL_KEY, body)
                .ok()
                .and_then(|b| crate::wire::decode::<Piece>(b).ok())
                .is_some_and(|p| p.epoch < epoch);
            if older {
                ReadBack::SendFrom(last + 1)
            } else {
                ReadBack::Fenced
            }
        }
    }
}

/// Why a message of the log was not taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Dropped {
    /// Not a piece (unreadable, or not sealed with the storage key).
    Unreadable(String),
    /// Of a leadership older than the log's current one, or not the next
    /// of its own: a deposed leader's, or replayed.
    OutOfOrder { epoch: u64, n: u64, part: u32 },
    /// A later leadership began before this entry's last part: its
    /// leader was deposed mid-entry, and the entry is none.
    Incomplete { epoch: u64, n: u64 },
}

/// Puts the pieces read from the log, in stream order, together into
/// entries. The log's rules, as every reader applies them: an epoch
/// begins with its takeover entry (number 0) and is higher than the one
/// before; within an epoch entries come numbered one after another, each
/// part after the one before. Anything else is not the log's (a deposed
/// leader's parts, a replay, a forgery) and is dropped.
#[derive(Clone, Debug, Default)]
pub(crate) struct Assembler {
    /// The current leadership (0: none yet).
    pub epoch: u64,
    /// The next entry number expected in it.
    next: u64,
    /// Parts of the entry being put together: its number, the parts
    /// expected, the data so far, the next part.
    partial: Option<(u64, u32, Vec<u8>, u32)>,
}

impl Assembler {
    /// An assembler that goes on after a snapshot taken at `epoch`, whose
    /// last entry was number `last_n`.
    pub(crate) fn after(epoch: u64, last_n: Option<u64>) -> Assembler {
        Assembler {
            epoch,
            next: last_n.map_or(0, |n| n + 1),
            partial: None,
        }
    }

    /// Takes the message `body` (as stored, sealed): `Ok(Some(entry))`
    /// when it completes one, `Ok(None)` when it is a part of one,
    /// `Err(why)` when it is dropped (and the entry it would have been
    /// part of with it, if any).
    pub(crate) fn push(
        &mut self,
        seal: &crate::server::seal::Seal,
        body: &[u8],
    ) -> Result<Option<Entry>, Dropped> {
        let body = seal
            .open(SEAL_KEY, body)
            .map_err(|why| Dropped::Unreadable(format!("{why:?}")))?;
        let piece: Piece = crate::wire::decode(body).map_err(|e| Dropped::Unreadable(e.message))?;
        self.take(piece)
    }

    fn take(&mut self, piece: Piece) -> Result<Option<Entry>, Dropped> {
        let out_of_order = Dropped::OutOfOrder {
            epoch: piece.epoch,
            n: piece.n,
            part: piece.part,
        };
        if piece.parts == 0 || piece.part >= piece.parts {
            return Err(out_of_order);
        }
        if piece.epoch > self.epoch && piece.n == 0 && piece.part == 0 {
            // A new leadership: whatever the last one left unfinished is
            // none.
            let incomplete = self.partial.take().map(|(n, ..)| Dropped::Incomplete {
                epoch: self.epoch,
                n,
            });
            self.epoch = piece.epoch;
            self.next = 0;
            if let Some(dropped) = incomplete {
                tracing::warn!(?dropped, "an entry of a deposed leader is incomplete");
            }
        } else if piece.epoch != self.epoch {
            return Err(out_of_order);
        }
        match &mut self.partial {
            None => {
                if piece.n != self.next || piece.part != 0 {
                    return Err(out_of_order);
                }
                if piece.parts > 1 {
                    self.partial = Some((piece.n, piece.parts, piece.data.to_vec(), 1));
                    return Ok(None);
                }
                self.next += 1;
                self.decode(&piece.data).map(Some)
            }
            Some((n, parts, data, next_part)) => {
                if piece.n != *n || piece.parts != *parts || piece.part != *next_part {
                    return Err(out_of_order);
                }
                data.extend_from_slice(&piece.data);
                *next_part += 1;
                if *next_part < *parts {
                    return Ok(None);
                }
                let (_, _, data, _) = self.partial.take().expect("matched above");
                self.next += 1;
                self.decode(&data).map(Some)
            }
        }
    }

    fn decode(&self, data: &[u8]) -> Result<Entry, Dropped> {
        let entry: Entry = crate::wire::decode(data).map_err(|e| Dropped::Unreadable(e.message))?;
        if entry.epoch != self.epoch || entry.n + 1 != self.next {
            return Err(Dropped::OutOfOrder {
                epoch: entry.epoch,
                n: entry.n,
                part: 0,
            });
        }
        Ok(entry)
    }
}

#[cfg(test)]
pub(crate) mod tests;

//! The journal: what the leader stores in JetStream and how.
//!
//! - `fence.rs`: every write is fenced on the leader subject
//!   ([`Fenced`]), so a deposed leader's writes are refused;
//! - `acks.rs`: the committer's acknowledgement inbox for records written
//!   on their own (no request, timer or JSON decoding per write);
//! - `committer.rs`: the committer stores each turn's records, one task's
//!   records in order, and announces a turn only once it and every earlier
//!   turn are stored;
//! - `pipeline.rs`: that ordering as a pure state machine (which writes
//!   may start, which turns may be announced), run by the committer and
//!   by the failover simulation;
//! - `batch.rs`: records in atomic batches, one fence check per batch
//!   (replicated streams);
//! - `dead_letters.rs`: refused submissions copied with their reason;
//! - `purge.rs`: finished submissions dropped from the submit stream.

mod acks;
mod batch;
mod committer;
mod dead_letters;
mod fence;
pub(crate) mod pipeline;
mod purge;

#[allow(unused_imports)]
pub(in crate::server) use self::{batch::*, committer::*, dead_letters::*, fence::*, purge::*};

//! The journal's shell beside the log (`server::log`, `server::log_store`):
//!
//! - `committer.rs`: appends each group of turns as one log entry and
//!   announces each turn once its entry, and every earlier one, is stored;
//! - `turns.rs`: the committer's rules without I/O (a turn's records, a
//!   group commit's entry, which groups may be announced), run by the
//!   committer and by the failover simulation alike;
//! - `dead_letters.rs`: refused submissions copied with their reason;
//! - `lookups.rs`: finished tasks' records for lookups, by block of ids;
//! - `purge.rs`: finished submissions dropped from the submit stream.

mod committer;
mod dead_letters;
pub(in crate::server) mod lookups;
mod purge;
pub(in crate::server) mod turns;

#[allow(unused_imports)]
pub(in crate::server) use self::{committer::*, dead_letters::*, purge::*, turns::*};

//! The journal's shell beside the log (`server::log`, `server::log_store`):
//!
//! - `committer.rs`: appends each group of turns as one log entry and
//!   announces each turn once its entry, and every earlier one, is stored;
//! - `pipeline.rs`: the per-record ordering the journal used before the
//!   log, still run by the failover simulation (to be replaced by the log's
//!   own, issue 35);
//! - `dead_letters.rs`: refused submissions copied with their reason;
//! - `purge.rs`: finished submissions dropped from the submit stream.

mod committer;
mod dead_letters;
#[cfg(test)]
pub(crate) mod pipeline;
mod purge;

#[allow(unused_imports)]
pub(in crate::server) use self::{committer::*, dead_letters::*, purge::*};

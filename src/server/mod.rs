//! `cronoq server`: the NATS shell around the [`driver::Driver`].
//!
//! At start the server connects to NATS (retrying until it can), makes sure
//! the JetStream objects exist (waiting, with a `waiting for jetstream`
//! warning and backoff, while JetStream does not answer: a cluster still
//! electing) — the submit stream (`P_SUBMIT`, capturing
//! `P.submit.>`, file storage, 2-minute duplicate window), the results
//! bucket (`P_RESULTS`) and the state bucket (`P_STATE`, holding the epoch
//! counter, bumped by every start) — and then runs these tasks:
//!
//! * **consumer**: an ordered consumer reads the submit stream from its
//!   first message. The stream holds every accepted, unfinished task: a
//!   finished task's result goes to the results bucket, and once a second
//!   the stream is purged below the oldest unfinished task whose result is
//!   not yet stored. A restarted server reads what is left and skips
//!   submissions whose result is already stored, so it picks up every
//!   accepted task again; a task id is its stream sequence number.
//! * **api**: requests on `P.api.*` are decoded and handed to the driver,
//!   which publishes the replies itself.
//! * **driver**: owns the core and all leader state; one input at a time,
//!   then carries out the outputs (publishes; results to the persister).
//! * **committer**: writes results to the bucket, many at once; the
//!   **purger** then drops finished submissions in one request a second
//!   (deleting them one by one costs nats-server milliseconds each).
//! * **http**: the HTTP API of SPEC §5 over [`LeaderApi`].
//!
//! **Several servers**: every server connects, creates the JetStream
//! objects and serves HTTP ([`NodeApi`]); one leads at a time
//! ([`election`]). Only the leader runs the tasks above; the others stand
//! by, answer HTTP by asking the leader over NATS, and take over when its
//! record stops moving for `election_timeout`. A new leader starts a fresh
//! driver that reads the submit stream again (finished tasks are skipped
//! by their stored result), or leads with the one it built from its warm
//! copies while the leader record stood still (`successor.rs`). Results
//! are written fenced on the leader subject, so a deposed leader cannot
//! overwrite them.
//!
//! By concern:
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | the error type, small helpers, the re-exports |
//! | `process.rs` | one process: connect, JetStream objects, HTTP, stand by or lead |
//! | `connect.rs` | connecting to NATS |
//! | `election.rs` | leader election and fencing over one subject |
//! | `leadership.rs` | one leadership's tasks and its right to act (its tenure) |
//! | `leader_api.rs`, `node.rs` | the API of the leader, and of every server |
//! | `consumer.rs` | the submit consumer |
//! | `takeover.rs` | reading the journal back at a takeover |
//! | `successor.rs` | a successor's driver prepared while the leader is silent |
//! | `warm.rs` | a standby's warm copy of the journal |
//! | `warm_submits.rs` | a standby's copy of the submit stream, decoded |
//! | `requests.rs` | worker and client requests over NATS |
//! | `guard.rs` | credentials, nonces and sessions of one leadership |
//! | `fires.rs` | schedule fires the leader publishes, sealed; telling them from forgeries |
//! | `runner.rs` | the driver's loop |
//! | `driver/` | the driver: the leader's state beside the core, I/O-free |
//! | `journal/` | the committer and its pure pipeline, fenced writes, atomic batches, dead letters, purge |
//! | `seal.rs` | sealing what the leader stores |
//! | `config.rs` | `cronoq.toml` |
//! | `sim/` | the failover simulation (tests) |

mod config;
mod connect;
mod consumer;
pub(crate) mod driver;
pub mod election;
pub mod fires;
mod guard;
mod journal;
mod leader_api;
mod leadership;
mod log;
mod log_store;
mod node;
mod process;
mod requests;
mod runner;
pub mod seal;
#[cfg(test)]
mod sim;
mod successor;
mod takeover;
mod warm;
mod warm_submits;

pub use config::*;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::{self, kv, stream};
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot, watch};

use crate::api::{Api, ApiError, ApiFuture, Health};
use crate::auth::{Authenticator, Principal};
use crate::core::{ErrorCode, Millis, PoolName, Snapshot, TaskId, TaskState};
use crate::metrics::{MetricsSnapshot, ServerMetrics};
use crate::task::{Task, TaskStatus};
use crate::wire::{self, Subjects, WireError};
use driver::{Driver, Input, Output, Registrant, Responder, Settings};
use guard::Guard;

pub use self::connect::connect_nats;
pub use self::leader_api::{effective_payload_limit, LeaderApi, ENVELOPE_RESERVE};
pub use self::node::NodeApi;
pub use self::process::{run, serve, Running};
#[allow(unused_imports)]
use self::{
    connect::*, consumer::*, journal::*, leader_api::*, leadership::*, node::*, process::*,
    requests::*, runner::*, takeover::*,
};

/// A server error, with a stable code.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad configuration.
    #[error("{0}")]
    Config(#[from] crate::core::Rejection),
    /// NATS or JetStream failed.
    #[error("{context}: {source}")]
    Nats {
        /// What we were doing.
        context: String,
        /// What failed.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The HTTP listener failed.
    #[error("http on {addr}: {source}")]
    Http {
        /// The address.
        addr: String,
        /// What failed.
        source: std::io::Error,
    },
    /// `[auth]` is not usable (an unset token variable, an inline secret, …).
    #[error("[auth]: {}", .0.message)]
    Auth(WireError),
    /// NATS refused the login (`UNAUTHENTICATED`).
    #[error("{0}")]
    Refused(String),
    /// `[telemetry]` or the `OTEL_*` env cannot be used.
    #[error("{0}")]
    Telemetry(#[from] crate::telemetry::StartError),
}

impl Error {
    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Config(r) => r.code(),
            Error::Nats { .. } => ErrorCode::UNAVAILABLE,
            Error::Http { .. } => ErrorCode::UNAVAILABLE,
            Error::Auth(e) => e.code.clone(),
            Error::Refused(_) => ErrorCode::UNAUTHENTICATED,
            Error::Telemetry(e) => e.code(),
        }
    }
}

fn nats_err<E: std::error::Error + Send + Sync + 'static>(
    context: impl Into<String>,
) -> impl FnOnce(E) -> Error {
    let context = context.into();
    move |e| Error::Nats {
        context,
        source: Box::new(e),
    }
}

/// Drops `value` on a blocking thread when there is a runtime to run
/// it (inline otherwise): a driver or a copy holding hundreds of thousands
/// of tasks takes tens of milliseconds to free (70 ms of a takeover).
fn drop_later<T: Send + 'static>(value: T) {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn_blocking(move || drop(value));
        }
        Err(_) => drop(value),
    }
}

fn wall_now() -> Millis {
    Millis::since_epoch(SystemTime::now())
}

/// The default server id: host name and process id.
pub fn default_server_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "cronoq".into());
    let host: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("{host}-{}", std::process::id())
}

/// The error a client gets when nothing answers.
pub fn no_server(subject: &str) -> ApiError {
    unavailable(format!("no cronoq server is answering on {subject}"))
}

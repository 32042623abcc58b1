//! The one interface behind the HTTP API (and the CLI's client commands):
//! submit, look up, cancel, snapshot, health. The embedded [`Scheduler`](crate::Scheduler)
//! implements it, and so do the distributed server (as leader) and the
//! remote client, so `cronoq dev` can serve the same HTTP API with or
//! without NATS.
//!
//! Futures are boxed so the trait can be used as `Arc<dyn Api>`.

use std::future::Future;
use std::pin::Pin;

use crate::core::{ErrorCode, Snapshot, TaskId};
use crate::metrics::MetricsSnapshot;
use crate::task::{Task, TaskStatus};
use crate::wire::WireError;

mod submit;
pub use submit::{BackoffRequest, SubmitRequest, SubmitResponse};

/// An API error: a stable code and a message (the same shape on the wire
/// and over HTTP).
pub type ApiError = WireError;

/// A boxed, sendable future.
pub type ApiFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ApiError>> + Send + 'a>>;

/// Liveness and readiness, for `/healthz` and `/readyz`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Health {
    /// The process works.
    pub live: bool,
    /// Connected, and leader or following a known leader.
    pub ready: bool,
    /// Why not ready, or what it is.
    pub detail: String,
}

/// What a scheduler offers to clients.
pub trait Api: Send + Sync + 'static {
    /// Submits a task; its id once accepted (durable, in distributed mode).
    fn submit(&self, task: Task) -> ApiFuture<'_, TaskId>;
    /// A task's state, why it waits, its attempts and result.
    fn task(&self, id: TaskId) -> ApiFuture<'_, TaskStatus>;
    /// Cancels a task.
    fn cancel(&self, id: TaskId) -> ApiFuture<'_, ()>;
    /// Pools, groups, demand, workers.
    fn snapshot(&self) -> ApiFuture<'_, Snapshot>;
    /// The most recent tasks, newest (highest id) first: live ones and
    /// the most recently finished, at most `limit`
    /// (1..=[`MAX_RECENT_TASKS`]; see [`check_recent_limit`]). Each is a
    /// [`TaskStatus::summary`]: outputs left out, long errors cut.
    fn recent_tasks(&self, limit: usize) -> ApiFuture<'_, Vec<TaskStatus>>;
    /// Liveness and readiness.
    fn health(&self) -> Health;
    /// Task counters and latency histograms per pool (and a server's
    /// election and journal figures), for `/metrics`. The embedded
    /// scheduler and the server implement it; remote clients do not and
    /// answer `FAILED_PRECONDITION` (scrape the server instead), and
    /// `/metrics` then shows the snapshot's gauges only.
    fn metrics(&self) -> ApiFuture<'_, MetricsSnapshot> {
        Box::pin(async {
            Err(WireError::new(
                ErrorCode::FAILED_PRECONDITION,
                "metrics are served by the scheduler itself: scrape the server's /metrics",
            ))
        })
    }
}

/// The most tasks one [`Api::recent_tasks`] call lists.
pub const MAX_RECENT_TASKS: usize = 500;

/// Refuses a `limit` of [`Api::recent_tasks`] outside 1..=[`MAX_RECENT_TASKS`]
/// (`INVALID_ARGUMENT`).
///
/// ```
/// assert!(cronoq::api::check_recent_limit(50).is_ok());
/// assert!(cronoq::api::check_recent_limit(0).is_err());
/// assert!(cronoq::api::check_recent_limit(501).is_err());
/// ```
pub fn check_recent_limit(limit: usize) -> Result<(), ApiError> {
    if (1..=MAX_RECENT_TASKS).contains(&limit) {
        Ok(())
    } else {
        Err(WireError::new(
            ErrorCode::INVALID_ARGUMENT,
            format!("limit {limit} is outside 1..={MAX_RECENT_TASKS}"),
        ))
    }
}

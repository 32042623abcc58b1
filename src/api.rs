//! The one interface behind the HTTP API (and the CLI's client commands):
//! submit, look up, cancel, snapshot, health. The embedded [`Scheduler`](crate::Scheduler)
//! implements it, and so do the distributed server (as leader) and the
//! remote client, so `cronoq dev` can serve the same HTTP API with or
//! without NATS.
//!
//! Schedules (issue 23) have their own methods and types
//! (`api/schedules.rs`); their defaults answer `FAILED_PRECONDITION`.
//!
//! Futures are boxed so the trait can be used as `Arc<dyn Api>`.

use std::future::Future;
use std::pin::Pin;

use crate::core::{ErrorCode, Snapshot, TaskId};
use crate::metrics::MetricsSnapshot;
use crate::task::{Task, TaskStatus};
use crate::wire::WireError;

mod schedules;
mod schema;
mod submit;
pub use schedules::{
    BackfillRange, BackfillReport, BackfillRequest, CreateScheduleRequest, FireKind, FireRecord,
    MissedTicks, ScheduleCounters, ScheduleEntry, ScheduleInfo, MAX_BACKFILL_TICKS, NEXT_FIRES,
};
pub use submit::{BackoffRequest, SubmitRequest, SubmitResponse};

/// An API error: a stable code and a message (the same shape on the wire
/// and over HTTP).
pub type ApiError = WireError;

/// A boxed, sendable future.
pub type ApiFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ApiError>> + Send + 'a>>;

/// Liveness and readiness, for `/healthz` and `/readyz`.
#[derive(
    Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct Health {
    /// The process works.
    pub live: bool,
    /// Connected, and leader or following a known leader (a server's
    /// follower also once its copies of the submit stream and the journal
    /// have caught up: it could take over from memory).
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

    // Schedules (issue 23). Every method answers `FAILED_PRECONDITION`
    // unless the implementation serves schedules. A refused request
    // (`INVALID_ARGUMENT`, `ALREADY_EXISTS`, `NOT_FOUND`,
    // `RESOURCE_EXHAUSTED`, `PERMISSION_DENIED`) changes nothing.

    /// Creates a schedule (`ALREADY_EXISTS` on a taken name,
    /// `RESOURCE_EXHAUSTED` past the limit); its first tick is the first
    /// one after now.
    fn create_schedule(&self, spec: CreateScheduleRequest) -> ApiFuture<'_, ScheduleInfo> {
        let _ = spec;
        no_schedules()
    }
    /// Every schedule, by name.
    fn list_schedules(&self) -> ApiFuture<'_, Vec<ScheduleEntry>> {
        no_schedules()
    }
    /// One schedule (`NOT_FOUND` if there is none by that name).
    fn get_schedule(&self, name: String) -> ApiFuture<'_, ScheduleInfo> {
        let _ = name;
        no_schedules()
    }
    /// Pauses a schedule: its ticks pass without runs until resumed
    /// (pausing a paused schedule changes nothing).
    fn pause_schedule(&self, name: String) -> ApiFuture<'_, ScheduleInfo> {
        let _ = name;
        no_schedules()
    }
    /// Resumes a schedule; ticks that passed while paused do not fire.
    fn resume_schedule(&self, name: String) -> ApiFuture<'_, ScheduleInfo> {
        let _ = name;
        no_schedules()
    }
    /// Deletes a schedule; its runs already started go on.
    fn delete_schedule(&self, name: String) -> ApiFuture<'_, ()> {
        let _ = name;
        no_schedules()
    }
    /// Starts one run now, outside the tick sequence (its own key; the
    /// overlap policy does not apply).
    fn trigger_schedule(&self, name: String) -> ApiFuture<'_, FireRecord> {
        let _ = name;
        no_schedules()
    }
    /// Fires each tick in the range (at most [`MAX_BACKFILL_TICKS`]),
    /// obeying the overlap policy.
    fn backfill_schedule(
        &self,
        name: String,
        range: BackfillRange,
    ) -> ApiFuture<'_, BackfillReport> {
        let _ = (name, range);
        no_schedules()
    }
}

/// The answer of an [`Api`] that serves no schedules.
fn no_schedules<'a, T: Send + 'a>() -> ApiFuture<'a, T> {
    Box::pin(async {
        Err(WireError::new(
            ErrorCode::FAILED_PRECONDITION,
            "this endpoint serves no schedules",
        ))
    })
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

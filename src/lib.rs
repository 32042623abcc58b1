//! cronoq: a label-aware task scheduler for fleets of workers that differ.
//!
//! Pools of workers carry labels (`gpu=a100`, `zone=eu`), tasks require
//! labels, and cronoq places each task on a matching group of workers:
//! least specialized first, urgent work first, never losing a task.
//!
//! Embedded use, in one process:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), cronoq::embedded::Error> {
//! use bytes::Bytes;
//! use cronoq::{Labels, Scheduler, Task, TaskContext};
//!
//! let sched = Scheduler::new();
//! sched.set_capacity("inference", 4)?;                       // the unlabeled group
//! sched.set_group_capacity("inference", Labels::from([("gpu", "a100")]), 2)?;
//! sched.executor("inference", |ctx: TaskContext, payload: Bytes| async move {
//!     tracing::info!(group = %ctx.group, attempt = ctx.attempt, "running");
//!     Ok(payload)
//! })?;
//! let handle = sched.submit(Task::new("hello").pool("inference").label("gpu", "a100")).await?;
//! let outcome = handle.wait().await?;
//! assert!(outcome.is_success());
//! assert_eq!(outcome.group().unwrap().to_string(), "gpu=a100");
//! let snap = sched.snapshot();
//! assert_eq!(snap.pools[0].groups.len(), 2);
//! # Ok(()) }
//! ```
//!
//! See `README.md` for a tour and `ARCHITECTURE.md` for the map of modules.

pub mod api;
pub mod auth;
pub mod cli;
pub mod client;
pub mod core;
pub mod embedded;
pub mod http;
pub(crate) mod ledger;
pub mod metrics;
pub(crate) mod nats;
pub mod schedule;
pub mod server;
pub mod task;
pub mod telemetry;
#[cfg(test)]
pub(crate) mod test_nats;
pub mod wire;
pub mod worker;

pub use crate::core::{
    ConcurrencyPolicy, Labels, PoolConfig, PoolName, Preemption, Snapshot, TaskId, TaskState,
};
pub use embedded::{Scheduler, SchedulerBuilder, TaskContext, TaskHandle};
pub use task::{Outcome, Task, TaskError, TaskStatus};

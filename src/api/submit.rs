//! The JSON of `POST /v1/tasks` ([`SubmitRequest`], which lives with the
//! one conversion of submission options in [`crate::task`]) and its
//! answer: what the HTTP API reads and the HTTP client writes, so it sits
//! below both.

use serde::{Deserialize, Serialize};

use crate::core::TaskId;

pub use crate::task::{BackoffRequest, SubmitRequest};

/// The answer to `POST /v1/tasks` (and to a cancel).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SubmitResponse {
    /// The task's id.
    pub id: TaskId,
}

//! The task routes: `POST /v1/tasks` (a [`SubmitRequest`], through the one
//! conversion of submission options), `GET /v1/tasks`,
//! `GET /v1/tasks/{id}`, `GET /v1/tasks/{id}/output` (the output's exact
//! bytes, `application/octet-stream`; `NOT_FOUND` while it has none),
//! `POST /v1/tasks/{id}/cancel`.

use std::time::SystemTime;

use axum::Json;

use super::extract::{IdPath, JsonBody};
use super::openapi::{text_answer, Params, Routes, TaskListParams};
use super::{clamp_message, Caller, HttpError};
use crate::api::{SubmitRequest, SubmitResponse};
use crate::task::TaskStatus;

/// The task routes, merged into [`super::router`].
pub(super) fn routes() -> Routes {
    Routes::new()
        .post("/v1/tasks", submit, |op| {
            op.summary("Submit a task (a traceparent header is its W3C trace context)")
        })
        .get("/v1/tasks", list_tasks, |op| {
            op.summary(
                "The newest tasks, live or recently finished, highest id first, without outputs",
            )
        })
        .get("/v1/tasks/{id}", task, |op| op.summary("A task's status"))
        .get("/v1/tasks/{id}/output", output, |op| {
            text_answer(
                op.summary("A task's output, its exact bytes however large"),
                200,
                "application/octet-stream",
                "the output",
            )
        })
        .post("/v1/tasks/{id}/cancel", cancel, |op| {
            op.summary("Cancel a task")
        })
}

async fn submit(
    Caller(api): Caller,
    headers: axum::http::HeaderMap,
    JsonBody(req): JsonBody<SubmitRequest>,
) -> Result<Json<SubmitResponse>, HttpError> {
    let mut req = req;
    req.traceparent = traceparent_header(&headers)?.map(str::to_string);
    let task = req.into_task(SystemTime::now())?;
    let id = api.submit(task).await?;
    Ok(Json(SubmitResponse { id }))
}

/// The request's `traceparent` header: at most one, visible ASCII.
fn traceparent_header(headers: &axum::http::HeaderMap) -> Result<Option<&str>, HttpError> {
    let mut values = headers.get_all(crate::wire::TRACEPARENT).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(HttpError::invalid("more than one traceparent header"));
    }
    value
        .to_str()
        .map(Some)
        .map_err(|_| HttpError::invalid("the traceparent header is not visible ASCII"))
}

/// `GET /v1/tasks?limit=N`: the newest tasks (default 50).
async fn list_tasks(
    Caller(api): Caller,
    query: Params<TaskListParams>,
) -> Result<Json<crate::wire::TaskList>, HttpError> {
    let pairs = query.pairs()?;
    let mut limit = DEFAULT_TASK_LIST;
    for (i, (key, value)) in pairs.iter().enumerate() {
        if key != "limit" || i > 0 {
            return Err(HttpError::invalid(format!(
                "the only query parameter is one limit, not {:?}",
                clamp_message(key)
            )));
        }
        limit = value.parse().map_err(|_| {
            HttpError::invalid(format!(
                "limit must be an integer, not {:?}",
                clamp_message(value)
            ))
        })?;
    }
    crate::api::check_recent_limit(limit)?;
    Ok(Json(crate::wire::TaskList {
        tasks: api.recent_tasks(limit).await?,
    }))
}

/// Tasks `GET /v1/tasks` lists without `?limit=`.
pub const DEFAULT_TASK_LIST: usize = 50;

async fn task(Caller(api): Caller, IdPath(id): IdPath) -> Result<Json<TaskStatus>, HttpError> {
    Ok(Json(api.task(id).await?))
}

/// `GET /v1/tasks/{id}/output`: the output's exact bytes, however large
/// (a status over NATS leaves a large one out; the client behind a
/// follower or a credential fetches it in pages first).
async fn output(
    Caller(api): Caller,
    IdPath(id): IdPath,
) -> Result<axum::response::Response, HttpError> {
    use axum::response::IntoResponse as _;
    let status = api.task(id).await?;
    let Some(bytes) = status.output_bytes() else {
        return Err(crate::wire::WireError::new(
            crate::core::ErrorCode::NOT_FOUND,
            format!("task {id} has no output ({})", status.state),
        )
        .into());
    };
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
        bytes,
    )
        .into_response())
}

async fn cancel(
    Caller(api): Caller,
    IdPath(id): IdPath,
) -> Result<Json<SubmitResponse>, HttpError> {
    api.cancel(id).await?;
    Ok(Json(SubmitResponse { id }))
}

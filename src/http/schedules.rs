//! The schedule routes of the HTTP API (issue 23), over any [`Api`]: the
//! embedded scheduler, the leader, or a follower asking the leader.
//!
//! | route | body | answer |
//! |---|---|---|
//! | `GET /v1/schedules` | | `{"schedules": [`[`ScheduleEntry`]`, …]}`, by name |
//! | `POST /v1/schedules` | a [`CreateScheduleRequest`] | 201 and the new schedule's [`ScheduleInfo`] |
//! | `GET /v1/schedules/{name}` | | its [`ScheduleInfo`]: spec, state, next 5 fires, recent runs, skipped and missed ticks, counters |
//! | `DELETE /v1/schedules/{name}` | | `{"deleted": "name"}` |
//! | `POST /v1/schedules/{name}/pause` | none | its [`ScheduleInfo`], paused |
//! | `POST /v1/schedules/{name}/resume` | none | its [`ScheduleInfo`], resumed |
//! | `POST /v1/schedules/{name}/trigger` | none | the run's [`FireRecord`] (its task id, or why its submission was refused) |
//! | `POST /v1/schedules/{name}/backfill` | a [`BackfillRequest`] `{"from": "RFC 3339", "to": "RFC 3339"}` | a [`BackfillReport`]: runs started and ticks skipped |
//!
//! A create body is the schedule as users write it:
//!
//! ```json
//! {"name": "nightly-report", "cron": "30 2 * * *", "tz": "Europe/Berlin",
//!  "overlap": "skip", "catchup_window": "10m", "jitter": "30s", "paused": false,
//!  "task": {"pool": "reports", "labels": {"gpu": "a100"}, "priority": 0,
//!           "payload": "build", "max_attempts": 3, "attempt_timeout": "1h",
//!           "deadline": "2h"}}
//! ```
//!
//! Instants in answers are milliseconds since the Unix epoch (JSON
//! numbers), as everywhere in the API.
//!
//! Errors are the API's (`{"code", "message"}`, status by
//! [`super::status_of`]): a malformed body, an invalid expression, an
//! unknown zone, a zero or sub-second interval, an expression that never
//! fires, a bad name in the path, a backfill range that runs backwards —
//! 400 `INVALID_ARGUMENT`; a duplicate name 409 `ALREADY_EXISTS`; an
//! unknown name 404 `NOT_FOUND`; the schedule limit 429
//! `RESOURCE_EXHAUSTED`. A refusal changes nothing. What can be checked
//! here (the body's form, the name) is, before the [`Api`] is called; the
//! rest is the scheduler's.
//!
//! **Credentials** are the router's (see [`super`]): with
//! `[auth] required`, each call goes to the leader as the caller's Bearer
//! token, and the leader decides — readers may list and get; creating,
//! changing and deleting need `admin` or a `submitter` allowed the
//! schedule's pool. The origin rules (JSON-only posts, Host and Origin
//! checks) apply here as to every route.

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::extract::JsonBody;
use super::openapi::{Routes, ScheduleNameParam};
use super::{Caller, HttpError};
use crate::api::{
    BackfillReport, BackfillRequest, CreateScheduleRequest, FireRecord, ScheduleEntry, ScheduleInfo,
};
use crate::schedule::check_schedule_name;

/// The schedule routes, merged into [`super::router`].
pub(super) fn routes() -> Routes {
    Routes::new()
        .get("/v1/schedules", list, |op| {
            op.summary("Every schedule, by name")
        })
        .post("/v1/schedules", create, |op| {
            // Its status is a value, not a type: said here.
            op.summary("Create a schedule")
                .response::<201, Json<ScheduleInfo>>()
        })
        .get("/v1/schedules/{name}", one, |op| {
            op.summary("Everything about one schedule")
        })
        .delete("/v1/schedules/{name}", delete, |op| {
            op.summary("Delete a schedule")
        })
        .post("/v1/schedules/{name}/pause", pause, |op| {
            op.summary("Pause a schedule")
        })
        .post("/v1/schedules/{name}/resume", resume, |op| {
            op.summary("Resume a schedule")
        })
        .post("/v1/schedules/{name}/trigger", trigger, |op| {
            op.summary("Fire a schedule now")
        })
        .post("/v1/schedules/{name}/backfill", backfill, |op| {
            op.summary("Fire each tick of a past range, obeying the overlap policy")
        })
}

/// `GET /v1/schedules`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ScheduleList {
    /// Every schedule, by name.
    pub schedules: Vec<ScheduleEntry>,
}

/// `DELETE /v1/schedules/{name}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Deleted {
    /// The schedule deleted.
    pub deleted: String,
}

/// The `{name}` of a path, checked as a schedule name (`INVALID_ARGUMENT`
/// otherwise, calling nothing).
struct NamePath(String);

impl aide::operation::OperationInput for NamePath {
    fn operation_input(
        ctx: &mut aide::generate::GenContext,
        operation: &mut aide::openapi::Operation,
    ) {
        <axum::extract::Path<ScheduleNameParam> as aide::operation::OperationInput>::operation_input(
            ctx, operation,
        );
    }
}

impl<S: Send + Sync> FromRequestParts<S> for NamePath {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, HttpError> {
        let Path(name) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| HttpError::invalid(e.body_text()))?;
        check_schedule_name(&name)?;
        Ok(NamePath(name))
    }
}

async fn list(Caller(api): Caller) -> Result<Json<ScheduleList>, HttpError> {
    let mut schedules = api.list_schedules().await?;
    schedules.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Json(ScheduleList { schedules }))
}

async fn create(
    Caller(api): Caller,
    JsonBody(spec): JsonBody<CreateScheduleRequest>,
) -> Result<(StatusCode, Json<ScheduleInfo>), HttpError> {
    // Checked here so a bad schedule never reaches a leader; it checks again.
    spec.validate()?;
    let info = api.create_schedule(spec).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

async fn one(
    Caller(api): Caller,
    NamePath(name): NamePath,
) -> Result<Json<ScheduleInfo>, HttpError> {
    Ok(Json(api.get_schedule(name).await?))
}

async fn delete(Caller(api): Caller, NamePath(name): NamePath) -> Result<Json<Deleted>, HttpError> {
    api.delete_schedule(name.clone()).await?;
    Ok(Json(Deleted { deleted: name }))
}

async fn pause(
    Caller(api): Caller,
    NamePath(name): NamePath,
) -> Result<Json<ScheduleInfo>, HttpError> {
    Ok(Json(api.pause_schedule(name).await?))
}

async fn resume(
    Caller(api): Caller,
    NamePath(name): NamePath,
) -> Result<Json<ScheduleInfo>, HttpError> {
    Ok(Json(api.resume_schedule(name).await?))
}

async fn trigger(
    Caller(api): Caller,
    NamePath(name): NamePath,
) -> Result<Json<FireRecord>, HttpError> {
    Ok(Json(api.trigger_schedule(name).await?))
}

async fn backfill(
    Caller(api): Caller,
    NamePath(name): NamePath,
    JsonBody(request): JsonBody<BackfillRequest>,
) -> Result<Json<BackfillReport>, HttpError> {
    let range = request.range()?;
    Ok(Json(api.backfill_schedule(name, range).await?))
}

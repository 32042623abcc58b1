//! [`HttpClient`]'s schedule calls: the routes of `crate::http`'s
//! schedules module (`/v1/schedules…`), with the same JSON. A name that is
//! not a schedule name is refused here (`INVALID_ARGUMENT`), before it
//! could make another path.

use axum::http::Method;
use serde::Deserialize;

use super::HttpClient;
use crate::api::{
    BackfillRange, BackfillReport, BackfillRequest, CreateScheduleRequest, FireRecord,
    ScheduleEntry, ScheduleInfo,
};
use crate::client::Error;
use crate::core::Millis;
use crate::schedule::check_schedule_name;

/// The answer of `GET /v1/schedules`.
#[derive(Deserialize)]
struct List {
    schedules: Vec<ScheduleEntry>,
}

fn path(name: &str, action: &str) -> Result<String, Error> {
    check_schedule_name(name)?;
    Ok(format!("/v1/schedules/{name}{action}"))
}

fn json<T: serde::Serialize>(value: &T) -> Result<Option<Vec<u8>>, Error> {
    serde_json::to_vec(value)
        .map(Some)
        .map_err(|e| Error::Protocol(format!("encoding the request: {e}")))
}

/// An instant as RFC 3339 (milliseconds), for a [`BackfillRequest`].
fn rfc3339(t: Millis) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + t.to_duration()).to_string()
}

impl HttpClient {
    /// Creates a schedule (`POST /v1/schedules`), checked here first.
    pub async fn create_schedule(
        &self,
        spec: CreateScheduleRequest,
    ) -> Result<ScheduleInfo, Error> {
        spec.validate()?;
        self.call(Method::POST, "/v1/schedules", json(&spec)?).await
    }

    /// Every schedule, by name.
    pub async fn list_schedules(&self) -> Result<Vec<ScheduleEntry>, Error> {
        let list: List = self.call(Method::GET, "/v1/schedules", None).await?;
        Ok(list.schedules)
    }

    /// One schedule.
    pub async fn get_schedule(&self, name: &str) -> Result<ScheduleInfo, Error> {
        self.call(Method::GET, &path(name, "")?, None).await
    }

    /// Pauses a schedule.
    pub async fn pause_schedule(&self, name: &str) -> Result<ScheduleInfo, Error> {
        self.call(Method::POST, &path(name, "/pause")?, None).await
    }

    /// Resumes a schedule.
    pub async fn resume_schedule(&self, name: &str) -> Result<ScheduleInfo, Error> {
        self.call(Method::POST, &path(name, "/resume")?, None).await
    }

    /// Deletes a schedule.
    pub async fn delete_schedule(&self, name: &str) -> Result<(), Error> {
        let _: serde_json::Value = self.call(Method::DELETE, &path(name, "")?, None).await?;
        Ok(())
    }

    /// Starts one run of a schedule now.
    pub async fn trigger_schedule(&self, name: &str) -> Result<FireRecord, Error> {
        self.call(Method::POST, &path(name, "/trigger")?, None)
            .await
    }

    /// Fires each tick of a schedule in `range`.
    pub async fn backfill_schedule(
        &self,
        name: &str,
        range: BackfillRange,
    ) -> Result<BackfillReport, Error> {
        let body = BackfillRequest {
            from: rfc3339(range.from),
            to: rfc3339(range.to),
        };
        self.call(Method::POST, &path(name, "/backfill")?, json(&body)?)
            .await
    }
}

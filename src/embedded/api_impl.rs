//! The embedded [`Scheduler`] as an [`Api`]: the same calls, served over
//! HTTP by `cronoq dev` and `http::router`. It lives with the scheduler so
//! that `api` names no shell.

use crate::api::{
    check_recent_limit, Api, ApiError, ApiFuture, BackfillRange, BackfillReport,
    CreateScheduleRequest, FireRecord, Health, ScheduleEntry, ScheduleInfo,
};
use crate::core::{ErrorCode, Snapshot, TaskId};
use crate::metrics::MetricsSnapshot;
use crate::task::{Task, TaskStatus};
use crate::wire::WireError;

use super::{Error, Scheduler};

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        WireError::new(e.code(), e.to_string())
    }
}

impl Api for Scheduler {
    fn submit(&self, task: Task) -> ApiFuture<'_, TaskId> {
        Box::pin(async move { Ok(self.submit_id(task, self.inner.eager_start)?) })
    }

    fn task(&self, id: TaskId) -> ApiFuture<'_, TaskStatus> {
        Box::pin(async move {
            Scheduler::task(self, id)
                .ok_or_else(|| WireError::new(ErrorCode::NOT_FOUND, format!("task {id} not found")))
        })
    }

    fn cancel(&self, id: TaskId) -> ApiFuture<'_, ()> {
        Box::pin(async move { Ok(Scheduler::cancel(self, id)?) })
    }

    fn snapshot(&self) -> ApiFuture<'_, Snapshot> {
        Box::pin(async move { Ok(Scheduler::snapshot(self)) })
    }

    fn recent_tasks(&self, limit: usize) -> ApiFuture<'_, Vec<TaskStatus>> {
        Box::pin(async move {
            check_recent_limit(limit)?;
            Ok(Scheduler::recent_tasks(self, limit))
        })
    }

    fn health(&self) -> Health {
        Health {
            live: true,
            ready: true,
            detail: "embedded scheduler".into(),
        }
    }

    fn metrics(&self) -> ApiFuture<'_, MetricsSnapshot> {
        Box::pin(async move { Ok(Scheduler::metrics(self)) })
    }

    fn create_schedule(&self, spec: CreateScheduleRequest) -> ApiFuture<'_, ScheduleInfo> {
        Box::pin(async move { Ok(self.schedule(spec)?) })
    }

    fn list_schedules(&self) -> ApiFuture<'_, Vec<ScheduleEntry>> {
        Box::pin(async move { Ok(Scheduler::list_schedules(self)) })
    }

    fn get_schedule(&self, name: String) -> ApiFuture<'_, ScheduleInfo> {
        Box::pin(async move { Ok(Scheduler::get_schedule(self, &name)?) })
    }

    fn pause_schedule(&self, name: String) -> ApiFuture<'_, ScheduleInfo> {
        Box::pin(async move { Ok(Scheduler::pause_schedule(self, &name, true)?) })
    }

    fn resume_schedule(&self, name: String) -> ApiFuture<'_, ScheduleInfo> {
        Box::pin(async move { Ok(Scheduler::pause_schedule(self, &name, false)?) })
    }

    fn delete_schedule(&self, name: String) -> ApiFuture<'_, ()> {
        Box::pin(async move { Ok(Scheduler::delete_schedule(self, &name)?) })
    }

    fn trigger_schedule(&self, name: String) -> ApiFuture<'_, FireRecord> {
        Box::pin(async move { Ok(Scheduler::trigger_schedule(self, &name)?) })
    }

    fn backfill_schedule(
        &self,
        name: String,
        range: BackfillRange,
    ) -> ApiFuture<'_, BackfillReport> {
        Box::pin(async move { Ok(Scheduler::backfill_schedule(self, &name, range)?) })
    }
}

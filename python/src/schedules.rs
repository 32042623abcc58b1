//! Schedules (issue 23) for Python: one class, [`Schedules`], over any
//! [`cronoq::api::Api`] — the embedded scheduler's, or a NATS or HTTP
//! client's — so `Scheduler` and `Client` offer the same calls with the
//! same arguments.
//!
//! Arguments are converted and the schedule validated at the call, so a
//! bad one raises `InvalidArgument` before anything is sent; the call then
//! returns an awaitable of the API's answer as JSON text, which the
//! Python half (`cronoq/__init__.py`) turns into dataclasses. Durations
//! are text (`"5m"`) or, as everywhere in the package, a `timedelta` or
//! seconds.

use std::sync::Arc;

use cronoq::api::{Api, BackfillRange, BackfillRequest};
use cronoq::core::Millis;
use cronoq::schedule::{Overlap, ScheduleSpec, TaskTemplate};
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::convert::{self, integer};
use crate::errors::{error, invalid, rejection};

/// Schedule calls on one API (see `cronoq.Scheduler.schedule`).
#[pyclass(frozen, module = "cronoq._native")]
pub struct Schedules {
    api: Arc<dyn Api>,
}

impl Schedules {
    /// Schedule calls on `api`.
    pub fn new(api: Arc<dyn Api>) -> Schedules {
        Schedules { api }
    }
}

/// A duration argument as the spec's text: a `str` as given (`"5m"`),
/// else a `timedelta` or seconds in milliseconds.
fn span(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<String>> {
    let Some(obj) = obj else {
        return Ok(None);
    };
    if let Ok(text) = obj.cast::<PyString>() {
        return Ok(Some(text.to_cow()?.into_owned()));
    }
    let d = convert::duration(obj, what)?;
    Ok(Some(format!("{}ms", d.as_millis())))
}

fn overlap(text: Option<&str>) -> PyResult<Overlap> {
    match text {
        None | Some("allow") => Ok(Overlap::Allow),
        Some("skip") => Ok(Overlap::Skip),
        Some("buffer_one") => Ok(Overlap::BufferOne),
        Some("cancel_previous") => Ok(Overlap::CancelPrevious),
        Some(other) => Err(invalid(format!(
            "overlap must be \"allow\", \"skip\", \"buffer_one\" or \"cancel_previous\", not {other:?}"
        ))),
    }
}

/// An instant of a backfill range: RFC 3339 text (read as
/// `POST /v1/schedules/{name}/backfill` reads it), a `datetime`, or a
/// duration from now.
fn instant(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Millis> {
    if let Ok(text) = obj.cast::<PyString>() {
        let text = text.to_cow()?.into_owned();
        let one = BackfillRequest {
            from: text.clone(),
            to: text,
        };
        let range = one
            .range()
            .map_err(|e| error(&e.code, e.message.replacen("from", what, 1)))?;
        return Ok(range.from);
    }
    convert::time(obj, what)?
        .duration_since(std::time::UNIX_EPOCH)
        .map(Millis::from_duration)
        .map_err(|_| invalid(format!("{what} is before 1970")))
}

/// Runs `call` on the API in tokio; an awaitable of its answer as JSON.
fn answer<'py, T, F>(py: Python<'py>, api: &Arc<dyn Api>, call: F) -> PyResult<Bound<'py, PyAny>>
where
    T: serde::Serialize + Send + 'static,
    F: for<'a> FnOnce(&'a dyn Api) -> cronoq::api::ApiFuture<'a, T> + Send + 'static,
{
    let api = api.clone();
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        let value = call(&*api).await.map_err(|e| error(&e.code, e.message))?;
        serde_json::to_string(&value)
            .map_err(|e| error(&cronoq::core::ErrorCode::INTERNAL, e.to_string()))
    })
}

fn checked_name(name: &str) -> PyResult<String> {
    cronoq::schedule::check_schedule_name(name).map_err(rejection)?;
    Ok(name.to_string())
}

#[pymethods]
impl Schedules {
    /// Creates a schedule; an awaitable of its info (JSON).
    #[pyo3(signature = (name, *, cron = None, every = None, tz = None, overlap = None,
                        catchup_window = None, jitter = None, paused = false, payload = None,
                        pool = None, labels = None, priority = None, max_attempts = None,
                        attempt_timeout = None, deadline = None))]
    #[allow(clippy::too_many_arguments)]
    fn create<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        cron: Option<String>,
        every: Option<&Bound<'py, PyAny>>,
        tz: Option<String>,
        overlap: Option<&str>,
        catchup_window: Option<&Bound<'py, PyAny>>,
        jitter: Option<&Bound<'py, PyAny>>,
        paused: bool,
        payload: Option<&Bound<'py, PyAny>>,
        pool: Option<String>,
        labels: Option<&Bound<'py, PyAny>>,
        priority: Option<&Bound<'py, PyAny>>,
        max_attempts: Option<&Bound<'py, PyAny>>,
        attempt_timeout: Option<&Bound<'py, PyAny>>,
        deadline: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let spec = ScheduleSpec {
            name: name.to_string(),
            cron,
            every: span(every, "every")?,
            tz,
            overlap: self::overlap(overlap)?,
            catchup_window: span(catchup_window, "catchup_window")?,
            jitter: span(jitter, "jitter")?,
            paused,
            task: TaskTemplate {
                pool,
                labels: convert::labels(labels, "labels")?,
                priority: priority
                    .map(|p| integer::<i32>(p, "priority", "a 32-bit integer"))
                    .transpose()?
                    .unwrap_or(0),
                payload: payload
                    .map(|p| convert::payload(p, "payload"))
                    .transpose()?
                    .unwrap_or_default(),
                max_attempts: max_attempts
                    .map(|n| integer::<u32>(n, "max_attempts", "a positive 32-bit integer"))
                    .transpose()?,
                attempt_timeout: span(attempt_timeout, "attempt_timeout")?,
                deadline: span(deadline, "deadline")?,
            },
        };
        spec.validate().map_err(rejection)?;
        answer(py, &self.api, move |api| api.create_schedule(spec))
    }

    /// Every schedule; an awaitable of a JSON list.
    fn list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        answer(py, &self.api, |api| api.list_schedules())
    }

    /// One schedule; an awaitable of its info (JSON).
    fn get<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let name = checked_name(name)?;
        answer(py, &self.api, move |api| api.get_schedule(name))
    }

    /// Pauses a schedule; an awaitable of its info (JSON).
    fn pause<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let name = checked_name(name)?;
        answer(py, &self.api, move |api| api.pause_schedule(name))
    }

    /// Resumes a schedule; an awaitable of its info (JSON).
    fn resume<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let name = checked_name(name)?;
        answer(py, &self.api, move |api| api.resume_schedule(name))
    }

    /// Deletes a schedule; an awaitable.
    fn delete<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let name = checked_name(name)?;
        answer(py, &self.api, move |api| api.delete_schedule(name))
    }

    /// Runs a schedule's task once now; an awaitable of the fire (JSON).
    fn trigger<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let name = checked_name(name)?;
        answer(py, &self.api, move |api| api.trigger_schedule(name))
    }

    /// Fires each tick from `start` to `end` (inclusive); an awaitable of
    /// the report (JSON).
    fn backfill<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        start: &Bound<'py, PyAny>,
        end: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let name = checked_name(name)?;
        let range = BackfillRange::new(instant(start, "start")?, instant(end, "end")?)
            .map_err(|e| error(&e.code, e.message))?;
        answer(py, &self.api, move |api| api.backfill_schedule(name, range))
    }
}

//! Python values to cronoq values and back.
//!
//! In: payloads (`bytes`, `bytearray`, or `str` as UTF-8), labels (a
//! `dict` of `str` to `str`, or `"k=v,k=v"` text), durations (a
//! `datetime.timedelta` or a number of seconds) and times (a
//! `datetime.datetime` — a naive one is local time, as
//! `datetime.timestamp()` reads it — or a duration from now). A value of
//! the wrong type or out of range is `InvalidArgument` naming the argument.
//!
//! Out: [`TaskContext`], [`Outcome`], [`TaskStatus`], [`Attempt`] and
//! [`NativeSnapshot`], read-only views that convert their fields when read.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use cronoq::core::{Labels, Millis, Snapshot};
use cronoq::task::{AttemptRecord, SubmitOptions};
use cronoq::Task;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDateTime, PyDelta, PyDict, PyFloat, PyInt, PyString};

use crate::errors::{invalid, rejection};

/// The Python type name of `obj`, for messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// A payload: `bytes`, `bytearray` or `str` (UTF-8).
pub fn payload(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Bytes> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Bytes::copy_from_slice(b.as_bytes()));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Bytes::copy_from_slice(s.to_cow()?.as_bytes()));
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(Bytes::from(b.to_vec()));
    }
    Err(invalid(format!(
        "{what} must be bytes or str, not {}",
        type_name(obj)
    )))
}

/// Labels: `None` (none), a dict of str to str, or `"k=v,k=v"`; validated.
pub fn labels(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Labels> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Labels::new());
    };
    let labels = if let Ok(text) = obj.cast::<PyString>() {
        Labels::parse(&text.to_cow()?).map_err(rejection)?
    } else if let Ok(dict) = obj.cast::<PyDict>() {
        let mut labels = Labels::new();
        for (k, v) in dict.iter() {
            let (Ok(k), Ok(v)) = (k.cast::<PyString>(), v.cast::<PyString>()) else {
                return Err(invalid(format!(
                    "{what} must map str to str, not {} to {}",
                    type_name(&k),
                    type_name(&v)
                )));
            };
            labels.insert(k.to_cow()?, v.to_cow()?);
        }
        labels
    } else {
        return Err(invalid(format!(
            "{what} must be a dict of str to str (or \"k=v,k=v\" text), not {}",
            type_name(obj)
        )));
    };
    labels.validate().map_err(rejection)?;
    Ok(labels)
}

/// Checks labels as the scheduler would, without using them.
#[pyfunction]
#[pyo3(signature = (labels, what = "labels"))]
pub fn check_labels(labels: &Bound<'_, PyAny>, what: &str) -> PyResult<()> {
    self::labels(Some(labels), what).map(|_| ())
}

/// Labels as a new dict.
pub fn labels_dict<'py>(py: Python<'py>, labels: &Labels) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (k, v) in labels.iter() {
        dict.set_item(k, v)?;
    }
    Ok(dict)
}

/// A duration: `timedelta` or seconds (int or float), not negative.
pub fn duration(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Duration> {
    let seconds: f64 = if obj.is_instance_of::<PyDelta>() {
        obj.call_method0("total_seconds")?.extract()?
    } else if (obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<pyo3::types::PyBool>())
        || obj.is_instance_of::<PyFloat>()
    {
        obj.extract()?
    } else {
        return Err(invalid(format!(
            "{what} must be a datetime.timedelta or a number of seconds, not {}",
            type_name(obj)
        )));
    };
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(invalid(format!(
            "{what} must be a finite, non-negative duration, not {seconds} s"
        )));
    }
    Duration::try_from_secs_f64(seconds)
        .map_err(|_| invalid(format!("{what} of {seconds} s is out of range")))
}

/// A time: a `datetime` (naive = local time), or a duration from now.
pub fn time(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<SystemTime> {
    if obj.is_instance_of::<PyDateTime>() {
        let seconds: f64 = obj.call_method0("timestamp")?.extract()?;
        if !seconds.is_finite() || seconds < 0.0 {
            return Err(invalid(format!("{what} is before 1970")));
        }
        return Duration::try_from_secs_f64(seconds)
            .ok()
            .and_then(|d| UNIX_EPOCH.checked_add(d))
            .ok_or_else(|| invalid(format!("{what} is out of range")));
    }
    let from_now = duration(obj, what).map_err(|_| {
        invalid(format!(
            "{what} must be a datetime.datetime, or a datetime.timedelta or number of seconds from now, not {}",
            type_name(obj)
        ))
    })?;
    SystemTime::now()
        .checked_add(from_now)
        .ok_or_else(|| invalid(format!("{what} is out of range")))
}

/// An integer argument in range for `T`.
pub fn integer<T: for<'a, 'py> FromPyObject<'a, 'py>>(
    obj: &Bound<'_, PyAny>,
    what: &str,
    range: &str,
) -> PyResult<T> {
    if !obj.is_instance_of::<PyInt>() || obj.is_instance_of::<pyo3::types::PyBool>() {
        return Err(invalid(format!(
            "{what} must be an int, not {}",
            type_name(obj)
        )));
    }
    obj.extract::<T>()
        .map_err(|_| invalid(format!("{what} must be {range}, not {obj}")))
}

/// The keyword arguments shared by every `submit` (embedded and clients).
pub struct TaskArgs<'a, 'py> {
    pub payload: &'a Bound<'py, PyAny>,
    pub pool: &'a str,
    pub labels: Option<&'a Bound<'py, PyAny>>,
    pub priority: Option<&'a Bound<'py, PyAny>>,
    pub deadline: Option<&'a Bound<'py, PyAny>>,
    pub start_at: Option<&'a Bound<'py, PyAny>>,
    pub tolerance: Option<&'a Bound<'py, PyAny>>,
    pub max_attempts: Option<&'a Bound<'py, PyAny>>,
    pub idempotency_key: Option<&'a Bound<'py, PyAny>>,
    pub attempt_timeout: Option<&'a Bound<'py, PyAny>>,
    pub est_runtime: Option<&'a Bound<'py, PyAny>>,
    pub backoff: Option<&'a Bound<'py, PyAny>>,
    pub fairness_key: Option<&'a Bound<'py, PyAny>>,
    pub fairness_weight: Option<&'a Bound<'py, PyAny>>,
    pub concurrency_key: Option<&'a Bound<'py, PyAny>>,
    pub concurrency_limit: Option<&'a Bound<'py, PyAny>>,
    pub concurrency_policy: Option<&'a Bound<'py, PyAny>>,
    pub preemptible: Option<&'a Bound<'py, PyAny>>,
}

/// A keyword that must be a `str`.
fn text(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<String>> {
    match given(obj) {
        Some(o) => Ok(Some(
            o.cast::<PyString>()
                .map_err(|_| invalid(format!("{what} must be a str, not {}", type_name(o))))?
                .to_cow()?
                .into_owned(),
        )),
        None => Ok(None),
    }
}

fn given<'a, 'py>(o: Option<&'a Bound<'py, PyAny>>) -> Option<&'a Bound<'py, PyAny>> {
    o.filter(|o| !o.is_none())
}

impl TaskArgs<'_, '_> {
    /// The task: every argument checked for type and range here, then the
    /// one conversion of submission options every path shares
    /// ([`cronoq::task::SubmitOptions::into_task`]), so a bad option is
    /// refused with the message HTTP, the CLI and plain publishes give (the
    /// scheduler validates the rest on submit).
    pub fn to_task(&self) -> PyResult<Task> {
        let backoff = match given(self.backoff) {
            Some(b) => {
                let pair: (Bound<'_, PyAny>, Bound<'_, PyAny>) = b.extract().map_err(|_| {
                    invalid(format!(
                        "backoff must be a pair (initial, max) of durations, not {}",
                        type_name(b)
                    ))
                })?;
                Some((
                    duration(&pair.0, "backoff initial")?,
                    duration(&pair.1, "backoff max")?,
                ))
            }
            None => None,
        };
        let idempotency_key = match given(self.idempotency_key) {
            Some(key) => Some(
                key.cast::<PyString>()
                    .map_err(|_| {
                        invalid(format!(
                            "idempotency_key must be a str, not {}",
                            type_name(key)
                        ))
                    })?
                    .to_cow()?
                    .into_owned(),
            ),
            None => None,
        };
        let options = SubmitOptions {
            payload: payload(self.payload, "payload")?,
            pool: Some(self.pool.to_string()),
            labels: labels(self.labels, "labels")?,
            priority: given(self.priority)
                .map(|p| integer::<i32>(p, "priority", "a 32-bit signed integer"))
                .transpose()?,
            deadline: given(self.deadline)
                .map(|d| time(d, "deadline"))
                .transpose()?,
            start_at: given(self.start_at)
                .map(|s| time(s, "start_at"))
                .transpose()?,
            tolerance: given(self.tolerance)
                .map(|t| duration(t, "tolerance"))
                .transpose()?,
            max_attempts: given(self.max_attempts)
                .map(|n| integer::<u32>(n, "max_attempts", "a positive 32-bit integer"))
                .transpose()?,
            attempt_timeout: given(self.attempt_timeout)
                .map(|t| duration(t, "attempt_timeout"))
                .transpose()?,
            est_runtime: given(self.est_runtime)
                .map(|e| duration(e, "est_runtime"))
                .transpose()?,
            backoff,
            idempotency_key,
            traceparent: None,
            fairness_key: text(self.fairness_key, "fairness_key")?,
            fairness_weight: given(self.fairness_weight)
                .map(|w| integer::<u32>(w, "fairness_weight", "an integer from 1 to 1000"))
                .transpose()?,
            concurrency_key: text(self.concurrency_key, "concurrency_key")?,
            concurrency_limit: given(self.concurrency_limit)
                .map(|n| integer::<u32>(n, "concurrency_limit", "a positive 32-bit integer"))
                .transpose()?,
            concurrency_policy: text(self.concurrency_policy, "concurrency_policy")?
                .as_deref()
                .map(cronoq::ConcurrencyPolicy::parse)
                .transpose()
                .map_err(rejection)?,
            preemptible: match given(self.preemptible) {
                Some(p) => Some(
                    p.cast::<pyo3::types::PyBool>()
                        .map_err(|_| {
                            invalid(format!("preemptible must be a bool, not {}", type_name(p)))
                        })?
                        .is_true(),
                ),
                None => None,
            },
        };
        options.into_task().map_err(rejection)
    }
}

fn datetime_of(py: Python<'_>, at: Millis) -> PyResult<Bound<'_, PyDateTime>> {
    (UNIX_EPOCH + Duration::from_millis(at.0)).into_pyobject(py)
}

/// What an executor or handler sees of the attempt it runs.
#[pyclass(frozen, module = "cronoq")]
pub struct TaskContext {
    /// The task's id.
    #[pyo3(get)]
    pub task_id: u64,
    /// The attempt, from 1.
    #[pyo3(get)]
    pub attempt: u32,
    pub pool: cronoq::PoolName,
    pub group: Labels,
    /// The attempt's W3C trace context (its span's, with telemetry on).
    #[pyo3(get)]
    pub traceparent: Option<String>,
}

impl TaskContext {
    pub fn new(ctx: cronoq::TaskContext) -> TaskContext {
        TaskContext {
            task_id: ctx.task_id.0,
            attempt: ctx.attempt,
            pool: ctx.pool,
            group: ctx.group,
            traceparent: ctx.traceparent,
        }
    }
}

#[pymethods]
impl TaskContext {
    /// The pool.
    #[getter]
    fn pool(&self) -> &str {
        self.pool.as_str()
    }

    /// The labels of the group this attempt runs in (empty: unlabeled).
    #[getter]
    fn group<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        labels_dict(py, &self.group)
    }

    fn __repr__(&self) -> String {
        format!(
            "TaskContext(task_id={}, attempt={}, pool={:?}, group={:?})",
            self.task_id,
            self.attempt,
            self.pool.as_str(),
            self.group.to_string()
        )
    }
}

/// One attempt of a task.
#[pyclass(frozen, module = "cronoq")]
pub struct Attempt {
    record: AttemptRecord,
}

#[pymethods]
impl Attempt {
    /// The attempt number, from 1.
    #[getter]
    fn attempt(&self) -> u32 {
        self.record.attempt
    }

    /// The labels of the group it ran in.
    #[getter]
    fn group<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        labels_dict(py, &self.record.group)
    }

    /// The remote worker that ran it (distributed mode), else `None`.
    #[getter]
    fn worker(&self) -> Option<&str> {
        self.record.worker.as_deref()
    }

    /// When it started (UTC).
    #[getter]
    fn started_at<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDateTime>> {
        datetime_of(py, self.record.started_at)
    }

    /// When it ended (UTC), if it did.
    #[getter]
    fn ended_at<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDateTime>>> {
        self.record.ended_at.map(|t| datetime_of(py, t)).transpose()
    }

    /// `"succeeded"`, `"failed"`, `"lost"` or `"cancelled"`, once ended.
    #[getter]
    fn outcome(&self) -> Option<&str> {
        self.record.outcome.as_deref()
    }

    /// The error of a failed attempt (a Python executor's traceback).
    #[getter]
    fn error(&self) -> Option<&str> {
        self.record.error.as_deref()
    }

    fn __repr__(&self) -> String {
        format!(
            "Attempt(attempt={}, group={:?}, outcome={:?})",
            self.record.attempt,
            self.record.group.to_string(),
            self.record.outcome.as_deref()
        )
    }
}

fn attempts(py: Python<'_>, records: &[AttemptRecord]) -> PyResult<Vec<Py<Attempt>>> {
    records
        .iter()
        .map(|r| Py::new(py, Attempt { record: r.clone() }))
        .collect()
}

/// A finished task of the embedded scheduler.
#[pyclass(frozen, module = "cronoq")]
pub struct Outcome {
    pub inner: Arc<cronoq::Outcome>,
}

#[pymethods]
impl Outcome {
    /// The task's id.
    #[getter]
    fn id(&self) -> u64 {
        self.inner.id.0
    }

    /// Its pool.
    #[getter]
    fn pool(&self) -> &str {
        self.inner.pool.as_str()
    }

    /// `"succeeded"`, `"failed"`, `"cancelled"` or `"missed"`.
    #[getter]
    fn state(&self) -> &'static str {
        self.inner.state.as_str()
    }

    /// The task succeeded.
    #[getter]
    fn ok(&self) -> bool {
        self.inner.is_success()
    }

    /// The output of the successful attempt.
    #[getter]
    fn output<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.inner.output.as_ref().map(|b| PyBytes::new(py, b))
    }

    /// The error of the last failed attempt.
    #[getter]
    fn error(&self) -> Option<&str> {
        self.inner.error.as_deref()
    }

    /// Every attempt, in order.
    #[getter]
    fn attempts(&self, py: Python<'_>) -> PyResult<Vec<Py<Attempt>>> {
        attempts(py, &self.inner.attempts)
    }

    /// The labels of the group of the last attempt (`None`: it never ran).
    #[getter]
    fn group<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.inner.group().map(|g| labels_dict(py, g)).transpose()
    }

    /// It finished after its deadline.
    #[getter]
    fn deadline_missed(&self) -> bool {
        self.inner.deadline_missed
    }

    fn __repr__(&self) -> String {
        format!(
            "Outcome(id={}, state={:?}, group={:?})",
            self.inner.id,
            self.inner.state.as_str(),
            self.inner.group().map(|g| g.to_string())
        )
    }
}

/// A task as a lookup shows it: live or finished.
#[pyclass(frozen, module = "cronoq")]
pub struct TaskStatus {
    pub inner: cronoq::TaskStatus,
}

#[pymethods]
impl TaskStatus {
    /// The task's id.
    #[getter]
    fn id(&self) -> u64 {
        self.inner.id.0
    }

    /// Its pool.
    #[getter]
    fn pool(&self) -> &str {
        self.inner.pool.as_str()
    }

    /// `"scheduled"`, `"queued"`, `"running"`, `"succeeded"`, `"failed"`,
    /// `"cancelled"` or `"missed"`.
    #[getter]
    fn state(&self) -> &'static str {
        self.inner.state.as_str()
    }

    /// Why it waits, while it does (`"no_group_matches"`, `"groups_full"`, …).
    #[getter]
    fn reason(&self) -> Option<&'static str> {
        self.inner.reason.map(|r| r.as_str())
    }

    /// The key it waits for: its fairness key when `reason` is `"quota"`,
    /// its concurrency key when `"concurrency"` (SPEC §9).
    #[getter]
    fn reason_key(&self) -> Option<String> {
        self.inner.reason_key.clone()
    }

    /// It has finished (succeeded, failed, cancelled or missed).
    #[getter]
    fn done(&self) -> bool {
        self.inner.state.is_terminal()
    }

    /// It succeeded.
    #[getter]
    fn ok(&self) -> bool {
        self.inner.state == cronoq::TaskState::Succeeded
    }

    /// The output, once succeeded.
    #[getter]
    fn output<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.inner.output_bytes().map(|b| PyBytes::new(py, &b))
    }

    /// The error of the last failed attempt.
    #[getter]
    fn error(&self) -> Option<&str> {
        self.inner.error.as_deref()
    }

    /// Attempts so far.
    #[getter]
    fn attempts(&self, py: Python<'_>) -> PyResult<Vec<Py<Attempt>>> {
        attempts(py, &self.inner.attempts)
    }

    /// The labels of the group of the last attempt (`None`: it never ran).
    #[getter]
    fn group<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.inner
            .attempts
            .last()
            .map(|a| labels_dict(py, &a.group))
            .transpose()
    }

    /// It finished after its deadline.
    #[getter]
    fn deadline_missed(&self) -> bool {
        self.inner.deadline_missed
    }

    /// The schedule that fired it (`None`: none did).
    #[getter]
    fn schedule(&self) -> Option<&str> {
        self.inner.schedule.as_deref()
    }

    /// The tick it was fired for, a `datetime` like `Attempt.started_at`
    /// (`None`: no schedule).
    #[getter]
    fn scheduled_at<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDateTime>>> {
        self.inner
            .scheduled_at
            .map(|t| datetime_of(py, t))
            .transpose()
    }

    fn __repr__(&self) -> String {
        format!(
            "TaskStatus(id={}, state={:?}, reason={:?})",
            self.inner.id,
            self.inner.state.as_str(),
            self.inner.reason.map(|r| r.as_str())
        )
    }
}

/// A snapshot as the Rust crate has it; `cronoq.Snapshot` wraps it.
#[pyclass(frozen, module = "cronoq._native")]
pub struct NativeSnapshot {
    pub inner: Snapshot,
}

#[pymethods]
impl NativeSnapshot {
    /// The JSON of `GET /v1/snapshot`.
    fn json(&self) -> PyResult<String> {
        serde_json::to_string(&self.inner).map_err(|e| invalid(e.to_string()))
    }

    /// The table `cronoq snapshot` prints.
    fn table(&self) -> String {
        self.inner.to_table()
    }
}

/// `fairness={"team-a": 3, ...}`: each key's weight (`[[pools.fairness]]`).
pub fn fairness_weights(obj: &Bound<'_, PyAny>) -> PyResult<Vec<cronoq::core::FairnessWeight>> {
    let dict = obj.cast::<PyDict>().map_err(|_| {
        invalid(format!(
            "fairness must be a dict of key to weight, not {}",
            type_name(obj)
        ))
    })?;
    let mut out = Vec::with_capacity(dict.len());
    for (key, weight) in dict.iter() {
        let key = text(Some(&key), "fairness key")?.unwrap_or_default();
        let weight = integer::<u32>(&weight, "fairness weight", "an integer from 1 to 1000")?;
        out.push(cronoq::core::FairnessWeight { key, weight });
    }
    Ok(out)
}

/// `quotas=[{"key": "team-b", "labels": {"gpu": "a100"}, "max_running": 8}]`
/// (`[[pools.quotas]]`).
pub fn quotas(obj: &Bound<'_, PyAny>) -> PyResult<Vec<cronoq::core::QuotaConfig>> {
    let shape = || {
        invalid(format!(
            "quotas must be a list of dicts with key, labels and max_running, not {}",
            type_name(obj)
        ))
    };
    let list: Vec<Bound<'_, PyAny>> = obj.extract().map_err(|_| shape())?;
    let mut out = Vec::with_capacity(list.len());
    for item in list {
        let dict = item.cast::<PyDict>().map_err(|_| shape())?;
        let mut quota = cronoq::core::QuotaConfig {
            key: String::new(),
            labels: cronoq::Labels::new(),
            max_running: 0,
        };
        let mut has_max = false;
        for (name, value) in dict.iter() {
            match name.extract::<String>().unwrap_or_default().as_str() {
                "key" => quota.key = text(Some(&value), "quota key")?.unwrap_or_default(),
                "labels" => quota.labels = labels(Some(&value), "quota labels")?,
                "max_running" => {
                    has_max = true;
                    quota.max_running =
                        integer::<u32>(&value, "quota max_running", "a non-negative integer")?;
                }
                other => {
                    return Err(invalid(format!(
                        "a quota has key, labels and max_running, not {other:?}"
                    )))
                }
            }
        }
        if !has_max {
            return Err(invalid("a quota needs max_running"));
        }
        out.push(quota);
    }
    Ok(out)
}

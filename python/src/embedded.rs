//! The embedded [`cronoq::Scheduler`] for Python. Capacity, submissions,
//! cancels and snapshots go straight to it, with the GIL released while
//! it schedules; executors are Python functions reached through a
//! [`Bridge`], and waits hand their outcomes back through it.

use std::sync::{Arc, Mutex};

use cronoq::core::{Backoff, Millis, OnMiss, PoolConfig, Preemption, TaskId};
use pyo3::prelude::*;

use crate::bridge::Bridge;
use crate::convert::{self, integer, NativeSnapshot, TaskArgs, TaskStatus};
use crate::errors::{embedded, invalid};
use crate::runtime;

/// The embedded scheduler (see `cronoq.Scheduler`).
#[pyclass(frozen, module = "cronoq._native")]
pub struct Scheduler {
    inner: cronoq::Scheduler,
}

fn slots(obj: &Bound<'_, PyAny>) -> PyResult<u32> {
    integer::<u32>(obj, "slots", "a non-negative 32-bit integer")
}

#[pymethods]
impl Scheduler {
    #[new]
    #[pyo3(signature = (*, max_payload_bytes = None, retain_finished = None, telemetry = false))]
    fn new(
        max_payload_bytes: Option<usize>,
        retain_finished: Option<usize>,
        telemetry: bool,
    ) -> PyResult<Self> {
        let mut builder = cronoq::Scheduler::builder();
        if telemetry {
            builder = builder.telemetry(crate::telemetry::process_telemetry()?);
        }
        if let Some(n) = max_payload_bytes {
            builder = builder.max_payload_bytes(n);
        }
        if let Some(n) = retain_finished {
            builder = builder.retain_finished(n);
        }
        let _runtime = runtime().enter();
        Ok(Scheduler {
            inner: builder.build().map_err(embedded)?,
        })
    }

    fn set_capacity(&self, py: Python<'_>, pool: &str, slots: &Bound<'_, PyAny>) -> PyResult<()> {
        let slots = self::slots(slots)?;
        py.detach(|| {
            let _runtime = runtime().enter();
            self.inner.set_capacity(pool, slots)
        })
        .map_err(embedded)
    }

    fn set_group_capacity(
        &self,
        py: Python<'_>,
        pool: &str,
        labels: &Bound<'_, PyAny>,
        slots: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let labels = convert::labels(Some(labels), "labels")?;
        let slots = self::slots(slots)?;
        py.detach(|| {
            let _runtime = runtime().enter();
            self.inner.set_group_capacity(pool, labels, slots)
        })
        .map_err(embedded)
    }

    #[pyo3(signature = (pool, *, max_attempts = None, urgency_window = None, max_bypass = None,
                        reservation_lead = None, on_miss = None, autoscale_min = None,
                        autoscale_max = None, backoff = None, fairness = None, quotas = None,
                        preemption = None, preemption_grace = None))]
    #[allow(clippy::too_many_arguments)]
    fn configure_pool(
        &self,
        py: Python<'_>,
        pool: &str,
        max_attempts: Option<&Bound<'_, PyAny>>,
        urgency_window: Option<&Bound<'_, PyAny>>,
        max_bypass: Option<&Bound<'_, PyAny>>,
        reservation_lead: Option<&Bound<'_, PyAny>>,
        on_miss: Option<&str>,
        autoscale_min: Option<&Bound<'_, PyAny>>,
        autoscale_max: Option<&Bound<'_, PyAny>>,
        backoff: Option<&Bound<'_, PyAny>>,
        fairness: Option<&Bound<'_, PyAny>>,
        quotas: Option<&Bound<'_, PyAny>>,
        preemption: Option<&str>,
        preemption_grace: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let mut config = PoolConfig::default();
        let u32_of = |o: &Bound<'_, PyAny>, what: &str| {
            integer::<u32>(o, what, "a non-negative 32-bit integer")
        };
        if let Some(n) = max_attempts {
            config.max_attempts = u32_of(n, "max_attempts")?;
        }
        if let Some(d) = urgency_window {
            config.urgency_window = Millis::from_duration(convert::duration(d, "urgency_window")?);
        }
        if let Some(n) = max_bypass {
            config.max_bypass = u32_of(n, "max_bypass")?;
        }
        if let Some(d) = reservation_lead {
            config.reservation_lead =
                Millis::from_duration(convert::duration(d, "reservation_lead")?);
        }
        if let Some(m) = on_miss {
            config.on_miss = match m {
                "skip" => OnMiss::Skip,
                "run" => OnMiss::Run,
                other => {
                    return Err(invalid(format!(
                        "on_miss must be \"skip\" or \"run\", not {other:?}"
                    )))
                }
            };
        }
        if let Some(n) = autoscale_min {
            config.autoscale_min = u32_of(n, "autoscale_min")?;
        }
        if let Some(n) = autoscale_max {
            config.autoscale_max = u32_of(n, "autoscale_max")?;
        }
        if let Some(b) = backoff {
            let (initial, max): (Bound<'_, PyAny>, Bound<'_, PyAny>) = b
                .extract()
                .map_err(|_| invalid("backoff must be a pair (initial, max) of durations"))?;
            config.backoff = Backoff {
                initial: Millis::from_duration(convert::duration(&initial, "backoff initial")?),
                max: Millis::from_duration(convert::duration(&max, "backoff max")?),
            };
        }
        if let Some(f) = fairness {
            config.fairness = convert::fairness_weights(f)?;
        }
        if let Some(q) = quotas {
            config.quotas = convert::quotas(q)?;
        }
        if let Some(p) = preemption {
            config.preemption = match p {
                "off" => Preemption::Off,
                "priority" => Preemption::Priority,
                other => {
                    return Err(invalid(format!(
                        "preemption must be \"off\" or \"priority\", not {other:?}"
                    )))
                }
            };
        }
        if let Some(d) = preemption_grace {
            config.preemption_grace =
                Millis::from_duration(convert::duration(d, "preemption_grace")?);
        }
        py.detach(|| {
            let _runtime = runtime().enter();
            self.inner.configure_pool(pool, config)
        })
        .map_err(embedded)
    }

    /// Registers Python function number `slot` of `bridge` as the pool's
    /// executor.
    fn executor(&self, pool: &str, bridge: &Bridge, slot: u32) -> PyResult<()> {
        self.inner
            .executor(pool, bridge.shared.executor(slot))
            .map_err(embedded)
    }

    #[pyo3(signature = (payload, *, pool = "default", labels = None, priority = None,
                        deadline = None, start_at = None, tolerance = None, max_attempts = None,
                        idempotency_key = None, attempt_timeout = None, est_runtime = None,
                        backoff = None, fairness_key = None, fairness_weight = None,
                        concurrency_key = None, concurrency_limit = None,
                        concurrency_policy = None, preemptible = None))]
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &self,
        py: Python<'_>,
        payload: &Bound<'_, PyAny>,
        pool: &str,
        labels: Option<&Bound<'_, PyAny>>,
        priority: Option<&Bound<'_, PyAny>>,
        deadline: Option<&Bound<'_, PyAny>>,
        start_at: Option<&Bound<'_, PyAny>>,
        tolerance: Option<&Bound<'_, PyAny>>,
        max_attempts: Option<&Bound<'_, PyAny>>,
        idempotency_key: Option<&Bound<'_, PyAny>>,
        attempt_timeout: Option<&Bound<'_, PyAny>>,
        est_runtime: Option<&Bound<'_, PyAny>>,
        backoff: Option<&Bound<'_, PyAny>>,
        fairness_key: Option<&Bound<'_, PyAny>>,
        fairness_weight: Option<&Bound<'_, PyAny>>,
        concurrency_key: Option<&Bound<'_, PyAny>>,
        concurrency_limit: Option<&Bound<'_, PyAny>>,
        concurrency_policy: Option<&Bound<'_, PyAny>>,
        preemptible: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<TaskHandle> {
        let task = TaskArgs {
            payload,
            pool,
            labels,
            priority,
            deadline,
            start_at,
            tolerance,
            max_attempts,
            idempotency_key,
            attempt_timeout,
            est_runtime,
            backoff,
            fairness_key,
            fairness_weight,
            concurrency_key,
            concurrency_limit,
            concurrency_policy,
            preemptible,
        }
        .to_task()?;
        let handle = py
            .detach(|| {
                let _runtime = runtime().enter();
                self.inner.submit_now(task)
            })
            .map_err(embedded)?;
        Ok(TaskHandle {
            id: handle.id().0,
            handle: Mutex::new(Some(handle)),
        })
    }

    fn cancel(&self, py: Python<'_>, id: u64) -> PyResult<()> {
        py.detach(|| {
            let _runtime = runtime().enter();
            self.inner.cancel(TaskId(id))
        })
        .map_err(embedded)
    }

    /// A task's status (live or recently finished), or `None`.
    fn task(&self, py: Python<'_>, id: u64) -> Option<TaskStatus> {
        py.detach(|| self.inner.task(TaskId(id)))
            .map(|inner| TaskStatus { inner })
    }

    fn snapshot(&self, py: Python<'_>) -> NativeSnapshot {
        NativeSnapshot {
            inner: py.detach(|| self.inner.snapshot()),
        }
    }

    /// The schedule calls on this scheduler.
    fn schedules(&self) -> crate::schedules::Schedules {
        crate::schedules::Schedules::new(Arc::new(self.inner.clone()))
    }

    /// Waits for task `id` (live or recently finished): its outcome comes
    /// through `bridge` under the returned key.
    fn watch(&self, id: u64, bridge: &Bridge) -> u64 {
        let sched = self.inner.clone();
        bridge.watch(async move { sched.wait(TaskId(id)).await.map(Arc::new) })
    }
}

/// A submitted task of the embedded scheduler (see `cronoq.TaskHandle`).
#[pyclass(frozen, module = "cronoq._native")]
pub struct TaskHandle {
    /// The task's id.
    #[pyo3(get)]
    id: u64,
    handle: Mutex<Option<cronoq::TaskHandle>>,
}

#[pymethods]
impl TaskHandle {
    /// Waits for the outcome through `bridge`: the waiter's key, or `None`
    /// if this handle was already waited on (then wait by id).
    fn watch(&self, bridge: &Bridge) -> Option<u64> {
        let handle = self
            .handle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()?;
        Some(bridge.watch(async move { handle.wait().await.map(Arc::new) }))
    }
}

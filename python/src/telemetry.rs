//! OpenTelemetry export for the Python package: off unless asked
//! (`cronoq.enable_telemetry()`, `Scheduler(telemetry=True)`), and then
//! only as the standard `OTEL_*` env vars configure it.
//!
//! One exporter per process, shared by every scheduler and worker: the
//! embedded scheduler hands it each finished task's spans, and a `tracing`
//! subscriber with its layer (installed here if the process has none)
//! exports a remote `Worker`'s attempt spans.

use std::sync::Mutex;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::runtime;

/// `None`: not asked yet; `Some(None)`: asked, and the env turned it off.
static TELEMETRY: Mutex<Option<Option<cronoq::telemetry::Telemetry>>> = Mutex::new(None);

/// The process's exporter, started from the env on first use (`None`:
/// the env configures none).
pub fn process_telemetry() -> PyResult<Option<cronoq::telemetry::Telemetry>> {
    let mut held = TELEMETRY.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(telemetry) = held.as_ref() {
        return Ok(telemetry.clone());
    }
    let started = {
        let _runtime = runtime().enter();
        cronoq::telemetry::Telemetry::from_env("cronoq-python")
            .map_err(|e| PyValueError::new_err(format!("{e} [{}]", e.code())))?
    };
    if let Some(telemetry) = &started {
        // A remote Worker's spans are `tracing` spans: exported by this
        // layer (when the process has no subscriber of its own yet).
        let _ = tracing_subscriber::registry()
            .with(telemetry.layer())
            .try_init();
    }
    *held = Some(started.clone());
    Ok(started)
}

/// Starts exporting traces as the `OTEL_*` env vars say; `True` when they
/// configure an endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`), `False` when
/// telemetry stays off. Idempotent.
#[pyfunction]
pub fn enable_telemetry() -> PyResult<bool> {
    Ok(process_telemetry()?.is_some())
}

/// Exports what is queued (waiting at most `timeout` seconds) and stops
/// exporting. Registered with `atexit` by the package.
#[pyfunction]
#[pyo3(signature = (timeout = 5.0))]
pub fn shutdown_telemetry(py: Python<'_>, timeout: f64) {
    let telemetry = TELEMETRY
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .flatten();
    if let Some(telemetry) = telemetry {
        let timeout = Duration::from_secs_f64(timeout.clamp(0.0, 60.0));
        py.detach(|| runtime().block_on(telemetry.shutdown(timeout)));
    }
}

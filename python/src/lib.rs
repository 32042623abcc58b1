//! `cronoq._native`: the Rust half of the `cronoq` Python package.
//!
//! Everything here wraps the `cronoq` crate — the same core, embedded
//! scheduler, remote worker and clients — and converts at the boundary;
//! no scheduling decision is made here. The Python half (`cronoq/`) adds
//! the decorators, the asyncio side of the [`bridge`] (which runs Python
//! executors on the event loop) and the result classes.
//!
//! Map:
//! - [`errors`]: stable codes to the Python exception classes of
//!   `cronoq._errors`;
//! - [`convert`]: Python arguments (payloads, labels, durations, times) to
//!   a [`cronoq::Task`], and outcomes back to Python objects;
//! - [`bridge`]: jobs from tokio to the asyncio loop and answers back,
//!   in batches, with a pipe to wake the loop;
//! - [`embedded`]: the embedded `Scheduler`;
//! - [`remote`]: the remote `Worker` and the NATS/HTTP `Client`;
//! - [`schedules`]: schedule calls over either (`Scheduler.schedule`,
//!   `Client.schedule`, …);
//! - [`telemetry`]: the opt-in OpenTelemetry export (`OTEL_*` env).

use pyo3::prelude::*;

pub mod bridge;
pub mod convert;
pub mod embedded;
pub mod errors;
pub mod remote;
pub mod schedules;
pub mod telemetry;

/// The tokio runtime every scheduler, worker and client of this process
/// runs on (pyo3-async-runtimes' shared multi-threaded runtime).
pub fn runtime() -> &'static tokio::runtime::Runtime {
    pyo3_async_runtimes::tokio::get_runtime()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<bridge::Bridge>()?;
    m.add_class::<bridge::Job>()?;
    m.add_class::<convert::TaskContext>()?;
    m.add_class::<convert::Outcome>()?;
    m.add_class::<convert::TaskStatus>()?;
    m.add_class::<convert::Attempt>()?;
    m.add_class::<convert::NativeSnapshot>()?;
    m.add_class::<embedded::Scheduler>()?;
    m.add_class::<embedded::TaskHandle>()?;
    m.add_class::<remote::Worker>()?;
    m.add_class::<remote::Client>()?;
    m.add_class::<schedules::Schedules>()?;
    m.add_function(wrap_pyfunction!(convert::check_labels, m)?)?;
    m.add_function(wrap_pyfunction!(errors::error_codes, m)?)?;
    m.add_function(wrap_pyfunction!(telemetry::enable_telemetry, m)?)?;
    m.add_function(wrap_pyfunction!(telemetry::shutdown_telemetry, m)?)?;
    Ok(())
}

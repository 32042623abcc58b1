//! Errors to Python: every error carries a stable code, and becomes an
//! instance of the class of `cronoq._errors` for that code
//! (`InvalidArgument`, `NotFound`, …; `cronoq.Error` for a code this
//! build does not know), with `.code` set.

use cronoq::core::{ErrorCode, Rejection};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;

static CLASSES: PyOnceLock<Py<PyDict>> = PyOnceLock::new();

/// A Python exception for `code` with `message`.
pub fn error(code: &ErrorCode, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::attach(|py| match build(py, code, &message) {
        Ok(err) => err,
        Err(e) => e,
    })
}

fn build(py: Python<'_>, code: &ErrorCode, message: &str) -> PyResult<PyErr> {
    let classes = CLASSES.get_or_try_init(py, || -> PyResult<Py<PyDict>> {
        let module = py.import("cronoq._errors")?;
        Ok(module
            .getattr("CLASSES_BY_CODE")?
            .cast_into::<PyDict>()?
            .unbind())
    })?;
    let classes = classes.bind(py);
    let instance = match classes.get_item(code.as_str())? {
        Some(class) => class.call1((message,))?,
        None => {
            let base = py.import("cronoq._errors")?.getattr("Error")?;
            base.call1((message, code.as_str()))?
        }
    };
    Ok(PyErr::from_value(instance))
}

/// Every stable code this build knows, in documentation order: the one
/// list (`ErrorCode::ALL`) that `cronoq._errors` has a class for each of
/// (checked by `python/tests/test_bad_input.py`).
#[pyfunction]
pub fn error_codes() -> Vec<String> {
    ErrorCode::ALL
        .iter()
        .map(|code| code.as_str().to_string())
        .collect()
}

/// `INVALID_ARGUMENT` with `message`.
pub fn invalid(message: impl Into<String>) -> PyErr {
    error(&ErrorCode::INVALID_ARGUMENT, message)
}

/// A core rejection.
pub fn rejection(r: Rejection) -> PyErr {
    error(&r.code(), r.to_string())
}

/// An embedded scheduler error.
pub fn embedded(e: cronoq::embedded::Error) -> PyErr {
    error(&e.code(), e.to_string())
}

/// A client error, with its sources (`a: b: c`).
pub fn client(e: cronoq::client::Error) -> PyErr {
    let wire = cronoq::wire::WireError::from(e);
    error(&wire.code, wire.message)
}

/// A worker error.
pub fn worker(e: cronoq::worker::Error) -> PyErr {
    let wire = cronoq::wire::WireError::from(e);
    error(&wire.code, wire.message)
}

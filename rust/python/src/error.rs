//! The one place core errors become Python exceptions.
//!
//! | core `Error`          | Python                                              |
//! |-----------------------|-----------------------------------------------------|
//! | `NotFound`            | `FileNotFoundError`                                 |
//! | `Io`                  | `OSError` (`PermissionError` when access is denied) |
//! | `Shard`               | `shardstream.ShardError` (a `ShardstreamError`)     |
//! | `Schema`              | `shardstream.SchemaError` (also a `ValueError`)     |
//! | `State`               | `shardstream.StateError` (also a `ValueError`)      |
//! | `ShardsChanged`       | `shardstream.ShardsChangedError` (a `StateError`)   |
//! | `Config`              | `ValueError`                                        |
//! | `Internal`, a panic   | `shardstream.ShardstreamError`                      |
//!
//! The exception classes live in `shardstream/errors.py` (plain Python, so they can inherit from
//! both `ShardstreamError` and a built-in, and pickle across DataLoader worker processes); each
//! is looked up once per process.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyPermissionError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use shardstream_core::error::panic_message;
use shardstream_core::Error;

static SHARDSTREAM_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static SHARD_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static SCHEMA_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static STATE_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static SHARDS_CHANGED_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn raise<'py>(
    py: Python<'py>,
    class: &PyOnceLock<Py<PyType>>,
    name: &str,
    args: impl pyo3::call::PyCallArgs<'py>,
    msg: &str,
) -> PyErr {
    match class.import(py, "shardstream.errors", name) {
        Ok(cls) => match cls.call1(args) {
            Ok(inst) => PyErr::from_value(inst),
            Err(e) => e,
        },
        // Only if the Python package is broken; still never a panic.
        Err(_) => PyValueError::new_err(msg.to_string()),
    }
}

pub fn to_py(py: Python<'_>, err: Error) -> PyErr {
    let msg = err.to_string();
    match err {
        Error::NotFound { .. } => PyFileNotFoundError::new_err(msg),
        Error::Io { ref source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => {
            PyPermissionError::new_err(msg)
        }
        Error::Io { .. } => PyOSError::new_err(msg),
        Error::Shard { .. } => raise(py, &SHARD_ERROR, "ShardError", (msg.clone(),), &msg),
        Error::Schema(_) => raise(py, &SCHEMA_ERROR, "SchemaError", (msg.clone(),), &msg),
        Error::State(_) => raise(py, &STATE_ERROR, "StateError", (msg.clone(),), &msg),
        Error::ShardsChanged {
            added,
            changed,
            removed,
            ..
        } => raise(
            py,
            &SHARDS_CHANGED_ERROR,
            "ShardsChangedError",
            (msg.clone(), added, changed, removed),
            &msg,
        ),
        Error::Config(_) => PyValueError::new_err(msg),
        Error::Internal(_) => raise(
            py,
            &SHARDSTREAM_ERROR,
            "ShardstreamError",
            (msg.clone(),),
            &msg,
        ),
    }
}

/// Run core code with the GIL released, turning both errors and panics into core errors.
/// A panic (e.g. from a decoder on a corrupt page) must not cross into Python: pyo3 would raise
/// `PanicException`, a `BaseException` that training loops don't catch.
pub fn detach<T: Send>(py: Python<'_>, f: impl FnOnce() -> Result<T, Error> + Send) -> PyResult<T> {
    py.detach(|| guard(f)).map_err(|e| to_py(py, e))
}

pub fn guard<T>(f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => Err(Error::Internal(panic_message(&*payload))),
    }
}

/// A core error as a Python exception, for conversions that fail on the Python side.
pub fn state_error(py: Python<'_>, msg: String) -> PyErr {
    to_py(py, Error::State(msg))
}

//! The one place core errors become Python exceptions.
//!
//! | core `Error`          | Python                                              |
//! |-----------------------|-----------------------------------------------------|
//! | `NotFound`            | `FileNotFoundError`                                 |
//! | `Io`                  | `OSError` (`PermissionError` when access is denied) |
//! | `Shard`               | `shardstream.ShardError` (a `ShardstreamError`)     |
//! | `Schema`              | `shardstream.SchemaError` (also a `ValueError`)     |
//! | `State`               | `shardstream.StateError` (also a `ValueError`)      |
//! | `Config`              | `ValueError`                                        |
//! | `Internal`, a panic   | `shardstream.ShardstreamError`                      |
//!
//! The exception classes live in `shardstream/errors.py` (plain Python, so they can inherit from
//! both `ShardstreamError` and a built-in, and pickle across DataLoader worker processes).

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyPermissionError, PyValueError};
use pyo3::prelude::*;
use shardstream_core::error::panic_message;
use shardstream_core::Error;

fn shardstream_exc(py: Python<'_>, class: &str, msg: String) -> PyErr {
    match py
        .import("shardstream.errors")
        .and_then(|m| m.getattr(class))
    {
        Ok(cls) => match cls.call1((msg.clone(),)) {
            Ok(inst) => PyErr::from_value(inst),
            Err(e) => e,
        },
        // Only if the Python package is broken; still never a panic.
        Err(_) => PyValueError::new_err(msg),
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
        Error::Shard { .. } => shardstream_exc(py, "ShardError", msg),
        Error::Schema(_) => shardstream_exc(py, "SchemaError", msg),
        Error::State(_) => shardstream_exc(py, "StateError", msg),
        Error::Config(_) => PyValueError::new_err(msg),
        Error::Internal(_) => shardstream_exc(py, "ShardstreamError", msg),
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

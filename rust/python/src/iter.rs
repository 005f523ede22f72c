//! `RawIter`: the batch-mode `__next__` of a dataset's iterator (`_iterator.StreamIterator`
//! subclasses it), so that a batch costs no Python frame: the iterator's own checks, the core
//! stream's `next_item` and, for `output="arrow"`, nothing else. Everything else an iterator
//! does (state, skips, replay, row mode) stays in Python and reaches the stream through `_raw`.

use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};

use crate::stream::RawStream;

/// Base of `StreamIterator`. `owner` is the dataset (a `ParquetStream` or `Mixture`): its
/// `_iter` says whether this iterator is the newest, its `_open_stream()` makes the core stream
/// at the first `next()`. `conv` turns an item into the output: its `batch(item)` is called
/// unless `conv.passthrough` is true (the item is the output: `output="arrow"`).
#[pyclass(name = "RawIter", module = "shardstream._core", subclass)]
pub struct RawIter {
    owner: Option<Py<PyAny>>,
    /// `conv.batch`, or `None` to hand items out as they come.
    convert: Option<Py<PyAny>>,
    /// The core stream (`RawStream` or `RawMixStream`), made at the first `next()`.
    raw: Option<Py<PyAny>>,
    batched: bool,
    ended: bool,
}

impl RawIter {
    fn owner<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match &self.owner {
            Some(o) => Ok(o.bind(py).clone()),
            None => Err(PyRuntimeError::new_err("this iterator was cleared")),
        }
    }
}

/// The stream of `slf`, made by its owner's `_open_stream()` on first use.
fn raw<'py>(slf: &Bound<'py, RawIter>) -> PyResult<Bound<'py, PyAny>> {
    let py = slf.py();
    let owner = {
        let this = slf.borrow();
        if let Some(r) = &this.raw {
            return Ok(r.bind(py).clone());
        }
        this.owner(py)?
    };
    // No borrow is held while Python runs (`_open_stream` may look at this iterator).
    let made = owner.call_method0(intern!(py, "_open_stream"))?;
    let mut this = slf.borrow_mut();
    match &this.raw {
        // Made meanwhile (re-entered): keep the first, as the Python property did.
        Some(r) => Ok(r.bind(py).clone()),
        None => {
            this.raw = Some(made.clone().unbind());
            Ok(made)
        }
    }
}

#[pymethods]
impl RawIter {
    #[new]
    #[pyo3(signature = (owner, conv, batched))]
    fn new(owner: &Bound<'_, PyAny>, conv: &Bound<'_, PyAny>, batched: bool) -> PyResult<Self> {
        let py = owner.py();
        let passthrough = match conv.getattr_opt(intern!(py, "passthrough"))? {
            Some(v) => v.is_truthy()?,
            None => false,
        };
        let convert = if passthrough {
            None
        } else {
            Some(conv.getattr(intern!(py, "batch"))?.unbind())
        };
        Ok(RawIter {
            owner: Some(owner.clone().unbind()),
            convert,
            raw: None,
            batched,
            ended: false,
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// Batch mode: the next item, converted. (Row mode: `RowIterator` defines its own.)
    fn __next__<'py>(slf: &Bound<'py, Self>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = slf.py();
        let (owner, convert) = {
            let this = slf.borrow();
            if this.ended {
                return Ok(None);
            }
            if !this.batched {
                return Err(PyRuntimeError::new_err(
                    "RawIter.__next__ is for batch mode; row mode iterates in RowIterator",
                ));
            }
            (
                this.owner(py)?,
                this.convert.as_ref().map(|c| c.clone_ref(py)),
            )
        };
        if !owner.getattr(intern!(py, "_iter"))?.is(slf) {
            slf.borrow_mut().ended = true; // like a generator that raised: finished from now on
            return Err(PyRuntimeError::new_err(format!(
                "this iterator is stale: the same {} has been iterated again or given another \
                 position (iter(), load_state_dict(), set_epoch(), skip()) since it was made, and \
                 only the newest iterator owns the dataset's position",
                owner.get_type().name()?
            )));
        }
        let raw = raw(slf)?;
        let item = match raw.cast::<RawStream>() {
            Ok(stream) => stream.get().next(py)?,
            Err(_) => {
                let it = raw.call_method0(intern!(py, "next_item"))?;
                (!it.is_none()).then_some(it)
            }
        };
        let Some(item) = item else {
            slf.borrow_mut().ended = true;
            return Ok(None);
        };
        match convert {
            None => Ok(Some(item)),
            Some(c) => c.bind(py).call1((item,)).map(Some),
        }
    }

    /// Whether the core stream was made (the first `next()` happened).
    #[getter]
    fn started(&self) -> bool {
        self.raw.is_some()
    }

    /// The core stream, made now if it was not yet.
    #[getter(_raw)]
    fn get_raw<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        raw(slf)
    }

    /// The pass ended (or the iterator went stale): `next()` raises `StopIteration`.
    #[getter]
    fn get_ended(&self) -> bool {
        self.ended
    }

    #[setter]
    fn set_ended(&mut self, ended: bool) {
        self.ended = ended;
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.owner)?;
        visit.call(&self.convert)?;
        visit.call(&self.raw)
    }

    fn __clear__(&mut self) {
        self.owner = None;
        self.convert = None;
        self.raw = None;
    }
}

//! `RawMixStream`: one iterator's mixed stream (one slot); `RawMixChunk`: an item handed over
//! as its sources' rows plus each row's source.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use shardstream_core::mix::{MixItem, MixStream, SourceStats};
use shardstream_core::{Error, Layout};

use crate::convert::BatchOut;
use crate::error::{detach, guard, to_py};
use crate::mix_resume::{mixture_state_with_ids, RawMixResume};
use crate::mixture::RawMixture;

/// `(rank, world_size, worker, num_workers)` as the core's layout under the mixture's `even`.
pub fn layout(
    py: Python<'_>,
    mixture: &RawMixture,
    (rank, world, worker, workers): (u64, u64, u64, u64),
) -> PyResult<Layout> {
    Layout::new(rank, world, worker, workers, mixture.inner.settings.even).map_err(|e| to_py(py, e))
}

/// An item as its sources' rows: `tags[i]` is row `i`'s source (index into the mixture's
/// names), `parts[s]` that source's rows in order (`None` when it has none here).
#[pyclass(name = "RawMixChunk", module = "shardstream._core", frozen)]
pub struct RawMixChunk {
    #[pyo3(get)]
    tags: Vec<u16>,
    parts: Vec<Option<arrow_array::RecordBatch>>,
    out: Arc<BatchOut>,
}

#[pymethods]
impl RawMixChunk {
    #[getter]
    fn num_rows(&self) -> usize {
        self.tags.len()
    }

    #[getter]
    fn parts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for p in &self.parts {
            match p {
                Some(b) => out.append(self.out.to_pyarrow(py, b.clone())?)?,
                None => out.append(py.None())?,
            }
        }
        Ok(out)
    }
}

/// One slot's mixed stream; `None` after an internal error (refuses further use).
#[pyclass(name = "RawMixStream", module = "shardstream._core", frozen)]
pub struct RawMixStream {
    inner: Mutex<Option<MixStream>>,
    out: Arc<BatchOut>,
}

impl RawMixStream {
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut MixStream) -> Result<T, Error> + Send,
    ) -> PyResult<T> {
        detach(py, || {
            let mut guard_ = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let stream = guard_.as_mut().ok_or_else(|| {
                Error::Internal(
                    "this stream hit an internal error earlier; load the last state into a new one"
                        .into(),
                )
            })?;
            let r = guard(|| f(stream));
            if matches!(r, Err(Error::Internal(_))) {
                *guard_ = None;
            }
            r
        })
    }
}

#[pymethods]
impl RawMixStream {
    /// The stream of `layout` (rank, world_size, worker, num_workers), starting at `resume`.
    #[new]
    fn new(
        py: Python<'_>,
        mixture: &RawMixture,
        resume: &RawMixResume,
        layout: (u64, u64, u64, u64),
    ) -> PyResult<Self> {
        let workers = layout.3;
        let layout = self::layout(py, mixture, layout)?;
        let cfg = mixture.inner.clone();
        let workers = Some(workers.min(u32::MAX as u64) as u32);
        let stream = detach(py, || {
            MixStream::resume(cfg, layout, workers, &resume.inner)
        })?;
        Ok(RawMixStream {
            inner: Mutex::new(Some(stream)),
            out: Arc::default(),
        })
    }

    /// The next item: a `pyarrow.RecordBatch` (mixed batches), a `RawMixChunk` (by-source
    /// batches, or row mode), or `None` once the mixture has ended.
    fn next_item<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        Ok(match self.with(py, |s| s.next_item())? {
            None => None,
            Some(MixItem::Mixed(b)) => Some(self.out.to_pyarrow(py, b)?),
            Some(MixItem::Parts { tags, parts }) => {
                let out = self.out.clone();
                Some(Bound::new(py, RawMixChunk { tags, parts, out })?.into_any())
            }
        })
    }

    /// The state after the last item, or (row mode) after the first `within` rows of it.
    #[pyo3(signature = (within=None))]
    fn state_dict<'py>(
        &self,
        py: Python<'py>,
        within: Option<usize>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let (st, ids) = self.with(py, |s| s.checkpoint_ids(within))?;
        mixture_state_with_ids(py, &st, &ids)
    }

    /// Where the mixture's next stream starts: here, or the start of the pass once it ended.
    #[pyo3(signature = (within=None))]
    fn resume_point(&self, py: Python<'_>, within: Option<usize>) -> PyResult<RawMixResume> {
        let inner = self.with(py, |s| s.resume_point(within))?;
        Ok(RawMixResume { inner })
    }

    /// Indexes of the sources with weight but no rows left in this slot.
    fn barren_sources(&self, py: Python<'_>) -> PyResult<Vec<usize>> {
        self.with(py, |s| Ok(s.barren_sources()))
    }

    /// Per source in name order: `(items, epoch, rows of that epoch, weight, active)`, after the
    /// last item or (row mode) after its first `within` rows.
    #[pyo3(signature = (within=None))]
    fn source_stats(&self, py: Python<'_>, within: Option<usize>) -> PyResult<Vec<SourceStats>> {
        self.with(py, |s| s.source_stats(within))
    }
}

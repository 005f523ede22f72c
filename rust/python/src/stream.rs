//! `RawStream`: one iterator's stream (one slot), from a resume point to the end of the pass.

use std::sync::{Mutex, TryLockError};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use shardstream_core::{Error, Layout, Stream};

use crate::catalog::RawCatalog;
use crate::convert::{ids_to_py, BatchOut};
use crate::error::{detach, guard, to_py};
use crate::resume::{state_with_ids, RawResume};
use crate::settings::RawSettings;
use crate::state_dict::StateHead;

/// `(rank, world_size, worker, num_workers)` as the core's layout under `settings.even`.
pub fn layout(
    py: Python<'_>,
    settings: &RawSettings,
    (rank, world, worker, workers): (u64, u64, u64, u64),
) -> PyResult<Layout> {
    Layout::new(rank, world, worker, workers, settings.settings.even).map_err(|e| to_py(py, e))
}

/// One slot's stream. `None` after an internal error: the stream refuses further use rather
/// than continue from a state it can't trust.
#[pyclass(name = "RawStream", module = "shardstream._core", frozen)]
pub struct RawStream {
    inner: Mutex<Option<Stream>>,
    out: BatchOut,
    /// The fields of every state this stream saves that cannot change while it lives.
    head: StateHead,
}

/// `f` on the stream in `slot` (panics caught); an internal error retires the stream.
fn run<T>(
    slot: &mut Option<Stream>,
    f: impl FnOnce(&mut Stream) -> Result<T, Error>,
) -> Result<T, Error> {
    let stream = slot.as_mut().ok_or_else(|| {
        Error::Internal(
            "this stream hit an internal error earlier; load the last state into a new one".into(),
        )
    })?;
    let r = guard(|| f(stream));
    if matches!(r, Err(Error::Internal(_))) {
        *slot = None;
    }
    r
}

impl RawStream {
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Stream) -> Result<T, Error> + Send,
    ) -> PyResult<T> {
        detach(py, || {
            let mut guard_ = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            run(&mut guard_, f)
        })
    }

    /// `f` on the stream right now, without releasing the GIL, or `None` when another thread
    /// is inside the stream (then use [`Self::with`], which waits without the GIL).
    fn try_with<T>(
        &self,
        f: impl FnOnce(&mut Stream) -> Result<T, Error>,
    ) -> Option<Result<T, Error>> {
        let mut guard_ = match self.inner.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        Some(run(&mut guard_, f))
    }

    /// The next item as a `pyarrow.RecordBatch`, or `None` at the end of the pass (also
    /// called by `RawIter.__next__` directly, without a Python call).
    pub fn next<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        match self.with(py, |s| s.next_item())? {
            Some(b) => Ok(Some(self.out.to_pyarrow(py, b)?)),
            None => Ok(None),
        }
    }
}

#[pymethods]
impl RawStream {
    /// The stream of `layout` (rank, world_size, worker, num_workers), starting at `resume`.
    #[new]
    fn new(
        py: Python<'_>,
        catalog: &RawCatalog,
        settings: &RawSettings,
        resume: &RawResume,
        layout: (u64, u64, u64, u64),
    ) -> PyResult<Self> {
        let workers = layout.3;
        let layout = self::layout(py, settings, layout)?;
        let cat = catalog.inner.clone();
        let threads = settings
            .tuning
            .stream_threads(&cat, workers.min(u32::MAX as u64) as u32);
        let stream = detach(py, || {
            Stream::resume(
                cat,
                &settings.settings,
                &settings.tuning,
                layout,
                threads,
                &resume.inner,
            )
        })?;
        let head = StateHead::new(py, &stream.checkpoint_head())?;
        Ok(RawStream {
            inner: Mutex::new(Some(stream)),
            out: BatchOut::default(),
            head,
        })
    }

    /// The next item as a `pyarrow.RecordBatch` (a batch, or in row mode a chunk of rows), or
    /// `None` at the end of the pass.
    fn next_item<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.next(py)
    }

    /// The state after the last returned item, or (row mode) after the first `within` rows of
    /// the last returned chunk.
    ///
    /// Made while holding the stream and the GIL when no other thread is in the stream (the
    /// usual case): the buffer's `str` comes straight from the stream's row ids, with no copy
    /// of them and no release and re-acquire of the GIL. Only the `str` is made under the
    /// stream's lock: it is not a GC-tracked object, so making it runs no Python code (a
    /// finalizer that used this stream would deadlock). Everything else is `state_dict.rs`.
    #[pyo3(signature = (within=None))]
    fn state_dict<'py>(
        &self,
        py: Python<'py>,
        within: Option<usize>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let now = self.try_with(|s| {
            let parts = s.checkpoint_parts(within)?;
            let buffer = ids_to_py(py, &parts.ids);
            Ok((parts.position, buffer, parts.skips))
        });
        let (position, buffer, skips) = match now {
            Some(r) => {
                let (position, buffer, skips) = r.map_err(|e| to_py(py, e))?;
                (position, buffer?, skips)
            }
            None => {
                let (position, ids, skips) = self.with(py, |s| {
                    let parts = s.checkpoint_parts(within)?;
                    Ok((parts.position, parts.ids.into_owned(), parts.skips))
                })?;
                (position, ids_to_py(py, &ids)?, skips)
            }
        };
        self.head.state(py, &position, buffer, &skips)
    }

    /// `state_dict()` built the way it was before `state_dict.rs`: the whole state through the
    /// core's serde tree (`Stream::checkpoint_ids`). For tests, which compare the two.
    #[pyo3(signature = (within=None))]
    fn _state_dict_serde<'py>(
        &self,
        py: Python<'py>,
        within: Option<usize>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let (st, ids) = self.with(py, |s| s.checkpoint_ids(within))?;
        state_with_ids(py, &st, &ids)
    }

    /// Pass over the next `n` items without reading them (recorded in the state); in row mode
    /// `within` rows of the last chunk were yielded and the rest of it is dropped.
    #[pyo3(signature = (n, within=None))]
    fn skip(&self, py: Python<'_>, n: u64, within: Option<usize>) -> PyResult<()> {
        self.with(py, |s| s.skip_items(n, within))
    }

    /// Also replay skips (as `RawResume.with_replay`), from the current position on.
    #[pyo3(signature = (records=None, states=None))]
    fn add_replay(
        &self,
        py: Python<'_>,
        records: Option<&Bound<'_, PyAny>>,
        states: Option<&Bound<'_, pyo3::types::PyList>>,
    ) -> PyResult<()> {
        let found = crate::resume::replay_records(py, records, states)?;
        self.with(py, |s| {
            s.add_replay(found);
            Ok(())
        })
    }

    /// Where the dataset's next stream starts: here, or the start of the pass once it ended.
    #[pyo3(signature = (within=None))]
    fn resume_point(&self, py: Python<'_>, within: Option<usize>) -> PyResult<RawResume> {
        let inner = self.with(py, |s| s.resume_point(within))?;
        Ok(RawResume { inner })
    }
}

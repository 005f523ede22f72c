//! `RawRows`: random access to rows by global id (the map-style dataset's reader), one per
//! process (the Python layer makes a new one in each DataLoader worker).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use shardstream_core::access::parquet::ParquetRows;
use shardstream_core::access::Access;
use shardstream_core::settings::{access_threads, page_cache_bytes, Tuning};

use crate::catalog::RawCatalog;
use crate::convert::BatchOut;
use crate::error::{detach, to_py};
use crate::settings::int;

#[pyclass(name = "RawRows", module = "shardstream._core", frozen)]
pub struct RawRows {
    access: Access,
    parquet: Arc<ParquetRows>,
    out: BatchOut,
}

#[pymethods]
impl RawRows {
    /// Random access to `catalog`'s rows with a page cache of `page_cache_bytes` (0: none) and
    /// `threads` row groups read at once (`None`: automatic for `workers` DataLoader workers).
    #[new]
    #[pyo3(signature = (catalog, page_cache_bytes, threads=None, workers=1))]
    fn new(
        py: Python<'_>,
        catalog: &RawCatalog,
        page_cache_bytes: &Bound<'_, PyAny>,
        threads: Option<&Bound<'_, PyAny>>,
        workers: u32,
    ) -> PyResult<Self> {
        let bytes = self::page_cache_bytes(
            int("page_cache_bytes", page_cache_bytes, false)?.unwrap_or_default(),
        )
        .map_err(|e| to_py(py, e))?;
        let threads = match threads {
            Some(t) if !t.is_none() => {
                let t = int("threads", t, false)?.unwrap_or_default();
                Some(access_threads(t).map_err(|e| to_py(py, e))?)
            }
            _ => None,
        };
        let cat = catalog.inner.clone();
        let tuning = Tuning {
            readahead_threads: threads,
            ..Tuning::default()
        };
        let threads = tuning.threads(cat.is_remote(), workers.max(1));
        let parquet = Arc::new(ParquetRows::new(cat, bytes));
        Ok(RawRows {
            access: Access::new(parquet.clone(), threads),
            parquet,
            out: BatchOut::default(),
        })
    }

    #[getter]
    fn num_rows(&self) -> u64 {
        self.access.num_rows()
    }

    /// The rows `ids` (global row ids in `[0, num_rows)`, any order, repeats allowed) as one
    /// `pyarrow.RecordBatch` in that order.
    fn take<'py>(&self, py: Python<'py>, ids: Vec<u64>) -> PyResult<Bound<'py, PyAny>> {
        let batch = detach(py, || self.access.take(&ids))?;
        self.out.to_pyarrow(py, batch)
    }

    /// The page cache's counters in this process.
    fn cache_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.parquet.cache_stats();
        let d = PyDict::new(py);
        d.set_item("hits", s.hits)?;
        d.set_item("misses", s.misses)?;
        d.set_item("uncached", s.uncached)?;
        d.set_item("evictions", s.evictions)?;
        d.set_item("bytes", s.bytes)?;
        d.set_item("pages", s.pages)?;
        Ok(d)
    }
}

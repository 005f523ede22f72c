//! `RawCatalog`: the shard set (resolved paths, footers, schema, fingerprint), read once.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use pyo3_arrow::PySchema;
use shardstream_core::Catalog;

use crate::error::detach;

/// The shard set: resolved paths and footers, read once.
#[pyclass(name = "RawCatalog", module = "shardstream._core", frozen)]
pub struct RawCatalog {
    pub inner: Arc<Catalog>,
    /// What the stores were opened with: a pickled catalog reopens its stores with them.
    storage_options: BTreeMap<String, String>,
    /// The pickled form, made once however many workers it is sent to.
    snapshot: OnceLock<Py<PyBytes>>,
}

impl RawCatalog {
    fn wrap(cat: Catalog, storage_options: BTreeMap<String, String>) -> Self {
        RawCatalog {
            inner: Arc::new(cat),
            storage_options,
            snapshot: OnceLock::new(),
        }
    }
}

#[pymethods]
impl RawCatalog {
    #[new]
    #[pyo3(signature = (sources, columns=None, storage_options=None))]
    fn new(
        py: Python<'_>,
        sources: Vec<String>,
        columns: Option<Vec<String>>,
        storage_options: Option<BTreeMap<String, String>>,
    ) -> PyResult<Self> {
        let options = storage_options.unwrap_or_default();
        let cat = detach(py, || {
            Catalog::open_with(&sources, columns.as_deref(), &options)
        })?;
        Ok(RawCatalog::wrap(cat, options))
    }

    /// The catalog as JSON (`Catalog::snapshot`): every shard's metadata and schema, so a copy
    /// reopens without listing, stat-ing or reading footers.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        if let Some(b) = self.snapshot.get() {
            return Ok(b.bind(py).clone());
        }
        let cat = self.inner.clone();
        let data = detach(py, move || cat.snapshot())?;
        let b = PyBytes::new(py, &data);
        let _ = self.snapshot.set(b.clone().unbind());
        Ok(b)
    }

    /// A catalog from `snapshot()`'s bytes; footers are read (and checked against the
    /// recorded digests) when a shard is first used.
    #[staticmethod]
    #[pyo3(signature = (data, storage_options=None))]
    fn from_snapshot(
        py: Python<'_>,
        data: &[u8],
        storage_options: Option<BTreeMap<String, String>>,
    ) -> PyResult<Self> {
        let options = storage_options.unwrap_or_default();
        let cat = detach(py, || Catalog::from_snapshot(data, &options))?;
        Ok(RawCatalog::wrap(cat, options))
    }

    /// Pickling (spawn-started DataLoader workers): the snapshot, not a re-open.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let ctor = py.get_type::<RawCatalog>().getattr("from_snapshot")?;
        let args = (self.snapshot(py)?, self.storage_options.clone());
        (ctor, args).into_pyobject(py)
    }

    /// True when the shards come from object stores.
    #[getter]
    fn remote(&self) -> bool {
        self.inner.is_remote()
    }

    /// Object-store counters of this catalog in this process (zeros for local datasets).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("requests", s.requests)?;
        d.set_item("bytes", s.bytes)?;
        d.set_item("retries", s.retries)?;
        d.set_item("http_requests", s.http_requests)?;
        Ok(d)
    }

    #[getter]
    fn num_rows(&self) -> u64 {
        self.inner.total_rows()
    }

    #[getter]
    fn shard_paths(&self) -> Vec<String> {
        self.inner
            .shards()
            .iter()
            .map(|s| s.path.display().to_string())
            .collect()
    }

    #[getter]
    fn root(&self) -> String {
        self.inner.root().display().to_string()
    }

    /// Output schema as a `pyarrow.Schema`.
    #[getter]
    fn schema<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        PySchema::new(self.inner.schema().clone()).into_pyarrow(py)
    }

    fn fingerprint<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let f = self.inner.fingerprint();
        let d = PyDict::new(py);
        d.set_item("shards", f.shards)?;
        d.set_item("rows", f.rows)?;
        d.set_item("paths", &f.paths)?;
        d.set_item("content", &f.content)?;
        d.set_item("buckets", &f.buckets)?;
        Ok(d)
    }

    /// Write the metadata sidecar into the dataset root; returns its path.
    fn write_index(&self, py: Python<'_>) -> PyResult<String> {
        let cat = self.inner.clone();
        let path = detach(py, move || shardstream_core::catalog::sidecar::write(&cat))?;
        Ok(path.display().to_string())
    }

    /// Per-shard metadata: path, size, rows, page index, format (`parquet`, `ipc-file`,
    /// `ipc-stream`), row groups (IPC: record batches) `(rows, byte_offset, bytes)`.
    fn shards_info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for s in self.inner.shards() {
            let d = PyDict::new(py);
            d.set_item("path", s.path.display().to_string())?;
            d.set_item("rel_path", &s.rel_path)?;
            d.set_item("size", s.size)?;
            d.set_item("rows", s.num_rows)?;
            d.set_item("has_offset_index", s.has_offset_index())?;
            let format = match s.ipc() {
                None => "parquet",
                Some(i) if i.stream => "ipc-stream",
                Some(_) => "ipc-file",
            };
            d.set_item("format", format)?;
            let rgs: Vec<(u64, u64, u64)> = s
                .row_groups
                .iter()
                .map(|r| (r.num_rows, r.byte_offset, r.compressed_bytes))
                .collect();
            d.set_item("row_groups", rgs)?;
            out.append(d)?;
        }
        Ok(out)
    }
}

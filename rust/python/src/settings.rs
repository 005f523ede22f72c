//! `RawSettings`: the dataset's arguments, checked once and frozen; `DEFAULTS`.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString};
use shardstream_core::pack::PackSettings;
use shardstream_core::settings::{
    Args, DEFAULTS, MAP_DEFAULTS, MAX_AUTO_BATCH_ROWS, MAX_READAHEAD_DEPTH, MAX_READAHEAD_THREADS,
    MAX_READ_BATCH_ROWS,
};
use shardstream_core::{Settings, Tuning};

use crate::error::to_py;

/// The settings (what shapes the stream) and tuning (what doesn't) of one dataset.
#[pyclass(name = "RawSettings", module = "shardstream._core", frozen)]
pub struct RawSettings {
    pub settings: Settings,
    pub tuning: Tuning,
}

/// A Python int as an i128; beyond that range, the nearest bound (the core reports it out of
/// range, naming the argument). Bools are not ints here.
pub(crate) fn int(name: &str, v: &Bound<'_, PyAny>, or_none: bool) -> PyResult<Option<i128>> {
    if or_none && v.is_none() {
        return Ok(None);
    }
    if v.is_instance_of::<PyBool>() || !v.is_instance_of::<PyInt>() {
        let want = if or_none { "an int or None" } else { "an int" };
        return Err(PyTypeError::new_err(format!(
            "{name} must be {want}, got {} {v}",
            v.get_type().name()?
        )));
    }
    Ok(Some(v.extract::<i128>().unwrap_or_else(|_| {
        if v.lt(0).unwrap_or(false) {
            i128::MIN
        } else {
            i128::MAX
        }
    })))
}

#[pymethods]
impl RawSettings {
    #[new]
    #[pyo3(signature = (*, seed, shuffle_buffer, batch_size, drop_last, epochs, even,
                        read_batch_rows, readahead_threads, readahead_depth, pack=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        seed: &Bound<'_, PyAny>,
        shuffle_buffer: &Bound<'_, PyAny>,
        batch_size: &Bound<'_, PyAny>,
        drop_last: &Bound<'_, PyAny>,
        epochs: &Bound<'_, PyAny>,
        even: &Bound<'_, PyAny>,
        read_batch_rows: &Bound<'_, PyAny>,
        readahead_threads: &Bound<'_, PyAny>,
        readahead_depth: &Bound<'_, PyAny>,
        pack: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let Ok(drop_last) = drop_last.cast::<PyBool>() else {
            return Err(PyTypeError::new_err(format!(
                "drop_last must be a bool, got {} {drop_last}",
                drop_last.get_type().name()?
            )));
        };
        let even = if even.is_none() {
            None
        } else {
            Some(
                even.cast::<PyString>()
                    .map_err(|_| {
                        PyTypeError::new_err(format!(
                            "even must be 'drop', 'pad' or None, got {even}"
                        ))
                    })?
                    .to_str()?
                    .to_owned(),
            )
        };
        let args = Args {
            seed: int("seed", seed, false)?.unwrap_or_default(),
            shuffle_buffer: int("shuffle_buffer", shuffle_buffer, false)?.unwrap_or_default(),
            batch_size: int("batch_size", batch_size, true)?,
            drop_last: drop_last.is_true(),
            epochs: int("epochs", epochs, true)?,
            even,
            read_batch_rows: int("read_batch_rows", read_batch_rows, true)?,
            readahead_threads: int("readahead_threads", readahead_threads, true)?,
            readahead_depth: int("readahead_depth", readahead_depth, false)?.unwrap_or_default(),
        };
        let (mut settings, tuning) = Settings::from_args(&args).map_err(|e| to_py(py, e))?;
        if let Some(p) = pack.filter(|p| !p.is_none()) {
            // The Python `Pack` checked the types; the core checks the values.
            let v = crate::convert::to_value(p, "pack")?;
            settings.pack = Some(PackSettings::parse(v).map_err(|e| to_py(py, e))?);
        }
        Ok(RawSettings { settings, tuning })
    }

    /// Rows per item (`None`: row mode).
    #[getter]
    fn batch_size(&self) -> Option<u64> {
        self.settings.batch_size
    }

    #[getter]
    fn drop_last(&self) -> bool {
        self.settings.drop_last
    }
}

/// The arguments' defaults and limits, for the Python signature and docs (one place).
pub fn defaults(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    // None: sized by bytes (`Tuning::batch_rows`); the rest say how.
    d.set_item("read_batch_rows", py.None())?;
    d.set_item("read_batch_bytes", DEFAULTS.read_batch_bytes)?;
    d.set_item("fallback_read_batch_rows", DEFAULTS.read_batch_rows)?;
    d.set_item("max_auto_read_batch_rows", MAX_AUTO_BATCH_ROWS)?;
    d.set_item("readahead_depth", DEFAULTS.readahead_depth)?;
    d.set_item("even", DEFAULTS.even.name())?;
    d.set_item(
        "remote_readahead_threads",
        DEFAULTS.remote_readahead_threads,
    )?;
    d.set_item(
        "max_local_readahead_threads",
        DEFAULTS.max_local_readahead_threads,
    )?;
    d.set_item("row_chunk", DEFAULTS.row_chunk)?;
    d.set_item("max_read_batch_rows", MAX_READ_BATCH_ROWS)?;
    d.set_item("max_readahead_threads", MAX_READAHEAD_THREADS)?;
    d.set_item("max_readahead_depth", MAX_READAHEAD_DEPTH)?;
    d.set_item(
        "max_stratified_block",
        shardstream_core::mix::MAX_STRATIFIED_BLOCK,
    )?;
    d.set_item("page_cache_bytes", MAP_DEFAULTS.page_cache_bytes)?;
    d.set_item("window", MAP_DEFAULTS.window)?;
    d.set_item("sampler_chunk", MAP_DEFAULTS.sampler_chunk)?;
    Ok(d)
}

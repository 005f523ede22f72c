//! `shardstream._core`: thin bindings over `shardstream-core`. Only conversions live here (types
//! in this file, errors in `error.rs`); behaviour belongs in the core. Every call that reads or
//! decodes releases the GIL.

mod error;

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use pyo3_arrow::{PyRecordBatch, PySchema};
use shardstream_core::elastic::{check_states, merged_state};
use shardstream_core::state::{ids_from_base64, ids_to_base64};
use shardstream_core::{
    Catalog, Error, Even, Seek, Slot, SlotSpec, SlotState, Stream, StreamOptions,
};

use crate::error::{detach, to_py};

/// The shard set: resolved paths and footers, read once.
#[pyclass(name = "RawCatalog", module = "shardstream._core", frozen)]
struct RawCatalog {
    inner: Arc<Catalog>,
}

#[pymethods]
impl RawCatalog {
    #[new]
    #[pyo3(signature = (sources, columns=None))]
    fn new(py: Python<'_>, sources: Vec<String>, columns: Option<Vec<String>>) -> PyResult<Self> {
        let cat = detach(py, || Catalog::open(&sources, columns.as_deref()))?;
        Ok(RawCatalog {
            inner: Arc::new(cat),
        })
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
        Ok(d)
    }

    /// Per-shard metadata: path, size, rows, page index, row groups `(rows, byte_offset, bytes)`.
    fn shards_info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for s in self.inner.shards() {
            let d = PyDict::new(py);
            d.set_item("path", s.path.display().to_string())?;
            d.set_item("rel_path", &s.rel_path)?;
            d.set_item("size", s.size)?;
            d.set_item("rows", s.num_rows)?;
            d.set_item("has_offset_index", s.has_offset_index)?;
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

/// One slot's stream. `None` after an internal error: the stream refuses further use rather
/// than continue from a state it can't trust.
#[pyclass(name = "RawStream", module = "shardstream._core", frozen)]
struct RawStream {
    inner: Mutex<Option<Stream>>,
}

impl RawStream {
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Stream) -> Result<T, Error> + Send,
    ) -> PyResult<T> {
        detach(py, || {
            let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let stream = guard.as_mut().ok_or_else(|| {
                Error::Internal(
                    "this stream hit an internal error earlier; load the last state into a new one"
                        .into(),
                )
            })?;
            let r = error::guard(|| f(stream));
            if matches!(r, Err(Error::Internal(_))) {
                *guard = None;
            }
            r
        })
    }
}

#[pymethods]
impl RawStream {
    #[new]
    #[pyo3(signature = (catalog, *, seed, shuffle_buffer, first_epoch, epochs, slot_index, slot_count,
                        read_batch_rows=8192, readahead_threads=0, readahead_depth=2,
                        piece_rows=65536, even="off", keep_batch_start=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        catalog: &RawCatalog,
        seed: u64,
        shuffle_buffer: usize,
        first_epoch: u64,
        epochs: Option<u64>,
        slot_index: u32,
        slot_count: u32,
        read_batch_rows: usize,
        readahead_threads: usize,
        readahead_depth: usize,
        piece_rows: u64,
        even: &str,
        keep_batch_start: bool,
    ) -> PyResult<Self> {
        let even = parse_even(even).map_err(|e| to_py(py, e))?;
        let opts = StreamOptions {
            seed,
            shuffle_buffer,
            first_epoch,
            epochs,
            read_batch_rows,
            readahead_threads,
            readahead_depth,
            piece_rows,
            even,
        };
        let cat = catalog.inner.clone();
        let stream = detach(py, move || {
            let mut s = Stream::new(cat, opts, Slot::new(slot_index, slot_count)?)?;
            s.keep_batch_start(keep_batch_start);
            Ok(s)
        })?;
        Ok(RawStream {
            inner: Mutex::new(Some(stream)),
        })
    }

    /// Next batch of up to `max_rows` rows as a `pyarrow.RecordBatch`, or `None` at the end.
    fn next_batch<'py>(
        &self,
        py: Python<'py>,
        max_rows: usize,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        match self.with(py, |s| s.next_batch(max_rows))? {
            Some(b) => Ok(Some(PyRecordBatch::new(b).into_pyarrow(py)?)),
            None => Ok(None),
        }
    }

    /// Position after the last returned row (`within=None`) or after the first `within` rows of
    /// the last returned batch.
    #[pyo3(signature = (within=None))]
    fn state<'py>(&self, py: Python<'py>, within: Option<usize>) -> PyResult<Bound<'py, PyDict>> {
        let (st, buffer, seek) = self.with(py, |s| {
            let (st, text) = s.snapshot(within)?;
            let (st, text) = (st, text.to_owned());
            let seek = s.seek_of(&st);
            Ok((st, text, seek))
        })?;
        state_to_py(py, &st, &buffer, seek.as_ref())
    }

    fn restore(&self, py: Python<'_>, state: &Bound<'_, PyDict>) -> PyResult<()> {
        let st = state_from_py(py, state)?;
        let seek = seek_from_py(py, state)?;
        self.with(py, move |s| s.restore_checked(&st, seek.as_ref()))
    }

    /// Continue from the states of every slot of another (or the same) layout:
    /// `states` is a list of `(slot_index, slot_count, position)`, run with policy `even`.
    fn restore_merged(
        &self,
        py: Python<'_>,
        states: &Bound<'_, PyList>,
        even: &str,
    ) -> PyResult<()> {
        let (old, old_even) = merged_input(py, states, even)?;
        self.with(py, move |s| {
            let st = merged_state(s.catalog(), s.options(), &old, old_even, s.slot())?;
            s.restore(&st)
        })
    }

    /// Validate the states of several slots (as `restore_merged` would) without restoring.
    fn check_states(&self, py: Python<'_>, states: &Bound<'_, PyList>, even: &str) -> PyResult<()> {
        let (old, old_even) = merged_input(py, states, even)?;
        self.with(py, move |s| {
            check_states(s.catalog(), s.options(), &old, old_even)
        })
    }

    fn finished(&self, py: Python<'_>) -> PyResult<bool> {
        self.with(py, |s| Ok(s.finished()))
    }

    /// Rows held in retained decoded batches (memory diagnostics).
    fn retained_rows(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |s| Ok(s.retained_rows()))
    }
}

type MergedInput = (Vec<(Slot, SlotState)>, Even);

fn merged_input(py: Python<'_>, states: &Bound<'_, PyList>, even: &str) -> PyResult<MergedInput> {
    let old_even = parse_even(even).map_err(|e| to_py(py, Error::State(e.to_string())))?;
    let mut old = Vec::with_capacity(states.len());
    for item in states.iter() {
        let (index, count, d): (u32, u32, Bound<'_, PyDict>) = item.extract().map_err(|_| {
            to_py(
                py,
                Error::State(
                    "each merged state must be (slot_index, slot_count, position dict)".into(),
                ),
            )
        })?;
        let slot = Slot::new(index, count).map_err(|e| to_py(py, Error::State(e.to_string())))?;
        old.push((slot, state_from_py(py, &d)?));
    }
    Ok((old, old_even))
}

fn parse_even(even: &str) -> Result<Even, Error> {
    match even {
        "off" => Ok(Even::Off),
        "drop" => Ok(Even::Drop),
        "pad" => Ok(Even::Pad),
        other => Err(Error::Config(format!(
            "even must be 'off', 'drop' or 'pad', got {other:?}"
        ))),
    }
}

const SLOT_KEYS: [&str; 7] = [
    "epoch",
    "cursor",
    "emitted",
    "rng_word_pos",
    "buffer",
    "specs",
    "seek",
];
const SEEK_KEYS: [&str; 4] = ["shard", "row_group", "row", "byte_offset"];
const SPEC_KEYS: [&str; 3] = ["epoch", "ranges", "injected"];

/// `buffer` is the base64 text of `st`'s buffer (whose own `buffer` field is not read).
fn state_to_py<'py>(
    py: Python<'py>,
    st: &SlotState,
    buffer: &str,
    seek: Option<&Seek>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("epoch", st.epoch)?;
    d.set_item("cursor", st.cursor)?;
    d.set_item("emitted", st.emitted)?;
    d.set_item("rng_word_pos", st.rng_word_pos)?;
    d.set_item("buffer", buffer)?;
    let specs = PyList::empty(py);
    for (epoch, spec) in &st.specs {
        let sd = PyDict::new(py);
        sd.set_item("epoch", epoch)?;
        let ranges: Vec<(u64, u64)> = spec.ranges.iter().map(|r| (r.start, r.end)).collect();
        sd.set_item(
            "ranges",
            ranges
                .into_iter()
                .map(|(a, b)| vec![a, b])
                .collect::<Vec<_>>(),
        )?;
        sd.set_item("injected", ids_to_base64(&spec.injected))?;
        specs.append(sd)?;
    }
    d.set_item("specs", specs)?;
    match seek {
        Some(k) => {
            let sd = PyDict::new(py);
            sd.set_item("shard", &k.shard)?;
            sd.set_item("row_group", k.row_group)?;
            sd.set_item("row", k.row)?;
            sd.set_item("byte_offset", k.byte_offset)?;
            d.set_item("seek", sd)?;
        }
        None => d.set_item("seek", py.None())?,
    }
    Ok(d)
}

/// The optional, informational `seek` of a saved position (checked against it on restore).
fn seek_from_py(py: Python<'_>, d: &Bound<'_, PyDict>) -> PyResult<Option<Seek>> {
    let bad = |msg: String| to_py(py, Error::State(msg));
    let Some(v) = d.get_item("seek")? else {
        return Ok(None);
    };
    if v.is_none() {
        return Ok(None);
    }
    let sd = v
        .cast::<PyDict>()
        .map_err(|_| bad("slot state field \"seek\" must be a dict or None".into()))?;
    check_keys(py, sd, &SEEK_KEYS, "a slot seek")?;
    let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
        sd.get_item(k)?
            .ok_or_else(|| bad(format!("a slot seek is missing key {k:?}")))
    };
    let int = |k: &str| -> PyResult<u64> {
        let v = get(k)?;
        if v.is_instance_of::<pyo3::types::PyBool>() {
            return Err(bad(format!("slot seek field {k:?} must be an int")));
        }
        v.extract()
            .map_err(|_| bad(format!("slot seek field {k:?} must be a non-negative int")))
    };
    Ok(Some(Seek {
        shard: get("shard")?
            .extract()
            .map_err(|_| bad("slot seek field \"shard\" must be a str".into()))?,
        row_group: int("row_group")?,
        row: int("row")?,
        byte_offset: int("byte_offset")?,
    }))
}

fn check_keys(py: Python<'_>, d: &Bound<'_, PyDict>, keys: &[&str], what: &str) -> PyResult<()> {
    for k in d.keys() {
        let k: String = k
            .extract()
            .map_err(|_| to_py(py, Error::State(format!("{what} has a non-string key"))))?;
        if !keys.contains(&k.as_str()) {
            return Err(to_py(
                py,
                Error::State(format!("{what} has unknown key {k:?}")),
            ));
        }
    }
    Ok(())
}

fn spec_from_py(py: Python<'_>, item: &Bound<'_, PyAny>) -> PyResult<(u64, SlotSpec)> {
    let bad = |msg: String| to_py(py, Error::State(msg));
    let d = item
        .cast::<PyDict>()
        .map_err(|_| bad("each entry of slot state field \"specs\" must be a dict".into()))?;
    check_keys(py, d, &SPEC_KEYS, "a slot spec")?;
    let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
        d.get_item(k)?
            .ok_or_else(|| bad(format!("a slot spec is missing key {k:?}")))
    };
    let epoch = get("epoch")?;
    if epoch.is_instance_of::<pyo3::types::PyBool>() {
        return Err(bad("slot spec field \"epoch\" must be an int".into()));
    }
    let epoch: u64 = epoch
        .extract()
        .map_err(|_| bad("slot spec field \"epoch\" must be a non-negative int".into()))?;
    let ranges: Vec<(u64, u64)> = get("ranges")?
        .extract::<Vec<Vec<u64>>>()
        .map_err(|_| bad("slot spec field \"ranges\" must be a list of [start, end] ints".into()))?
        .into_iter()
        .map(|r| match r.as_slice() {
            [a, b] if a <= b => Ok((*a, *b)),
            _ => Err(bad(format!(
                "slot spec range {r:?} is not [start, end] with start <= end"
            ))),
        })
        .collect::<PyResult<_>>()?;
    let injected: String = get("injected")?
        .extract()
        .map_err(|_| bad("slot spec field \"injected\" must be a str".into()))?;
    Ok((
        epoch,
        SlotSpec {
            ranges: ranges.into_iter().map(|(a, b)| a..b).collect(),
            injected: ids_from_base64(&injected, "injected").map_err(|e| to_py(py, e))?,
        },
    ))
}

fn state_from_py(py: Python<'_>, d: &Bound<'_, PyDict>) -> PyResult<SlotState> {
    let bad = |msg: String| to_py(py, Error::State(msg));
    for k in d.keys() {
        let k: String = k
            .extract()
            .map_err(|_| bad("slot state has a non-string key".into()))?;
        if !SLOT_KEYS.contains(&k.as_str()) {
            return Err(bad(format!("slot state has unknown key {k:?}")));
        }
    }
    let field = |name: &str| -> PyResult<Bound<'_, PyAny>> {
        d.get_item(name)?
            .ok_or_else(|| bad(format!("slot state is missing key {name:?}")))
    };
    let int = |name: &str| -> PyResult<u64> {
        let v = field(name)?;
        if v.is_instance_of::<pyo3::types::PyBool>() {
            return Err(bad(format!(
                "slot state field {name:?} must be an int, got bool"
            )));
        }
        v.extract::<u64>().map_err(|_| {
            bad(format!(
                "slot state field {name:?} must be a non-negative int, got {v:?}"
            ))
        })
    };
    let rng = field("rng_word_pos")?;
    let rng_word_pos: u128 = if rng.is_instance_of::<pyo3::types::PyBool>() {
        return Err(bad(
            "slot state field \"rng_word_pos\" must be an int, got bool".into(),
        ));
    } else {
        rng.extract().map_err(|_| {
            bad(format!(
                "slot state field \"rng_word_pos\" must be a non-negative int, got {rng:?}"
            ))
        })?
    };
    let buf = field("buffer")?;
    let text: String = buf.extract().map_err(|_| {
        bad(format!(
            "slot state field \"buffer\" must be a str, got {}",
            buf.get_type()
        ))
    })?;
    Ok(SlotState {
        epoch: int("epoch")?,
        cursor: int("cursor")?,
        emitted: int("emitted")?,
        rng_word_pos,
        buffer: SlotState::buffer_from_base64(&text).map_err(|e| to_py(py, e))?,
        specs: {
            let specs = field("specs")?;
            let list = specs.cast::<PyList>().map_err(|_| {
                bad(format!(
                    "slot state field \"specs\" must be a list, got {}",
                    specs.get_type()
                ))
            })?;
            list.iter()
                .map(|it| spec_from_py(py, &it))
                .collect::<PyResult<_>>()?
        },
    })
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<RawCatalog>()?;
    m.add_class::<RawStream>()?;
    Ok(())
}

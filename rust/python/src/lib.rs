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
    #[pyo3(signature = (sources, columns=None, storage_options=None))]
    fn new(
        py: Python<'_>,
        sources: Vec<String>,
        columns: Option<Vec<String>>,
        storage_options: Option<std::collections::BTreeMap<String, String>>,
    ) -> PyResult<Self> {
        let options = storage_options.unwrap_or_default();
        let cat = detach(py, || {
            Catalog::open_with(&sources, columns.as_deref(), &options)
        })?;
        Ok(RawCatalog {
            inner: Arc::new(cat),
        })
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

    /// Which shards differ from a saved fingerprint's `buckets`:
    /// `{"added": [rel_path], "changed": [rel_path], "removed_buckets": int}`.
    fn changes_since<'py>(&self, py: Python<'py>, buckets: &str) -> PyResult<Bound<'py, PyDict>> {
        let c = self
            .inner
            .changes_since(buckets)
            .map_err(|e| to_py(py, e))?;
        let d = PyDict::new(py);
        d.set_item("added", c.added)?;
        d.set_item("changed", c.changed)?;
        d.set_item("removed_buckets", c.removed_buckets)?;
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
                        piece_rows=16384, even="off", keep_batch_start=false))]
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

    /// Skip `items` outputs of `item_rows` rows without reading them (see `Stream::skip`);
    /// returns the skipped `(epoch, start, stop)` position ranges.
    #[pyo3(signature = (items, item_rows, drop_short=false))]
    fn skip(
        &self,
        py: Python<'_>,
        items: u64,
        item_rows: u64,
        drop_short: bool,
    ) -> PyResult<Vec<(u64, u64, u64)>> {
        self.with(py, move |s| s.skip(items, item_rows, drop_short))
    }

    /// `(epoch, rows emitted in it)` after the last returned row.
    fn position(&self, py: Python<'_>) -> PyResult<(u64, u64)> {
        self.with(py, |s| {
            let st = s.position();
            Ok(st)
        })
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

/// Strict reading of one dict of a saved state: only known keys, every key present, ints that
/// are ints (not bools) and in range; every complaint names the field.
struct Fields<'a, 'py> {
    py: Python<'py>,
    d: &'a Bound<'py, PyDict>,
    what: &'static str,
}

impl<'a, 'py> Fields<'a, 'py> {
    fn new(
        py: Python<'py>,
        d: &'a Bound<'py, PyDict>,
        keys: &[&str],
        what: &'static str,
    ) -> PyResult<Self> {
        let f = Fields { py, d, what };
        for k in d.keys() {
            let k: String = k
                .extract()
                .map_err(|_| f.bad(format!("{what} has a non-string key")))?;
            if !keys.contains(&k.as_str()) {
                return Err(f.bad(format!("{what} has unknown key {k:?}")));
            }
        }
        Ok(f)
    }

    fn bad(&self, msg: String) -> PyErr {
        to_py(self.py, Error::State(msg))
    }

    fn get(&self, k: &str) -> PyResult<Bound<'py, PyAny>> {
        self.d
            .get_item(k)?
            .ok_or_else(|| self.bad(format!("{} is missing key {k:?}", self.what)))
    }

    fn uint<T: for<'b> pyo3::FromPyObject<'b, 'py>>(&self, k: &str) -> PyResult<T> {
        let v = self.get(k)?;
        let bad = || {
            self.bad(format!(
                "{} field {k:?} must be a non-negative int, got {v:?}",
                self.what
            ))
        };
        if v.is_instance_of::<pyo3::types::PyBool>() {
            return Err(bad());
        }
        v.extract().map_err(|_| bad())
    }

    fn string(&self, k: &str) -> PyResult<String> {
        let v = self.get(k)?;
        v.extract().map_err(|_| {
            self.bad(format!(
                "{} field {k:?} must be a str, got {}",
                self.what,
                v.get_type()
            ))
        })
    }
}

/// The optional, informational `seek` of a saved position (checked against it on restore).
fn seek_from_py(py: Python<'_>, d: &Bound<'_, PyDict>) -> PyResult<Option<Seek>> {
    let Some(v) = d.get_item("seek")?.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    let sd = v.cast::<PyDict>().map_err(|_| {
        to_py(
            py,
            Error::State("slot state field \"seek\" must be a dict or None".into()),
        )
    })?;
    let f = Fields::new(py, sd, &SEEK_KEYS, "a slot seek")?;
    Ok(Some(Seek {
        shard: f.string("shard")?,
        row_group: f.uint("row_group")?,
        row: f.uint("row")?,
        byte_offset: f.uint("byte_offset")?,
    }))
}

fn spec_from_py(py: Python<'_>, item: &Bound<'_, PyAny>) -> PyResult<(u64, SlotSpec)> {
    let d = item.cast::<PyDict>().map_err(|_| {
        to_py(
            py,
            Error::State("each entry of slot state field \"specs\" must be a dict".into()),
        )
    })?;
    let f = Fields::new(py, d, &SPEC_KEYS, "a slot spec")?;
    let ranges = f
        .get("ranges")?
        .extract::<Vec<Vec<u64>>>()
        .map_err(|_| {
            f.bad("slot spec field \"ranges\" must be a list of [start, end] ints".into())
        })?
        .into_iter()
        .map(|r| match r.as_slice() {
            [a, b] if a <= b => Ok(*a..*b),
            _ => Err(f.bad(format!(
                "slot spec range {r:?} is not [start, end] with start <= end"
            ))),
        })
        .collect::<PyResult<_>>()?;
    let injected = ids_from_base64(&f.string("injected")?, "injected").map_err(|e| to_py(py, e))?;
    Ok((f.uint("epoch")?, SlotSpec { ranges, injected }))
}

fn state_from_py(py: Python<'_>, d: &Bound<'_, PyDict>) -> PyResult<SlotState> {
    let f = Fields::new(py, d, &SLOT_KEYS, "slot state")?;
    let specs = f.get("specs")?;
    let specs = specs
        .cast::<PyList>()
        .map_err(|_| {
            f.bad(format!(
                "slot state field \"specs\" must be a list, got {}",
                specs.get_type()
            ))
        })?
        .iter()
        .map(|it| spec_from_py(py, &it))
        .collect::<PyResult<_>>()?;
    Ok(SlotState {
        epoch: f.uint("epoch")?,
        cursor: f.uint("cursor")?,
        emitted: f.uint("emitted")?,
        rng_word_pos: f.uint("rng_word_pos")?,
        buffer: ids_from_base64(&f.string("buffer")?, "buffer").map_err(|e| to_py(py, e))?,
        specs,
    })
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // Panics are caught and raised as exceptions carrying their message (error.rs, and
    // ShardError naming the file for decoder panics on corrupt data), so the default hook's
    // stderr report is noise in a training log. This hook belongs to this extension's copy of
    // std only; SHARDSTREAM_DEBUG_PANICS=1 prints them again.
    if std::env::var_os("SHARDSTREAM_DEBUG_PANICS").is_none() {
        std::panic::set_hook(Box::new(|_| {}));
    }
    m.add_class::<RawCatalog>()?;
    m.add_class::<RawStream>()?;
    Ok(())
}

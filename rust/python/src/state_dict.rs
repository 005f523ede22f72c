//! A stream's `state_dict()` built as Python objects directly, without a serde tree: called after
//! every step by loaders that snapshot (torchdata's `StatefulDataLoader`), so its cost is paid
//! per batch.
//!
//! The fields that cannot change while a stream lives (`format`, `version`, `fingerprint`,
//! `settings`, `first_epoch`, `slot`: `Stream::checkpoint_head`) are converted once, when the
//! stream is made, through the same serde records as every other state ([`StateHead::new`]);
//! each state gets its own copy of their dicts, so a caller editing one state changes no
//! other. The position and the skip history are made from the core's records field by field
//! (`Stream::checkpoint_parts`), in the records' field order, with the same Python types as
//! `convert::from_value` gives them. `RawStream._state_dict_serde` still builds the whole state
//! through the serde tree: tests compare the two.
//!
//! No object appears twice in one state (interned keys are used once per state, keys that
//! repeat, those of skip and spec records, are made fresh), so a state pickles to the same
//! bytes either way: pickle writes a repeated object as a reference to its first occurrence.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use shardstream_core::state::envelope::{PositionRecord, SkipRecord, SpecRecord, StreamState};

use crate::convert::from_value;
use crate::resume::state_to_py;

/// The fixed part of a stream's states, as Python objects (`format` .. `slot`, in order).
pub struct StateHead(Py<PyDict>);

impl StateHead {
    /// From `Stream::checkpoint_head` (its `position` and `skips` are left out).
    pub fn new(py: Python<'_>, head: &StreamState) -> PyResult<Self> {
        let full = state_to_py(py, head)?;
        let d = PyDict::new(py);
        for (k, v) in full.iter() {
            if k.eq("position")? || k.eq("skips")? {
                continue;
            }
            d.set_item(k, v)?;
        }
        Ok(StateHead(d.unbind()))
    }

    /// A state: a copy of the head, then `position` (with `buffer` as its text) and `skips`.
    pub fn state<'py>(
        &self,
        py: Python<'py>,
        position: &PositionRecord,
        buffer: Bound<'py, PyString>,
        skips: &[SkipRecord],
    ) -> PyResult<Bound<'py, PyDict>> {
        let d = copy_dicts(self.0.bind(py))?;
        d.set_item(
            intern!(py, "position"),
            position_to_py(py, position, buffer)?,
        )?;
        let list = PyList::empty(py);
        for r in skips {
            list.append(skip_to_py(py, r)?)?;
        }
        d.set_item(intern!(py, "skips"), list)?;
        Ok(d)
    }
}

/// `d` with every dict in it (at any depth) copied; other values are shared. The head holds
/// only dicts, `str`, `int`, `bool` and `None` (lists appear only in position and skips, built
/// per call).
fn copy_dicts<'py>(d: &Bound<'py, PyDict>) -> PyResult<Bound<'py, PyDict>> {
    let out = d.copy()?;
    for (k, v) in d.iter() {
        if let Ok(inner) = v.cast::<PyDict>() {
            out.set_item(k, copy_dicts(inner)?)?;
        }
    }
    Ok(out)
}

fn position_to_py<'py>(
    py: Python<'py>,
    p: &PositionRecord,
    buffer: Bound<'py, PyString>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item(intern!(py, "epoch"), p.epoch)?;
    d.set_item(intern!(py, "cursor"), p.cursor)?;
    d.set_item(intern!(py, "emitted"), p.emitted)?;
    d.set_item(intern!(py, "rng_word_pos"), p.rng_word_pos)?;
    d.set_item(intern!(py, "buffer"), buffer)?;
    let specs = PyList::empty(py);
    for s in &p.specs {
        specs.append(spec_to_py(py, s)?)?;
    }
    d.set_item(intern!(py, "specs"), specs)?;
    let seek = match &p.seek {
        None => py.None().into_bound(py),
        Some(s) => {
            let sd = PyDict::new(py);
            sd.set_item(intern!(py, "shard"), s.shard.as_str())?;
            sd.set_item(intern!(py, "row_group"), s.row_group)?;
            sd.set_item(intern!(py, "row"), s.row)?;
            sd.set_item(intern!(py, "byte_offset"), s.byte_offset)?;
            sd.into_any()
        }
    };
    d.set_item(intern!(py, "seek"), seek)?;
    if let Some(pack) = &p.pack {
        // Packing only; its record through serde like the head (not per-step hot in cost).
        let v = serde_json::to_value(pack).expect("a pack record serializes");
        d.set_item(intern!(py, "pack"), from_value(py, &v)?)?;
    }
    Ok(d)
}

/// A fresh key: skip and spec records repeat their keys (see the module docs).
fn key<'py>(py: Python<'py>, k: &str) -> Bound<'py, PyString> {
    PyString::new(py, k)
}

fn spec_to_py<'py>(py: Python<'py>, s: &SpecRecord) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item(key(py, "epoch"), s.epoch)?;
    let ranges = PyList::empty(py);
    for [a, b] in &s.ranges {
        ranges.append(PyList::new(py, [*a, *b])?)?;
    }
    d.set_item(key(py, "ranges"), ranges)?;
    d.set_item(key(py, "injected"), s.injected.as_str())?;
    Ok(d)
}

fn skip_to_py<'py>(py: Python<'py>, r: &SkipRecord) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item(key(py, "epoch"), r.epoch)?;
    d.set_item(key(py, "slot"), PyList::new(py, r.slot)?)?;
    d.set_item(key(py, "start"), r.start)?;
    d.set_item(key(py, "stop"), r.stop)?;
    Ok(d)
}

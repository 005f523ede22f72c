//! `shardstream._core`: thin bindings over `shardstream-core`, one file per exposed class
//! (`catalog.rs`, `settings.rs`, `resume.rs`, `stream.rs`, `iter.rs`; for mixtures `mixture.rs`,
//! `mix_resume.rs`, `mix_stream.rs`; the map-style `access.rs` and `sampler.rs`), conversions
//! in `convert.rs` (a stream's per-step `state_dict()` in `state_dict.rs`) and errors in
//! `error.rs`.
//! Behaviour belongs in the core; every call that reads, decodes or validates releases the GIL.
//! This file only registers the module, and installs the extension's global allocator.

mod access;
mod catalog;
mod convert;
mod error;
mod iter;
mod mix_resume;
mod mix_stream;
mod mixture;
mod resume;
mod sampler;
mod settings;
mod state_dict;
mod stream;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use shardstream_core::alloc::Recycling;

use crate::access::RawRows;
use crate::catalog::RawCatalog;
use crate::error::detach;
use crate::resume::{state_to_py, RawResume};
use crate::sampler::{RawRun, RawSampler};
use crate::settings::RawSettings;
use crate::stream::RawStream;

/// Every Rust allocation of the extension (decoded batches, pages, batches handed to Python and
/// freed by it through Arrow's release callbacks, which run this library's code): large blocks
/// are mapped on their own, and freed ones kept for reuse up to 32 MiB
/// (`shardstream_core::alloc`).
#[global_allocator]
static ALLOC: Recycling = Recycling::new(32 << 20);

/// A copy of one saved state in which its stream has skipped `n` more items (nothing read).
#[pyfunction]
fn skip_state<'py>(
    py: Python<'py>,
    catalog: &RawCatalog,
    settings: &RawSettings,
    state: &Bound<'py, PyAny>,
    n: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let v = convert::to_value(state, "state")?;
    let cat = catalog.inner.clone();
    let st = detach(py, || {
        shardstream_core::stream::skip_state(&cat, &settings.settings, v, n)
    })?;
    state_to_py(py, &st)
}

/// Check states (strictly, as a load does, but without a dataset): each one's parsed envelope
/// (a stream's, or a mixture's with its sources' inside).
#[pyfunction]
fn parse_states<'py>(py: Python<'py>, states: &Bound<'py, PyList>) -> PyResult<Bound<'py, PyList>> {
    use shardstream_core::state::envelope::{parse_node, Node};
    let out = PyList::empty(py);
    for v in convert::list_to_values(states)? {
        match parse_node(v, "state").map_err(|e| error::to_py(py, e))? {
            Node::Stream(st) => out.append(state_to_py(py, &st)?)?,
            Node::Mixture(m) => out.append(mix_resume::mixture_state_to_py(py, &m)?)?,
            Node::Sampler(_) => {
                let e = shardstream_core::error::Error::State(format!(
                    "state is a map-style sampler's (format='{}'), not a stream's or a mixture's",
                    shardstream_core::state::sampler::SAMPLER_FORMAT
                ));
                return Err(error::to_py(py, e));
            }
        }
    }
    Ok(out)
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
    m.add("DEFAULTS", settings::defaults(m.py())?)?;
    m.add(
        "STATE_FORMAT",
        shardstream_core::state::envelope::STREAM_FORMAT,
    )?;
    m.add(
        "STATE_VERSION",
        shardstream_core::state::envelope::STREAM_VERSION,
    )?;
    m.add_class::<RawCatalog>()?;
    m.add_class::<RawSettings>()?;
    m.add_class::<RawResume>()?;
    m.add_class::<RawStream>()?;
    m.add_class::<iter::RawIter>()?;
    m.add(
        "SAMPLER_FORMAT",
        shardstream_core::state::sampler::SAMPLER_FORMAT,
    )?;
    m.add(
        "SAMPLER_VERSION",
        shardstream_core::state::sampler::SAMPLER_VERSION,
    )?;
    m.add_class::<RawRows>()?;
    m.add_class::<RawSampler>()?;
    m.add_class::<RawRun>()?;
    m.add(
        "MIXTURE_FORMAT",
        shardstream_core::state::mixture::MIXTURE_FORMAT,
    )?;
    m.add(
        "MIXTURE_VERSION",
        shardstream_core::state::mixture::MIXTURE_VERSION,
    )?;
    m.add_class::<mixture::RawMixture>()?;
    m.add_class::<mix_resume::RawMixResume>()?;
    m.add_class::<mix_stream::RawMixStream>()?;
    m.add_class::<mix_stream::RawMixChunk>()?;
    m.add_function(wrap_pyfunction!(skip_state, m)?)?;
    m.add_function(wrap_pyfunction!(parse_states, m)?)?;
    Ok(())
}

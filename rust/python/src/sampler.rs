//! `RawSampler` (a sampler's settings and rank, frozen) and `RawRun` (one rank's indices of one
//! epoch from a start state: what an iterator of the sampler walks). States are plain dicts made
//! and parsed by the core (`shardstream_core::sampler`, `state/sampler.rs`).

use std::sync::Mutex;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList, PyString};
use shardstream_core::sampler::{load, Run, SamplerLayout, SamplerSettings};
use shardstream_core::settings::SamplerArgs;
use shardstream_core::state::sampler::SamplerState;

use crate::convert::{from_value, list_to_values, to_value};
use crate::error::{detach, to_py};
use crate::settings::int;

#[pyclass(name = "RawSampler", module = "shardstream._core", frozen)]
pub struct RawSampler {
    settings: SamplerSettings,
    layout: SamplerLayout,
}

fn state_to_py<'py>(py: Python<'py>, st: &SamplerState) -> PyResult<Bound<'py, PyDict>> {
    Ok(from_value(py, &st.to_value())?.cast_into::<PyDict>()?)
}

impl RawSampler {
    fn parse(&self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<SamplerState> {
        let v = to_value(state, "state")?;
        self.settings.parse(v, "state").map_err(|e| to_py(py, e))
    }
}

#[pymethods]
impl RawSampler {
    #[new]
    #[pyo3(signature = (*, rows, seed, shuffle, block_size, window, rank, world_size, even))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        rows: &Bound<'_, PyAny>,
        seed: &Bound<'_, PyAny>,
        shuffle: &Bound<'_, PyAny>,
        block_size: &Bound<'_, PyAny>,
        window: &Bound<'_, PyAny>,
        rank: &Bound<'_, PyAny>,
        world_size: &Bound<'_, PyAny>,
        even: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let Ok(shuffle) = shuffle.cast::<PyBool>() else {
            return Err(PyTypeError::new_err(format!(
                "shuffle must be a bool, got {} {shuffle}",
                shuffle.get_type().name()?
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
        let args = SamplerArgs {
            rows: int("the dataset's length", rows, false)?.unwrap_or_default(),
            seed: int("seed", seed, false)?.unwrap_or_default(),
            shuffle: shuffle.is_true(),
            block_size: int("block_size", block_size, true)?,
            window: int("window", window, false)?.unwrap_or_default(),
            rank: int("rank", rank, false)?.unwrap_or_default(),
            world_size: int("world_size", world_size, false)?.unwrap_or_default(),
            even,
        };
        let (settings, layout) = args.validate().map_err(|e| to_py(py, e))?;
        Ok(RawSampler { settings, layout })
    }

    #[getter]
    fn rows(&self) -> u64 {
        self.settings.rows
    }

    #[getter]
    fn rank(&self) -> u64 {
        self.layout.rank
    }

    #[getter]
    fn world_size(&self) -> u64 {
        self.layout.world
    }

    /// Indices this rank yields in a whole epoch.
    fn epoch_len(&self) -> u64 {
        Run::new(
            &self.settings,
            self.layout,
            &self.settings.start(0, Vec::new()),
        )
        .len()
    }

    /// The state at the start of `epoch`, keeping the skip history of `state` (if given).
    #[pyo3(signature = (epoch, state=None))]
    fn start<'py>(
        &self,
        py: Python<'py>,
        epoch: u64,
        state: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let skips = match state {
            Some(s) => self.parse(py, s)?.skips,
            None => Vec::new(),
        };
        if epoch > u64::MAX >> 1 {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "epoch must be below 2**63, got {epoch}"
            )));
        }
        state_to_py(py, &self.settings.start(epoch, skips))
    }

    /// One state to continue from, out of the states of every rank of a checkpoint (or one):
    /// each parsed strictly and checked against these settings.
    fn load<'py>(
        &self,
        py: Python<'py>,
        states: &Bound<'py, PyList>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let values = list_to_values(states)?;
        let st = detach(py, || load(&self.settings, values))?;
        state_to_py(py, &st)
    }

    /// This rank's run of the epoch of `state`, from its position.
    fn run(&self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<RawRun> {
        let st = self.parse(py, state)?;
        Ok(RawRun {
            inner: Mutex::new(Run::new(&self.settings, self.layout, &st)),
        })
    }
}

/// One rank's indices of one epoch from a start state; `k` counts the indices the caller has
/// yielded since.
#[pyclass(name = "RawRun", module = "shardstream._core", frozen)]
pub struct RawRun {
    inner: Mutex<Run>,
}

impl RawRun {
    fn with<T>(&self, f: impl FnOnce(&mut Run) -> T) -> T {
        f(&mut self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

#[pymethods]
impl RawRun {
    fn __len__(&self) -> usize {
        self.with(|r| r.len() as usize)
    }

    #[getter]
    fn epoch(&self) -> u64 {
        self.with(|r| r.epoch())
    }

    /// Indices `k .. k + n` of this run (fewer at its end).
    fn indices(&self, py: Python<'_>, k: u64, n: u64) -> Vec<u64> {
        py.detach(|| self.with(|r| r.indices(k, n)))
    }

    /// The state after `k` indices were yielded.
    fn state_dict<'py>(&self, py: Python<'py>, k: u64) -> PyResult<Bound<'py, PyDict>> {
        let st = self.with(|r| r.state(k));
        state_to_py(py, &st)
    }

    /// Pass over `n` indices after `k` (recorded in the state's skips); the new `k`.
    fn skip(&self, k: u64, n: u64) -> u64 {
        self.with(|r| r.skip(k, n))
    }
}

//! `RawMixResume`: where a mixture's next stream starts (the start of a pass, or loaded states,
//! validated once when loaded).

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use shardstream_core::mix::MixResume;
use shardstream_core::state::mixture::MixtureState;

use crate::convert::{from_value, list_to_values};
use crate::error::detach;
use crate::mixture::RawMixture;
use crate::resume::put_buffer;

#[pyclass(name = "RawMixResume", module = "shardstream._core", frozen)]
pub struct RawMixResume {
    pub inner: MixResume,
}

/// A mixture state as a Python dict.
pub fn mixture_state_to_py<'py>(
    py: Python<'py>,
    st: &MixtureState,
) -> PyResult<Bound<'py, PyDict>> {
    Ok(from_value(py, &st.to_value())?.cast_into::<PyDict>()?)
}

/// `st` as a Python dict with `ids[i]` as the buffer of its `i`-th source (name order; their own
/// text is empty, as `MixStream::checkpoint_ids` leaves it): see `resume::state_with_ids`.
pub fn mixture_state_with_ids<'py>(
    py: Python<'py>,
    st: &MixtureState,
    ids: &[Vec<u64>],
) -> PyResult<Bound<'py, PyDict>> {
    let d = mixture_state_to_py(py, st)?;
    let sources = d.get_item("sources")?;
    for (name, ids) in st.sources.keys().zip(ids) {
        let source = sources.as_ref().and_then(|x| x.get_item(name).ok());
        put_buffer(py, source.as_ref(), ids)?;
    }
    Ok(d)
}

#[pymethods]
impl RawMixResume {
    /// The start of a pass.
    #[staticmethod]
    fn start(mixture: &RawMixture) -> Self {
        RawMixResume {
            inner: MixResume::start(&mixture.inner),
        }
    }

    /// Check the states found in a checkpoint against this mixture, once.
    #[staticmethod]
    #[pyo3(signature = (mixture, states, allow_changed_shards=false, strict=false))]
    fn load(
        py: Python<'_>,
        mixture: &RawMixture,
        states: &Bound<'_, PyList>,
        allow_changed_shards: bool,
        strict: bool,
    ) -> PyResult<Self> {
        let values = list_to_values(states)?;
        let cfg = mixture.inner.clone();
        let inner = detach(py, || {
            MixResume::load(&cfg, values, allow_changed_shards, strict)
        })?;
        Ok(RawMixResume { inner })
    }

    /// True when no position was loaded.
    #[getter]
    fn at_start(&self) -> bool {
        self.inner.at_start()
    }

    /// The epoch `set_epoch` gave the pass this position is in (`None`: never called, or the
    /// loaded states disagree).
    #[getter]
    fn epoch(&self) -> Option<u64> {
        self.inner.epoch()
    }

    /// This position as the pass `set_epoch(epoch)` started: its states say that epoch.
    #[pyo3(signature = (epoch))]
    fn with_epoch(&self, epoch: Option<u64>) -> Self {
        RawMixResume {
            inner: self.inner.with_epoch(epoch),
        }
    }

    /// True when a stream of `layout` started here has no item left (decided on coordinates,
    /// nothing read): a state saved at the end of its pass.
    fn pass_ended(
        &self,
        py: Python<'_>,
        mixture: &RawMixture,
        layout: (u64, u64, u64, u64),
    ) -> PyResult<bool> {
        let layout = crate::mix_stream::layout(py, mixture, layout)?;
        let cfg = mixture.inner.clone();
        detach(py, || self.inner.pass_ended(&cfg, layout))
    }

    /// The state a stream of `layout` (rank, world_size, worker, num_workers) would save now.
    fn state_dict<'py>(
        &self,
        py: Python<'py>,
        mixture: &RawMixture,
        layout: (u64, u64, u64, u64),
    ) -> PyResult<Bound<'py, PyDict>> {
        let layout = crate::mix_stream::layout(py, mixture, layout)?;
        let cfg = mixture.inner.clone();
        let st = detach(py, || self.inner.state(&cfg, layout))?;
        mixture_state_to_py(py, &st)
    }

    /// Every loaded position as a plain state (to pickle this resume point).
    fn states<'py>(&self, py: Python<'py>, mixture: &RawMixture) -> PyResult<Bound<'py, PyList>> {
        let cfg = mixture.inner.clone();
        let states = detach(py, || self.inner.states(&cfg))?;
        let out = PyList::empty(py);
        for st in &states {
            out.append(mixture_state_to_py(py, st)?)?;
        }
        Ok(out)
    }
}

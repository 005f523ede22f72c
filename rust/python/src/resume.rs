//! `RawResume`: where a dataset's next stream starts (the start of a pass, or loaded states,
//! validated once when loaded).

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use shardstream_core::resume::Resume;
use shardstream_core::state::envelope::{parse_skips, parse_stream, SkipRecord, StreamState};

use crate::catalog::RawCatalog;
use crate::convert::{from_value, ids_to_py, list_to_values, to_value};
use crate::error::{detach, to_py};
use crate::settings::RawSettings;

#[pyclass(name = "RawResume", module = "shardstream._core", frozen)]
pub struct RawResume {
    pub inner: Resume,
}

/// Skip records to replay: given as records, or the `skips` of states (each parsed strictly).
pub fn replay_records(
    py: Python<'_>,
    records: Option<&Bound<'_, PyAny>>,
    states: Option<&Bound<'_, PyList>>,
) -> PyResult<Vec<SkipRecord>> {
    let mut found = Vec::new();
    if let Some(r) = records {
        found.extend(parse_skips(to_value(r, "skips")?, "skips").map_err(|e| to_py(py, e))?);
    }
    if let Some(states) = states {
        for v in list_to_values(states)? {
            let st = parse_stream(v, "state").map_err(|e| to_py(py, e))?;
            found.extend(st.skips);
        }
    }
    Ok(found)
}

/// A state (the envelope) as a Python dict.
pub fn state_to_py<'py>(py: Python<'py>, st: &StreamState) -> PyResult<Bound<'py, PyDict>> {
    Ok(from_value(py, &st.to_value())?.cast_into::<PyDict>()?)
}

/// `st` as a Python dict with `ids` as its `position['buffer']` (`st`'s own text is not read:
/// `state_dict()` passes a state from `checkpoint_ids`, whose text is empty, and the ids go
/// straight from their bytes to a `str`: [`ids_to_py`]).
pub fn state_with_ids<'py>(
    py: Python<'py>,
    st: &StreamState,
    ids: &[u64],
) -> PyResult<Bound<'py, PyDict>> {
    let d = state_to_py(py, st)?;
    put_buffer(py, Some(d.as_any()), ids)?;
    Ok(d)
}

/// Sets `state['position']['buffer']` of a stream state's dict that has a position.
pub fn put_buffer(py: Python<'_>, state: Option<&Bound<'_, PyAny>>, ids: &[u64]) -> PyResult<()> {
    let pos = state.and_then(|s| s.get_item("position").ok());
    if let Some(pos) = pos.and_then(|p| p.cast_into::<PyDict>().ok()) {
        pos.set_item("buffer", ids_to_py(py, ids)?)?;
    }
    Ok(())
}

#[pymethods]
impl RawResume {
    /// The start of a pass at `first_epoch`.
    #[staticmethod]
    fn start(first_epoch: u64) -> Self {
        RawResume {
            inner: Resume::start(first_epoch),
        }
    }

    /// Check the states found in a checkpoint against this dataset, once, completely.
    #[staticmethod]
    /// `replay`: a resume point whose replay plan carries over.
    /// `summaries`: every old slot's summary (two-phase elastic resume; `states` then holds
    /// the full states of some slots, see `needed_slots`).
    #[pyo3(signature = (catalog, settings, states, allow_changed_shards=false, replay=None, summaries=None))]
    fn load(
        py: Python<'_>,
        catalog: &RawCatalog,
        settings: &RawSettings,
        states: &Bound<'_, PyList>,
        allow_changed_shards: bool,
        replay: Option<&RawResume>,
        summaries: Option<&Bound<'_, PyList>>,
    ) -> PyResult<Self> {
        let values = list_to_values(states)?;
        let cat = catalog.inner.clone();
        let s = &settings.settings;
        let mut inner = match summaries {
            None => detach(py, || Resume::load(&cat, s, values, allow_changed_shards))?,
            Some(sums) => {
                if allow_changed_shards {
                    return Err(pyo3::exceptions::PyValueError::new_err(
                        "allow_changed_shards=True cannot be combined with summaries (a \
                         two-phase elastic resume): load every state instead",
                    ));
                }
                let sums = list_to_values(sums)?;
                detach(py, || Resume::load_partial(&cat, s, values, sums))?
            }
        };
        if let Some(r) = replay {
            inner = inner.with_replay(r.inner.replay.records());
        }
        Ok(RawResume { inner })
    }

    /// Two-phase elastic resume, phase 1: the old slots whose full states the iterators of
    /// `layouts` ((rank, world_size, worker, num_workers) each) need, from every old slot's
    /// summary (its state's `first_epoch`, `slot` and `position`; `buffer` may be absent).
    #[staticmethod]
    fn needed_slots(
        py: Python<'_>,
        catalog: &RawCatalog,
        settings: &RawSettings,
        summaries: &Bound<'_, PyList>,
        layouts: Vec<(u64, u64, u64, u64)>,
    ) -> PyResult<Vec<u32>> {
        let layouts = layouts
            .into_iter()
            .map(|l| crate::stream::layout(py, settings, l))
            .collect::<PyResult<Vec<_>>>()?;
        let sums = list_to_values(summaries)?;
        let cat = catalog.inner.clone();
        let s = &settings.settings;
        detach(py, || Resume::needed_slots(&cat, s, sums, &layouts))
    }

    #[getter]
    fn first_epoch(&self) -> u64 {
        self.inner.first_epoch()
    }

    /// The epochs the loaded positions are in (empty when none was loaded).
    #[getter]
    fn epochs(&self) -> Vec<u64> {
        self.inner.epochs()
    }

    /// True when no position was loaded: the next stream starts at the beginning of the pass.
    #[getter]
    fn at_start(&self) -> bool {
        self.inner.at_start()
    }

    /// The start of a pass at `first_epoch`, keeping the skip history and replay plan.
    fn restart(&self, first_epoch: u64) -> Self {
        RawResume {
            inner: self.inner.restart(first_epoch),
        }
    }

    /// The state a stream of `layout` (rank, world_size, worker, num_workers) would save now.
    fn state_dict<'py>(
        &self,
        py: Python<'py>,
        catalog: &RawCatalog,
        settings: &RawSettings,
        layout: (u64, u64, u64, u64),
    ) -> PyResult<Bound<'py, PyDict>> {
        let layout = crate::stream::layout(py, settings, layout)?;
        let cat = catalog.inner.clone();
        let st = detach(py, || self.inner.state(&cat, &settings.settings, layout))?;
        state_to_py(py, &st)
    }

    /// True when the stream of `layout` from here has nothing left in its pass (nothing is
    /// read): a state saved at the end of its pass.
    fn pass_ended(
        &self,
        py: Python<'_>,
        catalog: &RawCatalog,
        settings: &RawSettings,
        layout: (u64, u64, u64, u64),
    ) -> PyResult<bool> {
        let layout = crate::stream::layout(py, settings, layout)?;
        let cat = catalog.inner.clone();
        detach(py, || {
            self.inner.pass_ended(&cat, &settings.settings, layout)
        })
    }

    /// This resume point moved on by `n` items of `layout`'s stream (nothing is read).
    fn skip(
        &self,
        py: Python<'_>,
        catalog: &RawCatalog,
        settings: &RawSettings,
        layout: (u64, u64, u64, u64),
        n: u64,
    ) -> PyResult<Self> {
        let layout = crate::stream::layout(py, settings, layout)?;
        let cat = catalog.inner.clone();
        let inner = detach(py, || self.inner.skip(&cat, &settings.settings, layout, n))?;
        Ok(RawResume { inner })
    }

    /// Also replay skips: `records` (skip records) or the `skips` of `states`.
    #[pyo3(signature = (records=None, states=None))]
    fn with_replay(
        &self,
        py: Python<'_>,
        records: Option<&Bound<'_, PyAny>>,
        states: Option<&Bound<'_, PyList>>,
    ) -> PyResult<Self> {
        let found = replay_records(py, records, states)?;
        Ok(RawResume {
            inner: self.inner.clone().with_replay(found),
        })
    }

    /// Every loaded position as a plain state (to pickle this resume point).
    fn states<'py>(
        &self,
        py: Python<'py>,
        catalog: &RawCatalog,
        settings: &RawSettings,
    ) -> PyResult<Bound<'py, PyList>> {
        let cat = catalog.inner.clone();
        let states = detach(py, || self.inner.states(&cat, &settings.settings))?;
        let out = PyList::empty(py);
        for st in &states {
            out.append(state_to_py(py, st)?)?;
        }
        Ok(out)
    }

    /// The replay plan as skip records (to pickle this resume point).
    fn replay<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let v = serde_json::to_value(self.inner.replay.records()).expect("records serialize");
        from_value(py, &v)
    }
}

//! `RawMixture`: a mixture's sources, settings and weights, checked once and frozen.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyList;
use pyo3_arrow::PySchema;
use shardstream_core::mix::{
    Combine, Kind, MixConfig, MixSettings, MixSource, Mixing, OnExhausted, WeightsArg,
};
use shardstream_core::pack::PackSettings;
use shardstream_core::{Error, Even};

use crate::catalog::RawCatalog;
use crate::error::to_py;
use crate::settings::RawSettings;

/// One source as Python passes it: `(name, catalog, settings, on_exhausted, max_epochs)`.
type SourceArgs<'py> = (
    String,
    PyRef<'py, RawCatalog>,
    PyRef<'py, RawSettings>,
    String,
    Option<u64>,
);

#[pyclass(name = "RawMixture", module = "shardstream._core", frozen)]
pub struct RawMixture {
    pub inner: Arc<MixConfig>,
}

#[pymethods]
impl RawMixture {
    /// `sources`: `(name, catalog, settings, on_exhausted, max_epochs)` per source (the
    /// source's seed, shuffle and tuning come from its settings); `weights`: `(item, [(name,
    /// weight)])` points.
    #[new]
    #[pyo3(signature = (*, sources, weights, schedule, mixing, block, seed, batch_size,
                        drop_last, even, samples, combine, source_column, pack=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        sources: Vec<SourceArgs<'_>>,
        weights: Vec<(u64, Vec<(String, f64)>)>,
        schedule: &str,
        mixing: &str,
        block: Option<u64>,
        seed: u64,
        batch_size: Option<u64>,
        drop_last: bool,
        even: Option<String>,
        samples: Option<u64>,
        combine: &str,
        source_column: Option<String>,
        pack: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let err = |e: Error| to_py(py, e);
        let mut srcs = Vec::with_capacity(sources.len());
        for (name, cat, st, on, max_epochs) in sources {
            srcs.push(MixSource {
                on_exhausted: OnExhausted::parse(&on, &format!("on_exhausted of {name:?}"))
                    .map_err(err)?,
                name,
                catalog: cat.inner.clone(),
                settings: st.settings.clone(),
                tuning: st.tuning.clone(),
                max_epochs,
            });
        }
        let mixing = match (mixing, block) {
            ("deterministic", None) => Mixing::Deterministic,
            ("random", None) => Mixing::Random,
            ("stratified", Some(b)) => Mixing::Stratified(b),
            ("stratified", None) => {
                return Err(err(Error::Config(
                    "mixing='stratified' needs a block (items per block; default: batch_size)"
                        .into(),
                )))
            }
            (m, _) => {
                return Err(err(Error::Config(format!(
                    "mixing must be 'deterministic', 'stratified' or 'random', got {m:?}{}",
                    if block.is_some() && m != "stratified" {
                        " (block is for 'stratified')"
                    } else {
                        ""
                    }
                ))))
            }
        };
        let combine = match combine {
            "mixed" => Combine::Mixed,
            "by_source" => Combine::BySource,
            other => {
                return Err(err(Error::Config(format!(
                    "combine must be 'mixed' or 'by_source', got {other:?}"
                ))))
            }
        };
        let settings = MixSettings {
            seed,
            mixing,
            batch_size,
            drop_last,
            even: Even::parse(even.as_deref(), "even").map_err(err)?,
            samples,
        };
        let weights = WeightsArg {
            kind: Kind::parse(schedule, "schedule").map_err(err)?,
            points: weights,
        };
        let mut cfg =
            MixConfig::new(srcs, settings, weights, combine, source_column).map_err(err)?;
        if let Some(p) = pack.filter(|p| !p.is_none()) {
            // Packing after mixing: items are packed rows (`Pack.record()` as the settings).
            let v = crate::convert::to_value(p, "pack")?;
            let p = PackSettings::parse(v).map_err(err)?;
            cfg.set_pack(Some(p)).map_err(err)?;
        }
        Ok(RawMixture {
            inner: Arc::new(cfg),
        })
    }

    /// Source names in the mixture's order (name order): tags index this list.
    #[getter]
    fn names(&self) -> Vec<String> {
        self.inner.names()
    }

    /// Schema of a mixed batch (the shared columns, then the tag column).
    #[getter]
    fn schema<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        PySchema::new(self.inner.schema.clone()).into_pyarrow(py)
    }

    /// Each source's own schema, in name order.
    fn source_schemas<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for s in &self.inner.sources {
            out.append(PySchema::new(s.catalog.schema().clone()).into_pyarrow(py)?)?;
        }
        Ok(out)
    }

    /// `(on_exhausted, max_epochs)` per source after defaults, in name order.
    fn policies(&self) -> Vec<(String, Option<u64>)> {
        self.inner
            .sources
            .iter()
            .map(|s| (s.on_exhausted.name().to_string(), s.max_epochs))
            .collect()
    }
}

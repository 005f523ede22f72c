//! A weighted mixture of named sources: one stage on top of the streams of its sources.
//!
//! - [`schedule`]: the weights over the mixture's items (constant, step, linear), as integers.
//! - [`rule`]: which source each item of a slot comes from (deterministic, stratified, random),
//!   exhaustion (stop / drop) and rebasing.
//! - [`resume`]: where a mixture's streams start: loaded states checked once, per source by the
//!   stream's own [`crate::resume::Resume`] (so per-source validation, changed shards and the
//!   elastic merge are exactly a single stream's), the mixer continued or rebased.
//! - [`stream`]: one slot's mixed items over one [`crate::stream::Stream`] per source.
//!
//! Every source runs in the same layout as the mixture (slot = rank * workers + worker), reads
//! its own slot's share of each of its epochs (so each row of a source is read exactly once per
//! source-epoch over all slots), and cycles through its epochs endlessly unless `max_epochs` caps
//! them. A slot's mixer decides, item by item, which source's next row comes next; with the
//! same settings every slot decides the same sequence, so with `even` policies every slot
//! yields the same number of items and stops at the same item.

pub mod resume;
pub mod rule;
pub mod schedule;
pub mod stream;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef};

pub use resume::MixResume;
pub use rule::{Mixing, Policy};
pub use schedule::{Kind, Schedule};
pub use stream::{MixItem, MixStream, SourceStats};

use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::pack::PackSettings;
use crate::plan::{Even, Slot};
use crate::settings::{Settings, Tuning};
use crate::state::mixture::{MixSettingsRecord, PointRecord, PolicyRecord, ScheduleRecord};
use rule::Rule;

/// What a source does when its rows run out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnExhausted {
    /// Start its next epoch (until `max_epochs`, then drop).
    Cycle,
    /// End the mixture.
    Stop,
    /// Leave the mixture; the others share its weight.
    Drop,
}

impl OnExhausted {
    pub fn parse(v: &str, what: &str) -> Result<OnExhausted> {
        match v {
            "cycle" => Ok(OnExhausted::Cycle),
            "stop" => Ok(OnExhausted::Stop),
            "drop" => Ok(OnExhausted::Drop),
            other => Err(Error::Config(format!(
                "{what} must be 'cycle', 'stop' or 'drop', got {other:?}"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            OnExhausted::Cycle => "cycle",
            OnExhausted::Stop => "stop",
            OnExhausted::Drop => "drop",
        }
    }
}

/// One named source: its shard set, its stream settings (seed and shuffle from the source;
/// rows one at a time, endless, in the mixture's layout) and what happens when it runs out.
#[derive(Debug, Clone)]
pub struct MixSource {
    pub name: String,
    pub catalog: Arc<Catalog>,
    pub settings: Settings,
    pub tuning: Tuning,
    pub on_exhausted: OnExhausted,
    /// Epochs it runs through (`None`: endless); default endless for `Cycle`, else 1.
    pub max_epochs: Option<u64>,
}

/// How a batch is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Combine {
    /// One batch in mixing order: the columns every source has, plus the tag column.
    Mixed,
    /// Each source's rows of the batch as its own batch (its own columns), plus the tags.
    BySource,
}

/// The mixture's arguments that shape its stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MixSettings {
    pub seed: u64,
    pub mixing: Mixing,
    /// Items per output batch (`None`: items one at a time, handed over in chunks).
    pub batch_size: Option<u64>,
    pub drop_last: bool,
    pub even: Even,
    /// Items the mixture yields over all slots (`None`: until it ends otherwise).
    pub samples: Option<u64>,
}

/// Weights as given: `(global item, weight per source name)` points, and how to go between.
#[derive(Debug, Clone)]
pub struct WeightsArg {
    pub kind: Kind,
    pub points: Vec<(u64, Vec<(String, f64)>)>,
}

/// A mixture: its sources (in name order: the order of source indices and tags), settings,
/// schedule and output.
#[derive(Debug)]
pub struct MixConfig {
    pub sources: Vec<MixSource>,
    pub settings: MixSettings,
    pub schedule: Arc<Schedule>,
    pub combine: Combine,
    /// Name of the source-index column (`None`: no column; by-source batches still carry tags).
    pub tag_column: Option<String>,
    /// Schema of a mixed batch (the shared columns, then the tag).
    pub schema: SchemaRef,
    /// For each source, the indices of the shared columns in its own schema.
    pub(crate) common: Vec<Vec<usize>>,
    pub(crate) rule: Arc<Rule>,
    /// Packing after mixing (`set_pack`): items are packed rows of the mixed documents.
    pub pack: Option<PackSettings>,
    /// Packing per source (every source's settings pack, one `seq_len`): items are packed rows,
    /// each from one source (`stream/per_source.rs`); these are the first source's settings.
    pub source_pack: Option<PackSettings>,
}

/// Most sources a mixture takes (source indices are u16 in the mixer; -1 marks padding).
pub const MAX_SOURCES: usize = i16::MAX as usize;

/// Largest stratified block (items). A block's counts are decided and its served order laid out
/// (two bytes an item) when the block starts, before its first item: this bounds that work and
/// memory (10^7 items took 0.7 s and 18 MiB; 10^12 hung the first item).
pub const MAX_STRATIFIED_BLOCK: u64 = 1 << 20;

impl MixConfig {
    pub fn new(
        mut sources: Vec<MixSource>,
        settings: MixSettings,
        weights: WeightsArg,
        combine: Combine,
        tag_column: Option<String>,
    ) -> Result<MixConfig> {
        if sources.is_empty() {
            return Err(Error::Config("a mixture needs at least one source".into()));
        }
        if sources.len() > MAX_SOURCES {
            return Err(Error::Config(format!(
                "a mixture takes at most {MAX_SOURCES} sources, got {}",
                sources.len()
            )));
        }
        sources.sort_by(|a, b| a.name.cmp(&b.name));
        if let Some(w) = sources.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(Error::Config(format!(
                "two sources are named {:?}",
                w[0].name
            )));
        }
        if let Some(s) = sources.iter().find(|s| s.name.is_empty()) {
            return Err(Error::Config(format!(
                "a source name is empty: {:?}",
                s.name
            )));
        }
        if let Mixing::Stratified(b) = settings.mixing {
            if !(1..=MAX_STRATIFIED_BLOCK).contains(&b) {
                return Err(Error::Config(format!(
                    "block must be an int in [1, {MAX_STRATIFIED_BLOCK}] (items per stratified \
                     block), got {b}"
                )));
            }
        }
        for s in &mut sources {
            if s.max_epochs == Some(0) {
                return Err(Error::Config(format!(
                    "max_epochs of source {:?} must be at least 1 (or None)",
                    s.name
                )));
            }
            if s.on_exhausted != OnExhausted::Cycle && s.max_epochs.is_none() {
                s.max_epochs = Some(1);
            }
            if s.on_exhausted == OnExhausted::Stop && settings.mixing == Mixing::Random {
                return Err(Error::Config(format!(
                    "source {:?} has on_exhausted='stop', which needs mixing 'deterministic' or \
                     'stratified': random draws differ per slot, so ranks would run out at \
                     different items",
                    s.name
                )));
            }
            // A source inside a mixture: rows one at a time, endless (the mixture caps epochs),
            // in the mixture's layout.
            s.settings.batch_size = None;
            s.settings.drop_last = false;
            s.settings.epochs = None;
            s.settings.even = settings.even;
        }
        let source_pack = source_pack(&sources, &settings, combine)?;
        let names: Vec<&str> = sources.iter().map(|s| s.name.as_str()).collect();
        let schedule = Arc::new(schedule_of(&names, &weights)?);
        let (schema, common) = match &source_pack {
            // Packed rows of any source: the packed columns and `source_ids`, whatever the
            // sources' own columns are.
            Some(p) => (p.schema_with_sources(), vec![Vec::new(); sources.len()]),
            None => mixed_schema(&sources, combine, tag_column.as_deref())?,
        };
        let rule = Arc::new(Rule {
            schedule: schedule.clone(),
            mixing: settings.mixing,
            policies: sources
                .iter()
                .map(|s| match s.on_exhausted {
                    OnExhausted::Stop => Policy::Stop,
                    _ => Policy::Drop,
                })
                .collect(),
            seed: settings.seed,
        });
        Ok(MixConfig {
            sources,
            settings,
            schedule,
            combine,
            tag_column,
            schema,
            common,
            rule,
            pack: None,
            source_pack,
        })
    }

    /// Pack the mixture's rows (after mixing) into rows of `seq_len` tokens: items are then
    /// packed rows (`batch_size` of them, one in row mode); every source must have the token
    /// column.
    pub fn set_pack(&mut self, pack: Option<PackSettings>) -> Result<()> {
        if pack.is_some() && self.source_pack.is_some() {
            return Err(Error::Config(
                "the sources pack (ParquetStream(pack=...)) and the mixture packs too (Mixture(\
                 pack=...)): choose one order, per source then mixing packed rows, or after \
                 mixing"
                    .into(),
            ));
        }
        if let Some(p) = &pack {
            let schemas: Vec<(&str, &arrow_schema::Schema)> = self
                .sources
                .iter()
                .map(|s| (s.name.as_str(), s.catalog.schema().as_ref()))
                .collect();
            crate::pack::Packer::for_mixture(p.clone(), &schemas, None)?;
        }
        self.pack = pack;
        Ok(())
    }

    pub fn names(&self) -> Vec<String> {
        self.sources.iter().map(|s| s.name.clone()).collect()
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.sources
            .binary_search_by(|s| s.name.as_str().cmp(name))
            .ok()
    }

    /// The epoch a source's rows run out at (`None`: never).
    pub fn until(&self, s: usize) -> Option<u64> {
        self.sources[s].max_epochs
    }

    pub fn settings_record(&self) -> MixSettingsRecord {
        let s = &self.settings;
        MixSettingsRecord {
            seed: s.seed,
            mixing: s.mixing.name().into(),
            block: match s.mixing {
                Mixing::Stratified(b) => Some(b),
                _ => None,
            },
            batch_size: s.batch_size,
            drop_last: s.drop_last,
            even: match s.even {
                Even::Off => None,
                e => Some(e.name().to_string()),
            },
            samples: s.samples,
            pack: self.pack.clone(),
        }
    }

    pub fn schedule_record(&self) -> ScheduleRecord {
        ScheduleRecord {
            kind: self.schedule.kind.name().into(),
            points: self
                .schedule
                .points
                .iter()
                .map(|(at, w)| PointRecord {
                    at: *at,
                    weights: self
                        .sources
                        .iter()
                        .zip(w)
                        .map(|(s, w)| (s.name.clone(), *w))
                        .collect(),
                })
                .collect(),
        }
    }

    pub fn policies_record(&self) -> BTreeMap<String, PolicyRecord> {
        self.sources
            .iter()
            .map(|s| {
                (
                    s.name.clone(),
                    PolicyRecord {
                        on_exhausted: s.on_exhausted.name().into(),
                        max_epochs: s.max_epochs,
                    },
                )
            })
            .collect()
    }
}

/// Packing per source: every source packs (or none), with one `seq_len`; a packed source's
/// exhaustion is found only when its packer cannot make a row (late), so `stop` — which must end
/// every slot at the same item under `even` — is refused unless `even` is off.
fn source_pack(
    sources: &[MixSource],
    settings: &MixSettings,
    combine: Combine,
) -> Result<Option<PackSettings>> {
    let Some(first) = sources.iter().find(|s| s.settings.pack.is_some()) else {
        return Ok(None);
    };
    let p = first.settings.pack.clone().expect("a packing source");
    for s in sources {
        match &s.settings.pack {
            None => {
                return Err(Error::Config(format!(
                    "source {:?} packs (pack=...) but source {:?} does not: either every source \
                     packs (each packed row from one source) or none does (pass \
                     Mixture(..., pack=...) to pack after mixing)",
                    first.name, s.name
                )))
            }
            Some(q) if q.seq_len != p.seq_len => {
                return Err(Error::Config(format!(
                    "sources {:?} and {:?} pack to different seq_len ({} and {}): packed rows \
                     of a mixture have one length",
                    first.name, s.name, p.seq_len, q.seq_len
                )))
            }
            Some(_) => {}
        }
        if s.on_exhausted == OnExhausted::Stop && settings.even != Even::Off {
            return Err(Error::Config(format!(
                "source {:?} packs and has on_exhausted='stop' with even={:?}: a packing \
                 source's packed rows are counted only as its packer makes them, so slots run \
                 out at different items and cannot stop together; use even=None (each slot \
                 stops at its own end), or 'drop'/'cycle'",
                s.name,
                settings.even.name()
            )));
        }
    }
    if combine != Combine::Mixed {
        return Err(Error::Config(
            "combine='by_source' does not apply to packing sources: items are packed rows (their \
             source_ids column says which source each row is from)"
                .into(),
        ));
    }
    Ok(Some(p))
}

/// A slot's share of `n` items under `even` (balanced to within one; `Drop`: the floor for
/// every slot, `Pad`: the ceiling).
pub fn share(n: u64, slot: Slot, even: Even) -> u64 {
    let c = slot.count as u128;
    let i = slot.index as u128;
    let n128 = n as u128;
    (match even {
        Even::Off => n128 * (i + 1) / c - n128 * i / c,
        Even::Drop => n128 / c,
        Even::Pad => n128.div_ceil(c),
    }) as u64
}

fn schedule_of(names: &[&str], weights: &WeightsArg) -> Result<Schedule> {
    if weights.points.is_empty() {
        return Err(Error::Config("weights: no weights given".into()));
    }
    let mut points = Vec::with_capacity(weights.points.len());
    for (at, given) in &weights.points {
        let what = if weights.points.len() == 1 {
            "weights".to_string()
        } else {
            format!("weights at item {at}")
        };
        let mut by_name: BTreeMap<&str, f64> = BTreeMap::new();
        for (n, w) in given {
            if !names.contains(&n.as_str()) {
                return Err(Error::Config(format!(
                    "{what}: {n:?} is not a source (the sources are {names:?})"
                )));
            }
            if !w.is_finite() || *w < 0.0 {
                return Err(Error::Config(format!(
                    "{what}: the weight of {n:?} is {w}; weights must be finite and >= 0"
                )));
            }
            if by_name.insert(n, *w).is_some() {
                return Err(Error::Config(format!("{what}: {n:?} is given twice")));
            }
        }
        let missing: Vec<&&str> = names
            .iter()
            .filter(|n| !by_name.contains_key(**n))
            .collect();
        if !missing.is_empty() {
            return Err(Error::Config(format!(
                "{what}: no weight for {missing:?} (give every source a weight; 0 leaves one out)"
            )));
        }
        let w: Vec<f64> = names.iter().map(|n| by_name[n]).collect();
        points.push((*at, schedule::quantize(&w, &what)?));
    }
    let s = Schedule {
        kind: weights.kind,
        points,
    };
    s.check(names.len(), "weights")?;
    Ok(s)
}

/// The mixed batch's schema: the columns every source has (in the first source's order, types
/// equal), then the tag; and where they are in each source.
fn mixed_schema(
    sources: &[MixSource],
    combine: Combine,
    tag: Option<&str>,
) -> Result<(SchemaRef, Vec<Vec<usize>>)> {
    if let Some(t) = tag {
        if let Some(s) = sources
            .iter()
            .find(|s| s.catalog.schema().index_of(t).is_ok())
        {
            return Err(Error::Schema(format!(
                "source {:?} has a column named {t:?}, the name of the source tag column: pass \
                 another source_column",
                s.name
            )));
        }
    }
    let first = sources[0].catalog.schema();
    let mut fields: Vec<Field> = Vec::new();
    let mut common: Vec<Vec<usize>> = vec![Vec::new(); sources.len()];
    if combine == Combine::Mixed {
        for f in first.fields() {
            let mut at = Vec::with_capacity(sources.len());
            for s in sources {
                let schema = s.catalog.schema();
                let Ok(i) = schema.index_of(f.name()) else {
                    break;
                };
                let other = schema.field(i);
                if other.data_type() != f.data_type() {
                    return Err(Error::Schema(format!(
                        "column {:?} is {} in source {:?} but {} in source {:?}: a mixed batch \
                         needs one type per column (select other columns, or \
                         combine='by_source')",
                        f.name(),
                        f.data_type(),
                        sources[0].name,
                        other.data_type(),
                        s.name
                    )));
                }
                at.push(i);
            }
            if at.len() == sources.len() {
                let nullable = sources
                    .iter()
                    .zip(&at)
                    .any(|(s, i)| s.catalog.schema().field(*i).is_nullable());
                fields.push(f.as_ref().clone().with_nullable(nullable));
                for (c, i) in common.iter_mut().zip(at) {
                    c.push(i);
                }
            }
        }
        if fields.is_empty() {
            return Err(Error::Schema(format!(
                "the sources {:?} have no column in common: select shared columns, or pass \
                 combine='by_source'",
                sources.iter().map(|s| &s.name).collect::<Vec<_>>()
            )));
        }
    }
    if let Some(t) = tag {
        // int32, not int16: NCCL and gloo have no int16, and accelerate's dispatch (or a
        // per-source loss's all_gather) sends every tensor of a batch between processes.
        fields.push(Field::new(t, DataType::Int32, false));
    }
    Ok((Arc::new(Schema::new(fields)), common))
}

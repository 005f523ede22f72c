//! The saved state of a mixture (`shardstream.Mixture`, version 1): a node of the state tree
//! whose `sources` hold each source's stream state unchanged (`shardstream.ParquetStream`), so
//! per-source checks, changed-shard detection and the elastic merge are the stream's own.
//!
//! Parsing is strict, like the stream's: every field checked, errors naming the field as a path
//! (`state['mixer']['deficits']['web']`). What the mixer's numbers must mean against the
//! mixture (sources, schedule, a position the rule can reach) is checked when it is loaded
//! (`crate::mix::resume`).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::envelope::{from_value, py_repr, SlotRecord, StreamState};
use super::pack::{DocRef, MixPackRecord};
use crate::error::{Error, Result};
use crate::pack::PackSettings;
use crate::plan::Even;

/// `format` of a mixture state.
pub const MIXTURE_FORMAT: &str = "shardstream.Mixture";
/// The version this code writes and reads.
pub const MIXTURE_VERSION: u64 = 1;

fn required<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    Option::<T>::deserialize(d)
}

/// The state of one slot of a mixture.
#[derive(Debug, Clone, PartialEq)]
pub struct MixtureState {
    pub settings: MixSettingsRecord,
    pub weights: ScheduleRecord,
    pub policies: BTreeMap<String, PolicyRecord>,
    pub slot: Option<SlotRecord>,
    pub mixer: Option<MixerRecord>,
    /// Each source's stream state, by name.
    pub sources: BTreeMap<String, StreamState>,
    /// Sources removed from the mixture since: their states, kept so they continue if they
    /// come back (several after a resize: see mix/resume.rs).
    pub removed: BTreeMap<String, Vec<StreamState>>,
    /// Packing after the mixture: the packer's pending documents (source name, reference).
    pub pack: Option<Vec<(String, DocRef)>>,
    /// The epoch `set_epoch` gave the pass this state was saved in (`None`: never called). A
    /// mixture has no epochs of its own; this tells a state saved at the end of one pass of a
    /// `set_epoch` loop from one loaded for the same pass (see `MixStream::pass_ended`).
    pub epoch: Option<u64>,
}

/// The record as serde reads it; the nested stream states are parsed by [`StreamState::parse`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    format: String,
    version: u64,
    settings: MixSettingsRecord,
    weights: ScheduleRecord,
    policies: BTreeMap<String, PolicyRecord>,
    #[serde(deserialize_with = "required")]
    slot: Option<SlotRecord>,
    #[serde(deserialize_with = "required")]
    mixer: Option<MixerRecord>,
    sources: BTreeMap<String, Value>,
    // torch.distributed.checkpoint drops empty dicts: absent reads as empty.
    #[serde(default)]
    removed: BTreeMap<String, Vec<Value>>,
    /// Absent for a mixture that does not pack (its states are unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pack: Option<MixPackRecord>,
    /// Absent when `set_epoch` was never called (and in states of earlier releases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    epoch: Option<u64>,
}

/// The mixture's arguments that shape its stream (a state loads only under the same ones).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixSettingsRecord {
    pub seed: u64,
    pub mixing: String,
    #[serde(deserialize_with = "required")]
    pub block: Option<u64>,
    #[serde(deserialize_with = "required")]
    pub batch_size: Option<u64>,
    pub drop_last: bool,
    #[serde(deserialize_with = "required")]
    pub even: Option<String>,
    #[serde(deserialize_with = "required")]
    pub samples: Option<u64>,
    /// Packing after the mixture; absent for a mixture that does not pack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<PackSettings>,
}

/// The weights, quantized (integers summing to 2**32 per point), by source name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleRecord {
    pub kind: String,
    pub points: Vec<PointRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PointRecord {
    pub at: u64,
    pub weights: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyRecord {
    pub on_exhausted: String,
    #[serde(deserialize_with = "required")]
    pub max_epochs: Option<u64>,
}

/// One slot's mixer (see `crate::mix::rule::MixerPos`), sources by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixerRecord {
    pub items: u64,
    pub base: u64,
    pub since: u64,
    #[serde(deserialize_with = "required")]
    pub left: Option<u64>,
    /// Sources still in the mix and their deficits (units of 2**-32 items); absent reads as
    /// empty (torch.distributed.checkpoint drops empty dicts).
    #[serde(default)]
    pub deficits: BTreeMap<String, i64>,
    #[serde(deserialize_with = "required")]
    pub block: Option<BlockRecord>,
    pub taken: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockRecord {
    pub quotas: BTreeMap<String, u64>,
    pub at: u64,
}

impl MixtureState {
    /// Parse a mixture state: format and version first, then every field strictly, each source's
    /// state as a stream state (`what['sources']['name']`).
    pub fn parse(v: Value, what: &str) -> Result<MixtureState> {
        let version = v.get("version").cloned().unwrap_or(Value::Null);
        if version.as_u64() != Some(MIXTURE_VERSION) || version.is_f64() {
            return Err(Error::State(format!(
                "mixture state version {} is not supported: this shardstream reads version \
                 {MIXTURE_VERSION}",
                py_repr(&version)
            )));
        }
        let raw: Raw = from_value(v, what)?;
        let mut sources = BTreeMap::new();
        for (name, v) in raw.sources {
            let st = StreamState::parse(v, &format!("{what}['sources']['{name}']"))?;
            sources.insert(name, st);
        }
        let mut removed = BTreeMap::new();
        for (name, list) in raw.removed {
            let mut out = Vec::with_capacity(list.len());
            for (i, v) in list.into_iter().enumerate() {
                out.push(StreamState::parse(
                    v,
                    &format!("{what}['removed']['{name}'][{i}]"),
                )?);
            }
            removed.insert(name, out);
        }
        let pack = match &raw.pack {
            Some(p) => Some(p.refs(&format!("{what}['pack']"))?),
            None => None,
        };
        let st = MixtureState {
            pack,
            epoch: raw.epoch,
            settings: raw.settings,
            weights: raw.weights,
            policies: raw.policies,
            slot: raw.slot,
            mixer: raw.mixer,
            sources,
            removed,
        };
        st.check(what)?;
        Ok(st)
    }

    /// Field rules that need no dataset.
    fn check(&self, what: &str) -> Result<()> {
        let bad = |m: String| Err(Error::State(format!("{what}{m}")));
        match self.settings.mixing.as_str() {
            "deterministic" | "random" if self.settings.block.is_none() => {}
            "stratified" if self.settings.block.is_some_and(|b| b > 0) => {}
            m => {
                return bad(format!(
                    "['settings']: mixing {m:?} with block {:?} (expected 'deterministic' or \
                     'random' without a block, or 'stratified' with one)",
                    self.settings.block
                ))
            }
        }
        Even::parse(
            self.settings.even.as_deref(),
            &format!("{what}['settings']['even']"),
        )
        .map_err(|e| Error::State(e.to_string()))?;
        if !matches!(self.weights.kind.as_str(), "step" | "linear") {
            return bad(format!(
                "['weights']['kind'] must be 'step' or 'linear', got {:?}",
                self.weights.kind
            ));
        }
        if self.weights.points.is_empty() {
            return bad("['weights']['points'] is empty".into());
        }
        for (name, p) in &self.policies {
            if !matches!(p.on_exhausted.as_str(), "cycle" | "stop" | "drop") {
                return bad(format!(
                    "['policies']['{name}']['on_exhausted'] must be 'cycle', 'stop' or 'drop', \
                     got {:?}",
                    p.on_exhausted
                ));
            }
        }
        let names: Vec<&String> = self.policies.keys().collect();
        if self.sources.keys().collect::<Vec<_>>() != names {
            return bad(format!(
                ": its sources {:?} and policies {:?} name different sources",
                self.sources.keys().collect::<Vec<_>>(),
                names
            ));
        }
        if let Some(n) = self.removed.keys().find(|n| self.sources.contains_key(*n)) {
            return bad(format!(": source {n:?} is both present and removed"));
        }
        for p in &self.weights.points {
            if p.weights.keys().collect::<Vec<_>>() != names {
                return bad(format!(
                    "['weights']: the point at item {} weighs {:?}, the sources are {:?}",
                    p.at,
                    p.weights.keys().collect::<Vec<_>>(),
                    names
                ));
            }
        }
        match (&self.slot, &self.mixer) {
            (None, Some(_)) => return bad(" has a mixer but no slot".into()),
            (Some(_), None) => return bad("['mixer'] must be a dict, got None".into()),
            _ => {}
        }
        if let Some(s) = &self.slot {
            if s.count == 0 || s.index >= s.count {
                return bad(format!(
                    "['slot'] index {} is not below count {}",
                    s.index, s.count
                ));
            }
            Even::parse_state(&s.even, &format!("{what}['slot']['even']"))?;
        }
        for (name, st) in &self.sources {
            if st.slot != self.slot && st.slot.is_some() {
                return bad(format!(
                    "['sources']['{name}'] is the state of slot {:?}, the mixture's is {:?}",
                    st.slot.as_ref().map(|s| (s.index, s.count)),
                    self.slot.as_ref().map(|s| (s.index, s.count))
                ));
            }
        }
        match (&self.settings.pack, &self.pack) {
            (None, Some(_)) => {
                return bad(
                    "['pack']: pending documents of a packer, but the settings do not pack".into(),
                )
            }
            (Some(_), None) if self.slot.is_some() => {
                return bad(
                    " lacks the packer's pending documents ('pack'), but its settings pack".into(),
                )
            }
            _ => {}
        }
        if let Some(n) = self
            .pack
            .iter()
            .flatten()
            .map(|(n, _)| n)
            .find(|n| !self.sources.contains_key(*n))
        {
            return bad(format!(
                "['pack'] has a pending document of {n:?}, which is not one of its sources"
            ));
        }
        if let Some(m) = &self.mixer {
            if let Some(n) = m
                .deficits
                .keys()
                .chain(m.block.iter().flat_map(|b| b.quotas.keys()))
                .find(|n| !self.sources.contains_key(*n))
            {
                return bad(format!(
                    "['mixer'] names {n:?}, which is not one of its sources"
                ));
            }
        }
        Ok(())
    }

    pub fn to_value(&self) -> Value {
        let raw = Raw {
            format: MIXTURE_FORMAT.into(),
            version: MIXTURE_VERSION,
            settings: self.settings.clone(),
            weights: self.weights.clone(),
            policies: self.policies.clone(),
            slot: self.slot.clone(),
            mixer: self.mixer.clone(),
            sources: self
                .sources
                .iter()
                .map(|(k, v)| (k.clone(), v.to_value()))
                .collect(),
            removed: self
                .removed
                .iter()
                .map(|(k, v)| (k.clone(), v.iter().map(StreamState::to_value).collect()))
                .collect(),
            pack: self.pack.as_deref().map(MixPackRecord::of),
            epoch: self.epoch,
        };
        serde_json::to_value(raw).expect("a mixture state serializes")
    }
}

impl MixSettingsRecord {
    /// `"field: state has X, dataset has Y"` for every setting that differs.
    pub fn differences(&self, now: &MixSettingsRecord) -> Vec<String> {
        let a = serde_json::to_value(self).expect("settings serialize");
        let b = serde_json::to_value(now).expect("settings serialize");
        let (Value::Object(a), Value::Object(b)) = (a, b) else {
            return Vec::new();
        };
        // Keys of either side: `pack` is absent when a mixture does not pack.
        let keys = a.keys().chain(b.keys().filter(|k| !a.contains_key(*k)));
        keys.filter(|k| a.get(*k) != b.get(*k))
            .map(|k| {
                format!(
                    "{k}: state has {}, mixture has {}",
                    py_repr(a.get(k).unwrap_or(&Value::Null)),
                    py_repr(b.get(k).unwrap_or(&Value::Null))
                )
            })
            .collect()
    }
}

//! The saved state as typed records: the one definition of what a checkpoint holds.
//!
//! A state is a tree of stage states. Every node is a dict with its own `format` (which stage
//! wrote it) and `version`, so a stage added later (a mixture of sources, a packer) wraps or
//! lists the states of the stages it reads without touching their records, and each stage
//! evolves its own version. Two stages today: the stream of one source
//! (`shardstream.ParquetStream`, version 2), and a mixture of named sources
//! (`shardstream.Mixture`, version 1, `state/mixture.rs`) whose `sources` are stream states;
//! docs/state-format.md describes every field.
//!
//! Parsing is strict: a missing or unknown field, a wrong type or an out-of-range number is a
//! [`Error::State`] naming the field as a path (`state['position']['cursor']`). What the fields
//! must mean for *this* dataset (fingerprint, settings, a position its slot can have reached) is
//! checked by [`crate::resume`], once per load.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::mixture::{MixtureState, MIXTURE_FORMAT};
use super::{ids_from_base64, Seek, SlotState};
use crate::catalog::Fingerprint;
use crate::error::{Error, Result};
use crate::plan::{Even, Slot, SlotSpec};
use crate::settings::Settings;

/// `format` of a stream state.
pub const STREAM_FORMAT: &str = "shardstream.ParquetStream";
/// The version this code writes. It also reads version 2, whose only difference is the
/// buffer's text (base64 there, Latin-1 since 3: `state/codec.rs`), upgraded when parsed.
pub const STREAM_VERSION: u64 = 3;

/// A field that must be present even when its value is `null` (serde would default a missing
/// `Option` to `None`; a state missing `slot` is truncated, not "not started").
pub(crate) fn required<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    Option::<T>::deserialize(d)
}

/// The state of one slot's stream: the root of a checkpoint for [`STREAM_FORMAT`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamState {
    pub format: String,
    pub version: u64,
    pub fingerprint: FingerprintRecord,
    pub settings: SettingsRecord,
    /// First epoch of the pass (`set_epoch`).
    pub first_epoch: u64,
    /// `None`: this slot had not read anything.
    #[serde(deserialize_with = "required")]
    pub slot: Option<SlotRecord>,
    #[serde(deserialize_with = "required")]
    pub position: Option<PositionRecord>,
    /// Every skip applied in this run and the runs it resumed from (history).
    pub skips: Vec<SkipRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FingerprintRecord {
    pub shards: u64,
    pub rows: u64,
    pub paths: String,
    pub content: String,
    pub buckets: String,
}

/// The settings a state was saved with; `even` as the API spells it (`None`, "drop", "pad").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettingsRecord {
    pub seed: u64,
    pub shuffle_buffer: u64,
    #[serde(deserialize_with = "required")]
    pub batch_size: Option<u64>,
    pub drop_last: bool,
    #[serde(deserialize_with = "required")]
    pub epochs: Option<u64>,
    /// Packing (`pack/`); absent for a stream that does not pack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<crate::pack::PackSettings>,
    #[serde(deserialize_with = "required")]
    pub even: Option<String>,
}

/// Which slot a state belongs to: `index` of `count` (`rank * num_workers + worker_id` of
/// `world_size * num_workers`) and the `even` policy that layout ran with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotRecord {
    pub index: u32,
    pub count: u32,
    pub even: String,
}

/// A slot's position (the core's [`SlotState`]): the buffer's row ids as Latin-1 text, a spec's
/// injected ones as base64 (`state/codec.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PositionRecord {
    pub epoch: u64,
    pub cursor: u64,
    pub emitted: u64,
    pub rng_word_pos: u64,
    pub buffer: String,
    pub specs: Vec<SpecRecord>,
    /// Informational, checked against the position on load; absent in some older states.
    #[serde(default)]
    pub seek: Option<Seek>,
    /// The packer's pending documents (`state/pack.rs`); absent for a stream that does not pack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<super::pack::PackRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecRecord {
    pub epoch: u64,
    pub ranges: Vec<[u64; 2]>,
    pub injected: String,
}

/// Rows `[start, stop)` of epoch `epoch`'s stream of slot `slot = [index, count]` were passed
/// over by a skip without being yielded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkipRecord {
    pub epoch: u64,
    pub slot: [u32; 2],
    pub start: u64,
    pub stop: u64,
}

/// The root of a checkpoint, by stage.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Stream(Box<StreamState>),
    /// A map-style dataset's sampler (`state/sampler.rs`).
    Sampler(Box<super::sampler::SamplerState>),
    Mixture(Box<MixtureState>),
}

/// Parse one node of a saved state, dispatching on its `format`. `what` names it in errors.
pub fn parse_node(v: Value, what: &str) -> Result<Node> {
    let Value::Object(map) = &v else {
        return Err(Error::State(format!(
            "a shardstream state is a dict, got {}",
            type_name(&v)
        )));
    };
    match map.get("format").and_then(Value::as_str) {
        Some(STREAM_FORMAT) => Ok(Node::Stream(Box::new(StreamState::parse(v, what)?))),
        Some(super::sampler::SAMPLER_FORMAT) => Ok(Node::Sampler(Box::new(
            super::sampler::SamplerState::parse(v, what)?,
        ))),
        Some(MIXTURE_FORMAT) => Ok(Node::Mixture(Box::new(MixtureState::parse(v, what)?))),
        _ => Err(Error::State(format!(
            "not a shardstream ParquetStream state (format={})",
            py_repr(map.get("format").unwrap_or(&Value::Null))
        ))),
    }
}

/// Parse the root of a checkpoint that must be a stream's state.
pub fn parse_stream(v: Value, what: &str) -> Result<StreamState> {
    match parse_node(v, what)? {
        Node::Stream(st) => Ok(*st),
        Node::Sampler(_) => Err(Error::State(format!(
            "not a shardstream ParquetStream state (format='{}')",
            super::sampler::SAMPLER_FORMAT
        ))),
        Node::Mixture(_) => Err(Error::State(format!(
            "{what} is a {MIXTURE_FORMAT} state, not a ParquetStream's: load it into the \
             Mixture that saved it"
        ))),
    }
}

impl StreamState {
    /// The state of a stream over `catalog` with `settings` in the pass starting at
    /// `first_epoch`: of `layout`'s slot at `position`, or (`None`) of a slot that has not read
    /// anything.
    pub fn new(
        catalog: &crate::catalog::Catalog,
        settings: &Settings,
        first_epoch: u64,
        at: Option<(Slot, Even, PositionRecord)>,
        skips: Vec<SkipRecord>,
    ) -> Self {
        let (slot, position) = match at {
            Some((slot, even, position)) => (
                Some(SlotRecord {
                    index: slot.index,
                    count: slot.count,
                    even: even.name().into(),
                }),
                Some(position),
            ),
            None => (None, None),
        };
        StreamState {
            format: STREAM_FORMAT.into(),
            version: STREAM_VERSION,
            fingerprint: FingerprintRecord::of(catalog.fingerprint()),
            settings: SettingsRecord::of(settings),
            first_epoch,
            slot,
            position,
            skips,
        }
    }

    /// Parse a stream state: format and version first (so a state of another version says so
    /// rather than listing fields), then every field strictly.
    pub fn parse(mut v: Value, what: &str) -> Result<StreamState> {
        let version = v.get("version").cloned().unwrap_or(Value::Null);
        if version.is_f64() || !matches!(version.as_u64(), Some(2) | Some(STREAM_VERSION)) {
            return Err(Error::State(format!(
                "state version {} is not supported: this shardstream reads versions 2 and \
                 {STREAM_VERSION}",
                py_repr(&version)
            )));
        }
        if version.as_u64() == Some(2) {
            upgrade_v2(&mut v, what)?;
        }
        let st: StreamState = from_value(v, what)?;
        st.check(what)?;
        Ok(st)
    }

    /// Field rules that need no dataset: slot and position agree, skip records are ranges.
    fn check(&self, what: &str) -> Result<()> {
        // An epoch number plus a pass length must not wrap (epochs are below 2**63 too).
        let limit = u64::MAX >> 1;
        if self.first_epoch > limit || self.position.as_ref().is_some_and(|p| p.epoch > limit) {
            return Err(Error::State(format!(
                "{what}: epochs must be below 2**63, got first_epoch {} (position epoch {})",
                self.first_epoch,
                self.position
                    .as_ref()
                    .map_or("none".into(), |p| p.epoch.to_string())
            )));
        }
        if let Some(s) = &self.slot {
            if s.count == 0 || s.index >= s.count {
                return Err(Error::State(format!(
                    "{what}['slot'] index {} is not below count {}",
                    s.index, s.count
                )));
            }
            Even::parse_state(&s.even, &format!("{what}['slot']['even']"))?;
        }
        match (&self.slot, &self.position) {
            (None, Some(_)) => {
                return Err(Error::State(format!("{what} has a position but no slot")))
            }
            (Some(_), None) => {
                return Err(Error::State(format!(
                    "{what}['position'] must be a dict, got None"
                )))
            }
            _ => {}
        }
        Even::parse(
            self.settings.even.as_deref(),
            &format!("{what}['settings']['even']"),
        )
        .map_err(|e| Error::State(e.to_string()))?;
        if let Some(p) = &self.position {
            // Row ids (base64) and spec ranges are part of the shape: decode them now.
            p.to_slot_state(&format!("{what}['position']"))?;
        }
        check_skips(&self.skips, &format!("{what}['skips']"))
    }

    /// The slot and the `even` policy its layout ran with.
    pub fn layout(&self) -> Option<(Slot, Even)> {
        let s = self.slot.as_ref()?;
        let even = Even::parse_state(&s.even, "slot").ok()?;
        Some((Slot::new(s.index, s.count).ok()?, even))
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a state serializes")
    }
}

/// A version-2 state as version 3: its buffer's base64 text as Latin-1 text of the same ids.
/// Anything that is not a string there is left for the field checks to name.
fn upgrade_v2(v: &mut Value, what: &str) -> Result<()> {
    if let Some(Value::String(text)) = v.pointer_mut("/position/buffer") {
        let ids = super::ids_from_base64(text, &format!("{what}['position']['buffer']"))?;
        *text = super::ids_to_latin1(&ids);
    }
    v["version"] = Value::from(STREAM_VERSION);
    Ok(())
}

impl Even {
    /// A layout's policy as a state records it: "off", "drop" or "pad".
    pub fn parse_state(v: &str, what: &str) -> Result<Even> {
        match v {
            "off" => Ok(Even::Off),
            "drop" => Ok(Even::Drop),
            "pad" => Ok(Even::Pad),
            other => Err(Error::State(format!(
                "{what} must be one of ('off', 'drop', 'pad'), got {other:?}"
            ))),
        }
    }
}

impl FingerprintRecord {
    pub fn of(f: &Fingerprint) -> Self {
        FingerprintRecord {
            shards: f.shards,
            rows: f.rows,
            paths: f.paths.clone(),
            content: f.content.clone(),
            buckets: f.buckets.clone(),
        }
    }

    pub fn matches(&self, f: &Fingerprint) -> bool {
        *self == Self::of(f)
    }
}

impl SettingsRecord {
    pub fn of(s: &Settings) -> Self {
        SettingsRecord {
            seed: s.seed,
            shuffle_buffer: s.shuffle_buffer as u64,
            batch_size: s.batch_size,
            drop_last: s.drop_last,
            epochs: s.epochs,
            pack: s.pack.clone(),
            even: match s.even {
                Even::Off => None,
                e => Some(e.name().to_string()),
            },
        }
    }

    /// `"field: state has X, dataset has Y"` for every setting that differs.
    pub fn differences(&self, now: &SettingsRecord) -> Vec<String> {
        let (a, b) = (self.to_value(), now.to_value());
        let (Value::Object(a), Value::Object(b)) = (a, b) else {
            return Vec::new();
        };
        // Keys of either side, in the state's order: `pack` is absent when a stream does not pack.
        a.keys()
            .chain(b.keys().filter(|k| !a.contains_key(*k)))
            .filter(|k| a.get(*k) != b.get(*k))
            .map(|k| {
                format!(
                    "{k}: state has {}, dataset has {}",
                    py_repr(a.get(k).unwrap_or(&Value::Null)),
                    py_repr(b.get(k).unwrap_or(&Value::Null))
                )
            })
            .collect()
    }

    fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("settings serialize")
    }
}

impl PositionRecord {
    /// `buffer` is the Latin-1 text of `st`'s buffer (whose own `buffer` field is not read: the
    /// stream moves its ids out first), or empty where the caller puts the ids in itself.
    pub fn of(st: &SlotState, buffer: String, seek: Option<Seek>) -> Self {
        PositionRecord {
            epoch: st.epoch,
            cursor: st.cursor,
            emitted: st.emitted,
            rng_word_pos: st.rng_word_pos as u64,
            buffer,
            specs: st
                .specs
                .iter()
                .map(|(e, s)| SpecRecord {
                    epoch: *e,
                    ranges: s.ranges.iter().map(|r| [r.start, r.end]).collect(),
                    injected: super::ids_to_base64(&s.injected),
                })
                .collect(),
            seek,
            pack: st.pack.as_deref().map(super::pack::PackRecord::of),
        }
    }

    /// The core's position; `what` names the record in errors.
    pub fn to_slot_state(&self, what: &str) -> Result<SlotState> {
        let mut specs = Vec::with_capacity(self.specs.len());
        for (i, s) in self.specs.iter().enumerate() {
            let w = format!("{what}['specs'][{i}]");
            let mut ranges = Vec::with_capacity(s.ranges.len());
            for [a, b] in &s.ranges {
                if a > b {
                    return Err(Error::State(format!(
                        "{w}: range [{a}, {b}] is not [start, end] with start <= end"
                    )));
                }
                ranges.push(*a..*b);
            }
            let injected = ids_from_base64(&s.injected, &format!("{w}['injected']"))?;
            specs.push((s.epoch, SlotSpec { ranges, injected }));
        }
        Ok(SlotState {
            epoch: self.epoch,
            cursor: self.cursor,
            emitted: self.emitted,
            rng_word_pos: u128::from(self.rng_word_pos),
            buffer: super::ids_from_latin1(&self.buffer, &format!("{what}['buffer']"))?,
            specs,
            pack: self
                .pack
                .as_ref()
                .map(|p| p.refs(&format!("{what}['pack']")))
                .transpose()?,
        })
    }
}

/// Skip records given on their own (to replay), checked like a state's.
pub fn parse_skips(v: Value, what: &str) -> Result<Vec<SkipRecord>> {
    let records: Vec<SkipRecord> = from_value(v, what)?;
    check_skips(&records, what)?;
    Ok(records)
}

fn check_skips(records: &[SkipRecord], what: &str) -> Result<()> {
    for (i, r) in records.iter().enumerate() {
        let w = format!("{what}[{i}]");
        if r.slot[1] == 0 || r.slot[0] >= r.slot[1] {
            return Err(Error::State(format!(
                "{w}['slot'] index {} is not below count {}",
                r.slot[0], r.slot[1]
            )));
        }
        if r.stop <= r.start {
            return Err(Error::State(format!(
                "{w} is empty or reversed: start {}, stop {}",
                r.start, r.stop
            )));
        }
    }
    Ok(())
}

/// Deserialize `v` into `T`; an error names the field's path under `what`.
pub(crate) fn from_value<T: DeserializeOwned>(v: Value, what: &str) -> Result<T> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let mut at = what.to_string();
        for seg in e.path().iter() {
            match seg {
                serde_path_to_error::Segment::Map { key } => at.push_str(&format!("['{key}']")),
                serde_path_to_error::Segment::Seq { index } => at.push_str(&format!("[{index}]")),
                _ => {}
            }
        }
        Error::State(format!("{at}: {}", e.inner()))
    })
}

/// A value as Python would print it (`None`, `True`, `'drop'`), for messages about settings.
pub fn py_repr(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::String(s) => format!("{s:?}").replace('"', "'"),
        other => other.to_string(),
    }
}

/// Python's name of a value's type, for messages.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn good() -> Value {
        json!({
            "format": STREAM_FORMAT, "version": 3,
            "fingerprint": {"shards": 1, "rows": 10, "paths": "a", "content": "b", "buckets": "AAAAAA=="},
            "settings": {"seed": 0, "shuffle_buffer": 0, "batch_size": null, "drop_last": false,
                         "epochs": 1, "even": "drop"},
            "first_epoch": 0,
            "slot": {"index": 0, "count": 1, "even": "off"},
            "position": {"epoch": 0, "cursor": 3, "emitted": 3, "rng_word_pos": 0, "buffer": "",
                         "specs": [], "seek": null},
            "skips": [],
        })
    }

    fn err(v: Value) -> String {
        StreamState::parse(v, "state").unwrap_err().to_string()
    }

    #[test]
    fn round_trips_and_names_bad_fields() {
        let st = StreamState::parse(good(), "state").unwrap();
        assert_eq!(st.to_value(), good());
        let mut v = good();
        v["position"]["buffer"] = json!("\u{1}\0\0\0\0\0\0\0\u{ff}\0\0\0\0\0\0\0");
        let st = StreamState::parse(v.clone(), "state").unwrap();
        assert_eq!(st.to_value(), v);
        let slot = st.position.as_ref().unwrap().to_slot_state("p").unwrap();
        assert_eq!(slot.buffer, vec![1, 255]);
        // Version 2: the same ids as base64, upgraded to version 3 when parsed.
        let mut old = v.clone();
        old["version"] = json!(2);
        old["position"]["buffer"] = json!("AQAAAAAAAAD/AAAAAAAAAA==");
        assert_eq!(StreamState::parse(old.clone(), "state").unwrap(), st);
        old["position"]["buffer"] = json!("AQAAAAAAAAD/AAAAAAAAAA");
        assert!(err(old).contains("state['position']['buffer'] is not valid base64"));
        let mut v = good();
        v["position"]["cursor"] = json!("12");
        assert!(err(v).contains("state['position']['cursor']"));
        let mut v = good();
        v["surprise_key"] = json!(1);
        assert!(err(v).contains("surprise_key"));
        let mut v = good();
        v.as_object_mut().unwrap().remove("slot");
        assert!(err(v).contains("slot"));
        let mut v = good();
        v["settings"]["drop_last"] = json!(1);
        assert!(err(v).contains("state['settings']['drop_last']"));
        let mut v = good();
        v["first_epoch"] = json!(true);
        assert!(err(v).contains("first_epoch"));
        let mut v = good();
        v["version"] = json!(4);
        assert!(err(v).contains("version 4 is not supported"));
        let mut v = good();
        v["version"] = json!(2.0);
        assert!(err(v).contains("version 2.0 is not supported"));
        let mut v = good();
        v["slot"] = json!(null);
        assert!(err(v).contains("position but no slot"));
        let mut v = good();
        v["skips"] = json!([{"epoch": 0, "slot": [1, 1], "start": 0, "stop": 2}]);
        assert!(err(v).contains("state['skips'][0]['slot']"));
        // A missing seek is accepted (older states), a missing buffer is not.
        let mut v = good();
        v["position"].as_object_mut().unwrap().remove("seek");
        StreamState::parse(v, "state").unwrap();
        let mut v = good();
        v["position"].as_object_mut().unwrap().remove("buffer");
        assert!(err(v).contains("buffer"));
    }

    #[test]
    fn settings_differences_name_the_field() {
        let a = SettingsRecord::of(&Settings {
            seed: 1,
            shuffle_buffer: 0,
            batch_size: None,
            drop_last: false,
            epochs: Some(1),
            even: Even::Off,
            pack: None,
        });
        let mut b = a.clone();
        b.even = Some("drop".into());
        b.seed = 2;
        assert_eq!(
            a.differences(&b),
            vec![
                "seed: state has 1, dataset has 2".to_string(),
                "even: state has None, dataset has 'drop'".to_string()
            ]
        );
    }
}

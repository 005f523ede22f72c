//! The saved state of a [`crate::sampler`]: a node of the state tree of its own format
//! (`shardstream.Sampler`) and version. O(1): the settings that define the order, the epoch and
//! one global position, plus skip history. docs/state-format.md describes every field.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::envelope::{from_value, py_repr, required};
use crate::error::{Error, Result};
use crate::settings::SamplerSettings;

/// `format` of a sampler state.
pub const SAMPLER_FORMAT: &str = "shardstream.Sampler";
/// The version this code writes and reads.
pub const SAMPLER_VERSION: u64 = 1;

/// Where a sampler stands: every position of `epoch`'s order below `position` was yielded (by
/// some rank), none at or above it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplerState {
    pub format: String,
    pub version: u64,
    pub settings: SamplerSettingsRecord,
    pub epoch: u64,
    pub position: u64,
    /// Global positions passed over by `skip()`, in this run and the runs it resumed from.
    pub skips: Vec<SamplerSkip>,
}

/// What defines the order: the sampler's arguments (not its ranks: the position is global).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplerSettingsRecord {
    pub rows: u64,
    pub seed: u64,
    pub shuffle: bool,
    #[serde(deserialize_with = "required")]
    pub block_size: Option<u64>,
    #[serde(deserialize_with = "required")]
    pub window: Option<u64>,
}

/// Positions `[start, stop)` of epoch `epoch`'s order were passed over without being yielded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplerSkip {
    pub epoch: u64,
    pub start: u64,
    pub stop: u64,
}

impl SamplerSettingsRecord {
    pub fn of(s: &SamplerSettings) -> Self {
        SamplerSettingsRecord {
            rows: s.rows,
            seed: s.seed,
            shuffle: s.shuffle,
            block_size: s.block.map(|b| b.0),
            window: s.block.map(|b| b.1),
        }
    }

    /// `"field: state has X, sampler has Y"` for every setting that differs.
    pub fn differences(&self, now: &SamplerSettingsRecord) -> Vec<String> {
        let (Value::Object(a), Value::Object(b)) = (to_value(self), to_value(now)) else {
            return Vec::new();
        };
        a.iter()
            .filter(|(k, v)| b.get(*k) != Some(*v))
            .map(|(k, v)| {
                format!(
                    "{k}: state has {}, sampler has {}",
                    py_repr(v),
                    py_repr(b.get(k).unwrap_or(&Value::Null))
                )
            })
            .collect()
    }
}

fn to_value<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("records serialize")
}

impl SamplerState {
    pub fn new(
        settings: &SamplerSettings,
        epoch: u64,
        position: u64,
        skips: Vec<SamplerSkip>,
    ) -> Self {
        SamplerState {
            format: SAMPLER_FORMAT.into(),
            version: SAMPLER_VERSION,
            settings: SamplerSettingsRecord::of(settings),
            epoch,
            position,
            skips,
        }
    }

    /// Parse strictly: format and version first, then every field (errors name the field as a
    /// path under `what`), then the rules that need no sampler.
    pub fn parse(v: Value, what: &str) -> Result<SamplerState> {
        let format = v.get("format").cloned().unwrap_or(Value::Null);
        if format.as_str() != Some(SAMPLER_FORMAT) {
            return Err(Error::State(format!(
                "{what} is not a shardstream sampler state (format={}, expected '{SAMPLER_FORMAT}')",
                py_repr(&format)
            )));
        }
        let version = v.get("version").cloned().unwrap_or(Value::Null);
        if version.as_u64() != Some(SAMPLER_VERSION) || version.is_f64() {
            return Err(Error::State(format!(
                "{what}: sampler state version {} is not supported: this shardstream reads \
                 version {SAMPLER_VERSION}",
                py_repr(&version)
            )));
        }
        let st: SamplerState = from_value(v, what)?;
        st.check(what)?;
        Ok(st)
    }

    fn check(&self, what: &str) -> Result<()> {
        let s = &self.settings;
        let bad = |m: String| Err(Error::State(format!("{what}{m}")));
        if self.epoch > u64::MAX >> 1 {
            return bad(format!("['epoch'] must be below 2**63, got {}", self.epoch));
        }
        if self.position > s.rows {
            return bad(format!(
                "['position'] {} is past the end of an epoch of {} rows",
                self.position, s.rows
            ));
        }
        if s.block_size.is_some() != s.window.is_some() {
            return bad("['settings']: block_size and window are both ints or both None".into());
        }
        if !s.shuffle && s.block_size.is_some() {
            return bad("['settings']: block_size needs shuffle=True".into());
        }
        if s.block_size == Some(0) || s.window == Some(0) {
            return bad("['settings']: block_size and window must be positive".into());
        }
        for (i, r) in self.skips.iter().enumerate() {
            if r.start >= r.stop || r.stop > s.rows {
                return bad(format!(
                    "['skips'][{i}] must have start < stop <= {} rows, got start {}, stop {}",
                    s.rows, r.start, r.stop
                ));
            }
        }
        Ok(())
    }

    pub fn to_value(&self) -> Value {
        to_value(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn good() -> Value {
        json!({
            "format": SAMPLER_FORMAT, "version": 1,
            "settings": {"rows": 100, "seed": 3, "shuffle": true, "block_size": null, "window": null},
            "epoch": 2, "position": 40,
            "skips": [{"epoch": 1, "start": 5, "stop": 9}],
        })
    }

    fn err(v: Value) -> String {
        SamplerState::parse(v, "state").unwrap_err().to_string()
    }

    #[test]
    fn round_trips_and_names_bad_fields() {
        let st = SamplerState::parse(good(), "state").unwrap();
        assert_eq!(st.to_value(), good());
        let cases: Vec<(&str, Value, &str)> = vec![
            ("position", json!("4"), "state['position']"),
            ("position", json!(101), "past the end"),
            ("position", json!(-1), "state['position']"),
            ("epoch", json!(1u64 << 63), "below 2**63"),
            ("epoch", json!(true), "state['epoch']"),
            ("version", json!(2), "version 2 is not supported"),
            ("version", json!(1.0), "version 1.0 is not supported"),
            (
                "format",
                json!("shardstream.ParquetStream"),
                "not a shardstream sampler state",
            ),
            (
                "skips",
                json!([{"epoch": 0, "start": 9, "stop": 9}]),
                "state['skips'][0]",
            ),
            (
                "skips",
                json!([{"epoch": 0, "start": 0, "stop": 101}]),
                "state['skips'][0]",
            ),
            (
                "skips",
                json!([{"epoch": 0, "start": 0}]),
                "state['skips'][0]",
            ),
            ("surprise", json!(1), "surprise"),
        ];
        for (field, value, want) in cases {
            let mut v = good();
            v[field] = value;
            let e = err(v);
            assert!(e.contains(want), "{field}: {e}");
        }
        let mut v = good();
        v["settings"]["window"] = json!(4);
        assert!(err(v).contains("both ints or both None"));
        let mut v = good();
        v["settings"]["shuffle"] = json!(false);
        v["settings"]["block_size"] = json!(4);
        v["settings"]["window"] = json!(4);
        assert!(err(v).contains("needs shuffle=True"));
        let mut v = good();
        v["settings"].as_object_mut().unwrap().remove("block_size");
        let e = err(v);
        assert!(
            e.contains("state['settings']") && e.contains("block_size"),
            "{e}"
        );
        let mut v = good();
        v.as_object_mut().unwrap().remove("skips");
        assert!(err(v).contains("skips"));
    }
}

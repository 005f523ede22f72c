//! The resumable state of one slot, and the checks a loaded state must pass.
//!
//! A state is a position in row coordinates, never row data: the epoch, how many rows of the
//! slot's range have entered the pipeline (`cursor`) and left it (`emitted`), the PRNG's word
//! position, and the shuffle buffer as global row ids in buffer order. Its size depends on the
//! buffer capacity, not on row width. The Python layer wraps it in a versioned envelope with the
//! catalog fingerprint and settings (python/shardstream/state.py).
//!
//! Validation is what makes a hostile or mismatched state harmless: every consumed row is either
//! emitted or buffered (`cursor - emitted == buffer.len()`), and every buffered id must be a
//! distinct row that this slot already consumed in this epoch. A state that passes can therefore
//! never make the stream repeat or drop a row of the epoch.

mod codec;
pub mod envelope;
pub mod mixture;
pub mod pack;
pub mod sampler;

pub use codec::{ids_from_base64, ids_from_latin1, ids_to_base64, ids_to_latin1};

use crate::error::{Error, Result};
use crate::plan::{EpochPlan, Even, Slot, SlotSpec};
use crate::settings::StreamOptions;

/// Where the next read of a state starts: the seek a resume performs (informational in a saved
/// state, and checked against the position on load).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seek {
    /// Shard path relative to the catalog root.
    pub shard: String,
    pub row_group: u64,
    /// Row within the row group.
    pub row: u64,
    /// Byte offset of the row group's first page in the file.
    pub byte_offset: u64,
}

impl std::fmt::Display for Seek {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "shard {}, row group {}, row {}, byte offset {}",
            self.shard, self.row_group, self.row, self.byte_offset
        )
    }
}

/// Where one slot stands, in row coordinates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotState {
    pub epoch: u64,
    /// Rows of the slot's range taken into the pipeline (emitted or buffered).
    pub cursor: u64,
    /// Rows of the slot's range emitted so far this epoch.
    pub emitted: u64,
    /// Word position of the shuffle buffer's PRNG (its key is derived, not stored).
    pub rng_word_pos: u128,
    /// Buffered rows as global row ids, in buffer order.
    pub buffer: Vec<u64>,
    /// Non-standard specs of this and later epochs, by epoch (only after an elastic resume).
    pub specs: Vec<(u64, SlotSpec)>,
    /// With packing: the packer's pending documents (rows this slot already emitted).
    pub pack: Option<Vec<pack::DocRef>>,
}

impl SlotState {
    pub fn start_of(epoch: u64) -> Self {
        SlotState {
            epoch,
            cursor: 0,
            emitted: 0,
            rng_word_pos: 0,
            buffer: Vec::new(),
            specs: Vec::new(),
            pack: None,
        }
    }

    /// This state's spec for `epoch`, if it has a non-standard one.
    pub fn spec_for(&self, epoch: u64) -> Option<&SlotSpec> {
        self.specs.iter().find(|(e, _)| *e == epoch).map(|(_, s)| s)
    }

    /// Check this state against its epoch's plan and spec and the buffer capacity.
    /// `repeats` allows a row to be buffered twice (`Even::Pad` reads one row twice).
    pub fn validate(
        &self,
        plan: &EpochPlan,
        spec: &SlotSpec,
        capacity: usize,
        repeats: bool,
    ) -> Result<()> {
        let bad = |msg: String| {
            Err(Error::State(format!(
                "invalid state for epoch {}: {msg}",
                self.epoch
            )))
        };
        let total = plan.total();
        for (e, sp) in &self.specs {
            if *e < self.epoch {
                return bad(format!(
                    "it carries a spec for epoch {e}, which is already over"
                ));
            }
            if let Some(r) = sp.ranges.iter().find(|r| r.start > r.end || r.end > total) {
                return bad(format!(
                    "spec range {r:?} of epoch {e} is outside the epoch's {total} rows"
                ));
            }
            if let Some(r) = sp
                .injected
                .iter()
                .find(|&&r| plan.positions_of(&[r])[0].is_none())
            {
                return bad(format!(
                    "spec of epoch {e} injects row {r}, which is outside the dataset"
                ));
            }
        }
        if self.specs.windows(2).any(|w| w[0].0 >= w[1].0) {
            return bad("its specs are not in increasing epoch order".into());
        }
        let len = spec.input_len();
        let injected = spec.injected.len() as u64;
        if self.cursor > len {
            return bad(format!(
                "cursor {} is past the end of the slot's {len} rows",
                self.cursor
            ));
        }
        if self.emitted > self.cursor + injected {
            return bad(format!(
                "{} rows emitted but only {} read and {injected} injected",
                self.emitted, self.cursor
            ));
        }
        let held = self.cursor + injected - self.emitted;
        if held != self.buffer.len() as u64 {
            return bad(format!(
                "{} rows read, {injected} injected and {} emitted, so {held} must be buffered, but the buffer holds {}",
                self.cursor,
                self.emitted,
                self.buffer.len()
            ));
        }
        // The buffer fills before the first output, and once running it holds `capacity` rows
        // until the input runs out (more only while injected rows drain down to capacity).
        let held = self.buffer.len();
        if self.emitted == 0 && self.cursor != 0 {
            return bad("rows were read into the buffer but none emitted".into());
        }
        if self.emitted > 0
            && self.cursor < len
            && (held < capacity || (self.cursor > 0 && held != capacity))
        {
            return bad(format!(
                "buffer holds {held} rows mid-epoch; a running buffer holds {capacity}"
            ));
        }
        if held > capacity.max(spec.injected.len()) {
            return bad(format!(
                "buffer holds {held} rows but shuffle_buffer is {capacity}"
            ));
        }
        if !self.buffer.is_empty() {
            let consumed = SlotSpec {
                ranges: spec.ranges.clone(),
                injected: Vec::new(),
            };
            let unread = consumed.ranges_after(self.cursor);
            let positions = plan.positions_of(&self.buffer);
            let mut injected_left: std::collections::HashMap<u64, usize> =
                std::collections::HashMap::new();
            for r in &spec.injected {
                *injected_left.entry(*r).or_default() += 1;
            }
            for (row, pos) in self.buffer.iter().zip(positions) {
                if let Some(n) = injected_left.get_mut(row).filter(|n| **n > 0) {
                    *n -= 1;
                    continue;
                }
                let Some(p) = pos else {
                    return bad(format!("buffered row {row} is outside the dataset"));
                };
                let read = spec.ranges.iter().any(|r| r.contains(&p))
                    && !unread.iter().any(|r| r.contains(&p) && !repeats);
                if !read {
                    return bad(format!("buffered row {row} was not read by this slot yet"));
                }
            }
            if !repeats {
                let mut sorted = self.buffer.clone();
                sorted.sort_unstable();
                if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
                    return bad(format!("row {} is buffered twice", w[0]));
                }
            }
        }
        Ok(())
    }
}

/// Check a state of `slot` under `opts`; `plan` is the plan of `st.epoch`. Returns the spec the
/// state reads in that epoch.
pub fn check_state(
    opts: &StreamOptions,
    slot: Slot,
    plan: &EpochPlan,
    st: &SlotState,
) -> Result<SlotSpec> {
    let end = opts.epochs.map(|n| opts.first_epoch + n);
    if st.epoch < opts.first_epoch || end.is_some_and(|e| st.epoch > e) {
        return Err(Error::State(format!(
            "state is at epoch {} but this pass covers epochs {}..{}",
            st.epoch,
            opts.first_epoch,
            end.map_or("endless".to_string(), |e| e.to_string())
        )));
    }
    if end == Some(st.epoch) && *st != SlotState::start_of(st.epoch) {
        // "After the last epoch": only the empty state is meaningful there.
        return Err(Error::State(format!(
            "state past the last epoch ({}) must be empty",
            st.epoch
        )));
    }
    if opts.shuffle_buffer == 0 && st.specs.iter().any(|(_, s)| !s.injected.is_empty()) {
        return Err(Error::State(
            "state injects buffered rows but shuffle_buffer is 0".into(),
        ));
    }
    let spec = st
        .spec_for(st.epoch)
        .cloned()
        .unwrap_or_else(|| slot.standard_spec(plan.total(), opts.even));
    st.validate(plan, &spec, opts.shuffle_buffer, opts.even == Even::Pad)?;
    Ok(spec)
}

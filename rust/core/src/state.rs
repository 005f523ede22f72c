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

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;

use crate::error::{Error, Result};
use crate::plan::{EpochPlan, SlotSpec};

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

/// Row ids as packed little-endian u64s, base64-encoded.
pub fn ids_to_base64(ids: &[u64]) -> String {
    let raw: Vec<u8> = ids.iter().flat_map(|r| r.to_le_bytes()).collect();
    BASE64.encode(raw)
}

/// [`ids_to_base64`] for a buffer that changes a little between calls: base64 maps every 3 ids
/// (24 bytes) to 32 characters independently, so only the groups that changed since the last call
/// are re-encoded. Snapshotting a 10k-row buffer every training step then costs a compare and a
/// copy instead of encoding 80 kB.
#[derive(Debug, Default, Clone)]
pub struct Base64Cache {
    ids: Vec<u64>,
    text: String,
}

impl Base64Cache {
    pub fn encode(&mut self, ids: &[u64]) -> &str {
        const GROUP: usize = 3;
        let keep = (ids.len() / GROUP).min(self.ids.len() / GROUP);
        // Valid prefix: whole groups both versions have; the rest is rebuilt.
        let mut text = std::mem::take(&mut self.text).into_bytes();
        text.truncate(keep * 32);
        let mut raw = [0u8; 24];
        let mut put = |group: &[u64], out: &mut [u8]| {
            for (k, id) in group.iter().enumerate() {
                raw[k * 8..k * 8 + 8].copy_from_slice(&id.to_le_bytes());
            }
            BASE64
                .encode_slice(&raw[..group.len() * 8], out)
                .expect("32 bytes hold the base64 of 24");
        };
        for g in 0..keep {
            let (new, old) = (&ids[g * GROUP..][..GROUP], &self.ids[g * GROUP..][..GROUP]);
            if new != old {
                put(new, &mut text[g * 32..g * 32 + 32]);
            }
        }
        for group in ids[keep * GROUP..].chunks(GROUP) {
            let at = text.len();
            text.resize(at + 32, 0);
            put(group, &mut text[at..]);
            if group.len() < GROUP {
                // Padded tail: (8 or 16 bytes) -> 12 or 24 characters.
                text.truncate(at + (group.len() * 8).div_ceil(3) * 4);
            }
        }
        self.ids.clear();
        self.ids.extend_from_slice(ids);
        self.text = String::from_utf8(text).expect("base64 is ASCII");
        &self.text
    }
}

/// Inverse of [`ids_to_base64`]; `field` names the state field in errors.
pub fn ids_from_base64(text: &str, field: &str) -> Result<Vec<u64>> {
    let bytes = BASE64
        .decode(text)
        .map_err(|e| Error::State(format!("state field '{field}' is not valid base64: {e}")))?;
    if bytes.len() % 8 != 0 {
        return Err(Error::State(format!(
            "state field '{field}' holds {} bytes, not a whole number of 8-byte row ids (truncated?)",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("chunks of 8")))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_encoding_round_trips_and_rejects_truncation() {
        let st = SlotState {
            buffer: vec![0, 1, u64::MAX, 1 << 40],
            ..SlotState::start_of(0)
        };
        let text = ids_to_base64(&st.buffer);
        assert_eq!(ids_from_base64(&text, "buffer").unwrap(), st.buffer);
        assert_eq!(ids_from_base64("", "buffer").unwrap(), Vec::<u64>::new());
        let short = BASE64.encode([1u8, 2, 3]);
        assert!(matches!(
            ids_from_base64(&short, "buffer"),
            Err(Error::State(_))
        ));
        assert!(matches!(
            ids_from_base64("not base64!", "buffer"),
            Err(Error::State(_))
        ));
    }
}

#[cfg(test)]
mod cache_tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The incremental encoder always equals a fresh encoding, whatever changed in between.
        #[test]
        fn base64_cache_matches_fresh_encoding(
            steps in proptest::collection::vec(
                (proptest::collection::vec(any::<u64>(), 0..20), 0usize..25, 0usize..4), 1..12)
        ) {
            let mut cache = Base64Cache::default();
            let mut ids: Vec<u64> = Vec::new();
            for (fresh, at, op) in steps {
                match op {
                    0 => ids = fresh,
                    1 => ids.extend(fresh),
                    2 => if !ids.is_empty() { let i = at % ids.len(); ids[i] ^= 1; },
                    _ => ids.truncate(at),
                }
                let fresh = ids_to_base64(&ids);
                prop_assert_eq!(cache.encode(&ids), fresh.as_str());
            }
        }
    }
}

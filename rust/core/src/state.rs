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

use std::ops::Range;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;

use crate::error::{Error, Result};
use crate::plan::EpochPlan;

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
}

impl SlotState {
    pub fn start_of(epoch: u64) -> Self {
        SlotState {
            epoch,
            cursor: 0,
            emitted: 0,
            rng_word_pos: 0,
            buffer: Vec::new(),
        }
    }

    /// The buffer as packed little-endian u64s (8 bytes per buffered row), base64-encoded.
    ///
    /// A `str`, not `bytes`: torch's `weights_only` unpickler rejects empty `bytes`, pickle
    /// protocol 2 (torch.save's) inflates bytes through latin-1, and a string is also JSON.
    pub fn buffer_base64(&self) -> String {
        let raw: Vec<u8> = self.buffer.iter().flat_map(|r| r.to_le_bytes()).collect();
        BASE64.encode(raw)
    }

    pub fn buffer_from_base64(text: &str) -> Result<Vec<u64>> {
        let bytes = BASE64
            .decode(text)
            .map_err(|e| Error::State(format!("state field 'buffer' is not valid base64: {e}")))?;
        if bytes.len() % 8 != 0 {
            return Err(Error::State(format!(
                "state field 'buffer' holds {} bytes, not a whole number of 8-byte row ids (truncated?)",
                bytes.len()
            )));
        }
        Ok(bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("chunks of 8")))
            .collect())
    }

    /// Check this state against the plan of its epoch, the slot's range and buffer capacity.
    pub fn validate(&self, plan: &EpochPlan, range: &Range<u64>, capacity: usize) -> Result<()> {
        let len = range.end - range.start;
        let bad = |msg: String| {
            Err(Error::State(format!(
                "invalid state for epoch {}: {msg}",
                self.epoch
            )))
        };
        if self.cursor > len {
            return bad(format!(
                "cursor {} is past the end of the slot's {len} rows",
                self.cursor
            ));
        }
        if self.emitted > self.cursor {
            return bad(format!(
                "{} rows emitted but only {} read",
                self.emitted, self.cursor
            ));
        }
        let held = self.cursor - self.emitted;
        if held != self.buffer.len() as u64 {
            return bad(format!(
                "{} rows read and {} emitted, so {held} must be buffered, but the buffer holds {}",
                self.cursor,
                self.emitted,
                self.buffer.len()
            ));
        }
        if self.buffer.len() > capacity {
            return bad(format!(
                "buffer holds {} rows but shuffle_buffer is {capacity}",
                self.buffer.len()
            ));
        }
        // Once the first row is emitted the buffer stays full until the input runs out.
        let started = self.emitted > 0;
        if started && self.cursor < len && self.buffer.len() != capacity {
            return bad(format!(
                "buffer holds {} rows mid-epoch; a running buffer holds exactly {capacity}",
                self.buffer.len()
            ));
        }
        if !started && self.cursor != 0 {
            return bad("rows were read into the buffer but none emitted".into());
        }
        if !self.buffer.is_empty() {
            let consumed = range.start..range.start + self.cursor;
            let positions = plan.positions_of(&self.buffer);
            for (row, pos) in self.buffer.iter().zip(positions) {
                match pos {
                    Some(p) if consumed.contains(&p) => {}
                    Some(_) => {
                        return bad(format!("buffered row {row} was not read by this slot yet"))
                    }
                    None => return bad(format!("buffered row {row} is outside the dataset")),
                }
            }
            let mut sorted = self.buffer.clone();
            sorted.sort_unstable();
            if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
                return bad(format!("row {} is buffered twice", w[0]));
            }
        }
        Ok(())
    }
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
        let text = st.buffer_base64();
        assert_eq!(SlotState::buffer_from_base64(&text).unwrap(), st.buffer);
        assert_eq!(
            SlotState::buffer_from_base64("").unwrap(),
            Vec::<u64>::new()
        );
        let short = BASE64.encode([1u8, 2, 3]);
        assert!(matches!(
            SlotState::buffer_from_base64(&short),
            Err(Error::State(_))
        ));
        assert!(matches!(
            SlotState::buffer_from_base64("not base64!"),
            Err(Error::State(_))
        ));
    }
}

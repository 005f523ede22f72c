//! Row ids in a state: packed little-endian u64s, base64-encoded (incrementally, for cheap
//! per-step snapshots).

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;

use crate::error::{Error, Result};

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
        .map_err(|e| Error::State(format!("{field} is not valid base64: {e}")))?;
    if bytes.len() % 8 != 0 {
        return Err(Error::State(format!(
            "{field} holds {} bytes, not a whole number of 8-byte row ids (truncated?)",
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
    use crate::state::SlotState;

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

//! Row ids in a state: packed little-endian u64s, as text. A stream's shuffle buffer
//! (`position['buffer']`, written at every `state_dict()`, 8 bytes per buffered row) is Latin-1
//! text since stream state version 3: one character per byte, so making it costs a copy, not
//! an encoding (Python builds such a `str` from the bytes with one scan). The other row-id
//! fields (a spec's `injected`, a packer's `rows`) and version-2 buffers are base64.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;

use crate::error::{Error, Result};

/// Row ids as packed little-endian u64s, base64-encoded.
pub fn ids_to_base64(ids: &[u64]) -> String {
    let raw: Vec<u8> = ids.iter().flat_map(|r| r.to_le_bytes()).collect();
    BASE64.encode(raw)
}

/// Row ids as Latin-1 text: the character `U+00XX` for each byte `XX` of their little-endian
/// u64s (a shuffle buffer's form, module docs).
pub fn ids_to_latin1(ids: &[u64]) -> String {
    ids.iter()
        .flat_map(|r| r.to_le_bytes())
        .map(char::from)
        .collect()
}

/// Inverse of [`ids_to_latin1`]; `field` names the state field in errors.
pub fn ids_from_latin1(text: &str, field: &str) -> Result<Vec<u64>> {
    let mut raw = Vec::with_capacity(text.len());
    for c in text.chars() {
        let b = u8::try_from(u32::from(c)).map_err(|_| {
            Error::State(format!(
                "{field} holds the character {c:?}, not Latin-1 text of row ids (each character \
                 one byte, U+0000..U+00FF)"
            ))
        })?;
        raw.push(b);
    }
    ids_of_bytes(&raw, field)
}

/// Inverse of [`ids_to_base64`]; `field` names the state field in errors.
pub fn ids_from_base64(text: &str, field: &str) -> Result<Vec<u64>> {
    let bytes = BASE64
        .decode(text)
        .map_err(|e| Error::State(format!("{field} is not valid base64: {e}")))?;
    ids_of_bytes(&bytes, field)
}

/// Little-endian u64s; `field` names the state field in errors.
fn ids_of_bytes(bytes: &[u8], field: &str) -> Result<Vec<u64>> {
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

    #[test]
    fn latin1_round_trips_and_rejects_truncation_and_wide_characters() {
        let ids = vec![0, 1, u64::MAX, 1 << 40, 0x8081_82ff_7f00_c3a9];
        let text = ids_to_latin1(&ids);
        assert_eq!(text.chars().count(), 8 * ids.len());
        assert!(text.chars().all(|c| u32::from(c) <= 0xff));
        assert_eq!(ids_from_latin1(&text, "buffer").unwrap(), ids);
        assert_eq!(ids_from_latin1("", "buffer").unwrap(), Vec::<u64>::new());
        let short: String = text.chars().take(12).collect();
        let e = ids_from_latin1(&short, "state['position']['buffer']").unwrap_err();
        assert!(e
            .to_string()
            .contains("state['position']['buffer'] holds 12 bytes"));
        let wide = format!("\u{100}{text}");
        let e = ids_from_latin1(&wide, "buffer").unwrap_err();
        assert!(e.to_string().contains("not Latin-1 text"), "{e}");
    }
}

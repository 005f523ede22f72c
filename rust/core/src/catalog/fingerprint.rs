//! The fingerprint of a shard set, and naming the shards that changed since a saved one.

use sha2::{Digest, Sha256};

use super::{Catalog, Shard};
use crate::error::{Error, Result};

/// A digest of the shard set: what a saved state must match to be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    pub shards: u64,
    pub rows: u64,
    /// SHA-256 (hex, truncated to 16 bytes) over the relative paths.
    pub paths: String,
    /// SHA-256 (hex, truncated) over paths, sizes, row-group row counts and footer digests.
    pub content: String,
    /// Per-bucket digests (4 bytes each, base64): shards are put in buckets by a hash of their
    /// relative path, so a state can say *which* shards changed, were added or removed without
    /// storing every path (a 10,000-shard set still costs at most 1.4 kB per state).
    pub buckets: String,
}

/// Which shards differ from a saved fingerprint's buckets.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ShardChanges {
    /// Shards (relative paths) in buckets that were empty when the state was saved.
    pub added: Vec<String>,
    /// Shards in buckets whose digest differs: at least one of them changed, or a shard that
    /// shared their bucket was added or removed.
    pub changed: Vec<String>,
    /// Buckets that held shards then and hold none now: that many (or more) shards removed
    /// or renamed; the state does not store their paths.
    pub removed_buckets: usize,
}

fn hex16(bytes: &[u8]) -> String {
    bytes[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// At most 256 buckets (1 kB); about four per shard below that, so small sets name shards
/// exactly.
fn bucket_count(shards: usize) -> usize {
    (shards.max(1).next_power_of_two() * 4).min(256)
}

fn bucket_of(rel_path: &str, buckets: usize) -> usize {
    let h = Sha256::digest(rel_path.as_bytes());
    (u64::from_le_bytes(h[..8].try_into().expect("8 bytes")) % buckets as u64) as usize
}

fn shard_content(h: &mut Sha256, s: &Shard) {
    h.update(s.rel_path.as_bytes());
    h.update([0u8]);
    h.update(s.size.to_le_bytes());
    h.update((s.row_groups.len() as u64).to_le_bytes());
    for rg in &s.row_groups {
        h.update(rg.num_rows.to_le_bytes());
    }
    h.update(s.footer_digest);
}

/// 4 bytes per bucket of `buckets`; all-zero for an empty bucket.
fn bucket_digests(shards: &[Shard], buckets: usize) -> Vec<u8> {
    let mut hashers: Vec<Option<Sha256>> = (0..buckets).map(|_| None).collect();
    for s in shards {
        shard_content(
            hashers[bucket_of(&s.rel_path, buckets)].get_or_insert_with(Sha256::new),
            s,
        );
    }
    let mut out = Vec::with_capacity(4 * buckets);
    for h in hashers {
        match h {
            Some(h) => out.extend_from_slice(&h.finalize()[..4]),
            None => out.extend_from_slice(&[0u8; 4]),
        }
    }
    out
}

pub(super) fn fingerprint(shards: &[Shard]) -> Fingerprint {
    use base64::Engine;
    let mut paths = Sha256::new();
    let mut content = Sha256::new();
    for s in shards {
        paths.update(s.rel_path.as_bytes());
        paths.update([0u8]);
        shard_content(&mut content, s);
    }
    Fingerprint {
        shards: shards.len() as u64,
        rows: shards.iter().map(|s| s.num_rows).sum(),
        paths: hex16(&paths.finalize()),
        content: hex16(&content.finalize()),
        buckets: base64::engine::general_purpose::STANDARD
            .encode(bucket_digests(shards, bucket_count(shards.len()))),
    }
}

impl Catalog {
    /// Which shards differ from a saved fingerprint's `buckets` (base64). Names shards exactly
    /// up to bucket collisions: at most 256 buckets, so large sets name small groups.
    pub fn changes_since(&self, saved_buckets: &str) -> Result<ShardChanges> {
        use base64::Engine;
        let saved = base64::engine::general_purpose::STANDARD
            .decode(saved_buckets)
            .map_err(|e| Error::State(format!("fingerprint buckets are not base64: {e}")))?;
        if saved.is_empty() || saved.len() % 4 != 0 || !(saved.len() / 4).is_power_of_two() {
            return Err(Error::State(format!(
                "fingerprint buckets hold {} bytes, expected 4 per bucket and a power of two \
                 buckets",
                saved.len()
            )));
        }
        let n = saved.len() / 4;
        // Recompute ours with the saved bucket count (the shard count may have changed).
        let now = bucket_digests(&self.shards, n);
        let mut members: Vec<Vec<&str>> = vec![Vec::new(); n];
        for s in &self.shards {
            members[bucket_of(&s.rel_path, n)].push(&s.rel_path);
        }
        let mut out = ShardChanges::default();
        for b in 0..n {
            let then = &saved[4 * b..4 * b + 4];
            if then == &now[4 * b..4 * b + 4] {
                continue;
            }
            let names = members[b].iter().map(|p| p.to_string());
            if then == [0u8; 4] {
                out.added.extend(names);
            } else if members[b].is_empty() {
                out.removed_buckets += 1;
            } else {
                out.changed.extend(names);
            }
        }
        Ok(out)
    }
}

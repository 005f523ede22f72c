//! The metadata sidecar (`_shardstream_index.json` in the dataset root): what `Catalog::open`
//! would learn from every footer, written once by `shardstream index`, so that opening 10,000+
//! shards costs one directory walk, one `stat` per file and one JSON parse.
//!
//! Trust, but check: an entry is used only if the file's size and mtime still match it; any
//! other file's footer is read as usual (so a stale sidecar costs speed, never correctness). A
//! shard known from the sidecar has its footer parsed on first read, and that read checks the
//! footer bytes against the digest recorded here (`Shard::reader_meta`). Footer digests feed the
//! fingerprint exactly as when footers are read, so states match either way.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::footer::{file_id, fill_schemas, indexed_shard, mtime_ns, read_footers, rel_path};
use super::{Catalog, RowGroupInfo, Shard};
use crate::error::{Error, Result};

/// File name of the sidecar, in the dataset root (the deepest directory holding every shard).
pub const INDEX_FILE: &str = "_shardstream_index.json";
const FORMAT: &str = "shardstream.index";
const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct IndexFile {
    format: String,
    version: u32,
    shards: Vec<Entry>,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    /// Relative to the directory holding the sidecar.
    path: String,
    size: u64,
    mtime_ns: u64,
    /// `[rows, byte_offset, compressed_bytes]` per row group.
    row_groups: Vec<[u64; 3]>,
    offset_index: bool,
    footer: String,
    schema: String,
}

fn hex(bytes: &[u8; 16]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str, what: &str, file: &Path) -> Result<[u8; 16]> {
    let bad = || {
        Error::Config(format!(
            "{}: {what} {s:?} is not 32 hex digits: rerun `shardstream index` or delete the file",
            file.display()
        ))
    };
    if s.len() != 32 {
        return Err(bad());
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

pub fn sidecar_path(root: &Path) -> PathBuf {
    root.join(INDEX_FILE)
}

/// Entries of the sidecar in `root`, by relative path; `None` if there is none. A sidecar that
/// exists but can't be parsed is an error naming it (not silently ignored: the user asked for it).
fn load(root: &Path) -> Result<Option<HashMap<String, Entry>>> {
    let path = sidecar_path(root);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(&path, e)),
    };
    let file: IndexFile = serde_json::from_slice(&text).map_err(|e| {
        Error::Config(format!(
            "{}: not a valid shardstream index ({e}): rerun `shardstream index` or delete it",
            path.display()
        ))
    })?;
    if file.format != FORMAT || file.version != VERSION {
        return Err(Error::Config(format!(
            "{}: index format {:?} version {} is not {FORMAT:?} version {VERSION}: rerun \
             `shardstream index`",
            path.display(),
            file.format,
            file.version
        )));
    }
    Ok(Some(
        file.shards
            .into_iter()
            .map(|e| (e.path.clone(), e))
            .collect(),
    ))
}

/// The shards of `paths` (sorted, absolute) under `root`: from the sidecar where it is current,
/// else by reading footers (concurrently). Every shard has its schema set on return.
pub(crate) fn open_shards(paths: &[PathBuf], root: &Path) -> Result<Vec<Shard>> {
    let Some(mut entries) = load(root)? else {
        return read_footers(paths, root);
    };
    let sidecar = sidecar_path(root);
    let mut known: Vec<Option<Shard>> = Vec::with_capacity(paths.len());
    let mut unknown = Vec::new();
    for path in paths {
        let rel = rel_path(path, root);
        let current = match entries.remove(&rel) {
            Some(e) => {
                let fs = std::fs::metadata(path).map_err(|err| Error::io(path, err))?;
                (fs.len() == e.size && mtime_ns(&fs) == e.mtime_ns).then_some((e, file_id(&fs)))
            }
            None => None,
        };
        match current {
            Some((e, id)) => {
                let row_groups = rows_of(&e);
                known.push(Some(indexed_shard(
                    path.clone(),
                    rel,
                    e.size,
                    e.mtime_ns,
                    row_groups,
                    e.offset_index,
                    unhex(&e.footer, "footer digest", &sidecar)?,
                    unhex(&e.schema, "schema digest", &sidecar)?,
                    id,
                )));
            }
            None => {
                known.push(None);
                unknown.push(path.clone());
            }
        }
    }
    let mut read = read_footers(&unknown, root)?.into_iter();
    let mut shards: Vec<Shard> = known
        .into_iter()
        .map(|s| s.or_else(|| read.next()))
        .collect::<Option<_>>()
        .ok_or_else(|| Error::Internal("footer count mismatch".into()))?;
    fill_schemas(&mut shards)?;
    Ok(shards)
}

fn rows_of(e: &Entry) -> Vec<RowGroupInfo> {
    let mut first = 0;
    e.row_groups
        .iter()
        .map(|&[rows, byte_offset, bytes]| {
            let rg = RowGroupInfo {
                num_rows: rows,
                first_row: first,
                byte_offset,
                compressed_bytes: bytes,
            };
            first += rows;
            rg
        })
        .collect()
}

/// Write the sidecar for every shard of `catalog` into its root (atomically: a temporary file
/// renamed over the old one). Returns its path.
pub fn write(catalog: &Catalog) -> Result<PathBuf> {
    if catalog.is_remote() {
        return Err(Error::Config(format!(
            "the metadata sidecar is for local datasets; {} is in an object store (its footers \
             are read with one request per shard, {} at a time)",
            catalog.root().display(),
            crate::store::FOOTER_CONCURRENCY
        )));
    }
    let shards = catalog
        .shards()
        .iter()
        .map(|s| Entry {
            path: s.rel_path.clone(),
            size: s.size,
            mtime_ns: s.mtime_ns,
            row_groups: s
                .row_groups
                .iter()
                .map(|r| [r.num_rows, r.byte_offset, r.compressed_bytes])
                .collect(),
            offset_index: s.has_offset_index,
            footer: hex(&s.footer_digest),
            schema: hex(&s.schema_digest),
        })
        .collect();
    let file = IndexFile {
        format: FORMAT.into(),
        version: VERSION,
        shards,
    };
    let path = sidecar_path(catalog.root());
    let tmp = path.with_extension(format!("json.tmp{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec(&file).map_err(std::io::Error::other)?)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(&path, e)
    })?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{drain_ids, write_shards};
    use crate::{Slot, Stream, StreamOptions};
    use std::sync::Arc;

    fn stream_ids(files: &[String]) -> (Vec<Vec<i64>>, crate::catalog::Fingerprint) {
        let cat = Arc::new(Catalog::open(files, None).unwrap());
        let fp = cat.fingerprint().clone();
        let opts = StreamOptions {
            shuffle_buffer: 7,
            epochs: Some(1),
            ..Default::default()
        };
        let mut s = Stream::new(cat, opts, Slot::new(0, 1).unwrap()).unwrap();
        (drain_ids(&mut s, 5), fp)
    }

    /// With the sidecar, the catalog (fingerprint included) and stream are the ones reading every
    /// footer gives; a stale entry falls back to the footer; a file changed behind an entry
    /// that still matches size and mtime is caught when its footer is first used.
    #[test]
    fn sidecar_gives_the_same_catalog_and_catches_changes() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_shards(dir.path(), &[30, 0, 17, 25], 6);
        let (plain, fp) = stream_ids(&files);
        let cat = Catalog::open(&files, None).unwrap();
        let side = write(&cat).unwrap();
        assert!(side.exists());
        let (indexed, fp2) = stream_ids(&files);
        assert_eq!(indexed, plain);
        assert_eq!(fp2, fp);

        // Stale entry (size differs): that footer is read, the result is still right.
        let other = tempfile::tempdir().unwrap();
        let fresh = write_shards(other.path(), &[30, 0, 17, 26], 6);
        std::fs::copy(&fresh[3], &files[3]).unwrap();
        // Coarse filesystem clocks can give the copy the old mtime: make it differ for sure.
        let f = std::fs::File::options()
            .write(true)
            .open(&files[3])
            .unwrap();
        f.set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(7))
            .unwrap();
        let (after, fp3) = stream_ids(&files);
        assert_ne!(fp3, fp);
        assert_eq!(after.concat().len(), 30 + 17 + 26);

        // Same size and mtime but other bytes: caught when its footer is first used (shard 2
        // is not its schema group's representative, so that is at read time), naming it.
        write(&Catalog::open(&files, None).unwrap()).unwrap();
        let meta = std::fs::metadata(&files[2]).unwrap();
        let mut bytes = std::fs::read(&files[2]).unwrap();
        let n = bytes.len();
        bytes[n - 20] ^= 0x55; // inside the footer
        std::fs::write(&files[2], &bytes).unwrap();
        let f = std::fs::File::options()
            .write(true)
            .open(&files[2])
            .unwrap();
        f.set_modified(meta.modified().unwrap()).unwrap();
        let cat = Arc::new(Catalog::open(&files, None).unwrap());
        let mut s = Stream::new(cat, StreamOptions::default(), Slot::new(0, 1).unwrap()).unwrap();
        let err = loop {
            match s.next_batch(5) {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("a changed shard was read without error"),
                Err(e) => break e.to_string(),
            }
        };
        assert!(
            err.contains("s002.parquet") && err.contains("shardstream index"),
            "{err}"
        );
    }

    #[test]
    fn malformed_sidecar_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_shards(dir.path(), &[5], 6);
        std::fs::write(dir.path().join(INDEX_FILE), b"{not json").unwrap();
        let err = Catalog::open(&files, None).unwrap_err().to_string();
        assert!(err.contains(INDEX_FILE), "{err}");
    }
}

//! The metadata sidecar (`_shardstream_index.json` in the dataset root, a directory or an
//! object-store prefix): what `Catalog::open` would learn from every footer, written once by
//! `shardstream index`, so that opening 10,000+ shards costs one directory walk and one `stat`
//! per file (locally) or one listing and one GET (in a bucket), plus one JSON parse.
//!
//! Trust, but check: an entry is used only if its file still matches it (size and mtime
//! locally; size and ETag in a bucket); any other file's footer is read as usual (so a stale
//! sidecar costs speed, never correctness). A shard known from the sidecar has its footer
//! parsed on first read, and that read checks the footer bytes against the digest recorded here
//! (`Shard::reader_meta`). Footer digests feed the fingerprint exactly as when footers are
//! read, so states match either way. Each schema is recorded too (checked against its digest),
//! so opening reads no footer at all.
//!
//! The same JSON, with the root and output columns, is a catalog's pickled form
//! ([`snapshot`] / [`from_snapshot`]): a spawned DataLoader worker gets its parent's catalog
//! instead of listing and reading footers again.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_schema::{Schema, SchemaRef};
use serde::{Deserialize, Serialize};

use super::footer::{
    file_id, fill_schemas, indexed_shard, mtime_ns, read_footers, read_remote_footers, rel_path,
    RemoteSet,
};
use super::ipc::{DictMsg, IpcIndex, Msg};
use super::schema::schema_digest;
use super::{Catalog, Format, RowGroupInfo, Shard};
use crate::error::{Error, Result};
use crate::store::{Object, Store};

/// File name of the sidecar, in the dataset root (the deepest directory holding every shard).
pub const INDEX_FILE: &str = "_shardstream_index.json";
const FORMAT: &str = "shardstream.index";
const VERSION: u32 = 1;
const SNAPSHOT_FORMAT: &str = "shardstream.catalog";
const SNAPSHOT_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct IndexFile {
    format: String,
    version: u32,
    /// The Arrow schema of each schema digest (hex). Sidecars written before it existed lack
    /// it: then one footer per schema is read at open.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    schemas: BTreeMap<String, Schema>,
    shards: Vec<Entry>,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    /// Relative to the directory holding the sidecar.
    path: String,
    size: u64,
    /// Local files: what the entry is checked against with the size.
    #[serde(default)]
    mtime_ns: u64,
    /// Objects: what the entry is checked against with the size (mtime changes with a copy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    etag: Option<String>,
    /// Snapshots only: a local file's `[device, inode]` when the catalog opened it, so the
    /// copy checks every open as the original does (a sidecar's would be stale after a copy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    file_id: Option<[u64; 2]>,
    /// `[rows, byte_offset, compressed_bytes]` per row group.
    row_groups: Vec<[u64; 3]>,
    offset_index: bool,
    /// Arrow IPC shards: the batch index (absent for Parquet, so Parquet entries are unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ipc: Option<IpcEntry>,
    footer: String,
    schema: String,
}

/// An IPC shard's batch index: what opening it would otherwise read from every message header.
#[derive(Serialize, Deserialize)]
struct IpcEntry {
    stream: bool,
    version: i16,
    /// `[offset, metadata bytes, body bytes]` per record batch (rows are in `row_groups`).
    batches: Vec<[u64; 3]>,
    /// `[offset, metadata bytes, body bytes, dictionary id, delta (0/1)]` per dictionary message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    dicts: Vec<[i64; 5]>,
    /// Dictionary messages before each batch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    dicts_before: Vec<u32>,
    /// Some message has compressed buffers; absent (written before it was recorded): unknown,
    /// taken as compressed.
    #[serde(default = "unknown_compression")]
    compressed: bool,
}

fn unknown_compression() -> bool {
    true
}

impl IpcEntry {
    fn of(i: &IpcIndex) -> Self {
        IpcEntry {
            stream: i.stream,
            version: i.version,
            batches: i
                .batches
                .iter()
                .map(|m| [m.offset, u64::from(m.meta_len), m.body_len])
                .collect(),
            dicts: i
                .dicts
                .iter()
                .map(|d| {
                    [
                        d.msg.offset as i64,
                        i64::from(d.msg.meta_len),
                        d.msg.body_len as i64,
                        d.id,
                        i64::from(d.delta),
                    ]
                })
                .collect(),
            dicts_before: if i.dicts.is_empty() {
                Vec::new()
            } else {
                i.dicts_before.clone()
            },
            compressed: i.compressed,
        }
    }

    fn index(&self, rows: usize, file: &str) -> Result<IpcIndex> {
        let bad = |what: &str| {
            Error::Config(format!(
                "{file}: bad Arrow IPC entry ({what}): rerun `shardstream index` or delete the file"
            ))
        };
        let msg = |o: u64, m: u64, b: u64| -> Result<Msg> {
            let meta_len = u32::try_from(m).map_err(|_| bad("metadata length"))?;
            o.checked_add(m)
                .and_then(|e| e.checked_add(b))
                .ok_or_else(|| bad("block end"))?;
            Ok(Msg {
                offset: o,
                meta_len,
                body_len: b,
            })
        };
        let batches = self
            .batches
            .iter()
            .map(|&[o, m, b]| msg(o, m, b))
            .collect::<Result<Vec<_>>>()?;
        let dicts = self
            .dicts
            .iter()
            .map(|&[o, m, b, id, delta]| {
                if o < 0 || m < 0 || b < 0 {
                    return Err(bad("negative dictionary block"));
                }
                Ok(DictMsg {
                    msg: msg(o as u64, m as u64, b as u64)?,
                    id,
                    delta: delta != 0,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let dicts_before = if self.dicts_before.is_empty() {
            vec![0; batches.len()]
        } else {
            self.dicts_before.clone()
        };
        if batches.len() != rows
            || dicts_before.len() != batches.len()
            || dicts_before.iter().any(|&n| n as usize > dicts.len())
        {
            return Err(bad("batch counts"));
        }
        Ok(IpcIndex {
            stream: self.stream,
            version: self.version,
            batches,
            dicts,
            dicts_before,
            compressed: self.compressed,
        })
    }
}

/// The format of an entry's shard.
fn format_of(e: &Entry, file: &str) -> Result<Format> {
    Ok(match &e.ipc {
        Some(i) => Format::Ipc(Arc::new(i.index(e.row_groups.len(), file)?)),
        None => Format::Parquet {
            has_offset_index: e.offset_index,
            meta: Default::default(),
        },
    })
}

/// A catalog as JSON: the sidecar's entries for every shard, plus what reopens it without
/// listing anything.
#[derive(Serialize, Deserialize)]
struct Snapshot {
    format: String,
    version: u32,
    root: String,
    remote: bool,
    columns: Vec<String>,
    index: IndexFile,
}

fn hex(bytes: &[u8; 16]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str, what: &str, file: &str) -> Result<[u8; 16]> {
    let bad = || {
        Error::Config(format!(
            "{file}: {what} {s:?} is not 32 hex digits: rerun `shardstream index` or delete the file"
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

/// Parse a sidecar's bytes; `file` names it in errors. A sidecar that exists but can't be
/// parsed is an error (not silently ignored: the user asked for it).
fn parse(text: &[u8], file: &str) -> Result<IndexFile> {
    let index: IndexFile = serde_json::from_slice(text).map_err(|e| {
        Error::Config(format!(
            "{file}: not a valid shardstream index ({e}): rerun `shardstream index` or delete it"
        ))
    })?;
    if index.format != FORMAT || index.version != VERSION {
        return Err(Error::Config(format!(
            "{file}: index format {:?} version {} is not {FORMAT:?} version {VERSION}: rerun \
             `shardstream index`",
            index.format, index.version
        )));
    }
    Ok(index)
}

/// The recorded schemas by digest, each checked against its digest.
fn schemas_of(index: &mut IndexFile, file: &str) -> Result<HashMap<[u8; 16], SchemaRef>> {
    let mut out = HashMap::new();
    for (digest, schema) in std::mem::take(&mut index.schemas) {
        let d = unhex(&digest, "schema digest", file)?;
        if schema_digest(&schema) != d {
            return Err(Error::Config(format!(
                "{file}: the schema recorded for digest {digest} does not match it: rerun \
                 `shardstream index` or delete the file"
            )));
        }
        out.insert(d, Arc::new(schema));
    }
    Ok(out)
}

/// A shard known from an entry: no footer read (it is parsed, and checked, on first use).
/// `file_id`: a local file's device and inode, checked at every open (`None` for objects).
fn entry_shard(
    path: PathBuf,
    rel: String,
    e: &Entry,
    schemas: &HashMap<[u8; 16], SchemaRef>,
    object: Option<Object>,
    file_id: Option<(u64, u64)>,
    file: &str,
) -> Result<Shard> {
    let schema_digest = unhex(&e.schema, "schema digest", file)?;
    let mut shard = indexed_shard(
        path,
        rel,
        e.size,
        e.mtime_ns,
        rows_of(e),
        format_of(e, file)?,
        unhex(&e.footer, "footer digest", file)?,
        schema_digest,
        file_id,
    );
    if let Some(schema) = schemas.get(&schema_digest) {
        shard.schema = schema.clone();
    }
    shard.object = object;
    Ok(shard)
}

/// Entries of the sidecar in `root`, by relative path, and its schemas; `None` if there is none.
type Loaded = (HashMap<String, Entry>, HashMap<[u8; 16], SchemaRef>);

fn load(root: &Path) -> Result<Option<Loaded>> {
    let path = sidecar_path(root);
    let text = match super::read_file_if_exists(&path) {
        Ok(Some(t)) => t,
        Ok(None) => return Ok(None),
        Err(e) => return Err(Error::io(&path, e)),
    };
    let name = path.display().to_string();
    let mut index = parse(&text, &name)?;
    let schemas = schemas_of(&mut index, &name)?;
    Ok(Some((by_path(index), schemas)))
}

fn by_path(index: IndexFile) -> HashMap<String, Entry> {
    index
        .shards
        .into_iter()
        .map(|e| (e.path.clone(), e))
        .collect()
}

/// The shards of `paths` (sorted, absolute) under `root`: from the sidecar where it is current,
/// else by reading footers (concurrently). Every shard has its schema set on return.
pub(crate) fn open_shards(paths: &[PathBuf], root: &Path) -> Result<Vec<Shard>> {
    let Some((mut entries, schemas)) = load(root)? else {
        return read_footers(paths, root);
    };
    let sidecar = sidecar_path(root).display().to_string();
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
            Some((e, id)) => known.push(Some(entry_shard(
                path.clone(),
                rel,
                &e,
                &schemas,
                None,
                Some(id),
                &sidecar,
            )?)),
            None => {
                known.push(None);
                unknown.push(path.clone());
            }
        }
    }
    let read = read_footers(&unknown, root)?;
    merge(known, read)
}

/// Shards known from the sidecar in place, the ones read in between (in order); schemas set.
fn merge(known: Vec<Option<Shard>>, read: Vec<Shard>) -> Result<Vec<Shard>> {
    let mut read = read.into_iter();
    let mut shards: Vec<Shard> = known
        .into_iter()
        .map(|s| s.or_else(|| read.next()))
        .collect::<Option<_>>()
        .ok_or_else(|| Error::Internal("footer count mismatch".into()))?;
    fill_schemas(&mut shards)?;
    Ok(shards)
}

/// The store serving the dataset root and the sidecar's key in it (`None` when the shards
/// span stores, so no single prefix holds them all).
fn remote_sidecar(
    root: &Path,
    stores: &[Arc<Store>],
) -> Option<(Arc<Store>, object_store::path::Path, String)> {
    let url = url::Url::parse(&root.display().to_string()).ok()?;
    let store = stores.iter().find(|s| s.serves(&url))?.clone();
    let dir = store.location(&url).ok()?;
    let key = if dir.as_ref().is_empty() {
        object_store::path::Path::from(INDEX_FILE)
    } else {
        object_store::path::Path::from(format!("{}/{INDEX_FILE}", dir.as_ref()))
    };
    let name = store.url_of(&key);
    Some((store, key, name))
}

/// ETags as stores report them in listings and in headers differ in their quotes.
fn same_etag(a: &Option<String>, b: &Option<String>) -> bool {
    let norm = |e: &str| e.trim_start_matches("W/").trim_matches('"').to_string();
    match (a, b) {
        (Some(a), Some(b)) => norm(a) == norm(b),
        _ => false,
    }
}

/// The shards of resolved URL sources: from the sidecar in the root prefix where an entry's
/// size and ETag match the object's, else from its footer (concurrently). A listing that
/// covered the root already said whether the sidecar exists; otherwise one GET asks.
pub(crate) fn open_remote(set: RemoteSet) -> Result<(PathBuf, Vec<Shard>, Vec<Arc<Store>>)> {
    let RemoteSet {
        root,
        objects,
        stores,
        resolved,
    } = set;
    let text = match remote_sidecar(&root, &stores) {
        None => None,
        Some((store, key, name)) => {
            let seen = resolved
                .iter()
                .any(|r| r.also.iter().any(|o| o.location == key));
            let covered = resolved
                .iter()
                .any(|r| r.listed.as_ref().is_some_and(|p| Store::covers(p, &key)));
            if seen || !covered {
                store.get_whole(&key, &name)?.map(|t| (t, name))
            } else {
                None
            }
        }
    };
    let Some((text, name)) = text else {
        let shards = read_remote_footers(&objects, &stores, &root)?;
        return Ok((root, shards, stores));
    };
    let mut index = parse(&text, &name)?;
    let schemas = schemas_of(&mut index, &name)?;
    let mut entries = by_path(index);
    let mut known: Vec<Option<Shard>> = Vec::with_capacity(objects.len());
    let mut unknown = Vec::new();
    for obj in objects {
        let path = PathBuf::from(obj.url());
        let rel = rel_path(&path, &root);
        match entries.remove(&rel) {
            Some(e) if e.size == obj.size && same_etag(&e.etag, &obj.etag) => known.push(Some(
                entry_shard(path, rel, &e, &schemas, Some(obj), None, &name)?,
            )),
            _ => {
                known.push(None);
                unknown.push(obj);
            }
        }
    }
    let read = read_remote_footers(&unknown, &stores, &root)?;
    Ok((root, merge(known, read)?, stores))
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

/// Every shard of `catalog` as sidecar entries, with every schema.
fn index_of(catalog: &Catalog, with_file_ids: bool) -> IndexFile {
    let mut schemas = BTreeMap::new();
    let shards = catalog
        .shards()
        .iter()
        .map(|s| {
            schemas
                .entry(hex(&s.schema_digest))
                .or_insert_with(|| s.schema.as_ref().clone());
            Entry {
                path: s.rel_path.clone(),
                size: s.size,
                mtime_ns: s.mtime_ns,
                etag: s.object.as_ref().and_then(|o| o.etag.clone()),
                file_id: s.file_id.filter(|_| with_file_ids).map(|(d, i)| [d, i]),
                row_groups: s
                    .row_groups
                    .iter()
                    .map(|r| [r.num_rows, r.byte_offset, r.compressed_bytes])
                    .collect(),
                offset_index: s.has_offset_index(),
                ipc: s.ipc().map(|i| IpcEntry::of(i)),
                footer: hex(&s.footer_digest),
                schema: hex(&s.schema_digest),
            }
        })
        .collect();
    IndexFile {
        format: FORMAT.into(),
        version: VERSION,
        schemas,
        shards,
    }
}

/// Write the sidecar for every shard of `catalog` into its root: a local file (atomically: a
/// temporary file renamed over the old one) or an object beside the shards (one PUT, which
/// replaces it whole). Returns its path or URL.
pub fn write(catalog: &Catalog) -> Result<PathBuf> {
    let data = serde_json::to_vec(&index_of(catalog, false))
        .map_err(|e| Error::Internal(format!("cannot encode the index: {e}")))?;
    if catalog.is_remote() {
        let Some((store, key, name)) = remote_sidecar(catalog.root(), &catalog.stores) else {
            return Err(Error::Config(format!(
                "the shards are in more than one bucket (common root {:?}): a sidecar indexes \
                 the shards below one prefix",
                catalog.root().display().to_string()
            )));
        };
        store.put_whole(&key, data.into(), &name)?;
        return Ok(PathBuf::from(name));
    }
    let path = sidecar_path(catalog.root());
    let tmp = path.with_extension(format!("json.tmp{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(&path, e)
    })?;
    Ok(path)
}

/// `catalog` as JSON (its pickled form): every shard's entry and schema, the root, the output
/// columns. [`from_snapshot`] reopens it without listing, stat-ing or reading a footer.
pub fn snapshot(catalog: &Catalog) -> Result<Vec<u8>> {
    let snap = Snapshot {
        format: SNAPSHOT_FORMAT.into(),
        version: SNAPSHOT_VERSION,
        root: catalog.root().display().to_string(),
        remote: catalog.is_remote(),
        columns: catalog
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect(),
        index: index_of(catalog, true),
    };
    serde_json::to_vec(&snap)
        .map_err(|e| Error::Internal(format!("cannot encode the catalog: {e}")))
}

/// The catalog of a [`snapshot`], with `storage_options` for its stores. Footers are read
/// (and checked against the recorded digests) when first used, so a shard changed since the
/// snapshot is an error naming it, never a different stream.
pub fn from_snapshot(data: &[u8], storage_options: &BTreeMap<String, String>) -> Result<Catalog> {
    const WHAT: &str = "catalog snapshot";
    let snap: Snapshot = serde_json::from_slice(data)
        .map_err(|e| Error::Config(format!("not a shardstream {WHAT}: {e}")))?;
    if snap.format != SNAPSHOT_FORMAT || snap.version != SNAPSHOT_VERSION {
        return Err(Error::Config(format!(
            "{WHAT} format {:?} version {} is not {SNAPSHOT_FORMAT:?} version {SNAPSHOT_VERSION} \
             (made by another shardstream version)",
            snap.format, snap.version
        )));
    }
    let mut index = snap.index;
    let schemas = schemas_of(&mut index, WHAT)?;
    let root = PathBuf::from(&snap.root);
    let mut stores: Vec<Arc<Store>> = Vec::new();
    let mut shards = Vec::with_capacity(index.shards.len());
    for e in &index.shards {
        let (path, object) = if snap.remote {
            let full = if snap.root.is_empty() {
                e.path.clone()
            } else {
                format!("{}/{}", snap.root, e.path)
            };
            let url = url::Url::parse(&full)
                .map_err(|err| Error::Config(format!("{WHAT}: bad URL {full:?}: {err}")))?;
            let store = match stores.iter().find(|s| s.serves(&url)) {
                Some(s) => s.clone(),
                None => {
                    let s = Store::new(&url, storage_options)?;
                    stores.push(s.clone());
                    s
                }
            };
            let object = Object {
                location: store.location(&url)?,
                store,
                size: e.size,
                etag: e.etag.clone(),
            };
            (PathBuf::from(full), Some(object))
        } else {
            (root.join(&e.path), None)
        };
        shards.push(entry_shard(
            path,
            e.path.clone(),
            e,
            &schemas,
            object,
            e.file_id.map(|[d, i]| (d, i)),
            WHAT,
        )?);
    }
    fill_schemas(&mut shards)?;
    Catalog::assemble(root, shards, stores, Some(&snap.columns))
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

    fn ids_of(cat: Catalog) -> Vec<Vec<i64>> {
        let opts = StreamOptions {
            shuffle_buffer: 7,
            epochs: Some(1),
            ..Default::default()
        };
        let mut s = Stream::new(Arc::new(cat), opts, Slot::new(0, 1).unwrap()).unwrap();
        drain_ids(&mut s, 5)
    }

    /// In-place rewrite of a shard's footer bytes keeping its size and mtime (so the size,
    /// mtime and a local ETag all still match the index).
    fn corrupt_footer_keeping_size_and_mtime(path: &str) {
        let meta = std::fs::metadata(path).unwrap();
        let f = std::fs::File::options().write(true).open(path).unwrap();
        use std::os::unix::fs::FileExt;
        let mut b = [0u8; 1];
        std::fs::File::open(path)
            .unwrap()
            .read_exact_at(&mut b, meta.len() - 20)
            .unwrap();
        f.write_all_at(&[b[0] ^ 0x55], meta.len() - 20).unwrap();
        f.set_modified(meta.modified().unwrap()).unwrap();
    }

    /// A bucket (here `file://`, the same code path as s3://): `shardstream index` puts the
    /// sidecar beside the shards; opening then lists and GETs it, and reads no footer; the
    /// catalog, fingerprint and stream equal the footer-reading ones; a stale entry (size or
    /// ETag differs) falls back to the footer; a footer changed behind a matching entry is an
    /// error naming the shard when it is first read.
    #[test]
    fn remote_sidecar_opens_with_one_listing_and_one_get() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_shards(dir.path(), &[30, 0, 17, 25], 6);
        let url = vec![format!("file://{}/", dir.path().display())];
        let none = std::collections::BTreeMap::new();
        let plain = Catalog::open_with(&url, None, &none).unwrap();
        let opened = plain.stats();
        let shards = files.len() as u64;
        assert_eq!(
            opened.requests,
            1 + shards,
            "a listing and one request per footer"
        );
        let fp = plain.fingerprint().clone();
        let side = write(&plain).unwrap();
        assert!(side.display().to_string().starts_with("file:///"));
        assert!(dir.path().join(INDEX_FILE).exists());
        let want = ids_of(plain);

        let indexed = Catalog::open_with(&url, None, &none).unwrap();
        let st = indexed.stats();
        let size = std::fs::metadata(dir.path().join(INDEX_FILE))
            .unwrap()
            .len();
        assert_eq!(
            (st.requests, st.bytes),
            (2, size),
            "one listing + one GET, no footer"
        );
        assert!(
            indexed
                .shards()
                .iter()
                .all(|s| matches!(&s.format, Format::Parquet { meta, .. } if meta.get().is_none())),
            "footers lazy"
        );
        assert_eq!(indexed.fingerprint(), &fp);
        assert_eq!(ids_of(indexed), want);

        // a stale entry: shard 3 replaced by other data (its size or ETag differs)
        let other = tempfile::tempdir().unwrap();
        let fresh = write_shards(other.path(), &[30, 0, 17, 26], 6);
        std::fs::copy(&fresh[3], &files[3]).unwrap();
        let cat = Catalog::open_with(&url, None, &none).unwrap();
        assert_eq!(
            cat.stats().requests,
            3,
            "listing, sidecar, the stale shard's footer"
        );
        assert_ne!(cat.fingerprint(), &fp);
        assert_eq!(ids_of(cat).concat().len(), 30 + 17 + 26);

        // same size and mtime (so the same ETag), other footer bytes: caught at first read
        write(&Catalog::open_with(&url, None, &none).unwrap()).unwrap();
        corrupt_footer_keeping_size_and_mtime(&files[2]);
        let cat = Arc::new(Catalog::open_with(&url, None, &none).unwrap());
        let mut s = Stream::new(cat, StreamOptions::default(), Slot::new(0, 1).unwrap()).unwrap();
        let err = loop {
            match s.next_batch(5) {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("a changed shard was read without error"),
                Err(e) => break e.to_string(),
            }
        };
        assert!(
            err.contains("s002.parquet") && err.contains("footer differs"),
            "{err}"
        );
    }

    /// The pickled form: the same catalog (fingerprint, paths, schema, stream) without
    /// touching the files at open; a shard is opened only when read.
    #[test]
    fn snapshot_reopens_without_reading_anything() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_shards(dir.path(), &[30, 0, 17, 25], 6);
        let cols = ["id".to_string()];
        for columns in [None, Some(&cols[..])] {
            let cat = Catalog::open(&files, columns).unwrap();
            let snap = cat.snapshot().unwrap();
            let copy = Catalog::from_snapshot(&snap, &Default::default()).unwrap();
            assert_eq!(copy.fingerprint(), cat.fingerprint());
            assert_eq!(copy.schema(), cat.schema());
            assert_eq!(copy.root(), cat.root());
            let paths = |c: &Catalog| {
                c.shards()
                    .iter()
                    .map(|s| s.path.clone())
                    .collect::<Vec<_>>()
            };
            assert_eq!(paths(&copy), paths(&cat));
            assert_eq!(ids_of(copy), ids_of(cat));
        }
        // nothing is read at open: a shard removed since still opens, and fails when read
        let snap = Catalog::open(&files, None).unwrap().snapshot().unwrap();
        std::fs::remove_file(&files[3]).unwrap();
        let copy = Catalog::from_snapshot(&snap, &Default::default()).unwrap();
        assert_eq!(copy.total_rows(), 30 + 17 + 25);
        let mut s = Stream::new(
            Arc::new(copy),
            StreamOptions::default(),
            Slot::new(0, 1).unwrap(),
        )
        .unwrap();
        let err = loop {
            match s.next_batch(5) {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("a removed shard was read without error"),
                Err(e) => break e.to_string(),
            }
        };
        assert!(err.contains("s003.parquet"), "{err}");
        assert!(Catalog::from_snapshot(b"{}", &Default::default()).is_err());
    }

    /// An IPC entry keeps whether the shard has compressed buffers; one written before that
    /// was recorded reads as compressed (so its streams keep their readahead threads).
    #[test]
    fn ipc_entry_records_compression() {
        for compressed in [false, true] {
            let index = IpcIndex {
                stream: false,
                version: 4,
                batches: vec![Msg {
                    offset: 8,
                    meta_len: 16,
                    body_len: 8,
                }],
                dicts: vec![],
                dicts_before: vec![0],
                compressed,
            };
            let json = serde_json::to_value(IpcEntry::of(&index)).unwrap();
            let back: IpcEntry = serde_json::from_value(json.clone()).unwrap();
            assert_eq!(back.index(1, "x").unwrap(), index);
            let mut old = json;
            old.as_object_mut().unwrap().remove("compressed");
            let back: IpcEntry = serde_json::from_value(old).unwrap();
            assert!(back.index(1, "x").unwrap().compressed);
        }
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

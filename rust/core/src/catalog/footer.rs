//! Reading footers: local files (concurrently, with the offset index when present) and remote
//! objects (one suffix request each; an Arrow IPC object's batch index through a ranged reader),
//! the raw-footer digest, and the [`Shard`] built from them.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use arrow_schema::{Schema, SchemaRef};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaDataReader};
use sha2::{Digest, Sha256};

use super::compat;
use super::ipc::{self, Sniffed};
use super::schema::schema_digest;
use super::sidecar::INDEX_FILE;
use super::sources::{common_root, hf_cache_skips, refuse_hf_dict, HF_DICT, HF_INFO};
use super::{Format, RowGroupInfo, Shard};
use crate::error::{shard_guard, Error, Result};
use crate::store::{Object, Store};

/// Footers are read concurrently: opening thousands of shards is dominated by per-file latency
/// (open, stat, two reads), not by parsing, so a few threads per core hide it.
const FOOTER_THREADS: usize = 16;

pub(crate) fn read_footers(paths: &[PathBuf], root: &Path) -> Result<Vec<Shard>> {
    let threads = FOOTER_THREADS.min(paths.len()).max(1);
    if threads == 1 {
        return paths
            .iter()
            .map(|p| shard_guard(p, || read_footer(p, root)))
            .collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut slots: Vec<OnceLock<Result<Shard>>> =
        (0..paths.len()).map(|_| OnceLock::new()).collect();
    std::thread::scope(|scope| {
        let (next, slots) = (&next, &slots);
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(move || loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(path) = paths.get(i) else { break };
                    // A panic in the footer parser must name the file, not kill the thread.
                    let r = shard_guard(path, || read_footer(path, root));
                    let failed = r.is_err();
                    let _ = slots[i].set(r);
                    if failed {
                        // Stop the others early: the first error (in path order) is reported.
                        next.store(paths.len(), std::sync::atomic::Ordering::Relaxed);
                        break;
                    }
                })
            })
            .collect();
        for w in workers {
            let _ = w.join();
        }
    });
    let mut out = Vec::with_capacity(paths.len());
    for (i, slot) in slots.iter_mut().enumerate() {
        match slot.take() {
            Some(r) => out.push(r?),
            None => {
                // Not read because an earlier-claimed file failed: find and return that error.
                if let Some(err) = slots[i..]
                    .iter_mut()
                    .find_map(|s| s.take().and_then(|r| r.err()))
                {
                    return Err(err);
                }
                return Err(Error::Internal(format!(
                    "footer of {} was not read",
                    paths[i].display()
                )));
            }
        }
    }
    Ok(out)
}

pub(super) fn load_meta(file: &File, path: &Path) -> Result<ArrowReaderMetadata> {
    // Only the offset index is needed to skip pages on seek; the column index (statistics) is not.
    let options = ArrowReaderOptions::new().with_offset_index_policy(PageIndexPolicy::Optional);
    let bad = |e: parquet::errors::ParquetError| {
        Error::shard(path, format!("not a readable Parquet file: {e}"))
    };
    let size = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let md = match ParquetMetaDataReader::new()
        .with_column_index_policy(PageIndexPolicy::Skip)
        .with_offset_index_policy(PageIndexPolicy::Optional)
        .parse_and_finish(file)
    {
        Ok(md) => md,
        // Files from other writers that Arrow C++ reads: see `compat`.
        Err(e) => compat::parse_lenient(file, size).ok_or_else(|| bad(e))?,
    };
    let md = compat::fix_num_rows(compat::fix_column_chunks(md, Some((file, size)), path)?);
    ArrowReaderMetadata::try_new(Arc::new(md), options).map_err(bad)
}

/// URL sources resolved: the objects (in path order), the dataset root, the stores, and any
/// metadata sidecars the listings saw.
pub(crate) struct RemoteSet {
    pub root: PathBuf,
    pub objects: Vec<Object>,
    pub stores: Vec<Arc<Store>>,
    pub resolved: Vec<crate::store::Resolved>,
}

/// Resolve URL sources to objects (listing prefixes, matching globs). One store per scheme and
/// bucket; the root is the deepest common "directory" of the objects' URLs.
pub(super) fn resolve_remote(
    sources: &[String],
    options: &BTreeMap<String, String>,
) -> Result<RemoteSet> {
    let mut stores: Vec<Arc<Store>> = Vec::new();
    let mut resolved = Vec::new();
    // Keyed by the URL as a path, so objects sort by path components exactly as local files do
    // ("a/x" before "a-b"): a local copy and a bucket copy give the same stream.
    let mut objects: BTreeMap<PathBuf, Object> = BTreeMap::new();
    for src in sources {
        let url =
            url::Url::parse(src).map_err(|e| Error::Config(format!("bad URL {src:?}: {e}")))?;
        let store = match stores.iter().find(|s| s.serves(&url)) {
            Some(s) => s.clone(),
            None => {
                let s = Store::new(&url, options)?;
                stores.push(s.clone());
                s
            }
        };
        let also = [super::sidecar::INDEX_FILE, HF_STATE, HF_INFO, HF_DICT];
        let mut r = store.resolve(&url, src, &also)?;
        skip_hf_caches(&store, &mut r)?;
        for obj in &r.objects {
            objects.insert(PathBuf::from(obj.url()), obj.clone());
        }
        resolved.push(r);
    }
    let urls: Vec<PathBuf> = objects.keys().cloned().collect();
    let root = common_root(&urls);
    let mut objects: Vec<Object> = objects.into_values().collect();
    // One HF `datasets` prefix: its files in state.json's order, as for a local directory.
    if let ([r], [store]) = (&resolved[..], &stores[..]) {
        if let Some(ordered) = hf_state_order(store, r)? {
            objects = ordered;
        }
    }
    Ok(RemoteSet {
        root,
        objects,
        stores,
        resolved,
    })
}

/// What `save_to_disk` names the file listing a dataset's data files in order.
const HF_STATE: &str = "state.json";

/// A listed prefix's HF `load_dataset` cache "directories" without their `.map()`/`.filter()`
/// caches, as a local walk reads them ([`hf_cache_skips`]: told by the names the listing
/// saw). A glob's matches are read as they are, as local ones are.
fn skip_hf_caches(store: &Arc<Store>, r: &mut crate::store::Resolved) -> Result<()> {
    if r.glob || r.listed.is_none() {
        return Ok(());
    }
    let split = |o: &Object| {
        let key = o.location.as_ref();
        match key.rsplit_once('/') {
            Some((dir, name)) => (dir.to_string(), name.to_string()),
            None => (String::new(), key.to_string()),
        }
    };
    // A DatasetDict's prefix: its splits are the next key component below it.
    for dict_dir in r
        .also
        .iter()
        .map(split)
        .filter(|(_, n)| n == HF_DICT)
        .map(|(d, _)| d)
    {
        let below = if dict_dir.is_empty() {
            String::new()
        } else {
            format!("{dict_dir}/")
        };
        let subdirs: BTreeSet<&str> = (r.objects.iter().chain(&r.also))
            .filter_map(|o| o.location.as_ref().strip_prefix(below.as_str()))
            .filter_map(|rest| rest.split_once('/').map(|(d, _)| d))
            .collect();
        let subdirs: Vec<&str> = subdirs.into_iter().collect();
        let url = store.url_of(&object_store::path::Path::from(dict_dir.as_str()));
        refuse_hf_dict(&url, &[HF_DICT], &subdirs)?;
    }
    let info_dirs: BTreeSet<String> = r
        .also
        .iter()
        .map(split)
        .filter(|(_, name)| name == HF_INFO)
        .map(|(dir, _)| dir)
        .collect();
    // The names in each of those directories, in one pass over the listing (not one per
    // directory: a prefix may hold many HF directories and many objects).
    let mut by_dir: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (dir, name) in r.objects.iter().chain(&r.also).map(split) {
        if info_dirs.contains(&dir) {
            by_dir.entry(dir).or_default().push(name);
        }
    }
    let mut drop: BTreeSet<String> = BTreeSet::new();
    for (dir, names) in &by_dir {
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let url = store.url_of(&object_store::path::Path::from(dir.as_str()));
        for name in hf_cache_skips(&url, &refs)?.unwrap_or_default() {
            drop.insert(if dir.is_empty() {
                name.to_string()
            } else {
                format!("{dir}/{name}")
            });
        }
    }
    if drop.is_empty() {
        return Ok(());
    }
    r.objects.retain(|o| !drop.contains(o.location.as_ref()));
    if r.objects.is_empty() {
        let prefix = r
            .listed
            .as_ref()
            .map(|p| store.url_of(p))
            .unwrap_or_default();
        return Err(Error::NotFound {
            path: prefix,
            what: "only HF datasets cache-*.arrow files (.map()/.filter() caches, not a \
                   split's data) under that prefix"
                .into(),
        });
    }
    Ok(())
}

/// The objects of a listed prefix holding an HF `datasets` `state.json` (directly under it),
/// in the order it lists them (one GET); `None` for any other listing.
fn hf_state_order(store: &Arc<Store>, r: &crate::store::Resolved) -> Result<Option<Vec<Object>>> {
    let Some(prefix) = &r.listed else {
        return Ok(None);
    };
    let key = prefix.clone().join(HF_STATE);
    if !r.also.iter().any(|o| o.location == key) {
        return Ok(None);
    }
    let url = store.url_of(&key);
    let Some(text) = store.get_whole(&key, &url)? else {
        return Ok(None);
    };
    let Some(names) = super::sources::hf_state_files(&text, &url)? else {
        return Ok(None);
    };
    if names.is_empty() {
        return Err(Error::NotFound {
            path: store.url_of(prefix),
            what: "state.json lists no data files".into(),
        });
    }
    names
        .iter()
        .map(|name| {
            let at = prefix.clone().join(name.as_str());
            r.objects
                .iter()
                .find(|o| o.location == at)
                .cloned()
                .ok_or_else(|| Error::NotFound {
                    path: store.url_of(&at),
                    what: format!("listed in {url} but missing"),
                })
        })
        .collect::<Result<Vec<Object>>>()
        .map(Some)
}

/// Read the footers of `objects` (all of `stores`),
/// [`FOOTER_CONCURRENCY`](crate::store::FOOTER_CONCURRENCY) at a time, in order.
pub(super) fn read_remote_footers(
    objects: &[Object],
    stores: &[Arc<Store>],
    root: &Path,
) -> Result<Vec<Shard>> {
    let mut shards = Vec::with_capacity(objects.len());
    // Footers are fetched per store (each has its own client), keeping the global order.
    for store in stores {
        let mine: Vec<(usize, Object)> = objects
            .iter()
            .cloned()
            .enumerate()
            .filter(|(_, o)| Arc::ptr_eq(&o.store, store))
            .collect();
        if mine.is_empty() {
            continue;
        }
        let root_for = root.to_path_buf();
        let read = crate::store::run_buffered(
            store,
            mine,
            crate::store::FOOTER_CONCURRENCY,
            move |client, (i, obj)| {
                let root = root_for.clone();
                async move { Ok((i, read_remote_footer(client, obj, &root).await?)) }
            },
        )?;
        shards.extend(read);
    }
    shards.sort_by_key(|(i, _)| *i);
    Ok(shards.into_iter().map(|(_, s)| s).collect())
}

/// One remote footer and its shard.
async fn read_remote_footer(
    client: Arc<dyn object_store::ObjectStore>,
    obj: Object,
    root: &Path,
) -> Result<Shard> {
    let path = PathBuf::from(obj.url());
    let rel = rel_path(&path, root);
    let tail = fetch_tail(&client, &obj).await?;
    // A Parquet file ends in PAR1; anything else may be Arrow IPC (told by its first bytes).
    if !tail.1.ends_with(b"PAR1") {
        if let Some(meta) = remote_ipc_meta(obj.clone(), tail.clone()).await? {
            let mut shard = ipc_shard(&path, rel, obj.size, 0, meta);
            shard.object = Some(obj);
            return Ok(shard);
        }
        if ipc::named_ipc_but_not(&path, &[], &tail.1) {
            return Err(ipc::not_ipc(&path, obj.size));
        }
    }
    let (meta, footer_digest) = parquet_meta(client, obj.clone(), tail).await?;
    shard_from_meta(&path, rel, obj.size, 0, meta, footer_digest, Some(obj))
}

/// The last [`FOOTER_PREFETCH`](crate::store::FOOTER_PREFETCH) bytes of an object (all of a
/// smaller one): a Parquet footer, or an IPC file's footer, in one request.
async fn fetch_tail(
    client: &Arc<dyn object_store::ObjectStore>,
    obj: &Object,
) -> Result<(std::ops::Range<u64>, bytes::Bytes)> {
    if obj.size == 0 {
        let path = PathBuf::from(obj.url());
        if ipc::named_ipc_but_not(&path, &[], &[]) {
            return Err(ipc::not_ipc(&path, 0));
        }
        return Err(Error::shard(
            &path,
            "an empty object (0 bytes): not a Parquet or Arrow IPC file",
        ));
    }
    let range = obj.suffix(crate::store::FOOTER_PREFETCH);
    let tail = crate::store::fetch_ranges(client.clone(), obj.clone(), vec![range.clone()])
        .await?
        .remove(0);
    Ok((range, tail))
}

/// Bytes of an object for the IPC index ([`ipc::read_file`], [`ipc::read_stream`]), which
/// reads the same bytes as it does of a local file: served from fetched chunks, a miss
/// fetching some bytes ahead from there on (a stream's next message headers, so a walk over
/// small batches costs a request per 64 KiB, not per message). The read-ahead adapts: a miss
/// past the end of the last fetch means a body larger than the rest of it was skipped, so the
/// next fetch is smaller (down to 4 KiB: a header, not a body); a miss at its end, larger
/// again. Every fetch goes through the store's retry policy and If-Match on the ETag seen
/// when listing.
struct RemoteAt {
    obj: Object,
    chunks: std::sync::Mutex<Vec<(u64, bytes::Bytes)>>,
    /// (end of the last read-ahead fetch, the read-ahead for the next one)
    ahead: std::sync::Mutex<(u64, u64)>,
}

const IPC_READ_AHEAD: u64 = 64 * 1024;
const IPC_MIN_READ_AHEAD: u64 = 4 * 1024;

impl RemoteAt {
    fn cached(chunks: &[(u64, bytes::Bytes)], r: &std::ops::Range<u64>) -> Option<Vec<u8>> {
        chunks.iter().find_map(|(s, b)| {
            (*s <= r.start && r.end <= s + b.len() as u64)
                .then(|| b[(r.start - s) as usize..(r.end - s) as usize].to_vec())
        })
    }
}

impl ipc::ReadAt for RemoteAt {
    fn read_at(&self, r: std::ops::Range<u64>) -> Result<Vec<u8>> {
        let mut chunks = self.chunks.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = Self::cached(&chunks, &r) {
            return Ok(b);
        }
        // Reads go forward (a walk, a file's blocks in order): what lies before is done with.
        chunks.retain(|(s, b)| s + b.len() as u64 > r.start);
        let mut ahead = self.ahead.lock().unwrap_or_else(|e| e.into_inner());
        let (last_end, size) = *ahead;
        let size = if r.start > last_end {
            (size / 4).max(IPC_MIN_READ_AHEAD)
        } else {
            (size * 4).min(IPC_READ_AHEAD)
        };
        let end = r.end.max(r.start + size).min(self.obj.size).max(r.end);
        let got = self
            .obj
            .fetch(std::iter::once(r.start..end).collect())?
            .remove(0);
        *ahead = (end, size);
        chunks.push((r.start, got));
        Ok(Self::cached(&chunks, &r).expect("just fetched"))
    }

    fn prefetch(&self, ranges: &[std::ops::Range<u64>]) -> Result<()> {
        let mut chunks = self.chunks.lock().unwrap_or_else(|e| e.into_inner());
        let missing: Vec<_> = ranges
            .iter()
            .filter(|r| Self::cached(&chunks, r).is_none() && r.end <= self.obj.size)
            .cloned()
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let got = self.obj.fetch(missing.clone())?;
        chunks.extend(missing.iter().map(|r| r.start).zip(got));
        Ok(())
    }
}

/// The IPC index of an object whose last bytes are `tail`, or `None` if its first bytes say
/// it is not Arrow IPC. A file: its footer (usually in `tail`), then every batch header in
/// one coalesced round of ranged reads; a stream: its message headers walked with read-ahead.
/// Bodies are never fetched. Runs on a blocking thread: the index readers are synchronous.
async fn remote_ipc_meta(
    obj: Object,
    tail: (std::ops::Range<u64>, bytes::Bytes),
) -> Result<Option<ipc::IpcMeta>> {
    let path = PathBuf::from(obj.url());
    let size = obj.size;
    let task = tokio::task::spawn_blocking(move || {
        let src = RemoteAt {
            obj,
            chunks: std::sync::Mutex::new(vec![(tail.0.start, tail.1)]),
            ahead: std::sync::Mutex::new((0, IPC_READ_AHEAD)),
        };
        // A file ends in ARROW1 too (its start is checked with the batch headers' reads).
        let kind = if src
            .chunks
            .lock()
            .expect("new")
            .last()
            .is_some_and(|c| c.1.ends_with(b"ARROW1"))
        {
            Ok(Sniffed::IpcFile)
        } else {
            ipc::sniff_at(&src, size)
        };
        shard_guard(&path, || match kind? {
            Sniffed::Parquet => Ok(None),
            Sniffed::IpcFile => ipc::read_file(&src, &path, size).map(Some),
            Sniffed::IpcStream => ipc::read_stream(&src, &path, size).map(Some),
        })
    });
    task.await
        .map_err(|e| Error::Internal(format!("IPC index task failed: {e}")))?
}

/// One remote footer, parsed, and the digest of its raw bytes: a single suffix request in the
/// common case ([`crate::store`] sizes it to hold footer and offset index), more only when the
/// decoder asks for them.
pub(crate) async fn remote_meta(
    client: Arc<dyn object_store::ObjectStore>,
    obj: Object,
) -> Result<(ArrowReaderMetadata, [u8; 16])> {
    let tail = fetch_tail(&client, &obj).await?;
    parquet_meta(client, obj, tail).await
}

/// [`remote_meta`] from the object's `tail`, already fetched.
async fn parquet_meta(
    client: Arc<dyn object_store::ObjectStore>,
    obj: Object,
    (tail_range, tail): (std::ops::Range<u64>, bytes::Bytes),
) -> Result<(ArrowReaderMetadata, [u8; 16])> {
    use parquet::file::metadata::ParquetMetaDataPushDecoder;
    use parquet::DecodeResult;
    let url = obj.url();
    let path = PathBuf::from(&url);
    if obj.size < 12 {
        return Err(Error::shard(
            &path,
            format!("not a Parquet file: {} bytes long", obj.size),
        ));
    }
    let bad = |e: parquet::errors::ParquetError| {
        Error::shard(&path, format!("not a readable Parquet file: {e}"))
    };
    let mut decoder = shard_guard(&path, || {
        let mut d = ParquetMetaDataPushDecoder::try_new(obj.size)
            .map_err(bad)?
            .with_column_index_policy(PageIndexPolicy::Skip)
            .with_offset_index_policy(PageIndexPolicy::Optional);
        d.push_range(tail_range.clone(), tail.clone())
            .map_err(bad)?;
        Ok(d)
    })?;
    let mut pushed = vec![(tail_range.clone(), tail.clone())];
    let decoded = loop {
        match shard_guard(&path, || decoder.try_decode().map_err(bad)) {
            Ok(DecodeResult::NeedsData(ranges)) => {
                let data =
                    crate::store::fetch_ranges(client.clone(), obj.clone(), ranges.clone()).await?;
                pushed.extend(ranges.iter().cloned().zip(data.iter().cloned()));
                decoder.push_ranges(ranges, data).map_err(bad)?;
            }
            Ok(DecodeResult::Data(md)) => break Ok(md),
            Ok(DecodeResult::Finished) => {
                return Err(Error::shard(
                    &path,
                    "the footer decoder returned no metadata",
                ))
            }
            Err(e) => break Err(e),
        }
    };
    // The raw footer bytes, for the digest (the same bytes a local read hashes).
    let len = u64::from(u32::from_le_bytes(
        tail[tail.len() - 8..tail.len() - 4]
            .try_into()
            .expect("4 bytes"),
    ));
    let footer = (obj.size - 8).checked_sub(len).map(|s| s..obj.size - 8);
    let Some(footer) = footer else {
        return Err(decoded
            .err()
            .unwrap_or_else(|| Error::shard(&path, "footer length exceeds the file size")));
    };
    let bytes = match pushed
        .iter()
        .find(|(r, _)| r.start <= footer.start && footer.end <= r.end)
    {
        Some((r, b)) => b.slice((footer.start - r.start) as usize..(footer.end - r.start) as usize),
        None => crate::store::fetch_ranges(client, obj.clone(), vec![footer])
            .await?
            .remove(0),
    };
    let digest = Sha256::digest(&bytes);
    let mut footer_digest = [0u8; 16];
    footer_digest.copy_from_slice(&digest[..16]);
    // Files from other writers that Arrow C++ reads (see `compat`; remote: without page index).
    let md = match decoded {
        Ok(md) => md,
        Err(e) => shard_guard(&path, || Ok(compat::decode_lenient(&bytes)))?.ok_or(e)?,
    };
    let meta = shard_guard(&path, || {
        let md = compat::fix_num_rows(compat::fix_column_chunks(md, None, &path)?);
        ArrowReaderMetadata::try_new(Arc::new(md), ArrowReaderOptions::new()).map_err(bad)
    })?;
    Ok((meta, footer_digest))
}

pub(crate) fn mtime_ns(meta: &std::fs::Metadata) -> u64 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64)
}

/// (device, inode) of a local file.
pub(crate) fn file_id(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

/// The relative path a shard is known by (fingerprint, sidecar).
pub(crate) fn rel_path(path: &Path, root: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/")
}

/// A shard known from the sidecar: everything but the parsed footer, which is read on first use.
#[allow(clippy::too_many_arguments)]
pub(crate) fn indexed_shard(
    path: PathBuf,
    rel_path: String,
    size: u64,
    mtime_ns: u64,
    row_groups: Vec<RowGroupInfo>,
    format: Format,
    footer_digest: [u8; 16],
    schema_digest: [u8; 16],
    file_id: Option<(u64, u64)>,
) -> Shard {
    Shard {
        path,
        rel_path,
        size,
        num_rows: row_groups.iter().map(|r| r.num_rows).sum(),
        first_row: 0,
        row_groups,
        format,
        footer_digest,
        mtime_ns,
        file_id,
        schema_digest,
        schema: Arc::new(Schema::empty()), // set from its schema group's representative
        object: None,
        roots: Vec::new(),
        reorder: Vec::new(),
    }
}

/// Give every shard its Arrow schema: shards whose footer was not read take it from the first
/// shard of the same schema digest, reading one footer per digest that has none yet.
pub(crate) fn fill_schemas(shards: &mut [Shard]) -> Result<()> {
    let mut known: std::collections::HashMap<[u8; 16], SchemaRef> = Default::default();
    for s in shards.iter() {
        // read from its footer, or given by the sidecar (checked against the digest there)
        let parsed = matches!(&s.format, Format::Parquet { meta, .. } if meta.get().is_some());
        if parsed || !s.schema.fields().is_empty() {
            known
                .entry(s.schema_digest)
                .or_insert_with(|| s.schema.clone());
        }
    }
    for s in shards.iter_mut() {
        let schema = match known.get(&s.schema_digest) {
            Some(schema) => schema.clone(),
            None => {
                let schema = match s.format {
                    Format::Parquet { .. } => s.reader_meta()?.schema().clone(),
                    Format::Ipc(_) => ipc_schema(s)?,
                };
                if schema_digest(&schema) != s.schema_digest {
                    return Err(Error::shard(
                        &s.path,
                        format!(
                            "schema differs from its indexed digest: rerun `shardstream index` or \
                             delete {}",
                            INDEX_FILE
                        ),
                    ));
                }
                known.insert(s.schema_digest, schema.clone());
                schema
            }
        };
        s.schema = schema;
    }
    Ok(())
}

/// The schema of an IPC shard known from an entry without one (read from the file).
fn ipc_schema(s: &Shard) -> Result<SchemaRef> {
    if s.object.is_some() {
        return Err(Error::shard(
            &s.path,
            format!("no schema recorded for this Arrow IPC shard: rerun `shardstream index` or delete {INDEX_FILE}"),
        ));
    }
    let file = super::open_file(&s.path).map_err(|e| Error::io(&s.path, e))?;
    let kind = sniff_file(&file, &s.path, s.size)?;
    Ok(ipc::read_local(&file, &s.path, s.size, kind)?.schema)
}

/// What a local file's first bytes say it is.
pub(crate) fn sniff_file(file: &File, path: &Path, size: u64) -> Result<Sniffed> {
    ipc::sniff_at(&(file, path), size)
}

fn read_footer(path: &Path, root: &Path) -> Result<Shard> {
    let file = super::open_file(path).map_err(|e| Error::io(path, e))?;
    let fs_meta = file.metadata().map_err(|e| Error::io(path, e))?;
    let size = fs_meta.len();
    let kind = sniff_file(&file, path, size)?;
    // Only a file named as IPC is read again (its first bytes): a Parquet shard costs nothing.
    if kind == Sniffed::Parquet && ipc::named_ipc(path) {
        use ipc::ReadAt;
        let head = (&file, path).read_at(0..size.min(4))?;
        if ipc::named_ipc_but_not(path, &head, &[]) {
            return Err(ipc::not_ipc(path, size));
        }
    }
    if kind != Sniffed::Parquet {
        let meta = ipc::read_local(&file, path, size, kind)?;
        let mut shard = ipc_shard(path, rel_path(path, root), size, mtime_ns(&fs_meta), meta);
        shard.file_id = Some(file_id(&fs_meta));
        return Ok(shard);
    }
    let meta = load_meta(&file, path)?;
    let footer_digest = footer_digest(&file, size).map_err(|e| Error::io(path, e))?;
    let mut shard = shard_from_meta(
        path,
        rel_path(path, root),
        size,
        mtime_ns(&fs_meta),
        meta,
        footer_digest,
        None,
    )?;
    shard.file_id = Some(file_id(&fs_meta));
    Ok(shard)
}

/// An IPC shard from its batch index: one unit per record batch.
pub(crate) fn ipc_shard(
    path: &Path,
    rel_path: String,
    size: u64,
    mtime_ns: u64,
    meta: ipc::IpcMeta,
) -> Shard {
    let mut first = 0;
    let row_groups = meta
        .rows
        .iter()
        .zip(&meta.index.batches)
        .map(|(&n, b)| {
            let rg = RowGroupInfo {
                num_rows: n,
                first_row: first,
                byte_offset: b.offset,
                compressed_bytes: b.range().end - b.offset,
            };
            first += n;
            rg
        })
        .collect();
    Shard {
        path: path.to_path_buf(),
        rel_path,
        size,
        num_rows: first,
        first_row: 0,
        row_groups,
        format: Format::Ipc(Arc::new(meta.index)),
        footer_digest: meta.digest,
        mtime_ns,
        file_id: None,
        schema_digest: schema_digest(&meta.schema),
        schema: meta.schema,
        object: None,
        roots: Vec::new(),
        reorder: Vec::new(),
    }
}

/// A shard from its parsed footer: row groups, row counts checked against the footer's total.
fn shard_from_meta(
    path: &Path,
    rel_path: String,
    size: u64,
    mtime_ns: u64,
    meta: ArrowReaderMetadata,
    footer_digest: [u8; 16],
    object: Option<Object>,
) -> Result<Shard> {
    let md = meta.metadata();
    let mut row_groups = Vec::with_capacity(md.num_row_groups());
    let mut rows = 0u64;
    for rg in md.row_groups() {
        let n = u64::try_from(rg.num_rows()).map_err(|_| {
            Error::shard(
                path,
                format!("row group with negative row count {}", rg.num_rows()),
            )
        })?;
        let byte_offset = rg
            .columns()
            .iter()
            .map(|c| {
                // (an offset inside the leading magic means "no dictionary page", see compat)
                c.dictionary_page_offset()
                    .filter(|&d| d >= 4)
                    .unwrap_or(c.data_page_offset())
            })
            .min()
            .unwrap_or(0)
            .max(0) as u64;
        row_groups.push(RowGroupInfo {
            num_rows: n,
            first_row: rows,
            byte_offset,
            compressed_bytes: rg.compressed_size().max(0) as u64,
        });
        rows += n;
    }
    // The footer's own total is not checked against the row groups: some writers leave it 0
    // (old parquet-rs) or wrong, and readers (pyarrow, Spark, arrow-rs) go by the row groups.
    let has_offset_index = md.offset_index().is_some_and(|oi| !oi.is_empty());
    let schema = meta.schema().clone();
    Ok(Shard {
        path: path.to_path_buf(),
        rel_path,
        size,
        num_rows: rows,
        first_row: 0,
        row_groups,
        format: Format::Parquet {
            has_offset_index,
            meta: OnceLock::from(meta),
        },
        footer_digest,
        mtime_ns,
        file_id: None,
        schema_digest: schema_digest(&schema),
        schema,
        object,
        roots: Vec::new(),
        reorder: Vec::new(),
    })
}

/// Digest of the footer bytes (the file's last `8 + footer length` bytes, as Parquet lays out).
pub(super) fn footer_digest(file: &File, size: u64) -> std::io::Result<[u8; 16]> {
    use std::os::unix::fs::FileExt;
    let mut tail = [0u8; 8];
    file.read_exact_at(&mut tail, size.saturating_sub(8))?;
    let len = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    let len = len.min(size.saturating_sub(8));
    let mut footer = vec![0u8; len as usize];
    file.read_exact_at(&mut footer, size - 8 - len)?;
    let d = Sha256::digest(&footer);
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    Ok(out)
}

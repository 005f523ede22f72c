//! The shard catalog: which files make up the dataset, and what their footers say.
//!
//! Opening a catalog resolves the sources (files, directories, globs) to a sorted list of Parquet
//! files, reads every footer once (with the offset index when the file has one: that is what
//! lets a resume skip pages without decoding them), checks that the shards agree on the schema of
//! the requested columns, and computes the fingerprint that a saved state is checked against.
//! Everything later (plan, reader) works from this in-memory metadata and never re-reads a footer.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::ProjectionMask;
use parquet::file::metadata::PageIndexPolicy;
use sha2::{Digest, Sha256};

use crate::error::{shard_guard, Error, Result};
use crate::store::{Object, StatsSnapshot, Store};

/// One row group of one shard.
#[derive(Debug, Clone)]
pub struct RowGroupInfo {
    pub num_rows: u64,
    /// Index of the row group's first row within its shard.
    pub first_row: u64,
    /// Byte offset of the row group's first page in the file (what a seek reads first).
    pub byte_offset: u64,
    pub compressed_bytes: u64,
}

/// One Parquet file.
#[derive(Debug)]
pub struct Shard {
    pub path: PathBuf,
    /// Path relative to the catalog root; what the fingerprint hashes, so a moved dataset still
    /// matches its checkpoints.
    pub rel_path: String,
    pub size: u64,
    pub num_rows: u64,
    /// Global row id of this shard's first row (shards are numbered in path order).
    pub first_row: u64,
    pub row_groups: Vec<RowGroupInfo>,
    pub has_offset_index: bool,
    /// SHA-256 (truncated) of the raw footer bytes: changes with almost any rewrite of the file
    /// (statistics, page offsets and sizes are in it), even one that keeps size and row counts.
    pub footer_digest: [u8; 16],
    /// Modification time (ns since the epoch) when the footer was read: what the metadata
    /// sidecar is checked against (never part of the fingerprint: copies change it).
    pub mtime_ns: u64,
    /// Digest of the file's Arrow schema: shards with equal digests share one projection.
    pub schema_digest: [u8; 16],
    /// The file's Arrow schema (from its footer, or from another shard with the same digest).
    pub(crate) schema: SchemaRef,
    /// Parsed footer: read at open, or on first use for shards known from the sidecar.
    meta: OnceLock<ArrowReaderMetadata>,
    /// Where a remote shard's bytes come from (`None`: a local file at `path`, which then
    /// holds the object's URL).
    pub(crate) object: Option<crate::store::Object>,
    /// Root columns to read, sorted (this file's own column order).
    pub(crate) roots: Vec<usize>,
    /// For each requested column, its position among the projected columns of this file.
    pub(crate) reorder: Vec<usize>,
}

impl Shard {
    /// The parsed footer, read now if the catalog came from the sidecar. A file that no longer
    /// matches what the catalog recorded (size, footer bytes) is an error naming it: reading it
    /// would silently change the stream.
    pub(crate) fn reader_meta(&self) -> Result<&ArrowReaderMetadata> {
        if let Some(m) = self.meta.get() {
            return Ok(m);
        }
        if self.object.is_some() {
            // Remote footers are read when the catalog opens, never lazily.
            return Err(Error::Internal(format!(
                "footer of {} was not read",
                self.path.display()
            )));
        }
        let file = File::open(&self.path).map_err(|e| Error::io(&self.path, e))?;
        let size = file.metadata().map_err(|e| Error::io(&self.path, e))?.len();
        let digest = footer_digest(&file, size).map_err(|e| Error::io(&self.path, e))?;
        if size != self.size || digest != self.footer_digest {
            return Err(Error::shard(
                &self.path,
                format!(
                    "changed since its metadata was indexed (size {} -> {size} bytes or footer \
                     differs): rerun `shardstream index` or delete {}",
                    self.size,
                    crate::index::INDEX_FILE
                ),
            ));
        }
        let meta = shard_guard(&self.path, || load_meta(&file, &self.path))?;
        Ok(self.meta.get_or_init(|| meta))
    }

    /// Projection of the requested columns for this file's footer.
    pub(crate) fn mask(&self, meta: &ArrowReaderMetadata) -> ProjectionMask {
        ProjectionMask::roots(meta.parquet_schema(), self.roots.iter().copied())
    }
}

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

/// The dataset's shards, their footers and the projected output schema.
#[derive(Debug)]
pub struct Catalog {
    shards: Vec<Shard>,
    schema: SchemaRef,
    total_rows: u64,
    root: PathBuf,
    fingerprint: Fingerprint,
    units: OnceLock<Arc<Vec<crate::plan::Unit>>>,
    /// The object stores remote shards come from (empty for local datasets).
    stores: Vec<Arc<Store>>,
}

impl Catalog {
    /// Resolve `sources` and read every footer. `columns = None` selects every column of the
    /// first shard (and then requires every shard to have exactly those columns).
    pub fn open(sources: &[String], columns: Option<&[String]>) -> Result<Self> {
        Self::open_with(sources, columns, &BTreeMap::new())
    }

    /// [`Catalog::open`] where sources may also be URLs (`s3://bucket/prefix/`, globs, single
    /// objects, `file://`), with `storage_options` for their stores (see [`crate::store`]).
    pub fn open_with(
        sources: &[String],
        columns: Option<&[String]>,
        storage_options: &BTreeMap<String, String>,
    ) -> Result<Self> {
        let remote = sources.iter().filter(|s| crate::store::is_url(s)).count();
        let (root, mut shards, stores) = if remote == 0 {
            if !storage_options.is_empty() {
                return Err(Error::Config(
                    "storage_options only apply to URL sources (s3://, gs://, az://, https://, \
                     file://), and every source here is a local path"
                        .into(),
                ));
            }
            let paths = resolve_sources(sources)?;
            let root = common_root(&paths);
            let shards = crate::index::open_shards(&paths, &root)?;
            (root, shards, Vec::new())
        } else if remote == sources.len() {
            open_remote(sources, storage_options)?
        } else {
            return Err(Error::Config(
                "sources mix URLs and local paths: use file:///abs/path URLs for the local ones \
                 (or only local paths)"
                    .into(),
            ));
        };
        let mut first_row = 0u64;
        for shard in &mut shards {
            shard.first_row = first_row;
            first_row += shard.num_rows;
        }
        let schema = project(&mut shards, columns)?;
        let fingerprint = fingerprint(&shards);
        Ok(Catalog {
            shards,
            schema,
            total_rows: first_row,
            root,
            fingerprint,
            units: OnceLock::new(),
            stores,
        })
    }

    /// True when the shards come from object stores.
    pub fn is_remote(&self) -> bool {
        !self.stores.is_empty()
    }

    /// Counters of the object stores, summed (all zero for a local dataset).
    pub fn stats(&self) -> StatsSnapshot {
        let mut total = StatsSnapshot::default();
        for s in &self.stores {
            total += s.stats();
        }
        total
    }

    /// Every non-empty row group in catalog order (computed once).
    pub fn units(&self) -> Arc<Vec<crate::plan::Unit>> {
        self.units.get_or_init(|| crate::plan::units(self)).clone()
    }

    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    pub fn shard(&self, i: usize) -> &Shard {
        &self.shards[i]
    }

    /// Output schema: the requested columns in the requested order.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    pub fn total_rows(&self) -> u64 {
        self.total_rows
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    /// Map a global row id to (shard, row group, row within the row group).
    pub fn locate(&self, row: u64) -> Option<(usize, usize, u64)> {
        if row >= self.total_rows {
            return None;
        }
        let s = self
            .shards
            .partition_point(|sh| sh.first_row + sh.num_rows <= row);
        let shard = &self.shards[s];
        let within = row - shard.first_row;
        let g = shard
            .row_groups
            .partition_point(|rg| rg.first_row + rg.num_rows <= within);
        Some((s, g, within - shard.row_groups[g].first_row))
    }
}

fn has_glob_chars(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// Expand files, directories (every `*.parquet` below, recursively) and globs into a sorted,
/// de-duplicated list of absolute file paths. Anything that names nothing is an error naming it.
pub fn resolve_sources(sources: &[String]) -> Result<Vec<PathBuf>> {
    if sources.is_empty() {
        return Err(Error::Config(
            "no source given: pass a file, directory or glob".into(),
        ));
    }
    let mut out = BTreeSet::new();
    for src in sources {
        let before = out.len();
        if has_glob_chars(src) {
            let entries =
                glob::glob(src).map_err(|e| Error::Config(format!("bad glob {src:?}: {e}")))?;
            for entry in entries {
                let p =
                    entry.map_err(|e| Error::io(e.path(), std::io::Error::other(e.to_string())))?;
                if p.is_dir() {
                    walk_dir(&p, &mut out)?;
                } else {
                    out.insert(absolute(&p)?);
                }
            }
            if out.len() == before {
                return Err(Error::NotFound {
                    path: src.clone(),
                    what: "no files match the glob".into(),
                });
            }
        } else {
            let p = Path::new(src);
            let meta = std::fs::metadata(p).map_err(|e| Error::io(p, e))?;
            if meta.is_dir() {
                walk_dir(p, &mut out)?;
                if out.len() == before {
                    return Err(Error::NotFound {
                        path: src.clone(),
                        what: "no *.parquet files under the directory".into(),
                    });
                }
            } else {
                out.insert(absolute(p)?);
            }
        }
    }
    Ok(out.into_iter().collect())
}

/// Absolute and lexically normalized (`a/./b/../c` -> `a/c`), so two spellings of one file are
/// one shard. Not `canonicalize`: following symlinks would rename shards in the fingerprint.
fn absolute(p: &Path) -> Result<PathBuf> {
    use std::path::Component;
    let abs = std::path::absolute(p).map_err(|e| Error::io(p, e))?;
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Ok(out)
}

fn walk_dir(dir: &Path, out: &mut BTreeSet<PathBuf>) -> Result<()> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    for entry in rd {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let path = entry.path();
        let ft = entry.file_type().map_err(|e| Error::io(&path, e))?;
        if ft.is_dir() || (ft.is_symlink() && path.is_dir()) {
            walk_dir(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "parquet") {
            out.insert(absolute(&path)?);
        }
    }
    Ok(())
}

/// The deepest directory containing every shard.
fn common_root(paths: &[PathBuf]) -> PathBuf {
    let mut root: PathBuf = match paths.first().and_then(|p| p.parent()) {
        Some(p) => p.to_path_buf(),
        None => return PathBuf::new(),
    };
    for p in &paths[1..] {
        while !p.starts_with(&root) {
            if !root.pop() {
                return PathBuf::new();
            }
        }
    }
    root
}

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

fn load_meta(file: &File, path: &Path) -> Result<ArrowReaderMetadata> {
    // Only the offset index is needed to skip pages on seek; the column index (statistics) is not.
    let options = ArrowReaderOptions::new().with_offset_index_policy(PageIndexPolicy::Optional);
    ArrowReaderMetadata::load(file, options)
        .map_err(|e| Error::shard(path, format!("not a readable Parquet file: {e}")))
}

/// Resolve URL sources to objects (listing prefixes, matching globs) and read their footers,
/// [`FOOTER_CONCURRENCY`](crate::store::FOOTER_CONCURRENCY) at a time. One store per scheme and
/// bucket; the root is the deepest common "directory" of the objects' URLs.
fn open_remote(
    sources: &[String],
    options: &BTreeMap<String, String>,
) -> Result<(PathBuf, Vec<Shard>, Vec<Arc<Store>>)> {
    let mut stores: Vec<Arc<Store>> = Vec::new();
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
        for obj in store.resolve(&url, src)? {
            objects.insert(PathBuf::from(obj.url()), obj);
        }
    }
    let urls: Vec<PathBuf> = objects.keys().cloned().collect();
    let root = common_root(&urls);
    let mut shards = Vec::with_capacity(objects.len());
    // Footers are fetched per store (each has its own client), keeping the global order.
    let objects: Vec<Object> = objects.into_values().collect();
    for store in &stores {
        let mine: Vec<(usize, Object)> = objects
            .iter()
            .cloned()
            .enumerate()
            .filter(|(_, o)| Arc::ptr_eq(&o.store, store))
            .collect();
        let root_for = root.clone();
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
    Ok((root, shards.into_iter().map(|(_, s)| s).collect(), stores))
}

/// One remote footer: a single suffix request in the common case ([`crate::store`] sizes it to
/// hold footer and offset index), more only when the decoder asks for them.
async fn read_remote_footer(
    client: Arc<dyn object_store::ObjectStore>,
    obj: Object,
    root: &Path,
) -> Result<Shard> {
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
    let tail_range = obj.suffix(crate::store::FOOTER_PREFETCH);
    let tail = crate::store::fetch_ranges(client.clone(), obj.clone(), vec![tail_range.clone()])
        .await?
        .remove(0);
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
    let md = loop {
        match shard_guard(&path, || decoder.try_decode().map_err(bad))? {
            DecodeResult::NeedsData(ranges) => {
                let data =
                    crate::store::fetch_ranges(client.clone(), obj.clone(), ranges.clone()).await?;
                pushed.extend(ranges.iter().cloned().zip(data.iter().cloned()));
                decoder.push_ranges(ranges, data).map_err(bad)?;
            }
            DecodeResult::Data(md) => break md,
            DecodeResult::Finished => {
                return Err(Error::shard(
                    &path,
                    "the footer decoder returned no metadata",
                ))
            }
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
        return Err(Error::shard(&path, "footer length exceeds the file size"));
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
    let meta = shard_guard(&path, || {
        ArrowReaderMetadata::try_new(Arc::new(md), ArrowReaderOptions::new()).map_err(bad)
    })?;
    let rel = rel_path(&path, root);
    shard_from_meta(&path, rel, obj.size, 0, meta, footer_digest, Some(obj))
}

pub(crate) fn mtime_ns(meta: &std::fs::Metadata) -> u64 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64)
}

pub(crate) fn schema_digest(schema: &Schema) -> [u8; 16] {
    let d = Sha256::digest(format!("{:?}", schema.fields()).as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    out
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
    has_offset_index: bool,
    footer_digest: [u8; 16],
    schema_digest: [u8; 16],
) -> Shard {
    Shard {
        path,
        rel_path,
        size,
        num_rows: row_groups.iter().map(|r| r.num_rows).sum(),
        first_row: 0,
        row_groups,
        has_offset_index,
        footer_digest,
        mtime_ns,
        schema_digest,
        schema: Arc::new(Schema::empty()), // set from its schema group's representative
        meta: OnceLock::new(),
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
        if s.meta.get().is_some() {
            known
                .entry(s.schema_digest)
                .or_insert_with(|| s.schema.clone());
        }
    }
    for s in shards.iter_mut() {
        let schema = match known.get(&s.schema_digest) {
            Some(schema) => schema.clone(),
            None => {
                let schema = s.reader_meta()?.schema().clone();
                if schema_digest(&schema) != s.schema_digest {
                    return Err(Error::shard(
                        &s.path,
                        format!(
                            "schema differs from its indexed digest: rerun `shardstream index` or \
                             delete {}",
                            crate::index::INDEX_FILE
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

fn read_footer(path: &Path, root: &Path) -> Result<Shard> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let fs_meta = file.metadata().map_err(|e| Error::io(path, e))?;
    let size = fs_meta.len();
    let meta = load_meta(&file, path)?;
    let footer_digest = footer_digest(&file, size).map_err(|e| Error::io(path, e))?;
    shard_from_meta(
        path,
        rel_path(path, root),
        size,
        mtime_ns(&fs_meta),
        meta,
        footer_digest,
        None,
    )
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
            .map(|c| c.dictionary_page_offset().unwrap_or(c.data_page_offset()))
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
    let footer_rows = md.file_metadata().num_rows();
    if footer_rows >= 0 && footer_rows as u64 != rows {
        return Err(Error::shard(
            path,
            format!("footer says {footer_rows} rows but its row groups hold {rows}"),
        ));
    }
    let has_offset_index = md.offset_index().is_some_and(|oi| !oi.is_empty());
    let schema = meta.schema().clone();
    Ok(Shard {
        path: path.to_path_buf(),
        rel_path,
        size,
        num_rows: rows,
        first_row: 0,
        row_groups,
        has_offset_index,
        footer_digest,
        mtime_ns,
        schema_digest: schema_digest(&schema),
        schema,
        meta: OnceLock::from(meta),
        object,
        roots: Vec::new(),
        reorder: Vec::new(),
    })
}

/// Check the shards agree on the requested columns and compute each shard's projection.
/// Returns the output schema (requested order; a column is nullable if it is in any shard).
fn project(shards: &mut [Shard], columns: Option<&[String]>) -> Result<SchemaRef> {
    let Some(first) = shards.first() else {
        return Ok(Arc::new(Schema::empty()));
    };
    let first_schema = first.schema.clone();
    let first_path = first.path.display().to_string();
    let names: Vec<String> = match columns {
        Some(cols) => {
            let mut seen = BTreeSet::new();
            for c in cols {
                if !seen.insert(c) {
                    return Err(Error::Schema(format!("column {c:?} requested twice")));
                }
            }
            cols.to_vec()
        }
        None => first_schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect(),
    };
    let mut fields: Vec<Field> = Vec::with_capacity(names.len());
    for name in &names {
        let f = first_schema.field_with_name(name).map_err(|_| {
            Error::Schema(format!(
                "unknown column {name:?}: {first_path} has columns {:?}",
                first_schema
                    .fields()
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
            ))
        })?;
        if let Some(bad) = nul_name(f) {
            return Err(Error::Schema(format!(
                "column {bad:?} in {first_path} has a NUL byte in its name: Arrow's C data \
                 interface (how batches reach Python) cannot carry it; rename the column or \
                 leave it out with columns=[...]"
            )));
        }
        fields.push(f.as_ref().clone().with_metadata(Default::default()));
    }
    for shard in shards.iter_mut() {
        let schema = shard.schema.clone();
        let path = shard.path.display().to_string();
        if columns.is_none() {
            if let Some(extra) = schema.fields().iter().find(|f| !names.contains(f.name())) {
                return Err(Error::Schema(format!(
                    "incompatible shards: column {:?} is in {path} but not in {first_path} \
                     (pass columns=[...] to read only the shared columns)",
                    extra.name()
                )));
            }
        }
        let mut roots = Vec::with_capacity(names.len());
        for (name, field) in names.iter().zip(fields.iter_mut()) {
            let (idx, f) = schema.column_with_name(name).ok_or_else(|| {
                Error::Schema(format!(
                    "incompatible shards: column {name:?} is in {first_path} but missing from {path}"
                ))
            })?;
            if !same_type(f.data_type(), field.data_type()) {
                return Err(Error::Schema(format!(
                    "incompatible shards: column {name:?} is {} in {first_path} but {} in {path}",
                    field.data_type(),
                    f.data_type()
                )));
            }
            if f.is_nullable() && !field.is_nullable() {
                *field = field.clone().with_nullable(true);
            }
            roots.push(idx);
        }
        let mut sorted = roots.clone();
        sorted.sort_unstable();
        shard.reorder = roots
            .iter()
            .map(|r| sorted.binary_search(r).expect("root is in the sorted list"))
            .collect();
        shard.roots = sorted;
    }
    Ok(Arc::new(Schema::new(fields)))
}

/// The first field name (this one or nested) containing a NUL byte.
fn nul_name(f: &Field) -> Option<String> {
    if f.name().contains('\0') {
        return Some(f.name().clone());
    }
    let children: Vec<&Field> = match f.data_type() {
        DataType::List(c)
        | DataType::LargeList(c)
        | DataType::ListView(c)
        | DataType::LargeListView(c)
        | DataType::FixedSizeList(c, _)
        | DataType::Map(c, _) => vec![c.as_ref()],
        DataType::Struct(fs) => fs.iter().map(|c| c.as_ref()).collect(),
        DataType::Union(fs, _) => fs.iter().map(|(_, c)| c.as_ref()).collect(),
        DataType::Dictionary(_, v) => {
            return nul_name(&Field::new("v", v.as_ref().clone(), true));
        }
        DataType::RunEndEncoded(a, b) => vec![a.as_ref(), b.as_ref()],
        _ => vec![],
    };
    children.into_iter().find_map(nul_name)
}

/// Types must match exactly (including nested field names): batches from different shards are
/// gathered into one output batch, which needs one schema.
fn same_type(a: &DataType, b: &DataType) -> bool {
    a == b
}

fn hex16(bytes: &[u8]) -> String {
    bytes[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// Digest of the footer bytes (the file's last `8 + footer length` bytes, as Parquet lays out).
fn footer_digest(file: &File, size: u64) -> std::io::Result<[u8; 16]> {
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

fn fingerprint(shards: &[Shard]) -> Fingerprint {
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

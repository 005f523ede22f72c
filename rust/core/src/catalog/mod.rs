//! The shard catalog: which files make up the dataset, and what their footers say.
//!
//! Opening a catalog resolves the sources (files, directories, globs) to a sorted list of Parquet
//! files, reads every footer once (with the offset index when the file has one: that is what
//! lets a resume skip pages without decoding them), checks that the shards agree on the schema of
//! the requested columns, and computes the fingerprint that a saved state is checked against.
//! Everything later (plan, reader) works from this in-memory metadata and never re-reads a footer.

//! The files are in the child modules, one concern each: [`sources`] (paths, directories,
//! globs), [`footer`] (local and remote footers, digests), [`schema`] (projection and
//! compatibility), [`fingerprint`] (what a saved state is checked against) and [`sidecar`] (the
//! metadata index that opens large sets without reading footers).

mod compat;
mod fingerprint;
mod footer;
pub mod ipc;
mod schema;
pub mod sidecar;
pub(crate) mod sources;
mod validate;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use arrow_schema::SchemaRef;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use parquet::arrow::ProjectionMask;

use crate::error::{shard_guard, Error, Result};
use crate::store::{StatsSnapshot, Store};

pub use fingerprint::{Fingerprint, ShardChanges};
pub(crate) use schema::{conform, type_name};
pub use sources::resolve_sources;

/// Opens a local file of the dataset (a shard, the sidecar, an HF `state.json`) for reading,
/// refusing anything but a regular file: opening a named pipe for reading waits for a writer,
/// forever for a FIFO left among the shards, and a device or socket is not data. The open does
/// not block (`O_NONBLOCK`, which regular files ignore) and the type is checked on the open
/// file, so it cannot change in between. The error is an `InvalidInput` I/O error naming what
/// the file is; the caller adds the path.
pub(crate) fn open_file(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path)?;
    check_regular(file.metadata()?.file_type())?;
    Ok(file)
}

/// `Ok` for a regular file; else the `InvalidInput` error of [`open_file`].
pub(crate) fn check_regular(kind: std::fs::FileType) -> std::io::Result<()> {
    if kind.is_file() {
        return Ok(());
    }
    #[cfg(unix)]
    let what = {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            "a named pipe"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_char_device() {
            "a character device"
        } else if kind.is_block_device() {
            "a block device"
        } else if kind.is_dir() {
            "a directory"
        } else {
            "a special file"
        }
    };
    #[cfg(not(unix))]
    let what = if kind.is_dir() {
        "a directory"
    } else {
        "a special file"
    };
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("{what}, not a regular file: a dataset's files are read as regular files"),
    ))
}

/// [`open_file`] and read it whole; `None` if it does not exist.
pub(crate) fn read_file_if_exists(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let mut file = match open_file(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    file.read_to_end(&mut out)?;
    Ok(Some(out))
}

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

/// What a shard's units are and how they are read: the format-specific part of a [`Shard`].
#[derive(Debug)]
pub enum Format {
    /// Units are non-empty row groups.
    Parquet {
        /// The file has an offset index: a piece can start at a page inside a row group.
        has_offset_index: bool,
        /// Parsed footer: read at open, or on first use for shards known from the sidecar.
        meta: OnceLock<ArrowReaderMetadata>,
    },
    /// Arrow IPC file or stream: units are non-empty record batches.
    Ipc(Arc<ipc::IpcIndex>),
}

/// One shard: a Parquet file or an Arrow IPC file or stream. `row_groups` are its units
/// whatever the format (an IPC record batch is a row group here).
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
    pub format: Format,
    /// SHA-256 (truncated) of the raw footer bytes: changes with almost any rewrite of the file
    /// (statistics, page offsets and sizes are in it), even one that keeps size and row counts.
    /// For an IPC file its footer; for an IPC stream every message's metadata.
    pub footer_digest: [u8; 16],
    /// Modification time (ns since the epoch) when the footer was read: what the metadata
    /// sidecar is checked against (never part of the fingerprint: copies change it).
    pub mtime_ns: u64,
    /// Device and inode of a local shard when the catalog opened it (`None` for remote ones):
    /// with size and mtime, what every later open checks (see [`Shard::check_unchanged`]).
    pub(crate) file_id: Option<(u64, u64)>,
    /// Digest of the file's Arrow schema: shards with equal digests share one projection.
    pub schema_digest: [u8; 16],
    /// The file's Arrow schema (from its footer, or from another shard with the same digest).
    pub(crate) schema: SchemaRef,
    /// Where a remote shard's bytes come from (`None`: a local file at `path`, which then
    /// holds the object's URL).
    pub(crate) object: Option<crate::store::Object>,
    /// Root columns to read, sorted (this file's own column order).
    pub(crate) roots: Vec<usize>,
    /// For each requested column, its position among the projected columns of this file.
    pub(crate) reorder: Vec<usize>,
}

impl Shard {
    /// True for a Parquet shard with an offset index (pieces may start inside a unit).
    pub fn has_offset_index(&self) -> bool {
        matches!(
            self.format,
            Format::Parquet {
                has_offset_index: true,
                ..
            }
        )
    }

    /// The batch index of an IPC shard (`None` for Parquet).
    pub fn ipc(&self) -> Option<&Arc<ipc::IpcIndex>> {
        match &self.format {
            Format::Ipc(index) => Some(index),
            Format::Parquet { .. } => None,
        }
    }

    /// The parsed footer of a Parquet shard, read now if known only from the sidecar.
    fn parquet_meta(&self) -> Result<&OnceLock<ArrowReaderMetadata>> {
        match &self.format {
            Format::Parquet { meta, .. } => Ok(meta),
            Format::Ipc(_) => Err(Error::Internal(format!(
                "{} is an Arrow IPC shard, not Parquet",
                self.path.display()
            ))),
        }
    }

    /// The parsed footer, read now if the catalog came from the sidecar. A file that no longer
    /// matches what the catalog recorded (size, footer bytes) is an error naming it: reading it
    /// would silently change the stream.
    pub(crate) fn reader_meta(&self) -> Result<&ArrowReaderMetadata> {
        let cell = self.parquet_meta()?;
        if let Some(m) = cell.get() {
            return Ok(m);
        }
        let changed = |what: String| {
            Error::shard(
                &self.path,
                format!(
                    "changed since its metadata was indexed or the dataset opened ({what}): \
                     rerun `shardstream index` or delete {}",
                    sidecar::INDEX_FILE
                ),
            )
        };
        if let Some(obj) = &self.object {
            // Fetched with If-Match on the ETag the entry was checked against.
            let o = obj.clone();
            let (meta, digest) = obj
                .store
                .run(move |client| footer::remote_meta(client, o))?;
            if digest != self.footer_digest {
                return Err(changed("footer differs".into()));
            }
            return Ok(cell.get_or_init(|| meta));
        }
        let file = open_file(&self.path).map_err(|e| Error::io(&self.path, e))?;
        let size = file.metadata().map_err(|e| Error::io(&self.path, e))?.len();
        let digest = footer::footer_digest(&file, size).map_err(|e| Error::io(&self.path, e))?;
        if size != self.size || digest != self.footer_digest {
            return Err(changed(format!(
                "size {} -> {size} bytes or footer differs",
                self.size
            )));
        }
        let meta = shard_guard(&self.path, || footer::load_meta(&file, &self.path))?;
        Ok(cell.get_or_init(|| meta))
    }

    /// Fails with an error naming this local shard if `file` (just opened at its path) is not
    /// the file the catalog read: another size, modification time or inode (a file written
    /// elsewhere and renamed over it). Reading on would mix rows of two files in one epoch.
    /// One `fstat` per open; the footer digest is checked only when a footer is read.
    pub(crate) fn check_unchanged(&self, file: &std::fs::File) -> Result<()> {
        if self.file_id.is_none() {
            return Ok(());
        }
        let meta = file.metadata().map_err(|e| Error::io(&self.path, e))?;
        self.check_unchanged_meta(&meta)
    }

    /// [`Shard::check_unchanged`] from the metadata of the file now at its path.
    pub(crate) fn check_unchanged_meta(&self, meta: &std::fs::Metadata) -> Result<()> {
        let Some(id) = self.file_id else {
            return Ok(());
        };
        let (size, mtime) = (meta.len(), footer::mtime_ns(meta));
        let now = footer::file_id(meta);
        if size == self.size && mtime == self.mtime_ns && now == id {
            return Ok(());
        }
        let what = if size != self.size {
            format!("its size went from {} to {size} bytes", self.size)
        } else if now != id {
            "it was replaced by another file".to_string()
        } else {
            "its modification time changed".to_string()
        };
        Err(Error::shard(
            &self.path,
            format!(
                "the file changed while the dataset was open ({what}): its rows may no longer be \
                 the ones this epoch is made of; restart from a state saved before the change, \
                 or open the dataset again"
            ),
        ))
    }

    /// Projection of the requested columns for this file's footer.
    pub(crate) fn mask(&self, meta: &ArrowReaderMetadata) -> ProjectionMask {
        ProjectionMask::roots(meta.parquet_schema(), self.roots.iter().copied())
    }
}

/// The dataset's shards, their footers and the projected output schema.
#[derive(Debug)]
pub struct Catalog {
    shards: Vec<Shard>,
    schema: SchemaRef,
    total_rows: u64,
    root: PathBuf,
    fingerprint: Fingerprint,
    units: OnceLock<Arc<Vec<Unit>>>,
    /// The object stores remote shards come from (empty for local datasets).
    stores: Vec<Arc<Store>>,
    /// Local IPC shards' memory maps, made once per file rather than once per batch.
    maps: ipc::Maps,
    /// Local IPC batches validated once (see [`ipc::Verified`]).
    verified: ipc::Verified,
    /// [`Catalog::row_bytes`], estimated once.
    row_bytes: OnceLock<Option<f64>>,
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
        let (root, shards, stores) = if remote == 0 {
            if !storage_options.is_empty() {
                return Err(Error::Config(
                    "storage_options only apply to URL sources (s3://, gs://, az://, https://, \
                     file://), and every source here is a local path"
                        .into(),
                ));
            }
            let paths = resolve_sources(sources)?;
            let root = sources::common_root(&paths);
            let shards = sidecar::open_shards(&paths, &root)?;
            (root, shards, Vec::new())
        } else if remote == sources.len() {
            sidecar::open_remote(footer::resolve_remote(sources, storage_options)?)?
        } else {
            return Err(Error::Config(
                "sources mix URLs and local paths: use file:///abs/path URLs for the local ones \
                 (or only local paths)"
                    .into(),
            ));
        };
        Self::assemble(root, shards, stores, columns)
    }

    /// The catalog of `shards` (footers read or known from a sidecar, schemas set): row
    /// numbering, projection and fingerprint.
    fn assemble(
        root: PathBuf,
        mut shards: Vec<Shard>,
        stores: Vec<Arc<Store>>,
        columns: Option<&[String]>,
    ) -> Result<Self> {
        let mut first_row = 0u64;
        for shard in &mut shards {
            shard.first_row = first_row;
            first_row += shard.num_rows;
        }
        let schema = schema::project(&mut shards, columns, first_row)?;
        let fingerprint = fingerprint::fingerprint(&shards);
        let verified = ipc::Verified::new(&shards);
        Ok(Catalog {
            shards,
            schema,
            total_rows: first_row,
            root,
            fingerprint,
            units: OnceLock::new(),
            stores,
            maps: ipc::Maps::default(),
            verified,
            row_bytes: OnceLock::new(),
        })
    }

    /// This catalog as JSON, to reopen it elsewhere with [`Catalog::from_snapshot`] (how a
    /// spawned DataLoader worker gets its parent's catalog).
    pub fn snapshot(&self) -> Result<Vec<u8>> {
        sidecar::snapshot(self)
    }

    /// A catalog from [`Catalog::snapshot`]'s JSON: no listing, no stat, no footer read until
    /// a shard is first used (then checked against the recorded digest).
    pub fn from_snapshot(data: &[u8], storage_options: &BTreeMap<String, String>) -> Result<Self> {
        sidecar::from_snapshot(data, storage_options)
    }

    /// True when the shards come from object stores.
    pub fn is_remote(&self) -> bool {
        !self.stores.is_empty()
    }

    /// True when every shard is a local Arrow IPC shard without compressed buffers: decoding a
    /// batch only builds arrays pointing into the mapped file.
    pub fn decodes_in_place(&self) -> bool {
        !self.is_remote()
            && self
                .shards
                .iter()
                .all(|s| s.object.is_none() && s.ipc().is_some_and(|i| !i.compressed))
    }

    /// True when every shard is an Arrow IPC shard.
    pub fn all_ipc(&self) -> bool {
        self.shards.iter().all(|s| s.ipc().is_some())
    }

    /// Estimated decoded (Arrow) bytes per row of the output columns, over the first
    /// [`ROW_BYTES_SAMPLE`] units: from the footers of the Parquet shards whose footer is
    /// already parsed, or else of the first Parquet shard (its footer read now, as its first
    /// read would; not for a remote catalog: `None`, the fallback size); without Parquet
    /// shards, the record batches' body bytes per row (every column; `None` if any shard has
    /// compressed buffers). `None` without a readable footer or rows. Computed
    /// once per catalog; it sizes decoded batches ([`crate::settings::Tuning::batch_rows`]).
    pub fn row_bytes(&self) -> Option<f64> {
        *self.row_bytes.get_or_init(|| {
            let (mut bytes, mut rows) = (0f64, 0u64);
            if self.all_ipc() {
                if self
                    .shards
                    .iter()
                    .any(|s| s.ipc().is_some_and(|i| i.compressed))
                {
                    // A compressed body says nothing of the decoded size (often 3-70x more).
                    return None;
                }
                let units = self.shards.iter().flat_map(|s| {
                    let index = s.ipc().expect("all IPC");
                    (index.batches.iter().zip(&s.row_groups)).map(|(b, g)| (b.body_len, g.num_rows))
                });
                for (b, n) in units.take(ROW_BYTES_SAMPLE) {
                    bytes += b as f64;
                    rows += n;
                }
                return (rows > 0).then(|| bytes / rows as f64);
            }
            let parquet = || self.shards.iter().filter(|s| s.ipc().is_none());
            let mut known = parquet()
                .filter_map(|s| Some((s, s.parquet_meta().ok()?.get()?)))
                .peekable();
            let metas: Vec<(&Shard, &ArrowReaderMetadata)> = if known.peek().is_some() {
                known.collect()
            } else {
                // Remote: a footer read for this alone would be a request that a sidecar's open,
                // or a resume reading one shard, does not otherwise make: fall back instead.
                if self.is_remote() {
                    return None;
                }
                let first = parquet().next()?;
                vec![(first, first.reader_meta().ok()?)]
            };
            let mut left = ROW_BYTES_SAMPLE;
            for (shard, meta) in metas {
                let md = meta.metadata();
                let mask = shard.mask(meta);
                for rg in md.row_groups().iter().take(left) {
                    left -= 1;
                    let n = rg.num_rows().max(0) as u64;
                    rows += n;
                    bytes += (0..rg.num_columns())
                        .filter(|&c| mask.leaf_included(c))
                        .map(|c| decoded_bytes(rg.column(c), n))
                        .sum::<f64>();
                }
                if left == 0 {
                    break;
                }
            }
            (rows > 0).then(|| bytes / rows as f64)
        })
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
    pub fn units(&self) -> Arc<Vec<Unit>> {
        self.units.get_or_init(|| units(self)).clone()
    }

    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    pub fn shard(&self, i: usize) -> &Shard {
        &self.shards[i]
    }

    /// The bytes of local IPC shard `i`, memory-mapped (see [`ipc::Maps`]).
    pub(crate) fn mapped(&self, i: usize) -> Result<arrow_buffer::Buffer> {
        self.maps.get(i, &self.shards[i])
    }

    /// Which local IPC batches were validated (see [`ipc::Verified`]).
    pub(crate) fn verified(&self) -> &ipc::Verified {
        &self.verified
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

/// Row groups [`Catalog::row_bytes`] looks at, at most.
pub const ROW_BYTES_SAMPLE: usize = 64;

/// Estimated Arrow bytes of one column chunk of `rows` rows once decoded: its values at their
/// fixed width (a dictionary-encoded chunk's uncompressed size counts indices, not values: a
/// `list<int32>` of ~300 tokens a row decodes to ~3x its uncompressed pages), byte arrays'
/// unencoded bytes (from the size statistics if the writer kept them) with their offsets,
/// list offsets per repetition level; at least the chunk's uncompressed size.
fn decoded_bytes(c: &parquet::file::metadata::ColumnChunkMetaData, rows: u64) -> f64 {
    use parquet::basic::Type;
    let values = c.num_values().max(0) as f64;
    let uncompressed = c.uncompressed_size().max(0) as f64;
    let data = match c.column_type() {
        Type::BOOLEAN => values / 8.0,
        Type::INT32 | Type::FLOAT => values * 4.0,
        Type::INT64 | Type::DOUBLE => values * 8.0,
        Type::INT96 => values * 12.0,
        Type::FIXED_LEN_BYTE_ARRAY => values * c.column_descr().type_length().max(0) as f64,
        Type::BYTE_ARRAY => {
            let data = c.unencoded_byte_array_data_bytes().map(|b| b.max(0) as f64);
            data.unwrap_or(uncompressed) + values * 4.0
        }
    };
    let lists = rows as f64 * 4.0 * f64::from(c.column_descr().max_rep_level().max(0));
    (data + lists).max(uncompressed)
}

/// A non-empty row group: the unit the epoch order permutes.
#[derive(Debug, Clone, Copy)]
pub struct Unit {
    pub shard: u32,
    pub row_group: u32,
    pub rows: u64,
    /// Global row id of the unit's first row.
    pub first_row: u64,
}

/// All non-empty row groups in catalog order (sorted by `first_row`); see [`Catalog::units`].
fn units(catalog: &Catalog) -> Arc<Vec<Unit>> {
    let mut out = Vec::new();
    for (s, shard) in catalog.shards().iter().enumerate() {
        for (g, rg) in shard.row_groups.iter().enumerate() {
            if rg.num_rows > 0 {
                out.push(Unit {
                    shard: s as u32,
                    row_group: g as u32,
                    rows: rg.num_rows,
                    first_row: shard.first_row + rg.first_row,
                });
            }
        }
    }
    Arc::new(out)
}

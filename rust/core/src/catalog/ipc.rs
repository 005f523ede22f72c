//! Arrow IPC shards: files (`ARROW1`, a footer listing every block) and streams (no footer;
//! what HF `datasets` writes). Each record batch is one unit of the plan, like a Parquet row
//! group. What this module knows and nothing else does: the batch index (where each batch and
//! dictionary message sits, how many rows each batch has), read from a file's footer plus one
//! small read of each batch's header, or by walking a stream's message headers and skipping the
//! bodies; and decoding one batch with the dictionaries in force at it (delta and replacement
//! dictionaries replayed in order).
//!
//! Local files are memory-mapped and decoded in place: uncompressed columns reference the
//! mapping (zero-copy), which the buffers keep alive. Remote objects fetch just the batch's
//! and its dictionaries' byte ranges.

use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::reader::FileDecoder;
use arrow_ipc::{Block, MessageHeader, MetadataVersion};
use arrow_schema::SchemaRef;
use sha2::{Digest, Sha256};

use crate::error::{shard_guard, Error, Result};

const FILE_MAGIC: &[u8; 6] = b"ARROW1";
const CONTINUATION: [u8; 4] = [0xff; 4];
/// Upper bound on one message's metadata: real ones are a few hundred bytes to a few kB per
/// column; anything larger is a corrupt length, refused before allocating for it.
const MAX_METADATA: usize = 64 << 20;

/// What a file's first bytes say it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sniffed {
    Parquet,
    IpcFile,
    IpcStream,
}

/// `PAR1`, `ARROW1`, or a stream's first message (continuation marker); anything else is left
/// to the Parquet reader, whose error names what it expected.
pub(crate) fn sniff(head: &[u8]) -> Sniffed {
    if head.starts_with(FILE_MAGIC) {
        Sniffed::IpcFile
    } else if head.starts_with(&CONTINUATION) {
        Sniffed::IpcStream
    } else {
        Sniffed::Parquet
    }
}

/// One encapsulated message: where it starts, its metadata length (prefix, flatbuffer and
/// padding) and its body length: arrow-ipc's `Block`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Msg {
    pub offset: u64,
    pub meta_len: u32,
    pub body_len: u64,
}

impl Msg {
    fn block(&self) -> Block {
        Block::new(
            self.offset as i64,
            self.meta_len as i32,
            self.body_len as i64,
        )
    }

    pub fn range(&self) -> Range<u64> {
        self.offset..self.offset + u64::from(self.meta_len) + self.body_len
    }
}

/// A dictionary message: its block, the dictionary id it sets, and whether it appends
/// (delta) or replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DictMsg {
    pub msg: Msg,
    pub id: i64,
    pub delta: bool,
}

/// The batch index of one IPC shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpcIndex {
    /// A stream (no footer) rather than a file.
    pub stream: bool,
    /// The metadata version (`MetadataVersion`'s value) every message is checked against.
    pub version: i16,
    /// Record batches in file order: one unit each (`Shard::row_groups` has their row counts).
    pub batches: Vec<Msg>,
    pub dicts: Vec<DictMsg>,
    /// For each batch, how many dictionary messages precede it (all of them in a file).
    pub dicts_before: Vec<u32>,
    /// Some record batch or dictionary message has compressed buffers (or, from a sidecar
    /// written before this was recorded, it is not known). Without any, a local shard's batch
    /// decodes to arrays pointing into the mapped file: no work worth a readahead thread.
    pub compressed: bool,
}

/// What reading an IPC shard's metadata gives: its index, row count per batch, schema and the
/// digest of its metadata (the footer of a file; every message header of a stream).
pub(crate) struct IpcMeta {
    pub index: IpcIndex,
    pub rows: Vec<u64>,
    pub schema: SchemaRef,
    pub digest: [u8; 16],
}

/// Positioned reads of a shard's bytes (a local file or an object).
pub(crate) trait ReadAt {
    fn read_at(&self, range: Range<u64>) -> Result<Vec<u8>>;
    /// `ranges` will be read next: a remote reader fetches them together (coalesced, in
    /// parallel) instead of one request each. A hint; local files ignore it.
    fn prefetch(&self, _ranges: &[Range<u64>]) -> Result<()> {
        Ok(())
    }
}

/// The extensions of [`SHARD_EXTENSIONS`](super::sources::SHARD_EXTENSIONS) that name a file
/// as Arrow IPC (file or stream).
const IPC_EXTENSIONS: [&str; 4] = ["arrow", "feather", "arrows", "ipc"];

/// Is a file that is neither IPC nor Parquet by its bytes (`head`: its first bytes, `tail`:
/// its last ones, either may be empty when not known) but named as Arrow IPC to be reported
/// as such ([`not_ipc`]): the Parquet reader it would otherwise go to would say "not a
/// readable Parquet file", naming a format the file never claimed. A file with Parquet's
/// magic is still read as Parquet, whatever its name.
pub(crate) fn named_ipc_but_not(path: &Path, head: &[u8], tail: &[u8]) -> bool {
    // `PAR1`, or `PARE` (encrypted footer): a Parquet file starts and ends with one of them.
    let parquet = |b: &[u8]| b.starts_with(b"PAR1") || b.starts_with(b"PARE");
    let ends_parquet = tail.ends_with(b"PAR1") || tail.ends_with(b"PARE");
    named_ipc(path) && !parquet(head) && !ends_parquet
}

/// Is `path` named as Arrow IPC (one of [`IPC_EXTENSIONS`])?
pub(crate) fn named_ipc(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| IPC_EXTENSIONS.iter().any(|x| e == *x))
}

/// The error for a file [`named_ipc_but_not`]: an empty one (a writer that died before its
/// first write, a failed copy) is said to be empty.
pub(crate) fn not_ipc(path: &Path, size: u64) -> Error {
    Error::shard(
        path,
        if size == 0 {
            "an empty file (0 bytes): not a readable Arrow IPC file (nothing was written to it)"
                .to_string()
        } else {
            format!(
                "not an Arrow IPC file ({size} bytes): it starts with neither the ARROW1 magic \
                 nor a stream's schema message (nor is it Parquet)"
            )
        },
    )
}

/// What a shard of `size` bytes is, from its first bytes: [`sniff`], plus streams written
/// before format 0.15 (no continuation marker: a 4-byte length, then a schema message), which
/// arrow-ipc still reads. Those are told from other data by parsing that first message.
pub(crate) fn sniff_at(src: &impl ReadAt, size: u64) -> Result<Sniffed> {
    let head = src.read_at(0..size.min(8))?;
    let kind = sniff(&head);
    if kind != Sniffed::Parquet || head.len() < 8 || head.starts_with(b"PAR1") {
        return Ok(kind);
    }
    let len = i32::from_le_bytes(head[..4].try_into().expect("4"));
    if len <= 0 || len as usize > MAX_METADATA || 4 + len as u64 > size {
        return Ok(kind);
    }
    let fb = src.read_at(4..4 + len as u64)?;
    let schema =
        arrow_ipc::root_as_message(&fb).is_ok_and(|m| m.header_type() == MessageHeader::Schema);
    Ok(if schema { Sniffed::IpcStream } else { kind })
}

impl ReadAt for (&File, &Path) {
    fn read_at(&self, range: Range<u64>) -> Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; (range.end - range.start) as usize];
        self.0
            .read_exact_at(&mut buf, range.start)
            .map_err(|e| Error::io(self.1, e))?;
        Ok(buf)
    }
}

fn digest16(h: Sha256) -> [u8; 16] {
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize()[..16]);
    out
}

/// The message whose metadata starts at `offset` (`None`: the end-of-stream marker, or the end
/// of the data at `end`): its block and flatbuffer bytes, every length checked against `end`.
fn message_at(
    src: &impl ReadAt,
    path: &Path,
    offset: u64,
    end: u64,
) -> Result<Option<(Msg, Vec<u8>)>> {
    if offset == end {
        return Ok(None);
    }
    let cut = |what: String| {
        Error::shard(
            path,
            format!("truncated or corrupt Arrow IPC data at byte {offset}: {what}"),
        )
    };
    if end - offset < 4 {
        return Err(cut(format!(
            "{} bytes left, a message needs 8",
            end - offset
        )));
    }
    let head = src.read_at(offset..offset + (end - offset).min(8))?;
    // Since format 0.15 a message starts with 0xFFFFFFFF then its length; before, the length.
    let (prefix, len) = if head[..4] == CONTINUATION {
        if head.len() < 8 {
            return Err(cut("the message length is cut off".into()));
        }
        (8u64, i32::from_le_bytes(head[4..8].try_into().expect("4")))
    } else {
        (4u64, i32::from_le_bytes(head[..4].try_into().expect("4")))
    };
    if len == 0 {
        return Ok(None);
    }
    if len < 0 || len as usize > MAX_METADATA {
        return Err(cut(format!("message metadata length {len}")));
    }
    let meta_end = offset + prefix + len as u64;
    if meta_end > end {
        return Err(cut(format!(
            "message metadata of {len} bytes runs past the end of the data ({end} bytes)"
        )));
    }
    let fb = src.read_at(offset + prefix..meta_end)?;
    let message = arrow_ipc::root_as_message(&fb)
        .map_err(|e| cut(format!("corrupt message metadata ({e})")))?;
    let body = message.bodyLength();
    if body < 0 || meta_end.checked_add(body as u64).is_none_or(|e| e > end) {
        return Err(cut(format!(
            "a message body of {body} bytes runs past the end of the data ({end} bytes)"
        )));
    }
    let msg = Msg {
        offset,
        meta_len: (prefix + len as u64) as u32,
        body_len: body as u64,
    };
    Ok(Some((msg, fb)))
}

/// The message of flatbuffer bytes `fb` returned by [`message_at`], not verified again.
fn verified(fb: &[u8]) -> arrow_ipc::Message<'_> {
    // SAFETY: `message_at` returns only bytes the flatbuffer verifier accepted.
    unsafe { arrow_ipc::root_as_message_unchecked(fb) }
}

/// Whether a record batch or dictionary message declares compressed buffers.
fn compressed(message: arrow_ipc::Message<'_>) -> bool {
    let rb = match message.header_type() {
        MessageHeader::RecordBatch => message.header_as_record_batch(),
        MessageHeader::DictionaryBatch => {
            message.header_as_dictionary_batch().and_then(|d| d.data())
        }
        _ => None,
    };
    rb.is_some_and(|rb| rb.compression().is_some())
}

/// Rows of the record batch whose metadata is `fb` (from [`message_at`]); an error if it is
/// not a record batch.
fn batch_rows(fb: &[u8], path: &Path, at: u64) -> Result<u64> {
    let message = verified(fb);
    let rb = message.header_as_record_batch().ok_or_else(|| {
        Error::shard(
            path,
            format!(
                "Arrow IPC message at byte {at} is a {:?}, expected a record batch",
                message.header_type()
            ),
        )
    })?;
    u64::try_from(rb.length())
        .map_err(|_| Error::shard(path, format!("record batch at byte {at}: negative length")))
}

fn schema_of(message: arrow_ipc::Message<'_>, path: &Path) -> Result<SchemaRef> {
    let fb = message.header_as_schema().ok_or_else(|| {
        Error::shard(
            path,
            format!(
                "an Arrow IPC stream starts with its schema; the first message is a {:?}",
                message.header_type()
            ),
        )
    })?;
    // (fb_to_schema panics on some malformed schemas: a ShardError instead)
    shard_guard(path, || Ok(Arc::new(arrow_ipc::convert::fb_to_schema(fb))))
}

/// Walk a stream's messages: schema, then dictionary and record batch messages, to the
/// end-of-stream marker or the end of the file. Bodies are skipped, never read.
pub(crate) fn read_stream(src: &impl ReadAt, path: &Path, size: u64) -> Result<IpcMeta> {
    let mut h = Sha256::new();
    let Some((first, fb)) = message_at(src, path, 0, size)? else {
        return Err(Error::shard(path, "an Arrow IPC stream with no schema"));
    };
    h.update(&fb);
    let message = verified(&fb);
    let version = message.version().0;
    let schema = schema_of(message, path)?;
    let mut index = IpcIndex {
        stream: true,
        version,
        batches: Vec::new(),
        dicts: Vec::new(),
        dicts_before: Vec::new(),
        compressed: false,
    };
    let mut rows = Vec::new();
    let mut at = first.range().end;
    while let Some((msg, fb)) = message_at(src, path, at, size)? {
        h.update(&fb);
        let message = verified(&fb);
        index.compressed |= compressed(message);
        match message.header_type() {
            MessageHeader::RecordBatch => {
                rows.push(batch_rows(&fb, path, at)?);
                index.batches.push(msg);
                index.dicts_before.push(index.dicts.len() as u32);
            }
            MessageHeader::DictionaryBatch => {
                let d = message.header_as_dictionary_batch().expect("type checked");
                index.dicts.push(DictMsg {
                    msg,
                    id: d.id(),
                    delta: d.isDelta(),
                });
            }
            t => {
                return Err(Error::shard(
                    path,
                    format!("Arrow IPC stream: unexpected {t:?} message at byte {at}"),
                ))
            }
        }
        at = msg.range().end;
    }
    Ok(IpcMeta {
        index,
        rows,
        schema,
        digest: digest16(h),
    })
}

/// A file's footer (schema, dictionary and record batch blocks), then each batch's header for
/// its row count: `2 + batches` small reads.
pub(crate) fn read_file(src: &impl ReadAt, path: &Path, size: u64) -> Result<IpcMeta> {
    let bad = |what: String| Error::shard(path, format!("not a readable Arrow IPC file: {what}"));
    if size < 18 {
        return Err(bad(format!("{size} bytes long")));
    }
    let tail = src.read_at(size - 10..size)?;
    if &tail[4..] != FILE_MAGIC {
        return Err(bad(
            "no ARROW1 magic at the end (truncated, or an IPC stream named like a file)".into(),
        ));
    }
    let len = i32::from_le_bytes(tail[..4].try_into().expect("4"));
    let data_end = size - 10;
    if len <= 0 || len as u64 > data_end - 8 {
        return Err(bad(format!("footer length {len} in a {size}-byte file")));
    }
    let footer_start = data_end - len as u64;
    let fb = src.read_at(footer_start..data_end)?;
    let footer =
        arrow_ipc::root_as_footer(&fb).map_err(|e| bad(format!("corrupt footer ({e})")))?;
    let schema = footer
        .schema()
        .ok_or_else(|| bad("the footer has no schema".into()))?;
    let schema = shard_guard(path, || {
        Ok(Arc::new(arrow_ipc::convert::fb_to_schema(schema)))
    })?;
    let version = footer.version().0;
    // Blocks must lie between the leading magic (8 bytes with padding) and the footer.
    let block = |b: &Block, what: &str| -> Result<Msg> {
        let (o, m, l) = (b.offset(), b.metaDataLength(), b.bodyLength());
        let ok = o >= 8
            && m > 0
            && l >= 0
            && (o as u64)
                .checked_add(m as u64)
                .and_then(|e| e.checked_add(l as u64))
                .is_some_and(|e| e <= footer_start);
        if !ok {
            return Err(bad(format!(
                "{what} block (offset {o}, metadata {m}, body {l} bytes) lies outside the data \
                 ({footer_start} bytes)"
            )));
        }
        Ok(Msg {
            offset: o as u64,
            meta_len: m as u32,
            body_len: l as u64,
        })
    };
    let dict_blocks = footer
        .dictionaries()
        .iter()
        .flatten()
        .map(|b| block(b, "dictionary"))
        .collect::<Result<Vec<_>>>()?;
    let batch_blocks = footer
        .recordBatches()
        .iter()
        .flatten()
        .map(|b| block(b, "record batch"))
        .collect::<Result<Vec<_>>>()?;
    // The leading magic and every message header (never a body) at once: one coalesced
    // round of requests remotely.
    let heads: Vec<Range<u64>> = std::iter::once(0..6)
        .chain(
            dict_blocks
                .iter()
                .chain(&batch_blocks)
                .map(|m| m.offset..m.offset + u64::from(m.meta_len)),
        )
        .collect();
    src.prefetch(&heads)?;
    if src.read_at(0..6)? != FILE_MAGIC {
        return Err(bad("no ARROW1 magic at the start".into()));
    }
    let mut any_compressed = false;
    let mut dicts = Vec::new();
    for msg in dict_blocks {
        let Some((found, mfb)) = message_at(src, path, msg.offset, footer_start)? else {
            return Err(bad(format!("no dictionary message at byte {}", msg.offset)));
        };
        let message = verified(&mfb);
        any_compressed |= compressed(message);
        let d = message.header_as_dictionary_batch().ok_or_else(|| {
            bad(format!(
                "dictionary block at byte {} holds a {:?}",
                msg.offset,
                message.header_type()
            ))
        })?;
        check_block(found, msg, path)?;
        dicts.push(DictMsg {
            msg,
            id: d.id(),
            delta: d.isDelta(),
        });
    }
    let mut batches = Vec::new();
    let mut rows = Vec::new();
    for msg in batch_blocks {
        let Some((found, mfb)) = message_at(src, path, msg.offset, footer_start)? else {
            return Err(bad(format!("no record batch at byte {}", msg.offset)));
        };
        check_block(found, msg, path)?;
        rows.push(batch_rows(&mfb, path, msg.offset)?);
        any_compressed |= compressed(verified(&mfb));
        batches.push(msg);
    }
    let n = dicts.len() as u32;
    Ok(IpcMeta {
        index: IpcIndex {
            stream: false,
            version,
            dicts_before: vec![n; batches.len()],
            batches,
            dicts,
            compressed: any_compressed,
        },
        rows,
        schema,
        digest: digest16(Sha256::new_with_prefix(&fb)),
    })
}

/// The footer's block and the message found at its offset must agree.
fn check_block(found: Msg, block: Msg, path: &Path) -> Result<()> {
    if found.body_len != block.body_len || found.meta_len > block.meta_len {
        return Err(Error::shard(
            path,
            format!(
                "Arrow IPC footer block at byte {} says {} + {} bytes, the message there has {} \
                 + {}",
                block.offset, block.meta_len, block.body_len, found.meta_len, found.body_len
            ),
        ));
    }
    Ok(())
}

/// Read the index of a local IPC shard of kind `kind`.
pub(crate) fn read_local(file: &File, path: &Path, size: u64, kind: Sniffed) -> Result<IpcMeta> {
    let src = (file, path);
    match kind {
        Sniffed::IpcFile => read_file(&src, path, size),
        _ => read_stream(&src, path, size),
    }
}

impl IpcIndex {
    /// The dictionary messages batch `b` needs, in order: per dictionary id, the last
    /// replacement before it and the deltas after that one.
    pub fn dicts_for(&self, b: usize) -> Vec<usize> {
        let upto = self.dicts_before[b] as usize;
        let mut start: std::collections::HashMap<i64, usize> = Default::default();
        for (i, d) in self.dicts[..upto].iter().enumerate() {
            if !d.delta || !start.contains_key(&d.id) {
                start.insert(d.id, i);
            }
        }
        (0..upto)
            .filter(|&i| start.get(&self.dicts[i].id).is_some_and(|&s| i >= s))
            .collect()
    }

    /// The byte ranges batch `b` is decoded from: its dictionaries' messages, then its own.
    pub fn ranges_for(&self, b: usize) -> Vec<Range<u64>> {
        let mut out: Vec<Range<u64>> = self
            .dicts_for(b)
            .into_iter()
            .map(|i| self.dicts[i].msg.range())
            .collect();
        out.push(self.batches[b].range());
        out
    }

    /// Decode batch `b` (columns `roots` of `schema`, the file's own) from `bufs`, the bytes
    /// of [`IpcIndex::ranges_for`] in that order. Buffers are referenced, not copied, where the
    /// data is uncompressed and aligned. Returns the batch and whether it was checked by
    /// [`super::validate::batch`] (a batch without dictionaries), i.e. whether these bytes may
    /// be decoded with `checked = true` later (see [`Verified`]).
    ///
    /// `checked`: these very bytes (same mapping of an unchanged file, same `roots`) were
    /// decoded and validated before; the metadata and the arrays are then taken as valid
    /// without checking them again. Only for batches without dictionaries.
    pub(crate) fn decode(
        &self,
        b: usize,
        schema: &SchemaRef,
        roots: &[usize],
        bufs: &[Buffer],
        path: &Path,
        checked: bool,
    ) -> Result<(RecordBatch, bool)> {
        let dicts = self.dicts_for(b);
        let bad = |e: arrow_schema::ArrowError| {
            Error::shard(path, format!("record batch {b} (Arrow IPC): {e}"))
        };
        if bufs.len() != dicts.len() + 1 {
            return Err(Error::Internal("one buffer per IPC message".into()));
        }
        // Validated by `validate::batch` instead (same checks, cheaper offsets), unless there
        // are dictionaries: arrow-ipc concatenates delta dictionaries as it reads them, so those
        // must be valid before, and arrow-ipc's validation stays on.
        let fast = dicts.is_empty();
        if checked && fast {
            // SAFETY: the caller passes `checked` only for bytes that passed `check_buffers`,
            // the flatbuffer verifier and `validate::batch` before (see `Verified`).
            return unsafe { self.decode_checked(b, schema, roots, &bufs[0]) }
                .map(|batch| (batch, true))
                .map_err(bad);
        }
        let dec = FileDecoder::new(schema.clone(), MetadataVersion(self.version))
            .with_projection(roots.to_vec());
        // SAFETY: nothing reads the batch before `validate::batch` has checked it as arrow-rs's
        // own validation would (decoding only builds the arrays, bounds-checked, from the
        // buffers).
        let mut dec = unsafe { dec.with_skip_validation(fast) };
        check_buffers(&bufs[dicts.len()], self.batches[b], path)?;
        for (buf, &i) in bufs.iter().zip(&dicts) {
            check_buffers(buf, self.dicts[i].msg, path)?;
            dec.read_dictionary(&self.dicts[i].msg.block(), buf)
                .map_err(bad)?;
        }
        let batch = dec
            .read_record_batch(&self.batches[b].block(), &bufs[dicts.len()])
            .map_err(bad)?
            .ok_or_else(|| Error::shard(path, format!("record batch {b}: an empty message")))?;
        if !fast {
            return Ok((batch, false));
        }
        super::validate::batch(batch)
            .map(|batch| (batch, true))
            .map_err(bad)
    }

    /// Batch `b` (no dictionaries) from `buf`, its message's bytes, with neither the flatbuffer
    /// verified nor the arrays validated: what `FileDecoder::read_record_batch` does otherwise.
    ///
    /// # Safety
    /// `buf` must hold bytes that [`IpcIndex::decode`] decoded and validated before with the
    /// same `schema` and `roots`.
    unsafe fn decode_checked(
        &self,
        b: usize,
        schema: &SchemaRef,
        roots: &[usize],
        buf: &Buffer,
    ) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
        let meta = self.batches[b].meta_len as usize;
        let prefix = if buf[..4] == CONTINUATION { 8 } else { 4 };
        // SAFETY: the verifier accepted these bytes when they were first decoded.
        let message = unsafe { arrow_ipc::root_as_message_unchecked(&buf[prefix..meta]) };
        let rb = message.header_as_record_batch().ok_or_else(|| {
            arrow_schema::ArrowError::IpcError("not a record batch message".into())
        })?;
        let no_dicts = Default::default();
        let version = message.version();
        let mut skip = arrow_data::UnsafeFlag::new();
        // SAFETY: the arrays were validated when these bytes were first decoded.
        unsafe { skip.set(true) };
        let all =
            roots.len() == schema.fields().len() && roots.iter().enumerate().all(|(i, &r)| i == r);
        arrow_ipc::reader::RecordBatchDecoder::try_new(
            &buf.slice(meta),
            rb,
            schema.clone(),
            &no_dicts,
            &version,
        )?
        .with_projection((!all).then_some(roots))
        .with_require_alignment(false)
        .with_skip_validation(skip)
        .read_record_batch()
    }
}

/// Which record batches of each local IPC shard have been decoded and validated: one bit per
/// batch, for batches without dictionaries of shards whose file is checked (size, mtime, inode)
/// every time it is mapped. A batch decoded again from the same file then skips the flatbuffer
/// verifier, `check_buffers` and the validation (the second and later epochs of a stream).
/// Safe for the reason zero-copy is: the arrays reference the mapped file's pages, so bytes
/// validated once are the bytes read later unless the file is rewritten in place under the
/// mapping, which breaks the batches already handed out as well (and, when it changes the size
/// or modification time, is an error naming the file at the next batch).
#[derive(Debug, Default)]
pub(crate) struct Verified(Vec<Box<[std::sync::atomic::AtomicU64]>>);

impl Verified {
    pub(crate) fn new(shards: &[crate::catalog::Shard]) -> Self {
        Verified(
            shards
                .iter()
                .map(|s| {
                    let n = match (s.ipc(), &s.object, s.file_id) {
                        (Some(index), None, Some(_)) => index.batches.len().div_ceil(64),
                        _ => 0,
                    };
                    (0..n).map(|_| Default::default()).collect()
                })
                .collect(),
        )
    }

    /// Batch `b` of shard `s` was validated (always false for shards not tracked).
    pub(crate) fn get(&self, s: usize, b: usize) -> bool {
        use std::sync::atomic::Ordering;
        self.0[s]
            .get(b / 64)
            .is_some_and(|w| w.load(Ordering::Relaxed) & (1 << (b % 64)) != 0)
    }

    pub(crate) fn set(&self, s: usize, b: usize) {
        use std::sync::atomic::Ordering;
        if let Some(w) = self.0[s].get(b / 64) {
            w.fetch_or(1 << (b % 64), Ordering::Relaxed);
        }
    }
}

/// Largest decompressed size a compressed buffer may claim, as a multiple of its compressed
/// size (ZSTD's densest block, a run, is ~32k:1; LZ4's is 255:1) and absolutely.
const MAX_RATIO: u64 = 1 << 16;
const MAX_BUFFER: u64 = 1 << 34;

/// Check what the message in `buf` (one [`Msg`]'s bytes) claims before arrow-ipc acts on it:
/// every buffer inside the body, and each compressed buffer's decompressed size plausible.
/// arrow-ipc allocates that size up front, and an impossible one aborts the process.
fn check_buffers(buf: &Buffer, msg: Msg, path: &Path) -> Result<()> {
    let meta = u64::from(msg.meta_len) as usize;
    if buf.len() < meta || buf.len() < 8 {
        return Err(Error::shard(
            path,
            format!("message at byte {}: cut short", msg.offset),
        ));
    }
    let prefix = if buf[..4] == CONTINUATION { 8 } else { 4 };
    let bad = |what: String| {
        Error::shard(
            path,
            format!("corrupt Arrow IPC message at byte {}: {what}", msg.offset),
        )
    };
    let message = arrow_ipc::root_as_message(&buf[prefix..meta])
        .map_err(|e| bad(format!("metadata ({e})")))?;
    let rb = match message.header_type() {
        MessageHeader::RecordBatch => message.header_as_record_batch(),
        MessageHeader::DictionaryBatch => {
            message.header_as_dictionary_batch().and_then(|d| d.data())
        }
        _ => None,
    };
    let Some(rb) = rb else {
        return Ok(()); // arrow-ipc refuses it with its own error
    };
    let body = &buf[meta..];
    let compressed = rb.compression().is_some();
    for b in rb.buffers().iter().flatten() {
        let (off, len) = (b.offset(), b.length());
        let end = off.checked_add(len);
        if off < 0 || len < 0 || end.is_none_or(|e| e as u64 > body.len() as u64) {
            return Err(bad(format!(
                "a buffer at {off} of {len} bytes lies outside the {}-byte body",
                body.len()
            )));
        }
        if !compressed || len < 8 {
            continue;
        }
        let at = off as usize;
        let claimed = i64::from_le_bytes(body[at..at + 8].try_into().expect("8"));
        if claimed == -1 || claimed == 0 {
            continue;
        }
        let limit = (len as u64).saturating_mul(MAX_RATIO).min(MAX_BUFFER);
        if claimed < 0 || claimed as u64 > limit {
            return Err(bad(format!(
                "a {len}-byte compressed buffer claims to hold {claimed} bytes"
            )));
        }
    }
    Ok(())
}

/// How many local IPC files a catalog keeps mapped between batches (a reader works through
/// one shard at a time; read-ahead threads a few more).
const MAPS_KEPT: usize = 16;

/// The memory maps of a catalog's local IPC shards, the last [`MAPS_KEPT`] made: every batch
/// of a shard slices one mapping instead of mapping the file again (an `open`, `fstat`, `mmap`
/// and, once its batches are dropped, `munmap` each). A mapping outlives its slot while any
/// batch references it, and the file pages it touched count in the process's RSS (shared,
/// clean, reclaimable) until then, as with any reader that keeps files mapped. The lock is
/// only tried (a lock held by a thread lost in a fork must not block the child): on
/// contention the file is mapped afresh.
#[derive(Default)]
pub(crate) struct Maps(std::sync::Mutex<std::collections::VecDeque<(usize, Buffer)>>);

impl std::fmt::Debug for Maps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Maps")
    }
}

impl Maps {
    /// The bytes of local shard `s` (`shard`). The file at its path is checked to be the one
    /// the catalog read (one `stat`) on every call, as it was for every fresh mapping.
    pub(crate) fn get(&self, s: usize, shard: &crate::catalog::Shard) -> Result<Buffer> {
        let meta = std::fs::metadata(&shard.path).map_err(|e| Error::io(&shard.path, e))?;
        shard.check_unchanged_meta(&meta)?;
        if let Ok(maps) = self.0.try_lock() {
            if let Some((_, b)) = maps.iter().find(|(i, _)| *i == s) {
                return Ok(b.clone());
            }
        }
        let file = super::open_file(&shard.path).map_err(|e| Error::io(&shard.path, e))?;
        shard.check_unchanged(&file)?;
        let whole = map_file(&file, &shard.path)?;
        if let Ok(mut maps) = self.0.try_lock() {
            if maps.len() >= MAPS_KEPT {
                maps.pop_front();
            }
            maps.push_back((s, whole.clone()));
        }
        Ok(whole)
    }
}

/// A local shard's bytes, memory-mapped: a [`Buffer`] that keeps the mapping alive as long as
/// any array sliced from it.
pub(crate) fn map_file(file: &File, path: &Path) -> Result<Buffer> {
    // SAFETY: the file is opened read-only and was just checked against the catalog's size,
    // mtime and inode (`Shard::check_unchanged`); like every mmap reader (pyarrow's
    // memory_map included) it relies on the file not being truncated while mapped.
    let map = unsafe { memmap2::Mmap::map(file) }.map_err(|e| Error::io(path, e))?;
    let len = map.len();
    if len == 0 {
        return Ok(Buffer::from_vec(Vec::<u8>::new()));
    }
    let ptr = std::ptr::NonNull::new(map.as_ptr() as *mut u8).expect("mmap is non-null");
    // SAFETY: `ptr` points to `len` readable bytes owned by `map`, which the buffer holds.
    Ok(unsafe { Buffer::from_custom_allocation(ptr, len, Arc::new(map)) })
}

/// Slices of `whole` (a mapped file) for `ranges`, each checked to lie inside it.
pub(crate) fn slices(whole: &Buffer, ranges: &[Range<u64>], path: &Path) -> Result<Vec<Buffer>> {
    ranges
        .iter()
        .map(|r| {
            if r.end > whole.len() as u64 {
                return Err(Error::shard(
                    path,
                    format!(
                        "bytes {}..{} lie past the end of the file ({} bytes)",
                        r.start,
                        r.end,
                        whole.len()
                    ),
                ));
            }
            Ok(whole.slice_with_length(r.start as usize, (r.end - r.start) as usize))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::types::Int32Type;
    use arrow_array::{ArrayRef, DictionaryArray, Int64Array, LargeStringArray, ListArray};
    use arrow_ipc::writer::{DictionaryHandling, FileWriter, IpcWriteOptions, StreamWriter};
    use arrow_ipc::CompressionType;
    use proptest::prelude::*;

    /// Batch `b` of `n` rows: ids, token lists, large strings and a dictionary column whose
    /// dictionary grows with `b` (so streams carry delta or replacement dictionaries).
    fn batch(b: i64, n: i64) -> RecordBatch {
        let ids: Vec<i64> = (b * 100..b * 100 + n).collect();
        let tokens = ListArray::from_iter_primitive::<Int32Type, _, _>(
            ids.iter()
                .map(|&x| Some((0..x % 4).map(|k| Some(k as i32)))),
        );
        let text = LargeStringArray::from_iter_values(ids.iter().map(|x| format!("r{x}")));
        let words = arrow_array::StringArray::from_iter_values((0..=b).map(|k| format!("w{k}")));
        let keys =
            arrow_array::Int32Array::from_iter_values(ids.iter().map(|&x| (x % (b + 1)) as i32));
        let dict = DictionaryArray::<Int32Type>::try_new(keys, Arc::new(words)).unwrap();
        RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(ids)) as ArrayRef),
            ("tokens", Arc::new(tokens) as ArrayRef),
            ("text", Arc::new(text) as ArrayRef),
            ("label", Arc::new(dict) as ArrayRef),
        ])
        .unwrap()
    }

    fn options(comp: Option<CompressionType>, delta: bool) -> IpcWriteOptions {
        let o = IpcWriteOptions::default()
            .try_with_compression(comp)
            .unwrap();
        if delta {
            o.with_dictionary_handling(DictionaryHandling::Delta)
        } else {
            o
        }
    }

    fn write(batches: &[RecordBatch], stream: bool, opts: IpcWriteOptions) -> Vec<u8> {
        let schema = batches[0].schema();
        let mut out = Vec::new();
        if stream {
            let mut w = StreamWriter::try_new_with_options(&mut out, &schema, opts).unwrap();
            batches.iter().for_each(|b| w.write(b).unwrap());
            w.finish().unwrap();
        } else {
            let mut w = FileWriter::try_new_with_options(&mut out, &schema, opts).unwrap();
            batches.iter().for_each(|b| w.write(b).unwrap());
            w.finish().unwrap();
        }
        out
    }

    struct Mem(Vec<u8>);
    impl ReadAt for Mem {
        fn read_at(&self, r: Range<u64>) -> Result<Vec<u8>> {
            Ok(self.0[r.start as usize..r.end as usize].to_vec())
        }
    }

    fn index(data: &[u8]) -> Result<IpcMeta> {
        let p = Path::new("mem.arrow");
        let src = Mem(data.to_vec());
        match sniff_at(&src, data.len() as u64)? {
            Sniffed::IpcFile => read_file(&src, p, data.len() as u64),
            Sniffed::IpcStream => read_stream(&src, p, data.len() as u64),
            Sniffed::Parquet => Err(Error::shard(p, "not IPC")),
        }
    }

    fn decode_all(meta: &IpcMeta, data: &[u8], roots: &[usize]) -> Vec<RecordBatch> {
        let whole = Buffer::from_vec(data.to_vec());
        (0..meta.index.batches.len())
            .map(|b| {
                let bufs = slices(&whole, &meta.index.ranges_for(b), Path::new("m")).unwrap();
                let p = Path::new("m");
                let (batch, validated) = meta
                    .index
                    .decode(b, &meta.schema, roots, &bufs, p, false)
                    .unwrap();
                assert_eq!(validated, meta.index.dicts_for(b).is_empty());
                if validated {
                    // the second decode of the same bytes (no verifier, no validation)
                    let again = meta
                        .index
                        .decode(b, &meta.schema, roots, &bufs, p, true)
                        .unwrap();
                    assert_eq!(again, (batch.clone(), true), "batch {b}, roots {roots:?}");
                }
                batch
            })
            .collect()
    }

    /// Files and streams, compressed or not, replacement and delta dictionaries (streams),
    /// written by arrow-rs: the index has every batch's rows, and each batch decodes on its
    /// own (any order) to what was written, whole or projected.
    #[test]
    fn every_batch_decodes_on_its_own() {
        let batches: Vec<RecordBatch> = (0..5)
            .map(|b| batch(b, [3, 0, 7, 1, 4][b as usize]))
            .collect();
        for stream in [false, true] {
            for comp in [
                None,
                Some(CompressionType::LZ4_FRAME),
                Some(CompressionType::ZSTD),
            ] {
                for delta in [false, true] {
                    // the file format cannot replace dictionaries: one dictionary for all
                    let bs: Vec<RecordBatch> = if stream {
                        batches.clone()
                    } else {
                        (0..5)
                            .map(|b| batch(0, [3, 0, 7, 1, 4][b as usize]))
                            .collect()
                    };
                    let data = write(&bs, stream, options(comp, delta));
                    let meta = index(&data).unwrap();
                    assert_eq!(meta.index.stream, stream);
                    assert_eq!(meta.index.compressed, comp.is_some());
                    assert_eq!(meta.rows, vec![3, 0, 7, 1, 4]);
                    let got = decode_all(&meta, &data, &[0, 1, 2, 3]);
                    assert_eq!(got, bs, "stream={stream} comp={comp:?} delta={delta}");
                    let proj = decode_all(&meta, &data, &[0, 3]);
                    for (p, b) in proj.iter().zip(&bs) {
                        assert_eq!(p.column(0), b.column(0));
                        assert_eq!(p.column(1), b.column(3));
                    }
                    if stream && delta {
                        assert!(meta.index.dicts.iter().any(|d| d.delta), "deltas written");
                    }
                    // Without the dictionary column every batch is validated, then decoded
                    // again unverified (`decode_all` compares the two), whole and projected.
                    let plain: Vec<RecordBatch> =
                        bs.iter().map(|b| b.project(&[0, 1, 2]).unwrap()).collect();
                    let data = write(&plain, stream, options(comp, false));
                    let meta = index(&data).unwrap();
                    assert!(meta.index.dicts.is_empty());
                    assert_eq!(decode_all(&meta, &data, &[0, 1, 2]), plain);
                    for (p, b) in decode_all(&meta, &data, &[1]).iter().zip(&plain) {
                        assert_eq!(p.column(0), b.column(1));
                    }
                }
            }
        }
    }

    /// A ranged reader that records what is read and what was announced by `prefetch`.
    struct Recorded {
        data: Vec<u8>,
        reads: std::cell::RefCell<Vec<Range<u64>>>,
        prefetched: std::cell::RefCell<Vec<Range<u64>>>,
    }
    impl ReadAt for Recorded {
        fn read_at(&self, r: Range<u64>) -> Result<Vec<u8>> {
            self.reads.borrow_mut().push(r.clone());
            Ok(self.data[r.start as usize..r.end as usize].to_vec())
        }
        fn prefetch(&self, ranges: &[Range<u64>]) -> Result<()> {
            self.prefetched.borrow_mut().extend_from_slice(ranges);
            Ok(())
        }
    }

    /// The index of a file or a stream (current or pre-0.15 format) over a ranged reader
    /// (what an object store serves) reads no byte of any message body; a file announces its
    /// leading magic and every batch and dictionary header in one prefetch, and every header
    /// read then lies inside it.
    #[test]
    fn the_header_walk_never_reads_a_body() {
        let bs: Vec<RecordBatch> = (0..4).map(|b| batch(b, [6, 0, 9, 3][b as usize])).collect();
        let file_bs: Vec<RecordBatch> = (0..4).map(|b| batch(0, 2 + b)).collect();
        for (stream, legacy) in [(false, false), (true, false), (true, true)] {
            let opts = options(Some(CompressionType::ZSTD), stream);
            let opts = if legacy {
                // (compression needs metadata V5, the legacy format V4)
                IpcWriteOptions::try_new(8, true, MetadataVersion::V4).unwrap()
            } else {
                opts
            };
            let data = write(if stream { &bs } else { &file_bs }, stream, opts);
            assert_eq!(
                legacy,
                data[..4] != CONTINUATION && data[..6] != *FILE_MAGIC
            );
            let src = Recorded {
                data: data.clone(),
                reads: Default::default(),
                prefetched: Default::default(),
            };
            let size = data.len() as u64;
            let kind = sniff_at(&src, size).unwrap();
            let want = if stream {
                Sniffed::IpcStream
            } else {
                Sniffed::IpcFile
            };
            assert_eq!(kind, want, "legacy={legacy}");
            let meta = if stream {
                read_stream(&src, Path::new("m"), size).unwrap()
            } else {
                read_file(&src, Path::new("m"), size).unwrap()
            };
            assert_eq!(
                meta.index,
                index(&data).unwrap().index,
                "same index as in memory"
            );
            let bodies: Vec<Range<u64>> = meta
                .index
                .batches
                .iter()
                .chain(meta.index.dicts.iter().map(|d| &d.msg))
                .map(|m| m.offset + u64::from(m.meta_len)..m.range().end)
                .filter(|b| !b.is_empty())
                .collect();
            assert!(!bodies.is_empty());
            for r in src.reads.borrow().iter() {
                for b in &bodies {
                    assert!(
                        r.end <= b.start || r.start >= b.end,
                        "stream={stream} legacy={legacy}: read {r:?} overlaps body {b:?}"
                    );
                }
            }
            let pre = src.prefetched.borrow();
            if stream {
                assert!(pre.is_empty());
            } else {
                let n = meta.index.batches.len() + meta.index.dicts.len();
                assert_eq!(
                    pre.len(),
                    1 + n,
                    "the magic and every header, announced once"
                );
                let heads = src.reads.borrow();
                let inside =
                    |r: &Range<u64>| pre.iter().any(|p| p.start <= r.start && r.end <= p.end);
                let after_footer = heads.iter().skip_while(|r| r.end < size - 10).skip(2);
                for r in after_footer {
                    assert!(
                        inside(r),
                        "{r:?} read outside the prefetched headers {pre:?}"
                    );
                }
            }
        }
    }

    /// A truncated or non-IPC start is not taken for a pre-0.15 stream.
    #[test]
    fn legacy_detection_needs_a_schema_message() {
        let mem = |d: &[u8]| Mem(d.to_vec());
        let bs = vec![batch(0, 3)];
        let legacy = write(
            &bs,
            true,
            IpcWriteOptions::try_new(8, true, MetadataVersion::V4).unwrap(),
        );
        let n = legacy.len() as u64;
        assert_eq!(sniff_at(&mem(&legacy), n).unwrap(), Sniffed::IpcStream);
        assert_eq!(sniff_at(&mem(&legacy[..40]), 40).unwrap(), Sniffed::Parquet);
        let mut junk = legacy.clone();
        junk[10] ^= 0xff;
        junk[20] ^= 0xff;
        let _ = sniff_at(&mem(&junk), n).unwrap(); // no panic on a damaged flatbuffer
        assert_eq!(
            sniff_at(&mem(b"PAR1\x10\0\0\0"), 8).unwrap(),
            Sniffed::Parquet
        );
        assert_eq!(sniff_at(&mem(b"abc"), 3).unwrap(), Sniffed::Parquet);
    }

    #[test]
    fn sniff_tells_formats_apart() {
        assert_eq!(sniff(b"PAR1...."), Sniffed::Parquet);
        assert_eq!(sniff(b"ARROW1\0\0"), Sniffed::IpcFile);
        assert_eq!(
            sniff(&[0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0]),
            Sniffed::IpcStream
        );
        assert_eq!(sniff(b""), Sniffed::Parquet);
    }

    /// The dictionaries a batch needs: the last replacement of each id and deltas after it.
    #[test]
    fn dicts_for_keeps_the_last_replacement_and_its_deltas() {
        let m = |o| Msg {
            offset: o,
            meta_len: 8,
            body_len: 0,
        };
        let d = |o, id, delta| DictMsg {
            msg: m(o),
            id,
            delta,
        };
        let index = IpcIndex {
            stream: true,
            version: 4,
            batches: vec![m(100), m(200), m(300)],
            dicts: vec![
                d(0, 0, false),
                d(10, 1, false),
                d(20, 0, true),
                d(30, 0, false),
                d(40, 0, true),
            ],
            dicts_before: vec![2, 3, 5],
            compressed: false,
        };
        assert_eq!(index.dicts_for(0), vec![0, 1]);
        assert_eq!(index.dicts_for(1), vec![0, 1, 2]);
        assert_eq!(index.dicts_for(2), vec![1, 3, 4]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Any prefix of a stream or file and any single flipped byte: an error or an index
        /// whose batches decode (or fail) without a panic; a cut stream never yields a batch
        /// beyond the cut.
        #[test]
        fn damaged_data_is_an_error_not_a_panic(
            stream in any::<bool>(),
            cut in 0.0f64..1.0,
            flip in 0usize..100_000,
            bits in 1u8..=255,
        ) {
            let bs: Vec<RecordBatch> = (0..4).map(|b| batch(if stream { b } else { 0 }, 5)).collect();
            let data = write(&bs, stream, options(Some(CompressionType::LZ4_FRAME), stream));
            let n = ((data.len() as f64) * cut) as usize;
            for d in [data[..n].to_vec(), {
                let mut d = data.clone();
                let i = flip % d.len();
                d[i] ^= bits;
                d
            }] {
                let r = std::panic::catch_unwind(|| {
                    if let Ok(meta) = index(&d) {
                        let whole = Buffer::from_vec(d.clone());
                        for b in 0..meta.index.batches.len() {
                            if let Ok(bufs) = slices(&whole, &meta.index.ranges_for(b), Path::new("m")) {
                                let _ = meta.index.decode(b, &meta.schema, &[0, 1, 2, 3], &bufs, Path::new("m"), false);
                            }
                        }
                    }
                });
                // arrow-ipc may panic on some corrupt bodies; the reader runs it under
                // shard_guard, which turns that into a ShardError: only the index must not.
                let _ = r;
                let indexed = std::panic::catch_unwind(|| index(&d).is_ok());
                prop_assert!(indexed.is_ok(), "indexing panicked");
            }
        }
    }
}

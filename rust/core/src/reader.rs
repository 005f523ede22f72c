//! Reading rows: where resume seeks.
//!
//! Every read goes through one row group of one shard with a `RowSelection` (skip `start`, select
//! `len`). With the file's offset index (loaded once in the catalog), only the pages holding
//! selected rows are read and decoded, from the page holding row `start`; without one the row
//! group is streamed and rows before `start` are skipped (page headers still read). Either way no
//! row before the resume point is ever handed to the caller, and the cost of a seek does not grow
//! with the position. Remote shards (object stores), and local ones with an offset index, fetch
//! the selected pages first and decode from memory: see `open_pushed_row_group`. An IPC shard's
//! unit is one record batch (`open_ipc_batch`).

use std::cell::Cell;
use std::fs::File;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use bytes::Bytes;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, RowSelector};

use crate::catalog::{ipc, Catalog, Shard};
use crate::decode;
use crate::error::{shard_guard, Error, Result};
use crate::prefetch::Piece;

/// Rows of the first decoded batch after a (re)start, whatever the batch size: the first
/// output batch then waits for little decoding (as the first piece is cut short for it,
/// `FIRST_PIECE_ROWS` in `stream/input.rs`), though a local piece may be a whole row group and
/// a decoded batch of narrow rows 16k rows. A power of two, so that output batches of a
/// power-of-two size up to it stay slices of one decoded batch.
pub const FIRST_BATCH_ROWS: usize = 1024;

/// Reads one [`Piece`] as record batches in the catalog's output schema.
pub struct SegmentReader {
    catalog: Arc<Catalog>,
    shard: usize,
    row_group: usize,
    inner: Batches,
    /// The buffers the piece's pages were read into, handed back (see [`Spare`]) when the reader
    /// is dropped.
    held: Vec<Bytes>,
    /// Per output column: check its UTF-8 after decoding (see [`utf8_check`]).
    checks: Vec<bool>,
    next_row: u64,
    remaining: u64,
}

impl SegmentReader {
    /// A reader of `piece` in batches of `batch_rows` rows, cut on multiples of `batch_rows`
    /// counted from the start of the piece sequence (where a row group's columns all decode in
    /// [`decode`]; arrow-rs readers cut from the piece's start), except that the sequence's
    /// first batch is at most [`FIRST_BATCH_ROWS`].
    pub fn open(catalog: Arc<Catalog>, piece: &Piece, batch_rows: usize) -> Result<Self> {
        let seg = &piece.seg;
        let selection = vec![
            RowSelector::skip(seg.start as usize),
            RowSelector::select(seg.len as usize),
        ];
        let shard = catalog.shard(seg.shard);
        let batch_rows = batch_rows.max(1);
        let lead = match piece.pos {
            0 => batch_rows.min(FIRST_BATCH_ROWS),
            pos => batch_rows - (pos % batch_rows as u64) as usize,
        };
        let mut held = Vec::new();
        let inner = shard_guard(&shard.path, || {
            open_row_group(
                &catalog,
                seg.shard,
                seg.row_group,
                selection,
                batch_rows,
                &shard.roots,
                &mut held,
            )
            .map(|b| b.with_first_batch(lead))
        });
        let inner = match inner {
            Ok(b) => b,
            Err(e) => {
                Spare::recycle(held);
                return Err(e);
            }
        };
        let checks = utf8_checks(shard)?;
        Ok(SegmentReader {
            shard: seg.shard,
            catalog,
            row_group: seg.row_group,
            inner,
            held,
            checks,
            next_row: seg.first_row,
            remaining: seg.len,
        })
    }

    /// All of the segment's rows were returned: the next `next_batch` is `None`.
    pub fn done(&self) -> bool {
        self.remaining == 0
    }

    /// The next batch and the global row id of its first row; `None` once the segment is done.
    pub fn next_batch(&mut self) -> Result<Option<(u64, RecordBatch)>> {
        if self.remaining == 0 {
            return Ok(None);
        }
        let shard = self.catalog.shard(self.shard);
        let inner = &mut self.inner;
        let next = shard_guard(&shard.path, || Ok(inner.next_batch()))?;
        let (n, columns) = match next {
            Ok(Some(b)) => b,
            Err(e) => {
                return Err(Error::shard(
                    &shard.path,
                    format!("row group {}: {e}", self.row_group),
                ))
            }
            Ok(None) => {
                return Err(Error::shard(
                    &shard.path,
                    format!(
                        "row group {} ended {} rows early",
                        self.row_group, self.remaining
                    ),
                ))
            }
        };
        let n = n as u64;
        if n == 0 || n > self.remaining {
            return Err(Error::shard(
                &shard.path,
                format!(
                    "row group {} returned {n} rows where {} were left",
                    self.row_group, self.remaining
                ),
            ));
        }
        let first = self.next_row;
        self.next_row += n;
        self.remaining -= n;
        let out = to_output(&self.catalog, shard, &self.checks, n as usize, columns)?;
        Ok(Some((first, out)))
    }
}

impl Drop for SegmentReader {
    fn drop(&mut self) {
        // The decoders hold slices of the piece's buffers: gone first, so they can be reused.
        self.inner = Batches::Ipc(Vec::new().into_iter());
        Spare::recycle(std::mem::take(&mut self.held));
    }
}

/// Most bytes of spare read buffer a thread keeps between pieces (a local piece holds at most
/// `prefetch::MAX_PIECE_BYTES` of pages, more only when one segment alone is larger).
const MAX_SPARE_BYTES: usize = 16 << 20;

thread_local! {
    static SPARE: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// The buffer a thread reads its next local piece's pages into: the previous piece's, once
/// nothing holds a slice of it. A new buffer per piece was written on fresh pages, a page fault
/// (and the kernel zeroing the page) per 4 KiB, every piece again: a flat pass without readahead
/// took 5.1k faults before, 0.24k after (docs/benchmarks.md, 2026-12-02 session 9). Per
/// thread, so no lock: a readahead thread's goes when it ends; the caller's thread
/// (`readahead_threads=0`, random access) keeps one, of at most [`MAX_SPARE_BYTES`].
struct Spare;

impl Spare {
    /// An empty buffer of at least `n` bytes' capacity.
    fn take(n: usize) -> Vec<u8> {
        let mut buf = SPARE.with(Cell::take);
        buf.clear();
        if buf.capacity() < n {
            // (not `reserve`: a realloc would copy the old, unused contents)
            buf = Vec::with_capacity(n);
        }
        buf
    }

    /// Keep the largest of `held` that nothing else refers to any more.
    fn recycle(held: Vec<Bytes>) {
        for b in held {
            if let Ok(mut m) = b.try_into_mut() {
                m.clear(); // (so that turning it back into a Vec moves no bytes)
                let v = Vec::from(m);
                if v.capacity() <= MAX_SPARE_BYTES {
                    SPARE.with(|s| {
                        let old = s.take();
                        s.set(if old.capacity() >= v.capacity() {
                            old
                        } else {
                            v
                        });
                    });
                }
            }
        }
    }
}

/// Decoded batches of one unit as (rows, projected columns in the shard's own order), whatever
/// the format.
enum Batches {
    Parquet(Box<decode::Batches>),
    /// Zero-copy slices of one decoded IPC record batch.
    Ipc(std::vec::IntoIter<RecordBatch>),
}

impl Batches {
    fn next_batch(&mut self) -> parquet::errors::Result<Option<(usize, Vec<ArrayRef>)>> {
        match self {
            Batches::Parquet(b) => b.next_batch(),
            Batches::Ipc(it) => Ok(it.next().map(|b| (b.num_rows(), b.columns().to_vec()))),
        }
    }

    /// See [`decode::Batches::with_first_batch`]; an IPC batch is already decoded whole.
    fn with_first_batch(self, rows: usize) -> Self {
        match self {
            Batches::Parquet(b) => Batches::Parquet(Box::new(b.with_first_batch(rows))),
            ipc => ipc,
        }
    }
}

/// `roots`: the file's root columns to decode (sorted; `shard.roots` for every output column).
/// The one place the read path dispatches on the shard's format.
fn open_row_group(
    catalog: &Catalog,
    s: usize,
    row_group: usize,
    selection: Vec<RowSelector>,
    batch_rows: usize,
    roots: &[usize],
    held: &mut Vec<Bytes>,
) -> Result<Batches> {
    let shard = catalog.shard(s);
    if let Some(index) = shard.ipc() {
        let batches = open_ipc_batch(catalog, s, index, row_group, selection, batch_rows, roots)?;
        return Ok(Batches::Ipc(batches));
    }
    Ok(Batches::Parquet(Box::new(open_parquet_row_group(
        shard, row_group, selection, batch_rows, roots, held,
    )?)))
}

/// One IPC record batch: its bytes (a local file memory-mapped once per shard, so
/// uncompressed columns are not copied; an object's ranges fetched), decoded once, then the
/// selection's rows as zero-copy slices of at most `batch_rows`.
fn open_ipc_batch(
    catalog: &Catalog,
    s: usize,
    index: &ipc::IpcIndex,
    b: usize,
    selection: Vec<RowSelector>,
    batch_rows: usize,
    roots: &[usize],
) -> Result<std::vec::IntoIter<RecordBatch>> {
    let shard = catalog.shard(s);
    let ranges = index.ranges_for(b);
    let bufs: Vec<arrow_buffer::Buffer> = match &shard.object {
        Some(obj) => {
            // Dictionaries come first; the store caches them, so the batches after the first
            // that need one do not fetch it again.
            let dicts = ranges[..ranges.len() - 1].to_vec();
            obj.fetch_pages(ranges, &dicts)?
                .into_iter()
                .map(arrow_buffer::Buffer::from)
                .collect()
        }
        None => ipc::slices(&catalog.mapped(s)?, &ranges, &shard.path)?,
    };
    // A batch of a local file decoded and validated before is not checked again (`Verified`).
    let tracked = shard.object.is_none() && roots == shard.roots.as_slice();
    let checked = tracked && catalog.verified().get(s, b);
    let (batch, validated) = index.decode(b, &shard.schema, roots, &bufs, &shard.path, checked)?;
    let rows = batch.num_rows() as u64;
    if rows != shard.row_groups[b].num_rows {
        return Err(Error::shard(
            &shard.path,
            format!(
                "record batch {b} has {rows} rows where the index says {}: the file changed \
                 since it was indexed (rerun `shardstream index` or open the dataset again)",
                shard.row_groups[b].num_rows
            ),
        ));
    }
    if tracked && validated && !checked {
        catalog.verified().set(s, b);
    }
    let step = batch_rows.max(1);
    let mut out = Vec::new();
    let mut at = 0usize;
    for sel in selection {
        if !sel.skip {
            let end = at + sel.row_count;
            let mut i = at;
            while i < end.min(batch.num_rows()) {
                let n = step.min(end - i).min(batch.num_rows() - i);
                // (the whole batch, the usual case, without slicing every column)
                out.push(if n == batch.num_rows() {
                    batch.clone()
                } else {
                    batch.slice(i, n)
                });
                i += n;
            }
        }
        at += sel.row_count;
    }
    Ok(out.into_iter())
}

fn open_parquet_row_group(
    shard: &Shard,
    row_group: usize,
    selection: Vec<RowSelector>,
    batch_rows: usize,
    roots: &[usize],
    held: &mut Vec<Bytes>,
) -> Result<decode::Batches> {
    let meta = shard.reader_meta()?;
    if let Some(obj) = &shard.object {
        return open_pushed_row_group(
            shard,
            meta,
            row_group,
            selection,
            batch_rows,
            roots,
            |r, d| obj.fetch_pages(r, d),
        );
    }
    let file = crate::catalog::open_file(&shard.path).map_err(|e| Error::io(&shard.path, e))?;
    shard.check_unchanged(&file)?;
    if shard.has_offset_index() {
        // Pieces are small and cut on page boundaries (prefetch.rs), so reading their pages up
        // front costs little memory, and decoding from memory was ~1.3x faster than the
        // page-at-a-time file reader in the iteration benchmark (README, "Measured figures").
        return open_pushed_row_group(
            shard,
            meta,
            row_group,
            selection,
            batch_rows,
            roots,
            |r, _| read_ranges(&file, &shard.path, r, held),
        );
    }
    // Without an offset index a piece is a whole row group: stream it page by page instead.
    decode::open_local_row_group(meta, row_group, roots, selection, batch_rows, file, |e| {
        Error::shard(&shard.path, format!("row group {row_group}: {e}"))
    })
}

/// `ranges` of a local file, read one after the other into one buffer ([`Spare`]; kept in
/// `held` too, to be handed back). The file was opened for this piece alone, so its position is
/// ours to move; `read_to_end` into reserved capacity skips zero-filling the buffer first.
fn read_ranges(
    mut file: &File,
    path: &std::path::Path,
    ranges: Vec<std::ops::Range<u64>>,
    held: &mut Vec<Bytes>,
) -> Result<Vec<Bytes>> {
    use std::io::{Read, Seek, SeekFrom};
    let total = ranges.iter().map(|r| (r.end - r.start) as usize).sum();
    let mut buf = Spare::take(total);
    let mut parts = Vec::with_capacity(ranges.len());
    for r in ranges {
        let n = (r.end - r.start) as usize;
        let at = buf.len();
        file.seek(SeekFrom::Start(r.start))
            .and_then(|_| file.take(n as u64).read_to_end(&mut buf))
            .map_err(|e| Error::io(path, e))?;
        if buf.len() - at != n {
            return Err(Error::shard(
                path,
                format!("file ended inside bytes {}..{}", r.start, r.end),
            ));
        }
        parts.push(at..at + n);
    }
    let all = Bytes::from(buf);
    let out = parts.into_iter().map(|p| all.slice(p)).collect();
    held.push(all);
    Ok(out)
}

/// The read from memory (every remote shard, local shards with an offset index): the pages
/// holding selected rows (with an offset index, just those, plus dictionary pages) are named up
/// front, `fetch` gets them (for an object store: coalesced, in parallel, dictionary pages
/// cached), then flat and list-of-primitive columns decode in `decode`, the rest in arrow-rs.
fn open_pushed_row_group(
    shard: &Shard,
    meta: &ArrowReaderMetadata,
    row_group: usize,
    selection: Vec<RowSelector>,
    batch_rows: usize,
    roots: &[usize],
    fetch: impl FnMut(Vec<std::ops::Range<u64>>, &[std::ops::Range<u64>]) -> Result<Vec<bytes::Bytes>>,
) -> Result<decode::Batches> {
    let bad = |e: parquet::errors::ParquetError| {
        Error::shard(&shard.path, format!("row group {row_group}: {e}"))
    };
    decode::open_row_group(
        meta, row_group, roots, selection, batch_rows, shard.size, fetch, bad,
    )
}

/// Whether root column `root` of `shard` needs its UTF-8 checked after decoding. arrow-rs checks
/// Parquet STRING columns itself but not e.g. JSON ones (also read as utf8): invalid bytes would
/// reach Python as a broken array. Decided from the footer, so the common case costs nothing per
/// batch. arrow-ipc validates what it decodes (UTF-8 included).
fn utf8_check(shard: &Shard, root: usize) -> Result<bool> {
    if shard.ipc().is_some() {
        return Ok(false);
    }
    Ok(decode::needs_utf8_check(shard.reader_meta()?, root))
}

/// [`utf8_check`] per output column of `shard`.
fn utf8_checks(shard: &Shard) -> Result<Vec<bool>> {
    shard
        .reorder
        .iter()
        .map(|&i| utf8_check(shard, shard.roots[i]))
        .collect()
}

/// One decoded column as output column `field`: string data checked if `check`, cast to the
/// output schema's type where this shard's type differs (see [`to_output`]).
fn output_column(
    shard: &Shard,
    field: &arrow_schema::Field,
    col: &ArrayRef,
    check: bool,
) -> Result<ArrayRef> {
    if check {
        col.to_data().validate_full().map_err(|e| {
            Error::shard(
                &shard.path,
                format!("column {:?}: invalid string data: {e}", field.name()),
            )
        })?;
    }
    if col.data_type() == field.data_type() {
        return Ok(col.clone());
    }
    crate::catalog::conform(col, field.data_type()).map_err(|e| {
        Error::shard(
            &shard.path,
            format!(
                "column {:?}: cannot read as {}: {e}",
                field.name(),
                crate::catalog::type_name(field.data_type())
            ),
        )
    })
}

/// Reorder a file's projected columns into the requested order, each cast to the output
/// schema's type where this shard's type differs (see `catalog::schema`: a `null` column, other
/// list child names or nullability, narrower dictionary keys, another time zone name).
fn to_output(
    catalog: &Catalog,
    shard: &Shard,
    checks: &[bool],
    rows: usize,
    columns: Vec<ArrayRef>,
) -> Result<RecordBatch> {
    let mut cols = Vec::with_capacity(shard.reorder.len());
    for ((&i, field), &check) in shard
        .reorder
        .iter()
        .zip(catalog.schema().fields())
        .zip(checks)
    {
        cols.push(output_column(shard, field, &columns[i], check)?);
    }
    let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(rows));
    RecordBatch::try_new_with_options(catalog.schema().clone(), cols, &options)
        .map_err(|e| Error::shard(&shard.path, format!("unexpected column data: {e}")))
}

/// Read arbitrary rows by global id (`rows` sorted ascending, unique): one read per row group
/// touched, each selecting just the wanted rows (with an offset index, only the pages holding
/// them are read and decoded), spread over up to `threads` scoped threads (joined before
/// returning, so nothing outlives the call). Returns batches whose rows, concatenated, are
/// `rows` in order. Used to refill a shuffle buffer from a saved state.
pub fn read_rows(
    catalog: &Catalog,
    rows: &[u64],
    batch_rows: usize,
    threads: usize,
) -> Result<Vec<RecordBatch>> {
    read_rows_until(catalog, rows, batch_rows, threads, None)
}

/// [`read_rows`], giving up (with an error) before its next read once `stop` is set.
pub fn read_rows_until(
    catalog: &Catalog,
    rows: &[u64],
    batch_rows: usize,
    threads: usize,
    stop: Option<&std::sync::atomic::AtomicBool>,
) -> Result<Vec<RecordBatch>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // (shard, row group, the slice of `rows` inside it)
    let mut groups = Vec::new();
    let mut i = 0;
    while i < rows.len() {
        let (s, g, _) = catalog
            .locate(rows[i])
            .ok_or_else(|| Error::State(format!("row id {} is outside the dataset", rows[i])))?;
        let shard = catalog.shard(s);
        let rg_end = shard.first_row + shard.row_groups[g].first_row + shard.row_groups[g].num_rows;
        let j = i + rows[i..].partition_point(|&r| r < rg_end);
        groups.push((s, g, &rows[i..j]));
        i = j;
    }
    let threads = threads.max(1);
    split_for_threads(&mut groups, threads);
    let read = |k: usize| {
        if stop.is_some_and(|f| f.load(Ordering::Relaxed)) {
            return Err(Error::Internal("reading rows: stopped".into()));
        }
        let (s, g, ids) = groups[k];
        read_group(catalog, s, g, ids, batch_rows)
    };
    let threads = threads.min(groups.len());
    if threads <= 1 {
        let mut out = Vec::new();
        for k in 0..groups.len() {
            out.extend(read(k)?);
        }
        return Ok(out);
    }
    // Each thread takes the next unread group, the dearest first (row groups differ widely in
    // rows wanted); the batches still come out in row order.
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by_key(|&k| std::cmp::Reverse(read_cost(groups[k].2)));
    let order = &order;
    let next = AtomicUsize::new(0);
    let mut parts: Vec<Option<Result<Vec<RecordBatch>>>> =
        (0..groups.len()).map(|_| None).collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (next, read, n) = (&next, &read, groups.len());
                scope.spawn(move || {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return done;
                        }
                        let k = order[i];
                        let r = read(k);
                        let failed = r.is_err();
                        done.push((k, r));
                        if failed {
                            // Let the others stop too: the call fails anyway.
                            next.store(n, Ordering::Relaxed);
                            return done;
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            // A panicking reader re-panics here, in the caller, where the FFI boundary catches it.
            for (k, r) in h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)) {
                parts[k] = Some(r);
            }
        }
    });
    // After a failed read the others stop, so reads never reached may come before the failed
    // one (they are not taken in row order): its error is the call's.
    let mut out = Vec::new();
    let mut unread = false;
    for p in parts {
        match p {
            Some(r) => out.extend(r?),
            None => unread = true,
        }
    }
    if unread {
        return Err(Error::Internal("a row group was not read".into()));
    }
    Ok(out)
}

/// What a read of `ids` (sorted, in one row group) costs, in units of a row passed over: each
/// wanted row is decoded (weight [`ROW_READ_COST`]), and every row between the first and the
/// last is passed over, its pages decompressed and its levels decoded to skip it (weight 1).
/// (Measured on the benchmark's `[id, tokens]` resume with a 10k buffer, callgrind: ~6.6k
/// instructions per row read, ~3.1k per row spanned.)
fn read_cost(ids: &[u64]) -> u64 {
    match (ids.first(), ids.last()) {
        (Some(a), Some(b)) => ids.len() as u64 * ROW_READ_COST + (b - a),
        _ => 0,
    }
}

const ROW_READ_COST: u64 = 2;

/// Reads cheaper than this (about 512 rows read) are not cut in two for another thread: a cut
/// costs up to a page decoded twice per column, worth it only for halves of ~256 rows or more.
const MIN_SPLIT_COST: u64 = 512 * ROW_READ_COST;

/// Cut reads so that `threads` threads share the work evenly: while the dearest read costs
/// more than its share (with 1/8 slack), cut it where its two halves cost the same. A buffer's
/// rows usually sit almost all in one row group (a few in the next shard's first), so cutting
/// only until there are as many reads as threads left one thread with nearly all of it. At most
/// `4 * threads` cuts (each may decode a page twice).
fn split_for_threads(groups: &mut Vec<(usize, usize, &[u64])>, threads: usize) {
    if threads <= 1 {
        return;
    }
    let total: u64 = groups.iter().map(|g| read_cost(g.2)).sum();
    let share = total.div_ceil(threads as u64);
    for _ in 0..4 * threads {
        let Some((k, cost)) =
            (groups.iter().map(|g| read_cost(g.2)).enumerate()).max_by_key(|&(_, c)| c)
        else {
            return;
        };
        if cost <= share + share / 8 || cost < MIN_SPLIT_COST {
            return;
        }
        let (s, g, ids) = groups[k];
        let at = even_cut(ids);
        let (a, b) = ids.split_at(at);
        groups[k] = (s, g, a);
        groups.insert(k + 1, (s, g, b));
    }
}

/// Where to cut `ids` (at least 2, sorted) so that the halves' [`read_cost`]s are closest.
fn even_cut(ids: &[u64]) -> usize {
    let n = ids.len();
    debug_assert!(n >= 2);
    // The first half's cost grows with the cut, the second's shrinks: find where they cross.
    let (mut lo, mut hi) = (1, n - 1);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if read_cost(&ids[..mid]) < read_cost(&ids[mid..]) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let worse = |k: usize| read_cost(&ids[..k]).max(read_cost(&ids[k..]));
    if lo > 1 && worse(lo - 1) <= worse(lo) {
        lo - 1
    } else {
        lo
    }
}

/// The rows `ids` (sorted, unique, all inside row group `g` of shard `s`).
fn read_group(
    catalog: &Catalog,
    s: usize,
    g: usize,
    ids: &[u64],
    batch_rows: usize,
) -> Result<Vec<RecordBatch>> {
    let shard = catalog.shard(s);
    shard_guard(&shard.path, || {
        read_group_inner(catalog, s, g, ids, batch_rows)
    })
}

fn read_group_inner(
    catalog: &Catalog,
    s: usize,
    g: usize,
    ids: &[u64],
    batch_rows: usize,
) -> Result<Vec<RecordBatch>> {
    let shard = catalog.shard(s);
    let rg_first = shard.first_row + shard.row_groups[g].first_row;
    let mut selection = Vec::new();
    let mut at = 0u64; // next row (relative to the row group) not yet covered by a selector
    let mut k = 0;
    while k < ids.len() {
        let start = ids[k] - rg_first;
        let mut end = start + 1;
        while k + 1 < ids.len() && ids[k + 1] == ids[k] + 1 {
            k += 1;
            end += 1;
        }
        if start > at {
            selection.push(RowSelector::skip((start - at) as usize));
        }
        selection.push(RowSelector::select((end - start) as usize));
        at = end;
        k += 1;
    }
    let mut out = Vec::new();
    let mut got = 0u64;
    let mut held = Vec::new();
    let mut batches = open_row_group(
        catalog,
        s,
        g,
        selection,
        batch_rows,
        &shard.roots,
        &mut held,
    )?;
    let checks = utf8_checks(shard)?;
    while let Some((n, columns)) = batches
        .next_batch()
        .map_err(|e| Error::shard(&shard.path, format!("row group {g}: {e}")))?
    {
        got += n as u64;
        out.push(to_output(catalog, shard, &checks, n, columns)?);
    }
    drop(batches);
    Spare::recycle(held);
    if got != ids.len() as u64 {
        return Err(Error::shard(
            &shard.path,
            format!("row group {g}: asked for {} rows, read {got}", ids.len()),
        ));
    }
    Ok(out)
}

/// Output column `column` of rows `selection` of row group `g` of shard `s`, one array per
/// decoded batch. Random access decodes (and caches) each column's pages on their own, since
/// page boundaries differ between columns (`access/parquet.rs`).
pub fn read_column(
    catalog: &Catalog,
    s: usize,
    g: usize,
    column: usize,
    selection: Vec<RowSelector>,
    batch_rows: usize,
) -> Result<Vec<arrow_array::ArrayRef>> {
    let shard = catalog.shard(s);
    let root = shard.roots[shard.reorder[column]];
    let field = catalog.schema().field(column);
    shard_guard(&shard.path, || {
        let mut out = Vec::new();
        let mut held = Vec::new();
        let mut batches = open_row_group(catalog, s, g, selection, batch_rows, &[root], &mut held)?;
        let check = utf8_check(shard, root)?;
        while let Some((_, columns)) = batches
            .next_batch()
            .map_err(|e| Error::shard(&shard.path, format!("row group {g}: {e}")))?
        {
            // As to_output does for whole batches: checked and cast to the output type.
            out.push(output_column(shard, field, &columns[0], check)?);
        }
        drop(batches);
        Spare::recycle(held);
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Segment;
    use crate::prefetch::Piece;
    use crate::test_util::{ids, write_shards};

    /// This thread's spare buffer: (address, capacity).
    fn spare() -> (usize, usize) {
        SPARE.with(|s| {
            let v = s.take();
            let r = (v.as_ptr() as usize, v.capacity());
            s.set(v);
            r
        })
    }

    /// A read buffer is read into again only once nothing holds a slice of it, and what a
    /// consumer still holds keeps its bytes.
    #[test]
    #[allow(clippy::single_range_in_vec_init)] // (lists of byte ranges to read, some of one)
    fn a_read_buffer_is_reused_only_once_free() {
        SPARE.with(Cell::take); // (tests may share a thread)
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let f = File::open(&path).unwrap();
        let mut held = Vec::new();
        let parts = read_ranges(&f, &path, vec![100..300, 5000..9000], &mut held).unwrap();
        assert_eq!(&parts[0][..], &data[100..300]);
        assert_eq!(&parts[1][..], &data[5000..9000]);
        let first = held[0].as_ptr() as usize;
        let kept = parts[1].clone();
        drop(parts);
        Spare::recycle(std::mem::take(&mut held));
        assert_eq!(spare().1, 0, "a buffer still referred to was kept");
        let parts = read_ranges(&f, &path, vec![0..4200], &mut held).unwrap();
        let second = held[0].as_ptr() as usize;
        assert_ne!(second, first);
        assert_eq!(&parts[0][..], &data[..4200]);
        assert_eq!(&kept[..], &data[5000..9000]);
        drop(parts);
        Spare::recycle(std::mem::take(&mut held));
        assert_eq!(spare().0, second, "a free buffer was not kept");
        // A smaller read goes into it, at its start.
        let parts = read_ranges(&f, &path, vec![10..20, 19_000..19_990], &mut held).unwrap();
        assert_eq!(held[0].as_ptr() as usize, second);
        assert_eq!(&parts[0][..], &data[10..20]);
        assert_eq!(&parts[1][..], &data[19_000..19_990]);
        // A range past the end of the file is an error naming it.
        let e = read_ranges(&f, &path, vec![19_990..20_010], &mut Vec::new()).unwrap_err();
        assert!(e.to_string().contains("19990..20010"), "{e}");
    }

    /// A piece's reader, once dropped, leaves its read buffer to the next piece of the thread,
    /// and pieces read through reused buffers give exactly their rows.
    #[test]
    fn a_finished_piece_hands_its_buffer_on() {
        SPARE.with(Cell::take);
        let dir = tempfile::tempdir().unwrap();
        let files = write_shards(dir.path(), &[40], 10);
        let cat = Arc::new(Catalog::open(&files, None).unwrap());
        let shard = cat.shard(0);
        assert!(shard.has_offset_index());
        let mut got = Vec::new();
        for g in [0, 1, 3, 2] {
            let seg = Segment {
                shard: 0,
                row_group: g,
                start: 1,
                len: 9,
                first_row: shard.first_row + shard.row_groups[g].first_row + 1,
            };
            let mut r = SegmentReader::open(cat.clone(), &Piece { seg, pos: 0 }, 4).unwrap();
            while let Some((_, b)) = r.next_batch().unwrap() {
                got.extend(ids(&b));
            }
            drop(r);
            assert!(spare().1 > 0, "row group {g} left no buffer");
        }
        let want: Vec<i64> = [0i64, 1, 3, 2]
            .iter()
            .flat_map(|g| g * 10 + 1..g * 10 + 10)
            .collect();
        assert_eq!(got, want);
    }

    /// A buffer's rows as a resume finds them: ~all in one row group, dense near its end, a few
    /// in another shard's first row group. Two threads must get about half the work each (the
    /// old rule, "cut until there are as many reads as threads", left one with ~99% of it), and
    /// the cut reads together are the reads before the cut, in order.
    #[test]
    fn reads_are_cut_until_threads_share_the_work() {
        let dense: Vec<u64> = (0..10_000u64).map(|i| 400_000 + i * i / 1_600).collect();
        let mut dense = dense;
        dense.dedup();
        let few: Vec<u64> = (1_248_600..1_248_616).collect();
        for threads in [2usize, 3, 8] {
            let mut groups = vec![(3, 0, &dense[..]), (7, 0, &few[..])];
            split_for_threads(&mut groups, threads);
            let total: u64 = [read_cost(&dense), read_cost(&few)].iter().sum();
            let dearest = groups.iter().map(|g| read_cost(g.2)).max().unwrap();
            assert!(
                dearest * threads as u64 <= total * 9 / 8 + threads as u64,
                "{threads} threads: the dearest read costs {dearest} of {total}"
            );
            assert!(groups.len() <= 2 + 4 * threads);
            let rejoined: Vec<(usize, usize, u64)> = groups
                .iter()
                .flat_map(|&(s, g, ids)| {
                    assert!(!ids.is_empty());
                    ids.iter().map(move |&r| (s, g, r))
                })
                .collect();
            let want: Vec<(usize, usize, u64)> = (dense.iter().map(|&r| (3, 0, r)))
                .chain(few.iter().map(|&r| (7, 0, r)))
                .collect();
            assert_eq!(rejoined, want);
        }
        // Small reads stay whole; one thread never cuts.
        let small: Vec<u64> = (0..200).collect();
        let mut groups = vec![(0, 0, &small[..])];
        split_for_threads(&mut groups, 2);
        assert_eq!(groups.len(), 1);
        let mut groups = vec![(0, 0, &dense[..])];
        split_for_threads(&mut groups, 1);
        assert_eq!(groups.len(), 1);
    }

    proptest::proptest! {
        /// The cut is where the halves' costs are closest, and both halves hold rows.
        #[test]
        fn even_cut_is_the_best_cut(mut ids in proptest::collection::vec(0u64..100_000, 2..300)) {
            ids.sort_unstable();
            ids.dedup();
            proptest::prop_assume!(ids.len() >= 2);
            let worse = |k: usize| read_cost(&ids[..k]).max(read_cost(&ids[k..]));
            let at = even_cut(&ids);
            proptest::prop_assert!(at >= 1 && at < ids.len());
            let best = (1..ids.len()).map(worse).min().unwrap();
            proptest::prop_assert_eq!(worse(at), best);
        }
    }

    /// Rows read by several threads from cut reads are the rows one thread reads, in order.
    #[test]
    fn cut_reads_give_the_same_rows() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_shards(dir.path(), &[3_000, 500], 2_000);
        let cat = Catalog::open(&files, None).unwrap();
        let rows: Vec<u64> = (0..3_500u64)
            .filter(|r| r % 3 != 1 && (*r < 2_000 || r % 7 == 0))
            .collect();
        let one: Vec<i64> = read_rows(&cat, &rows, 256, 1)
            .unwrap()
            .iter()
            .flat_map(ids)
            .collect();
        assert_eq!(one, rows.iter().map(|&r| r as i64).collect::<Vec<_>>());
        for threads in [2, 3] {
            let got: Vec<i64> = read_rows(&cat, &rows, 256, threads)
                .unwrap()
                .iter()
                .flat_map(ids)
                .collect();
            assert_eq!(got, one, "{threads} threads");
        }
    }
}

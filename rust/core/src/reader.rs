//! Reading rows: where resume seeks.
//!
//! Every read goes through one row group of one shard with a `RowSelection` (skip `start`, select
//! `len`). With the file's offset index (loaded once in the catalog), the parquet reader drops the
//! pages before `start` without reading or decompressing them and decodes only from the page
//! holding row `start`; without one it still skips rows but must read page headers. Either way no
//! row before the resume point is ever handed to the caller, and the cost of a seek does not grow
//! with the position. Remote shards (object stores), and local ones with an offset index, fetch
//! the selected pages first and decode from memory: see `open_pushed_row_group`.

use std::fs::File;
use std::sync::Arc;

use arrow_array::RecordBatch;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder, RowSelection,
    RowSelector,
};
use parquet::arrow::push_decoder::ParquetPushDecoderBuilder;
use parquet::arrow::ProjectionMask;
use parquet::DecodeResult;

use crate::catalog::{ipc, Catalog, Shard};
use crate::error::{shard_guard, Error, Result};
use crate::plan::Segment;

/// Reads one [`Segment`] as record batches in the catalog's output schema.
pub struct SegmentReader {
    catalog: Arc<Catalog>,
    shard: usize,
    row_group: usize,
    inner: Batches,
    next_row: u64,
    remaining: u64,
}

impl SegmentReader {
    pub fn open(catalog: Arc<Catalog>, seg: &Segment, batch_rows: usize) -> Result<Self> {
        let selection = vec![
            RowSelector::skip(seg.start as usize),
            RowSelector::select(seg.len as usize),
        ];
        let shard = catalog.shard(seg.shard);
        let inner = shard_guard(&shard.path, || {
            open_row_group(shard, seg.row_group, selection, batch_rows, &shard.roots)
        })?;
        Ok(SegmentReader {
            shard: seg.shard,
            catalog,
            row_group: seg.row_group,
            inner,
            next_row: seg.first_row,
            remaining: seg.len,
        })
    }

    /// The next batch and the global row id of its first row; `None` once the segment is done.
    pub fn next_batch(&mut self) -> Result<Option<(u64, RecordBatch)>> {
        if self.remaining == 0 {
            return Ok(None);
        }
        let shard = self.catalog.shard(self.shard);
        let inner = &mut self.inner;
        let next = shard_guard(&shard.path, || Ok(inner.next()))?;
        let batch = match next {
            Some(b) => b.map_err(|e| {
                Error::shard(&shard.path, format!("row group {}: {e}", self.row_group))
            })?,
            None => {
                return Err(Error::shard(
                    &shard.path,
                    format!(
                        "row group {} ended {} rows early",
                        self.row_group, self.remaining
                    ),
                ))
            }
        };
        let n = batch.num_rows() as u64;
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
        Ok(Some((first, to_output(&self.catalog, shard, batch)?)))
    }
}

/// Decoded batches of one unit, in the shard's own column order (projected), whatever the format.
type Batches =
    Box<dyn Iterator<Item = std::result::Result<RecordBatch, arrow_schema::ArrowError>> + Send>;

/// `roots`: the file's root columns to decode (sorted; `shard.roots` for every output column).
/// The one place the read path dispatches on the shard's format.
fn open_row_group(
    shard: &Shard,
    row_group: usize,
    selection: Vec<RowSelector>,
    batch_rows: usize,
    roots: &[usize],
) -> Result<Batches> {
    if let Some(index) = shard.ipc() {
        return open_ipc_batch(shard, index, row_group, selection, batch_rows, roots);
    }
    Ok(Box::new(open_parquet_row_group(
        shard, row_group, selection, batch_rows, roots,
    )?))
}

/// One IPC record batch: its bytes (a local file memory-mapped, so uncompressed columns are
/// not copied; an object's ranges fetched), decoded once, then the selection's rows as
/// zero-copy slices of at most `batch_rows`.
fn open_ipc_batch(
    shard: &Shard,
    index: &ipc::IpcIndex,
    b: usize,
    selection: Vec<RowSelector>,
    batch_rows: usize,
    roots: &[usize],
) -> Result<Batches> {
    let ranges = index.ranges_for(b);
    let bufs: Vec<arrow_buffer::Buffer> = match &shard.object {
        Some(obj) => obj
            .fetch(ranges)?
            .into_iter()
            .map(arrow_buffer::Buffer::from)
            .collect(),
        None => {
            let file = File::open(&shard.path).map_err(|e| Error::io(&shard.path, e))?;
            shard.check_unchanged(&file)?;
            let whole = ipc::map_file(&file, &shard.path)?;
            ipc::slices(&whole, &ranges, &shard.path)?
        }
    };
    let batch = index.decode(b, &shard.schema, roots, &bufs, &shard.path)?;
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
    let step = batch_rows.max(1);
    let mut out = Vec::new();
    let mut at = 0usize;
    for sel in selection {
        if !sel.skip {
            let end = at + sel.row_count;
            let mut i = at;
            while i < end.min(batch.num_rows()) {
                let n = step.min(end - i).min(batch.num_rows() - i);
                out.push(Ok(batch.slice(i, n)));
                i += n;
            }
        }
        at += sel.row_count;
    }
    Ok(Box::new(out.into_iter()))
}

fn open_parquet_row_group(
    shard: &Shard,
    row_group: usize,
    selection: Vec<RowSelector>,
    batch_rows: usize,
    roots: &[usize],
) -> Result<ParquetRecordBatchReader> {
    let meta = shard.reader_meta()?;
    let mask = ProjectionMask::roots(meta.parquet_schema(), roots.iter().copied());
    if let Some(obj) = &shard.object {
        return open_pushed_row_group(
            shard,
            meta,
            row_group,
            selection,
            batch_rows,
            mask,
            |r, d| obj.fetch_pages(r, d),
        );
    }
    let file = File::open(&shard.path).map_err(|e| Error::io(&shard.path, e))?;
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
            mask,
            |r, _| read_ranges(&file, &shard.path, r),
        );
    }
    // Without an offset index a piece is a whole row group: stream it page by page instead.
    ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta.clone())
        .with_row_groups(vec![row_group])
        .with_projection(mask)
        .with_row_selection(RowSelection::from(selection))
        .with_batch_size(batch_rows.max(1))
        .build()
        .map_err(|e| Error::shard(&shard.path, format!("row group {row_group}: {e}")))
}

/// `ranges` of a local file, read with `pread` (no shared file position: threads may share it).
fn read_ranges(
    file: &File,
    path: &std::path::Path,
    ranges: Vec<std::ops::Range<u64>>,
) -> Result<Vec<bytes::Bytes>> {
    use std::os::unix::fs::FileExt;
    ranges
        .into_iter()
        .map(|r| {
            let mut buf = vec![0u8; (r.end - r.start) as usize];
            file.read_exact_at(&mut buf, r.start)
                .map_err(|e| Error::io(path, e))?;
            Ok(bytes::Bytes::from(buf))
        })
        .collect()
}

/// The read through arrow-rs's push decoder (every remote shard, local shards with an offset
/// index): given the same row group, projection and selection, it names the byte ranges it needs
/// (with an offset index, just the pages holding selected rows, plus dictionary pages); `fetch`
/// gets them (for an object store: coalesced, in parallel, dictionary pages cached) and decoding
/// then runs from memory.
fn open_pushed_row_group(
    shard: &Shard,
    meta: &ArrowReaderMetadata,
    row_group: usize,
    selection: Vec<RowSelector>,
    batch_rows: usize,
    mask: ProjectionMask,
    mut fetch: impl FnMut(
        Vec<std::ops::Range<u64>>,
        &[std::ops::Range<u64>],
    ) -> Result<Vec<bytes::Bytes>>,
) -> Result<ParquetRecordBatchReader> {
    let bad = |e: parquet::errors::ParquetError| {
        Error::shard(&shard.path, format!("row group {row_group}: {e}"))
    };
    let mut decoder = ParquetPushDecoderBuilder::new_with_metadata(meta.clone())
        .with_row_groups(vec![row_group])
        .with_projection(mask)
        .with_row_selection(RowSelection::from(selection))
        .with_batch_size(batch_rows.max(1))
        .build()
        .map_err(bad)?;
    // The decoder asks for each column's dictionary page as its own range (chunk start to the
    // first data page): those are the same for every piece of this row group.
    let rg = meta.metadata().row_group(row_group);
    let first_pages = meta
        .metadata()
        .offset_index()
        .and_then(|oi| oi.get(row_group));
    let dictionaries: Vec<std::ops::Range<u64>> = (0..rg.num_columns())
        .filter_map(|c| {
            let start = rg.column(c).dictionary_page_offset()?;
            let end = first_pages?.get(c)?.page_locations().first()?.offset;
            (0 <= start && start < end).then_some(start as u64..end as u64)
        })
        .collect();
    loop {
        match decoder.try_next_reader().map_err(bad)? {
            DecodeResult::NeedsData(ranges) => {
                let data = fetch(ranges.clone(), &dictionaries)?;
                decoder.push_ranges(ranges, data).map_err(bad)?;
            }
            DecodeResult::Data(reader) => return Ok(reader),
            DecodeResult::Finished => {
                return Err(Error::shard(
                    &shard.path,
                    format!("row group {row_group}: the decoder returned no rows"),
                ))
            }
        }
    }
}

/// One decoded column as output column `field`: string data checked, cast to the output
/// schema's type where this shard's type differs (see [`to_output`]).
fn output_column(
    shard: &Shard,
    field: &arrow_schema::Field,
    col: &arrow_array::ArrayRef,
) -> Result<arrow_array::ArrayRef> {
    // arrow-rs validates UTF-8 for STRING columns but not for JSON ones (also read as
    // utf8): invalid bytes would reach Python as a broken array. Check every string column.
    if matches!(
        col.data_type(),
        arrow_schema::DataType::Utf8 | arrow_schema::DataType::LargeUtf8
    ) {
        col.to_data().validate_values().map_err(|e| {
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
fn to_output(catalog: &Catalog, shard: &Shard, batch: RecordBatch) -> Result<RecordBatch> {
    let mut cols = Vec::with_capacity(shard.reorder.len());
    for (&i, field) in shard.reorder.iter().zip(catalog.schema().fields()) {
        cols.push(output_column(shard, field, batch.column(i))?);
    }
    let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    RecordBatch::try_new_with_options(catalog.schema().clone(), cols, &options)
        .map_err(|e| Error::shard(&shard.path, format!("unexpected column data: {e}")))
}

/// Read arbitrary rows by global id (`rows` sorted ascending, unique): one read per row group
/// touched, each selecting just the wanted rows, spread over up to `threads` scoped threads
/// (joined before returning, so nothing outlives the call). Returns batches whose rows,
/// concatenated, are `rows` in order. Used to refill a shuffle buffer from a saved state.
pub fn read_rows(
    catalog: &Catalog,
    rows: &[u64],
    batch_rows: usize,
    threads: usize,
) -> Result<Vec<RecordBatch>> {
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
    let threads = threads.clamp(1, groups.len().max(1));
    if threads == 1 {
        let mut out = Vec::new();
        for &(s, g, ids) in &groups {
            out.extend(read_group(catalog, s, g, ids, batch_rows)?);
        }
        return Ok(out);
    }
    let mut parts: Vec<Option<Result<Vec<RecordBatch>>>> =
        (0..groups.len()).map(|_| None).collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let groups = &groups;
                scope.spawn(move || {
                    (t..groups.len())
                        .step_by(threads)
                        .map(|k| {
                            let (s, g, ids) = groups[k];
                            (k, read_group(catalog, s, g, ids, batch_rows))
                        })
                        .collect::<Vec<_>>()
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
    let mut out = Vec::new();
    for p in parts {
        out.extend(p.expect("every group read")?);
    }
    Ok(out)
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
        read_group_inner(catalog, shard, g, ids, batch_rows)
    })
}

fn read_group_inner(
    catalog: &Catalog,
    shard: &Shard,
    g: usize,
    ids: &[u64],
    batch_rows: usize,
) -> Result<Vec<RecordBatch>> {
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
    for b in open_row_group(shard, g, selection, batch_rows, &shard.roots)? {
        let b = b.map_err(|e| Error::shard(&shard.path, format!("row group {g}: {e}")))?;
        got += b.num_rows() as u64;
        out.push(to_output(catalog, shard, b)?);
    }
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
        for b in open_row_group(shard, g, selection, batch_rows, &[root])? {
            let b = b.map_err(|e| Error::shard(&shard.path, format!("row group {g}: {e}")))?;
            // As to_output does for whole batches: checked and cast to the output type.
            out.push(output_column(shard, field, b.column(0))?);
        }
        Ok(out)
    })
}

//! A specialised decoder for flat primitive columns and lists of primitives (`list<int32>` token
//! ids, `float64` scores, ...), the columns where arrow-rs's general record reader spent most of
//! the CPU of a pass: it decodes every definition and repetition level into an `i16` array, then
//! builds a validity bitmap bit by bit from them even when no value is null, and scans them again
//! for the list offsets. Here the levels are consumed run by run ([`rle`]) and offsets, bitmaps
//! and values come straight out of them ([`column`]).
//!
//! It stands on parquet's public page API (`SerializedPageReader`: page headers, decompression,
//! offset index) and takes only what it can decode exactly as arrow-rs does — see [`plan_root`];
//! every other column of the row group is read by arrow-rs in the same batches ([`Batches`]).
//! With an offset index only the pages holding selected rows are read ([`open_row_group`]);
//! without one a chunk's pages are read in order from its start, from a local file page by page
//! ([`open_local_row_group`]) or fetched whole from an object store, and rows before a selection
//! are skipped by decoding their levels.

mod column;
mod rle;
mod values;

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use arrow_array::ArrayRef;
use arrow_schema::DataType;
use bytes::{Buf, Bytes};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ParquetRecordBatchReader, RowSelection, RowSelector,
};
use parquet::arrow::push_decoder::ParquetPushDecoderBuilder;
use parquet::arrow::ProjectionMask;
use parquet::basic::{ConvertedType, Encoding};
use parquet::column::page::PageReader;
use parquet::errors::{ParquetError, Result};
use parquet::file::reader::{ChunkReader, Length};
use parquet::file::serialized_reader::SerializedPageReader;
use parquet::DecodeResult;

use column::{Column, ColumnRead, Shape};
use values::KindId;

/// How the fast path reads one root column of one row group.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    /// Its only leaf (parquet column index).
    pub leaf: usize,
    kind: KindId,
    shape: Shape,
    /// The chunk has a sound offset index (else its pages are read in order from its start).
    indexed: bool,
}

/// The fast path for root column `root` of row group `rg`, if it applies: one leaf, an arrow type
/// that is a supported primitive (see [`KindId::of`]) or a `List`/`LargeList` of one, levels that
/// match that type exactly, only PLAIN / dictionary values with RLE levels, and an offset index
/// for the chunk that is sound (so pages can be skipped and each starts a row) or none at all.
pub(crate) fn plan_root(meta: &ArrowReaderMetadata, rg: usize, root: usize) -> Option<Plan> {
    let descr = meta.parquet_schema();
    let mut leaves = (0..descr.num_columns()).filter(|&c| descr.get_column_root_idx(c) == root);
    let leaf = leaves.next()?;
    if leaves.next().is_some() {
        return None;
    }
    let col = descr.column(leaf);
    let field = meta.schema().fields().get(root)?.clone();
    let (max_def, max_rep) = (col.max_def_level(), col.max_rep_level());
    let (kind, shape) = match field.data_type() {
        DataType::List(item) | DataType::LargeList(item) => {
            let kind = KindId::of(item.data_type(), col.physical_type())?;
            let list_def = i16::from(field.is_nullable());
            let slot_def = list_def + 1;
            if max_rep != 1 || max_def != slot_def + i16::from(item.is_nullable()) {
                return None;
            }
            let large = matches!(field.data_type(), DataType::LargeList(_));
            let shape = Shape {
                max_def,
                max_rep,
                list_def,
                slot_def,
                item: Some((item.clone(), large)),
            };
            (kind, shape)
        }
        t => {
            let kind = KindId::of(t, col.physical_type())?;
            if max_rep != 0 || max_def != i16::from(field.is_nullable()) {
                return None;
            }
            let shape = Shape {
                max_def,
                max_rep,
                list_def: 0,
                slot_def: 0,
                item: None,
            };
            (kind, shape)
        }
    };
    let md = meta.metadata();
    let chunk = md.row_group(rg).column(leaf);
    let ok = |e: Encoding| {
        matches!(
            e,
            Encoding::PLAIN | Encoding::RLE | Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY
        )
    };
    if !chunk.encodings().all(ok) || chunk.column_type() != col.physical_type() {
        return None;
    }
    let listed = md
        .offset_index()
        .and_then(|oi| oi.get(rg))
        .and_then(|c| c.get(leaf))
        .is_some_and(|c| !c.page_locations().is_empty());
    let indexed = pages_of(meta, rg, leaf).is_some();
    if listed && !indexed {
        return None;
    }
    Some(Plan {
        leaf,
        kind,
        shape,
        indexed,
    })
}

/// The page locations of `leaf` in row group `rg` if they are usable: the first page starts at
/// row 0 and at or after the chunk start, rows and offsets strictly increase, all inside the row
/// group and the chunk.
fn pages_of(
    meta: &ArrowReaderMetadata,
    rg: usize,
    leaf: usize,
) -> Option<&[parquet::file::page_index::offset_index::PageLocation]> {
    let md = meta.metadata();
    let pages = md.offset_index()?.get(rg)?.get(leaf)?.page_locations();
    let chunk = md.row_group(rg).column(leaf);
    let (start, len) = chunk.byte_range();
    let rows = md.row_group(rg).num_rows();
    let first = pages.first()?;
    let sound = first.first_row_index == 0
        && pages.iter().all(|p| {
            p.compressed_page_size > 0
                && p.offset as u64 >= start
                && p.offset as u64 + p.compressed_page_size as u64 <= start + len
                && p.first_row_index < rows
        })
        && pages
            .windows(2)
            .all(|w| w[0].first_row_index < w[1].first_row_index && w[0].offset < w[1].offset);
    sound.then_some(pages.as_slice())
}

/// Byte ranges to fetch for `plan` given the rows `selected` (sorted, disjoint, relative to the
/// row group): the dictionary page (its own range, as the object-store cache keys it) and the
/// data pages holding any selected row, adjacent pages merged. Without an offset index: the
/// whole chunk if any row is selected (as arrow-rs's own push decoder fetches it).
pub(crate) fn page_ranges(
    meta: &ArrowReaderMetadata,
    rg: usize,
    plan: &Plan,
    selected: &[Range<u64>],
) -> (Option<Range<u64>>, Vec<Range<u64>>) {
    let md = meta.metadata();
    let Some(pages) = pages_of(meta, rg, plan.leaf) else {
        let (start, len) = md.row_group(rg).column(plan.leaf).byte_range();
        let whole = (!selected.is_empty() && len > 0).then(|| start..start + len);
        return (None, whole.into_iter().collect());
    };
    let (start, _) = md.row_group(rg).column(plan.leaf).byte_range();
    let rows = md.row_group(rg).num_rows() as u64;
    // SerializedPageReader's rule: bytes before the first data page are the dictionary page.
    let dict = (pages[0].offset as u64 != start).then(|| start..pages[0].offset as u64);
    let mut out: Vec<Range<u64>> = Vec::new();
    let mut sel = selected.iter().peekable();
    for (i, p) in pages.iter().enumerate() {
        let first = p.first_row_index as u64;
        let end = pages.get(i + 1).map_or(rows, |n| n.first_row_index as u64);
        while sel.next_if(|r| r.end <= first).is_some() {}
        if sel.peek().is_some_and(|r| r.start < end) {
            let r = p.offset as u64..p.offset as u64 + p.compressed_page_size as u64;
            match out.last_mut() {
                Some(last) if last.end == r.start => last.end = r.end,
                _ => out.push(r),
            }
        }
    }
    (dict, out)
}

/// The selected row ranges of `selection` (relative to the row group).
pub(crate) fn selected_rows(selection: &[RowSelector]) -> Vec<Range<u64>> {
    let mut at = 0u64;
    let mut out = Vec::new();
    for s in selection {
        let end = at + s.row_count as u64;
        if !s.skip && end > at {
            out.push(at..end);
        }
        at = end;
    }
    out
}

/// Byte ranges of a file held in memory (what a piece fetched), readable as a [`ChunkReader`].
pub(crate) struct Fetched {
    parts: Vec<(u64, Bytes)>,
    len: u64,
}

impl Fetched {
    pub(crate) fn new(ranges: Vec<Range<u64>>, data: Vec<Bytes>, file_len: u64) -> Self {
        let mut parts: Vec<(u64, Bytes)> = ranges.into_iter().map(|r| r.start).zip(data).collect();
        parts.sort_by_key(|p| p.0);
        Fetched {
            parts,
            len: file_len,
        }
    }

    fn find(&self, start: u64, len: u64) -> Result<Bytes> {
        let i = self.parts.partition_point(|p| p.0 <= start);
        let (off, b) = i
            .checked_sub(1)
            .map(|i| &self.parts[i])
            .filter(|(off, b)| start + len <= off + b.len() as u64)
            .ok_or_else(|| {
                ParquetError::General(format!("bytes {start}..{} were not fetched", start + len))
            })?;
        let from = (start - off) as usize;
        Ok(b.slice(from..from + len as usize))
    }
}

impl Length for Fetched {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for Fetched {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> Result<Self::T> {
        let i = self.parts.partition_point(|p| p.0 <= start);
        let (off, b) = i
            .checked_sub(1)
            .map(|i| &self.parts[i])
            .ok_or_else(|| ParquetError::General(format!("byte {start} was not fetched")))?;
        let from = usize::try_from(start - off).ok().filter(|&f| f <= b.len());
        let from =
            from.ok_or_else(|| ParquetError::General(format!("byte {start} was not fetched")))?;
        Ok(b.slice(from..).reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> Result<Bytes> {
        self.find(start, length as u64)
    }
}

/// A decoder for `plan`'s column over pages in `data` (with an offset index, the pages it lists;
/// without, every page from the chunk start, read one at a time as decoding needs it).
pub(crate) fn open_column<R: ChunkReader + 'static>(
    meta: &ArrowReaderMetadata,
    rg: usize,
    plan: &Plan,
    data: Arc<R>,
) -> Result<Box<dyn ColumnRead>> {
    let md = meta.metadata();
    let chunk = md.row_group(rg).column(plan.leaf);
    let pages = pages_of(meta, rg, plan.leaf).map(<[_]>::to_vec);
    let rows = md.row_group(rg).num_rows() as usize;
    let reader = Box::new(SerializedPageReader::new(data, chunk, rows, pages)?);
    Ok(column_over(plan, reader))
}

/// The decoder for `plan`'s value type over `pages`.
fn column_over(plan: &Plan, pages: Box<dyn PageReader>) -> Box<dyn ColumnRead> {
    use values as v;
    let shape = plan.shape.clone();
    let split = !plan.indexed;
    match plan.kind {
        KindId::I32 => Box::new(Column::<v::I32>::new(shape, pages, split)),
        KindId::I32AsI8 => Box::new(Column::<v::I32AsI8>::new(shape, pages, split)),
        KindId::I32AsI16 => Box::new(Column::<v::I32AsI16>::new(shape, pages, split)),
        KindId::I32AsU8 => Box::new(Column::<v::I32AsU8>::new(shape, pages, split)),
        KindId::I32AsU16 => Box::new(Column::<v::I32AsU16>::new(shape, pages, split)),
        KindId::I32AsU32 => Box::new(Column::<v::I32AsU32>::new(shape, pages, split)),
        KindId::I64 => Box::new(Column::<v::I64>::new(shape, pages, split)),
        KindId::I64AsU64 => Box::new(Column::<v::I64AsU64>::new(shape, pages, split)),
        KindId::F32 => Box::new(Column::<v::F32>::new(shape, pages, split)),
        KindId::F64 => Box::new(Column::<v::F64>::new(shape, pages, split)),
    }
}

/// The decoder's plan for each of `roots` in row group `rg` (`None`: arrow-rs reads it), and
/// the roots arrow-rs reads.
fn plans_of(
    meta: &ArrowReaderMetadata,
    rg: usize,
    roots: &[usize],
) -> (Vec<Option<Plan>>, Vec<usize>) {
    let plans: Vec<Option<Plan>> = roots.iter().map(|&r| plan_root(meta, rg, r)).collect();
    let rest = roots
        .iter()
        .zip(&plans)
        .filter(|(_, p)| p.is_none())
        .map(|(&r, _)| r)
        .collect();
    (plans, rest)
}

/// Open row group `rg` of a file for the projected root columns `roots` (sorted) under
/// `selection`: the fast columns' pages and arrow-rs's ranges for the rest are fetched together
/// (`fetch(ranges, dictionary_ranges)` returns one buffer per range; dictionary pages are asked
/// for as ranges of their own so a cache can key them), then decoding runs from memory.
/// `bad` turns a decoder error into the caller's error.
#[allow(clippy::too_many_arguments)]
pub(crate) fn open_row_group(
    meta: &ArrowReaderMetadata,
    rg: usize,
    roots: &[usize],
    selection: Vec<RowSelector>,
    batch_rows: usize,
    file_len: u64,
    mut fetch: impl FnMut(Vec<Range<u64>>, &[Range<u64>]) -> crate::Result<Vec<Bytes>>,
    bad: impl Fn(ParquetError) -> crate::Error,
) -> crate::Result<Batches> {
    let (plans, rest_roots) = plans_of(meta, rg, roots);
    let selected = selected_rows(&selection);
    let mut mine = Vec::new();
    let mut dictionaries = Vec::new();
    for p in plans.iter().flatten() {
        let (dict, data) = page_ranges(meta, rg, p, &selected);
        dictionaries.extend(dict.clone());
        mine.extend(dict);
        mine.extend(data);
    }
    // Dictionary pages of the arrow-rs columns too (bytes from the chunk start to its first
    // page): the decoder asks for each as its own range.
    let md = meta.metadata();
    let group = md.row_group(rg);
    let first_pages = md.offset_index().and_then(|oi| oi.get(rg));
    let descr = meta.parquet_schema();
    for c in
        (0..group.num_columns()).filter(|&c| rest_roots.contains(&descr.get_column_root_idx(c)))
    {
        let start = group.column(c).dictionary_page_offset();
        let end = first_pages
            .and_then(|p| p.get(c))
            .and_then(|p| p.page_locations().first())
            .map(|p| p.offset);
        if let (Some(start), Some(end)) = (start, end) {
            if 0 <= start && start < end {
                dictionaries.push(start as u64..end as u64);
            }
        }
    }
    let mut fetched: Option<Arc<Fetched>> = None;
    let rest = if rest_roots.is_empty() {
        None
    } else {
        let mask = ProjectionMask::roots(descr, rest_roots.iter().copied());
        let mut decoder = ParquetPushDecoderBuilder::new_with_metadata(meta.clone())
            .with_row_groups(vec![rg])
            .with_projection(mask)
            .with_row_selection(RowSelection::from(selection.clone()))
            .with_batch_size(batch_rows.max(1))
            .build()
            .map_err(&bad)?;
        let mut pending = Some(std::mem::take(&mut mine));
        loop {
            match decoder.try_next_reader().map_err(&bad)? {
                DecodeResult::NeedsData(ranges) => {
                    // The first request also carries the fast columns' pages: one round trip.
                    let extra = pending.take().unwrap_or_default();
                    let n = ranges.len();
                    let mut all = ranges.clone();
                    all.extend(extra.iter().cloned());
                    let mut data = fetch(all, &dictionaries)?;
                    if data.len() != n + extra.len() {
                        return Err(crate::Error::Internal(
                            "fetch returned a wrong count".into(),
                        ));
                    }
                    let mine_data = data.split_off(n);
                    if !extra.is_empty() {
                        fetched = Some(Arc::new(Fetched::new(extra, mine_data, file_len)));
                    }
                    decoder.push_ranges(ranges, data).map_err(&bad)?;
                }
                DecodeResult::Data(reader) => {
                    if let Some(m) = pending.take() {
                        mine = m;
                    }
                    break Some(reader);
                }
                DecodeResult::Finished if selected.is_empty() => break None,
                DecodeResult::Finished => {
                    return Err(bad(ParquetError::General(
                        "the decoder returned no rows".into(),
                    )))
                }
            }
        }
    };
    if !mine.is_empty() {
        let data = fetch(mine.clone(), &dictionaries)?;
        fetched = Some(Arc::new(Fetched::new(mine, data, file_len)));
    }
    let fetched =
        fetched.unwrap_or_else(|| Arc::new(Fetched::new(Vec::new(), Vec::new(), file_len)));
    let columns = sources_of(&plans, descr, |p| {
        open_column(meta, rg, p, fetched.clone()).map_err(&bad)
    })?;
    Ok(Batches::new(columns, rest, selection, batch_rows))
}

/// Each projected column's source: the fast decoder `open` makes for its plan, or its place
/// among the arrow-rs reader's columns.
fn sources_of(
    plans: &[Option<Plan>],
    descr: &parquet::schema::types::SchemaDescriptor,
    mut open: impl FnMut(&Plan) -> crate::Result<Box<dyn ColumnRead>>,
) -> crate::Result<Vec<ColumnSource>> {
    let mut k = 0;
    let mut columns = Vec::with_capacity(plans.len());
    for plan in plans {
        columns.push(match plan {
            Some(p) => Ok((descr.column(p.leaf).path().string(), open(p)?)),
            None => {
                k += 1;
                Err(k - 1)
            }
        });
    }
    Ok(columns)
}

/// Open row group `rg` of a local file without an offset index (or with any columns lacking
/// one) for the projected root columns `roots` (sorted) under `selection`: the fast columns read
/// their pages from `file` one at a time as they decode (so memory holds about a page per column,
/// as with arrow-rs's reader over a file), the others through arrow-rs's reader over the same
/// file. `bad` turns a decoder error into the caller's error.
pub(crate) fn open_local_row_group(
    meta: &ArrowReaderMetadata,
    rg: usize,
    roots: &[usize],
    selection: Vec<RowSelector>,
    batch_rows: usize,
    file: std::fs::File,
    bad: impl Fn(ParquetError) -> crate::Error,
) -> crate::Result<Batches> {
    let (plans, rest_roots) = plans_of(meta, rg, roots);
    let descr = meta.parquet_schema();
    // Every read of a `File` chunk reader seeks first and no reader outlives a page, so the
    // decoders and arrow-rs share one descriptor (all on the thread that takes the batches).
    let file = Arc::new(file);
    let rest = if rest_roots.is_empty() {
        None
    } else {
        let f = file
            .try_clone()
            .map_err(|e| bad(ParquetError::External(Box::new(e))))?;
        Some(
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::new_with_metadata(
                f,
                meta.clone(),
            )
            .with_row_groups(vec![rg])
            .with_projection(ProjectionMask::roots(descr, rest_roots.iter().copied()))
            .with_row_selection(RowSelection::from(selection.clone()))
            .with_batch_size(batch_rows.max(1))
            .build()
            .map_err(&bad)?,
        )
    };
    let columns = sources_of(&plans, descr, |p| {
        open_column(meta, rg, p, file.clone()).map_err(&bad)
    })?;
    Ok(Batches::new(columns, rest, selection, batch_rows))
}

/// A projected column as [`Batches::new`] takes it: a named fast decoder, or `Err(k)` for column
/// `k` of the arrow-rs reader's batches.
pub(crate) type ColumnSource = std::result::Result<(String, Box<dyn ColumnRead>), usize>;

/// Where each projected column of a batch comes from.
enum Origin {
    /// `fast[i]`
    Fast(usize, String),
    /// Column `i` of the arrow-rs reader's batch.
    Rest(usize),
}

/// Batches of one row group under a row selection: the fast columns decoded here, the others by
/// an arrow-rs reader over the same selection, both cut at the same rows.
pub(crate) struct Batches {
    from: Vec<Origin>,
    fast: Vec<Box<dyn ColumnRead>>,
    rest: Option<ParquetRecordBatchReader>,
    selection: VecDeque<RowSelector>,
    /// Selected rows not yet returned.
    left: usize,
    batch_rows: usize,
    /// Rows of the next batch when every column is decoded here.
    next_rows: usize,
}

impl Batches {
    /// Make the first batch `rows` rows (then `batch_rows` each) where every column is decoded
    /// here; arrow-rs cuts its own batches.
    pub(crate) fn with_first_batch(mut self, rows: usize) -> Self {
        self.next_rows = rows.clamp(1, self.batch_rows.max(1));
        self
    }

    /// `columns[i]` names where projected column `i` comes from: `Ok((name, decoder))` or
    /// `Err(k)` for column `k` of `rest`'s batches (which must be `Some` if any is).
    pub(crate) fn new(
        columns: Vec<ColumnSource>,
        rest: Option<ParquetRecordBatchReader>,
        selection: Vec<RowSelector>,
        batch_rows: usize,
    ) -> Self {
        let mut fast = Vec::new();
        let from = columns
            .into_iter()
            .map(|c| match c {
                Ok((name, col)) => {
                    fast.push(col);
                    Origin::Fast(fast.len() - 1, name)
                }
                Err(k) => Origin::Rest(k),
            })
            .collect();
        // Adjacent selectors of a kind merged (as RowSelection does): a skip is then passed over
        // in one go, never stopping inside a page no selected row needs (and nobody fetched).
        let mut merged: VecDeque<RowSelector> = VecDeque::new();
        for s in selection.into_iter().filter(|s| s.row_count > 0) {
            match merged.back_mut() {
                Some(last) if last.skip == s.skip => last.row_count += s.row_count,
                _ => merged.push_back(s),
            }
        }
        let left = merged.iter().filter(|s| !s.skip).map(|s| s.row_count).sum();
        Batches {
            from,
            fast,
            rest,
            selection: merged,
            left,
            batch_rows: batch_rows.max(1),
            next_rows: batch_rows.max(1),
        }
    }

    /// The next batch as (rows, projected columns); `None` when the selection is done.
    pub(crate) fn next_batch(&mut self) -> Result<Option<(usize, Vec<ArrayRef>)>> {
        let rest = match self.rest.as_mut() {
            Some(r) => match r.next() {
                Some(b) => Some(b?),
                None if self.fast.is_empty() || self.left == 0 => return Ok(None),
                None => {
                    return Err(ParquetError::General(format!(
                        "arrow-rs columns ended {} rows early",
                        self.left
                    )))
                }
            },
            None => None,
        };
        let n = match &rest {
            Some(b) => b.num_rows(),
            None => self
                .left
                .min(std::mem::replace(&mut self.next_rows, self.batch_rows)),
        };
        if n == 0 {
            return Ok(None);
        }
        if !self.fast.is_empty() {
            if n > self.left {
                return Err(ParquetError::General(format!(
                    "{n} rows in a batch where {} were left",
                    self.left
                )));
            }
            self.advance(n)?;
            self.left -= n;
        }
        let mut out = Vec::with_capacity(self.from.len());
        for f in &self.from {
            out.push(match f {
                Origin::Fast(i, name) => self.fast[*i].finish().map_err(|e| in_column(name, e))?,
                Origin::Rest(k) => rest
                    .as_ref()
                    .map(|b| b.column(*k).clone())
                    .ok_or_else(|| ParquetError::General("no arrow-rs batch".into()))?,
            });
        }
        Ok(Some((n, out)))
    }

    /// Move the fast columns over the next `n` selected rows (and the skips before them).
    fn advance(&mut self, mut n: usize) -> Result<()> {
        while n > 0 {
            let s = self
                .selection
                .front_mut()
                .ok_or_else(|| ParquetError::General("row selection exhausted".into()))?;
            let t = if s.skip {
                s.row_count
            } else {
                s.row_count.min(n)
            };
            for (f, col) in self.from.iter().filter_map(|f| match f {
                Origin::Fast(i, name) => Some((name, *i)),
                Origin::Rest(_) => None,
            }) {
                let c = &mut self.fast[col];
                if s.skip { c.skip(t) } else { c.read(t) }.map_err(|e| in_column(f, e))?;
            }
            if !s.skip {
                n -= t;
            }
            s.row_count -= t;
            if s.row_count == 0 {
                self.selection.pop_front();
            }
        }
        Ok(())
    }
}

fn in_column(name: &str, e: ParquetError) -> ParquetError {
    ParquetError::General(format!("column {name:?}: {e}"))
}

/// Whether root column `root` needs its UTF-8 checked after decoding: it holds utf8 data somewhere
/// and some BYTE_ARRAY leaf of it is not annotated UTF8 (arrow-rs validates exactly those that are,
/// so e.g. JSON columns read as utf8 pass unchecked).
pub(crate) fn needs_utf8_check(meta: &ArrowReaderMetadata, root: usize) -> bool {
    fn has_utf8(t: &DataType) -> bool {
        match t {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => true,
            DataType::List(f)
            | DataType::LargeList(f)
            | DataType::ListView(f)
            | DataType::LargeListView(f)
            | DataType::FixedSizeList(f, _)
            | DataType::Map(f, _) => has_utf8(f.data_type()),
            DataType::Struct(fs) => fs.iter().any(|f| has_utf8(f.data_type())),
            DataType::Union(fs, _) => fs.iter().any(|(_, f)| has_utf8(f.data_type())),
            DataType::Dictionary(_, v) => has_utf8(v),
            DataType::RunEndEncoded(_, v) => has_utf8(v.data_type()),
            _ => false,
        }
    }
    let Some(field) = meta.schema().fields().get(root) else {
        return true;
    };
    if !has_utf8(field.data_type()) {
        return false;
    }
    let descr = meta.parquet_schema();
    (0..descr.num_columns())
        .filter(|&c| descr.get_column_root_idx(c) == root)
        .any(|c| {
            let col = descr.column(c);
            col.physical_type() == parquet::basic::Type::BYTE_ARRAY
                && col.converted_type() != ConvertedType::UTF8
        })
}

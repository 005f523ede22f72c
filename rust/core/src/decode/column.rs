//! One leaf column of one row group: pages in, arrow arrays out.
//!
//! A flat column (no repetition) or a single list of primitives: the offsets, the validity bitmaps
//! and the values are built straight from the definition/repetition level runs. A run of levels
//! that are all "value present" (the usual case: no nulls) costs one step however long it is;
//! bitmaps are only created once a null turns up; a batch's buffers are sized from the last one.

use std::marker::PhantomData;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, GenericListArray, OffsetSizeTrait, PrimitiveArray};
use arrow_buffer::{BooleanBufferBuilder, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::FieldRef;
use bytes::Bytes;
use parquet::basic::Encoding;
use parquet::column::page::{Page, PageReader};
use parquet::errors::{ParquetError, Result};

use super::rle::{Rle, Run};
use super::values::{dictionary, Kind, Native, Source};

fn err(msg: impl Into<String>) -> ParquetError {
    ParquetError::General(msg.into())
}

/// How a leaf's levels map to arrow: see [`super::plan_root`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub max_def: i16,
    /// 0 (a flat column) or 1 (one list).
    pub max_rep: i16,
    /// Lists only: a definition level `>= list_def` is a list that is not null.
    pub list_def: i16,
    /// Lists only: a definition level `>= slot_def` is an item (null or not).
    pub slot_def: i16,
    /// Lists only: the list's item field and whether offsets are 64-bit.
    pub item: Option<(FieldRef, bool)>,
}

/// The operations the row group reader needs from a column, whatever its value type.
pub(crate) trait ColumnRead: Send {
    /// Decode the next `rows` rows into the batch being built.
    fn read(&mut self, rows: usize) -> Result<()>;
    /// Pass over the next `rows` rows (whole pages without decoding them where possible).
    fn skip(&mut self, rows: usize) -> Result<()>;
    /// The rows read since the last call, as one array.
    fn finish(&mut self) -> Result<ArrayRef>;
}

struct PageCursor {
    rep: Option<Rle>,
    def: Option<Rle>,
    /// Levels (or, without levels, values) left in the page.
    levels: usize,
    values: Source,
    /// No level of this page consumed yet: the next one must start a row.
    fresh: bool,
}

pub(crate) struct Column<K: Kind> {
    shape: Shape,
    pages: Box<dyn PageReader>,
    /// The dictionary page's entries (PLAIN bytes).
    dict: Option<Bytes>,
    page: Option<PageCursor>,
    values: Vec<Native<K>>,
    item_nulls: Option<BooleanBufferBuilder>,
    /// Lists: the first slot of each row read into this batch.
    starts: Vec<usize>,
    list_nulls: Option<BooleanBufferBuilder>,
    /// Values and rows in the last finished batch, and rows read into the current one: the
    /// next batch reserves as many values per row (see `read`).
    last_len: usize,
    last_rows: usize,
    batch_rows: usize,
    /// Pages may end inside a row (no offset index says otherwise: data page v1 writers such as
    /// parquet-cpp without a page index cut pages by level count).
    split: bool,
    /// Lists: a row has started and not yet been seen to end, so with `split` the next page may
    /// continue it.
    in_row: bool,
    _kind: PhantomData<K>,
}

impl<K: Kind> Column<K> {
    /// `split`: pages may end inside a row (see the field).
    pub(crate) fn new(shape: Shape, pages: Box<dyn PageReader>, split: bool) -> Self {
        Column {
            shape,
            pages,
            dict: None,
            page: None,
            values: Vec::new(),
            item_nulls: None,
            starts: Vec::new(),
            list_nulls: None,
            last_len: 0,
            last_rows: 0,
            batch_rows: 0,
            split,
            in_row: false,
            _kind: PhantomData,
        }
    }

    /// Load the next data page (reading a dictionary page on the way). `false`: no pages left.
    /// Whole pages inside the next `skip` rows are passed over undecoded (and taken off `skip`);
    /// if that covers them all, no page is loaded.
    fn next_page(&mut self, skip: &mut usize) -> Result<bool> {
        loop {
            if *skip > 0 {
                if let Some(m) = self.pages.peek_next_page()? {
                    // A v1 page header has no row count; without repetition its levels are rows
                    // (arrow-rs skips by the same rule). A v2 page starts a row (the spec).
                    let rows = m
                        .num_rows
                        .or(m.num_levels.filter(|_| self.shape.max_rep == 0));
                    if let Some(rows) = rows.filter(|&r| !m.is_dict && r <= *skip) {
                        self.pages.skip_next_page()?;
                        self.in_row = false;
                        *skip -= rows;
                        if *skip == 0 {
                            return Ok(true);
                        }
                        continue;
                    }
                }
            }
            let page = match self.pages.get_next_page()? {
                Some(p) => p,
                None => return Ok(false),
            };
            let s = &self.shape;
            let (buf, num_values, encoding, rep, def) = match page {
                Page::DictionaryPage {
                    buf,
                    num_values,
                    encoding,
                    ..
                } => {
                    if !matches!(encoding, Encoding::PLAIN | Encoding::PLAIN_DICTIONARY) {
                        return Err(err(format!("dictionary page encoded as {encoding}")));
                    }
                    self.dict = Some(dictionary::<K>(buf, num_values as usize)?);
                    continue;
                }
                Page::DataPage {
                    buf,
                    num_values,
                    encoding,
                    def_level_encoding,
                    rep_level_encoding,
                    ..
                } => {
                    let mut rest = buf;
                    let rep = (s.max_rep > 0)
                        .then(|| v1_levels(&mut rest, rep_level_encoding, s.max_rep))
                        .transpose()?;
                    let def = (s.max_def > 0)
                        .then(|| v1_levels(&mut rest, def_level_encoding, s.max_def))
                        .transpose()?;
                    (rest, num_values, encoding, rep, def)
                }
                Page::DataPageV2 {
                    buf,
                    num_values,
                    encoding,
                    def_levels_byte_len,
                    rep_levels_byte_len,
                    ..
                } => {
                    let (r, d) = (rep_levels_byte_len as usize, def_levels_byte_len as usize);
                    if r + d > buf.len() {
                        return Err(err("page levels longer than the page"));
                    }
                    let rep = (s.max_rep > 0)
                        .then(|| Rle::new(buf.slice(..r), bit_width(s.max_rep)))
                        .transpose()?;
                    let def = (s.max_def > 0)
                        .then(|| Rle::new(buf.slice(r..r + d), bit_width(s.max_def)))
                        .transpose()?;
                    (buf.slice(r + d..), num_values, encoding, rep, def)
                }
            };
            let values = match encoding {
                Encoding::PLAIN => Source::Plain { data: buf, pos: 0 },
                Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY => {
                    if self.dict.is_none() {
                        return Err(err("dictionary-encoded page without a dictionary page"));
                    }
                    match buf.first() {
                        Some(&w) => Source::Dict(Box::new(Rle::new(buf.slice(1..), u32::from(w))?)),
                        None => Source::Dict(Box::new(Rle::new(buf, 0)?)),
                    }
                }
                e => return Err(err(format!("page values encoded as {e}"))),
            };
            self.page = Some(PageCursor {
                rep,
                def,
                levels: num_values as usize,
                values,
                fresh: !(self.split && self.in_row),
            });
            return Ok(true);
        }
    }

    /// Read (`KEEP`) or skip `rows` rows.
    fn rows<const KEEP: bool>(&mut self, mut rows: usize) -> Result<()> {
        loop {
            if self.page.as_ref().is_none_or(|p| p.levels == 0) {
                // With an offset index pages start at row boundaries, so a finished page
                // finishes its last row; otherwise the next page may continue it.
                if rows == 0 && !(self.split && self.in_row) {
                    return Ok(());
                }
                let mut skippable = if KEEP { 0 } else { rows };
                let loaded = self.next_page(&mut skippable)?;
                if !KEEP {
                    rows = skippable;
                    if rows == 0 && !(self.split && self.in_row) {
                        return Ok(());
                    }
                }
                if !loaded {
                    if rows == 0 {
                        return Ok(());
                    }
                    return Err(err(format!("column ended {rows} rows early")));
                }
            }
            let done = if self.shape.max_rep == 0 {
                self.flat::<KEEP>(&mut rows)?
            } else {
                self.list::<KEEP>(&mut rows)?
            };
            if done {
                return Ok(());
            }
        }
    }

    /// Flat column: every level is a row. `true` once `rows` rows are done.
    fn flat<const KEEP: bool>(&mut self, rows: &mut usize) -> Result<bool> {
        let max = self.shape.max_def;
        let Column {
            page,
            dict,
            values,
            item_nulls,
            ..
        } = self;
        let p = page.as_mut().expect("a page is loaded");
        let dict: &[u8] = dict.as_deref().unwrap_or(&[]);
        let mut pending = 0usize;
        while p.levels > 0 && *rows > 0 {
            let limit = p.levels.min(*rows);
            let m = match p.def.as_mut() {
                None => {
                    pending += limit;
                    limit
                }
                Some(def) => match def
                    .peek(max as u32)?
                    .ok_or_else(|| levels_missing(p.levels))?
                {
                    Run::Repeat(d, n) => {
                        let m = n.min(limit);
                        if d == max as u32 {
                            pending += m;
                        } else if KEEP {
                            flush::<K, KEEP>(
                                &mut p.values,
                                dict,
                                &mut pending,
                                values,
                                item_nulls,
                            )?;
                            push_nulls::<K>(m, values, item_nulls);
                        }
                        def.consume(m);
                        m
                    }
                    Run::Literal(s) => {
                        let m = s.len().min(limit);
                        for &d in &s[..m] {
                            if d == max as u32 {
                                pending += 1;
                            } else if KEEP {
                                flush::<K, KEEP>(
                                    &mut p.values,
                                    dict,
                                    &mut pending,
                                    values,
                                    item_nulls,
                                )?;
                                push_nulls::<K>(1, values, item_nulls);
                            }
                        }
                        def.consume(m);
                        m
                    }
                },
            };
            p.levels -= m;
            *rows -= m;
        }
        flush::<K, KEEP>(&mut p.values, dict, &mut pending, values, item_nulls)?;
        Ok(*rows == 0)
    }

    /// List column: a level with repetition 0 starts a row; stop before one once `rows` rows
    /// have started (`true`), or at the end of the page (`false`).
    fn list<const KEEP: bool>(&mut self, rows: &mut usize) -> Result<bool> {
        let (max, list_def, slot_def) = (
            self.shape.max_def as u32,
            self.shape.list_def as u32,
            self.shape.slot_def as u32,
        );
        let Column {
            page,
            dict,
            values,
            item_nulls,
            starts,
            list_nulls,
            in_row,
            ..
        } = self;
        let p = page.as_mut().expect("a page is loaded");
        let dict: &[u8] = dict.as_deref().unwrap_or(&[]);
        let PageCursor {
            rep,
            def,
            levels,
            values: source,
            fresh,
        } = p;
        let (rep, def) = (
            rep.as_mut().expect("lists have repetition levels"),
            def.as_mut().expect("lists have definition levels"),
        );
        let mut pending = 0usize;
        let mut done = false;
        while *levels > 0 && !done {
            let left = *levels;
            let r_run = rep.peek(1)?.ok_or_else(|| levels_missing(left))?;
            let d_run = def.peek(max)?.ok_or_else(|| levels_missing(left))?;
            let m = match (&r_run, &d_run) {
                // Inside a row with every level the same: a stretch of items, all present (the
                // common case) or all null.
                (Run::Repeat(1, a), Run::Repeat(d, b)) if !*fresh => {
                    let m = (*a).min(*b).min(left);
                    if *d == max {
                        pending += m;
                    } else if *d >= slot_def {
                        if KEEP {
                            flush::<K, KEEP>(source, dict, &mut pending, values, item_nulls)?;
                            push_nulls::<K>(m, values, item_nulls);
                        }
                    } else {
                        return Err(err("an empty or null list continues a row"));
                    }
                    m
                }
                _ => {
                    let m = r_run.len().min(d_run.len()).min(left);
                    let mut i = 0;
                    while i < m {
                        let (r, d) = (r_run.at(i), d_run.at(i));
                        if r == 0 {
                            if *rows == 0 {
                                done = true;
                                break;
                            }
                            *rows -= 1;
                            *in_row = true;
                            if KEEP {
                                starts.push(values.len() + pending);
                                let valid = d >= list_def;
                                match list_nulls.as_mut() {
                                    Some(b) => b.append(valid),
                                    None if !valid => {
                                        let mut b = BooleanBufferBuilder::new(starts.capacity());
                                        b.append_n(starts.len() - 1, true);
                                        b.append(false);
                                        *list_nulls = Some(b);
                                    }
                                    None => {}
                                }
                            }
                        } else if *fresh {
                            return Err(err("a page starts inside a row"));
                        } else if d < slot_def {
                            return Err(err("an empty or null list continues a row"));
                        }
                        *fresh = false;
                        if d == max {
                            pending += 1;
                        } else if d >= slot_def && KEEP {
                            flush::<K, KEEP>(source, dict, &mut pending, values, item_nulls)?;
                            push_nulls::<K>(1, values, item_nulls);
                        }
                        i += 1;
                    }
                    i
                }
            };
            rep.consume(m);
            def.consume(m);
            *levels -= m;
            if m > 0 {
                *fresh = false;
            }
        }
        flush::<K, KEEP>(source, dict, &mut pending, values, item_nulls)?;
        Ok(done)
    }
}

trait RunExt {
    fn len(&self) -> usize;
    fn at(&self, i: usize) -> u32;
}

impl RunExt for Run<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        match self {
            Run::Repeat(_, n) => *n,
            Run::Literal(s) => s.len(),
        }
    }
    #[inline(always)]
    fn at(&self, i: usize) -> u32 {
        match self {
            Run::Repeat(v, _) => *v,
            Run::Literal(s) => s[i],
        }
    }
}

/// Decode (or skip) the `pending` present values counted so far.
#[inline]
fn flush<K: Kind, const KEEP: bool>(
    source: &mut Source,
    dict: &[u8],
    pending: &mut usize,
    values: &mut Vec<Native<K>>,
    item_nulls: &mut Option<BooleanBufferBuilder>,
) -> Result<()> {
    let n = std::mem::take(pending);
    if n == 0 {
        return Ok(());
    }
    if !KEEP {
        return source.skip::<K>(n);
    }
    source.read::<K>(n, dict, values)?;
    if let Some(b) = item_nulls.as_mut() {
        b.append_n(n, true);
    }
    Ok(())
}

/// Values to reserve for a batch starting with a read of `rows` rows, after a batch of
/// `last_len` values in `last_rows` rows: as many values per row, 1/32 more (a batch of longer
/// lists or more rows than the last grew its Vec by reallocation, copying what it held: ~1x a
/// list column's values per pass, and the page faults of the new block), which stays under
/// `finish`'s 1/16 slack so its shrink rarely runs. At most 4x the last batch's values: a
/// batch of a few long rows does not size one of many rows (past that the Vec grows).
fn reserve_for(last_len: usize, last_rows: usize, rows: usize) -> usize {
    if last_rows == 0 {
        return last_len;
    }
    let per_row = last_len as f64 / last_rows as f64;
    let want = (per_row * rows as f64 * (1.0 + 1.0 / 32.0)) as usize + 16;
    want.min(last_len.saturating_mul(4)).max(16)
}

/// `n` null slots (default values under a cleared validity bit).
fn push_nulls<K: Kind>(
    n: usize,
    values: &mut Vec<Native<K>>,
    item_nulls: &mut Option<BooleanBufferBuilder>,
) {
    let b = item_nulls.get_or_insert_with(|| {
        let mut b = BooleanBufferBuilder::new(values.capacity().max(values.len() + n));
        b.append_n(values.len(), true);
        b
    });
    b.append_n(n, false);
    values.extend(std::iter::repeat_n(Native::<K>::default(), n));
}

fn levels_missing(n: usize) -> ParquetError {
    err(format!("page ended {n} levels early"))
}

fn bit_width(max: i16) -> u32 {
    16 - (max as u16).leading_zeros()
}

/// A v1 page's level section: 4-byte length, then RLE data.
fn v1_levels(rest: &mut bytes::Bytes, encoding: Encoding, max: i16) -> Result<Rle> {
    if encoding != Encoding::RLE {
        return Err(err(format!("levels encoded as {encoding}")));
    }
    let len = rest
        .get(..4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
        .ok_or_else(|| err("page levels cut off"))?;
    if 4 + len > rest.len() {
        return Err(err("page levels longer than the page"));
    }
    let data = rest.slice(4..4 + len);
    *rest = rest.slice(4 + len..);
    Rle::new(data, bit_width(max))
}

impl<K: Kind> ColumnRead for Column<K> {
    fn read(&mut self, rows: usize) -> Result<()> {
        if self.values.capacity() == 0 && self.last_len > 0 {
            self.values
                .reserve(reserve_for(self.last_len, self.last_rows, rows));
        }
        self.batch_rows += rows;
        self.rows::<true>(rows)
    }

    fn skip(&mut self, rows: usize) -> Result<()> {
        self.rows::<false>(rows)
    }

    fn finish(&mut self) -> Result<ArrayRef> {
        let mut values = std::mem::take(&mut self.values);
        self.last_len = values.len();
        self.last_rows = std::mem::take(&mut self.batch_rows);
        // A batch outlives this call (a shuffle buffer keeps batches for their last rows): hand
        // over what it holds, not the up-to-doubled capacity of a grown Vec (a shrinking
        // realloc, in place).
        if values.capacity() - values.len() > values.len() / 16 {
            values.shrink_to_fit();
        }
        let nulls = self
            .item_nulls
            .take()
            .map(|mut b| NullBuffer::new(b.finish()));
        let child = PrimitiveArray::<K::Arrow>::try_new(ScalarBuffer::from(values), nulls)?;
        let Some((item, large)) = self.shape.item.clone() else {
            return Ok(Arc::new(child));
        };
        let starts = std::mem::take(&mut self.starts);
        let list_nulls = self
            .list_nulls
            .take()
            .map(|mut b| NullBuffer::new(b.finish()));
        if large {
            list_array::<i64>(item, starts, child, list_nulls)
        } else {
            list_array::<i32>(item, starts, child, list_nulls)
        }
    }
}

fn list_array<O: OffsetSizeTrait>(
    item: FieldRef,
    starts: Vec<usize>,
    child: impl Array + 'static,
    nulls: Option<NullBuffer>,
) -> Result<ArrayRef> {
    let end = child.len();
    let too_long = || err(format!("{end} list items do not fit the offsets"));
    let mut offsets = Vec::with_capacity(starts.len() + 1);
    for s in starts.into_iter().chain([end]) {
        offsets.push(O::from_usize(s).ok_or_else(too_long)?);
    }
    // Offsets grow by construction; `new` re-checks it in one pass over the rows.
    let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
    Ok(Arc::new(GenericListArray::<O>::try_new(
        item,
        offsets,
        Arc::new(child),
        nulls,
    )?))
}

#[cfg(test)]
mod tests {
    use super::reserve_for;

    /// A batch reserves the last batch's values per row for its rows, with a margin under
    /// `finish`'s shrink threshold, capped at 4x the last batch.
    #[test]
    fn reserve_follows_the_values_per_row_of_the_last_batch() {
        // same rows: the last count and a little more, under 1/16 of it
        let r = reserve_for(300_000, 2048, 2048);
        assert!((300_001..300_000 + 300_000 / 16).contains(&r), "{r}");
        // a short batch (a row group's end) before a whole one: sized for the whole one
        let r = reserve_for(100_000, 1000, 2048);
        assert!((204_800..204_800 + 204_800 / 16).contains(&r), "{r}");
        // many more rows than the last batch: at most 4x its values
        assert_eq!(reserve_for(1_000, 10, 16_384), 4_000);
        // nothing known of the rows (a batch of skips only): the last count
        assert_eq!(reserve_for(5_000, 0, 2048), 5_000);
        assert_eq!(reserve_for(0, 10, 2048), 16);
    }
}

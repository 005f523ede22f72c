//! Token packing: a slot's documents (rows of a `list<int>` column) packed into rows of exactly
//! `seq_len` tokens.
//!
//! The packer is a queue of pending documents, each a token range of one row (`DocRef`: row id,
//! start, end). It takes documents in stream order and emits rows; which row comes next depends
//! only on the queue (never on how many rows were read at once), so a state holding the queue as
//! references (`state/pack.rs`) and the stream's position resumes exactly: the pending rows are
//! read again (`reader::read_rows`) and the queue rebuilt.
//!
//! - `concat`: documents concatenated and cut every `seq_len` tokens (a document may span rows;
//!   only the last row of a pass is padded).
//! - `best_fit`: each row is filled from a window of the first `buffer_docs` queued documents,
//!   taking the longest document that still fits (ties: the earliest) until none fits; a document
//!   of at most `seq_len` tokens is never split. Longer ones follow `long_docs`: `split` (the
//!   earliest such document in the window fills a whole row at the start of each row, its last
//!   part then packs like any document), `truncate` (first `seq_len` tokens), `drop`.

use std::collections::VecDeque;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{
    Array, FixedSizeListArray, GenericListArray, Int32Array, Int64Array, OffsetSizeTrait,
    RecordBatch,
};
use arrow_buffer::ScalarBuffer;
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
pub use crate::state::pack::{DocRef, PackRecord};

/// Label of a token with no target (document boundary, padding), as torch's `ignore_index`.
pub const IGNORE: i64 = -100;

/// Largest `seq_len` (a packed row is allocated whole).
pub const MAX_SEQ_LEN: u64 = 1 << 24;
/// Largest `buffer_docs`.
pub const MAX_BUFFER_DOCS: u64 = 1 << 16;

/// The per-token source column of rows packed after a mixture.
pub const SOURCE_IDS: &str = "source_ids";

/// Tokens a call of [`Packer::emit`] reserves room for before it makes its rows (8 MiB for an
/// `i64` column): the first 64 rows at the usual sequence lengths (up to 16,384 tokens).
const PREALLOC_TOKENS: usize = 1 << 20;

/// Rows the packer reads from its stream at a time.
const PULL_ROWS: usize = 64;

/// Most packed rows allocated at once for one item.
const MAX_ITEM_ROWS: u64 = 1 << 20;

/// Packed rows per item: `batch_size` (one in row mode), refused past [`MAX_ITEM_ROWS`] before
/// anything is allocated for them.
pub fn item_rows(batch_size: Option<u64>) -> Result<usize> {
    let n = batch_size.unwrap_or(1);
    if n > MAX_ITEM_ROWS {
        return Err(Error::Config(format!(
            "with packing, batch_size is at most {MAX_ITEM_ROWS} packed rows, got {n}"
        )));
    }
    Ok(n as usize)
}

/// The packer's settings; a saved state records them (`state['settings']['pack']`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackSettings {
    pub column: String,
    pub seq_len: u64,
    /// `"concat"` or `"best_fit"`.
    pub algorithm: String,
    pub buffer_docs: u64,
    /// `"split"`, `"truncate"` or `"drop"`.
    pub long_docs: String,
    pub bos_id: Option<i64>,
    pub eos_id: Option<i64>,
    pub pad_id: i64,
    /// Labels are next-token targets (`True`) or the input ids for a model that shifts.
    pub shift_labels: bool,
}

impl PackSettings {
    /// Checked settings from their record (the Python arguments); errors name the argument.
    pub fn parse(v: serde_json::Value) -> Result<PackSettings> {
        let s: PackSettings =
            serde_json::from_value(v).map_err(|e| Error::Config(format!("pack settings: {e}")))?;
        if !(1..=MAX_SEQ_LEN).contains(&s.seq_len) {
            return Err(Error::Config(format!(
                "Pack seq_len must be an int in [1, {MAX_SEQ_LEN}], got {}",
                s.seq_len
            )));
        }
        if !matches!(s.algorithm.as_str(), "concat" | "best_fit") {
            return Err(Error::Config(format!(
                "Pack algorithm must be 'concat' or 'best_fit', got {:?}",
                s.algorithm
            )));
        }
        if !(1..=MAX_BUFFER_DOCS).contains(&s.buffer_docs) {
            return Err(Error::Config(format!(
                "Pack buffer_docs must be an int in [1, {MAX_BUFFER_DOCS}], got {}",
                s.buffer_docs
            )));
        }
        if !matches!(s.long_docs.as_str(), "split" | "truncate" | "drop") {
            return Err(Error::Config(format!(
                "Pack long_docs must be 'split', 'truncate' or 'drop', got {:?}",
                s.long_docs
            )));
        }
        Ok(s)
    }

    fn best_fit(&self) -> bool {
        self.algorithm == "best_fit"
    }

    /// The packed rows' schema: `[seq_len]` lists of int64 (`segment_ids` int32).
    pub fn schema(&self) -> SchemaRef {
        let col = |name: &str, t: DataType| {
            Field::new(
                name,
                DataType::FixedSizeList(Arc::new(Field::new("item", t, false)), self.len_i32()),
                false,
            )
        };
        Arc::new(Schema::new(vec![
            col("input_ids", DataType::Int64),
            col("labels", DataType::Int64),
            col("position_ids", DataType::Int64),
            col("segment_ids", DataType::Int32),
        ]))
    }

    /// The packed rows' schema after a mixture: also `source_ids` (int32: each token's source
    /// index in the mixture's name order, -1 on padding). int32, not a narrower type, because
    /// NCCL and gloo have no int16: accelerate's dispatch broadcasts every tensor of a batch.
    pub fn schema_with_sources(&self) -> SchemaRef {
        let mut fields: Vec<Field> = self
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.push(Field::new(
            SOURCE_IDS,
            DataType::FixedSizeList(
                Arc::new(Field::new("item", DataType::Int32, false)),
                self.len_i32(),
            ),
            false,
        ));
        Arc::new(Schema::new(fields))
    }

    fn len_i32(&self) -> i32 {
        self.seq_len as i32 // at most MAX_SEQ_LEN
    }
}

/// A document's tokens (cheap to clone: shared).
type Tokens = ScalarBuffer<i64>;

/// A pending document with its tokens (BOS/EOS included): `toks[start..end]` is still to pack.
#[derive(Debug, Clone)]
struct Doc {
    /// The source (index in a mixture's name order; 0 for a single stream).
    source: u16,
    row: u64,
    toks: Tokens,
    start: usize,
    end: usize,
}

impl Doc {
    fn len(&self) -> usize {
        self.end - self.start
    }
}

/// Rows being built.
struct Rows {
    seq_len: usize,
    shift: bool,
    pad: i64,
    ids: Vec<i64>,
    labels: Vec<i64>,
    pos: Vec<i64>,
    seg: Vec<i32>,
    /// Each token's source (-1 on padding), when packing after a mixture.
    src: Option<Vec<i32>>,
    /// Tokens in the current row, segments in it.
    fill: usize,
    segs: i32,
}

impl Rows {
    fn push_segment(&mut self, toks: &[i64], source: u16) {
        if let Some(src) = &mut self.src {
            src.extend(std::iter::repeat_n(i32::from(source), toks.len()));
        }
        self.segs += 1;
        self.ids.extend_from_slice(toks);
        if self.shift {
            self.labels.extend_from_slice(&toks[1..]);
            self.labels.push(IGNORE);
        } else {
            self.labels.push(IGNORE);
            self.labels.extend_from_slice(&toks[1..]);
        }
        self.pos.extend(0..toks.len() as i64);
        self.seg.extend(std::iter::repeat_n(self.segs, toks.len()));
        self.fill += toks.len();
    }

    fn end_row(&mut self) {
        let pad = self.seq_len - self.fill;
        self.ids.extend(std::iter::repeat_n(self.pad, pad));
        self.labels.extend(std::iter::repeat_n(IGNORE, pad));
        self.pos.extend(std::iter::repeat_n(0, pad));
        self.seg.extend(std::iter::repeat_n(0, pad));
        if let Some(src) = &mut self.src {
            src.extend(std::iter::repeat_n(-1, pad));
        }
        self.fill = 0;
        self.segs = 0;
    }
}

/// The packer of one slot.
#[derive(Debug, Clone)]
pub struct Packer {
    cfg: PackSettings,
    /// Index of the token column in the stream's batches.
    column: usize,
    queue: VecDeque<Doc>,
    /// References loaded from a state (with their source), read on first use (`hydrate`).
    unread: Option<Vec<(u16, DocRef)>>,
    /// Emit a per-token source column (`source_ids`, packing after a mixture).
    sources: bool,
}

impl Packer {
    /// A packer over column `cfg.column` of batches of `schema`, empty or with pending
    /// references from a state.
    pub fn new(cfg: PackSettings, schema: &Schema, pending: Option<Vec<DocRef>>) -> Result<Self> {
        let (column, field) = schema.column_with_name(&cfg.column).ok_or_else(|| {
            Error::Config(format!(
                "Pack column {:?} is not among the columns read ({}): add it to columns=",
                cfg.column,
                schema
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        let ok = match field.data_type() {
            DataType::List(f) | DataType::LargeList(f) => f.data_type().is_integer(),
            _ => false,
        };
        if !ok {
            return Err(Error::Config(format!(
                "Pack column {:?} must be a list of integers (token ids: int32, int64, uint16, \
                 uint32, ...), got {}",
                cfg.column,
                field.data_type()
            )));
        }
        Ok(Packer {
            cfg,
            column,
            queue: VecDeque::new(),
            unread: single(pending),
            sources: false,
        })
    }

    /// A packer after a mixture: documents come from several sources (each checked to have
    /// the token column), and each packed row carries a per-token source column.
    pub fn for_mixture(
        cfg: PackSettings,
        schemas: &[(&str, &Schema)],
        pending: Option<Vec<(u16, DocRef)>>,
    ) -> Result<Self> {
        let mut p = None;
        for (name, schema) in schemas {
            let q = Packer::new(cfg.clone(), schema, None)
                .map_err(|e| crate::mix::stream::in_source(name, e))?;
            p.get_or_insert(q);
        }
        let mut p = p.ok_or_else(|| Error::Config("a mixture needs a source".into()))?;
        p.unread = pending.filter(|v| !v.is_empty());
        p.sources = true;
        Ok(p)
    }

    /// Continue from another position: its pending references, read on first use.
    pub fn reset(&mut self, pending: Option<Vec<DocRef>>) {
        self.queue.clear();
        self.unread = single(pending);
    }

    pub fn settings(&self) -> &PackSettings {
        &self.cfg
    }

    /// The pending documents as references (what a state saves).
    pub fn refs(&self) -> Vec<DocRef> {
        self.refs_with_sources()
            .into_iter()
            .map(|(_, r)| r)
            .collect()
    }

    /// The pending documents as (source, reference), in queue order.
    pub fn refs_with_sources(&self) -> Vec<(u16, DocRef)> {
        if let Some(u) = &self.unread {
            return u.clone();
        }
        self.queue
            .iter()
            .map(|d| {
                let r = DocRef {
                    row: d.row,
                    start: d.start as u64,
                    end: (d.end != d.toks.len()).then_some(d.end as u64),
                };
                (d.source, r)
            })
            .collect()
    }

    /// True if references loaded from a state still have to be read (`hydrate`).
    pub fn needs_rows(&self) -> Option<Vec<u64>> {
        self.needs_rows_by_source()
            .map(|m| m.into_values().flatten().collect())
    }

    /// The rows to read again per source (sorted, unique ids), if references are still unread.
    pub fn needs_rows_by_source(&self) -> Option<std::collections::BTreeMap<u16, Vec<u64>>> {
        self.unread.as_ref().map(|u| {
            let mut m: std::collections::BTreeMap<u16, Vec<u64>> = Default::default();
            for (s, r) in u {
                m.entry(*s).or_default().push(r.row);
            }
            for ids in m.values_mut() {
                // Each row read once (`read_rows` takes unique ids) for all its references.
                ids.sort_unstable();
                ids.dedup();
            }
            m
        })
    }

    /// Rebuild the queue from the rows of `needs_rows()` (sorted ids), read as `batches`.
    pub fn hydrate(&mut self, ids: &[u64], batches: &[RecordBatch]) -> Result<()> {
        self.hydrate_sources(&[(0, ids, batches)])
    }

    /// Rebuild the queue from each source's rows of `needs_rows_by_source()`.
    pub fn hydrate_sources(&mut self, read: &[(u16, &[u64], &[RecordBatch])]) -> Result<()> {
        let Some(refs) = self.unread.take() else {
            return Ok(());
        };
        let mut by_id = std::collections::HashMap::new();
        for &(s, ids, batches) in read {
            let mut k = 0;
            for b in batches {
                for t in self.documents(b)? {
                    let id = *ids.get(k).ok_or_else(|| {
                        Error::Internal("read_rows returned more rows than asked".into())
                    })?;
                    by_id.insert((s, id), t);
                    k += 1;
                }
            }
        }
        for (i, &(source, r)) in refs.iter().enumerate() {
            let toks = by_id
                .get(&(source, r.row))
                .ok_or_else(|| Error::Internal(format!("pending row {} was not read", r.row)))?
                .clone();
            let end = r.end.unwrap_or(toks.len() as u64);
            if end > toks.len() as u64 || r.start >= end {
                return Err(Error::State(format!(
                    "state['position']['pack']: pending document {i} is tokens {}..{end} of row \
                     {}, which has {} tokens (BOS/EOS included): the state does not belong to \
                     these shards or settings",
                    r.start,
                    r.row,
                    toks.len()
                )));
            }
            self.push(Doc {
                source,
                row: r.row,
                toks,
                start: r.start as usize,
                end: end as usize,
            });
        }
        Ok(())
    }

    fn push(&mut self, d: Doc) {
        self.queue.push_back(d);
    }

    /// The token sequences (BOS/EOS added) of a batch's rows.
    fn documents(&self, b: &RecordBatch) -> Result<Vec<Tokens>> {
        let col = match b.schema().index_of(&self.cfg.column) {
            Ok(i) => b.column(i),
            Err(_) => b.column(self.column),
        };
        match col.data_type() {
            DataType::List(_) => self.documents_of(col.as_list::<i32>()),
            DataType::LargeList(_) => self.documents_of(col.as_list::<i64>()),
            t => Err(Error::Config(format!(
                "Pack column {:?} must be a list of integers, got {t}",
                self.cfg.column
            ))),
        }
    }

    /// `documents` of a list column: each row's tokens widened straight into its own buffer
    /// (no cast of the whole column: a batch is often a slice of a larger decoded one).
    fn documents_of<O: OffsetSizeTrait>(&self, list: &GenericListArray<O>) -> Result<Vec<Tokens>> {
        let values = list.values();
        let bad = |i: usize, what: &str| {
            Error::Config(format!(
                "Pack column {:?}: a row has {what} (row {i} of a batch); documents must be \
                 lists of non-null token ids that fit in int64",
                self.cfg.column
            ))
        };
        let offsets = list.value_offsets();
        let mut out = Vec::with_capacity(list.len());
        for i in 0..list.len() {
            if list.is_null(i) {
                return Err(bad(i, "a null list"));
            }
            let (a, z) = (offsets[i].as_usize(), offsets[i + 1].as_usize());
            if values.null_count() > 0 && (a..z).any(|j| values.is_null(j)) {
                return Err(bad(i, "a null (or out-of-range) token"));
            }
            let doc = match values.data_type() {
                DataType::Int8 => self.widen(&values.as_primitive::<Int8Type>().values()[a..z]),
                DataType::Int16 => self.widen(&values.as_primitive::<Int16Type>().values()[a..z]),
                DataType::Int32 => self.widen(&values.as_primitive::<Int32Type>().values()[a..z]),
                DataType::Int64 => self.widen(&values.as_primitive::<Int64Type>().values()[a..z]),
                DataType::UInt8 => self.widen(&values.as_primitive::<UInt8Type>().values()[a..z]),
                DataType::UInt16 => self.widen(&values.as_primitive::<UInt16Type>().values()[a..z]),
                DataType::UInt32 => self.widen(&values.as_primitive::<UInt32Type>().values()[a..z]),
                DataType::UInt64 => {
                    let v = &values.as_primitive::<UInt64Type>().values()[a..z];
                    if v.iter().any(|&t| t > i64::MAX as u64) {
                        return Err(bad(i, "a null (or out-of-range) token"));
                    }
                    self.widen(v)
                }
                t => {
                    return Err(Error::Config(format!(
                        "Pack column {:?} must be a list of integers, got a list of {t}",
                        self.cfg.column
                    )))
                }
            };
            out.push(doc);
        }
        Ok(out)
    }

    /// One document's tokens as int64 with BOS/EOS, in one allocation (values already checked
    /// to fit).
    fn widen<T: Copy + TryInto<i64>>(&self, v: &[T]) -> Tokens {
        let (bos, eos) = (self.cfg.bos_id, self.cfg.eos_id);
        let mut t = Vec::with_capacity(v.len() + 2);
        t.extend(bos);
        t.extend(v.iter().map(|&x| x.try_into().unwrap_or(0)));
        t.extend(eos);
        // A Vec's buffer becomes the ScalarBuffer as is (no copy, unlike `Arc<[i64]>::from`).
        ScalarBuffer::from(t)
    }

    /// Take a batch of the stream's rows (global ids `ids`) into the queue.
    pub fn take(&mut self, b: &RecordBatch, ids: &[u64]) -> Result<()> {
        if ids.len() != b.num_rows() {
            return Err(Error::Internal(format!(
                "{} row ids for {} rows",
                ids.len(),
                b.num_rows()
            )));
        }
        for (toks, &row) in self.documents(b)?.into_iter().zip(ids) {
            self.take_doc(0, row, toks);
        }
        Ok(())
    }

    /// Take a mixture's rows into the queue in mixing order: `choices[i]` is the source of
    /// the `i`-th row, `parts[s]` source `s`'s rows (in order) and their row ids.
    pub fn take_mixed(
        &mut self,
        parts: &[Option<(RecordBatch, Vec<u64>)>],
        choices: &[u16],
    ) -> Result<()> {
        let mut docs = Vec::with_capacity(parts.len());
        for p in parts {
            docs.push(match p {
                Some((b, ids)) => {
                    if ids.len() != b.num_rows() {
                        return Err(Error::Internal(format!(
                            "{} row ids for {} rows",
                            ids.len(),
                            b.num_rows()
                        )));
                    }
                    Some((self.documents(b)?.into_iter(), ids.iter()))
                }
                None => None,
            });
        }
        for &s in choices {
            let (toks, row) = docs
                .get_mut(s as usize)
                .and_then(|d| d.as_mut())
                .and_then(|(t, i)| Some((t.next()?, *i.next()?)))
                .ok_or_else(|| Error::Internal(format!("source {s} has fewer rows than chosen")))?;
            self.take_doc(s, row, toks);
        }
        Ok(())
    }

    fn take_doc(&mut self, source: u16, row: u64, toks: Tokens) {
        let seq_len = self.cfg.seq_len as usize;
        let mut end = toks.len();
        if end == 0 {
            return; // nothing to pack, nothing to remember
        }
        if end > seq_len {
            match self.cfg.long_docs.as_str() {
                "drop" => return,
                "truncate" => end = seq_len,
                _ => {} // split: concat cuts every row anyway; best_fit in `fill_best`
            }
        }
        self.push(Doc {
            source,
            row,
            toks,
            start: 0,
            end,
        });
    }

    /// True when the next row can be decided without more input (`concat` reads as it fills a
    /// row instead, so it never holds more than one read's documents).
    fn ready(&self) -> bool {
        !self.cfg.best_fit() || self.queue.len() >= self.cfg.buffer_docs as usize
    }

    /// Documents waiting in the queue (a read that adds none took only empty or dropped ones).
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Rows to read from the stream when not `ready`.
    pub fn pull_rows(&self) -> usize {
        PULL_ROWS
    }

    /// Pack up to `n` rows (fewer only at the end of input), calling `more` to take the next
    /// rows of the stream into the queue (false: no more input).
    pub fn emit(
        &mut self,
        n: usize,
        more: &mut dyn FnMut(&mut Packer) -> Result<bool>,
    ) -> Result<Option<RecordBatch>> {
        let seq_len = self.cfg.seq_len as usize;
        // Grows past this as rows are made: reserving for 64 rows of the longest seq_len up
        // front was 8 GiB a column before any token was read (an abort where the address space
        // is capped).
        let cap = (n.min(64) * seq_len).min(PREALLOC_TOKENS);
        let mut rows = Rows {
            seq_len,
            shift: self.cfg.shift_labels,
            pad: self.cfg.pad_id,
            ids: Vec::with_capacity(cap),
            labels: Vec::with_capacity(cap),
            pos: Vec::with_capacity(cap),
            seg: Vec::with_capacity(cap),
            src: self.sources.then(|| Vec::with_capacity(cap)),
            fill: 0,
            segs: 0,
        };
        let mut made = 0;
        while made < n {
            while !self.ready() {
                if !more(self)? {
                    break;
                }
            }
            let any = if self.cfg.best_fit() {
                self.fill_best(&mut rows)
            } else {
                self.fill_concat(&mut rows, more)?
            };
            if !any {
                break;
            }
            rows.end_row();
            made += 1;
        }
        if made == 0 {
            return Ok(None);
        }
        let list = |v: ArrayRefOf| -> Result<Arc<dyn Array>> {
            let (field, values): (Arc<Field>, Arc<dyn Array>) = match v {
                ArrayRefOf::I64(v) => (
                    Arc::new(Field::new("item", DataType::Int64, false)),
                    Arc::new(Int64Array::from(v)),
                ),
                ArrayRefOf::I32(v) => (
                    Arc::new(Field::new("item", DataType::Int32, false)),
                    Arc::new(Int32Array::from(v)),
                ),
            };
            FixedSizeListArray::try_new(field, self.cfg.len_i32(), values, None)
                .map(|a| Arc::new(a) as Arc<dyn Array>)
                .map_err(|e| Error::Internal(format!("packed rows: {e}")))
        };
        let mut cols = vec![
            list(ArrayRefOf::I64(std::mem::take(&mut rows.ids)))?,
            list(ArrayRefOf::I64(std::mem::take(&mut rows.labels)))?,
            list(ArrayRefOf::I64(std::mem::take(&mut rows.pos)))?,
            list(ArrayRefOf::I32(std::mem::take(&mut rows.seg)))?,
        ];
        let schema = match rows.src.take() {
            Some(src) => {
                cols.push(list(ArrayRefOf::I32(src))?);
                self.cfg.schema_with_sources()
            }
            None => self.cfg.schema(),
        };
        RecordBatch::try_new(schema, cols)
            .map(Some)
            .map_err(|e| Error::Internal(format!("packed rows: {e}")))
    }

    /// One `concat` row, reading more when the queue runs dry; false if nothing is left.
    fn fill_concat(
        &mut self,
        rows: &mut Rows,
        more: &mut dyn FnMut(&mut Packer) -> Result<bool>,
    ) -> Result<bool> {
        while rows.fill < rows.seq_len {
            if self.queue.is_empty() && !more(self)? {
                break;
            }
            let Some(d) = self.queue.front_mut() else {
                continue; // a read of empty (or dropped) documents only
            };
            let take = (rows.seq_len - rows.fill).min(d.len());
            rows.push_segment(&d.toks[d.start..d.start + take], d.source);
            d.start += take;
            if d.start == d.end {
                self.queue.pop_front();
            }
        }
        Ok(rows.fill > 0)
    }

    /// One `best_fit` row; false if nothing is pending.
    fn fill_best(&mut self, rows: &mut Rows) -> bool {
        let window = (self.cfg.buffer_docs as usize).min(self.queue.len());
        let seq_len = rows.seq_len;
        // A document longer than a row (long_docs="split") fills whole rows first.
        if let Some(i) = (0..window).find(|&i| self.queue[i].len() > seq_len) {
            let d = &mut self.queue[i];
            rows.push_segment(&d.toks[d.start..d.start + seq_len], d.source);
            d.start += seq_len;
            return true;
        }
        // The window is fixed when the row starts (not refilled as documents leave it), so
        // rows depend on the document order alone, not on how many rows were read at once.
        let mut window = window;
        loop {
            let room = seq_len - rows.fill;
            let mut best: Option<(usize, usize)> = None;
            for i in 0..window {
                let l = self.queue[i].len();
                if l <= room && best.is_none_or(|(_, b)| l > b) {
                    best = Some((i, l));
                    if l == room {
                        break;
                    }
                }
            }
            let Some((i, _)) = best else {
                break;
            };
            let d = self.queue.remove(i).expect("in the window");
            window -= 1;
            rows.push_segment(&d.toks[d.start..d.end], d.source);
            if rows.fill == seq_len {
                break;
            }
        }
        rows.fill > 0
    }
}

/// A single stream's pending references (all from source 0); `None` if there are none.
fn single(pending: Option<Vec<DocRef>>) -> Option<Vec<(u16, DocRef)>> {
    pending
        .filter(|p| !p.is_empty())
        .map(|p| p.into_iter().map(|r| (0, r)).collect())
}

enum ArrayRefOf {
    I64(Vec<i64>),
    I32(Vec<i32>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::builder::{Int32Builder, ListBuilder};

    fn cfg(algorithm: &str, seq_len: u64, buffer_docs: u64) -> PackSettings {
        PackSettings {
            column: "t".into(),
            seq_len,
            algorithm: algorithm.into(),
            buffer_docs,
            long_docs: "split".into(),
            bos_id: None,
            eos_id: None,
            pad_id: 0,
            shift_labels: true,
        }
    }

    /// Document `d` of length `len[d]` is tokens `d * 1000 + j`.
    fn batch(lens: &[usize], first: usize) -> RecordBatch {
        let mut b = ListBuilder::new(Int32Builder::new());
        for (i, &l) in lens.iter().enumerate() {
            for j in 0..l {
                b.values().append_value(((first + i) * 1000 + j) as i32);
            }
            b.append(true);
        }
        let a: Arc<dyn Array> = Arc::new(b.finish());
        RecordBatch::try_from_iter([("t", a)]).unwrap()
    }

    /// All rows of a packer fed `lens` in pulls of `pull` rows.
    fn pack_all(c: PackSettings, lens: &[usize], pull: usize) -> Vec<Vec<i64>> {
        let b = batch(lens, 0);
        let mut p = Packer::new(c, &b.schema(), None).unwrap();
        let mut at = 0;
        let mut more = |p: &mut Packer| -> Result<bool> {
            if at >= lens.len() {
                return Ok(false);
            }
            let n = pull.min(lens.len() - at);
            let ids: Vec<u64> = (at as u64..(at + n) as u64).collect();
            p.take(&b.slice(at, n), &ids)?;
            at += n;
            Ok(true)
        };
        let mut rows = Vec::new();
        while let Some(out) = p.emit(1, &mut more).unwrap() {
            let ids = out.column(0).as_fixed_size_list().values().clone();
            rows.push(ids.as_primitive::<Int64Type>().values().to_vec());
        }
        rows
    }

    #[test]
    fn rows_do_not_depend_on_how_many_rows_are_read_at_once() {
        let lens: Vec<usize> = (0..200).map(|i| 1 + (i * 37) % 60).collect();
        for c in [cfg("concat", 32, 1), cfg("best_fit", 32, 8)] {
            let a = pack_all(c.clone(), &lens, 1);
            assert_eq!(a, pack_all(c.clone(), &lens, 7));
            assert_eq!(a, pack_all(c, &lens, 64));
        }
    }

    #[test]
    fn pending_references_round_trip_and_bad_ones_are_refused() {
        let refs = vec![
            DocRef {
                row: 7,
                start: 3,
                end: None,
            },
            DocRef {
                row: 2,
                start: 0,
                end: None,
            },
            DocRef {
                row: 9,
                start: 0,
                end: Some(4),
            },
        ];
        let rec = PackRecord::of(&refs);
        assert_eq!(rec.spans, vec![[0, 3, 0], [2, 0, 4]]);
        assert_eq!(rec.refs("p").unwrap(), refs);
        let bad = |f: &dyn Fn(&mut PackRecord)| {
            let mut r = rec.clone();
            f(&mut r);
            r.refs("p").unwrap_err().to_string()
        };
        assert!(bad(&|r| r.spans[1][0] = 0).contains("increasing index"));
        assert!(bad(&|r| r.spans[1][0] = 3).contains("increasing index"));
        assert!(bad(&|r| r.spans[0] = [0, 5, 5]).contains("start < end"));
        // The same row of two epochs, both pending (a slot's epoch shorter than the window).
        let mut twice = rec.clone();
        twice.rows = ids_to_base64_for_test(&[7, 2, 7]);
        assert_eq!(twice.refs("p").unwrap()[2], DocRef { row: 7, ..refs[2] });
    }

    #[test]
    fn mixture_pack_record_round_trips_and_refuses_bad_runs() {
        use crate::state::pack::MixPackRecord;
        let r = |row, start, end| DocRef { row, start, end };
        let refs = vec![
            ("a".to_string(), r(7, 3, None)),
            ("a".to_string(), r(2, 0, None)),
            ("b".to_string(), r(7, 0, Some(4))), // the same row id in another source
        ];
        let rec = MixPackRecord::of(&refs);
        assert_eq!(rec.sources, vec![("a".into(), 2), ("b".into(), 1)]);
        assert_eq!(rec.refs("p").unwrap(), refs);
        let bad = |f: &dyn Fn(&mut MixPackRecord)| {
            let mut x = rec.clone();
            f(&mut x);
            x.refs("p").unwrap_err().to_string()
        };
        assert!(bad(&|x| x.sources[1].1 = 2).contains("cover the 3"));
        assert!(bad(&|x| x.sources.push(("c".into(), 0))).contains("positive"));
        let mut twice = rec.clone();
        twice.sources = vec![("a".into(), 3)];
        let got = twice.refs("p").unwrap();
        assert_eq!((got[2].0.as_str(), got[0].1.row, got[2].1.row), ("a", 7, 7));
    }

    fn ids_to_base64_for_test(ids: &[u64]) -> String {
        crate::state::ids_to_base64(ids)
    }
}

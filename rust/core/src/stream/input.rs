//! A slot's input: its remaining row ranges read in order, synchronously or through readahead
//! threads, and the two row sources the shuffle buffer steps over (data rows, coordinates only).

use std::sync::Arc;

use arrow_array::RecordBatch;

use super::slab::{Loc, Slab};
use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::plan::{EpochPlan, Segment, Segments, SlotSpec};
use crate::prefetch::{Pieces, Prefetcher};
use crate::reader::SegmentReader;
use crate::settings::StreamOptions;
use crate::shuffle::RowSource;

/// Rows in the first piece of a (re)started input; the pieces after it double up to
/// `piece_rows` (`Segments::with_ramp`): the first batch after a resume waits for a small fetch
/// and decode, and the readahead threads started beside it fetch small pieces too, not a whole
/// piece each.
const FIRST_PIECE_ROWS: u64 = 1024;

/// Largest piece of a remote shard whatever `piece_rows` says: a piece's pages are downloaded
/// before it decodes and every readahead thread holds one, so this bounds memory and the wait
/// for the first batch while keeping requests large (about 8 MiB for 16k rows of a few hundred
/// tokens).
const REMOTE_PIECE_ROWS: u64 = 16384;

/// Where decoded batches come from: this thread, or readahead threads started on first use.
pub(super) enum Source {
    Sync {
        segments: Pieces,
        reader: Option<SegmentReader>,
    },
    NotStarted(Pieces),
    Ahead(Prefetcher),
}

/// Sequential reader over the rest of a slot's range.
pub(super) struct Input {
    pub(super) catalog: Arc<Catalog>,
    pub(super) source: Source,
    pub(super) batch: Option<RecordBatch>,
    pub(super) first_row: u64,
    pub(super) offset: usize,
    /// Slab entry holding `batch` (shuffle path only); pinned with one extra reference.
    pub(super) pinned: Option<u32>,
    pub(super) opts: StreamOptions,
}

impl Input {
    pub(super) fn new(
        catalog: Arc<Catalog>,
        plan: &Arc<EpochPlan>,
        spec: &SlotSpec,
        cursor: u64,
        opts: &StreamOptions,
    ) -> Self {
        let ranges = spec.ranges_after(cursor);
        let piece_rows = if catalog.is_remote() {
            opts.piece_rows.min(REMOTE_PIECE_ROWS)
        } else {
            opts.piece_rows
        };
        let source = if opts.readahead_threads == 0 {
            // Pieces are fetched before they decode (reader.rs): cut like readahead pieces, so
            // the first batch after a resume waits for (and reads) a small piece, not the rest
            // of a row group. Shards without an offset index stay whole (read page by page).
            let segments =
                Segments::new(plan.clone(), ranges, piece_rows).with_ramp(FIRST_PIECE_ROWS);
            Source::Sync {
                segments: Pieces::new(catalog.clone(), segments),
                reader: None,
            }
        } else {
            Source::NotStarted(Pieces::new(
                catalog.clone(),
                Segments::new(plan.clone(), ranges, piece_rows).with_ramp(FIRST_PIECE_ROWS),
            ))
        };
        Input {
            catalog,
            source,
            batch: None,
            first_row: 0,
            offset: 0,
            pinned: None,
            opts: opts.clone(),
        }
    }

    /// True unless readahead threads were started by another process (we were forked).
    pub(super) fn owned_by_this_process(&self) -> bool {
        match &self.source {
            Source::Ahead(p) => p.owned_by_this_process(),
            _ => true,
        }
    }

    pub(super) fn next_decoded(&mut self) -> Result<Option<(u64, RecordBatch)>> {
        loop {
            match &mut self.source {
                Source::Sync { segments, reader } => {
                    if let Some(r) = reader.as_mut() {
                        if let Some(b) = r.next_batch()? {
                            return Ok(Some(b));
                        }
                    }
                    // The last piece's reader goes first: its read buffer is then the next
                    // one's (reader.rs, `Spare`).
                    *reader = None;
                    match segments.next() {
                        Some(seg) => {
                            *reader = Some(SegmentReader::open(
                                self.catalog.clone(),
                                &seg,
                                self.opts.read_batch_rows,
                            )?)
                        }
                        None => return Ok(None),
                    }
                }
                Source::NotStarted(pieces) => {
                    let pieces = pieces.clone();
                    let o = &self.opts;
                    self.source = Source::Ahead(Prefetcher::start(
                        self.catalog.clone(),
                        pieces,
                        o.readahead_threads,
                        o.readahead_depth,
                        o.read_batch_rows,
                    )?);
                }
                Source::Ahead(p) => return p.next_batch(),
            }
        }
    }

    /// Make sure `batch` has a row left (true if a new batch was loaded); the caller never asks
    /// past the slot's range.
    pub(super) fn fill(&mut self) -> Result<bool> {
        if self
            .batch
            .as_ref()
            .is_some_and(|b| self.offset < b.num_rows())
        {
            return Ok(false);
        }
        match self.next_decoded()? {
            Some((first, b)) => {
                self.batch = Some(b);
                self.first_row = first;
                self.offset = 0;
                Ok(true)
            }
            None => Err(Error::Internal(
                "input read past the end of the slot".into(),
            )),
        }
    }

    /// Up to `max` rows from the current batch, as a zero-copy slice.
    pub(super) fn take(&mut self, max: usize) -> Result<RecordBatch> {
        self.fill()?;
        let b = self.batch.as_ref().expect("filled");
        let n = max.min(b.num_rows() - self.offset);
        // (the whole batch, the usual case, without slicing every column)
        let out = if n == b.num_rows() {
            b.clone()
        } else {
            b.slice(self.offset, n)
        };
        self.offset += n;
        Ok(out)
    }
}

/// Input rows for the buffer, with their data pinned in the slab.
pub(super) struct DataRows<'a> {
    pub(super) input: &'a mut Input,
    pub(super) slab: &'a mut Slab,
}

impl RowSource for DataRows<'_> {
    type Data = Loc;
    fn next_row(&mut self) -> Result<(u64, Loc)> {
        if self.input.fill()? {
            if let Some(old) = self.input.pinned.take() {
                self.slab.release(old);
            }
            let b = self.input.batch.clone().expect("filled");
            self.input.pinned = Some(self.slab.insert(b, 1));
        }
        let id = self.input.pinned.expect("pinned");
        let row = self.input.offset;
        self.input.offset += 1;
        self.slab.refs[id as usize] += 1;
        Ok((
            self.input.first_row + row as u64,
            Loc {
                batch: id,
                row: row as u32,
            },
        ))
    }
}

/// Input rows as ids only: the coordinate twin of [`Input`], walking the same segments.
pub(super) struct CoordRows {
    pub(super) segments: Segments,
    pub(super) current: Option<Segment>,
}

impl RowSource for CoordRows {
    type Data = ();
    fn next_row(&mut self) -> Result<(u64, ())> {
        if self.current.is_none_or(|s| s.len == 0) {
            self.current = self.segments.next();
        }
        let seg = self
            .current
            .as_mut()
            .ok_or_else(|| Error::Internal("coordinate walk past the end of the slot".into()))?;
        let row = seg.first_row;
        seg.first_row += 1;
        seg.len -= 1;
        Ok((row, ()))
    }
}

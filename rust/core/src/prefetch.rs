//! Readahead: decode upcoming pieces of the slot's range on background threads.
//!
//! Design:
//! * The pieces (runs of rows inside one row group) are known in advance from the plan, so
//!   readahead needs no coordination: piece `i` goes to thread `i % threads`, each thread decodes
//!   its pieces in order into its own bounded channel, and the consumer reads the channels
//!   round-robin. Output order is therefore exactly the synchronous order, and the state (which
//!   counts rows *consumed*, never rows decoded) is unaffected by how far readahead got.
//! * Pieces are generated lazily from the plan (each thread walks the sequence and takes its
//!   own), so starting readahead costs O(1) even when the range spans a million row groups.
//! * Large row groups are cut into pieces of at most `piece_rows` rows when the file has an
//!   offset index (each piece then decodes only its own pages), so even a few huge row groups
//!   keep every thread busy. Cuts fall on page boundaries of the largest projected column where
//!   possible, so its pages are fetched and decoded once (`Costs`). Without an offset
//!   index a piece would re-decode the pages before it, so those row groups stay whole.
//! * After a (re)start a piece is fetched only once the consumer waits for it, until the consumer
//!   has received a decoded batch's worth of rows ([`Gate`]); then all threads run. Otherwise
//!   they fetch their (ramped, but larger) pieces at the same time as the first, and a deep
//!   resume over an object store paid for several pieces before its first batch (2.5-4.8% of a
//!   full read instead of ~0.5%, benchmarks "Object stores").
//! * Fork safety: threads are only started on the first read (inside the DataLoader worker), and a
//!   prefetcher that finds itself in a different process than the one that started it (a fork
//!   happened) is abandoned without touching its channels, whose locks a vanished thread may hold.
//! * Shutdown: dropping the prefetcher drops the receivers; each thread stops at its next send.
//!   Nothing joins, so dropping never blocks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};

use arrow_array::RecordBatch;

use crate::catalog::{Catalog, Shard};
use crate::error::{panic_message, Error, Result};
use crate::plan::{Segment, Segments};
use crate::reader::SegmentReader;
use parquet::file::page_index::offset_index::PageLocation;

enum Msg {
    /// A batch, its first row's id, and whether it ends its piece (one message fewer per
    /// piece than an end marker after it: a local IPC piece is often one batch, and each
    /// message may wake a thread).
    Batch(u64, RecordBatch, bool),
    /// A piece that ended without a batch ending it.
    EndOfPiece,
    Failed(Error),
}

/// The pieces of a slot's remaining input: segments cut to about `piece_rows` rows where the
/// shard allows cheap seeks (it has an offset index), generated lazily.
///
/// Where a piece ends, the pages straddling the cut (in every projected column) and every
/// dictionary page are decoded by both pieces. So a piece ends where that overhead is small next
/// to the piece ([`Costs::good_end`]); otherwise it takes in the following segment of the same
/// row group (up to [`MAX_PIECE_BYTES`]). E.g. `[id, score]` row groups of one page per column
/// stay whole, while `[id, tokens]` is still cut on token pages every ~16k rows. (Local shards;
/// remote ones keep their pieces as cut, see below.)
#[derive(Clone)]
pub struct Pieces {
    catalog: Arc<Catalog>,
    segments: Segments,
    /// A segment read ahead that did not continue the last piece.
    pending: Option<Segment>,
    /// Rows in the pieces returned so far.
    pos: u64,
}

/// A piece and where it starts among the rows of the sequence (the first piece at 0): readers
/// cut their batches on multiples of the batch size in those coordinates, so that the stream's
/// output batches, counted from the same start, are slices of one decoded batch, not copies
/// gathered from two (see [`SegmentReader::open`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub seg: Segment,
    pub pos: u64,
}

impl std::ops::Deref for Piece {
    type Target = Segment;
    fn deref(&self) -> &Segment {
        &self.seg
    }
}

/// Compressed bytes (what a piece holds in memory while it decodes) beyond which segments are
/// no longer merged into one piece.
const MAX_PIECE_BYTES: u64 = 8 << 20;

impl Pieces {
    pub fn new(catalog: Arc<Catalog>, segments: Segments) -> Self {
        Pieces {
            catalog,
            segments,
            pending: None,
            pos: 0,
        }
    }

    fn next_segment(&mut self) -> Option<Segment> {
        if let Some(s) = self.pending.take() {
            return Some(s);
        }
        let catalog = &self.catalog;
        self.segments.next_with(|shard, row_group, start, cap| {
            let shard = catalog.shard(shard);
            shard.has_offset_index().then(|| {
                Costs::of(shard, row_group)
                    .and_then(|c| c.best_cut(start, cap))
                    .unwrap_or(cap)
            })
        })
    }
}

impl Iterator for Pieces {
    type Item = Piece;
    fn next(&mut self) -> Option<Piece> {
        let seg = self.merged()?;
        let pos = self.pos;
        self.pos += seg.len;
        Some(Piece { seg, pos })
    }
}

impl Pieces {
    /// The next segment, with the following ones of its row group taken in while ending it
    /// would cost too much (see [`Costs::good_end`]).
    fn merged(&mut self) -> Option<Segment> {
        let mut seg = self.next_segment()?;
        let catalog = self.catalog.clone();
        let shard = catalog.shard(seg.shard);
        // Remote shards keep their pieces as cut: the store caches dictionary pages for the
        // pieces after the first, a merged piece would be one larger download, and the first
        // piece (after a resume) is short so that the first batch waits for little. A local
        // piece is read into memory but decoded page by page as batches are taken, so a merged
        // first piece costs a resume little more than the read.
        let Some(costs) = (shard.has_offset_index() && shard.object.is_none())
            .then(|| Costs::of(shard, seg.row_group))
            .flatten()
        else {
            return Some(seg);
        };
        while !costs.good_end(seg.start, seg.start + seg.len) {
            let Some(next) = self.next_segment() else {
                break;
            };
            let continues = next.shard == seg.shard
                && next.row_group == seg.row_group
                && next.start == seg.start + seg.len
                && next.first_row == seg.first_row + seg.len;
            if !continues || costs.bytes(seg.start, next.start + next.len) > MAX_PIECE_BYTES {
                self.pending = Some(next);
                break;
            }
            seg.len += next.len;
        }
        Some(seg)
    }
}

/// Decode cost estimates of one row group's projected columns, from its offset index: a page
/// costs its compressed size times its column chunk's compression ratio (about the bytes it
/// decompresses to).
struct Costs<'a> {
    cols: Vec<Col<'a>>,
    rows: u64,
}

struct Col<'a> {
    pages: &'a [PageLocation],
    ratio: f64,
    /// The dictionary page's estimated cost (0 without one).
    dict: f64,
}

impl Col<'_> {
    /// Index of the page holding row `r`.
    fn page_of(&self, r: u64) -> usize {
        self.pages
            .partition_point(|p| (p.first_row_index.max(0) as u64) <= r)
            .saturating_sub(1)
    }
    fn cost(&self, page: usize) -> f64 {
        self.pages[page].compressed_page_size.max(0) as f64 * self.ratio
    }
}

impl<'a> Costs<'a> {
    fn of(shard: &'a Shard, row_group: usize) -> Option<Self> {
        let meta = shard.reader_meta().ok()?;
        let md = meta.metadata();
        let index = md.offset_index()?.get(row_group)?;
        let mask = shard.mask(meta);
        let rg = md.row_group(row_group);
        let cols = (0..rg.num_columns())
            .filter(|&c| mask.leaf_included(c))
            .map(|c| {
                let chunk = rg.column(c);
                let pages = index.get(c)?.page_locations().as_slice();
                let ratio =
                    chunk.uncompressed_size().max(1) as f64 / chunk.compressed_size().max(1) as f64;
                let start = chunk.byte_range().0;
                let dict = pages.first().map_or(0.0, |p| {
                    (p.offset as u64).saturating_sub(start) as f64 * ratio
                });
                (!pages.is_empty()).then_some(Col { pages, ratio, dict })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Costs {
            cols,
            rows: rg.num_rows().max(0) as u64,
        })
    }

    /// What cutting before row `r` costs twice: the pages it splits and every dictionary page.
    fn overhead(&self, r: u64) -> f64 {
        self.cols
            .iter()
            .map(|c| {
                let p = c.page_of(r);
                let split = (c.pages[p].first_row_index.max(0) as u64) < r;
                c.dict + if split { c.cost(p) } else { 0.0 }
            })
            .sum()
    }

    /// Estimated decode cost of rows `a..b`: every page they touch, and the dictionaries.
    fn span(&self, a: u64, b: u64) -> f64 {
        self.cols
            .iter()
            .map(|c| {
                c.dict
                    + (c.page_of(a)..=c.page_of(b - 1))
                        .map(|p| c.cost(p))
                        .sum::<f64>()
            })
            .sum()
    }

    /// Compressed bytes of the pages holding rows `a..b`.
    fn bytes(&self, a: u64, b: u64) -> u64 {
        self.cols
            .iter()
            .map(|c| {
                (c.page_of(a)..=c.page_of(b - 1))
                    .map(|p| c.pages[p].compressed_page_size.max(0) as u64)
                    .sum::<u64>()
            })
            .sum()
    }

    /// Whether a piece of rows `a..b` may end at `b`: the row group ends there, or decoding twice
    /// what the cut splits costs at most an eighth of the piece.
    fn good_end(&self, a: u64, b: u64) -> bool {
        b >= self.rows || b <= a || self.overhead(b) * 8.0 <= self.span(a, b)
    }

    /// Where to end a piece that starts at row `start` and may hold `cap` rows: the page
    /// boundary (of any projected column) in the upper half of the allowance that splits the
    /// fewest page bytes, the later on ties. `None`: no boundary there (cut at `cap`).
    fn best_cut(&self, start: u64, cap: u64) -> Option<u64> {
        let (lo, hi) = (start + cap / 2, start + cap);
        let mut best: Option<(f64, u64)> = None;
        for c in &self.cols {
            let from = c
                .pages
                .partition_point(|p| (p.first_row_index.max(0) as u64) < lo);
            for p in &c.pages[from..] {
                let r = p.first_row_index.max(0) as u64;
                if r > hi {
                    break;
                }
                if r > start {
                    let o = self.overhead(r);
                    if best.is_none_or(|(bo, br)| o < bo || (o == bo && r > br)) {
                        best = Some((o, r));
                    }
                }
            }
        }
        best.map(|(_, r)| r - start)
    }
}

/// How many pieces may be fetched (piece `i` waits until more than `i` may): after a (re)start,
/// only the piece the consumer is waiting for, until it has received its first rows; then all.
/// (Per piece, not per thread: a thread done with the first piece would otherwise fetch its
/// next one, the largest of the ramp, while the consumer waits for the second.) Only raised.
#[derive(Default)]
struct Gate {
    allowed: Mutex<usize>,
    raised: Condvar,
}

impl Gate {
    fn allow(&self, n: usize) {
        let mut allowed = self.allowed.lock().unwrap_or_else(|p| p.into_inner());
        if n > *allowed {
            *allowed = n;
            self.raised.notify_all();
        }
    }

    fn wait_for(&self, piece: usize) {
        let mut allowed = self.allowed.lock().unwrap_or_else(|p| p.into_inner());
        while *allowed <= piece {
            allowed = self.raised.wait(allowed).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Rows the consumer receives after a (re)start before every thread may fetch: the fixed
/// decoded batch this was tuned with. Decoded batches sized by bytes hold up to 16k narrow
/// rows, and waiting for that many would fetch the ramp's pieces one at a time.
const WARM_ROWS: usize = 2048;

/// Background decoding of a fixed list of pieces, consumed in order.
pub struct Prefetcher {
    pid: u32,
    channels: Vec<Receiver<Msg>>,
    next: usize,
    stop: Arc<AtomicBool>,
    gate: Arc<Gate>,
    /// Every thread may start.
    started_all: bool,
    /// Rows received so far, counted until `warm_rows`.
    received: usize,
    /// Rows after which every thread may start (a decoded batch, at most [`WARM_ROWS`]: about
    /// the first output batch).
    warm_rows: usize,
    /// Index of the piece being consumed.
    piece: usize,
    /// The last batch received ended its piece.
    piece_done: bool,
}

impl Prefetcher {
    pub fn start(
        catalog: Arc<Catalog>,
        pieces: Pieces,
        threads: usize,
        depth: usize,
        batch_rows: usize,
    ) -> Result<Self> {
        let threads = threads.max(1);
        let stop = Arc::new(AtomicBool::new(false));
        let gate = Arc::new(Gate::default());
        gate.allow(1);
        let mut channels = Vec::with_capacity(threads);
        for t in 0..threads {
            let (tx, rx) = sync_channel(depth.max(1));
            // Each thread walks the (cheap, lazy) piece sequence and decodes every `threads`-th.
            let mine = pieces.clone().skip(t).step_by(threads);
            let (catalog, stop) = (catalog.clone(), stop.clone());
            // Piece `t + k * threads` may be fetched once the gate allows it.
            let order = (gate.clone(), t, threads);
            let spawned = std::thread::Builder::new()
                .name(format!("shardstream-read-{t}"))
                .spawn(move || decode_pieces(catalog, mine, tx, stop, batch_rows, order));
            if let Err(e) = spawned {
                // Threads already started must not wait forever: they stop at their first send.
                gate.allow(usize::MAX);
                return Err(Error::Internal(format!(
                    "cannot start a readahead thread: {e}"
                )));
            }
            channels.push(rx);
        }
        Ok(Prefetcher {
            pid: std::process::id(),
            channels,
            next: 0,
            stop,
            gate,
            started_all: false,
            received: 0,
            warm_rows: batch_rows.clamp(1, WARM_ROWS),
            piece: 0,
            piece_done: false,
        })
    }

    /// The piece being consumed is done: the next one comes from the next thread.
    fn end_piece(&mut self) {
        self.next = (self.next + 1) % self.channels.len();
        self.piece += 1;
        // Still warming up: let just the piece now waited for be fetched.
        if !self.started_all {
            self.gate.allow(self.piece + 1);
        }
    }

    /// True if this prefetcher's threads live in this process (no fork since it started).
    pub fn owned_by_this_process(&self) -> bool {
        self.pid == std::process::id()
    }

    /// The next decoded batch in piece order; `None` when every piece is done.
    pub fn next_batch(&mut self) -> Result<Option<(u64, RecordBatch)>> {
        if std::mem::take(&mut self.piece_done) {
            self.end_piece();
        }
        let out = loop {
            match self.channels[self.next].recv() {
                Ok(Msg::Batch(first, b, last)) => {
                    // The piece ends when the next batch is asked for, as at an end marker.
                    self.piece_done = last;
                    break Ok(Some((first, b)));
                }
                Ok(Msg::EndOfPiece) => self.end_piece(),
                Ok(Msg::Failed(e)) => break Err(e),
                // The thread owning the next piece has none left: all pieces are done.
                Err(_) => break Ok(None),
            }
        };
        if !self.started_all {
            self.received += out
                .as_ref()
                .ok()
                .and_then(|b| b.as_ref())
                .map_or(0, |(_, b)| b.num_rows());
            if self.received >= self.warm_rows || !matches!(out, Ok(Some(_))) {
                self.gate.allow(usize::MAX);
                self.started_all = true;
            }
        }
        out
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Threads still waiting to start see the stop flag at their first send.
        self.gate.allow(usize::MAX);
    }
}

fn decode_pieces(
    catalog: Arc<Catalog>,
    pieces: impl Iterator<Item = Piece>,
    tx: SyncSender<Msg>,
    stop: Arc<AtomicBool>,
    batch_rows: usize,
    (gate, first, step): (Arc<Gate>, usize, usize),
) {
    let run = || -> Result<bool> {
        for (k, p) in pieces.enumerate() {
            gate.wait_for(first + k * step);
            if stop.load(Ordering::Relaxed) {
                return Ok(false);
            }
            let mut reader = SegmentReader::open(catalog.clone(), &p, batch_rows)?;
            let mut ended = false;
            while let Some((first, b)) = reader.next_batch()? {
                ended = reader.done();
                if stop.load(Ordering::Relaxed) || tx.send(Msg::Batch(first, b, ended)).is_err() {
                    return Ok(false);
                }
            }
            if !ended && tx.send(Msg::EndOfPiece).is_err() {
                return Ok(false);
            }
        }
        Ok(true)
    };
    // A decoder panic on a corrupt page must surface as an error in the consumer, not vanish.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or_else(|p| {
        Err(Error::Internal(format!(
            "readahead thread panicked: {}",
            panic_message(&*p)
        )))
    });
    if let Err(e) = outcome {
        let _ = tx.send(Msg::Failed(e));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::EpochPlan;
    use arrow_array::{ArrayRef, Float64Array, Int64Array};
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;
    use proptest::prelude::*;

    /// One shard of `[id int64, big list<float64> of 64 items]`: `big` (64x the bytes of `id`)
    /// has a page every `big_page` rows, `id` one page per row group.
    fn shard(dir: &std::path::Path, rows: usize, rg: usize, big_page: usize) -> Arc<Catalog> {
        let path = dir.join("s.parquet");
        let ids: Vec<i64> = (0..rows as i64).collect();
        let values = Float64Array::from_iter_values((0..rows * 64).map(|i| i as f64 * 1.5));
        let item = Arc::new(arrow_schema::Field::new(
            "item",
            arrow_schema::DataType::Float64,
            false,
        ));
        let offsets = arrow_buffer::OffsetBuffer::from_lengths(std::iter::repeat_n(64, rows));
        let big = arrow_array::ListArray::new(item, offsets, Arc::new(values), None);
        let batch = arrow_array::RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(ids)) as ArrayRef),
            ("big", Arc::new(big) as ArrayRef),
        ])
        .unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(rg))
            .set_dictionary_enabled(false)
            .set_write_batch_size(big_page)
            .set_column_data_page_size_limit("id".into(), usize::MAX)
            .set_column_data_page_size_limit(
                parquet::schema::types::ColumnPath::new(vec![
                    "big".into(),
                    "list".into(),
                    "item".into(),
                ]),
                big_page * 512,
            )
            .build();
        let mut w = ArrowWriter::try_new(
            std::fs::File::create(&path).unwrap(),
            batch.schema(),
            Some(props),
        )
        .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        Arc::new(Catalog::open(&[path.display().to_string()], None).unwrap())
    }

    fn pieces(cat: &Arc<Catalog>, cap: u64, first: u64) -> (Vec<Segment>, Vec<Segment>) {
        let plan = Arc::new(EpochPlan::new(cat.units(), 3, 0, true));
        let total = plan.total();
        let range = 0..total;
        let segs = || Segments::new(plan.clone(), vec![range.clone()], cap).with_ramp(first);
        let plain: Vec<Segment> = segs().collect();
        let pieces: Vec<Piece> = Pieces::new(cat.clone(), segs()).collect();
        let mut pos = 0;
        for p in &pieces {
            assert_eq!(p.pos, pos, "a piece's position is the rows before it");
            pos += p.len;
        }
        (pieces.into_iter().map(|p| p.seg).collect(), plain)
    }

    fn rows(s: &[Segment]) -> Vec<(usize, usize, u64, u64)> {
        s.iter()
            .flat_map(|s| {
                (0..s.len).map(move |k| (s.shard, s.row_group, s.start + k, s.first_row + k))
            })
            .collect()
    }

    #[test]
    fn single_page_row_groups_stay_whole() {
        let dir = tempfile::tempdir().unwrap();
        // `big` pages as large as the row group: nowhere to cut without decoding a page twice
        let cat = shard(dir.path(), 1000, 200, 200);
        let (p, plain) = pieces(&cat, 30, 10);
        assert_eq!(rows(&p), rows(&plain));
        assert!(plain.len() > 5 * p.len());
        for s in &p {
            assert!(s.start == 0 && s.len == 200, "{s:?}");
        }
    }

    #[test]
    fn many_page_row_groups_are_cut_on_pages() {
        let dir = tempfile::tempdir().unwrap();
        // `big` has a page every 20 rows and dominates the bytes: cut there, near the cap
        let cat = shard(dir.path(), 1000, 500, 20);
        let (p, plain) = pieces(&cat, 100, 10);
        assert_eq!(rows(&p), rows(&plain));
        for s in &p {
            assert!(
                s.len <= 100 && (s.start + s.len) % 20 == 0 || s.start + s.len == 500,
                "{s:?}"
            );
        }
        assert!(p.len() >= 10, "cut, not merged: {}", p.len());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

        /// Merged or not, pieces are the plain segments' rows in the same order.
        #[test]
        fn pieces_are_the_segments_rows(rows_n in 1usize..400, rg in 1usize..150, page in 1usize..60,
                                        cap in 1u64..80, first in 1u64..40) {
            let dir = tempfile::tempdir().unwrap();
            let cat = shard(dir.path(), rows_n, rg, page);
            let (p, plain) = pieces(&cat, cap, first);
            prop_assert_eq!(rows(&p), rows(&plain));
        }
    }
}

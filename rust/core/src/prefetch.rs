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
//!   possible, so its pages are fetched and decoded once (`page_aligned`). Without an offset
//!   index a piece would re-decode the pages before it, so those row groups stay whole.
//! * Fork safety: threads are only started on the first read (inside the DataLoader worker), and a
//!   prefetcher that finds itself in a different process than the one that started it (a fork
//!   happened) is abandoned without touching its channels, whose locks a vanished thread may hold.
//! * Shutdown: dropping the prefetcher drops the receivers; each thread stops at its next send.
//!   Nothing joins, so dropping never blocks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;

use arrow_array::RecordBatch;

use crate::catalog::{Catalog, Shard};
use crate::error::{panic_message, Error, Result};
use crate::plan::{Segment, Segments};
use crate::reader::SegmentReader;

enum Msg {
    Batch(u64, RecordBatch),
    EndOfPiece,
    Failed(Error),
}

/// The pieces of a slot's remaining input: segments cut to at most `piece_rows` rows where the
/// shard allows cheap seeks (it has an offset index), generated lazily.
#[derive(Clone)]
pub struct Pieces {
    catalog: Arc<Catalog>,
    segments: Segments,
}

impl Pieces {
    pub fn new(catalog: Arc<Catalog>, segments: Segments) -> Self {
        Pieces { catalog, segments }
    }
}

impl Iterator for Pieces {
    type Item = Segment;
    fn next(&mut self) -> Option<Segment> {
        let catalog = &self.catalog;
        self.segments.next_with(|shard, row_group, start, cap| {
            let shard = catalog.shard(shard);
            shard
                .has_offset_index()
                .then(|| page_aligned(shard, row_group, start, cap).unwrap_or(cap))
        })
    }
}

/// Where to end a piece that starts at row `start` of a row group and may hold `cap` rows: on a
/// page boundary of the projected column with the most bytes in that row group, if one lies in
/// the upper half of the allowance. A cut inside a page makes both pieces fetch and decode that
/// page; for the dominant column (say, 1 MiB pages of token lists) that was a sizeable share of a
/// remote read's bytes. `None`: no such boundary (cut at `cap`).
fn page_aligned(shard: &Shard, row_group: usize, start: u64, cap: u64) -> Option<u64> {
    let meta = shard.reader_meta().ok()?;
    let md = meta.metadata();
    let pages = md.offset_index()?.get(row_group)?;
    let mask = shard.mask(meta);
    let rg = md.row_group(row_group);
    let col = (0..rg.num_columns())
        .filter(|&c| mask.leaf_included(c))
        .max_by_key(|&c| rg.column(c).compressed_size())?;
    let locations = pages.get(col)?.page_locations();
    let (lo, hi) = (start + cap / 2, start + cap);
    let i = locations.partition_point(|p| (p.first_row_index.max(0) as u64) <= hi);
    let first = locations[..i].last()?.first_row_index.max(0) as u64;
    (first > start && first >= lo).then(|| first - start)
}

/// Background decoding of a fixed list of pieces, consumed in order.
pub struct Prefetcher {
    pid: u32,
    channels: Vec<Receiver<Msg>>,
    next: usize,
    stop: Arc<AtomicBool>,
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
        let mut channels = Vec::with_capacity(threads);
        for t in 0..threads {
            let (tx, rx) = sync_channel(depth.max(1));
            // Each thread walks the (cheap, lazy) piece sequence and decodes every `threads`-th.
            let mine = pieces.clone().skip(t).step_by(threads);
            let (catalog, stop) = (catalog.clone(), stop.clone());
            std::thread::Builder::new()
                .name(format!("shardstream-read-{t}"))
                .spawn(move || decode_pieces(catalog, mine, tx, stop, batch_rows))
                .map_err(|e| Error::Internal(format!("cannot start a readahead thread: {e}")))?;
            channels.push(rx);
        }
        Ok(Prefetcher {
            pid: std::process::id(),
            channels,
            next: 0,
            stop,
        })
    }

    /// True if this prefetcher's threads live in this process (no fork since it started).
    pub fn owned_by_this_process(&self) -> bool {
        self.pid == std::process::id()
    }

    /// The next decoded batch in piece order; `None` when every piece is done.
    pub fn next_batch(&mut self) -> Result<Option<(u64, RecordBatch)>> {
        loop {
            match self.channels[self.next].recv() {
                Ok(Msg::Batch(first, b)) => return Ok(Some((first, b))),
                Ok(Msg::EndOfPiece) => self.next = (self.next + 1) % self.channels.len(),
                Ok(Msg::Failed(e)) => return Err(e),
                // The thread owning the next piece has none left: all pieces are done.
                Err(_) => return Ok(None),
            }
        }
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn decode_pieces(
    catalog: Arc<Catalog>,
    pieces: impl Iterator<Item = Segment>,
    tx: SyncSender<Msg>,
    stop: Arc<AtomicBool>,
    batch_rows: usize,
) {
    let run = || -> Result<bool> {
        for p in pieces {
            let mut reader = SegmentReader::open(catalog.clone(), &p, batch_rows)?;
            while let Some((first, b)) = reader.next_batch()? {
                if stop.load(Ordering::Relaxed) || tx.send(Msg::Batch(first, b)).is_err() {
                    return Ok(false);
                }
            }
            if tx.send(Msg::EndOfPiece).is_err() {
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

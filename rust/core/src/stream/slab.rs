//! Decoded batches that buffered rows point into (reference-counted), and refilling them from a
//! saved state's row ids: after a restore every entry is [`Loc::MISSING`]; the first batch reads
//! just the rows it picks, and the rest of the buffer is read in the background meanwhile
//! ([`Refill`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use arrow_array::RecordBatch;
use arrow_select::interleave::interleave_record_batch;

use super::input::Input;
use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::reader::read_rows_until;
use crate::shuffle::{Buffer, Departures};

/// Where a buffered row's data is: a slab entry and a row in it.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Loc {
    pub(super) batch: u32,
    pub(super) row: u32,
}

/// Decoded batches that buffered rows point into, with reference counts.
#[derive(Default)]
pub(super) struct Slab {
    pub(super) batches: Vec<Option<RecordBatch>>,
    pub(super) refs: Vec<u32>,
    pub(super) free: Vec<u32>,
    pub(super) live_rows: usize,
    /// Rows copied by compaction (`stream::compact`), for diagnostics.
    pub(super) copied: u64,
}

impl Slab {
    pub(super) fn insert(&mut self, b: RecordBatch, refs: u32) -> u32 {
        self.live_rows += b.num_rows();
        match self.free.pop() {
            Some(i) => {
                self.batches[i as usize] = Some(b);
                self.refs[i as usize] = refs;
                i
            }
            None => {
                self.batches.push(Some(b));
                self.refs.push(refs);
                (self.batches.len() - 1) as u32
            }
        }
    }

    pub(super) fn release(&mut self, i: u32) {
        let r = &mut self.refs[i as usize];
        *r -= 1;
        if *r == 0 {
            if let Some(b) = self.batches[i as usize].take() {
                self.live_rows -= b.num_rows();
            }
            self.free.push(i);
        }
    }

    /// Slab entries to compact so that about `waste` rows no buffer entry points at are freed,
    /// copying about `max_moved` buffered rows at most (at least one entry if any qualifies):
    /// the live batches with the smallest share of referenced rows first (most freed per row
    /// copied), never `keep` (the input batch still being read into the buffer).
    pub(super) fn sparsest(&self, keep: Option<u32>, waste: usize, max_moved: usize) -> Vec<u32> {
        let mut live: Vec<(u32, usize, usize)> = (self.batches.iter().zip(&self.refs))
            .enumerate()
            .filter(|&(i, _)| Some(i as u32) != keep)
            .filter_map(|(i, (b, &r))| b.as_ref().map(|b| (i as u32, b.num_rows(), r as usize)))
            .filter(|&(_, rows, refs)| refs < rows)
            .collect();
        // refs / rows ascending, compared without division.
        live.sort_unstable_by(|a, b| (a.2 * b.1).cmp(&(b.2 * a.1)));
        let (mut freed, mut moved) = (0, 0);
        let mut out = Vec::new();
        for (i, rows, refs) in live {
            if freed >= waste || (moved >= max_moved && !out.is_empty()) {
                break;
            }
            freed += rows - refs;
            moved += refs;
            out.push(i);
        }
        out
    }

    /// The retained batches `locs` point into (shared: `RecordBatch` clones are `Arc` clones)
    /// and each loc as (index among them, row): what [`Slab::gather`] would copy, for a caller
    /// that copies these rows together with others (a mixture's mixed batch). Taken before the
    /// locs are released, since a batch may leave the slab then.
    pub(super) fn locate(&self, locs: &[Loc]) -> Located {
        let mut index_of = vec![usize::MAX; self.batches.len()];
        let mut batches = Vec::new();
        let rows = locs
            .iter()
            .map(|l| {
                let slot = &mut index_of[l.batch as usize];
                if *slot == usize::MAX {
                    *slot = batches.len();
                    batches.push(self.batches[l.batch as usize].clone().expect("live batch"));
                }
                (*slot, l.row as usize)
            })
            .collect();
        Located { batches, rows }
    }

    /// Gather rows into one batch.
    pub(super) fn gather(
        &self,
        schema: &arrow_schema::SchemaRef,
        locs: &[Loc],
    ) -> Result<RecordBatch> {
        let mut index_of = vec![usize::MAX; self.batches.len()];
        let mut refs: Vec<&RecordBatch> = Vec::new();
        for l in locs {
            let slot = &mut index_of[l.batch as usize];
            if *slot == usize::MAX {
                *slot = refs.len();
                refs.push(self.batches[l.batch as usize].as_ref().expect("live batch"));
            }
        }
        if refs.is_empty() {
            return Ok(RecordBatch::new_empty(schema.clone()));
        }
        let idx: Vec<(usize, usize)> = locs
            .iter()
            .map(|l| (index_of[l.batch as usize], l.row as usize))
            .collect();
        interleave_record_batch(&refs, &idx).map_err(|e| Error::Internal(format!("gather: {e}")))
    }
}

/// A batch's rows not yet copied into one: row `i` is row `rows[i].1` of `batches[rows[i].0]`.
#[derive(Debug, Clone)]
pub struct Located {
    pub batches: Vec<RecordBatch>,
    pub rows: Vec<(usize, usize)>,
}

impl Located {
    pub fn num_rows(&self) -> usize {
        self.rows.len()
    }

    /// The rows as one batch (what [`Slab::gather`] gives for the same locs).
    pub fn materialize(&self, schema: &arrow_schema::SchemaRef) -> Result<RecordBatch> {
        if self.batches.is_empty() {
            return Ok(RecordBatch::new_empty(schema.clone()));
        }
        let refs: Vec<&RecordBatch> = self.batches.iter().collect();
        interleave_record_batch(&refs, &self.rows)
            .map_err(|e| Error::Internal(format!("gather: {e}")))
    }
}

/// Data behind the buffer; `None` in [`Stream`] until rebuilt after a restore.
pub(super) struct DataSide {
    pub(super) input: Input,
    pub(super) slab: Slab,
    /// Buffer entries still [`Loc::MISSING`] after the first batch, being read.
    pub(super) refill: Option<Refill>,
    /// Some buffer entries may be [`Loc::MISSING`] and no refill covers them.
    pub(super) missing: bool,
    /// When the buffered rows leave, for compaction: made when it is first due, then stepped
    /// with the buffer; with the stream's `emitted` when it was made.
    pub(super) departures: Option<(u64, Departures)>,
    /// This stream counts as reading for the allocator's age limit while it has data.
    pub(super) _reading: crate::alloc::Reading,
}

impl Loc {
    /// A buffer entry whose data is not read yet (after a restore): its id is re-read when it is
    /// picked or when the background refill lands, whichever comes first.
    pub(super) const MISSING: Loc = Loc {
        batch: u32::MAX,
        row: 0,
    };

    pub(super) fn is_missing(self) -> bool {
        self.batch == u32::MAX
    }
}

/// Rows read for some entries (of the buffer, or of one output batch's picks): the batches, and
/// for each entry the batch and row holding its data.
pub(super) struct Filled {
    batches: Vec<RecordBatch>,
    /// (entry, batch, row)
    places: Vec<(u32, u32, u32)>,
}

/// Read the rows `wanted` (row id, entry) names. Sorted once, so each distinct id is read once
/// (`Even::Pad` may buffer a row twice) and every entry finds its row in one linear walk.
pub(super) fn read_entries(
    catalog: &Catalog,
    mut wanted: Vec<(u64, u32)>,
    batch_rows: usize,
    threads: usize,
    stop: Option<&AtomicBool>,
) -> Result<Filled> {
    wanted.sort_unstable();
    let mut unique: Vec<u64> = wanted.iter().map(|w| w.0).collect();
    unique.dedup();
    let batches = read_rows_until(catalog, &unique, batch_rows, threads, stop)?;
    let mut places = Vec::with_capacity(wanted.len());
    let (mut u, mut w) = (0, 0);
    for (k, b) in batches.iter().enumerate() {
        for row in 0..b.num_rows() {
            while w < wanted.len() && wanted[w].0 == unique[u] {
                places.push((wanted[w].1, k as u32, row as u32));
                w += 1;
            }
            u += 1;
        }
    }
    if w != wanted.len() {
        return Err(Error::Internal(format!(
            "read {u} of {} buffered rows",
            unique.len()
        )));
    }
    Ok(Filled { batches, places })
}

impl Filled {
    /// Point `entries` at the rows read, each holding one slab reference.
    pub(super) fn apply(self, entries: &mut [Loc], slab: &mut Slab) {
        let ids: Vec<u32> = self
            .batches
            .into_iter()
            .map(|b| slab.insert(b, 0))
            .collect();
        for (e, k, row) in self.places {
            let batch = ids[k as usize];
            slab.refs[batch as usize] += 1;
            entries[e as usize] = Loc { batch, row };
        }
    }
}

/// The buffer's rows not needed by the first batch after a restore, read on background threads
/// while that batch is used (or, with `readahead_threads=0`, by the next batch).
pub(super) struct Refill {
    pid: u32,
    stop: Arc<AtomicBool>,
    job: Option<Job>,
}

enum Job {
    Later(Vec<(u64, u32)>),
    Running(JoinHandle<Result<Filled>>),
}

impl Refill {
    /// Read `buffer`'s missing entries: on a thread of its own fanning out to `threads` readers,
    /// or later, in [`Refill::finish`], if `threads` is 0.
    pub(super) fn start(
        catalog: &Arc<Catalog>,
        buffer: &Buffer<Loc>,
        batch_rows: usize,
        threads: usize,
    ) -> Result<Option<Self>> {
        let wanted: Vec<(u64, u32)> = buffer
            .rows
            .iter()
            .zip(&buffer.data)
            .enumerate()
            .filter(|(_, (_, l))| l.is_missing())
            .map(|(i, (&r, _))| (r, i as u32))
            .collect();
        if wanted.is_empty() {
            return Ok(None);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let job = if threads == 0 {
            Job::Later(wanted)
        } else {
            let (catalog, flag) = (catalog.clone(), stop.clone());
            let spawned = std::thread::Builder::new()
                .name("shardstream-refill".into())
                .spawn(move || read_entries(&catalog, wanted, batch_rows, threads, Some(&flag)));
            Job::Running(spawned.map_err(|e| {
                Error::Internal(format!("cannot start a thread to refill the buffer: {e}"))
            })?)
        };
        Ok(Some(Refill {
            pid: std::process::id(),
            stop,
            job: Some(job),
        }))
    }

    /// True unless the thread was started by another process (we were forked).
    pub(super) fn owned_by_this_process(&self) -> bool {
        self.pid == std::process::id()
    }

    /// Wait for the rows (or read them now) and point the buffer at them.
    pub(super) fn finish(
        mut self,
        catalog: &Catalog,
        buffer: &mut Buffer<Loc>,
        slab: &mut Slab,
        batch_rows: usize,
    ) -> Result<()> {
        let filled = match self.job.take().expect("not finished") {
            Job::Later(wanted) => read_entries(catalog, wanted, batch_rows, 1, None)?,
            // A panicking reader re-panics here, in the caller, where the FFI boundary catches it.
            Job::Running(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?,
        };
        filled.apply(&mut buffer.data, slab);
        Ok(())
    }
}

impl Drop for Refill {
    fn drop(&mut self) {
        // Dropped unfinished (a skip or restore replaced the data side): the thread stops at its
        // next row group and its result is discarded.
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{ids, write_shards_with};
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int32Type;
    use proptest::prelude::*;
    use std::sync::OnceLock;

    /// 97 rows in 3 shards, row groups of 9, pages of 7 rows; with and without a page index.
    fn catalog(page_index: bool) -> &'static Catalog {
        static CATS: OnceLock<[(tempfile::TempDir, Catalog); 2]> = OnceLock::new();
        let cats = CATS.get_or_init(|| {
            [true, false].map(|pi| {
                let dir = tempfile::tempdir().unwrap();
                let files = write_shards_with(dir.path(), &[40, 24, 33], 9, pi);
                let cat = Catalog::open(&files, None).unwrap();
                (dir, cat)
            })
        });
        &cats[usize::from(!page_index)].1
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Every entry gets exactly its row (all columns), for random row sets across pages,
        /// row groups and shards, repeated ids, any batch size and thread count (row groups cut
        /// between threads included), with and without a page index; the batches hold each id
        /// once, in ascending order.
        #[test]
        fn entries_get_their_rows(
            pick in proptest::collection::vec(0u64..97, 0..120), page_index in any::<bool>(),
            batch_rows in 1usize..12, threads in 0usize..4,
        ) {
            let cat = catalog(page_index);
            let wanted: Vec<(u64, u32)> =
                pick.iter().enumerate().map(|(e, &r)| (r, e as u32)).collect();
            let filled = read_entries(cat, wanted, batch_rows, threads, None).unwrap();
            let mut unique = pick.clone();
            unique.sort_unstable();
            unique.dedup();
            let read: Vec<i64> = filled.batches.iter().flat_map(ids).collect();
            prop_assert_eq!(&read, &unique.iter().map(|&r| r as i64).collect::<Vec<_>>());
            prop_assert!(filled.batches.iter().all(|b| b.num_rows() <= batch_rows));
            let mut slab = Slab::default();
            let mut entries = vec![Loc::MISSING; pick.len()];
            filled.apply(&mut entries, &mut slab);
            let rows = slab.gather(catalog(page_index).schema(), &entries).unwrap();
            let got = ids(&rows);
            prop_assert_eq!(&got, &pick.iter().map(|&r| r as i64).collect::<Vec<_>>());
            let text = rows.column_by_name("text").unwrap().as_string::<i32>();
            let tokens = rows.column_by_name("tokens").unwrap().as_list::<i32>();
            for (i, &r) in pick.iter().enumerate() {
                prop_assert_eq!(text.value(i), format!("row-{r}"));
                let t = tokens.value(i);
                let want: Vec<i32> = (0..(r % 5) as i32).map(|k| r as i32 + k).collect();
                prop_assert_eq!(t.as_primitive::<Int32Type>().values().to_vec(), want);
            }
            // One slab reference per entry.
            prop_assert_eq!(slab.refs.iter().map(|&n| n as usize).sum::<usize>(), pick.len());
        }
    }

    #[test]
    fn a_set_stop_flag_fails_the_read() {
        let stop = AtomicBool::new(true);
        let wanted = vec![(3, 0), (50, 1)];
        let err = read_entries(catalog(true), wanted, 4, 2, Some(&stop));
        assert!(err.is_err());
    }
}

//! Decoded batches that buffered rows point into (reference-counted), and refilling them from a
//! saved state's row ids.

use arrow_array::RecordBatch;
use arrow_select::interleave::interleave_record_batch;

use super::input::Input;
use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::reader::read_rows;
use crate::shuffle::Buffer;

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

/// Data behind the buffer; `None` in [`Stream`] until (re)hydrated after a restore.
pub(super) struct DataSide {
    pub(super) input: Input,
    pub(super) slab: Slab,
}

/// Re-read the buffered rows by id and point the buffer at them. A row may be buffered twice
/// (`Even::Pad` repeats one), so the ids are de-duplicated before reading.
pub(super) fn hydrate(
    catalog: &Catalog,
    buffer: &mut Buffer<Loc>,
    slab: &mut Slab,
    batch_rows: usize,
    threads: usize,
) -> Result<()> {
    let mut unique = buffer.rows.clone();
    unique.sort_unstable();
    unique.dedup();
    let mut locs = Vec::with_capacity(unique.len());
    for b in read_rows(catalog, &unique, batch_rows, threads)? {
        let n = b.num_rows();
        // One reference per buffer entry pointing here, added below.
        let id = slab.insert(b, 0);
        locs.extend((0..n).map(|row| Loc {
            batch: id,
            row: row as u32,
        }));
    }
    buffer.data.clear();
    for r in &buffer.rows {
        let loc = locs[unique.binary_search(r).expect("read every buffered row")];
        slab.refs[loc.batch as usize] += 1;
        buffer.data.push(loc);
    }
    Ok(())
}

//! Random access: rows by global id, in any order, for a map-style dataset.
//!
//! Design: a file format plugs in as a [`RowFormat`], which says how its rows split into
//! independently readable *pieces* (Parquet: row groups) and reads given rows of one piece,
//! returning for each output column where each row is (arrays it decoded or had cached, and a
//! row in one of them). [`Access::take`] does the rest for every format: checks the ids,
//! reads each piece touched once (duplicates read once), spreads pieces over scoped threads
//! (joined before returning: nothing outlives a call, so forking a DataLoader worker is safe),
//! and gathers every column in the requested order with `interleave`.
//!
//! Formats: [`parquet::ParquetRows`] (local and object-store shards, through the page index and
//! a cache of decoded pages). Arrow IPC files are the next (memory-mapped: a row is a slice).

pub mod cache;
pub mod parquet;

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch, RecordBatchOptions};
use arrow_schema::SchemaRef;
use arrow_select::interleave::interleave;

use crate::error::{Error, Result};

/// Where each requested row of one output column is: row `at[i].1` of `arrays[at[i].0]`.
#[derive(Debug, Default)]
pub struct Located {
    pub arrays: Vec<ArrayRef>,
    pub at: Vec<(usize, usize)>,
}

/// One file format's random access (see the module docs).
pub trait RowFormat: Send + Sync {
    /// The output schema.
    fn schema(&self) -> &SchemaRef;
    /// Piece boundaries as global row ids: piece `i` holds rows `bounds[i]..bounds[i + 1]`;
    /// the last entry is the row count (`[0]` for no rows).
    fn bounds(&self) -> &[u64];
    /// Rows `rows` (global ids, sorted, unique, all in piece `piece`): one [`Located`] per
    /// output column, `at` in the order of `rows`.
    fn read(&self, piece: usize, rows: &[u64]) -> Result<Vec<Located>>;
}

/// Random access over one format.
pub struct Access {
    format: Arc<dyn RowFormat>,
    threads: usize,
}

impl Access {
    /// `threads`: pieces read at once in one call (1: in the caller's thread).
    pub fn new(format: Arc<dyn RowFormat>, threads: usize) -> Self {
        Access {
            format,
            threads: threads.max(1),
        }
    }

    pub fn format(&self) -> &Arc<dyn RowFormat> {
        &self.format
    }

    pub fn num_rows(&self) -> u64 {
        *self.format.bounds().last().unwrap_or(&0)
    }

    /// The rows `ids` (global row ids, any order, repeats allowed) as one batch in that order.
    pub fn take(&self, ids: &[u64]) -> Result<RecordBatch> {
        let n = self.num_rows();
        if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id >= n) {
            return Err(Error::Config(format!(
                "index {id} (item {i} of the request) is out of range for a dataset of {n} rows"
            )));
        }
        if ids.len() > u32::MAX as usize {
            return Err(Error::Config(format!(
                "{} indices in one request: at most 2**32 - 1 (request fewer at a time)",
                ids.len()
            )));
        }
        let schema = self.format.schema().clone();
        if ids.is_empty() {
            return Ok(RecordBatch::new_empty(schema));
        }
        // Sorted unique ids, and for each request item the index of its id among them.
        let mut order: Vec<u32> = (0..ids.len() as u32).collect();
        order.sort_unstable_by_key(|&i| ids[i as usize]);
        let mut unique: Vec<u64> = Vec::with_capacity(ids.len());
        let mut slot = vec![0u32; ids.len()];
        for &i in &order {
            let id = ids[i as usize];
            if unique.last() != Some(&id) {
                unique.push(id);
            }
            slot[i as usize] = (unique.len() - 1) as u32;
        }
        // Pieces touched: (piece, range of `unique` inside it).
        let bounds = self.format.bounds();
        let mut tasks = Vec::new();
        let mut a = 0;
        while a < unique.len() {
            let piece = bounds.partition_point(|&b| b <= unique[a]) - 1;
            let b = a + unique[a..].partition_point(|&r| r < bounds[piece + 1]);
            tasks.push((piece, a..b));
            a = b;
        }
        let parts = self.read_all(&tasks, &unique)?;
        // Gather each column: task t's arrays follow those of tasks before it.
        let columns = schema.fields().len();
        let mut where_ = vec![(0u32, 0u32); unique.len()]; // unique id -> (task, row in task)
        for (t, (_, r)) in tasks.iter().enumerate() {
            for (j, u) in r.clone().enumerate() {
                where_[u] = (t as u32, j as u32);
            }
        }
        let mut out = Vec::with_capacity(columns);
        for c in 0..columns {
            let mut arrays: Vec<&dyn Array> = Vec::new();
            let mut base = Vec::with_capacity(parts.len());
            for p in &parts {
                base.push(arrays.len());
                arrays.extend(p[c].arrays.iter().map(|a| a.as_ref()));
            }
            let indices: Vec<(usize, usize)> = slot
                .iter()
                .map(|&u| {
                    let (t, j) = where_[u as usize];
                    let (a, row) = parts[t as usize][c].at[j as usize];
                    (base[t as usize] + a, row)
                })
                .collect();
            let col = interleave(&arrays, &indices).map_err(|e| {
                Error::Internal(format!(
                    "gathering column {:?}: {e}",
                    schema.field(c).name()
                ))
            })?;
            out.push(col);
        }
        let options = RecordBatchOptions::new().with_row_count(Some(ids.len()));
        RecordBatch::try_new_with_options(schema, out, &options)
            .map_err(|e| Error::Internal(format!("assembling the rows: {e}")))
    }

    /// Every task's columns, in task order; pieces spread over up to `threads` threads.
    fn read_all(
        &self,
        tasks: &[(usize, std::ops::Range<usize>)],
        unique: &[u64],
    ) -> Result<Vec<Vec<Located>>> {
        let read = |&(piece, ref r): &(usize, std::ops::Range<usize>)| -> Result<Vec<Located>> {
            let cols = self.format.read(piece, &unique[r.clone()])?;
            let want = self.format.schema().fields().len();
            if cols.len() != want || cols.iter().any(|l| l.at.len() != r.len()) {
                return Err(Error::Internal(format!(
                    "piece {piece}: the reader returned {} columns for {} rows",
                    cols.len(),
                    r.len()
                )));
            }
            Ok(cols)
        };
        let threads = self.threads.min(tasks.len());
        if threads <= 1 {
            return tasks.iter().map(read).collect();
        }
        let mut parts: Vec<Option<Result<Vec<Located>>>> = (0..tasks.len()).map(|_| None).collect();
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let read = &read;
                    scope.spawn(move || {
                        (t..tasks.len())
                            .step_by(threads)
                            .map(|k| (k, read(&tasks[k])))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            for h in handles {
                // A panicking reader re-panics here, in the caller, where the FFI boundary
                // catches it.
                for (k, r) in h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)) {
                    parts[k] = Some(r);
                }
            }
        });
        parts
            .into_iter()
            .map(|p| p.expect("every task read"))
            .collect()
    }
}

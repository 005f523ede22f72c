//! Random access into Parquet shards (local and object store).
//!
//! A piece is a non-empty row group. Without a page cache, the rows asked of a row group are
//! read in one pass selecting just them (`reader::read_rows`): with the offset index only the
//! pages holding them are fetched and decompressed, so a row costs at most one page of each
//! projected column. With a cache, each column's pages holding the rows are decoded whole (one
//! pass per column and row group for all its missing pages) and kept, keyed by (shard, row
//! group, column, page): orders that come back to the same pages — the sampler's block order,
//! sequential reads — then decode each page once. Columns are cached on their own because
//! their page boundaries differ. Without an offset index a column's "page" is its whole chunk.

use std::sync::{Arc, Mutex, OnceLock};

use arrow_array::{Array, ArrayRef};
use arrow_schema::SchemaRef;
use arrow_select::interleave::interleave;
use parquet::arrow::arrow_reader::RowSelector;

use super::cache::{CacheStats, PageCache};
use super::{Located, RowFormat};
use crate::catalog::{Catalog, Unit};
use crate::error::{Error, Result};
use crate::reader;
use crate::settings::MAX_READ_BATCH_ROWS;

pub struct ParquetRows {
    catalog: Arc<Catalog>,
    units: Arc<Vec<Unit>>,
    bounds: Vec<u64>,
    cache: Option<Mutex<PageCache>>,
    /// The process that made the cache (see `cache.rs`).
    pid: u32,
    /// Per shard, lazily: the first leaf column of each output column's root (whose page
    /// boundaries are the column's pages).
    leaves: Vec<OnceLock<Vec<usize>>>,
}

impl ParquetRows {
    /// `cache_bytes = 0`: no page cache.
    pub fn new(catalog: Arc<Catalog>, cache_bytes: u64) -> Self {
        let units = catalog.units();
        let mut bounds: Vec<u64> = units.iter().map(|u| u.first_row).collect();
        bounds.push(catalog.total_rows());
        let leaves = (0..catalog.shards().len())
            .map(|_| OnceLock::new())
            .collect();
        ParquetRows {
            catalog,
            units,
            bounds,
            cache: (cache_bytes > 0).then(|| Mutex::new(PageCache::new(cache_bytes))),
            pid: std::process::id(),
            leaves,
        }
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    pub fn cache_stats(&self) -> CacheStats {
        match self.cache() {
            Some(c) => lock(c).stats(),
            None => CacheStats::default(),
        }
    }

    fn cache(&self) -> Option<&Mutex<PageCache>> {
        self.cache
            .as_ref()
            .filter(|_| self.pid == std::process::id())
    }

    /// First row (within the row group) of each page of output column `c` in unit `u`.
    fn page_starts(&self, u: &Unit, c: usize) -> Result<Vec<u64>> {
        let shard = self.catalog.shard(u.shard as usize);
        if !shard.has_offset_index() {
            return Ok(vec![0]);
        }
        let meta = shard.reader_meta()?;
        let leaves = self.leaves[u.shard as usize].get_or_init(|| {
            let schema = meta.parquet_schema();
            shard
                .reorder
                .iter()
                .map(|&i| {
                    let root = shard.roots[i];
                    (0..schema.num_columns())
                        .find(|&l| schema.get_column_root_idx(l) == root)
                        .unwrap_or(0)
                })
                .collect()
        });
        let pages = meta
            .metadata()
            .offset_index()
            .and_then(|oi| oi.get(u.row_group as usize))
            .and_then(|cols| cols.get(leaves[c]))
            .map(|idx| idx.page_locations());
        let mut starts: Vec<u64> = pages
            .into_iter()
            .flatten()
            .map(|l| l.first_row_index.max(0) as u64)
            .filter(|&r| r < u.rows)
            .collect();
        starts.sort_unstable();
        starts.dedup();
        if starts.first() != Some(&0) {
            starts.insert(0, 0);
        }
        Ok(starts)
    }

    /// Rows `rows` of unit `u`, all columns at once, just the selected rows (no cache).
    fn read_selected(&self, rows: &[u64]) -> Result<Vec<Located>> {
        let batch_rows = rows.len().clamp(1, MAX_READ_BATCH_ROWS as usize);
        let batches = reader::read_rows(&self.catalog, rows, batch_rows, 1)?;
        let columns = self.catalog.schema().fields().len();
        let mut out: Vec<Located> = (0..columns).map(|_| Located::default()).collect();
        for (b, batch) in batches.iter().enumerate() {
            for (c, l) in out.iter_mut().enumerate() {
                l.arrays.push(batch.column(c).clone());
                l.at.extend((0..batch.num_rows()).map(|r| (b, r)));
            }
        }
        Ok(out)
    }

    /// Rows `rows` of column `c` of unit `u` from its cached pages, decoding those missing.
    fn read_cached(
        &self,
        cache: &Mutex<PageCache>,
        u: &Unit,
        c: usize,
        rows: &[u64],
    ) -> Result<Located> {
        let starts = self.page_starts(u, c)?;
        let span = |p: usize| (starts[p], starts.get(p + 1).copied().unwrap_or(u.rows));
        let page_of = |r: u64| starts.partition_point(|&s| s <= r) - 1;
        // The pages touched, in order, and for each row (page slot, row in page).
        let mut pages: Vec<usize> = Vec::new();
        let mut at = Vec::with_capacity(rows.len());
        for &id in rows {
            let r = id - u.first_row;
            let p = page_of(r);
            if pages.last() != Some(&p) {
                pages.push(p);
            }
            at.push((pages.len() - 1, (r - starts[p]) as usize));
        }
        let key = |p: usize| (u.shard, u.row_group, c as u32, p as u32);
        let mut arrays: Vec<Option<ArrayRef>> = {
            let mut cache = lock(cache);
            pages.iter().map(|&p| cache.get(&key(p))).collect()
        };
        let missing: Vec<usize> = (0..pages.len()).filter(|&i| arrays[i].is_none()).collect();
        if !missing.is_empty() {
            let decoded = self.decode_pages(u, c, missing.iter().map(|&i| span(pages[i])))?;
            let mut cache = lock(cache);
            for (&i, page) in missing.iter().zip(decoded) {
                cache.put(key(pages[i]), page.clone());
                arrays[i] = Some(page);
            }
        }
        Ok(Located {
            arrays: arrays
                .into_iter()
                .map(|a| a.expect("read or cached"))
                .collect(),
            at,
        })
    }

    /// Column `c` of unit `u` for the row spans `spans` (ascending, disjoint), one compact
    /// array per span.
    fn decode_pages(
        &self,
        u: &Unit,
        c: usize,
        spans: impl Iterator<Item = (u64, u64)>,
    ) -> Result<Vec<ArrayRef>> {
        let spans: Vec<(u64, u64)> = spans.collect();
        let mut selection = Vec::new();
        let mut at = 0;
        for &(a, b) in &spans {
            if a > at {
                selection.push(RowSelector::skip((a - at) as usize));
            }
            selection.push(RowSelector::select((b - a) as usize));
            at = b;
        }
        let total: u64 = spans.iter().map(|(a, b)| b - a).sum();
        let batch_rows = (total as usize).clamp(1, MAX_READ_BATCH_ROWS as usize);
        let s = u.shard as usize;
        let decoded = reader::read_column(
            &self.catalog,
            s,
            u.row_group as usize,
            c,
            selection,
            batch_rows,
        )?;
        let got: usize = decoded.iter().map(|a| a.len()).sum();
        if got as u64 != total {
            return Err(Error::shard(
                &self.catalog.shard(s).path,
                format!(
                    "row group {}: asked for {total} rows, read {got}",
                    u.row_group
                ),
            ));
        }
        if let ([one], [_]) = (decoded.as_slice(), spans.as_slice()) {
            return Ok(vec![one.clone()]); // exactly the page: no copy
        }
        // Cut the decoded rows into pages, each copied into its own buffers (a slice would
        // keep the whole decode alive and the cache's byte count would be wrong).
        let refs: Vec<&dyn Array> = decoded.iter().map(|a| a.as_ref()).collect();
        let (mut arr, mut row) = (0usize, 0usize);
        let mut out = Vec::with_capacity(spans.len());
        for (a, b) in spans {
            let mut indices = Vec::with_capacity((b - a) as usize);
            for _ in a..b {
                while row == decoded[arr].len() {
                    arr += 1;
                    row = 0;
                }
                indices.push((arr, row));
                row += 1;
            }
            out.push(interleave(&refs, &indices).map_err(|e| {
                Error::Internal(format!("cutting decoded pages of column {c}: {e}"))
            })?);
        }
        Ok(out)
    }
}

fn lock(m: &Mutex<PageCache>) -> std::sync::MutexGuard<'_, PageCache> {
    // A panic while holding it (caught at the FFI boundary) leaves a consistent map.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RowFormat for ParquetRows {
    fn schema(&self) -> &SchemaRef {
        self.catalog.schema()
    }

    fn bounds(&self) -> &[u64] {
        &self.bounds
    }

    fn read(&self, piece: usize, rows: &[u64]) -> Result<Vec<Located>> {
        let u = self.units[piece];
        match self.cache() {
            None => self.read_selected(rows),
            Some(cache) => (0..self.catalog.schema().fields().len())
                .map(|c| self.read_cached(cache, &u, c, rows))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::Access;
    use crate::test_util::{ids, write_shards};
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int32Type;
    use proptest::prelude::*;

    fn check_rows(batch: &arrow_array::RecordBatch, want: &[u64]) {
        assert_eq!(
            ids(batch),
            want.iter().map(|&x| x as i64).collect::<Vec<_>>()
        );
        let tokens = batch.column_by_name("tokens").unwrap().as_list::<i32>();
        let text = batch.column_by_name("text").unwrap().as_string::<i32>();
        for (i, &x) in want.iter().enumerate() {
            let t: Vec<i32> = tokens
                .value(i)
                .as_primitive::<Int32Type>()
                .values()
                .to_vec();
            let expect: Vec<i32> = (0..(x % 5) as i32).map(|k| x as i32 + k).collect();
            assert_eq!(t, expect, "tokens of row {x}");
            assert_eq!(text.value(i), format!("row-{x}"));
        }
    }

    fn open(dir: &std::path::Path, cols: Option<&[&str]>) -> Arc<Catalog> {
        let paths = write_shards(dir, &[40, 0, 35, 64], 9);
        let cols: Option<Vec<String>> = cols.map(|c| c.iter().map(|s| s.to_string()).collect());
        Arc::new(Catalog::open(&paths, cols.as_deref()).unwrap())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Any ids (any order, repeats), with or without a cache of any size, on 1 or 3
        /// threads: exactly those rows, in that order; repeated requests hit the cache.
        #[test]
        fn take_returns_the_rows_asked_for(
            reqs in proptest::collection::vec(proptest::collection::vec(0u64..139, 0..60), 1..5),
            cache in prop_oneof![Just(0u64), Just(600u64), Just(1u64 << 30)],
            threads in 1usize..4,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let cat = open(dir.path(), Some(&["text", "id", "tokens"]));
            let rows = Arc::new(ParquetRows::new(cat, cache));
            let access = Access::new(rows.clone(), threads);
            prop_assert_eq!(access.num_rows(), 139);
            for ids_ in &reqs {
                let b = access.take(ids_).unwrap();
                prop_assert_eq!(b.schema().fields().len(), 3);
                let schema = b.schema();
                prop_assert_eq!(schema.field(0).name(), "text");
                check_rows(&b, ids_);
            }
            let s = rows.cache_stats();
            if cache == 0 {
                prop_assert_eq!(s, CacheStats::default());
            } else {
                prop_assert!(s.bytes <= cache);
            }
            if cache == 1 << 30 && !reqs[0].is_empty() {
                let before = rows.cache_stats();
                access.take(&reqs[0]).unwrap();
                let after = rows.cache_stats();
                prop_assert_eq!(after.misses, before.misses, "a repeat must be served by the cache");
            }
        }
    }

    #[test]
    fn out_of_range_ids_are_refused_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let cat = open(dir.path(), None);
        let access = Access::new(Arc::new(ParquetRows::new(cat, 0)), 1);
        let e = access.take(&[3, 139]).unwrap_err().to_string();
        assert!(
            e.contains("index 139 (item 1") && e.contains("139 rows"),
            "{e}"
        );
        assert_eq!(access.take(&[]).unwrap().num_rows(), 0);
    }

    /// The cache keeps one entry per (column, page): a second pass over the same rows decodes
    /// nothing, and pages are per column (tiny pages: 7 rows).
    #[test]
    fn cache_counts_pages_per_column() {
        let dir = tempfile::tempdir().unwrap();
        let cat = open(dir.path(), Some(&["id", "tokens"]));
        let rows = Arc::new(ParquetRows::new(cat, 1 << 30));
        let access = Access::new(rows.clone(), 1);
        let ids_: Vec<u64> = (0..20).collect();
        check_rows_ids(&access.take(&ids_).unwrap(), &ids_);
        let first = rows.cache_stats();
        assert!(first.pages >= 2 * 3, "{first:?}"); // >= 3 pages of 7 rows per column
        assert_eq!(first.hits, 0);
        access.take(&ids_).unwrap();
        let second = rows.cache_stats();
        assert_eq!((second.misses, second.pages), (first.misses, first.pages));
        assert_eq!(second.hits, first.misses);
    }

    fn check_rows_ids(b: &arrow_array::RecordBatch, want: &[u64]) {
        assert_eq!(ids(b), want.iter().map(|&x| x as i64).collect::<Vec<_>>());
    }
}

//! Decoded pages kept for random access: least recently used first out, bounded in bytes.
//!
//! One per process: its owner (`ParquetRows`) never touches a cache made in another process
//! (a DataLoader worker forked after the parent used it), so a lock held by a parent thread at
//! fork time cannot block a worker; the Python layer makes one per process.

use std::collections::{BTreeMap, HashMap};

use arrow_array::{Array, ArrayRef};

/// One decoded page: shard, row group, output column, page index in the column chunk.
pub type PageKey = (u32, u32, u32, u32);

/// Counters of one cache (this process).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Pages decoded that were larger than the whole budget (used once, not kept).
    pub uncached: u64,
    pub evictions: u64,
    pub bytes: u64,
    pub pages: u64,
}

#[derive(Debug)]
pub struct PageCache {
    capacity: u64,
    pages: HashMap<PageKey, (ArrayRef, u64, u64)>,
    /// Use tick -> page: the first entry is the least recently used.
    lru: BTreeMap<u64, PageKey>,
    tick: u64,
    stats: CacheStats,
}

impl PageCache {
    pub fn new(capacity: u64) -> Self {
        PageCache {
            capacity,
            pages: HashMap::new(),
            lru: BTreeMap::new(),
            tick: 0,
            stats: CacheStats::default(),
        }
    }

    pub fn get(&mut self, key: &PageKey) -> Option<ArrayRef> {
        let Some((page, _, tick)) = self.pages.get_mut(key) else {
            self.stats.misses += 1;
            return None;
        };
        self.stats.hits += 1;
        self.lru.remove(tick);
        self.tick += 1;
        *tick = self.tick;
        self.lru.insert(self.tick, *key);
        Some(page.clone())
    }

    /// Keep `page`, evicting the least recently used pages to stay within the budget. A page
    /// larger than the whole budget is not kept.
    pub fn put(&mut self, key: PageKey, page: ArrayRef) {
        let bytes = page.get_array_memory_size() as u64;
        if bytes > self.capacity {
            self.stats.uncached += 1;
            return;
        }
        if let Some((_, old, tick)) = self.pages.remove(&key) {
            self.lru.remove(&tick);
            self.stats.bytes -= old;
        }
        while self.stats.bytes + bytes > self.capacity {
            let (_, victim) = self
                .lru
                .pop_first()
                .expect("bytes > 0 means pages are held");
            let (_, b, _) = self.pages.remove(&victim).expect("lru and pages agree");
            self.stats.bytes -= b;
            self.stats.evictions += 1;
        }
        self.tick += 1;
        self.lru.insert(self.tick, key);
        self.pages.insert(key, (page, bytes, self.tick));
        self.stats.bytes += bytes;
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            pages: self.pages.len() as u64,
            ..self.stats
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Int64Array;
    use std::sync::Arc;

    fn page(n: usize) -> ArrayRef {
        Arc::new(Int64Array::from(vec![7i64; n]))
    }

    #[test]
    fn evicts_least_recently_used_within_budget() {
        let one = page(1000).get_array_memory_size() as u64;
        let mut c = PageCache::new(3 * one);
        for i in 0..3 {
            c.put((0, 0, 0, i), page(1000));
        }
        assert!(c.get(&(0, 0, 0, 0)).is_some()); // 0 is now the most recent
        c.put((0, 0, 0, 3), page(1000)); // evicts 1
        assert!(c.get(&(0, 0, 0, 1)).is_none());
        for i in [0, 2, 3] {
            assert!(c.get(&(0, 0, 0, i)).is_some(), "page {i}");
        }
        let s = c.stats();
        assert_eq!((s.pages, s.evictions, s.bytes), (3, 1, 3 * one));
        assert_eq!((s.hits, s.misses), (4, 1));
        c.put((1, 0, 0, 0), page(10_000)); // larger than the budget: not kept, nothing evicted
        assert_eq!(c.stats().uncached, 1);
        assert_eq!(c.stats().pages, 3);
        let mut none = PageCache::new(0);
        none.put((0, 0, 0, 0), page(1));
        assert!(none.get(&(0, 0, 0, 0)).is_none());
    }
}

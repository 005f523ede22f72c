//! The iteration plan: which rows an epoch visits, in which order, and which of them each slot
//! reads.
//!
//! Design: the unit of ordering is the row group ("unit"). An epoch is the concatenation of all
//! non-empty row groups, in catalog order without shuffle or in a seeded per-epoch permutation
//! with shuffle. Every row thus has a *position* in the epoch (0..total). The positions are cut
//! into `count` contiguous ranges, one per slot (a (rank, worker) pair), balanced to within one
//! row; a range may start or end inside a row group, which the reader handles with a row
//! selection. All slots compute the same permutation from the same seed, so their ranges are
//! disjoint and together cover the epoch exactly once, without any communication.

use std::ops::Range;
use std::sync::{Arc, OnceLock};

pub use crate::catalog::Unit;
use crate::error::{Error, Result};
use crate::rng::{derive_key, permute, Prng};

/// One (rank, worker) reader: `index` of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub index: u32,
    pub count: u32,
}

impl Slot {
    pub fn new(index: u32, count: u32) -> Result<Self> {
        if count == 0 || index >= count {
            return Err(Error::Config(format!(
                "slot {index} of {count} is not a valid slot"
            )));
        }
        Ok(Slot { index, count })
    }

    /// This slot's positions in an epoch of `total` rows.
    pub fn range(&self, total: u64) -> Range<u64> {
        let at = |i: u32| ((total as u128 * i as u128) / self.count as u128) as u64;
        at(self.index)..at(self.index + 1)
    }
}

/// How slots are made equal in length so every rank yields the same number of items.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Even {
    /// Slots differ by at most one row; every row exactly once.
    #[default]
    Off,
    /// Every slot reads `floor(n / slots)` rows: at most `slots - 1` rows per epoch are skipped.
    Drop,
    /// Every slot reads `ceil(n / slots)` rows: short slots repeat one row.
    Pad,
}

/// What one slot reads in one epoch: `ranges` of epoch positions, in order, after `injected`
/// rows that start out in the shuffle buffer (rows another layout had buffered; see elastic.rs).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlotSpec {
    pub ranges: Vec<Range<u64>>,
    pub injected: Vec<u64>,
}

impl SlotSpec {
    /// Rows read from `ranges`.
    pub fn input_len(&self) -> u64 {
        self.ranges.iter().map(|r| r.end - r.start).sum()
    }

    /// Rows emitted over the epoch.
    pub fn output_len(&self) -> u64 {
        self.input_len() + self.injected.len() as u64
    }

    /// The ranges left after the first `skip` input rows.
    pub fn ranges_after(&self, mut skip: u64) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        for r in &self.ranges {
            let n = r.end - r.start;
            if skip >= n {
                skip -= n;
                continue;
            }
            out.push(r.start + skip..r.end);
            skip = 0;
        }
        out
    }
}

impl Slot {
    /// The spec of this slot in an epoch of `total` rows under the standard layout.
    pub fn standard_spec(&self, total: u64, even: Even) -> SlotSpec {
        let range = self.range(total);
        let mut ranges = Vec::new();
        match even {
            Even::Off => ranges.push(range),
            Even::Drop => {
                let q = total / self.count as u64;
                ranges.push(q * self.index as u64..q * (self.index as u64 + 1));
            }
            Even::Pad => {
                let q = total.div_ceil(self.count as u64);
                let len = range.end - range.start;
                let start = range.start;
                ranges.push(range);
                if len < q && total > 0 {
                    let p = if len > 0 {
                        start
                    } else {
                        self.index as u64 % total
                    };
                    ranges.push(p..p + 1);
                }
            }
        }
        ranges.retain(|r| r.end > r.start);
        SlotSpec {
            ranges,
            injected: Vec::new(),
        }
    }
}

/// A contiguous run of rows inside one row group, in epoch order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub shard: usize,
    pub row_group: usize,
    /// First row to read, relative to the row group.
    pub start: u64,
    pub len: u64,
    /// Global row id of the first row read.
    pub first_row: u64,
}

/// The order of one epoch.
#[derive(Debug)]
pub struct EpochPlan {
    pub epoch: u64,
    units: Arc<Vec<Unit>>,
    order: Vec<u32>,
    /// `cum[i]` = rows before `order[i]`; one longer than `order`.
    cum: Vec<u64>,
    /// Inverse of `order`, built on first use (validating states).
    inverse: OnceLock<Vec<u32>>,
}

impl EpochPlan {
    pub fn new(units: Arc<Vec<Unit>>, seed: u64, epoch: u64, shuffle: bool) -> Self {
        let mut order: Vec<u32> = (0..units.len() as u32).collect();
        if shuffle {
            let mut rng = Prng::new(derive_key("unit-order", &[seed, epoch]));
            permute(&mut order, &mut rng);
        }
        let mut cum = Vec::with_capacity(order.len() + 1);
        let mut acc = 0u64;
        cum.push(0);
        for &u in &order {
            acc += units[u as usize].rows;
            cum.push(acc);
        }
        EpochPlan {
            epoch,
            units,
            order,
            cum,
            inverse: OnceLock::new(),
        }
    }

    pub fn total(&self) -> u64 {
        *self.cum.last().unwrap_or(&0)
    }

    /// (index into the order, row offset inside that unit) of an epoch position.
    fn find(&self, pos: u64) -> (usize, u64) {
        let i = self.cum.partition_point(|&c| c <= pos) - 1;
        (i, pos - self.cum[i])
    }

    /// Global row id at an epoch position.
    pub fn row_at(&self, pos: u64) -> u64 {
        let (i, off) = self.find(pos);
        self.units[self.order[i] as usize].first_row + off
    }

    /// The segments covering positions `range`, in order.
    pub fn segments(self: &Arc<Self>, range: Range<u64>) -> Vec<Segment> {
        Segments::new(self.clone(), vec![range], u64::MAX).collect()
    }

    /// Epoch positions of global row ids (`None` for an id outside the dataset). Used to check
    /// that a loaded state's buffered rows really were consumed by its slot.
    pub fn positions_of(&self, rows: &[u64]) -> Vec<Option<u64>> {
        let inv = self.inverse.get_or_init(|| {
            let mut inv = vec![0u32; self.order.len()];
            for (i, &u) in self.order.iter().enumerate() {
                inv[u as usize] = i as u32;
            }
            inv
        });
        rows.iter()
            .map(|&r| {
                let u = self.units.partition_point(|x| x.first_row + x.rows <= r);
                let unit = self.units.get(u)?;
                if r < unit.first_row {
                    return None;
                }
                Some(self.cum[inv[u] as usize] + (r - unit.first_row))
            })
            .collect()
    }
}

/// The segments covering position `ranges` of an epoch, generated one at a time (a slot's range
/// can span a million row groups; nothing materializes them all), each at most `max_len` rows.
#[derive(Clone)]
pub struct Segments {
    plan: Arc<EpochPlan>,
    ranges: std::collections::VecDeque<Range<u64>>,
    max_len: u64,
    /// Cap of the next segment while ramping up (see [`Segments::with_ramp`]); doubles after
    /// each segment until it reaches `max_len`.
    ramp: Option<u64>,
}

impl Segments {
    pub fn new(plan: Arc<EpochPlan>, ranges: Vec<Range<u64>>, max_len: u64) -> Self {
        Segments {
            plan,
            ranges: ranges.into_iter().filter(|r| r.start < r.end).collect(),
            max_len: max_len.max(1),
            ramp: None,
        }
    }

    /// Ramp up: cut the first segment at `n` rows (where splittable), the next at `2n`, `4n`, ...
    /// until `max_len`. After a (re)start the first batch then waits for a small fetch and
    /// decode, and the readahead threads started beside it fetch small pieces too, instead of
    /// a whole piece each; steady state is unchanged. The rows and their order are unchanged.
    pub fn with_ramp(mut self, n: u64) -> Self {
        self.ramp = Some(n.max(1));
        self
    }

    /// Like [`Segments::new`], but a segment longer than the cap is cut where
    /// `cut(shard, row_group, start, cap)` says: `Some(n)` rows (clamped to `1..=cap`), or
    /// `None` to keep it whole (a shard that cannot seek cheaply).
    pub fn next_with(
        &mut self,
        cut: impl Fn(usize, usize, u64, u64) -> Option<u64>,
    ) -> Option<Segment> {
        let r = self.ranges.front_mut()?;
        let (i, off) = self.plan.find(r.start);
        let u = self.plan.units[self.plan.order[i] as usize];
        let mut len = (u.rows - off).min(r.end - r.start);
        let cap = self.ramp.map_or(self.max_len, |f| f.min(self.max_len));
        self.ramp = self
            .ramp
            .and_then(|f| Some(f.saturating_mul(2)).filter(|&n| n < self.max_len));
        if len > cap {
            if let Some(n) = cut(u.shard as usize, u.row_group as usize, off, cap) {
                len = n.clamp(1, cap);
            }
        }
        r.start += len;
        if r.start == r.end {
            self.ranges.pop_front();
        }
        Some(Segment {
            shard: u.shard as usize,
            row_group: u.row_group as usize,
            start: off,
            len,
            first_row: u.first_row + off,
        })
    }
}

impl Iterator for Segments {
    type Item = Segment;
    fn next(&mut self) -> Option<Segment> {
        self.next_with(|_, _, _, cap| Some(cap))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn mk_units(sizes: &[u64]) -> Arc<Vec<Unit>> {
        let mut first = 0;
        Arc::new(
            sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    let u = Unit {
                        shard: 0,
                        row_group: i as u32,
                        rows: n,
                        first_row: first,
                    };
                    first += n;
                    u
                })
                .collect(),
        )
    }

    proptest! {
        /// Slots partition every epoch: disjoint, covering, balanced within one row.
        #[test]
        fn slots_partition_the_epoch(sizes in proptest::collection::vec(1u64..50, 0..20),
                                     count in 1u32..9, seed in any::<u64>(), shuffle in any::<bool>()) {
            let plan = Arc::new(EpochPlan::new(mk_units(&sizes), seed, 3, shuffle));
            let total: u64 = sizes.iter().sum();
            prop_assert_eq!(plan.total(), total);
            let mut seen = vec![0u8; total as usize];
            let mut lens = Vec::new();
            for i in 0..count {
                let r = Slot::new(i, count).unwrap().range(total);
                lens.push(r.end - r.start);
                let segs = plan.segments(r.clone());
                prop_assert_eq!(segs.iter().map(|s| s.len).sum::<u64>(), r.end - r.start);
                let mut pos = r.start;
                for s in &segs {
                    for k in 0..s.len {
                        prop_assert_eq!(plan.row_at(pos), s.first_row + k);
                        seen[(s.first_row + k) as usize] += 1;
                        pos += 1;
                    }
                }
            }
            prop_assert!(seen.iter().all(|&c| c == 1));
            let (mn, mx) = (lens.iter().min().unwrap(), lens.iter().max().unwrap());
            prop_assert!(mx - mn <= 1);
        }

        #[test]
        fn positions_invert_row_at(sizes in proptest::collection::vec(1u64..30, 1..10), seed in any::<u64>()) {
            let plan = EpochPlan::new(mk_units(&sizes), seed, 0, true);
            let rows: Vec<u64> = (0..plan.total()).map(|p| plan.row_at(p)).collect();
            let pos = plan.positions_of(&rows);
            for (p, got) in pos.iter().enumerate() {
                prop_assert_eq!(*got, Some(p as u64));
            }
            prop_assert_eq!(plan.positions_of(&[plan.total()]), vec![None]);
        }
    }

    proptest! {
        /// Standard specs: Off partitions, Drop gives equal lengths and loses < slots rows,
        /// Pad gives equal lengths and repeats < slots rows.
        #[test]
        fn even_policies(total in 0u64..200, count in 1u32..9) {
            let specs = |even| (0..count).map(|i| Slot::new(i, count).unwrap().standard_spec(total, even)).collect::<Vec<_>>();
            let lens = |v: &Vec<SlotSpec>| v.iter().map(|s| s.output_len()).collect::<Vec<_>>();
            let off = specs(Even::Off);
            prop_assert_eq!(lens(&off).iter().sum::<u64>(), total);
            let drop = lens(&specs(Even::Drop));
            prop_assert!(drop.iter().all(|&l| l == total / count as u64));
            prop_assert!(total - drop.iter().sum::<u64>() < count as u64);
            let pad = specs(Even::Pad);
            if total > 0 {
                prop_assert!(lens(&pad).iter().all(|&l| l == total.div_ceil(count as u64)));
            }
            let mut covered = vec![0u32; total as usize];
            for s in &pad { for r in &s.ranges { for p in r.clone() { covered[p as usize] += 1; } } }
            prop_assert!(covered.iter().all(|&c| c >= 1));
            prop_assert!(covered.iter().map(|&c| (c - 1) as u64).sum::<u64>() < count as u64);
        }
    }

    proptest! {
        /// However segments are cut (max length, a ramp from a small first one, unsplittable
        /// shards), they walk exactly the rows of the ranges, in order, and the ramp holds.
        #[test]
        fn segment_cuts_preserve_rows(sizes in proptest::collection::vec(1u64..40, 1..8),
                                      seed in any::<u64>(), max_len in 1u64..50, first in 1u64..10,
                                      split in any::<bool>()) {
            let plan = Arc::new(EpochPlan::new(mk_units(&sizes), seed, 0, true));
            let total = plan.total();
            let ranges = vec![0..total / 3, total / 2..total];
            let walk = |segs: Vec<Segment>| segs.iter().flat_map(|s| s.first_row..s.first_row + s.len).collect::<Vec<_>>();
            let plain = walk(Segments::new(plan.clone(), ranges.clone(), u64::MAX).collect());
            let mut cut = Segments::new(plan.clone(), ranges.clone(), max_len).with_ramp(first);
            // Cuts anywhere in 1..=cap (as page alignment picks them), or none.
            let segs: Vec<Segment> = std::iter::from_fn(|| {
                cut.next_with(|_, g, start, cap| split.then_some((start + g as u64 * 7) % cap + 1))
            })
            .collect();
            if split {
                prop_assert!(segs.iter().all(|s| s.len <= max_len));
                for (i, s) in segs.iter().enumerate() {
                    prop_assert!(s.len <= first.saturating_mul(1 << i.min(32)), "segment {} has {} rows", i, s.len);
                }
            }
            prop_assert_eq!(walk(segs), plain);
        }
    }

    #[test]
    fn shuffle_depends_on_epoch_and_seed() {
        let u = mk_units(&[1; 50]);
        let a: Vec<u64> = (0..50)
            .map(|p| EpochPlan::new(u.clone(), 1, 0, true).row_at(p))
            .collect();
        let b: Vec<u64> = (0..50)
            .map(|p| EpochPlan::new(u.clone(), 1, 1, true).row_at(p))
            .collect();
        let c: Vec<u64> = (0..50)
            .map(|p| EpochPlan::new(u.clone(), 2, 0, true).row_at(p))
            .collect();
        let plain: Vec<u64> = (0..50).collect();
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, plain);
        let d: Vec<u64> = (0..50)
            .map(|p| EpochPlan::new(u.clone(), 1, 0, false).row_at(p))
            .collect();
        assert_eq!(d, plain);
    }
}

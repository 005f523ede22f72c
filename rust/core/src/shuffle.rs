//! The row-level shuffle buffer.
//!
//! Algorithm (per slot, per epoch): fill the buffer with the first `capacity` rows of the slot's
//! range; then each output row is `buffer[j]` for `j` drawn uniformly by the PRNG, and its place
//! is taken by the next input row or, once the input is exhausted, removed by `swap_remove`.
//! A buffer that starts above capacity (rows injected by an elastic resume) also removes until it
//! is down to capacity, then runs as usual.
//! One PRNG draw per output row and nothing else, so the output sequence depends only on
//! (seed, epoch, slot, plan) and not on how reads or output batches are sized.
//!
//! [`Buffer::step`] is the only implementation of those decisions. The stream runs it with rows
//! that carry a data location; `advance` runs the very same code with coordinates only (`D = ()`),
//! which is how a position inside an output batch is turned into a state without reading data.

use std::collections::VecDeque;

use crate::error::Result;
use crate::rng::Prng;

/// A source of input rows in epoch order: global row id plus whatever locates the data.
pub trait RowSource {
    type Data: Copy;
    fn next_row(&mut self) -> Result<(u64, Self::Data)>;
}

/// Buffered rows: global ids (the state) and, in parallel, where their data is.
#[derive(Debug, Clone)]
pub struct Buffer<D> {
    pub capacity: usize,
    pub rows: Vec<u64>,
    pub data: Vec<D>,
}

impl<D: Copy> Buffer<D> {
    pub fn new(capacity: usize) -> Self {
        Buffer {
            capacity,
            rows: Vec::new(),
            data: Vec::new(),
        }
    }

    /// Emit one row. `cursor` counts input rows taken of the slot's `len`; `emitted` counts output.
    pub fn step<S: RowSource<Data = D>>(
        &mut self,
        rng: &mut Prng,
        src: &mut S,
        cursor: &mut u64,
        len: u64,
        emitted: &mut u64,
    ) -> Result<Option<(u64, D)>> {
        while self.rows.len() < self.capacity && *cursor < len {
            let (row, d) = src.next_row()?;
            self.rows.push(row);
            self.data.push(d);
            *cursor += 1;
        }
        if self.rows.is_empty() {
            return Ok(None);
        }
        let j = rng.below(self.rows.len() as u64) as usize;
        let out = (self.rows[j], self.data[j]);
        if *cursor < len && self.rows.len() <= self.capacity {
            let (row, d) = src.next_row()?;
            self.rows[j] = row;
            self.data[j] = d;
            *cursor += 1;
        } else {
            self.rows.swap_remove(j);
            self.data.swap_remove(j);
        }
        *emitted += 1;
        Ok(Some(out))
    }
}

/// When the rows now in a full buffer will leave: a copy of the buffer's PRNG run up to
/// `horizon` steps ahead of it.
///
/// While the buffer is full and input remains, every step draws `below(capacity)` and replaces
/// the row at that position, so the row at position `j` leaves at the next step that draws `j`:
/// the draws alone say it, without the rows. That holds until the input runs out (then rows are
/// swap-removed and positions move), so nothing past that step is predicted.
///
/// The stream uses it to copy rows that leave together into the same new batch when it compacts
/// (`stream::compact`): such a batch is freed whole soon after, instead of emptying at random
/// and being compacted again. Only the draws are kept (a step costs one draw); the positions
/// asked about are looked up in one pass over them.
pub struct Departures {
    ahead: Prng,
    capacity: u64,
    /// Steps taken since it was made.
    steps: u64,
    /// Steps predicted at most: the input runs out after them.
    end: u64,
    horizon: usize,
    /// The positions the next steps draw, from the next one on.
    draws: VecDeque<u32>,
    /// Scratch for [`Departures::leaving`]: per position, its index among those asked about,
    /// and a bit set while it is asked about and not found yet (a bitmap small enough to stay
    /// in the CPU's cache while the draws stream past it).
    asked: Vec<u32>,
    waiting: Vec<u64>,
}

impl Departures {
    /// For a buffer that is full (`capacity` rows) with `input_left` rows still to take, whose
    /// PRNG is `rng` before its next step; `None` if that is not the case (while filling,
    /// draining or above capacity, positions don't follow the draws alone; nor for a buffer of
    /// more than 2^32 rows, whose positions the draws' `u32`s could not hold).
    pub fn new<D>(buffer: &Buffer<D>, rng: &Prng, input_left: u64, horizon: usize) -> Option<Self> {
        let capacity = buffer.capacity;
        if buffer.rows.len() != capacity
            || input_left == 0
            || capacity == 0
            || capacity > u32::MAX as usize
        {
            return None;
        }
        let horizon = horizon.max(1);
        let mut d = Departures {
            ahead: rng.clone(),
            capacity: capacity as u64,
            steps: 0,
            end: input_left,
            horizon,
            draws: VecDeque::with_capacity(horizon.min(input_left as usize)),
            asked: vec![0; capacity],
            waiting: vec![0; capacity.div_ceil(64)],
        };
        d.fill();
        Some(d)
    }

    /// Draw until the horizon or the end.
    fn fill(&mut self) {
        while self.draws.len() < self.horizon && self.steps + (self.draws.len() as u64) < self.end {
            self.draws.push_back(self.ahead.below(self.capacity) as u32);
        }
    }

    /// The buffer took one step (it drew the front draw).
    #[inline]
    pub fn step(&mut self) {
        self.draws.pop_front();
        self.steps += 1;
        self.fill();
    }

    /// Steps taken since it was made.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Those of `positions` (distinct, below the capacity) whose rows leave within the horizon,
    /// in the order they leave: (index in `positions`, steps from now until it leaves). A
    /// position not listed leaves beyond the horizon (or the end of the input). In that order
    /// because the draws are scanned in it: the caller needs no sort.
    pub fn leaving(&mut self, positions: &[usize]) -> Vec<(usize, u64)> {
        for (k, &p) in positions.iter().enumerate() {
            self.asked[p] = k as u32;
            self.waiting[p / 64] |= 1 << (p % 64);
        }
        let mut out = Vec::with_capacity(positions.len());
        let (front, back) = self.draws.as_slices();
        for (t, &j) in front.iter().chain(back).enumerate() {
            if out.len() == positions.len() {
                break;
            }
            let (w, bit) = (j as usize / 64, 1u64 << (j % 64));
            if self.waiting[w] & bit != 0 {
                self.waiting[w] &= !bit;
                out.push((self.asked[j as usize] as usize, t as u64));
            }
        }
        for &p in positions {
            self.waiting[p / 64] &= !(1 << (p % 64));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::derive_key;
    use proptest::prelude::*;

    struct Counter(u64);
    impl RowSource for Counter {
        type Data = ();
        fn next_row(&mut self) -> Result<(u64, ())> {
            self.0 += 1;
            Ok((self.0 - 1, ()))
        }
    }

    fn run(len: u64, cap: usize, seed: u64) -> Vec<u64> {
        let mut b = Buffer::new(cap);
        let mut rng = Prng::new(derive_key("t", &[seed]));
        let (mut cursor, mut emitted) = (0, 0);
        let mut src = Counter(0);
        let mut out = Vec::new();
        while let Some((r, ())) = b
            .step(&mut rng, &mut src, &mut cursor, len, &mut emitted)
            .unwrap()
        {
            out.push(r);
        }
        out
    }

    proptest! {
        #[test]
        fn every_row_once(len in 0u64..300, cap in 1usize..64, seed in any::<u64>()) {
            let mut out = run(len, cap, seed);
            out.sort_unstable();
            prop_assert_eq!(out, (0..len).collect::<Vec<_>>());
        }

        /// Displacement is bounded by the buffer: row r can't come out before position r - cap.
        #[test]
        fn rows_leave_no_earlier_than_buffer_allows(len in 1u64..300, cap in 1usize..32, seed in any::<u64>()) {
            let out = run(len, cap, seed);
            for (pos, &r) in out.iter().enumerate() {
                prop_assert!(r <= pos as u64 + cap as u64);
            }
        }
    }

    proptest! {
        /// Every prediction comes true, and a row not predicted stays beyond the horizon (or
        /// beyond the end of the input).
        #[test]
        fn departures_predict_when_each_buffered_row_leaves(
            len in 1u64..400, cap in 1usize..48, seed in any::<u64>(),
            at in 0u64..400, horizon in 1usize..100, later in 0u64..60,
        ) {
            let mut b = Buffer::new(cap);
            let mut rng = Prng::new(derive_key("t", &[seed]));
            let (mut cursor, mut emitted) = (0, 0);
            let mut src = Counter(0);
            while emitted < at && b.step(&mut rng, &mut src, &mut cursor, len, &mut emitted).unwrap().is_some() {}
            let Some(mut d) = Departures::new(&b, &rng, len - cursor, horizon) else {
                prop_assert!(b.rows.len() != cap || cursor == len);
                return Ok(());
            };
            // Stepped in sync for a while first: predictions made later are as good.
            let all: Vec<usize> = (0..cap).collect();
            // When each of `positions` leaves (u64::MAX: not predicted), listed in that order.
            let leave_in = |d: &mut Departures,
                            positions: &[usize]|
             -> Result<Vec<u64>, TestCaseError> {
                let soon = d.leaving(positions);
                prop_assert!(soon.windows(2).all(|w| w[0].1 < w[1].1), "not in leaving order");
                let mut t = vec![u64::MAX; positions.len()];
                for (k, at) in soon {
                    t[k] = at;
                }
                Ok(t)
            };
            for _ in 0..later {
                if cursor == len {
                    break;
                }
                leave_in(&mut d, &all)?;
                b.step(&mut rng, &mut src, &mut cursor, len, &mut emitted).unwrap();
                d.step();
            }
            let steady = len - cursor;
            // Asked about fewer after being asked about all: the scratch is clean between calls.
            let odd: Vec<usize> = all.iter().rev().copied().filter(|j| j % 2 == 1).collect();
            let some = leave_in(&mut d, &odd)?;
            let leave = leave_in(&mut d, &all)?;
            for (k, &j) in odd.iter().enumerate() {
                prop_assert_eq!(some[k], leave[j]);
            }
            let predicted: Vec<(u64, u64)> = b.rows.iter().copied().zip(leave).collect();
            let mut left_at = std::collections::HashMap::new();
            let mut k = 0;
            while let Some((r, ())) = b.step(&mut rng, &mut src, &mut cursor, len, &mut emitted).unwrap() {
                left_at.insert(r, k);
                k += 1;
            }
            let window = steady.min(horizon as u64);
            for (r, p) in predicted {
                if p == u64::MAX {
                    prop_assert!(left_at[&r] >= window);
                } else {
                    prop_assert_eq!(left_at[&r], p);
                }
            }
        }
    }

    #[test]
    fn capacity_one_is_identity_and_large_capacity_shuffles() {
        assert_eq!(run(50, 1, 3), (0..50).collect::<Vec<_>>());
        assert_ne!(run(50, 64, 3), (0..50).collect::<Vec<_>>());
    }
}

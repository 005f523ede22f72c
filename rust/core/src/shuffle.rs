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

    #[test]
    fn capacity_one_is_identity_and_large_capacity_shuffles() {
        assert_eq!(run(50, 1, 3), (0..50).collect::<Vec<_>>());
        assert_ne!(run(50, 64, 3), (0..50).collect::<Vec<_>>());
    }
}

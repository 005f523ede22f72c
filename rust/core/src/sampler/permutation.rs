//! The order of one epoch as a function: position `p` -> row `order.at(p)`, a bijection of
//! `[0, rows)` computed on the fly, so an epoch of 10^9 rows costs no index array and a resume
//! at any position costs one evaluation.
//!
//! * [`Feistel`]: a keyed bijection of `[0, n)`: a balanced Feistel network on the smallest
//!   power-of-four domain holding `n` (at least 2^8), with cycle-walking (apply again until the
//!   value falls inside `[0, n)`; a permutation's cycle through `x` returns to `[0, n)`, so this
//!   is a bijection of `[0, n)`; the domain is below `4n` for large `n`, so under 4 steps on
//!   average). Round function: the splitmix64 finalizer of the right half xor a round key.
//! * [`Order::Blocks`]: the locality option: blocks of `block` consecutive rows are permuted,
//!   consecutive runs of `window` permuted blocks form windows, and rows are permuted within
//!   each window. A batch then draws from at most `window` blocks, and consecutive batches from
//!   the same ones (what a page cache turns into near-sequential reads).
//!
//! Keys come from [`crate::rng`] (SHA-256 of `(purpose, seed, epoch)` into ChaCha8), so the
//! orders are portable and pinned by the golden test below, like every other shuffle.

use crate::rng::{derive_key, Prng};

/// Feistel rounds (an even number; 4 already make a pseudo-random permutation of a
/// pseudo-random round function; 8 leave margin for the small domains of windows).
const ROUNDS: usize = 8;
/// Smallest half-width: tiny `n` are walked on a 256-value domain, whose many keyed
/// permutations make orders of a handful of rows close to uniform (tested below).
const MIN_HALF_BITS: u32 = 4;

/// The splitmix64 finalizer: every input bit flips each output bit with probability ~1/2.
#[inline]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Round keys for one purpose of one epoch.
fn round_keys(purpose: &str, seed: u64, epoch: u64) -> [u64; ROUNDS] {
    let mut rng = Prng::new(derive_key(purpose, &[seed, epoch]));
    std::array::from_fn(|_| rng.next_u64())
}

/// A keyed bijection of `[0, n)` (see the module docs).
#[derive(Debug, Clone)]
pub struct Feistel {
    n: u64,
    half: u32,
    mask: u64,
    keys: [u64; ROUNDS],
}

impl Feistel {
    pub fn new(n: u64, keys: [u64; ROUNDS]) -> Self {
        let bits = u64::BITS - n.saturating_sub(1).leading_zeros();
        let half = bits.div_ceil(2).max(MIN_HALF_BITS);
        Feistel {
            n,
            half,
            mask: (1u64 << half) - 1,
            keys,
        }
    }

    #[inline]
    fn encrypt(&self, x: u64) -> u64 {
        let (mut l, mut r) = (x >> self.half, x & self.mask);
        for k in &self.keys {
            let t = l ^ (mix(r ^ k) & self.mask);
            l = r;
            r = t;
        }
        (l << self.half) | r
    }

    #[inline]
    fn decrypt(&self, y: u64) -> u64 {
        let (mut l, mut r) = (y >> self.half, y & self.mask);
        for k in self.keys.iter().rev() {
            let t = r ^ (mix(l ^ k) & self.mask);
            r = l;
            l = t;
        }
        (l << self.half) | r
    }

    /// The image of `x < n`.
    #[inline]
    pub fn apply(&self, x: u64) -> u64 {
        debug_assert!(x < self.n);
        let mut y = self.encrypt(x);
        while y >= self.n {
            y = self.encrypt(y);
        }
        y
    }

    /// The `x` with `apply(x) == y` (`y < n`).
    pub fn invert(&self, y: u64) -> u64 {
        debug_assert!(y < self.n);
        let mut x = self.decrypt(y);
        while x >= self.n {
            x = self.decrypt(x);
        }
        x
    }
}

/// The locality order (see the module docs): `q` is a bijection of the padded domain
/// `[0, blocks * block)`; positions are cycle-walked through it into `[0, rows)`.
#[derive(Debug, Clone)]
pub struct Blocks {
    rows: u64,
    block: u64,
    window: u64,
    blocks: u64,
    order: Feistel,
    /// Keys of window `j` are derived from these and `j` (cheaply: a batch may cross windows).
    window_keys: [u64; ROUNDS],
}

impl Blocks {
    fn new(rows: u64, block: u64, window: u64, seed: u64, epoch: u64) -> Self {
        let blocks = rows.div_ceil(block);
        Blocks {
            rows,
            block,
            window,
            blocks,
            order: Feistel::new(blocks, round_keys("sampler-blocks", seed, epoch)),
            window_keys: round_keys("sampler-windows", seed, epoch),
        }
    }

    /// The permutation of window `j`'s rows.
    fn window(&self, j: u64) -> Feistel {
        let first = j * self.window;
        let t = self.window.min(self.blocks - first);
        let salt = mix(j);
        Feistel::new(t * self.block, self.window_keys.map(|k| mix(k ^ salt)))
    }

    /// One step on the padded domain; `last` caches the window used before.
    #[inline]
    fn q(&self, p: u64, last: &mut Option<(u64, Feistel)>) -> u64 {
        let rows_per_window = self.window * self.block;
        let (j, off) = (p / rows_per_window, p % rows_per_window);
        if last.as_ref().is_none_or(|(w, _)| *w != j) {
            *last = Some((j, self.window(j)));
        }
        let f = &last.as_ref().expect("set above").1;
        let within = f.apply(off);
        let b = self.order.apply(j * self.window + within / self.block);
        b * self.block + within % self.block
    }

    fn at(&self, p: u64, last: &mut Option<(u64, Feistel)>) -> u64 {
        let mut x = self.q(p, last);
        while x >= self.rows {
            x = self.q(x, last);
        }
        x
    }
}

/// The order of one epoch: position -> row.
#[derive(Debug, Clone)]
pub enum Order {
    /// Rows in their order (no shuffle).
    Sequential,
    /// Every row equally likely at every position.
    Global(Feistel),
    /// Blocks permuted, rows permuted within windows of blocks.
    Blocks(Blocks),
}

impl Order {
    /// The order of epoch `epoch` of `rows` rows. `block = Some((block rows, window blocks))`
    /// selects the locality order.
    pub fn new(rows: u64, seed: u64, epoch: u64, shuffle: bool, block: Option<(u64, u64)>) -> Self {
        match (shuffle, block) {
            (false, _) => Order::Sequential,
            (true, None) => Order::Global(Feistel::new(
                rows,
                round_keys("sampler-global", seed, epoch),
            )),
            (true, Some((b, w))) => {
                Order::Blocks(Blocks::new(rows, b.max(1), w.max(1), seed, epoch))
            }
        }
    }

    /// Rows at positions `positions` (each below the epoch's row count), appended to `out`.
    pub fn rows_at(&self, positions: impl Iterator<Item = u64>, out: &mut Vec<u64>) {
        match self {
            Order::Sequential => out.extend(positions),
            Order::Global(f) => out.extend(positions.map(|p| f.apply(p))),
            Order::Blocks(b) => {
                let mut last = None;
                out.extend(positions.map(|p| b.at(p, &mut last)));
            }
        }
    }

    /// The row at position `p`.
    pub fn at(&self, p: u64) -> u64 {
        let mut out = Vec::with_capacity(1);
        self.rows_at(std::iter::once(p), &mut out);
        out[0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn is_bijection(order: &Order, n: u64) -> bool {
        let mut seen = vec![false; n as usize];
        let mut out = Vec::new();
        order.rows_at(0..n, &mut out);
        for &r in &out {
            if r >= n || seen[r as usize] {
                return false;
            }
            seen[r as usize] = true;
        }
        out.len() as u64 == n
    }

    /// Awkward sizes: empty, one, primes, powers of two and their neighbours, across the
    /// domain-size steps of the network.
    const AWKWARD: &[u64] = &[
        0, 1, 2, 3, 5, 7, 13, 15, 16, 17, 97, 255, 256, 257, 1021, 1023, 1024, 1025, 4093, 4095,
        4096, 4097, 65535, 65536, 65537, 100_003, 131_071, 131_072, 131_073,
    ];

    #[test]
    fn orders_are_bijections_for_awkward_sizes() {
        for &n in AWKWARD {
            for seed in 0..3 {
                assert!(
                    is_bijection(&Order::new(n, seed, 1, true, None), n),
                    "global n={n}"
                );
                for (b, w) in [(1, 1), (7, 3), (64, 16), (1000, 2)] {
                    if b * w < 256 && n > 5000 {
                        continue; // windows under 256 rows walk a 256-value domain: slow here
                    }
                    let o = Order::new(n, seed, 2, true, Some((b, w)));
                    assert!(is_bijection(&o, n), "blocks n={n} b={b} w={w}");
                }
            }
            assert!(is_bijection(&Order::new(n, 0, 0, false, None), n));
        }
    }

    proptest! {
        #[test]
        fn feistel_is_a_bijection_and_inverts(n in 1u64..5000, seed in any::<u64>(), epoch in any::<u64>()) {
            let f = Feistel::new(n, round_keys("t", seed, epoch));
            let mut seen = vec![false; n as usize];
            for x in 0..n {
                let y = f.apply(x);
                prop_assert!(y < n);
                prop_assert!(!seen[y as usize]);
                seen[y as usize] = true;
                prop_assert_eq!(f.invert(y), x);
            }
        }

        #[test]
        fn block_orders_are_bijections(n in 0u64..3000, block in 1u64..70, window in 1u64..9,
                                       seed in any::<u64>()) {
            prop_assert!(is_bijection(&Order::new(n, seed, 0, true, Some((block, window))), n));
        }

        /// Large domains: sampled points invert (the full check is the awkward sizes above).
        #[test]
        fn large_domains_invert(n in 1u64 << 40..1u64 << 62, x in any::<u64>(), seed in any::<u64>()) {
            let f = Feistel::new(n, round_keys("t", seed, 0));
            let x = x % n;
            let y = f.apply(x);
            prop_assert!(y < n);
            prop_assert_eq!(f.invert(y), x);
        }
    }

    /// A block order keeps every window's rows inside its blocks: a run of `block * window`
    /// positions touches at most `window` blocks (plus one for the short last block).
    #[test]
    fn windows_stay_within_their_blocks() {
        let (n, b, w) = (10_000u64, 100u64, 4u64);
        let o = Order::new(n, 5, 0, true, Some((b, w)));
        let mut rows = Vec::new();
        o.rows_at(0..n, &mut rows);
        for win in rows.chunks((b * w) as usize) {
            let mut blocks: Vec<u64> = win.iter().map(|r| r / b).collect();
            blocks.sort_unstable();
            blocks.dedup();
            assert!(blocks.len() as u64 <= w, "{blocks:?}");
        }
    }

    /// Orders of a few rows are close to uniform over all permutations (chi-square test):
    /// the 256-value minimum domain is what makes this hold for tiny n.
    #[test]
    fn small_orders_are_close_to_uniform() {
        for n in [2u64, 3, 4] {
            let perms: u64 = (1..=n).product();
            let trials = 6000 * perms;
            let mut counts = std::collections::HashMap::new();
            for seed in 0..trials {
                let o = Order::new(n, seed, 0, true, None);
                let mut out = Vec::new();
                o.rows_at(0..n, &mut out);
                *counts.entry(out).or_insert(0u64) += 1;
            }
            assert_eq!(counts.len() as u64, perms, "n={n}: not every order occurs");
            let expect = trials as f64 / perms as f64;
            let chi2: f64 = counts
                .values()
                .map(|&c| (c as f64 - expect).powi(2) / expect)
                .sum();
            // 99.9% quantile of chi-square with perms-1 <= 23 degrees of freedom is < 50.
            assert!(chi2 < 50.0, "n={n}: chi2 {chi2:.1} over {perms} orders");
        }
    }

    /// Every row is equally likely at every position (over seeds): the global order for a
    /// size that is not a power of two (cycle-walking), the block order when the block size
    /// divides the row count (otherwise the short last block's rows, cycle-walked out of the
    /// padding, lean towards the epoch's last positions: see the next test).
    #[test]
    fn positions_are_uniform_over_seeds() {
        for (n, block) in [(11u64, None), (12, Some((3, 2))), (12, Some((2, 4)))] {
            let mut counts = vec![vec![0u64; n as usize]; n as usize];
            let trials = 22_000u64;
            for seed in 0..trials {
                let o = Order::new(n, seed, 3, true, block);
                for p in 0..n {
                    counts[p as usize][o.at(p) as usize] += 1;
                }
            }
            let expect = trials as f64 / n as f64;
            for row in &counts {
                for &c in row {
                    assert!(
                        (c as f64 - expect).abs() < 0.1 * expect,
                        "{block:?}: {counts:?}"
                    );
                }
            }
        }
    }

    /// The block order's one departure from uniform: with a short last block, its rows take
    /// the epoch's last positions more often. Bounded here (n = 11, blocks of 3: within 20%
    /// of uniform at every position); rows of full blocks at the other positions stay within
    /// 10%.
    #[test]
    fn short_last_block_bias_is_bounded() {
        let (n, trials) = (11u64, 22_000u64);
        let mut counts = vec![vec![0u64; n as usize]; n as usize];
        for seed in 0..trials {
            let o = Order::new(n, seed, 3, true, Some((3, 2)));
            for p in 0..n {
                counts[p as usize][o.at(p) as usize] += 1;
            }
        }
        let expect = trials as f64 / n as f64;
        for (p, row) in counts.iter().enumerate() {
            for (r, &c) in row.iter().enumerate() {
                let dev = (c as f64 - expect).abs() / expect;
                let bound = if p >= 9 || r >= 9 { 0.2 } else { 0.1 };
                assert!(
                    dev < bound,
                    "position {p} row {r}: {c} (uniform {expect:.0})"
                );
            }
        }
    }

    #[test]
    fn seeds_and_epochs_give_different_orders() {
        let n = 1000;
        let rows = |seed, epoch, block| {
            let mut out = Vec::new();
            Order::new(n, seed, epoch, true, block).rows_at(0..n, &mut out);
            out
        };
        for block in [None, Some((10, 4))] {
            let base = rows(1, 0, block);
            assert_ne!(base, rows(2, 0, block));
            assert_ne!(base, rows(1, 1, block));
            assert_ne!(base, (0..n).collect::<Vec<_>>());
            assert_eq!(base, rows(1, 0, block));
        }
    }

    /// Golden vectors: a saved sampler state resumes to the same order after any upgrade. If
    /// this fails the order changed: fix the code, do not update the numbers (or bump the
    /// sampler state's version and say so).
    #[test]
    fn golden_orders_are_pinned() {
        let take = |o: Order| {
            let mut out = Vec::new();
            o.rows_at(0..12, &mut out);
            out
        };
        assert_eq!(take(Order::new(12, 42, 7, true, None)), GOLDEN_GLOBAL);
        assert_eq!(take(Order::new(1 << 40, 42, 7, true, None)), GOLDEN_LARGE);
        assert_eq!(
            take(Order::new(100, 42, 7, true, Some((8, 3)))),
            GOLDEN_BLOCKS
        );
    }

    const GOLDEN_GLOBAL: [u64; 12] = [11, 4, 10, 8, 3, 0, 5, 6, 1, 9, 2, 7];
    const GOLDEN_LARGE: [u64; 12] = [
        253770528901,
        571179930785,
        699499963455,
        792809457268,
        387653224261,
        231498643336,
        283959412514,
        717943000338,
        333004005028,
        698615599447,
        706597320386,
        135081818038,
    ];
    const GOLDEN_BLOCKS: [u64; 12] = [95, 57, 56, 94, 5, 7, 61, 62, 2, 88, 63, 1];
}

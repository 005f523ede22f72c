//! The sampler of a map-style dataset: one epoch = one seeded permutation of `[0, rows)`,
//! computed on the fly ([`permutation`]), split across ranks, with an O(1) state.
//!
//! Design: the order is a function position -> row of `(seed, epoch)` only. Ranks read it
//! interleaved: from a start position `g`, rank `r` of `W` yields positions `g + r`,
//! `g + r + W`, ... So after each rank has yielded `k` indices — ranks move in step, one batch
//! each per training step — every position below `g + k·W` was yielded and none above: that
//! *global position* is the whole state, the same on every rank, and any number of ranks can
//! continue from it (rank `r'` of `W'` yields `g' + r'`, `g' + r' + W'`, ...): every position
//! exactly once per epoch, whatever `W` and `W'`. The `even` policies are the stream's: `Off`
//! yields the rest of the epoch once (ranks differ by at most one index), `Drop` gives every
//! rank `floor(rest / W)` (the last `< W` positions are left for the epoch's end), `Pad` gives
//! every rank `ceil(rest / W)`, repeating positions from the epoch's start.
//!
//! With `Off`, a rank that has yielded all its indices reports the end of the epoch (the rank
//! before it may still have one): loading several ranks' states takes the lowest position,
//! which is then the true one (see [`load`]).

pub mod permutation;

use serde_json::Value;

pub use permutation::{Feistel, Order};

use crate::error::{Error, Result};
use crate::plan::Even;
pub use crate::settings::{SamplerLayout, SamplerSettings};
use crate::state::envelope::{parse_node, py_repr, Node};
use crate::state::sampler::{SamplerSettingsRecord, SamplerSkip, SamplerState};

impl SamplerSettings {
    /// The order of epoch `epoch`.
    pub fn order(&self, epoch: u64) -> Order {
        Order::new(self.rows, self.seed, epoch, self.shuffle, self.block)
    }

    /// The state at the start of `epoch` (skip history kept).
    pub fn start(&self, epoch: u64, skips: Vec<SamplerSkip>) -> SamplerState {
        SamplerState::new(self, epoch, 0, skips)
    }

    /// Parse `v` (strictly) as a state of this sampler; errors name the field under `what`.
    pub fn parse(&self, v: Value, what: &str) -> Result<SamplerState> {
        let format = v.get("format").cloned().unwrap_or(Value::Null);
        let Node::Sampler(st) = parse_node(v, what)? else {
            return Err(Error::State(format!(
                "{what} is not a shardstream sampler state (format={})",
                py_repr(&format)
            )));
        };
        let st = *st;
        let diffs = st.settings.differences(&SamplerSettingsRecord::of(self));
        if !diffs.is_empty() {
            return Err(Error::State(format!(
                "{what} was saved by a sampler with other settings: {}",
                diffs.join("; ")
            )));
        }
        Ok(st)
    }
}

/// The states of every rank of a checkpoint (or of one): one state to continue from. All must
/// be of this sampler's settings and of one epoch; the position is the lowest (a rank of an
/// uneven split that ran out reports the epoch's end), and every other position must be that
/// one or the end — ranks that were not in step cannot be continued exactly.
pub fn load(settings: &SamplerSettings, values: Vec<Value>) -> Result<SamplerState> {
    if values.is_empty() {
        return Err(Error::State("no sampler state given".into()));
    }
    let mut states = Vec::with_capacity(values.len());
    for (i, v) in values.into_iter().enumerate() {
        states.push(settings.parse(v, &format!("state[{i}]"))?);
    }
    let epoch = states[0].epoch;
    if let Some(s) = states.iter().find(|s| s.epoch != epoch) {
        return Err(Error::State(format!(
            "the sampler states are in different epochs ({epoch} and {}): load the states of \
             one checkpoint",
            s.epoch
        )));
    }
    let position = states.iter().map(|s| s.position).min().expect("not empty");
    let mut positions: Vec<u64> = states
        .iter()
        .map(|s| s.position)
        .filter(|&p| p != settings.rows)
        .collect();
    positions.sort_unstable();
    positions.dedup();
    if positions.len() > 1 {
        return Err(Error::State(format!(
            "the sampler states are at different positions of epoch {epoch} ({}): their ranks \
             were not in step, so no position continues all of them exactly",
            positions
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let mut skips: Vec<SamplerSkip> = states
        .iter()
        .flat_map(|s| s.skips.iter().copied())
        .collect();
    skips.sort_unstable();
    skips.dedup();
    Ok(SamplerState::new(settings, epoch, position, skips))
}

/// One rank's indices of one epoch from a start position (see the module docs). `k` counts the
/// indices this rank has yielded since `start`.
#[derive(Debug, Clone)]
pub struct Run {
    order: Order,
    settings: SamplerSettings,
    epoch: u64,
    start: u64,
    layout: SamplerLayout,
    /// Indices this rank yields from `start`.
    count: u64,
    /// Where every rank stands once all have yielded their indices.
    end: u64,
    skips: Vec<SamplerSkip>,
}

impl Run {
    /// The run of `layout` from state `st` (already parsed against `settings`).
    pub fn new(settings: &SamplerSettings, layout: SamplerLayout, st: &SamplerState) -> Run {
        let n = settings.rows;
        let start = st.position.min(n);
        let rest = n - start;
        let (w, r) = (layout.world, layout.rank);
        let count = match layout.even {
            Even::Off if rest > r => (rest - r).div_ceil(w),
            Even::Off => 0,
            Even::Drop => rest / w,
            Even::Pad => rest.div_ceil(w),
        };
        let end = match layout.even {
            Even::Drop => start + rest / w * w,
            _ => n,
        };
        Run {
            order: settings.order(st.epoch),
            settings: settings.clone(),
            epoch: st.epoch,
            start,
            layout,
            count,
            end,
            skips: st.skips.clone(),
        }
    }

    /// Indices this rank yields from the start.
    pub fn len(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// This rank's indices `k .. k + max` (fewer at the end).
    pub fn indices(&self, k: u64, max: u64) -> Vec<u64> {
        let stop = k.saturating_add(max).min(self.count);
        let k = k.min(stop);
        let (n, w, r, g) = (
            self.settings.rows,
            self.layout.world,
            self.layout.rank,
            self.start,
        );
        let mut out = Vec::with_capacity((stop - k) as usize);
        // Pad's positions past the end wrap to the epoch's start (only pad reaches them).
        let positions = (k..stop).map(|i| {
            let p = g + i * w + r;
            if p >= n {
                p % n
            } else {
                p
            }
        });
        self.order.rows_at(positions, &mut out);
        out
    }

    /// Where the epoch stands in step with this rank after it yielded `k` indices.
    fn lockstep(&self, k: u64) -> u64 {
        self.start
            .saturating_add(k.saturating_mul(self.layout.world))
            .min(self.end)
    }

    /// The global position after this rank yielded `k` indices: the lockstep position, or
    /// the epoch's end once this rank has no more.
    pub fn position_after(&self, k: u64) -> u64 {
        if k >= self.count {
            self.end
        } else {
            self.start + k * self.layout.world
        }
    }

    /// The state after this rank yielded `k` indices.
    pub fn state(&self, k: u64) -> SamplerState {
        SamplerState::new(
            &self.settings,
            self.epoch,
            self.position_after(k),
            self.skips.clone(),
        )
    }

    /// Pass over `n` more indices after `k` without yielding them; returns the new `k`. Ranks
    /// in step skipping the same `n` record the positions their next `n` steps would have
    /// yielded: each the same range, or nothing if it has no indices left (it cannot tell how
    /// many steps it has been idle, so it records from where it stands: the epoch's end).
    pub fn skip(&mut self, k: u64, n: u64) -> u64 {
        let a = self.position_after(k);
        let b = self.lockstep(k.saturating_add(n)).max(a);
        if b > a {
            self.skips.push(SamplerSkip {
                epoch: self.epoch,
                start: a,
                stop: b,
            });
        }
        k.saturating_add(n).min(self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn settings(rows: u64, seed: u64, block: Option<(u64, u64)>) -> SamplerSettings {
        SamplerSettings {
            rows,
            seed,
            shuffle: true,
            block,
        }
    }

    fn layout(rank: u64, world: u64, even: Even) -> SamplerLayout {
        SamplerLayout {
            rank,
            world,
            even: if world == 1 { Even::Off } else { even },
        }
    }

    fn all(run: &Run) -> Vec<u64> {
        run.indices(0, u64::MAX)
    }

    fn even_of(i: u8) -> Even {
        [Even::Off, Even::Drop, Even::Pad][i as usize % 3]
    }

    fn block_of(b: Option<(u64, u64)>) -> Option<(u64, u64)> {
        b.map(|(b, w)| (b.max(1), w.max(1)))
    }

    proptest! {
        /// One epoch over `world` ranks: `Off` yields every index exactly once, `Drop` gives
        /// every rank the same count and loses fewer than `world`, `Pad` the same count and
        /// covers everything, repeating fewer than `world`.
        #[test]
        fn ranks_split_the_epoch(rows in 0u64..300, world in 1u64..7, even in 0u8..3,
                                 seed in any::<u64>(), block in proptest::option::of((1u64..20, 1u64..5))) {
            let s = settings(rows, seed, block_of(block));
            let even = even_of(even);
            let mut count = vec![0u32; rows as usize];
            let mut lens = Vec::new();
            for r in 0..world {
                let run = Run::new(&s, layout(r, world, even), &s.start(0, vec![]));
                let got = all(&run);
                prop_assert_eq!(got.len() as u64, run.len());
                lens.push(run.len());
                for i in got { count[i as usize] += 1; }
            }
            let once = count.iter().filter(|&&c| c == 1).count() as u64;
            match layout(0, world, even).even {
                Even::Off => {
                    prop_assert!(count.iter().all(|&c| c == 1));
                    prop_assert!(lens.iter().max().unwrap() - lens.iter().min().unwrap() <= 1);
                }
                Even::Drop => {
                    prop_assert!(lens.iter().all(|&l| l == rows / world));
                    prop_assert!(count.iter().all(|&c| c <= 1));
                    prop_assert!(rows - once < world);
                }
                Even::Pad => {
                    prop_assert!(lens.iter().all(|&l| l == rows.div_ceil(world)));
                    prop_assert!(count.iter().all(|&c| c >= 1));
                    let extra: u32 = count.iter().map(|&c| c - 1).sum();
                    prop_assert!((extra as u64) < world);
                }
            }
        }

        /// Ranks in step for `k` indices each, their states loaded together, continued on any
        /// other number of ranks: with `even = Off` every index of the epoch exactly once; the
        /// states agree on one position (ranks that ran out report the end).
        #[test]
        fn elastic_resume_reads_each_index_once(rows in 0u64..300, world in 1u64..6, world2 in 1u64..6,
                                                 k in 0u64..80, seed in any::<u64>(),
                                                 block in proptest::option::of((1u64..20, 1u64..5)),
                                                 one_state in any::<bool>()) {
            let s = settings(rows, seed, block_of(block));
            let mut count = vec![0u32; rows as usize];
            let mut states = Vec::new();
            for r in 0..world {
                let run = Run::new(&s, layout(r, world, Even::Off), &s.start(4, vec![]));
                let k = k.min(run.len());
                for i in run.indices(0, k) { count[i as usize] += 1; }
                states.push(run.state(k).to_value());
            }
            // Rank 0's state alone is the global position too.
            let states = if one_state { vec![states[0].clone()] } else { states };
            let st = load(&s, states).unwrap();
            prop_assert_eq!(st.epoch, 4);
            for r in 0..world2 {
                let run = Run::new(&s, layout(r, world2, Even::Off), &st);
                for i in all(&run) { count[i as usize] += 1; }
            }
            prop_assert!(count.iter().all(|&c| c == 1), "{:?}", count);
        }

        /// A run resumed from its own state after `k` indices continues identically, for every
        /// policy, order and rank.
        #[test]
        fn resume_continues_identically(rows in 0u64..400, world in 1u64..6, even in 0u8..3,
                                        k in 0u64..120, seed in any::<u64>(),
                                        block in proptest::option::of((1u64..20, 1u64..5))) {
            let s = settings(rows, seed, block_of(block));
            let even = even_of(even);
            for r in 0..world {
                let l = layout(r, world, even);
                let run = Run::new(&s, l, &s.start(1, vec![]));
                let full = all(&run);
                let k = k.min(run.len());
                let st = run.state(k);
                let parsed = s.parse(st.to_value(), "state").unwrap();
                let rest = all(&Run::new(&s, l, &parsed));
                prop_assert_eq!(&full[k as usize..], &rest[..]);
            }
        }

        /// Skips: ranks in step for `k` steps (a rank that ran out yielded fewer), each skipping
        /// `n`, record together exactly the positions of those `n` steps (a rank with nothing
        /// left records nothing), and each run continues after it as reading and discarding
        /// `n` would.
        #[test]
        fn skips_are_recorded_once_for_all_ranks(rows in 1u64..300, world in 1u64..5, even in 0u8..3,
                                                 k in 0u64..40, n in 1u64..40, seed in any::<u64>()) {
            let s = settings(rows, seed, None);
            let even = even_of(even);
            let mut records = std::collections::BTreeSet::new();
            for r in 0..world {
                let l = layout(r, world, even);
                let mut run = Run::new(&s, l, &s.start(0, vec![]));
                let full = all(&run);
                let k = k.min(run.len());
                let k2 = run.skip(k, n);
                prop_assert_eq!(k2, (k + n).min(run.len()));
                let st = run.state(k2);
                prop_assert!(st.skips.len() <= 1);
                records.extend(st.skips.iter().copied());
                let rest = all(&Run::new(&s, l, &st));
                prop_assert_eq!(&full[k2 as usize..], &rest[..]);
            }
            // The epoch's end for the policy, and the steps k .. k + n of every rank in it.
            let end = match layout(0, world, even).even { Even::Drop => rows / world * world, _ => rows };
            let (lo, hi) = ((k * world).min(end), ((k + n) * world).min(end));
            let want: std::collections::BTreeSet<SamplerSkip> = (lo < hi)
                .then_some(SamplerSkip { epoch: 0, start: lo, stop: hi })
                .into_iter()
                .collect();
            prop_assert_eq!(records, want);
        }
    }

    #[test]
    fn load_refuses_other_settings_and_ranks_out_of_step() {
        let s = settings(100, 1, None);
        let run = Run::new(&s, layout(0, 2, Even::Off), &s.start(0, vec![]));
        let other = settings(100, 2, None);
        let e = load(&other, vec![run.state(3).to_value()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("seed: state has 1, sampler has 2"), "{e}");
        let e = load(&s, vec![run.state(3).to_value(), run.state(4).to_value()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not in step") && e.contains("6, 8"), "{e}");
        let late = Run::new(&s, layout(0, 2, Even::Off), &s.start(1, vec![]));
        let e = load(&s, vec![run.state(3).to_value(), late.state(3).to_value()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("different epochs"), "{e}");
        assert!(load(&s, vec![]).is_err());
        let stream_state = serde_json::json!({"format": "shardstream.ParquetStream", "version": 2});
        let e = load(&s, vec![stream_state]).unwrap_err().to_string();
        assert!(e.contains("state[0]"), "{e}");
        // Same position on every rank: loads, skip records merged without duplicates.
        let mut a = Run::new(&s, layout(0, 2, Even::Off), &s.start(0, vec![]));
        let mut b = Run::new(&s, layout(1, 2, Even::Off), &s.start(0, vec![]));
        let (ka, kb) = (a.skip(0, 5), b.skip(0, 5));
        let st = load(&s, vec![a.state(ka).to_value(), b.state(kb).to_value()]).unwrap();
        assert_eq!((st.position, st.skips.len()), (10, 1));
    }

    #[test]
    fn sequential_order_interleaves_ranks() {
        let s = SamplerSettings {
            rows: 10,
            seed: 0,
            shuffle: false,
            block: None,
        };
        let run = |r| all(&Run::new(&s, layout(r, 3, Even::Off), &s.start(0, vec![])));
        assert_eq!(run(0), vec![0, 3, 6, 9]);
        assert_eq!(run(1), vec![1, 4, 7]);
        assert_eq!(run(2), vec![2, 5, 8]);
        let pad = all(&Run::new(&s, layout(2, 3, Even::Pad), &s.start(0, vec![])));
        assert_eq!(pad, vec![2, 5, 8, 1]); // position 11 wraps to 1
        let drop = all(&Run::new(&s, layout(0, 3, Even::Drop), &s.start(0, vec![])));
        assert_eq!(drop, vec![0, 3, 6]);
    }

    /// The state is O(1): at 10^9 rows, any position, the same few fields; computing a chunk
    /// at 99% of the epoch costs what it costs at the start.
    #[test]
    fn billion_rows_resume_anywhere() {
        let s = settings(1_000_000_000, 9, None);
        let l = layout(3, 8, Even::Drop);
        let run = Run::new(&s, l, &s.start(2, vec![]));
        let k = run.len() * 99 / 100;
        let st = run.state(k);
        assert!(st.to_value().to_string().len() < 300);
        let again = Run::new(&s, l, &s.parse(st.to_value(), "s").unwrap());
        assert_eq!(run.indices(k, 1000), again.indices(0, 1000));
    }
}

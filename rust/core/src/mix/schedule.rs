//! A mixture's weights over its items: constant, stepped or linear, quantized to integers.
//!
//! Weights are integers summing to [`UNIT`] (2**32) at every item, so the mixing rule is exact
//! integer arithmetic and a state resumes to the same choices on every machine. The axis is the
//! mixture's *global* item count (all slots together); a slot maps its own `t`-th item since its
//! last rebase to `base + t * stride` (stride = the number of slots), so every slot follows the
//! same schedule without talking to the others. A linear segment is a staircase of at most
//! [`LINEAR_STEPS`] equal steps, each at the weights of its midpoint: the mixing rule needs the
//! future weights to plan (rule.rs), and a staircase keeps that a closed form per step.

use std::sync::Arc;

use crate::error::{Error, Result};

/// Weights at one item sum to this.
pub const UNIT: u64 = 1 << 32;
/// Steps of a linear segment (fewer when the segment is shorter than this many items).
pub const LINEAR_STEPS: u64 = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Each point's weights hold until the next point.
    Step,
    /// Weights move linearly from each point to the next (a staircase of [`LINEAR_STEPS`]).
    Linear,
}

impl Kind {
    pub fn parse(v: &str, what: &str) -> Result<Kind> {
        match v {
            "step" => Ok(Kind::Step),
            "linear" => Ok(Kind::Linear),
            other => Err(Error::Config(format!(
                "{what} must be 'step' or 'linear', got {other:?}"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Step => "step",
            Kind::Linear => "linear",
        }
    }
}

/// Weights of the sources (in the mixture's canonical order) over global items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub kind: Kind,
    /// `(global item, weights summing to UNIT)`; the first at 0, `at` strictly increasing.
    pub points: Vec<(u64, Vec<u64>)>,
}

/// Quantize non-negative weights to integers summing to [`UNIT`] (largest remainder; ties to
/// the lower index; a positive weight is at least one unit). `what` names the weights in
/// errors.
pub fn quantize(w: &[f64], what: &str) -> Result<Vec<u64>> {
    if let Some((i, x)) = w
        .iter()
        .enumerate()
        .find(|(_, x)| !x.is_finite() || **x < 0.0)
    {
        return Err(Error::Config(format!(
            "{what}: weight {i} is {x}; weights must be finite and >= 0"
        )));
    }
    let total: f64 = w.iter().sum();
    if total <= 0.0 || !total.is_finite() {
        return Err(Error::Config(format!(
            "{what}: the weights sum to {total}; at least one must be > 0"
        )));
    }
    let raw: Vec<f64> = w.iter().map(|x| x / total * UNIT as f64).collect();
    // A positive weight never rounds to 0 (the source would silently never be taken).
    let floor: Vec<u64> = w.iter().map(|x| u64::from(*x > 0.0)).collect();
    let mut q: Vec<u64> = raw
        .iter()
        .zip(&floor)
        .map(|(x, f)| (x.floor() as u64).clamp(*f, UNIT))
        .collect();
    let frac: Vec<f64> = raw.iter().zip(&q).map(|(x, f)| x - *f as f64).collect();
    settle(&mut q, &floor, |a, b| {
        frac[b].total_cmp(&frac[a]).then(a.cmp(&b))
    });
    Ok(q)
}

/// Make `q` sum to exactly [`UNIT`]: add one to entries in `order` (largest remainder first), or
/// take one from entries in reverse order, never below `floor` (float rounding, or positive
/// weights raised to one unit, can overshoot by a few units).
fn settle(q: &mut [u64], floor: &[u64], order: impl Fn(usize, usize) -> std::cmp::Ordering) {
    let mut idx: Vec<usize> = (0..q.len()).collect();
    idx.sort_by(|&a, &b| order(a, b));
    let mut sum: u64 = q.iter().sum();
    let mut i = 0;
    while sum < UNIT {
        q[idx[i % idx.len()]] += 1;
        sum += 1;
        i += 1;
    }
    let mut i = idx.len();
    while sum > UNIT {
        i = if i == 0 { idx.len() - 1 } else { i - 1 };
        if q[idx[i]] > floor[idx[i]] {
            q[idx[i]] -= 1;
            sum -= 1;
        }
    }
}

/// `num[s] / den` rounded to integers by largest remainder; `sum(num)` must be `UNIT * den`.
fn apportion(num: &[u128], den: u128) -> Vec<u64> {
    let mut q: Vec<u64> = num.iter().map(|n| (n / den) as u64).collect();
    let rem: Vec<u128> = num.iter().map(|n| n % den).collect();
    let floor = vec![0; q.len()];
    settle(&mut q, &floor, |a, b| rem[b].cmp(&rem[a]).then(a.cmp(&b)));
    q
}

/// `w` restricted to the `active` sources and scaled back to [`UNIT`]; `None` when the active
/// sources' weights are all 0.
pub fn renormalize(w: &[u64], active: &[bool]) -> Option<Vec<u64>> {
    let total: u128 = w
        .iter()
        .zip(active)
        .filter(|(_, a)| **a)
        .map(|(x, _)| *x as u128)
        .sum();
    if total == 0 {
        return None;
    }
    if total == UNIT as u128 {
        return Some(
            w.iter()
                .zip(active)
                .map(|(x, a)| if *a { *x } else { 0 })
                .collect(),
        );
    }
    let num: Vec<u128> = w
        .iter()
        .zip(active)
        .map(|(x, a)| if *a { *x as u128 * UNIT as u128 } else { 0 })
        .collect();
    let mut q = apportion(&num, total);
    // Inactive sources had remainder 0 and stay at 0 unless every active remainder was taken.
    for (x, a) in q.iter_mut().zip(active) {
        if !*a {
            debug_assert_eq!(*x, 0);
            *x = 0;
        }
    }
    Some(q)
}

impl Schedule {
    /// Constant weights.
    pub fn constant(w: Vec<u64>) -> Schedule {
        Schedule {
            kind: Kind::Step,
            points: vec![(0, w)],
        }
    }

    /// Check the points' shape: first at 0, increasing, each summing to [`UNIT`], `k` weights.
    pub fn check(&self, k: usize, what: &str) -> Result<()> {
        if self.points.first().map(|p| p.0) != Some(0) {
            return Err(Error::Config(format!(
                "{what}: the first point must be at item 0"
            )));
        }
        if self.points.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(Error::Config(format!(
                "{what}: points must be at strictly increasing items"
            )));
        }
        for (at, w) in &self.points {
            if w.len() != k || w.iter().map(|x| *x as u128).sum::<u128>() != UNIT as u128 {
                return Err(Error::Config(format!(
                    "{what}: the weights at item {at} do not sum to 2**32 over {k} sources"
                )));
            }
        }
        Ok(())
    }

    /// The weights at global item `g`, the global start of the piece holding it, and the start
    /// of the next piece (`None`: they hold forever).
    pub fn at(&self, g: u64) -> (Vec<u64>, u64, Option<u64>) {
        let i = self.points.partition_point(|p| p.0 <= g).max(1) - 1;
        let (a, wa) = &self.points[i];
        let Some((b, wb)) = self.points.get(i + 1) else {
            return (wa.clone(), *a, None);
        };
        if self.kind == Kind::Step {
            return (wa.clone(), *a, Some(*b));
        }
        let len = (b - a) as u128;
        let steps = len.min(LINEAR_STEPS as u128);
        let j = ((g - a) as u128 * steps) / len;
        let start = |j: u128| a + (j * len).div_ceil(steps) as u64;
        // The step's weights: the interpolation at its midpoint, (2j + 1) / (2 * steps).
        let (lo, hi) = (2 * steps - 2 * j - 1, 2 * j + 1);
        let num: Vec<u128> = wa
            .iter()
            .zip(wb)
            .map(|(x, y)| *x as u128 * lo + *y as u128 * hi)
            .collect();
        (apportion(&num, 2 * steps), start(j), Some(start(j + 1)))
    }
}

/// Weights as one slot sees them: its item `t` (since its last rebase) is global item
/// `base + t * stride`, and only the `active` sources share the weight.
#[derive(Debug, Clone)]
pub struct Pieces {
    pub schedule: Arc<Schedule>,
    pub base: u64,
    pub stride: u64,
    pub active: Vec<bool>,
}

/// A run of a slot's items with the same weights: items `[start, end)` (`end` `None`: forever).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub start: u64,
    pub end: Option<u64>,
    /// Renormalized over the active sources; where they have no weight, the next point's at
    /// which they have some; all 0 when no point from here on gives them any.
    pub w: Vec<u64>,
}

impl Pieces {
    /// The piece holding the slot's item `t`.
    pub fn piece(&self, t: u64) -> Piece {
        let g = self.base as u128 + t as u128 * self.stride as u128;
        let g = u64::try_from(g).unwrap_or(u64::MAX);
        let (w, gs, ge) = self.schedule.at(g);
        // Local items are ceil((global - base) / stride); the piece holds t, so start <= t < end.
        let local = |x: u64| -> u64 {
            if x <= self.base {
                0
            } else {
                (x - self.base).div_ceil(self.stride).min(t + 1)
            }
        };
        let start = local(gs).min(t);
        let end = ge.map(|e| {
            if e <= self.base {
                t + 1
            } else {
                (e - self.base).div_ceil(self.stride)
            }
        });
        // A stretch where every source still in the mix has weight 0 (those weighted there have
        // left) takes the weights of the next point at which one of them has weight, rather
        // than ending the mixture while later points still weight sources with rows. All 0
        // only when no later point does: then the mixture ends.
        let mut next = ge;
        let mut w = renormalize(&w, &self.active);
        while let (None, Some(g)) = (&w, next) {
            let (wn, _, gn) = self.schedule.at(g);
            w = renormalize(&wn, &self.active);
            next = gn;
        }
        let w = w.unwrap_or_else(|| vec![0; self.active.len()]);
        Piece {
            start,
            end: end.map(|e| e.max(t + 1)),
            w,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantized_weights_sum_to_unit_and_keep_zeros() {
        for w in [
            vec![0.7, 0.3],
            vec![1.0, 1.0, 1.0],
            vec![1e-12, 1.0, 0.0],
            vec![3.0],
        ] {
            let q = quantize(&w, "weights").unwrap();
            assert_eq!(q.iter().sum::<u64>(), UNIT, "{w:?}");
            for (x, y) in w.iter().zip(&q) {
                assert_eq!(*x == 0.0, *y == 0, "{w:?} -> {q:?}");
            }
        }
        assert_eq!(
            quantize(&[0.5, 0.5], "w").unwrap(),
            vec![UNIT / 2, UNIT / 2]
        );
        for bad in [vec![0.0, 0.0], vec![-1.0, 2.0], vec![f64::NAN, 1.0]] {
            assert!(quantize(&bad, "weights").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn renormalize_moves_weight_to_active_sources() {
        let w = quantize(&[0.5, 0.25, 0.25], "w").unwrap();
        let r = renormalize(&w, &[false, true, true]).unwrap();
        assert_eq!(r, vec![0, UNIT / 2, UNIT / 2]);
        assert!(renormalize(&[UNIT, 0], &[false, true]).is_none());
    }

    #[test]
    fn linear_staircase_moves_between_points() {
        let s = Schedule {
            kind: Kind::Linear,
            points: vec![(0, vec![UNIT, 0]), (2048, vec![0, UNIT])],
        };
        s.check(2, "w").unwrap();
        let (w0, a0, b0) = s.at(0);
        assert_eq!((a0, b0), (0, Some(2)));
        assert!(w0[0] > UNIT - UNIT / 512 && w0[1] > 0);
        let (wm, _, _) = s.at(1024);
        assert!(wm[1] > UNIT / 2 && wm[1] < UNIT / 2 + UNIT / 512);
        assert_eq!(s.at(5000), (vec![0, UNIT], 2048, None));
        // Every step sums to UNIT and the weight of source 1 never decreases.
        let mut last = 0;
        for g in 0..2048 {
            let (w, a, b) = s.at(g);
            assert_eq!(w.iter().sum::<u64>(), UNIT);
            assert!(a <= g && g < b.unwrap());
            assert!(w[1] >= last);
            last = w[1];
        }
    }

    #[test]
    fn pieces_map_global_items_to_a_slot() {
        let s = Arc::new(Schedule {
            kind: Kind::Step,
            points: vec![(0, vec![UNIT, 0]), (10, vec![0, UNIT])],
        });
        // Stride 4 from base 1: items 0,1,2 are global 1,5,9; item 3 is global 13.
        let p = Pieces {
            schedule: s,
            base: 1,
            stride: 4,
            active: vec![true, true],
        };
        assert_eq!(
            p.piece(2),
            Piece {
                start: 0,
                end: Some(3),
                w: vec![UNIT, 0]
            }
        );
        assert_eq!(
            p.piece(3),
            Piece {
                start: 3,
                end: None,
                w: vec![0, UNIT]
            }
        );
    }

    #[test]
    fn a_stretch_without_weight_for_the_sources_left_takes_the_next_points() {
        let third = UNIT / 3;
        let s = Arc::new(Schedule {
            kind: Kind::Step,
            points: vec![
                (0, vec![0, 0, UNIT]),
                (10, vec![0, 0, UNIT]),
                (20, vec![third, UNIT - third, 0]),
            ],
        });
        let p = |active: Vec<bool>| Pieces {
            schedule: s.clone(),
            base: 0,
            stride: 1,
            active,
        };
        // Source 2 left: items 0..20 follow the weights at item 20 (the piece keeps its span).
        let left = p(vec![true, true, false]);
        let want = vec![third, UNIT - third, 0];
        assert_eq!(
            left.piece(3),
            Piece {
                start: 0,
                end: Some(10),
                w: want.clone()
            }
        );
        assert_eq!(
            left.piece(12),
            Piece {
                start: 10,
                end: Some(20),
                w: want.clone()
            }
        );
        assert_eq!(
            left.piece(25),
            Piece {
                start: 20,
                end: None,
                w: want
            }
        );
        // Only source 2 is in the mix: from item 20 no point weights it, so all 0 (the end).
        let only = p(vec![false, false, true]);
        assert_eq!(only.piece(5).w, vec![0, 0, UNIT]);
        assert_eq!(only.piece(20).w, vec![0, 0, 0]);
    }
}

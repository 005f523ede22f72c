//! The mixing rule: which source each item of one slot comes from.
//!
//! **Deterministic** (the default) is earliest-deadline-first over the targets. After `t` items
//! since the last rebase, source `s`'s target is `A_s(t) = sum of its weights over those items`
//! (in units of [`UNIT`]) and `d_s = A_s(t) - UNIT * count_s` is its deficit. A source is
//! *released* when taking it keeps its count below its target plus one (`d_s + w_s > 0`), and
//! its *deadline* is the last item by which it must be taken to keep its count above its target
//! minus one (the first `t'` with `d_s + sum_{t..=t'} w_s >= UNIT`). Taking the released source
//! with the earliest deadline keeps `|A_s(t) / UNIT - count_s| < 1` for every source after every
//! item: Tijdeman's theorem (the chairman assignment problem, with weights that may change at
//! every item) says an assignment within that bound exists, and EDF finds a feasible schedule
//! of unit jobs with integer release times and deadlines whenever one exists. Deadlines look
//! ahead through the schedule (closed form per constant piece); a source's deadline changes only
//! when it is taken, so an item costs O(sources) plus one deadline. No random state.
//!
//! **Stratified** takes the deterministic rule's next `block` choices as a block and serves them
//! in a random order (counter-based: the permutation's key is derived from the seed, the slot
//! and where the block starts, never stored), so every block holds fixed counts and the order
//! inside it carries no pattern. **Random** draws each item i.i.d. with the current weights from
//! a ChaCha8 stream at word position `2 * t`: resuming sets the position, no replay.
//!
//! Exhaustion is handled at the boundary before each choice (before each block when
//! stratified): a source whose rows have run out either ends the mixture (`Stop`) or leaves it
//! (`Drop`: the others renormalize and the targets *rebase*: counts and targets restart at 0 from
//! here, with the schedule's position carried on). A stratified block is cut right after a
//! source's last row, so the boundary comes there.

use std::sync::Arc;

use super::schedule::{Piece, Pieces, Schedule, UNIT};
use crate::error::{Error, Result};
use crate::plan::Slot;
use crate::rng::{derive_key, permute, Prng};

/// How items are drawn from the sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mixing {
    Deterministic,
    /// Deterministic counts per block of this many items, served in a random order.
    Stratified(u64),
    Random,
}

impl Mixing {
    pub fn name(self) -> &'static str {
        match self {
            Mixing::Deterministic => "deterministic",
            Mixing::Stratified(_) => "stratified",
            Mixing::Random => "random",
        }
    }
}

/// What happens when a source runs out of rows (after its `max_epochs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The mixture ends.
    Stop,
    /// The source leaves; the others share its weight.
    Drop,
}

/// What the rule needs to know about a mixture (shared by every slot's mixer).
#[derive(Debug, Clone)]
pub struct Rule {
    pub schedule: Arc<Schedule>,
    pub mixing: Mixing,
    pub policies: Vec<Policy>,
    pub seed: u64,
}

/// Rows each source can still give (`u64::MAX`: unbounded), as the stream's positions say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Avail {
    pub left: Vec<u64>,
}

/// A mixer's position, by source index (the mixture's canonical order); see state/mixture.rs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MixerPos {
    /// Items this slot yielded (after a resize: see elastic in mix/resume.rs).
    pub items: u64,
    /// Global item count at the last rebase.
    pub base: u64,
    /// Items this slot yielded since the last rebase.
    pub since: u64,
    /// Items this slot may still yield (`None`: no limit).
    pub left: Option<u64>,
    /// Deficits of the sources still in the mix (`None`: the source has left).
    pub deficits: Vec<Option<i64>>,
    /// Stratified: the current block's counts per source and how many of its items were served.
    pub block: Option<(Vec<u64>, u64)>,
    /// Items taken from each source.
    pub taken: Vec<u64>,
}

/// A relative deadline beyond this is not ordered by [`Lanes`]' keys.
const FAR: i64 = 1 << 46;
/// Not released within the piece.
const NEVER: i64 = i64::MAX;
/// Mixtures of more sources choose item by item (`choose`); up to this many, a batch's choices
/// run in [`Lanes`] of a fixed width (4, 8, ... this).
const MAX_LANES: usize = 256;

/// [`Lanes::run`] writes its items into this many slots of the output at a time.
const CHUNK: i64 = 4096;

/// The key [`Lanes`] orders released sources by: its deadline, then its index.
fn key(deadline: i64, s: usize) -> i64 {
    deadline.clamp(-FAR, FAR) << 16 | s as i64
}

/// What a take reads and writes of one source in [`Lanes`], in one place (one bounds check).
#[derive(Clone, Copy, Default)]
struct Line {
    /// Weight > 0: the deficit's line. `c` is the last item before the deficit reaches a whole
    /// item, by `rem` more: the deficit before item `x` is `UNIT + rem - w * (c + 1 - x)`.
    c: i64,
    rem: i64,
    /// `UNIT = q * w + r`: a taken item moves the line by `q` items and `r` of remainder.
    q: i64,
    r: i64,
    w: i64,
    /// Weight 0: the deficit, which only a take changes.
    d0: i64,
    /// Items taken in this run.
    taken: u64,
}

impl Line {
    /// The deficit before item `x`.
    fn deficit(&self, x: i64) -> i64 {
        if self.w == 0 {
            return self.d0;
        }
        (UNIT as i128 + self.rem as i128 - self.w as i128 * (self.c as i128 + 1 - x as i128)) as i64
    }
}

/// [`Mixer::run_piece`]'s view of each source within a piece, in items from the run's first
/// item, over `N` lanes (a power of two; the lanes past the mixture's sources are never
/// released): the scan for the earliest released deadline is over fixed-size arrays, unrolled
/// and without bounds checks, and a take touches one [`Line`].
struct Lanes<const N: usize> {
    /// The first item it is released at (`NEVER`: not in this piece).
    rel: [i64; N],
    /// `key(deadline, source)`.
    key: [i64; N],
    line: [Line; N],
}

/// Why [`Lanes::run`] returned.
enum Stop {
    /// It made the run's last item.
    Done,
    /// The earliest released deadline is not one it can order (passed, or too far).
    Unordered,
    /// The source it just took has its next deadline past the piece: the caller computes it.
    Beyond(usize),
}

impl<const N: usize> Lanes<N> {
    /// Items from `*tau` until `len` (or a stop): each the released source with the earliest
    /// deadline, written to `out[item]`.
    #[inline(never)]
    fn run(&mut self, tau: &mut i64, len: i64, end_rel: i64, out: &mut [u16]) -> Stop {
        const { assert!(N.is_power_of_two() && N <= 1 << 16) };
        // Keys and release items are copied out and written back at the end, and a take
        // updates its lane with a select over all lanes (constant indices): at 4 lanes they
        // then stay in registers and the next item's scan does not wait on the store of the
        // last one's key. K=3: 3.6% -> 2.3% of a mixed pass's CPU samples (~8 -> ~5 ns an
        // item); at 8 lanes they spill and it is as before (docs/benchmarks.md, "Mixtures").
        let (mut key, mut rel) = (self.key, self.rel);
        let mut t = *tau;
        let stop = loop {
            if t == len {
                break Stop::Done;
            }
            // The earliest deadline of all is usually released: one plain min over the keys,
            // and a second one over the released ones only when it is not.
            let mut best = key.iter().fold(i64::MAX, |b, k| b.min(*k));
            let lane = (best & 0xffff) as usize & (N - 1);
            let best_rel = (0..N).fold(NEVER, |r, i| if i == lane { rel[i] } else { r });
            if best_rel > t {
                best = i64::MAX;
                for (rel, key) in rel.iter().zip(&key) {
                    best = best.min(if *rel <= t { *key } else { i64::MAX });
                }
            }
            let dl = best >> 16;
            // (no released source: best = MAX, so dl >= FAR)
            if dl < t || dl >= FAR {
                break Stop::Unordered;
            }
            let s = (best & 0xffff) as usize & (N - 1);
            out[t as usize] = s as u16;
            t += 1;
            let ln = &mut self.line[s];
            ln.taken += 1;
            if ln.w == 0 {
                ln.d0 -= UNIT as i64;
                set(&mut rel, s, NEVER);
                continue;
            }
            // released again once the line passes the next whole item: at this deadline (or the
            // item after, when it lands on it exactly)
            set(&mut rel, s, ln.c + i64::from(ln.rem == 0));
            let rem = ln.rem - ln.r;
            let carry = i64::from(rem < 0);
            ln.rem = rem + carry * ln.w;
            ln.c += ln.q + carry;
            if ln.c >= end_rel {
                break Stop::Beyond(s);
            }
            // c < 2**35 here (a deficit stays above -2 items, w >= 1, the run < 2**30 items):
            // no clamp needed
            debug_assert!(ln.c < FAR);
            set(&mut key, s, ln.c << 16 | s as i64);
        };
        (self.key, self.rel) = (key, rel);
        *tau = t;
        stop
    }
}

/// `a[s] = v` as a select over every lane (see [`Lanes::run`]).
#[inline(always)]
fn set<const N: usize>(a: &mut [i64; N], s: usize, v: i64) {
    for (i, x) in a.iter_mut().enumerate() {
        *x = if i == s { v } else { *x };
    }
}

#[derive(Debug, Clone)]
struct Block {
    quotas: Vec<u64>,
    order: Vec<u16>,
    at: usize,
}

/// One slot's mixer.
#[derive(Clone)]
pub struct Mixer {
    rule: Arc<Rule>,
    slot: Slot,
    pieces: Pieces,
    /// The piece holding item `inner`.
    piece: Piece,
    /// Some source has weight in `piece` (kept with it: checked once per item).
    live: bool,
    /// Items yielded since the last rebase.
    since: u64,
    /// Items the rule has decided since the last rebase (stratified: the end of the block).
    inner: u64,
    d: Vec<i64>,
    /// Absolute deadline of each source, valid until it is taken (`u64::MAX`: never).
    deadline: Vec<u64>,
    rng: Option<Prng>,
    block: Option<Block>,
    left: Option<u64>,
    ended: bool,
    items: u64,
    taken: Vec<u64>,
    /// The choice `peek` made and `take` has not consumed.
    cached: Option<Option<usize>>,
}

impl Mixer {
    /// A mixer starting at a rebase: global item `base`, every source in `active` at target 0.
    pub fn fresh(
        rule: Arc<Rule>,
        slot: Slot,
        base: u64,
        left: Option<u64>,
        active: Vec<bool>,
        items: u64,
        taken: Vec<u64>,
    ) -> Mixer {
        let k = rule.policies.len();
        let pieces = Pieces {
            schedule: rule.schedule.clone(),
            base,
            stride: slot.count as u64,
            active,
        };
        let piece = pieces.piece(0);
        let mut m = Mixer {
            rule,
            slot,
            pieces,
            live: false,
            piece,
            since: 0,
            inner: 0,
            d: vec![0; k],
            deadline: vec![u64::MAX; k],
            rng: None,
            block: None,
            left,
            ended: false,
            items,
            taken,
            cached: None,
        };
        m.reset_rule();
        m
    }

    /// A mixer continuing a saved position (checked here: a position the rule can reach keeps
    /// every deficit within one item, summing to 0).
    pub fn restore(rule: Arc<Rule>, slot: Slot, p: &MixerPos) -> Result<Mixer> {
        let k = rule.policies.len();
        let bad = |m: String| Err(Error::State(format!("invalid mixer state: {m}")));
        if p.deficits.len() != k || p.taken.len() != k {
            return bad(format!(
                "it has {} sources, the mixture {k}",
                p.deficits.len()
            ));
        }
        let active: Vec<bool> = p.deficits.iter().map(Option::is_some).collect();
        let d: Vec<i64> = p.deficits.iter().map(|x| x.unwrap_or(0)).collect();
        if d.iter().any(|x| x.unsigned_abs() > UNIT) {
            return bad("a deficit is more than one item (2**32)".into());
        }
        if d.iter().map(|x| *x as i128).sum::<i128>() != 0 {
            return bad("the deficits do not sum to 0".into());
        }
        let mut inner = p.since;
        let mut block = None;
        match (rule.mixing, &p.block) {
            (Mixing::Stratified(size), Some((quotas, at))) => {
                let n: u64 = quotas.iter().sum();
                if quotas.len() != k || *at >= n || n > size || *at > p.since {
                    return bad(format!(
                        "block of {n} items served up to {at} (block size {size}, {} items since \
                         the last rebase)",
                        p.since
                    ));
                }
                if quotas.iter().zip(&active).any(|(q, a)| *q > 0 && !a) {
                    return bad("its block takes from a source that has left".into());
                }
                // A block is served before the item limit is looked at (as before exhaustion).
                if p.left.is_some_and(|l| l < n - at) {
                    return bad(format!(
                        "its block has {} items left to serve, more than the {} the slot may \
                         still yield",
                        n - at,
                        p.left.unwrap_or(0)
                    ));
                }
                inner = p.since - at + n;
                block = Some((quotas.clone(), *at));
            }
            (_, Some(_)) => return bad(format!("a block, but mixing is {}", rule.mixing.name())),
            _ => {}
        }
        let mut m = Mixer::fresh(rule, slot, p.base, p.left, active, p.items, p.taken.clone());
        m.since = p.since;
        m.inner = inner;
        m.d = d;
        m.reset_rule();
        if let Some((quotas, at)) = block {
            let order = m.block_order(&quotas, p.since - at);
            m.block = Some(Block {
                quotas,
                order,
                at: at as usize,
            });
        }
        Ok(m)
    }

    /// The position to save.
    pub fn position(&self) -> MixerPos {
        MixerPos {
            items: self.items,
            base: self.pieces.base,
            since: self.since,
            left: self.left,
            deficits: self
                .d
                .iter()
                .zip(&self.pieces.active)
                .map(|(d, a)| a.then_some(*d))
                .collect(),
            block: self
                .block
                .as_ref()
                .filter(|b| b.at < b.order.len())
                .map(|b| (b.quotas.clone(), b.at as u64)),
            taken: self.taken.clone(),
        }
    }

    pub fn ended(&self) -> bool {
        self.ended
    }

    pub fn active(&self) -> &[bool] {
        &self.pieces.active
    }

    pub fn taken(&self) -> &[u64] {
        &self.taken
    }

    /// Items of each source the stratified block in progress still takes (all 0 without one):
    /// `decide` follows a block's order before any boundary, so these rows must exist.
    pub fn block_rest(&self) -> Vec<u64> {
        let mut rest = vec![0u64; self.taken.len()];
        if let Some(b) = &self.block {
            for s in b.order.iter().skip(b.at) {
                rest[*s as usize] += 1;
            }
        }
        rest
    }

    /// The global item count this slot estimates: `base + since * slots`.
    pub fn global(&self) -> u64 {
        let g = self.pieces.base as u128 + self.since as u128 * self.slot.count as u128;
        u64::try_from(g).unwrap_or(u64::MAX)
    }

    /// The weights of the next item (renormalized over the sources still in the mix).
    pub fn weights(&mut self) -> Vec<u64> {
        self.ensure_piece();
        self.piece.w.clone()
    }

    /// The next item's source without taking it (`None`: the mixture has ended here).
    pub fn peek(&mut self, avail: &Avail) -> Option<usize> {
        if let Some(c) = self.cached {
            return c;
        }
        let c = self.decide(avail);
        if c.is_none() {
            self.ended = true;
        }
        self.cached = Some(c);
        c
    }

    /// Forget the choice `peek` made: its source turned out to have no item after all (a
    /// packing source finds out only when its packer cannot make a row). Mark it run out in
    /// `avail` and peek again: the boundary then applies its policy there. A stratified block
    /// is cut at that point (the rebase that follows a drop restarts the counts anyway).
    pub fn unpeek(&mut self) {
        self.cached = None;
        self.block = None;
    }

    /// Take the next item: its source, with `avail` counted down.
    pub fn take(&mut self, avail: &mut Avail) -> Option<usize> {
        let c = self.peek(avail);
        self.cached = None;
        let s = c?;
        match self.rule.mixing {
            Mixing::Deterministic => self.commit(s),
            Mixing::Random => self.inner += 1,
            Mixing::Stratified(_) => {
                if let Some(b) = &mut self.block {
                    b.at += 1;
                }
            }
        }
        self.since += 1;
        self.items += 1;
        self.taken[s] += 1;
        if let Some(l) = &mut self.left {
            debug_assert!(*l > 0, "an item taken past the item limit");
            *l -= 1;
        }
        if avail.left[s] != u64::MAX {
            // a row the mixer counted on: `new_block` and the load's check keep a block inside
            debug_assert!(avail.left[s] > 0, "source {s} taken with no row left");
            avail.left[s] -= 1;
        }
        c
    }

    /// Take up to `n` items at once, appending their sources to `out` and counting them in
    /// `counts`: the same items `take` would give, without the per-item boundary and peek.
    /// Only when the boundary cannot act within them (deterministic mixing, no pending peek,
    /// no item limit below `n`, every source in the mix with at least `n` rows); otherwise
    /// takes nothing, and may stop early (the rule ends): the caller goes on with `take`.
    pub fn take_run(&mut self, avail: &mut Avail, n: u64, counts: &mut [u64], out: &mut Vec<u16>) {
        if self.ended
            || self.cached.is_some()
            || self.rule.mixing != Mixing::Deterministic
            || self.left.is_some_and(|l| l < n)
            || (self.pieces.active.iter())
                .zip(&avail.left)
                .any(|(a, l)| *a && *l < n)
        {
            return;
        }
        // Per item only the choice; the counters are settled once after the run.
        let before = out.len();
        let counts0 = counts.to_vec();
        while ((out.len() - before) as u64) < n {
            let left = n - (out.len() - before) as u64;
            if self.run_piece(left, counts, out) {
                continue;
            }
            // The run stopped at an item it cannot order cheaply (a passed or far deadline):
            // that item through the exact choice.
            let Some(s) = self.choose() else { break };
            self.commit(s);
            counts[s] += 1;
            out.push(s as u16);
        }
        let ran = (out.len() - before) as u64;
        self.since += ran;
        self.items += ran;
        if let Some(l) = &mut self.left {
            *l -= ran;
        }
        for (s, (c, c0)) in counts.iter().zip(counts0).enumerate() {
            self.taken[s] += c - c0;
            if avail.left[s] != u64::MAX {
                avail.left[s] -= c - c0;
            }
        }
    }

    /// Up to `n` deterministic choices within the current piece, in one loop: each source's
    /// deficit is kept as a line ([`Line`]), so an item costs a scan for the earliest released
    /// deadline and an O(1) update of the taken source (no division). Stops early, with the
    /// state settled at that item, where the scan cannot order exactly (a deadline already
    /// passed, or one beyond its key's range); returns whether it ran to the end (`n` items or
    /// the piece's end). The same choices as `choose` + `commit` (proptests below).
    fn run_piece(&mut self, n: u64, counts: &mut [u64], out: &mut Vec<u16>) -> bool {
        self.ensure_piece();
        if !self.live {
            return false;
        }
        match self.d.len() {
            0..=4 => self.run_lanes::<4>(n, counts, out),
            5..=8 => self.run_lanes::<8>(n, counts, out),
            9..=16 => self.run_lanes::<16>(n, counts, out),
            17..=32 => self.run_lanes::<32>(n, counts, out),
            33..=64 => self.run_lanes::<64>(n, counts, out),
            65..=128 => self.run_lanes::<128>(n, counts, out),
            129..=MAX_LANES => self.run_lanes::<MAX_LANES>(n, counts, out),
            _ => false,
        }
    }

    fn run_lanes<const N: usize>(
        &mut self,
        n: u64,
        counts: &mut [u64],
        out: &mut Vec<u16>,
    ) -> bool {
        let k = self.d.len();
        let t0 = self.inner;
        let end_rel = match self.piece.end {
            Some(e) => (e - t0).min(i64::MAX as u64) as i64,
            None => i64::MAX,
        };
        let len = n.min(end_rel as u64).min(1 << 30) as i64;
        let rel_abs =
            |dl: u64| -> i64 { (dl as i128 - t0 as i128).clamp(-FAR as i128, FAR as i128) as i64 };
        let mut lanes = Lanes::<N> {
            rel: [NEVER; N],
            key: [i64::MAX; N],
            line: [Line::default(); N],
        };
        for s in 0..k {
            let w = self.piece.w[s] as i64;
            let d = self.d[s];
            let ln = &mut lanes.line[s];
            ln.w = w;
            if w == 0 {
                ln.d0 = d;
                lanes.rel[s] = if d > 0 { 0 } else { NEVER };
                lanes.key[s] = key(rel_abs(self.deadline[s]), s);
                continue;
            }
            // need = w * steps - rem, 0 <= rem < w (need may be <= 0: the deadline passed)
            let need = UNIT as i64 - d;
            let steps = need.div_euclid(w) + i64::from(need.rem_euclid(w) != 0);
            ln.c = steps - 1;
            ln.rem = w * steps - need;
            ln.q = (UNIT / w as u64) as i64;
            ln.r = (UNIT % w as u64) as i64;
            lanes.rel[s] = if d + w > 0 { 0 } else { (-d) / w };
            lanes.key[s] = if ln.c < end_rel {
                key(ln.c, s)
            } else {
                key(rel_abs(self.deadline[s]), s)
            };
        }
        let before = out.len();
        let mut tau = 0i64;
        let ok = loop {
            // `out` grows by chunks, not by `len` at once: a run may stop after one item.
            let until = len.min(tau + CHUNK);
            out.resize(before + until as usize, 0);
            match lanes.run(&mut tau, until, end_rel, &mut out[before..]) {
                Stop::Done if until == len => break true,
                Stop::Done => {}
                Stop::Unordered => break false,
                Stop::Beyond(s) => {
                    let ln = &lanes.line[s];
                    let dl = self.deadline_of(s, t0 + tau as u64, ln.deficit(tau));
                    lanes.key[s] = key(rel_abs(dl), s);
                }
            }
        };
        out.truncate(before + tau as usize);
        // Settle the counts, the deficits and the deadlines of the sources taken at item `tau`.
        for ((c, d), ln) in counts.iter_mut().zip(&mut self.d).zip(&lanes.line) {
            *c += ln.taken;
            *d = ln.deficit(tau);
        }
        self.inner = t0 + tau as u64;
        self.ensure_piece();
        for s in 0..k {
            if lanes.line[s].taken > 0 {
                self.deadline[s] = self.deadline_of(s, self.inner, self.d[s]);
            }
        }
        ok && tau > 0
    }

    fn decide(&mut self, avail: &Avail) -> Option<usize> {
        if self.ended {
            return None;
        }
        if let Some(b) = &self.block {
            if b.at < b.order.len() {
                return Some(b.order[b.at] as usize);
            }
        }
        self.block = None;
        if !self.boundary(avail) {
            return None;
        }
        match self.rule.mixing {
            Mixing::Deterministic => self.choose(),
            Mixing::Random => self.draw(),
            Mixing::Stratified(size) => self.new_block(avail, size),
        }
    }

    /// Before a choice: the item limit, and sources that ran out (stop, or leave and rebase).
    fn boundary(&mut self, avail: &Avail) -> bool {
        if self.left == Some(0) {
            return false;
        }
        // The common case, once per item: no source in the mix has run out.
        let active = &self.pieces.active;
        if !active.iter().zip(&avail.left).any(|(a, l)| *a && *l == 0) {
            return true;
        }
        let mut dropped = false;
        for s in 0..self.d.len() {
            if self.pieces.active[s] && avail.left[s] == 0 {
                match self.rule.policies[s] {
                    Policy::Stop => return false,
                    Policy::Drop => {
                        self.pieces.active[s] = false;
                        dropped = true;
                    }
                }
            }
        }
        if dropped {
            let base = self.global();
            self.pieces.base = base;
            self.since = 0;
            self.inner = 0;
            self.d.iter_mut().for_each(|d| *d = 0);
            self.reset_rule();
        }
        true
    }

    /// Recompute what derives from the position: the piece, deadlines, the random stream.
    fn reset_rule(&mut self) {
        self.set_piece();
        for s in 0..self.d.len() {
            self.deadline[s] = self.deadline_of(s, self.inner, self.d[s]);
        }
        self.rng = match self.rule.mixing {
            Mixing::Random => {
                let mut r = Prng::new(derive_key(
                    "mixture-random",
                    &[
                        self.rule.seed,
                        self.slot.index as u64,
                        self.slot.count as u64,
                        self.pieces.base,
                    ],
                ));
                r.set_word_pos(2 * self.inner as u128);
                Some(r)
            }
            _ => None,
        };
    }

    fn ensure_piece(&mut self) {
        if self.inner < self.piece.start || self.piece.end.is_some_and(|e| self.inner >= e) {
            self.set_piece();
        }
    }

    fn set_piece(&mut self) {
        self.piece = self.pieces.piece(self.inner);
        self.live = self.piece.w.iter().any(|w| *w > 0);
    }

    /// The first item `t' >= t` by which source `s` (deficit `d` before item `t`) must be taken.
    fn deadline_of(&self, s: usize, t: u64, d: i64) -> u64 {
        if !self.pieces.active[s] {
            return u64::MAX;
        }
        // |d| <= 2 * UNIT, so need fits an i64
        let need = UNIT as i64 - d;
        if need <= 0 {
            return t;
        }
        // The common case, once per item: reached within the current piece (read in place).
        let w = self.piece.w[s];
        if w > 0 && t >= self.piece.start {
            let steps = (need as u64).div_ceil(w); // >= 1
            match self.piece.end {
                None => return t.saturating_add(steps - 1),
                Some(end) if t < end && steps <= end - t => return t + steps - 1,
                _ => {}
            }
        }
        let mut need = need as i128;
        let mut at = t;
        loop {
            let (w, end) = if at >= self.piece.start && self.piece.end.is_none_or(|e| at < e) {
                (self.piece.w[s], self.piece.end)
            } else {
                let p = self.pieces.piece(at);
                (p.w[s], p.end)
            };
            let w = w as i128;
            let reach = |at: u64, need: i128| -> u64 {
                // 0 < need <= 2 * UNIT and 0 < w <= UNIT: u64 division (i128's is a call)
                let steps = (need as u64).div_ceil(w as u64) as i128; // >= 1
                u64::try_from(at as i128 + steps - 1).unwrap_or(u64::MAX)
            };
            match end {
                None => return if w == 0 { u64::MAX } else { reach(at, need) },
                Some(end) => {
                    let n = (end - at) as i128;
                    if w > 0 && w * n >= need {
                        return reach(at, need);
                    }
                    need -= w * n;
                    at = end;
                }
            }
        }
    }

    /// Earliest deadline among the released sources (ties: the lower index).
    ///
    /// One pass without branches on the data: a source is released when `d + w > 0` (a source
    /// out of the mix has `w = 0` and `d = 0`, so never is), and a deadline already passed
    /// counts as now (`max(deadline, t)`: what recomputing it would give). The key is that
    /// deadline above the index (u128: any deadline, even one far past a stretch of zero
    /// weight, orders as in the reference rule; "never"s tie, lower index first).
    fn choose(&mut self) -> Option<usize> {
        self.ensure_piece();
        if !self.live {
            return None; // no source in the mix has weight here: the mixture ends
        }
        let t = self.inner;
        let k = self.d.len();
        let (d, w, dl) = (&self.d[..k], &self.piece.w[..k], &self.deadline[..k]);
        let mut best = u128::MAX;
        for (s, ((d, w), dl)) in d.iter().zip(w).zip(dl).enumerate() {
            let key = ((*dl).max(t) as u128) << 16 | s as u128;
            let released = *d + *w as i64 > 0;
            best = best.min(if released { key } else { u128::MAX });
        }
        (best != u128::MAX).then_some((best & 0xffff) as usize)
    }

    /// The rule as first written (a branch per source, deadlines recomputed once passed): what
    /// [`Mixer::choose`] must equal.
    #[cfg(test)]
    fn choose_reference(&mut self) -> Option<usize> {
        self.ensure_piece();
        if !self.live {
            return None;
        }
        let k = self.d.len();
        let (active, w) = (&self.pieces.active[..k], &self.piece.w[..k]);
        let (mut best, mut best_dl) = (usize::MAX, u64::MAX);
        for s in 0..k {
            if !active[s] || self.d[s] + w[s] as i64 <= 0 {
                continue;
            }
            let mut dl = self.deadline[s];
            if dl < self.inner {
                dl = self.deadline_of(s, self.inner, self.d[s]);
                self.deadline[s] = dl;
            }
            if dl < best_dl || best == usize::MAX {
                (best, best_dl) = (s, dl);
            }
        }
        (best != usize::MAX).then_some(best)
    }

    fn commit(&mut self, s: usize) {
        let k = self.d.len();
        let (d, w) = (&mut self.d[..k], &self.piece.w[..k]);
        for (d, w) in d.iter_mut().zip(w) {
            *d += *w as i64;
        }
        self.d[s] -= UNIT as i64;
        self.inner += 1;
        self.ensure_piece();
        self.deadline[s] = self.deadline_of(s, self.inner, self.d[s]);
    }

    fn draw(&mut self) -> Option<usize> {
        self.ensure_piece();
        let rng = self.rng.as_mut().expect("random mixing has a stream");
        if !self.live {
            return None;
        }
        // One u64 per item (below(2**32) never rejects), so item t is at word 2t.
        let r = rng.below(UNIT);
        let mut acc = 0u64;
        for (s, w) in self.piece.w.iter().enumerate() {
            acc += w;
            if r < acc {
                return Some(s);
            }
        }
        None
    }

    fn new_block(&mut self, avail: &Avail, size: u64) -> Option<usize> {
        let n = size.min(self.left.unwrap_or(u64::MAX));
        let mut view = avail.left.clone();
        let mut quotas = vec![0u64; self.d.len()];
        let mut count = 0;
        while count < n {
            let Some(s) = self.choose() else { break };
            self.commit(s);
            quotas[s] += 1;
            count += 1;
            if view[s] != u64::MAX {
                view[s] -= 1;
                if view[s] == 0 {
                    break; // its last row: the next boundary applies its policy
                }
            }
        }
        if count == 0 {
            return None;
        }
        let order = self.block_order(&quotas, self.since);
        let first = order[0] as usize;
        self.block = Some(Block {
            quotas,
            order,
            at: 0,
        });
        Some(first)
    }

    /// A block's items in their served order: the counts laid out by source, permuted with a
    /// key from the seed, the slot and the block's start.
    fn block_order(&self, quotas: &[u64], start: u64) -> Vec<u16> {
        let mut order: Vec<u16> = quotas
            .iter()
            .enumerate()
            .flat_map(|(s, q)| std::iter::repeat_n(s as u16, *q as usize))
            .collect();
        let mut rng = Prng::new(derive_key(
            "mixture-block",
            &[
                self.rule.seed,
                self.slot.index as u64,
                self.slot.count as u64,
                self.pieces.base,
                start,
            ],
        ));
        permute(&mut order, &mut rng);
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mix::schedule::{quantize, Kind};
    use proptest::prelude::*;

    fn rule(schedule: Schedule, mixing: Mixing, k: usize, stop: bool) -> Arc<Rule> {
        Arc::new(Rule {
            schedule: Arc::new(schedule),
            mixing,
            policies: vec![if stop { Policy::Stop } else { Policy::Drop }; k],
            seed: 7,
        })
    }

    fn weights() -> impl Strategy<Value = Vec<f64>> {
        proptest::collection::vec(
            prop_oneof![Just(0.0), 0.001f64..1.0, (1u32..5).prop_map(f64::from)],
            1..7,
        )
        .prop_filter("some weight", |w| w.iter().any(|x| *x > 0.0))
    }

    fn schedule() -> impl Strategy<Value = Schedule> {
        (
            1usize..7,
            proptest::collection::vec((1u64..400, any::<u64>()), 0..5),
            any::<bool>(),
        )
            .prop_flat_map(|(k, gaps, linear)| {
                let n = gaps.len() + 1;
                proptest::collection::vec(
                    proptest::collection::vec(prop_oneof![Just(0.0), 0.001f64..1.0, Just(1.0)], k)
                        .prop_map(|mut w| {
                            if w.iter().all(|x| *x == 0.0) {
                                w[0] = 1.0;
                            }
                            w
                        }),
                    n,
                )
                .prop_map(move |ws| {
                    let mut at = 0;
                    let mut points = Vec::new();
                    for (i, w) in ws.into_iter().enumerate() {
                        points.push((at, quantize(&w, "w").unwrap()));
                        at += gaps.get(i).map_or(0, |g| g.0);
                    }
                    Schedule {
                        kind: if linear { Kind::Linear } else { Kind::Step },
                        points,
                    }
                })
            })
    }

    /// Run `n` items, checking after every item that each source's count is within one item of
    /// its target since the last rebase (targets summed from the weights the rule used).
    fn run_checked(m: &mut Mixer, avail: &mut Avail, n: usize) -> Vec<usize> {
        let k = avail.left.len();
        let mut target = vec![0i128; k];
        let mut count = vec![0i128; k];
        let mut base = m.pieces.base;
        let mut out = Vec::new();
        for _ in 0..n {
            let w = {
                // the weights of the item about to be taken, after any boundary rebase
                let Some(_) = m.peek(avail) else { break };
                m.weights()
            };
            if m.pieces.base != base {
                // a source left: targets rebase here
                target = vec![0; k];
                count = vec![0; k];
                base = m.pieces.base;
            }
            let s = m.take(avail).unwrap();
            for i in 0..k {
                target[i] += w[i] as i128;
            }
            count[s] += 1;
            for i in 0..k {
                let dev = target[i] - count[i] * UNIT as i128;
                assert!(
                    dev.abs() < UNIT as i128,
                    "source {i} off by {} items after {} items",
                    dev as f64 / UNIT as f64,
                    out.len() + 1
                );
            }
            out.push(s);
        }
        out
    }

    /// Deficits a restored state may hold (within one item, summing to 0: deadlines may
    /// already have passed): `skew` centred and scaled, the rest on `d_0`.
    fn skewed(skew: &[f64]) -> Vec<i64> {
        let k = skew.len();
        let mean = skew.iter().sum::<f64>() / k as f64;
        let top = skew.iter().map(|x| (x - mean).abs()).fold(1e-9, f64::max);
        let mut d: Vec<i64> = skew
            .iter()
            .map(|x| ((x - mean) / top * 0.999 * UNIT as f64) as i64)
            .collect();
        d[0] -= d.iter().sum::<i64>();
        d
    }

    /// Up to `n` items with each source's `rows` found out only when picked past them (as
    /// `stream/per_source.rs` does); `given` counts each source's rows taken.
    fn late_run(m: &mut Mixer, rows: &[u64], given: &mut [u64], n: usize) -> Vec<usize> {
        let k = rows.len();
        let mut out = Vec::new();
        while out.len() < n {
            let mut dry = vec![false; k];
            loop {
                let left = (0..k)
                    .map(|s| {
                        if m.active()[s] && !dry[s] {
                            u64::MAX
                        } else {
                            0
                        }
                    })
                    .collect();
                let mut a = Avail { left };
                let Some(s) = m.peek(&a) else { return out };
                if given[s] < rows[s] {
                    m.take(&mut a);
                    given[s] += 1;
                    out.push(s);
                    break;
                }
                dry[s] = true;
                m.unpeek();
            }
        }
        out
    }

    /// `unpeek` takes the peeked choice back: with that source marked run out, the next peek
    /// decides again, in every mode, and never repeats it (`late_run` and a per-source
    /// packing stream would ask it for rows forever). In a stratified block the source may be
    /// the block's next: the block is cut. Bounded, so a broken `unpeek` fails here instead
    /// of hanging `late_exhaustion_drops_and_resumes_exactly`.
    #[test]
    fn unpeek_decides_again_without_the_run_out_source() {
        for mixing in [Mixing::Deterministic, Mixing::Stratified(4), Mixing::Random] {
            for first_out in [false, true] {
                let w = quantize(&[1.0, 1.0], "w").unwrap();
                let r = rule(Schedule::constant(w), mixing, 2, false);
                let slot = Slot::new(0, 1).unwrap();
                let mut m = Mixer::fresh(r, slot, 0, None, vec![true; 2], 0, vec![0; 2]);
                let mut a = Avail {
                    left: vec![u64::MAX; 2],
                };
                if !first_out {
                    m.take(&mut a); // inside a stratified block
                }
                let s = m.peek(&a).unwrap();
                a.left[s] = 0;
                m.unpeek();
                assert_eq!(m.peek(&a), Some(1 - s), "{mixing:?}, first_out {first_out}");
                assert_eq!(m.take(&mut a), Some(1 - s));
                assert_eq!(
                    m.peek(&a),
                    Some(1 - s),
                    "{mixing:?}: the run-out source left"
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        /// Every prefix of a slot's items holds each source within one item of its target,
        /// under constant, stepped and linear weights, any slot count and base.
        #[test]
        fn deterministic_prefixes_stay_within_one_item(
            s in schedule(), count in 1u32..5, base in 0u64..1000, n in 1usize..1500,
        ) {
            let k = s.points[0].1.len();
            let slot = Slot::new(0, count).unwrap();
            let mut m = Mixer::fresh(rule(s, Mixing::Deterministic, k, false), slot, base, None, vec![true; k], 0, vec![0; k]);
            let mut avail = Avail { left: vec![u64::MAX; k] };
            let got = run_checked(&mut m, &mut avail, n);
            prop_assert_eq!(got.len(), n);
        }

        /// Sources that run out leave (drop) and the rest rebase: the bound holds again from
        /// each rebase; a stop source ends the slot right after its last row.
        #[test]
        fn exhaustion_drops_or_stops(
            w in weights(), rows in proptest::collection::vec(0u64..60, 7), stop: bool,
        ) {
            let k = w.len();
            let slot = Slot::new(0, 1).unwrap();
            let r = rule(Schedule::constant(quantize(&w, "w").unwrap()), Mixing::Deterministic, k, stop);
            let mut m = Mixer::fresh(r, slot, 0, None, vec![true; k], 0, vec![0; k]);
            let mut avail = Avail { left: rows[..k].to_vec() };
            let got = run_checked(&mut m, &mut avail, 10_000);
            let total: u64 = rows[..k].iter().sum();
            let positive: u64 = rows[..k].iter().zip(&w).filter(|(_, w)| **w > 0.0).map(|(r, _)| *r).sum();
            if stop {
                // Ends exactly when the first source runs out (or at once if one is empty).
                prop_assert!(avail.left.contains(&0) || got.is_empty());
                prop_assert!(got.len() as u64 <= total);
            } else {
                // Every row of every source with weight is taken; zero-weight ones never.
                prop_assert_eq!(got.len() as u64, positive);
            }
            prop_assert!(m.ended());
        }

        /// A position saved after any item and restored continues with the same choices, in
        /// every mode, across rebases.
        /// Late discovery (a packing source, `stream/per_source.rs`): a source's rows are not
        /// known ahead; when the mixer picks it past its last one, the choice is taken back
        /// (`unpeek`) and decided again with the source run out. Every row of every source with
        /// weight is taken exactly once (drop), and a mixer restored after any item continues
        /// identically, under every mixing.
        #[test]
        fn late_exhaustion_drops_and_resumes_exactly(
            w in weights(), rows in proptest::collection::vec(0u64..40, 7),
            mixing in 0u8..3, block in 1u64..8, cut in 0usize..400,
        ) {
            let k = w.len();
            let mixing = match mixing {
                0 => Mixing::Deterministic,
                1 => Mixing::Stratified(block),
                _ => Mixing::Random,
            };
            let slot = Slot::new(1, 3).unwrap();
            let r = rule(Schedule::constant(quantize(&w, "w").unwrap()), mixing, k, false);
            let rows = &rows[..k];
            let mut m = Mixer::fresh(r.clone(), slot, 0, None, vec![true; k], 0, vec![0; k]);
            let mut given = vec![0u64; k];
            let full = late_run(&mut m, rows, &mut given, usize::MAX);
            for s in 0..k {
                let want = if w[s] > 0.0 { rows[s] } else { 0 };
                prop_assert_eq!(given[s], want, "source {}", s);
            }
            let cut = cut.min(full.len());
            let mut m = Mixer::fresh(r.clone(), slot, 0, None, vec![true; k], 0, vec![0; k]);
            let mut given = vec![0u64; k];
            let mut got = late_run(&mut m, rows, &mut given, cut);
            let mut m = Mixer::restore(r, slot, &m.position()).unwrap();
            got.extend(late_run(&mut m, rows, &mut given, usize::MAX));
            prop_assert_eq!(got, full);
        }

        #[test]
        fn restored_positions_continue_identically(
            s in schedule(), mode in 0u8..3, block in 1u64..9, cut in 0usize..300,
            rows in proptest::collection::vec(prop_oneof![Just(u64::MAX), 0u64..200], 7),
            count in 1u32..4,
        ) {
            let k = s.points[0].1.len();
            let mixing = [Mixing::Deterministic, Mixing::Stratified(block), Mixing::Random][mode as usize];
            let slot = Slot::new(count - 1, count).unwrap();
            let r = rule(s, mixing, k, false);
            let fresh = || Mixer::fresh(r.clone(), slot, 3, Some(400), vec![true; k], 0, vec![0; k]);
            let start = Avail { left: rows[..k].to_vec() };
            let (mut a, mut avail) = (fresh(), start.clone());
            let mut all = Vec::new();
            while let Some(s) = a.take(&mut avail) { all.push(s); }
            let (mut b, mut avail) = (fresh(), start.clone());
            let cut = cut.min(all.len());
            for _ in 0..cut { b.take(&mut avail); }
            if cut % 2 == 1 { b.peek(&avail); } // a peeked, untaken choice is not part of the state
            let mut c = Mixer::restore(r.clone(), slot, &b.position()).unwrap();
            let mut rest = Vec::new();
            while let Some(s) = c.take(&mut avail) { rest.push(s); }
            prop_assert_eq!(&rest[..], &all[cut..]);
            prop_assert!(all.len() <= 400);
        }

        /// `take_run` gives exactly the items `take` gives (and leaves the same position), and
        /// every one is the reference rule's choice, whether or not its conditions let it run:
        /// short and long runs (up to 3,000 items at once), across schedule pieces (constant,
        /// stepped, linear), exhaustion (drops and stops between runs), from fresh and from
        /// restored positions with any deficits the state may hold (passed deadlines).
        #[test]
        fn take_run_equals_take(
            s in schedule(), n in prop_oneof![1u64..70, 300u64..3000], count in 1u32..4,
            rows in proptest::collection::vec(prop_oneof![Just(u64::MAX), 0u64..2000], 7),
            base in 0u64..500, since in 0u64..300, stop: bool,
            skew in proptest::collection::vec(-1.0f64..1.0, 7), restored: bool,
        ) {
            let k = s.points[0].1.len();
            let slot = Slot::new(count - 1, count).unwrap();
            let r = rule(s, Mixing::Deterministic, k, stop);
            let limit = Some(6000);
            let mut a = if restored {
                let pos = MixerPos {
                    items: 0, base, since, left: limit, deficits: skewed(&skew[..k]).into_iter().map(Some).collect(),
                    block: None, taken: vec![0; k],
                };
                Mixer::restore(r, slot, &pos).unwrap()
            } else {
                Mixer::fresh(r, slot, base, limit, vec![true; k], 0, vec![0; k])
            };
            let start = Avail { left: rows[..k].to_vec() };
            let (mut av_a, mut b, mut av_b) = (start.clone(), a.clone(), start);
            let mut ran = false;
            loop {
                let mut counts = vec![0u64; k];
                let mut x = Vec::new();
                b.take_run(&mut av_b, n, &mut counts, &mut x);
                ran |= !x.is_empty();
                while (x.len() as u64) < n {
                    let Some(s) = b.take(&mut av_b) else { break };
                    counts[s] += 1;
                    x.push(s as u16);
                }
                let mut y = Vec::new();
                while (y.len() as u64) < n {
                    let Some(s) = a.peek(&av_a) else { break };
                    prop_assert_eq!(Some(s), a.clone().choose_reference(), "item {}", y.len());
                    a.take(&mut av_a);
                    y.push(s as u16);
                }
                prop_assert_eq!(&x, &y);
                for (i, c) in counts.iter().enumerate() {
                    prop_assert_eq!(*c, x.iter().filter(|s| **s as usize == i).count() as u64);
                }
                prop_assert_eq!(a.position(), b.position());
                prop_assert_eq!(&av_a, &av_b);
                if y.is_empty() { break; }
            }
            prop_assert!(ran || rows[..k].iter().any(|r| *r < n) || a.position().items == 0);
        }

        /// The branch-free choice equals the reference rule at every item: from fresh and from
        /// restored positions with any deficits the state may hold (within one item, summing to
        /// 0: deadlines may already have passed, so ties at "now" occur), under constant,
        /// stepped and linear schedules, drops and stops.
        #[test]
        fn fast_choice_equals_reference(
            s in schedule(), count in 1u32..4, base in 0u64..500, since in 0u64..300, stop: bool,
            rows in proptest::collection::vec(prop_oneof![Just(u64::MAX), 0u64..200], 7),
            skew in proptest::collection::vec(-1.0f64..1.0, 7), restored: bool,
        ) {
            let k = s.points[0].1.len();
            let slot = Slot::new(count - 1, count).unwrap();
            let r = rule(s, Mixing::Deterministic, k, stop);
            let mut m = if restored {
                let deficits = skewed(&skew[..k]).into_iter().map(Some).collect();
                let pos = MixerPos {
                    items: 0, base, since, left: Some(600), deficits, block: None, taken: vec![0; k],
                };
                Mixer::restore(r, slot, &pos).unwrap()
            } else {
                Mixer::fresh(r, slot, base, Some(600), vec![true; k], 0, vec![0; k])
            };
            let mut avail = Avail { left: rows[..k].to_vec() };
            let mut n = 0;
            loop {
                let got = m.peek(&avail);
                let fast = m.clone().choose();
                prop_assert_eq!(fast, m.clone().choose_reference(), "item {}", n);
                if got.is_some() {
                    prop_assert_eq!(got, fast);
                }
                if m.take(&mut avail).is_none() {
                    break;
                }
                n += 1;
            }
            prop_assert!(n <= 600);
        }

        /// Stratified blocks hold exactly the deterministic rule's counts for the same items.
        #[test]
        fn stratified_blocks_have_deterministic_counts(w in weights(), block in 1u64..12, n in 1usize..300) {
            let k = w.len();
            let slot = Slot::new(0, 1).unwrap();
            let sched = Schedule::constant(quantize(&w, "w").unwrap());
            let mut det = Mixer::fresh(rule(sched.clone(), Mixing::Deterministic, k, false), slot, 0, None, vec![true; k], 0, vec![0; k]);
            let mut st = Mixer::fresh(rule(sched, Mixing::Stratified(block), k, false), slot, 0, None, vec![true; k], 0, vec![0; k]);
            let mut a1 = Avail { left: vec![u64::MAX; k] };
            let mut a2 = a1.clone();
            let n = n - n % block as usize;
            let x: Vec<usize> = (0..n).map(|_| det.take(&mut a1).unwrap()).collect();
            let y: Vec<usize> = (0..n).map(|_| st.take(&mut a2).unwrap()).collect();
            for (bx, by) in x.chunks(block as usize).zip(y.chunks(block as usize)) {
                let (mut bx, mut by) = (bx.to_vec(), by.to_vec());
                bx.sort_unstable();
                by.sort_unstable();
                prop_assert_eq!(bx, by);
            }
        }
    }

    /// A one-slot mixer at item 0 restored with these deficits (nothing taken yet).
    fn restored_at(r: Arc<Rule>, deficits: &[i64]) -> Mixer {
        let pos = MixerPos {
            items: 0,
            base: 0,
            since: 0,
            left: None,
            deficits: deficits.iter().copied().map(Some).collect(),
            block: None,
            taken: vec![0; deficits.len()],
        };
        Mixer::restore(r, Slot::new(0, 1).unwrap(), &pos).unwrap()
    }

    /// A restored position may hold deficits no run reaches: two sources due at the same item,
    /// so one deadline passes. A passed deadline counts as now, so at the next item it ties with
    /// a source due then and the lower index wins, as in the reference rule.
    #[test]
    fn passed_deadlines_tie_at_now() {
        let w = quantize(&[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 7.0, 7.0], "w").unwrap();
        let ws = w[0] as i64;
        let u = UNIT as i64;
        // source 0 due at item 1; sources 1 and 2 both due at item 0 (released, need < w)
        let mut d = vec![u - 2 * ws + 1, u - ws / 2, u - ws / 2];
        let rest = -d.iter().sum::<i64>();
        d.extend([rest / 5; 4]);
        d.push(rest - 4 * (rest / 5));
        let r = rule(Schedule::constant(w), Mixing::Deterministic, 8, false);
        let mut m = restored_at(r, &d);
        let mut avail = Avail {
            left: vec![u64::MAX; 8],
        };
        let mut got = Vec::new();
        for _ in 0..200 {
            m.peek(&avail);
            assert_eq!(m.clone().choose(), m.clone().choose_reference());
            got.push(m.take(&mut avail).unwrap());
        }
        // item 0: 1 (tie with 2, lower index); item 1: 2 is past due, 0 due now: 0 wins
        assert_eq!(got[..3], [1, 0, 2]);
    }

    /// Deadlines far beyond a stretch of zero weight still order exactly: sources 0 and 1 are
    /// released but get weight only from item 2**48 (1 sooner than 0), sources 2 and 3 are not
    /// released, so the choice is between two deadlines near 2**48.
    #[test]
    fn far_deadlines_order_as_in_the_reference() {
        let far = 1u64 << 48;
        let s = Schedule {
            kind: Kind::Step,
            points: vec![
                (0, quantize(&[0.0, 0.0, 1.0, 1.0], "w").unwrap()),
                (far, quantize(&[1.0, 3.0, 0.0, 0.0], "w").unwrap()),
            ],
        };
        s.check(4, "w").unwrap();
        let u = UNIT as i64;
        let d = [6 * u / 10, 6 * u / 10, -6 * u / 10, -6 * u / 10];
        let r = rule(s, Mixing::Deterministic, 4, false);
        let mut m = restored_at(r, &d);
        let avail = Avail {
            left: vec![u64::MAX; 4],
        };
        assert_eq!(m.peek(&avail), Some(1));
        assert_eq!(m.clone().choose_reference(), Some(1));
    }

    #[test]
    fn random_mixing_follows_the_weights() {
        let w = quantize(&[0.6, 0.3, 0.1], "w").unwrap();
        let slot = Slot::new(0, 1).unwrap();
        let mut m = Mixer::fresh(
            rule(Schedule::constant(w), Mixing::Random, 3, false),
            slot,
            0,
            None,
            vec![true; 3],
            0,
            vec![0; 3],
        );
        let mut avail = Avail {
            left: vec![u64::MAX; 3],
        };
        let n = 30_000;
        let mut counts = [0f64; 3];
        for _ in 0..n {
            counts[m.take(&mut avail).unwrap()] += 1.0;
        }
        // Within 5 standard deviations of the binomial mean.
        for (c, p) in counts.iter().zip([0.6, 0.3, 0.1]) {
            let sd = (n as f64 * p * (1.0 - p)).sqrt();
            assert!((c - n as f64 * p).abs() < 5.0 * sd, "{counts:?}");
        }
        // Other slots draw other sequences.
        let mut other = Mixer::fresh(
            m.rule.clone(),
            Slot::new(1, 2).unwrap(),
            0,
            None,
            vec![true; 3],
            0,
            vec![0; 3],
        );
        let mut fresh = Mixer::fresh(m.rule.clone(), slot, 0, None, vec![true; 3], 0, vec![0; 3]);
        let a: Vec<_> = (0..64).map(|_| other.take(&mut avail)).collect();
        let b: Vec<_> = (0..64).map(|_| fresh.take(&mut avail)).collect();
        assert_ne!(a, b);
    }

    #[test]
    fn hostile_positions_are_refused() {
        let w = quantize(&[0.5, 0.5], "w").unwrap();
        let r = rule(Schedule::constant(w), Mixing::Stratified(4), 2, false);
        let slot = Slot::new(0, 1).unwrap();
        let good = MixerPos {
            items: 2,
            base: 0,
            since: 2,
            left: None,
            deficits: vec![Some(0), Some(0)],
            block: Some((vec![2, 2], 2)),
            taken: vec![1, 1],
        };
        Mixer::restore(r.clone(), slot, &good).unwrap();
        let mut bad = vec![];
        let mut p = good.clone();
        p.deficits = vec![Some(1), Some(0)];
        bad.push(("sum", p));
        let mut p = good.clone();
        p.deficits = vec![Some(UNIT as i64 * 3), Some(-(UNIT as i64) * 3)];
        bad.push(("range", p));
        let mut p = good.clone();
        p.block = Some((vec![4, 4], 1));
        bad.push(("block size", p));
        let mut p = good.clone();
        p.block = Some((vec![2, 2], 3));
        bad.push(("served before since", p));
        let mut p = good.clone();
        p.deficits = vec![Some(0), None];
        bad.push(("block from a source that left", p));
        // The block's last 2 items fit an item limit of 2, not of 1 (served, they wrapped it).
        let mut p = good.clone();
        p.left = Some(2);
        Mixer::restore(r.clone(), slot, &p).unwrap();
        p.left = Some(1);
        bad.push(("block beyond the item limit", p));
        for (what, p) in bad {
            assert!(
                matches!(Mixer::restore(r.clone(), slot, &p), Err(Error::State(_))),
                "{what}"
            );
        }
    }
}

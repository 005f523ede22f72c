//! Elastic resume: states saved by one layout of slots (W ranks x K workers) continued by
//! another (W' x K').
//!
//! Same layout: each slot simply continues its own state, so the stream is identical.
//!
//! Another layout: for every epoch that some old slot had not finished, the *remainder* is what
//! no old slot emitted yet: each old slot's unread ranges of epoch positions plus the rows in its
//! shuffle buffer (for epochs an old slot had not reached: its whole spec). The remainder is laid
//! out as one sequence — buffered rows first, then ranges, both in old-slot order — and cut into
//! `new.count` balanced pieces (the `even` policy applies as in any epoch). A new slot reads its
//! piece as a non-standard spec: the buffered rows start out in its shuffle buffer ("injected"),
//! the ranges are read through it. Epochs after the remainder use the new layout's standard specs.
//! Everything is a function of (states, settings, new layout), so every new slot computes its own
//! piece independently and a resumed run is reproducible. Rows already emitted are never
//! repeated and rows not yet emitted are never lost (up to the `even` policy's drop/pad).

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::plan::{EpochPlan, Even, Slot, SlotSpec};
use crate::settings::StreamOptions;
use crate::state::check_state;
use crate::state::SlotState;

/// What one epoch still owes, in old-slot order.
#[derive(Default)]
struct Remainder {
    rows: Vec<u64>,
    ranges: Vec<Range<u64>>,
}

/// An old slot's state, validated against the old layout: its spec in its own epoch is known.
#[derive(Debug, Clone)]
pub struct Checked {
    pub slot: Slot,
    pub state: SlotState,
    /// What the state reads in its epoch (standard, or from its own `specs`).
    pub spec: SlotSpec,
}

/// Validate the states of one old layout (policy `old_even`): every slot at most once, all of
/// one slot count, each a position its slot can have reached. One epoch plan is built per
/// epoch for all of them (building one is O(row groups)).
pub fn check_states(
    catalog: &Arc<Catalog>,
    opts: &StreamOptions,
    old: Vec<(Slot, SlotState)>,
    old_even: Even,
) -> Result<Vec<Checked>> {
    let count = old
        .first()
        .map(|(s, _)| s.count)
        .ok_or_else(|| Error::State("no states to resume from".into()))?;
    let old_opts = StreamOptions {
        even: old_even,
        ..opts.clone()
    };
    let mut seen = std::collections::BTreeSet::new();
    let mut plans: BTreeMap<u64, Arc<EpochPlan>> = BTreeMap::new();
    let mut out = Vec::with_capacity(old.len());
    for (slot, state) in old {
        if slot.count != count {
            return Err(Error::State(format!(
                "states come from different layouts ({} and {} slots); pass the states of one checkpoint",
                count, slot.count
            )));
        }
        if !seen.insert(slot.index) {
            return Err(Error::State(format!(
                "two states for slot {} of {count}",
                slot.index
            )));
        }
        let plan = plans
            .entry(state.epoch)
            .or_insert_with(|| {
                Arc::new(EpochPlan::new(
                    catalog.units(),
                    opts.seed,
                    state.epoch,
                    opts.shuffle_buffer > 0,
                ))
            })
            .clone();
        let spec = check_state(&old_opts, slot, &plan, &state)?;
        out.push(Checked { slot, state, spec });
    }
    out.sort_by_key(|c| c.slot.index);
    Ok(out)
}

/// The state a slot of the new layout (policy `opts.even`) starts from, given every old slot's
/// validated state ([`check_states`]; `old_even` is the policy the old layout ran with).
pub fn merged_state(
    catalog: &Arc<Catalog>,
    opts: &StreamOptions,
    old: &[Checked],
    old_even: Even,
    new: Slot,
) -> Result<SlotState> {
    let count = old
        .first()
        .map(|c| c.slot.count)
        .ok_or_else(|| Error::State("no states to resume from".into()))?;
    if count == new.count && old_even == opts.even {
        // Same layout: continue this slot's own state, so the stream is identical.
        return old
            .iter()
            .find(|c| c.slot.index == new.index)
            .map(|c| c.state.clone())
            .ok_or_else(|| {
                Error::State(format!(
                    "no state for slot {} of {count} among the states given",
                    new.index
                ))
            });
    }
    let missing: Vec<u32> = (0..count)
        .filter(|i| !old.iter().any(|c| c.slot.index == *i))
        .collect();
    if !missing.is_empty() {
        return Err(Error::State(format!(
            "resuming {count} slots as {} needs the states of all {count}; missing slots {missing:?}",
            new.count
        )));
    }
    let owed = remainders(catalog, opts, old, old_even);
    let specs: Vec<(u64, SlotSpec)> = owed
        .into_iter()
        .map(|(e, r)| (e, piece(&r, new, opts.even)))
        .collect();
    let Some(&(epoch, _)) = specs.first() else {
        // Every old slot is past the last epoch: so is the new one.
        let end = opts.epochs.map(|n| opts.first_epoch + n);
        let last = old
            .iter()
            .map(|c| c.state.epoch)
            .max()
            .unwrap_or(opts.first_epoch);
        return Ok(SlotState::start_of(end.unwrap_or(last)));
    };
    let mut st = SlotState::start_of(epoch);
    st.buffer = specs
        .first()
        .map(|(_, s)| s.injected.clone())
        .unwrap_or_default();
    st.specs = specs;
    Ok(st)
}

/// What each unfinished epoch still owes, given every old slot's validated state.
fn remainders(
    catalog: &Arc<Catalog>,
    opts: &StreamOptions,
    old: &[Checked],
    old_even: Even,
) -> BTreeMap<u64, Remainder> {
    let end = opts.epochs.map(|n| opts.first_epoch + n);
    let mut owed: BTreeMap<u64, Remainder> = BTreeMap::new();
    let last = old
        .iter()
        .map(|c| c.state.epoch)
        .max()
        .unwrap_or(opts.first_epoch);
    let last = end.map_or(last, |e| last.min(e.saturating_sub(1)));
    // Every epoch has the same total, so one count serves the standard specs of all of them.
    let total = catalog.total_rows();
    for c in old {
        let st = &c.state;
        if end.is_some_and(|e| st.epoch >= e) {
            continue;
        }
        let r = owed.entry(st.epoch).or_default();
        r.rows.extend_from_slice(&st.buffer);
        r.ranges.extend(c.spec.ranges_after(st.cursor));
        for e in st.epoch + 1..=last {
            let spec = st
                .spec_for(e)
                .cloned()
                .unwrap_or_else(|| c.slot.standard_spec(total, old_even));
            let r = owed.entry(e).or_default();
            r.rows.extend(spec.injected);
            r.ranges.extend(spec.ranges);
        }
    }
    owed
}

/// Slot `new`'s balanced piece of a remainder laid out as `rows ++ ranges`.
fn piece(r: &Remainder, new: Slot, even: Even) -> SlotSpec {
    let nrows = r.rows.len() as u64;
    let n = nrows + r.ranges.iter().map(|x| x.end - x.start).sum::<u64>();
    let (i, c) = (new.index as u64, new.count as u64);
    let (mut lo, mut hi) = (n * i / c, n * (i + 1) / c);
    let mut pad = None;
    match even {
        Even::Off => {}
        Even::Drop => (lo, hi) = (n / c * i, n / c * (i + 1)),
        Even::Pad => {
            if hi - lo < n.div_ceil(c) && n > 0 {
                pad = Some(if hi > lo { lo } else { i % n });
            }
        }
    }
    let mut spec = SlotSpec::default();
    let take = |a: u64, b: u64, spec: &mut SlotSpec| {
        // Virtual positions [a, b) of rows ++ ranges.
        for v in a..b.min(nrows) {
            spec.injected.push(r.rows[v as usize]);
        }
        let mut at = nrows;
        for x in &r.ranges {
            let len = x.end - x.start;
            let (s, e) = (a.max(at), b.min(at + len));
            if s < e {
                spec.ranges.push(x.start + (s - at)..x.start + (e - at));
            }
            at += len;
        }
    };
    take(lo, hi, &mut spec);
    if let Some(p) = pad {
        take(p, p + 1, &mut spec);
    }
    spec
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::Stream;
    use crate::test_util::{drain_ids, ids, write_shards};
    use proptest::prelude::*;

    /// Validate then merge, as a resume does.
    fn merge(
        cat: &Arc<Catalog>,
        o: &StreamOptions,
        states: &[(Slot, SlotState)],
        old_even: Even,
        new: Slot,
    ) -> Result<SlotState> {
        let checked = check_states(cat, o, states.to_vec(), old_even)?;
        merged_state(cat, o, &checked, old_even, new)
    }

    fn opts(shuffle: usize, even: Even) -> StreamOptions {
        StreamOptions {
            seed: 5,
            shuffle_buffer: shuffle,
            epochs: Some(2),
            read_batch_rows: 4,
            even,
            ..Default::default()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

        /// Interrupt every slot of layout A after some batches, resume in layout B: per epoch,
        /// what A emitted plus what B emits is every row exactly once (Even::Off); and
        /// resuming with the same layout reproduces each slot's own stream.
        #[test]
        fn elastic_resume_is_exactly_once(
            rows in proptest::collection::vec(0usize..30, 1..4), shuffle in prop_oneof![Just(0usize), 1usize..20],
            old_count in 1u32..5, new_count in 1u32..5, bs in 1usize..6,
            cuts in proptest::collection::vec(0usize..40, 4),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let files = write_shards(dir.path(), &rows, 5);
            let cat = Arc::new(Catalog::open(&files, None).unwrap());
            let o = opts(shuffle, Even::Off);
            let total: usize = rows.iter().sum();
            let mut emitted = Vec::new(); // (epoch, id) pairs already emitted by layout A
            let mut states = Vec::new();
            for i in 0..old_count {
                let slot = Slot::new(i, old_count).unwrap();
                let mut s = Stream::new(cat.clone(), o.clone(), slot).unwrap();
                for _ in 0..cuts[i as usize] {
                    let before = s.state().epoch;
                    match s.next_batch(bs).unwrap() {
                        Some(b) => emitted.extend(ids(&b).into_iter().map(|x| (before.max(s.state().epoch), x))),
                        None => break,
                    }
                }
                states.push((slot, s.state()));
            }
            for j in 0..new_count {
                let slot = Slot::new(j, new_count).unwrap();
                let st = merge(&cat, &o, &states, Even::Off, slot).unwrap();
                let mut s = Stream::new(cat.clone(), o.clone(), slot).unwrap();
                s.restore(&st).unwrap();
                loop {
                    let before = s.state().epoch;
                    match s.next_batch(bs).unwrap() {
                        Some(b) => emitted.extend(ids(&b).into_iter().map(|x| (before.max(s.state().epoch), x))),
                        None => break,
                    }
                }
            }
            emitted.sort_unstable();
            let want: Vec<(u64, i64)> = (0..2u64).flat_map(|e| (0..total as i64).map(move |x| (e, x))).collect();
            prop_assert_eq!(emitted, want);
        }

        /// Same layout: merging returns each slot's own state, so streams are identical.
        #[test]
        fn same_layout_is_identity(rows in proptest::collection::vec(1usize..30, 1..3), count in 1u32..4, cut in 0usize..10) {
            let dir = tempfile::tempdir().unwrap();
            let files = write_shards(dir.path(), &rows, 5);
            let cat = Arc::new(Catalog::open(&files, None).unwrap());
            let o = opts(7, Even::Off);
            let mut states = Vec::new();
            let mut rests = Vec::new();
            for i in 0..count {
                let slot = Slot::new(i, count).unwrap();
                let mut s = Stream::new(cat.clone(), o.clone(), slot).unwrap();
                for _ in 0..cut { s.next_batch(3).unwrap(); }
                states.push((slot, s.state()));
                rests.push(drain_ids(&mut s, 3));
            }
            for i in 0..count {
                let slot = Slot::new(i, count).unwrap();
                let mut s = Stream::new(cat.clone(), o.clone(), slot).unwrap();
                s.restore(&merge(&cat, &o, &states, Even::Off, slot).unwrap()).unwrap();
                prop_assert_eq!(drain_ids(&mut s, 3), rests[i as usize].clone());
            }
        }

        /// Even::Drop / Pad: every slot of the new layout emits the same number of rows in
        /// every epoch, including the remainder epoch.
        #[test]
        fn even_policies_equalize_slots(rows in proptest::collection::vec(1usize..30, 1..3), old_count in 1u32..4,
                                        new_count in 1u32..5, pad in any::<bool>(), cut in 0usize..8) {
            let dir = tempfile::tempdir().unwrap();
            let files = write_shards(dir.path(), &rows, 5);
            let cat = Arc::new(Catalog::open(&files, None).unwrap());
            let o = opts(4, if pad { Even::Pad } else { Even::Drop });
            let mut states = Vec::new();
            for i in 0..old_count {
                let slot = Slot::new(i, old_count).unwrap();
                let mut s = Stream::new(cat.clone(), o.clone(), slot).unwrap();
                for _ in 0..cut { s.next_batch(1).unwrap(); }
                states.push((slot, s.state()));
            }
            let mut per_epoch: Vec<Vec<usize>> = Vec::new();
            for j in 0..new_count {
                let slot = Slot::new(j, new_count).unwrap();
                let mut s = Stream::new(cat.clone(), o.clone(), slot).unwrap();
                s.restore(&merge(&cat, &o, &states, o.even, slot).unwrap()).unwrap();
                let mut counts = BTreeMap::new();
                loop {
                    let e = s.state().epoch;
                    match s.next_batch(1).unwrap() {
                        Some(_) => *counts.entry(s.state().epoch.max(e)).or_insert(0usize) += 1,
                        None => break,
                    }
                }
                per_epoch.push(counts.values().copied().collect());
            }
            for w in per_epoch.windows(2) {
                prop_assert_eq!(&w[0], &w[1]);
            }
        }
    }

    #[test]
    fn missing_and_mixed_states_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_shards(dir.path(), &[20], 5);
        let cat = Arc::new(Catalog::open(&files, None).unwrap());
        let o = opts(3, Even::Off);
        let st = SlotState::start_of(0);
        let two = |i| (Slot::new(i, 2).unwrap(), st.clone());
        let three = (Slot::new(0, 3).unwrap(), st.clone());
        let new = Slot::new(0, 1).unwrap();
        let msg = |r: Result<SlotState>| match r {
            Err(Error::State(m)) => m,
            other => panic!("expected a state error, got {other:?}"),
        };
        assert!(msg(merge(&cat, &o, &[two(0)], Even::Off, new)).contains("missing slots [1]"));
        assert!(msg(merge(&cat, &o, &[two(0), two(0)], Even::Off, new)).contains("two states"));
        assert!(
            msg(merge(&cat, &o, &[two(0), three], Even::Off, new)).contains("different layouts")
        );
        assert!(msg(merge(&cat, &o, &[], Even::Off, new)).contains("no states"));
    }
}

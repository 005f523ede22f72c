//! Where a stream starts: the one owner of "continue from a checkpoint".
//!
//! [`Resume::load`] takes the states found in a checkpoint (one slot's, or every slot's of some
//! layout) and checks them once, completely: each envelope strictly, then against this dataset
//! (settings, fingerprint — naming changed shards), then each position against the epoch plan
//! of its own slot. What passes is kept as validated positions, so starting a stream from it
//! (the slot's own state, or its share of every slot's remainder in another layout: elastic.rs)
//! never validates again. With `allow_changed`, positions saved over shards that changed since
//! are carried over: same epoch, same number of rows emitted in it, fast-forwarded on the new
//! data's coordinates.
//!
//! The skip log lives here too: every skip applied (history, saved in the state) and skips to
//! apply again when the stream reaches them (replay).

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::Value;

use crate::catalog::Catalog;
use crate::elastic::{check_states, merged_state, Checked};
use crate::error::{Error, Result};
use crate::plan::{EpochPlan, Even, Slot};
use crate::settings::{Layout, Settings, StreamOptions, Tuning};
use crate::state::envelope::{
    parse_stream, FingerprintRecord, SettingsRecord, SkipRecord, StreamState,
};
use crate::state::SlotState;
use crate::stream::{seek_of, Stream};

/// Skip records, sorted and without duplicates (several slots' states carry the same history).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SkipLog(BTreeSet<SkipRecord>);

impl SkipLog {
    pub fn records(&self) -> Vec<SkipRecord> {
        self.0.iter().copied().collect()
    }

    pub fn extend(&mut self, records: impl IntoIterator<Item = SkipRecord>) {
        self.0.extend(records);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Record the ranges one skip of `slot` passed over (`(epoch, start, stop)` per epoch
    /// touched, in order) as ONE record: from its first row, `stop - start` rows of the slot's
    /// stream, which may run past the end of that epoch into the next ones. A skip across a
    /// million epochs of an endless pass is one record, and replaying it (skip that many rows
    /// from there) crosses the same epoch ends.
    pub fn record(&mut self, slot: Slot, ranges: &[(u64, u64, u64)]) {
        let rows: u64 = ranges.iter().map(|(_, a, b)| b - a).sum();
        let Some(&(epoch, start, _)) = ranges.iter().find(|(_, a, b)| b > a) else {
            return;
        };
        self.0.insert(SkipRecord {
            epoch,
            slot: [slot.index, slot.count],
            start,
            stop: start + rows,
        });
    }

    /// For replay at `(epoch, at)` of `slot`: the record starting exactly there, and the start
    /// of the next one after it in this epoch.
    pub fn due(&self, slot: Slot, epoch: u64, at: u64) -> (Option<SkipRecord>, Option<u64>) {
        let me = [slot.index, slot.count];
        let mut here = None;
        let mut next = None;
        for r in self.0.iter().filter(|r| r.epoch == epoch && r.slot == me) {
            if r.start == at && here.is_none() {
                here = Some(*r);
            } else if r.start > at {
                next = Some(next.map_or(r.start, |n: u64| n.min(r.start)));
            }
        }
        (here, next)
    }
}

/// Where the next stream of a dataset starts: the beginning of a pass, or validated positions.
#[derive(Debug, Clone)]
pub struct Resume {
    first_epoch: u64,
    /// Validated positions of one layout (empty: the start of the pass).
    loaded: Vec<Checked>,
    /// The `even` policy of that layout.
    even: Even,
    /// States given that had not started (no slot) and did not fill a missing slot.
    unstarted: usize,
    pub skips: SkipLog,
    pub replay: SkipLog,
}

impl Resume {
    /// The start of a pass at `first_epoch`.
    pub fn start(first_epoch: u64) -> Self {
        Resume {
            first_epoch,
            loaded: Vec::new(),
            even: Even::Off,
            unstarted: 0,
            skips: SkipLog::default(),
            replay: SkipLog::default(),
        }
    }

    /// A stream's own position (already valid: it is where the stream is).
    pub(crate) fn at(
        first_epoch: u64,
        slot: Slot,
        even: Even,
        checked: (SlotState, crate::plan::SlotSpec),
        skips: SkipLog,
        replay: SkipLog,
    ) -> Self {
        Resume {
            first_epoch,
            loaded: vec![Checked {
                slot,
                state: checked.0,
                spec: checked.1,
            }],
            even,
            unstarted: 0,
            skips,
            replay,
        }
    }

    pub fn first_epoch(&self) -> u64 {
        self.first_epoch
    }

    /// The epochs the loaded positions are in (empty: none loaded).
    pub fn epochs(&self) -> Vec<u64> {
        let set: BTreeSet<u64> = self.loaded.iter().map(|c| c.state.epoch).collect();
        set.into_iter().collect()
    }

    /// True when no position was loaded (nothing read yet).
    pub fn at_start(&self) -> bool {
        self.loaded.is_empty()
    }

    /// The start of the same pass again (a new `iter()` after the pass ended), or of another
    /// one (`set_epoch`): no position, the skip history and replay plan kept.
    pub fn restart(&self, first_epoch: u64) -> Resume {
        Resume {
            loaded: Vec::new(),
            first_epoch,
            ..self.clone()
        }
    }

    /// Check the states found in a checkpoint against this dataset, once, completely.
    pub fn load(
        catalog: &Arc<Catalog>,
        settings: &Settings,
        states: Vec<Value>,
        allow_changed: bool,
    ) -> Result<Resume> {
        let now = SettingsRecord::of(settings);
        let mut parsed = Vec::with_capacity(states.len());
        let mut changed = false;
        for v in states {
            let st = parse_stream(v, "state")?;
            let diffs = st.settings.differences(&now);
            if !diffs.is_empty() {
                return Err(Error::State(format!(
                    "state was saved with different settings: {}",
                    diffs.join("; ")
                )));
            }
            if !st.fingerprint.matches(catalog.fingerprint()) {
                match changed_shards(&st.fingerprint, catalog) {
                    Error::ShardsChanged { .. } if allow_changed => changed = true,
                    e => return Err(e),
                }
            }
            parsed.push(st);
        }
        let first: BTreeSet<u64> = parsed.iter().map(|s| s.first_epoch).collect();
        if first.len() > 1 {
            return Err(Error::State(format!(
                "the states come from different passes (first epochs {:?})",
                first.iter().collect::<Vec<_>>()
            )));
        }
        let first_epoch = first.into_iter().next().unwrap_or(0);
        let mut skips = SkipLog::default();
        let mut pending = Vec::new();
        let mut evens = BTreeSet::new();
        for st in &parsed {
            skips.extend(st.skips.iter().copied());
            // Slots that had not started carry no position: nothing to continue there.
            let (Some((slot, even)), Some(pos)) = (st.layout(), &st.position) else {
                continue;
            };
            evens.insert(even.name());
            if pos.pack.is_some() != settings.pack.is_some() {
                return Err(Error::State(format!(
                    "state['position'] {} the packer's pending documents ('pack'), but the \
                     settings {}",
                    if pos.pack.is_some() { "has" } else { "lacks" },
                    if settings.pack.is_some() {
                        "pack"
                    } else {
                        "do not pack"
                    }
                )));
            }
            pending.push((slot, even, pos.to_slot_state("state['position']")?, pos));
        }
        if evens.len() > 1 {
            return Err(Error::State(format!(
                "the states mix even policies {:?}: pass one checkpoint's states",
                evens.iter().collect::<Vec<_>>()
            )));
        }
        let even = pending.first().map_or(Even::Off, |p| p.1);
        let opts = StreamOptions::new(settings, &Tuning::default(), first_epoch, even, 0);
        let mut positions = Vec::with_capacity(pending.len());
        for (slot, _, st, _) in &pending {
            let st = if changed {
                carry_over(catalog, &opts, *slot, st)?
            } else {
                st.clone()
            };
            positions.push((*slot, st));
        }
        // A rank that never iterated saves a state without a slot: its slot is the one missing
        // from the others, and its position is the start of the pass (nothing was read). Only
        // when the count matches exactly; otherwise the merge reports the missing slots.
        let unstarted = parsed.iter().filter(|s| s.slot.is_none()).count();
        let mut unstarted_left = unstarted;
        if let Some(count) = positions.first().map(|(s, _)| s.count) {
            let missing: Vec<u32> = (0..count)
                .filter(|i| !positions.iter().any(|(s, _)| s.index == *i))
                .collect();
            if !missing.is_empty() && missing.len() == unstarted {
                unstarted_left = 0;
                for i in missing {
                    positions.push((Slot::new(i, count)?, SlotState::start_of(first_epoch)));
                }
            }
        }
        let loaded = if positions.is_empty() {
            Vec::new()
        } else {
            check_states(catalog, &opts, positions, even)?
        };
        if !changed {
            // The informational seek must describe the position it was saved with.
            for (slot, _, _, pos) in &pending {
                let Some(saved) = &pos.seek else { continue };
                let Some(c) = loaded.iter().find(|c| c.slot == *slot) else {
                    continue;
                };
                let plan = EpochPlan::new(
                    catalog.units(),
                    settings.seed,
                    c.state.epoch,
                    settings.shuffle_buffer > 0,
                );
                let here = seek_of(catalog, &plan, &c.spec, &c.state);
                if here.as_ref() != Some(saved) {
                    return Err(Error::State(format!(
                        "state's seek ({saved}) does not match its position, which resumes at {}",
                        here.map_or("nothing: the slot has no rows left".into(), |h| format!(
                            "({h})"
                        ))
                    )));
                }
            }
        }
        Ok(Resume {
            first_epoch,
            loaded,
            even,
            unstarted: unstarted_left,
            skips,
            replay: SkipLog::default(),
        })
    }

    /// The position the stream of `layout` starts from: its own loaded state, or (another
    /// layout) its share of what every loaded slot had left; `None` at the start of the pass.
    pub fn position(
        &self,
        catalog: &Arc<Catalog>,
        settings: &Settings,
        layout: Layout,
    ) -> Result<Option<SlotState>> {
        if self.loaded.is_empty() {
            return Ok(None);
        }
        if self.even == layout.even {
            if let Some(c) = self.loaded.iter().find(|c| c.slot == layout.slot) {
                return Ok(Some(c.state.clone()));
            }
        }
        let opts = StreamOptions::new(
            settings,
            &Tuning::default(),
            self.first_epoch,
            layout.even,
            0,
        );
        merged_state(catalog, &opts, &self.loaded, self.even, layout.slot)
            .map(|mut st| {
                if settings.pack.is_some() {
                    st.pack = Some(self.pending_share(layout.slot));
                }
                Some(st)
            })
            .map_err(|e| {
                let unstarted = match self.unstarted {
                    0 => String::new(),
                    n => format!(
                        "; {n} of the states given had not started iterating: they carry no \
                         slot, so which slots they stand for is not known"
                    ),
                };
                Error::State(format!(
                    "{} (this iterator is slot {} of {}, slot = rank * num_workers + worker_id; \
                     to resume with other ranks or workers, load the states of every slot, e.g. \
                     a list of all ranks' states{unstarted})",
                    e, layout.slot.index, layout.slot.count
                ))
            })
    }

    /// With packing, another layout: old slot `i`'s pending documents go to new slot
    /// `i % count`, queues concatenated in old-slot order, so each is packed exactly once.
    fn pending_share(&self, new: Slot) -> Vec<crate::pack::DocRef> {
        let mut old: Vec<&Checked> = self.loaded.iter().collect();
        old.sort_by_key(|c| c.slot.index);
        old.into_iter()
            .filter(|c| c.slot.index % new.count == new.index)
            .flat_map(|c| c.state.pack.clone().unwrap_or_default())
            .collect()
    }

    /// The state a stream of `layout` would save right now, before reading anything.
    pub fn state(
        &self,
        catalog: &Arc<Catalog>,
        settings: &Settings,
        layout: Layout,
    ) -> Result<StreamState> {
        if self.loaded.is_empty() {
            return Ok(StreamState::new(
                catalog,
                settings,
                self.first_epoch,
                None,
                self.skips.records(),
            ));
        }
        self.stream(catalog, settings, layout)?.checkpoint(None)
    }

    /// The stream of `layout` from here, for work on coordinates (a state, a skip): default
    /// tuning and no readahead (nothing is read unless it is iterated).
    pub fn stream(
        &self,
        catalog: &Arc<Catalog>,
        settings: &Settings,
        layout: Layout,
    ) -> Result<Stream> {
        Stream::resume(
            catalog.clone(),
            settings,
            &Tuning::default(),
            layout,
            0,
            self,
        )
    }

    /// This resume point moved on by `n` items of `layout`'s stream (nothing read).
    pub fn skip(
        &self,
        catalog: &Arc<Catalog>,
        settings: &Settings,
        layout: Layout,
        n: u64,
    ) -> Result<Resume> {
        if self.loaded.len() > 1 {
            return Err(Error::State(
                "skip() before iterating needs a single loaded state; to skip in every slot of \
                 a multi-slot checkpoint, rewrite it with skip_state()"
                    .into(),
            ));
        }
        let mut s = self.stream(catalog, settings, layout)?;
        s.skip_items(n, None)?;
        s.resume_point(None)
    }

    /// Add skips to apply again when the stream reaches them.
    pub fn with_replay(mut self, records: impl IntoIterator<Item = SkipRecord>) -> Resume {
        self.replay.extend(records);
        self
    }

    /// Every loaded position as a state (for pickling into spawned DataLoader workers).
    pub fn states(&self, catalog: &Arc<Catalog>, settings: &Settings) -> Result<Vec<StreamState>> {
        if self.loaded.is_empty() {
            let any = Layout::new(0, 1, 0, 1, Even::Off)?;
            return Ok(vec![self.state(catalog, settings, any)?]);
        }
        self.loaded
            .iter()
            .map(|c| {
                let layout = Layout {
                    slot: c.slot,
                    even: self.even,
                };
                self.state(catalog, settings, layout)
            })
            .collect()
    }
}

/// A position over changed shards: same epoch, same rows emitted in it, on the new data.
fn carry_over(
    catalog: &Arc<Catalog>,
    opts: &StreamOptions,
    slot: Slot,
    st: &SlotState,
) -> Result<SlotState> {
    let mut s = Stream::new(catalog.clone(), opts.clone(), slot)?;
    s.restore(&SlotState::start_of(st.epoch))?;
    s.skip(st.emitted, 1, false)?;
    Ok(s.state())
}

/// The error for a fingerprint mismatch: another shard set, or the same one changed (then
/// naming the shards, from the per-bucket digests).
fn changed_shards(saved: &FingerprintRecord, catalog: &Catalog) -> Error {
    let now = catalog.fingerprint();
    let diff = match catalog.changes_since(&saved.buckets) {
        Ok(d) => d,
        Err(e) => return Error::State(format!("state's fingerprint is malformed: {}", e)),
    };
    let (added, changed, removed) = (diff.added, diff.changed, diff.removed_buckets);
    if saved.paths != now.paths
        && now.shards > 1
        && (added.len() + changed.len()) as u64 >= now.shards
    {
        // No shard of this dataset is where the state's digests expect it: other data.
        return Error::State(format!(
            "state belongs to a different shard set: it was saved over {} shards (paths digest \
             {}), this dataset has {} shards (paths digest {})",
            saved.shards, saved.paths, now.shards, now.paths
        ));
    }
    let mut parts = Vec::new();
    if !changed.is_empty() {
        parts.push(format!("modified or replaced: {}", names(&changed)));
    }
    if !added.is_empty() {
        parts.push(format!("added: {}", names(&added)));
    }
    let gone =
        (saved.shards as i128 - now.shards as i128 - added.len() as i128).max(removed as i128);
    if removed > 0 || saved.shards > now.shards {
        parts.push(format!(
            "removed or renamed: {gone} shard(s) (the state does not store their paths)"
        ));
    }
    if parts.is_empty() {
        // Digests collide or only the totals differ.
        parts.push("the shards' sizes, row counts or footers differ".into());
    }
    Error::ShardsChanged {
        message: format!(
            "shards changed since the state was saved (then {} shards / {} rows, now {} / {}): \
             {}. To continue anyway, pass load_state_dict(..., allow_changed_shards=True): the \
             epoch and the rows already yielded in it are kept, the rest of that epoch is read \
             from the new data",
            saved.shards,
            saved.rows,
            now.shards,
            now.rows,
            parts.join("; ")
        ),
        added,
        changed,
        removed: gone.max(0) as u64,
    }
}

fn names(paths: &[String]) -> String {
    const LIMIT: usize = 10;
    let more = if paths.len() > LIMIT {
        format!(" and {} more", paths.len() - LIMIT)
    } else {
        String::new()
    };
    paths[..paths.len().min(LIMIT)].join(", ") + &more
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{ids, write_shards};
    use proptest::prelude::*;

    fn settings(shuffle: usize, batch: Option<u64>, drop_last: bool) -> Settings {
        Settings {
            seed: 3,
            shuffle_buffer: shuffle,
            batch_size: batch,
            drop_last,
            epochs: Some(2),
            even: Even::Drop,
            pack: None,
        }
    }

    fn drain(s: &mut Stream) -> Vec<Vec<i64>> {
        let mut out = Vec::new();
        while let Some(b) = s.next_item().unwrap() {
            out.push(ids(&b));
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        /// A checkpoint taken after any item (or any row of a row-mode chunk), loaded from its
        /// plain form, continues the stream exactly, in every slot of a layout; `skips` and
        /// the layout's `even` survive the round trip.
        #[test]
        fn checkpoints_resume_exactly(
            rows in proptest::collection::vec(0usize..40, 1..4),
            shuffle in prop_oneof![Just(0usize), 1usize..30],
            batch in prop_oneof![Just(None), (1u64..7).prop_map(Some)],
            drop_last: bool, world in 1u64..3, cut in 0usize..12, within in 0usize..5,
            skip in 0u64..3,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let files = write_shards(dir.path(), &rows, 6);
            let cat = Arc::new(Catalog::open(&files, None).unwrap());
            let st = settings(shuffle, batch, drop_last);
            for rank in 0..world {
                let layout = Layout::new(rank, world, 0, 1, st.even).unwrap();
                let start = Resume::start(0);
                let fresh = || Stream::resume(cat.clone(), &st, &Tuning::default(), layout, 0, &start).unwrap();
                let mut s = fresh();
                s.skip_items(skip, None).unwrap();
                let mut head = Vec::new();
                for _ in 0..cut {
                    match s.next_item().unwrap() { Some(b) => head.push(ids(&b)), None => break }
                }
                // Row mode: stop `within` rows into the last chunk.
                let k = match (batch, head.last()) {
                    (None, Some(last)) if within < last.len() => Some(within),
                    _ => None,
                };
                let saved = s.checkpoint(k).unwrap();
                let mut want: Vec<i64> = Vec::new();
                if let Some(k) = k {
                    // The rest of the last chunk, then the rest of the stream.
                    want.extend_from_slice(&head.last().unwrap()[k..]);
                }
                want.extend(drain(&mut s).concat());
                let loaded = Resume::load(&cat, &st, vec![saved.to_value()], false).unwrap();
                prop_assert_eq!(loaded.skips.records(), saved.skips.clone());
                let mut r = Stream::resume(cat.clone(), &st, &Tuning::default(), layout, 0, &loaded).unwrap();
                prop_assert_eq!(drain(&mut r).concat(), want);
                prop_assert_eq!(r.checkpoint(None).unwrap().slot, saved.slot);
            }
        }
    }

    #[test]
    fn mismatched_states_are_refused_naming_what_differs() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_shards(dir.path(), &[20, 9], 6);
        let cat = Arc::new(Catalog::open(&files, None).unwrap());
        let st = settings(4, Some(3), false);
        let layout = Layout::new(0, 1, 0, 1, st.even).unwrap();
        let mut s = Stream::resume(
            cat.clone(),
            &st,
            &Tuning::default(),
            layout,
            0,
            &Resume::start(0),
        )
        .unwrap();
        s.next_item().unwrap();
        let saved = s.checkpoint(None).unwrap().to_value();
        let err = |st: &Settings, v: Value| {
            Resume::load(&cat, st, vec![v], false)
                .unwrap_err()
                .to_string()
        };
        assert!(err(&settings(5, Some(3), false), saved.clone())
            .contains("shuffle_buffer: state has 4, dataset has 5"));
        let mut v = saved.clone();
        v["position"]["cursor"] = serde_json::json!(1);
        assert!(err(&st, v).starts_with("invalid state for epoch 0"));
        let mut v = saved.clone();
        v["position"]["seek"]["row"] = serde_json::json!(99);
        assert!(err(&st, v).contains("does not match its position"));
        let mut v = saved.clone();
        v["fingerprint"]["content"] = serde_json::json!("00");
        assert!(matches!(
            Resume::load(&cat, &st, vec![v], false),
            Err(Error::ShardsChanged { .. })
        ));
        let mut other = saved.clone();
        other["first_epoch"] = serde_json::json!(1);
        other["position"]["epoch"] = serde_json::json!(1);
        assert!(err(&st, serde_json::json!(null)).contains("is a dict"));
        assert!(Resume::load(&cat, &st, vec![saved, other], false)
            .unwrap_err()
            .to_string()
            .contains("different passes"));
    }

    /// A rank that never iterated saves a slot-less state; with the other rank's state it
    /// resumes in any layout, every row exactly once (its slot starts from the beginning).
    #[test]
    fn unstarted_rank_fills_its_missing_slot() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_shards(dir.path(), &[23, 17], 5);
        let cat = Arc::new(Catalog::open(&files, None).unwrap());
        let st = Settings {
            epochs: Some(1),
            even: Even::Off,
            ..settings(6, Some(4), false)
        };
        let two = |r| Layout::new(r, 2, 0, 1, st.even).unwrap();
        let mut a = Stream::resume(
            cat.clone(),
            &st,
            &Tuning::default(),
            two(0),
            0,
            &Resume::start(0),
        )
        .unwrap();
        let mut seen: Vec<i64> = Vec::new();
        for _ in 0..2 {
            seen.extend(ids(&a.next_item().unwrap().unwrap()));
        }
        let started = a.checkpoint(None).unwrap().to_value();
        let never = Resume::start(0)
            .state(&cat, &st, two(1))
            .unwrap()
            .to_value();
        assert!(never["slot"].is_null());
        let loaded = Resume::load(&cat, &st, vec![started.clone(), never.clone()], false).unwrap();
        let one = Layout::new(0, 1, 0, 1, st.even).unwrap();
        let mut r = Stream::resume(cat.clone(), &st, &Tuning::default(), one, 0, &loaded).unwrap();
        seen.extend(drain(&mut r).concat());
        seen.sort_unstable();
        assert_eq!(seen, (0..40).collect::<Vec<i64>>());
        // Without the unstarted state the slot is missing, and the message says so.
        let loaded = Resume::load(&cat, &st, vec![started], false).unwrap();
        let err = loaded.position(&cat, &st, one).unwrap_err().to_string();
        assert!(err.contains("missing slots [1]"), "{err}");
    }

    /// A skip across many epochs of an endless pass is one record, and replaying it from an
    /// earlier point gives the stream the skipping run had.
    #[test]
    fn a_skip_across_epochs_is_one_record_and_replays_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_shards(dir.path(), &[7, 5], 3);
        let cat = Arc::new(Catalog::open(&files, None).unwrap());
        let st = Settings {
            epochs: None,
            ..settings(4, Some(5), true)
        };
        let layout = Layout::new(0, 1, 0, 1, st.even).unwrap();
        let start = Resume::start(0);
        let mut a =
            Stream::resume(cat.clone(), &st, &Tuning::default(), layout, 0, &start).unwrap();
        a.next_item().unwrap();
        a.skip_items(1000, None).unwrap();
        let after: Vec<Vec<i64>> = (0..6)
            .map(|_| ids(&a.next_item().unwrap().unwrap()))
            .collect();
        let saved = a.checkpoint(None).unwrap();
        assert_eq!(saved.skips.len(), 1, "{:?}", saved.skips);
        let replay = Resume::start(0).with_replay(saved.skips.clone());
        let mut b =
            Stream::resume(cat.clone(), &st, &Tuning::default(), layout, 0, &replay).unwrap();
        b.next_item().unwrap();
        let again: Vec<Vec<i64>> = (0..6)
            .map(|_| ids(&b.next_item().unwrap().unwrap()))
            .collect();
        assert_eq!(again, after);
    }
}

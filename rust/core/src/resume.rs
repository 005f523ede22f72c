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
use crate::elastic::{
    check_states, merged_from_summaries, merged_state, needed_slots, pending_owner, Checked,
    Summary,
};
use crate::error::{Error, Result};
use crate::plan::{EpochPlan, Even, Slot};
use crate::settings::{Layout, Settings, StreamOptions, Tuning};
use crate::state::envelope::{
    parse_stream, FingerprintRecord, SettingsRecord, SkipRecord, SlotRecord, StreamState,
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
    /// Two-phase elastic resume: every old slot's summary; `loaded` then holds the full
    /// states of only some slots (empty: `loaded` holds them all).
    summaries: Vec<Summary>,
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
            summaries: Vec::new(),
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
            summaries: Vec::new(),
            skips,
            replay,
        }
    }

    pub fn first_epoch(&self) -> u64 {
        self.first_epoch
    }

    /// The epochs the loaded positions are in (empty: none loaded).
    pub fn epochs(&self) -> Vec<u64> {
        let set: BTreeSet<u64> = if self.summaries.is_empty() {
            self.loaded.iter().map(|c| c.state.epoch).collect()
        } else {
            self.summaries.iter().map(|s| s.epoch).collect()
        };
        set.into_iter().collect()
    }

    /// True when no position was loaded (nothing read yet).
    pub fn at_start(&self) -> bool {
        self.loaded.is_empty() && self.summaries.is_empty()
    }

    /// The start of the same pass again (a new `iter()` after the pass ended), or of another
    /// one (`set_epoch`): no position, the skip history and replay plan kept.
    pub fn restart(&self, first_epoch: u64) -> Resume {
        Resume {
            loaded: Vec::new(),
            summaries: Vec::new(),
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
            let present: Vec<u32> = positions.iter().map(|(s, _)| s.index).collect();
            let missing = unstarted_slots(count, &present, unstarted);
            if !missing.is_empty() {
                unstarted_left = 0;
            }
            for i in missing {
                positions.push((Slot::new(i, count)?, SlotState::start_of(first_epoch)));
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
            summaries: Vec::new(),
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
        if self.at_start() {
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
        let merged = if self.summaries.is_empty() {
            merged_state(catalog, &opts, &self.loaded, self.even, layout.slot)
        } else {
            self.merged_from_summaries(catalog, &opts, settings, layout.slot)
        };
        merged
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

    /// The two-phase merge: every old slot's summary, the loaded full states of some.
    fn merged_from_summaries(
        &self,
        catalog: &Arc<Catalog>,
        opts: &StreamOptions,
        settings: &Settings,
        new: Slot,
    ) -> Result<SlotState> {
        if settings.pack.is_some() {
            // Pending documents are carried by slot index: each must be here, or lost.
            let count = self.summaries[0].slot.count;
            if let Some(i) = self
                .summaries
                .iter()
                .filter(|s| s.pending && pending_owner(s.slot.index, new.count) == new.index)
                .map(|s| s.slot.index)
                .find(|i| !self.loaded.iter().any(|c| c.slot.index == *i))
            {
                return Err(Error::State(format!(
                    "slot {} of {} needs the full state of old slot {i} of {count} (it continues \
                     that slot's pending documents), which was not given",
                    new.index, new.count
                )));
            }
        }
        let states = self
            .loaded
            .iter()
            .map(|c| (c.slot.index, c.state.clone()))
            .collect();
        let total = catalog.total_rows();
        merged_from_summaries(opts, total, &self.summaries, &states, self.even, new)
    }

    /// Two-phase elastic resume, phase 2: the full states of some old slots (`states`, e.g.
    /// those [`Resume::needed_slots`] names) and every old slot's summary (`summaries`: each
    /// the `slot` and `position` of its state; `buffer` and anything else may be absent).
    /// Full states are checked as [`Resume::load`] checks them, summaries by their counts, and
    /// each full state must agree with its slot's summary.
    pub fn load_partial(
        catalog: &Arc<Catalog>,
        settings: &Settings,
        states: Vec<Value>,
        summaries: Vec<Value>,
    ) -> Result<Resume> {
        let mut r = Resume::load(catalog, settings, states, false)?;
        let (sums, even, first_epoch) = parse_summaries(catalog, summaries)?;
        if !r.loaded.is_empty() && first_epoch != r.first_epoch {
            return Err(Error::State(format!(
                "the summaries come from a pass starting at epoch {first_epoch}, the states from \
                 one at {}: pass one checkpoint's",
                r.first_epoch
            )));
        }
        if !r.loaded.is_empty() && even != r.even {
            return Err(Error::State(format!(
                "the summaries are of a layout with even={:?}, the states of even={:?}: pass \
                 one checkpoint's",
                even.name(),
                r.even.name()
            )));
        }
        for c in &r.loaded {
            let Some(s) = sums.iter().find(|s| s.slot.index == c.slot.index) else {
                return Err(Error::State(format!(
                    "no summary for slot {} of {}, whose state was given",
                    c.slot.index, c.slot.count
                )));
            };
            if *s != Summary::of(c) {
                return Err(Error::State(format!(
                    "the summary of slot {} of {} does not match its state: pass the summaries \
                     and states of one checkpoint",
                    c.slot.index, c.slot.count
                )));
            }
        }
        r.even = even;
        r.first_epoch = first_epoch;
        r.summaries = sums;
        Ok(r)
    }

    /// Two-phase elastic resume, phase 1: from every old slot's summary (see
    /// [`Resume::load_partial`]), the old slots whose full states the streams of `layouts`
    /// need (sorted). Same layout: each its own slot.
    pub fn needed_slots(
        catalog: &Arc<Catalog>,
        settings: &Settings,
        summaries: Vec<Value>,
        layouts: &[Layout],
    ) -> Result<Vec<u32>> {
        let (sums, even, first_epoch) = parse_summaries(catalog, summaries)?;
        if sums.is_empty() {
            return Ok(Vec::new()); // no rank had iterated: every slot starts the pass
        }
        let mut need = BTreeSet::new();
        for layout in layouts {
            let opts =
                StreamOptions::new(settings, &Tuning::default(), first_epoch, layout.even, 0);
            need.extend(needed_slots(
                &opts,
                catalog.total_rows(),
                &sums,
                even,
                layout.slot,
            )?);
        }
        Ok(need.into_iter().collect())
    }

    /// With packing, another layout: each old slot's pending documents go to one new slot
    /// ([`pending_owner`]), queues concatenated in old-slot order, so each is packed exactly
    /// once.
    fn pending_share(&self, new: Slot) -> Vec<crate::pack::DocRef> {
        let mut old: Vec<&Checked> = self.loaded.iter().collect();
        old.sort_by_key(|c| c.slot.index);
        old.into_iter()
            .filter(|c| pending_owner(c.slot.index, new.count) == new.index)
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
        if self.at_start() {
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

    /// True when the stream of `layout` from here has nothing left in its pass (nothing read):
    /// a state saved at the end of its pass (`Stream::pass_ended`).
    pub fn pass_ended(
        &self,
        catalog: &Arc<Catalog>,
        settings: &Settings,
        layout: Layout,
    ) -> Result<bool> {
        Ok(self.stream(catalog, settings, layout)?.pass_ended())
    }

    /// This resume point moved on by `n` items of `layout`'s stream (nothing read).
    pub fn skip(
        &self,
        catalog: &Arc<Catalog>,
        settings: &Settings,
        layout: Layout,
        n: u64,
    ) -> Result<Resume> {
        if self.loaded.len() > 1 || !self.summaries.is_empty() {
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
        if !self.summaries.is_empty() {
            return Err(Error::State(
                "a resume loaded in two phases (summaries and some slots' states) cannot be \
                 passed on as states: load it where the stream runs (in each DataLoader worker)"
                    .into(),
            ));
        }
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

/// The slots of a `count`-slot layout that `unstarted` states without a slot (ranks that never
/// iterated) stand for, at the start of the pass: the slots missing from `present`, when exactly
/// that many are missing; none otherwise (the merge then reports the missing slots). Full
/// states, summaries and mixture states all follow this rule.
pub(crate) fn unstarted_slots(count: u32, present: &[u32], unstarted: usize) -> Vec<u32> {
    let missing: Vec<u32> = (0..count).filter(|i| !present.contains(i)).collect();
    if !missing.is_empty() && missing.len() == unstarted {
        missing
    } else {
        Vec::new()
    }
}

/// Every old slot's summary (its state's `slot` and `position`, `buffer` optional) and the
/// layout's `even` policy.
fn parse_summaries(
    catalog: &Arc<Catalog>,
    values: Vec<Value>,
) -> Result<(Vec<Summary>, Even, u64)> {
    let total = catalog.total_rows();
    let mut out = Vec::with_capacity(values.len());
    let mut evens = BTreeSet::new();
    let mut firsts = BTreeSet::new();
    let mut unstarted = 0usize;
    for (i, v) in values.into_iter().enumerate() {
        let what = format!("summaries[{i}]");
        let field = |k: &str| -> Result<Value> {
            v.get(k).cloned().ok_or_else(|| {
                Error::State(format!(
                    "{what} has no '{k}' (expected a state's 'first_epoch', 'slot' and 'position')"
                ))
            })
        };
        firsts.insert(
            field("first_epoch")?.as_u64().ok_or_else(|| {
                Error::State(format!("{what}['first_epoch'] must be an int >= 0"))
            })?,
        );
        if field("slot")?.is_null() && field("position")?.is_null() {
            // A rank that never iterated: the slot missing from the others, at the start.
            unstarted += 1;
            continue;
        }
        let slot: SlotRecord = serde_json::from_value(field("slot")?)
            .map_err(|e| Error::State(format!("{what}['slot']: {e}")))?;
        let even = Even::parse_state(&slot.even, &format!("{what}['slot']['even']"))?;
        evens.insert(even.name());
        let pos = field("position")?;
        let num = |k: &str| -> Result<u64> {
            pos.get(k).and_then(Value::as_u64).ok_or_else(|| {
                Error::State(format!("{what}['position']['{k}'] must be an int >= 0"))
            })
        };
        let mut specs = Vec::new();
        for (j, sp) in pos
            .get("specs")
            .and_then(Value::as_array)
            .ok_or_else(|| Error::State(format!("{what}['position']['specs'] must be a list")))?
            .iter()
            .enumerate()
        {
            let at = format!("{what}['position']['specs'][{j}]");
            let rec: SummarySpec = serde_json::from_value(sp.clone())
                .map_err(|e| Error::State(format!("{at}: {e}")))?;
            let ranges = rec.ranges.iter().map(|[a, b]| *a..*b).collect();
            let counted = match &rec.injected {
                None => None,
                Some(text) => Some(base64_ids_len(text).ok_or_else(|| {
                    Error::State(format!("{at}['injected'] is not base64 of 8-byte row ids"))
                })?),
            };
            let injected = match (rec.injected_rows, counted) {
                (Some(a), Some(b)) if a != b => {
                    return Err(Error::State(format!(
                        "{at}: 'injected_rows' is {a} but 'injected' holds {b} rows"
                    )))
                }
                (Some(n), _) | (None, Some(n)) => n,
                (None, None) => {
                    return Err(Error::State(format!(
                        "{at} has neither 'injected' nor 'injected_rows'"
                    )))
                }
            };
            specs.push((rec.epoch, ranges, injected));
        }
        let slot_ = Slot::new(slot.index, slot.count)?;
        let mut summary = Summary::from_counts(
            slot_,
            num("epoch")?,
            num("cursor")?,
            num("emitted")?,
            specs,
            total,
            even,
        )?;
        // The packer's queue (kept in a summary: its row ids, 8 bytes a pending document).
        // Anything but an empty queue counts as pending; loading the state checks its shape.
        summary.pending = match pos.get("pack") {
            None | Some(Value::Null) => false,
            Some(p) => p.get("rows").and_then(Value::as_str) != Some(""),
        };
        out.push(summary);
    }
    if evens.len() > 1 {
        return Err(Error::State(format!(
            "the summaries mix even policies {:?}: pass one checkpoint's",
            evens.iter().collect::<Vec<_>>()
        )));
    }
    if firsts.len() > 1 {
        return Err(Error::State(format!(
            "the summaries come from different passes (first epochs {:?})",
            firsts.iter().collect::<Vec<_>>()
        )));
    }
    let even = match evens.iter().next() {
        Some(e) => Even::parse_state(e, "slot")?,
        // Only ranks that never iterated: nothing was read, every slot starts the pass (the
        // policy is not used).
        None if unstarted > 0 => Even::Off,
        None => return Err(Error::State("no summaries given".into())),
    };
    let first_epoch = firsts.into_iter().next().unwrap_or(0);
    // As `Resume::load` does for full states: summaries of ranks that never iterated stand for
    // the missing slots at the start of the pass, when their count matches exactly (otherwise
    // the merge reports the missing slots).
    if let Some(count) = out.first().map(|s| s.slot.count) {
        let present: Vec<u32> = out.iter().map(|s| s.slot.index).collect();
        for i in unstarted_slots(count, &present, unstarted) {
            let slot = Slot::new(i, count)?;
            out.push(Summary::from_counts(
                slot,
                first_epoch,
                0,
                0,
                Vec::new(),
                total,
                even,
            )?);
        }
    }
    Ok((out, even, first_epoch))
}

/// A spec of a summary: a state's spec, whose `injected` rows may be given by their number
/// (`injected_rows`, what `state_summaries` writes) instead of the ids.
#[derive(serde::Deserialize)]
struct SummarySpec {
    epoch: u64,
    ranges: Vec<[u64; 2]>,
    #[serde(default)]
    injected: Option<String>,
    #[serde(default)]
    injected_rows: Option<u64>,
}

/// How many 8-byte ids padded base64 `text` holds, without decoding it.
fn base64_ids_len(text: &str) -> Option<u64> {
    if text.len() % 4 != 0 {
        return None;
    }
    let pad = text.bytes().rev().take_while(|b| *b == b'=').count();
    let bytes = (text.len() / 4 * 3).checked_sub(pad)?;
    (bytes % 8 == 0).then_some(bytes as u64 / 8)
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

    /// Two phases through the envelope: summaries (states without `buffer`), then the full
    /// states of only the slots `needed_slots` names, resume every slot of the new layout
    /// with the same stream as loading every state; mismatched inputs are refused.
    #[test]
    fn two_phase_load_resumes_like_loading_every_state() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_shards(dir.path(), &[37, 29, 18], 6);
        let cat = Arc::new(Catalog::open(&files, None).unwrap());
        let st = Settings {
            even: Even::Off,
            ..settings(5, Some(3), false)
        };
        let mut saved = Vec::new();
        for r in 0..4u64 {
            let layout = Layout::new(r, 4, 0, 1, st.even).unwrap();
            let mut s = Stream::resume(
                cat.clone(),
                &st,
                &Tuning::default(),
                layout,
                0,
                &Resume::start(0),
            )
            .unwrap();
            for _ in 0..(r + 1) * 2 {
                s.next_item().unwrap();
            }
            saved.push(s.checkpoint(None).unwrap().to_value());
        }
        let summaries: Vec<Value> = saved
            .iter()
            .map(|v| {
                let mut v = v.clone();
                v["position"].as_object_mut().unwrap().remove("buffer");
                v
            })
            .collect();
        let all = Resume::load(&cat, &st, saved.clone(), false).unwrap();
        let mut fewer = 0;
        for new in 0..3u64 {
            let layout = Layout::new(new, 3, 0, 1, st.even).unwrap();
            let need = Resume::needed_slots(&cat, &st, summaries.clone(), &[layout]).unwrap();
            fewer += 4 - need.len();
            let some: Vec<Value> = need.iter().map(|i| saved[*i as usize].clone()).collect();
            let part = Resume::load_partial(&cat, &st, some, summaries.clone()).unwrap();
            let want = drain(&mut all.stream(&cat, &st, layout).unwrap());
            let got = drain(&mut part.stream(&cat, &st, layout).unwrap());
            assert!(!want.is_empty());
            assert_eq!(got, want);
            if let Some(i) = need.first() {
                let less: Vec<Value> = need[1..]
                    .iter()
                    .map(|i| saved[*i as usize].clone())
                    .collect();
                let p = Resume::load_partial(&cat, &st, less, summaries.clone()).unwrap();
                let err = p.stream(&cat, &st, layout).err().unwrap().to_string();
                assert!(
                    err.contains(&format!("needs the full state of old slot {i} of 4")),
                    "{err}"
                );
            }
        }
        assert!(
            fewer > 0,
            "some new slot should need fewer than every old state"
        );
        // A summary from another point of the run than its state is refused.
        let mut off = summaries.clone();
        off[0]["position"]["emitted"] = serde_json::json!(1);
        off[0]["position"]["cursor"] = serde_json::json!(6);
        let err = Resume::load_partial(&cat, &st, vec![saved[0].clone()], off)
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not match its state"), "{err}");
        let mut bad = summaries.clone();
        bad[1]["position"]["emitted"] = serde_json::json!(10_000);
        let err = Resume::load_partial(&cat, &st, vec![], bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid summary of slot 1 of 4"), "{err}");
        let err = Resume::load_partial(&cat, &st, vec![], summaries[..3].to_vec())
            .unwrap()
            .stream(&cat, &st, Layout::new(0, 3, 0, 1, st.even).unwrap())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("missing slots [3]"), "{err}");
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

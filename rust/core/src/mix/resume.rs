//! Where a mixture's streams start: the start of a pass, or the states of a checkpoint.
//!
//! [`MixResume::load`] checks each state strictly (the mixture node, and each source's stream
//! state), then the mixture's settings, then — per source — that source's states from every
//! slot through the stream's own [`Resume::load`]: settings, fingerprint (changed shards named
//! and, if allowed, carried over), every position against its slot. So a source in a mixture is
//! checked, and merged across layouts, exactly as a single stream is.
//!
//! The mixer: in the same layout with the same weights, policies and sources, each slot
//! continues its own mixer exactly. Otherwise the targets *rebase* where the slot stands: counts
//! and targets restart at 0, the schedule's position (the global item count) carries on. A
//! changed configuration rebases each slot at its own count (`base + since * slots`); another
//! layout rebases every new slot at the old slots' total (`sum(base_i + since_i * slots) /
//! slots`) and splits what is left of `samples` between the new slots (`even` applies), so
//! every new slot starts the same sequence. Sources are matched by name: a new one starts at
//! its beginning, a removed one's states are carried in `removed` (by old slot: slot `i`'s go to
//! new slot `i % new slots`; every new slot names it, with no state if it got none) so it
//! continues where it was if it comes back: from each slot's own state if it left on the same
//! layout, else from every slot's states (`check_comes_back`). `strict` refuses any
//! change instead, naming it.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::rule::{Mixer, MixerPos};
use super::stream::{in_source, mixer_record, MixStream};
use super::{share, MixConfig};
use crate::elastic::pending_owner;
use crate::error::{Error, Result};
use crate::plan::{Even, Slot};
use crate::resume::Resume;
use crate::settings::Layout;
use crate::state::envelope::{parse_node, Node, StreamState};
use crate::state::mixture::{MixerRecord, MixtureState, MIXTURE_FORMAT};
use crate::state::pack::DocRef;

/// One loaded slot of the old layout.
#[derive(Debug, Clone)]
struct Loaded {
    slot: Slot,
    mixer: MixerRecord,
    removed: BTreeMap<String, Vec<StreamState>>,
    /// Packing after mixing: the packer's pending documents (source name, reference).
    pack: Vec<(String, DocRef)>,
}

/// Where a mixture's next streams start.
#[derive(Debug, Clone)]
pub struct MixResume {
    /// Per configured source (name order), where its stream starts.
    sources: Vec<Resume>,
    /// Loaded slots of one layout, by slot index (empty: the start of the pass).
    loaded: Vec<Loaded>,
    even: Even,
    /// Weights, policies or sources differ from the saved ones: the mixers rebase.
    changed: bool,
    /// The epoch `set_epoch` gave the pass (`MixtureState::epoch`): loaded states' when they
    /// agree, else none.
    epoch: Option<u64>,
}

impl MixResume {
    /// The start of a pass.
    pub fn start(cfg: &MixConfig) -> MixResume {
        MixResume {
            sources: cfg.sources.iter().map(|_| Resume::start(0)).collect(),
            loaded: Vec::new(),
            even: Even::Off,
            changed: false,
            epoch: None,
        }
    }

    pub fn at_start(&self) -> bool {
        self.loaded.is_empty()
    }

    pub fn epoch(&self) -> Option<u64> {
        self.epoch
    }

    /// This position as the pass `set_epoch(epoch)` started (what its states will say).
    pub fn with_epoch(&self, epoch: Option<u64>) -> MixResume {
        MixResume {
            epoch,
            ..self.clone()
        }
    }

    /// True when a stream of `layout` started here would have no item: a state saved at the
    /// end of its pass ([`MixStream::pass_ended`]).
    pub fn pass_ended(&self, cfg: &std::sync::Arc<MixConfig>, layout: Layout) -> Result<bool> {
        Ok(MixStream::resume(cfg.clone(), layout, None, self)?.pass_ended())
    }

    pub(crate) fn source(&self, i: usize) -> &Resume {
        &self.sources[i]
    }

    /// Check the states found in a checkpoint against this mixture, once.
    pub fn load(
        cfg: &MixConfig,
        states: Vec<Value>,
        allow_changed: bool,
        strict: bool,
    ) -> Result<MixResume> {
        let mut parsed = Vec::with_capacity(states.len());
        for v in states {
            match parse_node(v, "state")? {
                Node::Mixture(m) => parsed.push(*m),
                Node::Stream(_) => {
                    return Err(Error::State(format!(
                        "state is a ParquetStream's, not a {MIXTURE_FORMAT} state: a Mixture \
                         loads what Mixture.state_dict() saved"
                    )))
                }
                Node::Sampler(_) => {
                    return Err(Error::State(format!(
                        "state is a ResumableSampler's, not a {MIXTURE_FORMAT} state: a \
                         Mixture loads what Mixture.state_dict() saved"
                    )))
                }
            }
        }
        let now = cfg.settings_record();
        for st in &parsed {
            let diffs = st.settings.differences(&now);
            if !diffs.is_empty() {
                return Err(Error::State(format!(
                    "state was saved with different mixture settings: {}",
                    diffs.join("; ")
                )));
            }
        }
        let Some(first) = parsed.first() else {
            return Ok(MixResume::start(cfg));
        };
        let epoch = first
            .epoch
            .filter(|_| parsed.iter().all(|s| s.epoch == first.epoch));
        if parsed.iter().any(|s| {
            s.weights != first.weights
                || s.policies != first.policies
                || s.sources.keys().ne(first.sources.keys())
        }) {
            return Err(Error::State(
                "the states come from differently configured mixtures (weights, policies or \
                 sources differ between them): pass one checkpoint's states"
                    .into(),
            ));
        }
        let changes = changes(cfg, first);
        if strict && !changes.is_empty() {
            return Err(Error::State(format!(
                "the mixture differs from the one that saved the state (strict): {}",
                changes.join("; ")
            )));
        }
        // A slot given twice, named as the mixture's (each source would otherwise report it
        // as its own).
        let mut slots = BTreeSet::new();
        for slot in parsed.iter().filter_map(|st| st.slot.as_ref()) {
            if !slots.insert((slot.index, slot.count)) {
                return Err(Error::State(format!(
                    "two Mixture states for slot {} of {}: pass each slot's state once",
                    slot.index, slot.count
                )));
            }
        }
        // Per source: its states from every slot, checked as a stream's.
        let names = cfg.names();
        let mut sources = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            let mut found: Vec<Value> = Vec::new();
            let mut have = 0;
            for st in &parsed {
                if let Some(s) = st.sources.get(name) {
                    found.push(s.to_value());
                    have += 1;
                } else if let Some(list) = st.removed.get(name) {
                    found.extend(list.iter().map(StreamState::to_value));
                }
            }
            if have != 0 && have != parsed.len() {
                return Err(Error::State(format!(
                    "source {name:?} is in {have} of the {} states given",
                    parsed.len()
                )));
            }
            if have == 0 {
                check_comes_back(name, &parsed)?;
            }
            let src = &cfg.sources[i];
            let r = if found.is_empty() {
                Resume::start(0)
            } else {
                Resume::load(&src.catalog, &src.settings, found, allow_changed)
                    .map_err(|e| in_source(name, e))?
            };
            sources.push(r);
        }
        // The mixers of one layout.
        let mut loaded: Vec<Loaded> = Vec::new();
        let mut evens = BTreeSet::new();
        let mut unstarted = 0usize;
        for st in &parsed {
            let (Some(slot), Some(mixer)) = (&st.slot, &st.mixer) else {
                unstarted += 1;
                continue;
            };
            let s = Slot::new(slot.index, slot.count)?;
            evens.insert(slot.even.clone());
            let mut removed = st.removed.clone();
            for (n, s) in &st.sources {
                if cfg.index_of(n).is_none() {
                    removed.entry(n.clone()).or_default().push(s.clone());
                }
            }
            removed.retain(|n, _| cfg.index_of(n).is_none());
            loaded.push(Loaded {
                slot: s,
                mixer: mixer.clone(),
                removed,
                pack: st.pack.clone().unwrap_or_default(),
            });
        }
        if evens.len() > 1 {
            return Err(Error::State(format!(
                "the states mix even policies {evens:?}: pass one checkpoint's states"
            )));
        }
        let even = match evens.iter().next() {
            Some(e) => Even::parse_state(e, "state['slot']['even']")?,
            None => Even::Off,
        };
        loaded.sort_by_key(|l| l.slot.index);
        if let Some(count) = loaded.first().map(|l| l.slot.count) {
            if let Some(l) = loaded.iter().find(|l| l.slot.count != count) {
                return Err(Error::State(format!(
                    "states come from different layouts ({count} and {} slots); pass the states \
                     of one checkpoint",
                    l.slot.count
                )));
            }
            if let Some(w) = loaded.windows(2).find(|w| w[0].slot == w[1].slot) {
                return Err(Error::State(format!(
                    "two states for slot {} of {count}",
                    w[0].slot.index
                )));
            }
            // Slots that had not started: a fresh mixer (as their sources resume at the start).
            let present: Vec<u32> = loaded.iter().map(|l| l.slot.index).collect();
            let missing = crate::resume::unstarted_slots(count, &present, unstarted);
            if !missing.is_empty() {
                for i in missing {
                    let slot = Slot::new(i, count)?;
                    let pos = start_pos(cfg, slot, even, cfg.sources.len());
                    loaded.push(Loaded {
                        slot,
                        mixer: mixer_record(&names, &pos),
                        removed: BTreeMap::new(),
                        pack: Vec::new(),
                    });
                }
                loaded.sort_by_key(|l| l.slot.index);
            }
        }
        if changes.is_empty() {
            // Each mixer continues as saved: check its numbers now (against its sources' rows
            // when its stream starts).
            for l in &loaded {
                Mixer::restore(cfg.rule.clone(), l.slot, &to_pos(&names, &l.mixer))?;
            }
        }
        Ok(MixResume {
            sources,
            loaded,
            even,
            changed: !changes.is_empty(),
            epoch,
        })
    }

    /// The mixer of `layout`'s slot, and the removed sources' states it carries.
    pub(crate) fn mixer(
        &self,
        cfg: &MixConfig,
        layout: Layout,
    ) -> Result<(Mixer, BTreeMap<String, Vec<StreamState>>)> {
        let k = cfg.sources.len();
        let names = cfg.names();
        let rule = cfg.rule.clone();
        if self.loaded.is_empty() {
            let pos = start_pos(cfg, layout.slot, layout.even, k);
            return Ok((Mixer::restore(rule, layout.slot, &pos)?, BTreeMap::new()));
        }
        let count = self.loaded[0].slot.count;
        let same = count == layout.slot.count && self.even == layout.even;
        if same {
            let Some(own) = self.loaded.iter().find(|l| l.slot == layout.slot) else {
                return Err(Error::State(format!(
                    "no state for slot {} of {count} among the states given (slot = rank * \
                     num_workers + worker_id; to resume with other ranks or workers, load the \
                     states of every slot)",
                    layout.slot.index
                )));
            };
            let pos = to_pos(&names, &own.mixer);
            let m = if self.changed {
                let (items, taken) = (pos.items, pos.taken.clone());
                let base = global(&own.mixer, count);
                Mixer::fresh(
                    rule,
                    layout.slot,
                    base,
                    pos.left,
                    vec![true; k],
                    items,
                    taken,
                )
            } else {
                Mixer::restore(rule, layout.slot, &pos)?
            };
            return Ok((m, own.removed.clone()));
        }
        if self.loaded.len() != count as usize {
            let missing: Vec<u32> = (0..count)
                .filter(|i| !self.loaded.iter().any(|l| l.slot.index == *i))
                .collect();
            return Err(Error::State(format!(
                "resuming {count} slots as {} needs the states of all {count}; missing slots \
                 {missing:?} (this iterator is slot {} of {}, slot = rank * num_workers + \
                 worker_id)",
                layout.slot.count, layout.slot.index, layout.slot.count
            )));
        }
        // Another layout: every new slot rebases at the old slots' total.
        let total: u128 = self
            .loaded
            .iter()
            .map(|l| global(&l.mixer, count) as u128)
            .sum();
        let base = u64::try_from(total / count as u128).unwrap_or(u64::MAX);
        let left = self
            .loaded
            .iter()
            .map(|l| l.mixer.left)
            .try_fold(0u64, |acc, l| l.map(|l| acc.saturating_add(l)))
            .map(|n| share(n, layout.slot, layout.even));
        let (mut items, mut taken) = (0, vec![0u64; k]);
        if layout.slot.index == 0 {
            for l in &self.loaded {
                let p = to_pos(&names, &l.mixer);
                items += p.items;
                for (t, x) in taken.iter_mut().zip(p.taken) {
                    *t += x;
                }
            }
        }
        let m = Mixer::fresh(rule, layout.slot, base, left, vec![true; k], items, taken);
        // Every new slot names every removed source, with the states of the old slots it
        // continues (possibly none): the source's position is now spread over the new slots'
        // states, and one that holds none must still know that (`check_comes_back`).
        let mut removed: BTreeMap<String, Vec<StreamState>> = self
            .loaded
            .iter()
            .flat_map(|l| l.removed.keys())
            .map(|n| (n.clone(), Vec::new()))
            .collect();
        for l in &self.loaded {
            if l.slot.index % layout.slot.count == layout.slot.index {
                for (n, list) in &l.removed {
                    removed
                        .entry(n.clone())
                        .or_default()
                        .extend(list.iter().cloned());
                }
            }
        }
        Ok((m, removed))
    }

    /// Packing after mixing: the pending documents `layout`'s packer starts with (source index,
    /// reference): its own slot's in the same layout; in another, each old slot's go to one new
    /// slot ([`pending_owner`]), in old-slot order, so each document is packed exactly once.
    pub(crate) fn pending(
        &self,
        cfg: &MixConfig,
        layout: Layout,
    ) -> Result<Option<Vec<(u16, DocRef)>>> {
        if cfg.pack.is_none() || self.loaded.is_empty() {
            return Ok(None);
        }
        let count = self.loaded[0].slot.count;
        let same = count == layout.slot.count && self.even == layout.even;
        let mut out = Vec::new();
        for l in &self.loaded {
            let mine = if same {
                l.slot == layout.slot
            } else {
                pending_owner(l.slot.index, layout.slot.count) == layout.slot.index
            };
            if !mine {
                continue;
            }
            for (n, r) in &l.pack {
                let s = cfg.index_of(n).ok_or_else(|| {
                    Error::State(format!(
                        "state['pack'] holds pending documents of source {n:?}, which this \
                         mixture does not have: packed after mixing, a source with pending \
                         documents cannot be removed (add it back)"
                    ))
                })?;
                out.push((s as u16, *r));
            }
        }
        Ok(Some(out))
    }

    /// The state a stream of `layout` would save now, before reading anything.
    pub fn state(&self, cfg: &std::sync::Arc<MixConfig>, layout: Layout) -> Result<MixtureState> {
        if self.loaded.is_empty() {
            let mut sources = BTreeMap::new();
            for (i, src) in cfg.sources.iter().enumerate() {
                let st = self.sources[i]
                    .state(&src.catalog, &src.settings, layout)
                    .map_err(|e| in_source(&src.name, e))?;
                sources.insert(src.name.clone(), st);
            }
            return Ok(MixtureState {
                settings: cfg.settings_record(),
                weights: cfg.schedule_record(),
                policies: cfg.policies_record(),
                slot: None,
                mixer: None,
                sources,
                removed: BTreeMap::new(),
                pack: None,
                epoch: self.epoch,
            });
        }
        MixStream::resume(cfg.clone(), layout, None, self)?.checkpoint(None)
    }

    /// Every loaded slot's position as a state of this mixture (to pickle this resume point).
    pub fn states(&self, cfg: &std::sync::Arc<MixConfig>) -> Result<Vec<MixtureState>> {
        if self.loaded.is_empty() {
            let any = Layout::new(0, 1, 0, 1, Even::Off)?;
            return Ok(vec![self.state(cfg, any)?]);
        }
        self.loaded
            .iter()
            .map(|l| {
                self.state(
                    cfg,
                    Layout {
                        slot: l.slot,
                        even: self.even,
                    },
                )
            })
            .collect()
    }
}

/// What differs between the mixture and the one that saved `st` (empty: nothing).
fn changes(cfg: &MixConfig, st: &MixtureState) -> Vec<String> {
    let mut out = Vec::new();
    let names = cfg.names();
    for n in &names {
        if !st.sources.contains_key(n) {
            let back = if st.removed.contains_key(n) {
                " (back: it continues where it was)"
            } else {
                " (it starts at its beginning)"
            };
            out.push(format!("source {n:?} added{back}"));
        }
    }
    for n in st.sources.keys() {
        if cfg.index_of(n).is_none() {
            out.push(format!(
                "source {n:?} removed (its position is kept in the state)"
            ));
        }
    }
    if st.weights != cfg.schedule_record() {
        out.push("weights changed (the targets rebase where the state stands)".into());
    }
    let now = cfg.policies_record();
    for (n, p) in &now {
        if let Some(old) = st.policies.get(n) {
            if old != p {
                let epochs = |m: Option<u64>| m.map_or("None".to_string(), |m| m.to_string());
                out.push(format!(
                    "source {n:?}: on_exhausted={:?}, max_epochs={} (was on_exhausted={:?}, \
                     max_epochs={})",
                    p.on_exhausted,
                    epochs(p.max_epochs),
                    old.on_exhausted,
                    epochs(old.max_epochs)
                ));
            }
        }
    }
    out
}

/// A source named in `removed` but in no state's `sources` comes back: its position is the
/// states in the `removed` lists of `parsed`. Each slot's own state is enough when the source
/// left on this layout (every removed list holds only its slot's state); after it left on
/// another layout (a resize: a slot's list holds other slots' states, or none), its position is
/// spread over every slot's states, and a slot given only its own would start the source over
/// (rows twice) or lack a share: then every slot's states must be given.
fn check_comes_back(name: &str, parsed: &[MixtureState]) -> Result<()> {
    let lists: Vec<(&MixtureState, &Vec<StreamState>)> = parsed
        .iter()
        .filter_map(|st| st.removed.get(name).map(|l| (st, l)))
        .collect();
    if lists.is_empty() {
        return Ok(()); // a new source: it starts at its beginning
    }
    let own_only = lists.iter().all(|(st, list)| {
        list.len() == 1
            && match (&st.slot, &list[0].slot) {
                (Some(a), Some(b)) => a.index == b.index && a.count == b.count,
                (_, None) => true,
                (None, Some(_)) => false,
            }
    });
    if own_only {
        return Ok(());
    }
    // The old slots whose positions these states hold (a state that never read has no slot).
    let removed: Vec<&StreamState> = lists.iter().flat_map(|(_, list)| list.iter()).collect();
    let mut count = None;
    let mut seen = BTreeSet::new();
    let mut unstarted = 0u32;
    for st in &removed {
        match &st.slot {
            Some(slot) => {
                seen.insert(slot.index);
                count = Some(u64::from(slot.count));
            }
            None => unstarted += 1,
        }
    }
    let Some(count) = count else {
        if removed.is_empty() {
            return Err(Error::State(format!(
                "source {name:?} comes back, but it was removed when the mixture was resumed on \
                 another layout and these states hold none of its position (the other slots' \
                 states do): to add it back, load the states of every slot (the list of every \
                 rank's state), even on the same layout"
            )));
        }
        return Ok(()); // only states that never read: it starts at its beginning
    };
    if (seen.len() as u64) + u64::from(unstarted) < count {
        return Err(Error::State(format!(
            "source {name:?} comes back, but it was removed when the mixture was resumed on \
             another layout, so its position is spread over the states of every slot: these \
             states hold {} of its {count} old slots' positions; to add it back, load the \
             states of every slot (the list of every rank's state), even on the same layout",
            seen.len() as u64 + u64::from(unstarted)
        )));
    }
    Ok(())
}

/// A slot's mixer at the start of a pass.
fn start_pos(cfg: &MixConfig, slot: Slot, even: Even, k: usize) -> MixerPos {
    MixerPos {
        items: 0,
        base: 0,
        since: 0,
        left: cfg.settings.samples.map(|n| share(n, slot, even)),
        deficits: vec![Some(0); k],
        block: None,
        taken: vec![0; k],
    }
}

/// The global item count a slot's mixer stands at.
fn global(m: &MixerRecord, count: u32) -> u64 {
    u64::try_from(m.base as u128 + m.since as u128 * count as u128).unwrap_or(u64::MAX)
}

/// A record as the rule's position, by source index (sources the record does not name are
/// out of the mix with nothing taken).
fn to_pos(names: &[String], r: &MixerRecord) -> MixerPos {
    MixerPos {
        items: r.items,
        base: r.base,
        since: r.since,
        left: r.left,
        deficits: names.iter().map(|n| r.deficits.get(n).copied()).collect(),
        block: r.block.as_ref().map(|b| {
            (
                names
                    .iter()
                    .map(|n| b.quotas.get(n).copied().unwrap_or(0))
                    .collect(),
                b.at,
            )
        }),
        taken: names
            .iter()
            .map(|n| r.taken.get(n).copied().unwrap_or(0))
            .collect(),
    }
}

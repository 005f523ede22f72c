//! One slot's mixed stream: a [`Stream`] per source, a [`Mixer`], and the items they make.
//!
//! An item (a batch of `batch_size` rows, or in row mode a chunk handed out row by row) is made
//! in two steps: the mixer decides its sources, counting each source's rows down without
//! reading (`Stream::rows_ahead`), then each source's stream yields exactly that many rows. So
//! a source's stream is only ever asked for rows it has, and its position after the item is
//! exactly after the rows used: the saved state is each source's stream state plus the mixer's,
//! nothing buffered in between. In row mode a chunk is cut before a source would cross into its
//! next epoch, so the state after the first `k` rows of a chunk is each source's
//! `state_within_batch` plus the mixer replayed from the chunk's start (`checkpoint(Some(k))`).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int32Array, RecordBatch};
use arrow_select::concat::concat_batches;
use arrow_select::interleave::interleave_record_batch;

use super::resume::MixResume;
use super::rule::{Avail, Mixer, MixerPos};
use super::{Combine, MixConfig};
use crate::error::{Error, Result};
use crate::settings::{Layout, Tuning, DEFAULTS};
use crate::state::envelope::{SlotRecord, StreamState};
use crate::state::mixture::{BlockRecord, MixerRecord, MixtureState};
use crate::stream::{Rows, Stream};

mod packed;
mod per_source;

/// What one `next_item` returns.
#[derive(Debug)]
pub enum MixItem {
    /// One batch in mixing order (shared columns and the tag column).
    Mixed(RecordBatch),
    /// The item's source per row (index in name order) and each source's rows, in order.
    Parts {
        tags: Vec<u16>,
        parts: Vec<Option<RecordBatch>>,
    },
}

impl MixItem {
    pub fn num_rows(&self) -> usize {
        match self {
            MixItem::Mixed(b) => b.num_rows(),
            MixItem::Parts { tags, .. } => tags.len(),
        }
    }
}

/// Prefix a source's error with its name (the message is the stream's own).
pub(crate) fn in_source(name: &str, e: Error) -> Error {
    match e {
        Error::State(m) => Error::State(format!("source {name:?}: {m}")),
        Error::ShardsChanged {
            message,
            added,
            changed,
            removed,
        } => Error::ShardsChanged {
            message: format!("source {name:?}: {message}"),
            added,
            changed,
            removed,
        },
        Error::Config(m) => Error::Config(format!("source {name:?}: {m}")),
        other => other,
    }
}

/// The mixed stream of one slot.
pub struct MixStream {
    cfg: Arc<MixConfig>,
    layout: Layout,
    streams: Vec<Stream>,
    mixer: Mixer,
    /// Removed sources' states carried along (see mix/resume.rs).
    removed: BTreeMap<String, Vec<StreamState>>,
    row_mode: bool,
    /// Row mode: the mixer and availability before the last chunk, its choices, and which
    /// sources it read from.
    chunk_start: Option<(Mixer, Avail)>,
    choices: Vec<u16>,
    pulled: Vec<bool>,
    ended: bool,
    /// Packing after mixing (`packed.rs`): the packer of the mixed documents.
    packer: Option<crate::pack::Packer>,
    /// The epoch `set_epoch` gave this pass (written in its states).
    epoch: Option<u64>,
}

impl MixStream {
    /// The stream of `layout` starting where `resume` says (checked when it was loaded; the
    /// mixer's position against its sources' is checked here). `workers`: the DataLoader
    /// workers of this process, whose iterators and sources share the cores for readahead
    /// ([`Tuning::source_threads`]); `None` decodes every source in the caller.
    pub fn resume(
        cfg: Arc<MixConfig>,
        layout: Layout,
        workers: Option<u32>,
        resume: &MixResume,
    ) -> Result<MixStream> {
        // Packed items are whole packed rows: no position inside one.
        let row_mode =
            cfg.settings.batch_size.is_none() && cfg.pack.is_none() && cfg.source_pack.is_none();
        let k = cfg.sources.len();
        let mut streams = Vec::with_capacity(k);
        for (i, src) in cfg.sources.iter().enumerate() {
            // The sources share what one stream would use: threads, ready batches, the cache.
            let tuning = Tuning {
                read_batch_rows: Some(src.tuning.source_batch_rows(&src.catalog, k)),
                readahead_depth: src.tuning.source_depth(&src.catalog, k),
                ..src.tuning.clone()
            };
            let threads = workers.map_or(0, |w| src.tuning.source_threads(&src.catalog, k, w));
            let mut s = Stream::resume(
                src.catalog.clone(),
                &src.settings,
                &tuning,
                layout,
                threads,
                resume.source(i),
            )
            .map_err(|e| in_source(&src.name, e))?;
            // Row mode needs each chunk's start to compute a position inside it.
            s.keep_batch_start(row_mode);
            s.track_ids(cfg.pack.is_some() || cfg.source_pack.is_some());
            streams.push(s);
        }
        let (mixer, removed) = resume.mixer(&cfg, layout)?;
        let packer = packed::packer(&cfg, resume, layout)?;
        let out = MixStream {
            cfg,
            layout,
            streams,
            mixer,
            removed,
            row_mode,
            chunk_start: None,
            choices: Vec::new(),
            pulled: vec![false; k],
            ended: false,
            packer,
            epoch: resume.epoch(),
        };
        // Each source's own state against the mixer's: a source that left the mix has no rows
        // left, and a stratified block (served in its order before exhaustion is looked at, so
        // it would read past a source's `max_epochs`) takes no more rows than a source has.
        let avail = out.avail();
        let rest = out.mixer.block_rest();
        for (s, (left, active)) in avail.left.iter().zip(out.mixer.active()).enumerate() {
            let name = &out.cfg.sources[s].name;
            if !active && *left != 0 {
                return Err(Error::State(format!(
                    "invalid mixer state: source {name:?} has left the mix, but its own state \
                     has rows left"
                )));
            }
            if rest[s] > *left {
                return Err(Error::State(format!(
                    "invalid mixer state: its stratified block still takes {} items of source \
                     {name:?}, but that source's own state has {left} rows left",
                    rest[s]
                )));
            }
        }
        Ok(out)
    }

    pub fn config(&self) -> &Arc<MixConfig> {
        &self.cfg
    }

    fn avail(&self) -> Avail {
        if self.cfg.source_pack.is_some() {
            return per_source::avail(&self.mixer, &[]);
        }
        Avail {
            left: self
                .streams
                .iter()
                .enumerate()
                .map(|(i, s)| s.rows_ahead(self.cfg.until(i)))
                .collect(),
        }
    }

    /// The next item, or `None` once the mixture has ended (a `stop` source ran out, the
    /// `samples` were all yielded, or no source with weight has rows left).
    pub fn next_item(&mut self) -> Result<Option<MixItem>> {
        if self.packer.is_some() {
            return self.next_packed();
        }
        if self.cfg.source_pack.is_some() {
            return self.next_source_packed();
        }
        if self.ended {
            return Ok(None);
        }
        let n = self
            .cfg
            .settings
            .batch_size
            .unwrap_or(DEFAULTS.row_chunk as u64);
        let mut avail = self.avail();
        let (start, runs) = if self.row_mode {
            let runs = self
                .streams
                .iter()
                .map(Stream::rows_before_epoch_end)
                .collect();
            (Some((self.mixer.clone(), avail.clone())), runs)
        } else {
            (None, Vec::new())
        };
        let k = self.streams.len();
        let mut counts = vec![0u64; k];
        let mut choices = Vec::with_capacity(n.min(1 << 16) as usize);
        if !self.row_mode {
            // The batch at once while no source can run out within it (the same choices).
            self.mixer
                .take_run(&mut avail, n, &mut counts, &mut choices);
        }
        while (choices.len() as u64) < n {
            let Some(s) = self.mixer.peek(&avail) else {
                break;
            };
            if self.row_mode && counts[s] == runs[s] {
                break; // its next row is in its next epoch: the next chunk starts there
            }
            self.mixer.take(&mut avail);
            counts[s] += 1;
            choices.push(s as u16);
        }
        if choices.is_empty() {
            // The last chunk stays the one a position `within` it refers to.
            self.ended = true;
            return Ok(None);
        }
        self.choices = choices;
        self.chunk_start = start;
        // A mixed batch copies every row once, from where each source has it: a shuffled
        // source's rows are located in its buffer's batches, not gathered into a batch first.
        let mixed = !self.row_mode && self.cfg.combine == Combine::Mixed;
        let mut pieces: Vec<Vec<Rows>> = Vec::with_capacity(k);
        for (s, c) in counts.iter().enumerate() {
            self.pulled[s] = *c > 0;
            pieces.push(if *c > 0 {
                self.pull(s, *c, mixed)?
            } else {
                Vec::new()
            });
        }
        if let Some(bs) = self.cfg.settings.batch_size {
            if self.cfg.settings.drop_last && (self.choices.len() as u64) < bs {
                self.ended = true; // the last, short batch
                return Ok(None);
            }
        }
        if mixed {
            return Ok(Some(MixItem::Mixed(self.mixed(pieces)?)));
        }
        let mut parts = Vec::with_capacity(k);
        for (s, p) in pieces.into_iter().enumerate() {
            let schema = self.cfg.sources[s].catalog.schema();
            let p: Vec<RecordBatch> = p
                .into_iter()
                .map(|r| r.into_batch(schema))
                .collect::<Result<_>>()?;
            parts.push(match p.len() {
                0 => None,
                1 => p.into_iter().next(),
                _ => Some(
                    concat_batches(self.cfg.sources[s].catalog.schema(), &p)
                        .map_err(|e| Error::Internal(format!("concat: {e}")))?,
                ),
            });
        }
        Ok(Some(MixItem::Parts {
            tags: self.choices.clone(),
            parts,
        }))
    }

    /// Exactly `n` rows of source `s` (the mixer counted them as there), in the batches its
    /// stream gave them (`locate`: a shuffled source's as located rows, a plain source's as slices of
    /// its decoded batches, never concatenated: `Stream::next_rows`).
    fn pull(&mut self, s: usize, n: u64, locate: bool) -> Result<Vec<Rows>> {
        let stream = &mut self.streams[s];
        let mut got = 0u64;
        let mut batches = Vec::with_capacity(1);
        while got < n {
            let want = usize::try_from(n - got).unwrap_or(usize::MAX);
            match stream
                .next_rows(want, locate)
                .map_err(|e| in_source(&self.cfg.sources[s].name, e))?
            {
                Some(b) => {
                    got += b.num_rows() as u64;
                    batches.push(b);
                }
                None => {
                    return Err(Error::Internal(format!(
                        "source {:?} ended after {got} of the {n} rows the mixer counted",
                        self.cfg.sources[s].name
                    )))
                }
            }
        }
        Ok(batches)
    }

    /// One batch in mixing order: each source's rows projected to the shared columns and
    /// interleaved in one pass straight from where each source has them (the batches a plain
    /// source gave, the batches a shuffled source's buffer holds: no copy before this one),
    /// then the tag column. (A gather by runs of rows was tried: most runs are one row, and it
    /// cost more per row than arrow's `interleave`, which copies each row's values with
    /// `memcpy`.)
    fn mixed(&self, pieces: Vec<Vec<Rows>>) -> Result<RecordBatch> {
        let internal = |e: arrow_schema::ArrowError| Error::Internal(format!("mixed batch: {e}"));
        // Every source's rows in its order, as (input, row): source `s`'s are `locs[next[s]..]`.
        let n = self.choices.len();
        let mut inputs = Vec::new();
        let mut locs: Vec<(usize, usize)> = Vec::with_capacity(n);
        let mut next = vec![0usize; pieces.len()];
        let mut in_order = true; // every input's rows are all used, in order
        for (s, p) in pieces.into_iter().enumerate() {
            next[s] = locs.len();
            for rows in p {
                let base = inputs.len();
                match rows {
                    Rows::Batch(b) => {
                        locs.extend((0..b.num_rows()).map(|r| (base, r)));
                        inputs.push(b.project(&self.cfg.common[s]).map_err(internal)?);
                    }
                    Rows::Located(l) => {
                        in_order = false;
                        locs.extend(l.rows.iter().map(|&(b, r)| (base + b, r)));
                        for b in l.batches {
                            inputs.push(b.project(&self.cfg.common[s]).map_err(internal)?);
                        }
                    }
                }
            }
        }
        let mut columns: Vec<ArrayRef> = if inputs.len() == 1 && in_order {
            inputs[0].columns().to_vec()
        } else {
            let mut indices = Vec::with_capacity(n);
            for &s in &self.choices {
                let at = &mut next[s as usize];
                indices.push(locs[*at]);
                *at += 1;
            }
            let refs: Vec<&RecordBatch> = inputs.iter().collect();
            interleave_record_batch(&refs, &indices)
                .map_err(internal)?
                .columns()
                .to_vec()
        };
        if self.cfg.tag_column.is_some() {
            let tags: Vec<i32> = self.choices.iter().map(|&s| i32::from(s)).collect();
            columns.push(Arc::new(Int32Array::from(tags)));
        }
        RecordBatch::try_new(self.cfg.schema.clone(), columns).map_err(internal)
    }

    /// The saved state: after the last item, or (row mode) after its first `within` rows.
    pub fn checkpoint(&mut self, within: Option<usize>) -> Result<MixtureState> {
        let (mut st, ids) = self.checkpoint_ids(within)?;
        for (source, ids) in st.sources.values_mut().zip(&ids) {
            if let Some(p) = source.position.as_mut() {
                p.buffer = crate::state::ids_to_latin1(ids);
            }
        }
        Ok(st)
    }

    /// [`Self::checkpoint`] with each source's buffer ids beside the state (in name order, the
    /// order of `sources`), its `position.buffer` text left empty, as a stream's
    /// `checkpoint_ids`.
    pub fn checkpoint_ids(
        &mut self,
        within: Option<usize>,
    ) -> Result<(MixtureState, Vec<Vec<u64>>)> {
        let (pos, sources) = match self.replay_within(within)? {
            Some((m, counts)) => {
                let mut sources = Vec::with_capacity(self.streams.len());
                for (s, st) in self.streams.iter_mut().enumerate() {
                    let within = self.pulled[s].then_some(counts[s]);
                    sources.push(st.checkpoint_ids(within)?);
                }
                (m.position(), sources)
            }
            _ => {
                let mut sources = Vec::with_capacity(self.streams.len());
                for st in &mut self.streams {
                    sources.push(st.checkpoint_ids(None)?);
                }
                (self.mixer.position(), sources)
            }
        };
        let (sources, ids): (Vec<StreamState>, Vec<Vec<u64>>) = sources.into_iter().unzip();
        Ok((self.state_of(&pos, sources), ids))
    }

    /// Row mode, `within` rows into the last chunk (fewer than it holds): the mixer as it stood
    /// after them (replayed from the chunk's start) and the rows each source gave them; `None`
    /// when the position is after the whole last item.
    fn replay_within(&self, within: Option<usize>) -> Result<Option<(Mixer, Vec<usize>)>> {
        let k = match within {
            Some(k) if self.row_mode && k < self.choices.len() => k,
            _ => return Ok(None),
        };
        let (mut m, mut a) = self
            .chunk_start
            .clone()
            .ok_or_else(|| Error::Internal("no chunk to be within".into()))?;
        let mut counts = vec![0usize; self.streams.len()];
        for &want in &self.choices[..k] {
            let got = m.take(&mut a);
            if got != Some(want as usize) {
                return Err(Error::Internal(format!(
                    "mixer replay chose {got:?}, the chunk had {want}"
                )));
            }
            counts[want as usize] += 1;
        }
        Ok(Some((m, counts)))
    }

    fn state_of(&self, pos: &MixerPos, sources: Vec<StreamState>) -> MixtureState {
        let names = self.cfg.names();
        MixtureState {
            settings: self.cfg.settings_record(),
            weights: self.cfg.schedule_record(),
            policies: self.cfg.policies_record(),
            slot: Some(SlotRecord {
                index: self.layout.slot.index,
                count: self.layout.slot.count,
                even: self.layout.even.name().into(),
            }),
            mixer: Some(mixer_record(&names, pos)),
            sources: names.iter().cloned().zip(sources).collect(),
            removed: self.removed.clone(),
            pack: self.packer.as_ref().map(|p| packed::named_refs(&names, p)),
            epoch: self.epoch,
        }
    }

    /// Where the next stream of this mixture starts: here (`within` rows into the last chunk),
    /// or once it has ended, the start of the pass again.
    pub fn resume_point(&mut self, within: Option<usize>) -> Result<MixResume> {
        if self.ended {
            return Ok(MixResume::start(&self.cfg).with_epoch(self.epoch));
        }
        let st = self.checkpoint(within)?;
        MixResume::load(&self.cfg, vec![st.to_value()], false, true)
    }

    /// True when this mixture has no item left from here, decided on the mixer's and the
    /// sources' coordinates (nothing read): the mixing rule has no next item (the `samples`
    /// were all yielded, a `stop` source ran out, no source with weight has rows left), or only
    /// a short last batch that `drop_last` drops. Where the end depends on documents not yet
    /// read it counts as not ended: a packer that still holds documents, or sources that pack
    /// on their own (each found run out only when asked for a row).
    pub fn pass_ended(&self) -> bool {
        if self.ended {
            return true;
        }
        if self
            .packer
            .as_ref()
            .is_some_and(|p| !p.refs_with_sources().is_empty())
        {
            return false;
        }
        let mut mixer = self.mixer.clone();
        if self.cfg.source_pack.is_some() {
            return mixer.peek(&per_source::avail(&mixer, &[])).is_none();
        }
        let mut avail = self.avail();
        // A packer makes rows while documents are left, so one item decides.
        let bs = self
            .cfg
            .settings
            .batch_size
            .filter(|_| self.packer.is_none());
        let n = bs.unwrap_or(1);
        let mut got = 0u64;
        while got < n && mixer.peek(&avail).is_some() {
            mixer.take(&mut avail);
            got += 1;
        }
        got == 0 || (self.cfg.settings.drop_last && got < n)
    }

    /// The sources (indexes, name order) that have weight at some point of the schedule and
    /// are in the mix but have no rows left in this slot, in any epoch they may still run (at
    /// the start: an empty source, or fewer rows than slots): the mixer drops each when it
    /// first looks at it, so this slot's other sources share its weight.
    pub fn barren_sources(&mut self) -> Vec<usize> {
        let points = &self.cfg.schedule.points;
        let active = self.mixer.active();
        (0..self.streams.len())
            .filter(|&i| {
                active[i]
                    && points.iter().any(|(_, w)| w[i] > 0)
                    && self.streams[i].rows_ahead(self.cfg.until(i)) == 0
            })
            .collect()
    }

    /// Per source, in name order: `(items taken, epoch, rows yielded in that epoch, weight of
    /// the next item as a fraction, still in the mix)`, after the last item or (row mode) after
    /// its first `within` rows, as [`Self::checkpoint`].
    pub fn source_stats(&mut self, within: Option<usize>) -> Result<Vec<SourceStats>> {
        let unit = super::schedule::UNIT as f64;
        let mut replayed = self.replay_within(within)?;
        let (m, counts) = match &mut replayed {
            Some((m, counts)) => (m, Some(counts)),
            None => (&mut self.mixer, None),
        };
        let w = m.weights();
        let mut out = Vec::with_capacity(self.streams.len());
        for (i, s) in self.streams.iter().enumerate() {
            let (epoch, emitted) = match &counts {
                Some(c) if self.pulled[i] => {
                    let st = s.state_within_batch(c[i])?;
                    (st.epoch, st.emitted)
                }
                _ => s.position_before(self.cfg.until(i)),
            };
            out.push((
                m.taken()[i],
                epoch,
                emitted,
                w[i] as f64 / unit,
                m.active()[i] && !m.ended(),
            ));
        }
        Ok(out)
    }
}

/// A source's `(items taken, epoch, rows yielded in that epoch, weight of the next item as a
/// fraction, still in the mix)`: [`MixStream::source_stats`].
pub type SourceStats = (u64, u64, u64, f64, bool);

pub(crate) fn mixer_record(names: &[String], p: &MixerPos) -> MixerRecord {
    MixerRecord {
        items: p.items,
        base: p.base,
        since: p.since,
        left: p.left,
        deficits: names
            .iter()
            .zip(&p.deficits)
            .filter_map(|(n, d)| d.map(|d| (n.clone(), d)))
            .collect(),
        block: p.block.as_ref().map(|(q, at)| BlockRecord {
            quotas: names
                .iter()
                .zip(q)
                .filter(|(_, q)| **q > 0)
                .map(|(n, q)| (n.clone(), *q))
                .collect(),
            at: *at,
        }),
        taken: names.iter().cloned().zip(p.taken.iter().copied()).collect(),
    }
}

//! One slot's stream of output batches across epochs: plan + reader + shuffle buffer + state.
//!
//! Output rows come from two places: straight from the input (no shuffle; output batches are
//! zero-copy slices of decoded batches, concatenated only where a batch spans a read boundary)
//! or from the shuffle buffer, whose entries point into retained decoded batches; an output batch
//! is gathered from them in one pass (`interleave_record_batch`), or handed over as row locations
//! in those batches (`next_rows` with `locate`: a mixture gathers every source's rows into its
//! mixed batch in one pass). A decoded batch is dropped when its last buffered row leaves; when
//! the retained batches hold more than 1.08x the rows the buffer needs, the buffered rows of the
//! sparsest batches are copied into new batches, grouped by when they will leave (predicted from
//! the PRNG: `shuffle::Departures`), and those are dropped (`compact`), so they hold at most
//! `1.08 * shuffle_buffer + read_batch_rows` rows beside the input batch.
//!
//! The state is always the position after the last *emitted* row; after a restore the buffer's
//! rows are re-read by id: the next batch reads the rows it picks, the rest are read in the
//! background while it is used (`slab.rs`).

mod input;
mod items;
mod packed;
pub use items::{skip_state, CheckpointParts};
mod slab;

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_select::concat::concat_batches;

use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::plan::{EpochPlan, Segments, Slot, SlotSpec, Unit};
use crate::resume::SkipLog;
use crate::rng::{derive_key, Prng};
use crate::settings::Settings;
pub use crate::settings::StreamOptions;
use crate::shuffle::{Buffer, Departures};
use crate::state::{check_state, Seek, SlotState};
use input::{CoordRows, DataRows, Input};
pub use slab::Located;
use slab::{read_entries, DataSide, Loc, Refill, Slab};

/// What [`Stream::next_rows`] returns: a batch, or (a shuffled stream asked to `locate`) where
/// its rows are, to be copied by the caller together with other rows.
#[derive(Debug, Clone)]
pub enum Rows {
    Batch(RecordBatch),
    Located(Located),
}

impl Rows {
    pub fn num_rows(&self) -> usize {
        match self {
            Rows::Batch(b) => b.num_rows(),
            Rows::Located(l) => l.num_rows(),
        }
    }

    /// The rows as one batch (`schema`: the stream's, for an empty one).
    pub fn into_batch(self, schema: &arrow_schema::SchemaRef) -> Result<RecordBatch> {
        match self {
            Rows::Batch(b) => Ok(b),
            Rows::Located(l) => l.materialize(schema),
        }
    }
}

/// The stream of one slot.
pub struct Stream {
    catalog: Arc<Catalog>,
    units: Arc<Vec<Unit>>,
    opts: StreamOptions,
    slot: Slot,
    epoch: u64,
    cursor: u64,
    emitted: u64,
    rng: Prng,
    buffer: Buffer<Loc>,
    plan: Arc<EpochPlan>,
    /// What this slot reads in the current epoch.
    spec: SlotSpec,
    /// Non-standard specs of the current and later epochs (after an elastic resume).
    specs: Vec<(u64, SlotSpec)>,
    data: Option<DataSide>,
    /// State before the last returned batch, when `keep_batch_start` is on (row mode).
    batch_start: Option<SlotState>,
    keep_batch_start: bool,
    /// The settings the state records (items, drop_last, the user's `even`).
    settings: Settings,
    /// Every skip applied (history) and skips to apply again on reaching them (items.rs).
    skips: SkipLog,
    replay: SkipLog,
    /// `next_item` returned the end of the pass.
    ended: bool,
    /// Packing (`pack/`): the packer, fed by `next_batch`.
    pub(crate) pack: Option<crate::pack::Packer>,
    /// Global row ids of the last `next_batch`, kept while packing (`track_ids`).
    ids: Vec<u64>,
    track_ids: bool,
}

impl Stream {
    pub fn new(catalog: Arc<Catalog>, opts: StreamOptions, slot: Slot) -> Result<Self> {
        if opts.epochs == Some(0) {
            return Err(Error::Config(
                "epochs must be at least 1 (or None for endless)".into(),
            ));
        }
        let units = catalog.units();
        let plan = Arc::new(EpochPlan::new(
            units.clone(),
            opts.seed,
            opts.first_epoch,
            opts.shuffle_buffer > 0,
        ));
        let spec = slot.standard_spec(plan.total(), opts.even);
        let rng = Prng::new(buffer_key(&opts, opts.first_epoch, slot));
        let settings = Settings {
            seed: opts.seed,
            shuffle_buffer: opts.shuffle_buffer,
            batch_size: None,
            drop_last: false,
            epochs: opts.epochs,
            even: opts.even,
            pack: None,
        };
        Ok(Stream {
            epoch: opts.first_epoch,
            cursor: 0,
            emitted: 0,
            buffer: Buffer::new(opts.shuffle_buffer),
            catalog,
            units,
            opts,
            slot,
            rng,
            plan,
            spec,
            specs: Vec::new(),
            data: None,
            batch_start: None,
            keep_batch_start: false,
            settings,
            skips: SkipLog::default(),
            replay: SkipLog::default(),
            ended: false,
            pack: None,
            ids: Vec::new(),
            track_ids: false,
        })
    }

    /// Remember the state before each batch, so [`Stream::state_within_batch`] works (row mode).
    pub fn keep_batch_start(&mut self, on: bool) {
        self.keep_batch_start = on;
    }

    /// Keep the global row ids of each `next_batch` (`last_ids`), as a packer needs.
    pub fn track_ids(&mut self, on: bool) {
        self.track_ids = on;
    }

    /// The global row ids of the last `next_batch` (with `track_ids`).
    pub fn last_ids(&self) -> &[u64] {
        &self.ids
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    pub fn slot(&self) -> Slot {
        self.slot
    }

    pub fn options(&self) -> &StreamOptions {
        &self.opts
    }

    fn end_epoch(&self) -> Option<u64> {
        self.opts.epochs.map(|n| self.opts.first_epoch + n)
    }

    fn plan_for(&self, epoch: u64) -> Arc<EpochPlan> {
        if self.plan.epoch == epoch {
            return self.plan.clone();
        }
        Arc::new(EpochPlan::new(
            self.units.clone(),
            self.opts.seed,
            epoch,
            self.opts.shuffle_buffer > 0,
        ))
    }

    fn standard_spec(&self) -> SlotSpec {
        // Every epoch has the same total, so the standard spec does not depend on the epoch.
        self.slot.standard_spec(self.plan.total(), self.opts.even)
    }

    /// The spec of `epoch` given the non-standard `specs`.
    fn spec_of(&self, specs: &[(u64, SlotSpec)], epoch: u64) -> SlotSpec {
        specs
            .iter()
            .find(|(e, _)| *e == epoch)
            .map_or_else(|| self.standard_spec(), |(_, s)| s.clone())
    }

    /// True if no epoch after the current one has rows for this slot.
    fn nothing_after(&self) -> bool {
        self.standard_spec().output_len() == 0 && self.specs.iter().all(|(e, _)| *e <= self.epoch)
    }

    /// True when this pass has no item left from here, decided on coordinates (nothing read):
    /// past its last epoch, or at the end of an epoch after which the pass has no rows (the
    /// rule `skip` and `next_batch` follow), a short last batch that `drop_last` drops counting
    /// as nothing. A packing stream whose packer still holds documents has rows left.
    pub fn pass_ended(&self) -> bool {
        if self.pack.as_ref().is_some_and(|p| !p.refs().is_empty()) {
            return false;
        }
        let end = self.end_epoch();
        if end.is_some_and(|e| self.epoch >= e) {
            return true;
        }
        let left = self.spec.output_len() - self.emitted;
        let dropped = self.pack.is_none()
            && self.settings.drops_short()
            && left < self.settings.item_rows().max(1);
        (left == 0 || dropped) && (end == Some(self.epoch + 1) || self.nothing_after())
    }

    /// `(epoch, rows emitted in it)` of the next output row: at the end of an epoch that is the
    /// start of the next one (unless the pass ends there).
    pub fn position(&self) -> (u64, u64) {
        self.position_before(None)
    }

    /// [`Self::position`], with epoch `until` (if any) ending the stream as its own end does (a
    /// mixture's source capped at `max_epochs` reports its last epoch's end, not an epoch it
    /// will not run).
    pub fn position_before(&self, until: Option<u64>) -> (u64, u64) {
        let end = match (self.end_epoch(), until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let at_end = self.emitted >= self.spec.output_len();
        if at_end && end.is_none_or(|e| self.epoch + 1 < e) && !self.nothing_after() {
            return (self.epoch + 1, 0);
        }
        (self.epoch, self.emitted)
    }

    /// Rows this stream can still emit before epoch `until` (and its own end), nothing read;
    /// `u64::MAX` when that is unbounded (an endless pass with rows in every epoch).
    pub fn rows_ahead(&self, until: Option<u64>) -> u64 {
        let end = match (until, self.end_epoch()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if end.is_some_and(|e| self.epoch >= e) {
            return 0;
        }
        let mut n = self.spec.output_len() - self.emitted;
        let after = self.epoch + 1;
        // Epochs with their own spec (after an elastic resume), then standard ones.
        let special: Vec<&(u64, SlotSpec)> = self
            .specs
            .iter()
            .filter(|(e, _)| *e >= after && end.is_none_or(|x| *e < x))
            .collect();
        n = special
            .iter()
            .fold(n, |n, (_, s)| n.saturating_add(s.output_len()));
        let per = self.standard_spec().output_len();
        match end {
            None if per > 0 => u64::MAX,
            None => n,
            Some(e) => {
                let standard = e.saturating_sub(after) - special.len() as u64;
                n.saturating_add(per.saturating_mul(standard))
            }
        }
    }

    /// Rows the next `next_batch` calls return before an epoch ends: the rest of this epoch,
    /// or at its end all of the next epoch that has rows (nothing read).
    pub fn rows_before_epoch_end(&self) -> u64 {
        let left = self.spec.output_len() - self.emitted;
        if left > 0 {
            return left;
        }
        // As next_batch moves on: epoch by epoch, until one has rows or none can.
        let end = self.end_epoch();
        let mut e = self.epoch + 1;
        loop {
            if end.is_some_and(|x| e >= x) {
                return 0;
            }
            let n = self.spec_of(&self.specs, e).output_len();
            if n > 0 {
                return n;
            }
            if self.standard_spec().output_len() == 0 && self.specs.iter().all(|(x, _)| *x <= e) {
                return 0;
            }
            e += 1;
        }
    }

    /// The position after the last emitted row.
    pub fn state(&self) -> SlotState {
        SlotState {
            buffer: self.buffer.rows.clone(),
            ..self.state_without_buffer()
        }
    }

    /// A state for serialization: the state (`within` rows into the last batch, or after it)
    /// with its buffer's row ids moved out beside it (the caller encodes them: base64 text for
    /// the JSON form, `bytes` in Python without any encoding).
    pub fn snapshot(&mut self, within: Option<usize>) -> Result<(SlotState, Vec<u64>)> {
        match within {
            Some(k) => {
                let mut st = self.state_within_batch(k)?;
                let rows = std::mem::take(&mut st.buffer);
                Ok((st, rows))
            }
            None => Ok((self.state_without_buffer(), self.buffer.rows.clone())),
        }
    }

    fn state_without_buffer(&self) -> SlotState {
        SlotState {
            epoch: self.epoch,
            cursor: self.cursor,
            emitted: self.emitted,
            rng_word_pos: self.rng.word_pos(),
            buffer: Vec::new(),
            specs: self.specs.clone(),
            pack: self.pack.as_ref().map(|p| p.refs()),
        }
    }

    /// The seek a resume from `st` starts with; `None` when its slot has no input left this epoch.
    pub fn seek_of(&self, st: &SlotState) -> Option<Seek> {
        seek_of(
            &self.catalog,
            &self.plan_for(st.epoch),
            &self.spec_of(&st.specs, st.epoch),
            st,
        )
    }

    /// The position after the first `k` rows of the last returned batch.
    pub fn state_within_batch(&self, k: usize) -> Result<SlotState> {
        let start = self.batch_start.as_ref().ok_or_else(|| {
            Error::Internal("state_within_batch needs keep_batch_start and a returned batch".into())
        })?;
        self.advance_state(start, k as u64)
    }

    fn set_epoch(&mut self, epoch: u64) {
        self.plan = self.plan_for(epoch);
        self.specs.retain(|(e, _)| *e >= epoch);
        self.spec = self.spec_of(&self.specs, epoch);
        self.rng = Prng::new(buffer_key(&self.opts, epoch, self.slot));
        self.epoch = epoch;
        self.cursor = 0;
        self.emitted = 0;
        self.buffer = Buffer::new(self.opts.shuffle_buffer);
        self.buffer.rows = self.spec.injected.clone();
        self.buffer.data = vec![Loc::MISSING; self.buffer.rows.len()];
        self.data = None;
    }

    /// Check `st` against this stream's settings and slot; returns its epoch's plan.
    pub fn check(&self, st: &SlotState) -> Result<Arc<EpochPlan>> {
        let plan = self.plan_for(st.epoch);
        check_state(&self.opts, self.slot, &plan, st)?;
        Ok(plan)
    }

    /// Continue from `st` (validated first; on error the stream is unchanged).
    pub fn restore(&mut self, st: &SlotState) -> Result<()> {
        let plan = self.check(st)?;
        self.apply(plan, st);
        Ok(())
    }

    /// Take over a state already validated against `plan` (its epoch's plan).
    fn apply(&mut self, plan: Arc<EpochPlan>, st: &SlotState) {
        self.plan = plan;
        self.specs = st.specs.clone();
        self.set_epoch(st.epoch);
        self.cursor = st.cursor;
        self.emitted = st.emitted;
        self.rng.set_word_pos(st.rng_word_pos);
        self.buffer.rows = st.buffer.clone();
        self.buffer.data = vec![Loc::MISSING; st.buffer.len()];
        self.batch_start = None;
        if let Some(p) = &mut self.pack {
            p.reset(st.pack.clone());
        }
    }

    /// `st` moved forward by `k` output rows (within its epoch), computed on row ids alone.
    pub fn advance_state(&self, st: &SlotState, k: u64) -> Result<SlotState> {
        let plan = self.plan_for(st.epoch);
        let spec = self.spec_of(&st.specs, st.epoch);
        let len = spec.input_len();
        let mut out = st.clone();
        if self.opts.shuffle_buffer == 0 {
            let k = k.min(len - st.emitted);
            out.cursor += k;
            out.emitted += k;
            return Ok(out);
        }
        let mut rng = Prng::new(buffer_key(&self.opts, st.epoch, self.slot));
        rng.set_word_pos(st.rng_word_pos);
        let mut buf: Buffer<()> = Buffer {
            capacity: self.opts.shuffle_buffer,
            data: vec![(); st.buffer.len()],
            rows: std::mem::take(&mut out.buffer),
        };
        let mut src = CoordRows {
            segments: Segments::new(plan.clone(), spec.ranges_after(st.cursor), u64::MAX),
            current: None,
        };
        for _ in 0..k {
            if buf
                .step(&mut rng, &mut src, &mut out.cursor, len, &mut out.emitted)?
                .is_none()
            {
                break;
            }
        }
        out.buffer = buf.rows;
        out.rng_word_pos = rng.word_pos();
        Ok(out)
    }

    /// Skip the next `items` outputs without reading them: an output is `item_rows` rows (a
    /// batch; 1 in row mode), or fewer at the end of an epoch, as [`Stream::next_batch`] would cut
    /// them. With `drop_short`, an epoch's short last batch is skipped without counting, as the
    /// Python layer drops it (`drop_last`). Works on row coordinates only (the shuffle buffer is
    /// simulated on row ids), so nothing skipped is read or decoded; the rows left in the buffer
    /// are re-read on the next batch, as after a resume.
    ///
    /// Returns the skipped row ranges as `(epoch, start, stop)` in this slot's epoch positions
    /// (`emitted` before and after), one per epoch touched; fewer items are skipped only when
    /// the pass ends first.
    pub fn skip(
        &mut self,
        mut items: u64,
        item_rows: u64,
        drop_short: bool,
    ) -> Result<Vec<(u64, u64, u64)>> {
        let item_rows = item_rows.max(1);
        let mut out = Vec::new();
        while items > 0 {
            let end = self.end_epoch();
            if end.is_some_and(|e| self.epoch >= e) {
                break;
            }
            let left = self.spec.output_len() - self.emitted;
            if left == 0 {
                // Same rule as next_batch: never step onto an empty epoch past the pass.
                if end == Some(self.epoch + 1) || self.nothing_after() {
                    break;
                }
                self.set_epoch(self.epoch + 1);
                continue;
            }
            let (full, short) = (left / item_rows, left % item_rows);
            let rows = if items <= full {
                items * item_rows
            } else {
                left // the rest of the epoch: every full batch and the short one
            };
            items -= if items <= full {
                items
            } else {
                full + u64::from(short > 0 && !drop_short)
            };
            let start = self.emitted;
            let st = self.advance_state(&self.state(), rows)?;
            if st.emitted != start + rows {
                return Err(Error::Internal(format!(
                    "skip moved {} rows instead of {rows}",
                    st.emitted - start
                )));
            }
            let plan = self.plan.clone();
            self.apply(plan, &st);
            out.push((self.epoch, start, st.emitted));
        }
        Ok(out)
    }

    /// The next batch of up to `max_rows` rows (fewer only at the end of an epoch; batches never
    /// span epochs), or `None` at the end of the pass.
    pub fn next_batch(&mut self, max_rows: usize) -> Result<Option<RecordBatch>> {
        match self.next_rows(max_rows, false)? {
            Some(r) => Ok(Some(r.into_batch(self.catalog.schema())?)),
            None => Ok(None),
        }
    }

    /// The rows [`Stream::next_batch`] would return, or with `locate` the first of them: a
    /// shuffled stream returns where they are in its retained batches instead of copying them
    /// ([`Rows::Located`]), and an unshuffled one at most the rest of its current decoded batch
    /// (a zero-copy slice; the caller asks again for the others) instead of concatenating
    /// slices of two decoded batches, so that a mixture copies each row once, into its mixed
    /// batch. The stream's position moves on by the rows returned, as with `next_batch`.
    pub fn next_rows(&mut self, max_rows: usize, locate: bool) -> Result<Option<Rows>> {
        let max_rows = max_rows.max(1);
        loop {
            let end = self.end_epoch();
            if end.is_some_and(|e| self.epoch >= e) {
                return Ok(None);
            }
            if self.emitted < self.spec.output_len() {
                break;
            }
            // Stay at "end of the last epoch" rather than move to an empty epoch past it; and
            // stop for good if this slot has no rows in any later epoch (more slots than rows).
            if end == Some(self.epoch + 1) || self.nothing_after() {
                return Ok(None);
            }
            self.set_epoch(self.epoch + 1);
        }
        if self.keep_batch_start {
            self.batch_start = Some(self.state());
        }
        let out = if self.opts.shuffle_buffer == 0 {
            Rows::Batch(self.next_plain(max_rows, !locate)?)
        } else {
            self.next_shuffled(max_rows, locate)?
        };
        Ok(Some(out))
    }

    fn data_side(&mut self) -> Result<&mut DataSide> {
        if self.data.as_ref().is_some_and(|d| {
            !d.input.owned_by_this_process()
                || d.refill
                    .as_ref()
                    .is_some_and(|r| !r.owned_by_this_process())
        }) {
            // Forked since readahead started: the threads are gone and their channels' locks may
            // be held forever. Abandon (never drop) that side and rebuild it from the state.
            std::mem::forget(self.data.take());
        }
        if self.data.is_none() {
            let input = Input::new(
                self.catalog.clone(),
                &self.plan,
                &self.spec,
                self.cursor,
                &self.opts,
            );
            // The buffer's data is read again by id: the rows the next batch picks first, the
            // rest in the background (next_shuffled).
            self.buffer.data.fill(Loc::MISSING);
            self.data = Some(DataSide {
                input,
                slab: Slab::default(),
                refill: None,
                missing: !self.buffer.rows.is_empty(),
                departures: None,
                _reading: crate::alloc::Reading::new(),
            });
        }
        Ok(self.data.as_mut().expect("just set"))
    }

    /// Up to `max_rows` rows in order; without `whole`, only those of the current decoded
    /// batch (never a concatenation).
    fn next_plain(&mut self, max_rows: usize, whole: bool) -> Result<RecordBatch> {
        let want = (max_rows as u64).min(self.spec.output_len() - self.emitted) as usize;
        let track = self.track_ids;
        let mut ids = std::mem::take(&mut self.ids);
        ids.clear();
        let data = self.data_side()?;
        let mut parts = Vec::new();
        let mut got = 0;
        let single = loop {
            let part = data.input.take(want - got)?;
            got += part.num_rows();
            if track {
                let first = data.input.first_row + (data.input.offset - part.num_rows()) as u64;
                ids.extend(first..first + part.num_rows() as u64);
            }
            if (got == want || !whole) && parts.is_empty() {
                break Some(part); // one slice of one decoded batch: the usual case
            }
            parts.push(part);
            if got == want {
                break None;
            }
        };
        self.ids = ids;
        self.cursor += got as u64;
        self.emitted += got as u64;
        match single {
            Some(b) => Ok(b),
            None => concat_batches(self.catalog.schema(), &parts)
                .map_err(|e| Error::Internal(format!("concat: {e}"))),
        }
    }

    fn next_shuffled(&mut self, max_rows: usize, locate: bool) -> Result<Rows> {
        let len = self.spec.input_len();
        self.data_side()?;
        let data = self.data.as_mut().expect("just set");
        if let Some(r) = data.refill.take() {
            let done = r.finish(
                &self.catalog,
                &mut self.buffer,
                &mut data.slab,
                self.opts.read_batch_rows,
            );
            // On failure the entries stay missing: read them again next time.
            data.missing = done.is_err();
            done?;
        }
        // Sized by the rows left in the epoch, not by the request (a batch_size of 10^11 is
        // legal and must not allocate up front).
        let left = (self.spec.output_len() - self.emitted).min(max_rows as u64);
        if data.missing && self.buffer.rows.len() <= EAGER_BUFFER_BATCHES * max_rows {
            // A buffer of a few batches: the first batch's picks touch nearly every page the
            // buffer's rows sit in, so read them all at once rather than those pages twice.
            let wanted: Vec<(u64, u32)> = (self.buffer.rows.iter().zip(&self.buffer.data))
                .enumerate()
                .filter(|(_, (_, l))| l.is_missing())
                .map(|(i, (&r, _))| (r, i as u32))
                .collect();
            let read = read_entries(
                &self.catalog,
                wanted,
                self.opts.read_batch_rows,
                self.opts.readahead_threads,
                None,
            )?;
            read.apply(&mut self.buffer.data, &mut data.slab);
            data.missing = false;
        }
        let mut picks = Vec::with_capacity(left as usize);
        let mut missing = Vec::new();
        let mut src = DataRows {
            input: &mut data.input,
            slab: &mut data.slab,
        };
        let track = self.track_ids;
        self.ids.clear();
        while picks.len() < max_rows {
            match self.buffer.step(
                &mut self.rng,
                &mut src,
                &mut self.cursor,
                len,
                &mut self.emitted,
            )? {
                Some((id, loc)) => {
                    if let Some((_, d)) = &mut data.departures {
                        d.step();
                    }
                    if track {
                        self.ids.push(id);
                    }
                    if loc.is_missing() {
                        missing.push((id, picks.len() as u32));
                    }
                    picks.push(loc)
                }
                None => break,
            }
        }
        if !missing.is_empty() {
            // Picked before their data was read (the first batch after a restore): read them
            // now, on as many threads as readahead may use (scoped: joined right here).
            let read = read_entries(
                &self.catalog,
                missing,
                self.opts.read_batch_rows,
                self.opts.readahead_threads,
                None,
            )?;
            read.apply(&mut picks, &mut data.slab);
        }
        if data.missing {
            // The rest of the buffer is read in the background while this batch is used.
            data.refill = Refill::start(
                &self.catalog,
                &self.buffer,
                self.opts.read_batch_rows,
                self.opts.readahead_threads,
            )?;
            data.missing = false;
        }
        // Located or gathered before the picks are released (a batch may leave the slab then).
        let out = if locate {
            Rows::Located(data.slab.locate(&picks))
        } else {
            Rows::Batch(data.slab.gather(self.catalog.schema(), &picks)?)
        };
        for l in &picks {
            data.slab.release(l.batch);
        }
        if data.refill.is_none() && !data.missing {
            let due = compaction_due(
                &data.slab,
                self.buffer.data.len(),
                self.buffer.capacity,
                data.input.pinned,
                self.opts.read_batch_rows,
            );
            if let Some(waste) = due {
                if data
                    .departures
                    .as_ref()
                    .is_none_or(|(at, d)| at + d.steps() != self.emitted)
                {
                    // Made when first due (a stream that never compacts never pays for it):
                    // the draws of one buffer length ahead, then one draw per step.
                    data.departures = Departures::new(
                        &self.buffer,
                        &self.rng,
                        len - self.cursor,
                        self.buffer.capacity,
                    )
                    .map(|d| (self.emitted, d));
                }
                compact(
                    &mut data.slab,
                    &mut self.buffer.data,
                    waste,
                    data.departures.as_mut().map(|(_, d)| d),
                    data.input.pinned,
                    self.opts.read_batch_rows,
                    self.catalog.schema(),
                )?;
            }
        }
        Ok(out)
    }
}

/// Retained batches may hold this many rows per 64 buffered ones (plus a decoded batch's rows,
/// beside the input batch) before the sparsest are compacted, at most 1/[`COMPACT_MOVE`] of the
/// buffer at a time: a decoded batch stays alive until its last buffered row leaves, which with
/// random picks takes several buffer lengths. Rows that leave together are copied together
/// ([`Departures`]), so a merged batch empties over a short span and is freed whole instead of
/// being compacted again. In a model of the buffer (random departures, 2,048-row batches, 2 M
/// rows through a 100k buffer, the peak counting the rows being copied), copying in batch order
/// at 88/76 held up to 1.43x the buffer's rows and copied 1.31 rows per row read; by departure at
/// 76/70, 1/12 at a time, 1.34x and 1.00. Measured on a 100k shuffle of `[id, tokens]`: at 69,
/// 1/8 at a time, the peak RSS is ~11 MiB (5%) lower than at 76/70, 1/12, for 1.41 rows copied
/// per row read instead of 1.00 (CPU within the noise, at most a few %); the lower the bound,
/// the lower the peak and the more rows copied (docs/benchmarks.md, "Compaction from 1.08x").
const COMPACT_FROM: usize = 69;
/// One compaction copies at most about 1/this of the buffer (or one decoded batch): the rows
/// copied in departure order come from all the compacted batches at once, which are all freed
/// only at the end.
const COMPACT_MOVE: usize = 8;

/// Rows to free when the retained batches hold more than [`COMPACT_FROM`]/64 of the buffered
/// rows (see there): every row no buffer entry points at; `None` when they don't.
fn compaction_due(
    slab: &Slab,
    entries: usize,
    capacity: usize,
    pinned: Option<u32>,
    read_batch_rows: usize,
) -> Option<usize> {
    // While the buffer drains at the end of an epoch the batches empty with it: measured
    // against the capacity, draining never compacts (rows only leave).
    let buffered = entries.max(capacity);
    let input = pinned
        .and_then(|p| slab.batches[p as usize].as_ref())
        .map_or(0, |b| b.num_rows());
    let held = slab.live_rows - input;
    (entries > 0 && held > buffered * COMPACT_FROM / 64 + read_batch_rows).then(|| held - buffered)
}

/// Copy the buffered rows of the sparsest retained batches into new ones and free those, until
/// about `waste` unreferenced rows are freed or 1/[`COMPACT_MOVE`] of the buffer is copied (see
/// there). Compacting only the sparsest keeps both the memory held and the rows copied small:
/// all of the buffer copied at once held three buffers' worth at the peak.
fn compact(
    slab: &mut Slab,
    entries: &mut [Loc],
    waste: usize,
    departures: Option<&mut Departures>,
    pinned: Option<u32>,
    read_batch_rows: usize,
    schema: &arrow_schema::SchemaRef,
) -> Result<()> {
    let max_moved = (entries.len() / COMPACT_MOVE).max(read_batch_rows);
    let chosen = slab.sparsest(pinned, waste, max_moved);
    let mut picked = vec![false; slab.batches.len()];
    for &b in &chosen {
        picked[b as usize] = true;
    }
    let moved: Vec<usize> = (0..entries.len())
        .filter(|&i| picked.get(entries[i].batch as usize) == Some(&true))
        .collect();
    // A decoded batch's worth of rows at a time, in the order they will leave (rows not
    // predicted last, in the order of the batches they come from), so each merged batch empties
    // over a short span and is freed whole; merged batches are the size of a decoded one, so
    // the next merged batch (and the next decoded one) reuses the memory the last ones freed
    // (`alloc::Recycling`). Each compacted batch is freed as soon as its last row is copied.
    // (No comparison sort: it was ~5% of a 100k shuffle's instructions.)
    let mut order = Vec::with_capacity(moved.len());
    let mut listed = vec![false; moved.len()];
    if let Some(d) = departures {
        for (k, _) in d.leaving(&moved) {
            listed[k] = true;
            order.push(moved[k]);
        }
    }
    let later = moved
        .iter()
        .zip(&listed)
        .filter(|(_, &l)| !l)
        .map(|(&i, _)| i);
    order.extend(by_batch(later, entries, slab.batches.len()));
    let moved = order;
    for chunk in moved.chunks(read_batch_rows.max(1)) {
        let locs: Vec<Loc> = chunk.iter().map(|&i| entries[i]).collect();
        let merged = slab.gather(schema, &locs)?;
        for l in &locs {
            slab.release(l.batch);
        }
        let id = slab.insert(merged, locs.len() as u32);
        slab.copied += locs.len() as u64;
        for (k, &i) in chunk.iter().enumerate() {
            entries[i] = Loc {
                batch: id,
                row: k as u32,
            };
        }
    }
    Ok(())
}

/// Buffer positions grouped by the batch their rows are in (in batch order; stable: a counting
/// sort over the `batches` slab entries).
fn by_batch(
    positions: impl Iterator<Item = usize> + Clone,
    entries: &[Loc],
    batches: usize,
) -> Vec<usize> {
    let mut start = vec![0usize; batches + 1];
    for i in positions.clone() {
        start[entries[i].batch as usize + 1] += 1;
    }
    for b in 0..batches {
        start[b + 1] += start[b];
    }
    let mut out = vec![0usize; start[batches]];
    for i in positions {
        let at = &mut start[entries[i].batch as usize];
        out[*at] = i;
        *at += 1;
    }
    out
}

/// The seek a resume from `st` (of a slot reading `spec` in `plan`'s epoch) starts with; `None`
/// when the slot has no input left in that epoch.
pub fn seek_of(
    catalog: &Catalog,
    plan: &EpochPlan,
    spec: &SlotSpec,
    st: &SlotState,
) -> Option<Seek> {
    let next = spec.ranges_after(st.cursor).first()?.start;
    if next >= plan.total() {
        return None;
    }
    let (s, g, row) = catalog.locate(plan.row_at(next))?;
    let shard = catalog.shard(s);
    Some(Seek {
        shard: shard.rel_path.clone(),
        row_group: g as u64,
        row,
        byte_offset: shard.row_groups[g].byte_offset,
    })
}

/// Buffers of at most this many output batches are read whole before the first batch after a
/// restore; larger ones read the first batch's picks first and the rest in the background.
const EAGER_BUFFER_BATCHES: usize = 16;

fn buffer_key(opts: &StreamOptions, epoch: u64, slot: Slot) -> [u8; 32] {
    derive_key(
        "shuffle-buffer",
        &[opts.seed, epoch, slot.index as u64, slot.count as u64],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{drain_ids as drain, ids, write_shards};
    use proptest::prelude::*;

    fn opts(shuffle: usize, threads: usize, epochs: u64) -> StreamOptions {
        StreamOptions {
            seed: 9,
            shuffle_buffer: shuffle,
            epochs: Some(epochs),
            read_batch_rows: 5,
            readahead_threads: threads,
            piece_rows: 6,
            ..Default::default()
        }
    }

    #[test]
    fn compaction_copies_rows_that_leave_together_into_the_same_batch() {
        // Copied in the order they leave, rows are copied about once: a merged batch is freed
        // whole soon after. Copied in the order of their batches, merged batches empty at
        // random like decoded ones and are compacted again.
        let dir = tempfile::tempdir().unwrap();
        let files = write_shards(dir.path(), &[12000], 100);
        let cat = Arc::new(Catalog::open(&files, None).unwrap());
        let mut o = opts(400, 0, 1);
        o.read_batch_rows = 16;
        let mut s = Stream::new(cat, o, Slot::new(0, 1).unwrap()).unwrap();
        let mut seen = Vec::new();
        while let Some(b) = s.next_batch(7).unwrap() {
            seen.extend(ids(&b));
        }
        // 16,868 rows copied; 32,686 in the order of their batches.
        let copied = s.data.as_ref().unwrap().slab.copied;
        assert!(copied < 20_000, "{copied} rows copied for 12,000 read");
        seen.sort_unstable();
        assert_eq!(seen, (0..12000).collect::<Vec<i64>>());
    }

    /// The retained batches stay within the compaction bound after every batch, and compaction
    /// makes batches of at most `read_batch_rows` rows (not one of every moved row), while the
    /// epoch still yields every row once.
    #[test]
    fn compaction_bounds_the_retained_rows_in_batches_of_read_batch_rows() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_shards(dir.path(), &[3000, 1000], 100);
        let cat = Arc::new(Catalog::open(&files, None).unwrap());
        let (buffer, rbr) = (400usize, 5usize);
        let mut s = Stream::new(cat, opts(buffer, 0, 1), Slot::new(0, 1).unwrap()).unwrap();
        // Without compaction 5-row batches would keep ~2.3x the buffer's rows (a batch lives
        // until the last of its rows leaves: H(5) buffer lengths), over the bound checked here.
        let (mut seen, mut largest) = (Vec::new(), 0);
        while let Some(b) = s.next_batch(7).unwrap() {
            seen.extend(ids(&b));
            let data = s.data.as_ref().unwrap();
            let input = data.input.pinned;
            let mut held = 0;
            for (i, b) in data.slab.batches.iter().enumerate() {
                if let (Some(b), false) = (b, Some(i as u32) == input) {
                    held += b.num_rows();
                    largest = largest.max(b.num_rows());
                }
            }
            assert!(
                held <= buffer * COMPACT_FROM / 64 + rbr,
                "{held} rows retained"
            );
        }
        assert!(largest <= rbr, "a retained batch of {largest} rows");
        seen.sort_unstable();
        assert_eq!(seen, (0..4000).collect::<Vec<i64>>());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        /// Readahead (any thread count) yields exactly the synchronous stream, and restoring
        /// the state taken after any batch continues it exactly, with or without readahead.
        #[test]
        fn readahead_and_restore_preserve_the_stream(
            rows in proptest::collection::vec(0usize..40, 1..5), rg in 1usize..15,
            shuffle in prop_oneof![Just(0usize), 1usize..60], bs in 1usize..9,
            threads in 0usize..4, slots in 1u32..3, cut in any::<proptest::sample::Index>(),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let files = write_shards(dir.path(), &rows, rg);
            let cat = Arc::new(Catalog::open(&files, None).unwrap());
            let mut seen = Vec::new();
            for slot in 0..slots {
                let slot = Slot::new(slot, slots).unwrap();
                let reference = drain(&mut Stream::new(cat.clone(), opts(shuffle, 0, 2), slot).unwrap(), bs);
                let ahead = drain(&mut Stream::new(cat.clone(), opts(shuffle, threads, 2), slot).unwrap(), bs);
                prop_assert_eq!(&ahead, &reference);
                let k = if reference.is_empty() { 0 } else { cut.index(reference.len() + 1) };
                let mut s = Stream::new(cat.clone(), opts(shuffle, threads, 2), slot).unwrap();
                for _ in 0..k {
                    s.next_batch(bs).unwrap();
                }
                let st = s.state();
                let mut resumed = Stream::new(cat.clone(), opts(shuffle, threads, 2), slot).unwrap();
                resumed.restore(&st).unwrap();
                // One batch, its state taken and restored while the rest of the buffer may
                // still be read in the background (that read is dropped), then the rest.
                let first = resumed.next_batch(bs).unwrap().map(|b| ids(&b));
                prop_assert_eq!(first.as_ref(), reference.get(k));
                let st = resumed.state();
                resumed.restore(&st).unwrap();
                prop_assert_eq!(&drain(&mut resumed, bs)[..], &reference[(k + 1).min(reference.len())..]);
                seen.extend(reference.into_iter().flatten());
            }
            // Two epochs: every row exactly twice over all slots.
            seen.sort_unstable();
            let total: usize = rows.iter().sum();
            let want: Vec<i64> = (0..total as i64).flat_map(|x| [x, x]).collect();
            prop_assert_eq!(seen, want);
        }

        /// Skipping n batches (on coordinates, nothing read) leaves the stream exactly where
        /// reading and discarding them would, across epoch ends and short last batches, and
        /// reports the skipped rows as per-epoch position ranges.
        #[test]
        fn skip_equals_read_and_discard(
            rows in proptest::collection::vec(0usize..30, 1..4), rg in 1usize..9,
            shuffle in prop_oneof![Just(0usize), 1usize..40], bs in 1usize..7,
            threads in 0usize..3, slots in 1u32..3, before in 0usize..6, n in 0u64..12,
            drop_short: bool,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let files = write_shards(dir.path(), &rows, rg);
            let cat = Arc::new(Catalog::open(&files, None).unwrap());
            for slot in 0..slots {
                let slot = Slot::new(slot, slots).unwrap();
                // Reference: what a reader that drops short batches (drop_last) counts as items.
                let mut reference = Vec::new();
                let mut r = Stream::new(cat.clone(), opts(shuffle, 0, 3), slot).unwrap();
                while let Some(b) = r.next_batch(bs).unwrap() {
                    if !(drop_short && b.num_rows() < bs) {
                        reference.push((r.state().epoch, ids(&b)));
                    }
                }
                let mut s = Stream::new(cat.clone(), opts(shuffle, threads, 3), slot).unwrap();
                let mut got = Vec::new();
                while got.len() < before {
                    match s.next_batch(bs).unwrap() {
                        Some(b) if drop_short && b.num_rows() < bs => {}
                        Some(b) => got.push((s.state().epoch, ids(&b))),
                        None => break,
                    }
                }
                let ranges = s.skip(n, bs as u64, drop_short).unwrap();
                let skipped: u64 = ranges.iter().map(|(_, a, b)| b - a).sum();
                let cut = (got.len() + n as usize).min(reference.len());
                let expect_rows: u64 = reference[got.len()..cut]
                    .iter()
                    .map(|(_, v)| v.len() as u64)
                    .sum();
                // A dropped short batch is skipped too, without counting; at most one per epoch.
                prop_assert!(skipped >= expect_rows);
                prop_assert!(ranges.windows(2).all(|w| w[0].0 < w[1].0));
                while let Some(b) = s.next_batch(bs).unwrap() {
                    if !(drop_short && b.num_rows() < bs) {
                        got.push((s.state().epoch, ids(&b)));
                    }
                }
                let mut want = reference[..before.min(reference.len())].to_vec();
                want.extend_from_slice(&reference[cut.max(want.len())..]);
                prop_assert_eq!(got, want);
            }
        }

        /// Asked to `locate`, an unshuffled stream hands over one slice of one decoded batch at
        /// a time (never a concatenation: a mixture copies each row once), and those slices are
        /// exactly the rows `next_batch` gives, with the same position after each batch.
        #[test]
        fn located_plain_rows_are_slices_of_one_decoded_batch(
            rows in proptest::collection::vec(0usize..40, 1..5), rg in 1usize..15,
            bs in 1usize..13, threads in 0usize..3,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let files = write_shards(dir.path(), &rows, rg);
            let cat = Arc::new(Catalog::open(&files, None).unwrap());
            let slot = Slot::new(0, 1).unwrap();
            let o = opts(0, threads, 2);
            let mut r = Stream::new(cat.clone(), o.clone(), slot).unwrap();
            let mut s = Stream::new(cat.clone(), o.clone(), slot).unwrap();
            while let Some(want) = r.next_batch(bs).unwrap() {
                let want = ids(&want);
                let mut got = Vec::new();
                while got.len() < want.len() {
                    match s.next_rows(want.len() - got.len(), true).unwrap() {
                        Some(Rows::Batch(b)) => {
                            prop_assert!(b.num_rows() >= 1 && b.num_rows() <= o.read_batch_rows);
                            got.extend(ids(&b));
                        }
                        other => prop_assert!(false, "expected a batch, got {:?}", other),
                    }
                }
                prop_assert_eq!(got, want);
                prop_assert_eq!(s.state(), r.state());
            }
            prop_assert!(s.next_rows(bs, true).unwrap().is_none());
        }

        /// The state after k rows of a batch, computed on row ids alone, equals the state of a
        /// stream that really emitted exactly those rows.
        #[test]
        fn state_within_batch_matches_real_position(
            rows in proptest::collection::vec(1usize..30, 1..4), shuffle in 0usize..40,
            bs in 1usize..12, batches in 0usize..6, k in 0usize..12,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let files = write_shards(dir.path(), &rows, 4);
            let cat = Arc::new(Catalog::open(&files, None).unwrap());
            let slot = Slot::new(0, 1).unwrap();
            let mut a = Stream::new(cat.clone(), opts(shuffle, 0, 1), slot).unwrap();
            a.keep_batch_start(true);
            let mut b = Stream::new(cat.clone(), opts(shuffle, 0, 1), slot).unwrap();
            for _ in 0..batches {
                if a.next_batch(bs).unwrap().is_none() { break; }
                b.next_batch(bs).unwrap();
            }
            if let Some(batch) = a.next_batch(bs).unwrap() {
                let k = k.min(batch.num_rows());
                b.next_batch(k.max(1)).unwrap();
                let expect = if k == 0 { a.batch_start.clone().unwrap() } else { b.state() };
                prop_assert_eq!(a.state_within_batch(k).unwrap(), expect);
            }
        }
    }

    /// `checkpoint_head` and `checkpoint_parts` (what a stream's `state_dict()` is built from)
    /// put together are `checkpoint`, at every step, across epoch ends and after a skip.
    #[test]
    fn checkpoint_parts_reassemble_the_checkpoint() {
        use crate::state::envelope::StreamState;
        let dir = tempfile::tempdir().unwrap();
        let files = write_shards(dir.path(), &[23, 0, 17], 4);
        let cat = Arc::new(Catalog::open(&files, None).unwrap());
        for shuffle in [0, 7] {
            let slot = Slot::new(1, 2).unwrap();
            let mut s = Stream::new(cat.clone(), opts(shuffle, 1, 3), slot).unwrap();
            let head = s.checkpoint_head();
            let mut steps = 0;
            loop {
                let parts = s.checkpoint_parts(None).unwrap();
                let mut position = parts.position.clone();
                position.buffer = crate::state::ids_to_latin1(&parts.ids);
                let st = StreamState {
                    position: Some(position),
                    skips: parts.skips.clone(),
                    ..head.clone()
                };
                assert_eq!(
                    st,
                    s.checkpoint(None).unwrap(),
                    "shuffle {shuffle}, step {steps}"
                );
                if steps == 3 {
                    s.skip_items(2, None).unwrap();
                }
                if s.next_batch(4).unwrap().is_none() {
                    break;
                }
                steps += 1;
            }
            assert!(steps > 10, "{steps}");
        }
    }

    #[test]
    fn hostile_states_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_shards(dir.path(), &[30, 20], 7);
        let cat = Arc::new(Catalog::open(&files, None).unwrap());
        let slot = Slot::new(0, 1).unwrap();
        let mut s = Stream::new(cat.clone(), opts(8, 0, 1), slot).unwrap();
        s.next_batch(5).unwrap();
        let good = s.state();
        let mut fresh = Stream::new(cat.clone(), opts(8, 0, 1), slot).unwrap();
        fresh.restore(&good).unwrap();
        let mut bad = vec![];
        let mut st = good.clone();
        st.buffer[0] = st.buffer[1];
        bad.push(("duplicate", st));
        let mut st = good.clone();
        st.buffer[0] = 49; // a row this slot has not read yet
        bad.push(("unread row", st));
        let mut st = good.clone();
        st.buffer.pop();
        bad.push(("short buffer", st));
        let mut st = good.clone();
        st.cursor = 51;
        bad.push(("cursor past end", st));
        let mut st = good.clone();
        st.emitted += 1;
        bad.push(("emitted", st));
        let mut st = good.clone();
        st.epoch = 5;
        bad.push(("epoch", st));
        for (what, st) in bad {
            let r = fresh.restore(&st);
            assert!(matches!(r, Err(Error::State(_))), "{what}: {r:?}");
        }
    }
}

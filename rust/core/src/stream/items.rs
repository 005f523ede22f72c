//! The stream as the user sees it: items (batches of `batch_size`, or rows handed over in
//! chunks in row mode), skips recorded in the state, recorded skips replayed, and the saved
//! state itself. One call per user action crosses into the core.

use std::borrow::Cow;
use std::sync::Arc;

use arrow_array::RecordBatch;

use super::Stream;
use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::resume::Resume;
use crate::settings::{Layout, Settings, StreamOptions, Tuning, DEFAULTS};
use crate::state::envelope::{parse_stream, PositionRecord, SkipRecord, SlotRecord, StreamState};
use crate::state::ids_to_latin1;

impl Stream {
    /// The stream of `layout` starting where `resume` says, with `threads` readahead threads.
    /// The resume point was validated when it was loaded: nothing is checked again.
    pub fn resume(
        catalog: Arc<Catalog>,
        settings: &Settings,
        tuning: &Tuning,
        layout: Layout,
        threads: usize,
        resume: &Resume,
    ) -> Result<Stream> {
        let opts = StreamOptions {
            read_batch_rows: tuning.batch_rows(&catalog),
            ..StreamOptions::new(settings, tuning, resume.first_epoch(), layout.even, threads)
        };
        let position = resume.position(&catalog, settings, layout)?;
        let mut s = Stream::new(catalog, opts, layout.slot)?;
        if let Some(cfg) = &settings.pack {
            let pending = position.as_ref().and_then(|st| st.pack.clone());
            s.pack = Some(crate::pack::Packer::new(
                cfg.clone(),
                s.catalog.schema(),
                pending,
            )?);
            s.track_ids = true;
        }
        if let Some(st) = position {
            let plan = s.plan_for(st.epoch);
            s.apply(plan, &st);
        }
        s.settings = settings.clone();
        s.keep_batch_start(settings.batch_size.is_none());
        s.skips = resume.skips.clone();
        s.replay = resume.replay.clone();
        Ok(s)
    }

    /// The next item: a batch of `batch_size` rows (an epoch's short last one unless
    /// `drop_last`), or in row mode a chunk of rows (cut where a replayed skip starts); `None` at
    /// the end of the pass. Recorded skips due at the current position are applied first.
    pub fn next_item(&mut self) -> Result<Option<RecordBatch>> {
        if self.pack.is_some() {
            return self.next_packed();
        }
        loop {
            let room = if self.replay.is_empty() {
                None
            } else {
                self.replay_due()?
            };
            let batch = match self.settings.batch_size {
                Some(bs) => self.next_batch(bs.min(usize::MAX as u64) as usize)?,
                None => {
                    let chunk = DEFAULTS.row_chunk as u64;
                    self.next_batch(room.map_or(chunk, |r| r.min(chunk)) as usize)?
                }
            };
            match batch {
                None => {
                    self.ended = true;
                    return Ok(None);
                }
                Some(b) => {
                    let short = self
                        .settings
                        .batch_size
                        .is_some_and(|bs| (b.num_rows() as u64) < bs);
                    if self.settings.drop_last && short {
                        continue;
                    }
                    return Ok(Some(b));
                }
            }
        }
    }

    /// Replay: apply the recorded skip that starts at the current position, if any; returns
    /// the rows until the next one in this epoch (`None`: none ahead).
    fn replay_due(&mut self) -> Result<Option<u64>> {
        loop {
            let (epoch, at) = self.position();
            let (here, next) = self.replay.due(self.slot, epoch, at);
            let Some(rec) = here else {
                return Ok(next.map(|n| n - at));
            };
            self.skip_recorded(rec.stop - at, 1)?;
            if self.position() == (epoch, at) {
                return Ok(None); // the end of the pass
            }
        }
    }

    /// Also replay these skips when the stream reaches them.
    pub fn add_replay(
        &mut self,
        records: impl IntoIterator<Item = crate::state::envelope::SkipRecord>,
    ) {
        self.replay.extend(records);
    }

    /// Skip `items` items of `item_rows` rows and record the rows passed over.
    fn skip_recorded(&mut self, items: u64, item_rows: u64) -> Result<()> {
        let ranges = self.skip(items, item_rows, self.settings.drops_short())?;
        self.skips.record(self.slot, &ranges);
        Ok(())
    }

    /// Pass over the next `n` items without reading them, recorded in the state. In row mode,
    /// `within` = rows of the last chunk actually yielded: the rest of that chunk is dropped
    /// (the position goes back to the last yielded row first).
    pub fn skip_items(&mut self, n: u64, within: Option<usize>) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        if self.pack.is_some() {
            // Which rows a packed row holds depends on the tokens: nothing to skip without reading.
            return Err(Error::Config(
                "skip() is not available with packing (packed rows depend on the documents' \
                 lengths, so they cannot be passed over without reading them)"
                    .into(),
            ));
        }
        if let Some(k) = within {
            let st = self.state_within_batch(k)?;
            self.restore(&st)?;
        }
        self.skip_recorded(n, self.settings.item_rows())
    }

    /// The saved state: the position after the last returned row (`within=None`) or after the
    /// first `within` rows of the last returned chunk (row mode).
    pub fn checkpoint(&mut self, within: Option<usize>) -> Result<StreamState> {
        let (mut st, ids) = self.checkpoint_ids(within)?;
        if let Some(p) = st.position.as_mut() {
            p.buffer = ids_to_latin1(&ids);
        }
        Ok(st)
    }

    /// [`Self::checkpoint`] with the buffer's row ids beside the state instead of in it (its
    /// `position.buffer` text is empty): the binding makes their Latin-1 `str` from their bytes
    /// itself (a mixture's `state_dict()`), so a snapshot encodes nothing in proportion to the
    /// buffer. A stream's own `state_dict()` uses [`Self::checkpoint_head`] and
    /// [`Self::checkpoint_parts`] instead, which copy neither the ids nor the fixed fields.
    pub fn checkpoint_ids(&mut self, within: Option<usize>) -> Result<(StreamState, Vec<u64>)> {
        let (st, ids) = self.snapshot(within)?;
        let seek = self.seek_of(&st);
        let state = StreamState::new(
            &self.catalog,
            &self.settings,
            self.opts.first_epoch,
            Some((
                self.slot,
                self.opts.even,
                PositionRecord::of(&st, String::new(), seek),
            )),
            self.skips.records(),
        );
        Ok((state, ids))
    }

    /// What every checkpoint of this stream holds besides its position and skips: `format`,
    /// `version`, `fingerprint`, `settings`, `first_epoch` and `slot`, none of which can change
    /// while the stream lives (its catalog, settings, pass and slot are fixed when it is made;
    /// `set_epoch` or `load_state_dict` make a new stream). `position` is `None` and `skips`
    /// empty here: [`Self::checkpoint_parts`] has them.
    pub fn checkpoint_head(&self) -> StreamState {
        let mut st = StreamState::new(
            &self.catalog,
            &self.settings,
            self.opts.first_epoch,
            None,
            Vec::new(),
        );
        st.slot = Some(SlotRecord {
            index: self.slot.index,
            count: self.slot.count,
            even: self.opts.even.name().into(),
        });
        st
    }

    /// The rest of [`Self::checkpoint`] after [`Self::checkpoint_head`]: the position (its
    /// `buffer` text empty), the buffer's row ids, and the skip history. After the last
    /// returned item (`within = None`) the ids are the buffer's own, borrowed, not copied: the
    /// caller makes their text while it holds the stream.
    pub fn checkpoint_parts(&self, within: Option<usize>) -> Result<CheckpointParts<'_>> {
        let (st, ids) = match within {
            Some(k) => {
                let mut st = self.state_within_batch(k)?;
                let ids = std::mem::take(&mut st.buffer);
                (st, Cow::Owned(ids))
            }
            None => (
                self.state_without_buffer(),
                Cow::Borrowed(self.buffer.rows.as_slice()),
            ),
        };
        let seek = self.seek_of(&st);
        Ok(CheckpointParts {
            position: PositionRecord::of(&st, String::new(), seek),
            ids,
            skips: self.skips.records(),
        })
    }

    /// Where the next stream of this dataset starts: here (`within` rows into the last chunk),
    /// or, once the pass has ended, the start of the pass again; skip history and the rest of
    /// the replay plan carry over.
    pub fn resume_point(&self, within: Option<usize>) -> Result<Resume> {
        if self.ended {
            let mut r = Resume::start(self.opts.first_epoch);
            r.skips = self.skips.clone();
            r.replay = self.replay.clone();
            return Ok(r);
        }
        let st = match within {
            Some(k) => self.state_within_batch(k)?,
            None => self.state(),
        };
        let spec = self.spec_of(&st.specs, st.epoch);
        Ok(Resume::at(
            self.opts.first_epoch,
            self.slot,
            self.opts.even,
            (st, spec),
            self.skips.clone(),
            self.replay.clone(),
        ))
    }
}

/// A checkpoint without its fixed fields ([`Stream::checkpoint_parts`]).
#[derive(Debug)]
pub struct CheckpointParts<'a> {
    /// `position`, with an empty `buffer` text.
    pub position: PositionRecord,
    /// The shuffle buffer's row ids, in buffer order.
    pub ids: Cow<'a, [u64]>,
    pub skips: Vec<SkipRecord>,
}

/// A checkpoint's single state rewritten as if its stream had skipped `n` more items.
pub fn skip_state(
    catalog: &Arc<Catalog>,
    settings: &Settings,
    state: serde_json::Value,
    n: u64,
) -> Result<StreamState> {
    let st = parse_stream(state.clone(), "state")?;
    let Some((slot, even)) = st.layout() else {
        return Err(Error::State(
            "skip_state needs states of slots that have started (this one has no position): \
             iterate once, or use skip() before iterating"
                .into(),
        ));
    };
    let resume = Resume::load(catalog, settings, vec![state], false)?;
    let layout = Layout { slot, even };
    let mut s = Stream::resume(
        catalog.clone(),
        settings,
        &Tuning::default(),
        layout,
        0,
        &resume,
    )?;
    s.skip_items(n, None)?;
    s.checkpoint(None)
}

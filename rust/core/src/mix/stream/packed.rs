//! Packing after mixing: the mixer decides, row by row as without packing, which source's next
//! document comes next; the documents go into one packer (`pack/`) in mixing order, and items
//! are packed rows. The state is each source's stream state and the mixer's after the rows
//! already taken into the packer, plus the packer's pending documents as (source, row id, token
//! range): on resume those rows are read again from their source.

use arrow_array::RecordBatch;
use arrow_select::concat::concat_batches;

use super::{in_source, MixItem, MixStream};
use crate::error::{Error, Result};
use crate::mix::{MixConfig, MixResume};
use crate::pack::{DocRef, Packer};
use crate::reader::read_rows;
use crate::settings::Layout;

/// The packer of `layout`'s slot, with the pending documents `resume` gives it.
pub(super) fn packer(
    cfg: &MixConfig,
    resume: &MixResume,
    layout: Layout,
) -> Result<Option<Packer>> {
    let Some(p) = &cfg.pack else {
        return Ok(None);
    };
    let schemas: Vec<(&str, &arrow_schema::Schema)> = cfg
        .sources
        .iter()
        .map(|s| (s.name.as_str(), s.catalog.schema().as_ref()))
        .collect();
    let pending = resume.pending(cfg, layout)?;
    Packer::for_mixture(p.clone(), &schemas, pending).map(Some)
}

/// The packer's pending documents by source name (what a state saves).
pub(super) fn named_refs(names: &[String], p: &Packer) -> Vec<(String, DocRef)> {
    p.refs_with_sources()
        .into_iter()
        .map(|(s, r)| (names[s as usize].clone(), r))
        .collect()
}

impl MixStream {
    /// The next item of `batch_size` packed rows (one in row mode), or `None` at the end.
    pub(super) fn next_packed(&mut self) -> Result<Option<MixItem>> {
        if self.ended {
            return Ok(None);
        }
        let n = crate::pack::item_rows(self.cfg.settings.batch_size)?;
        let mut p = self.packer.take().expect("a packing mixture");
        let out = self.pack_rows(&mut p, n);
        self.packer = Some(p);
        match out? {
            Some(b) if !(self.cfg.settings.drop_last && b.num_rows() < n) => {
                Ok(Some(MixItem::Mixed(b)))
            }
            _ => {
                self.ended = true;
                Ok(None)
            }
        }
    }

    fn pack_rows(&mut self, p: &mut Packer, n: usize) -> Result<Option<RecordBatch>> {
        if let Some(need) = p.needs_rows_by_source() {
            // A resumed state's pending documents: read just those rows again, per source.
            let mut read = Vec::with_capacity(need.len());
            for (s, ids) in need {
                let st = self.streams.get(s as usize).ok_or_else(|| {
                    Error::Internal(format!("pending document of source index {s}"))
                })?;
                let o = st.options();
                let batches = read_rows(
                    st.catalog(),
                    &ids,
                    o.read_batch_rows,
                    o.readahead_threads.max(1),
                )
                .map_err(|e| in_source(&self.cfg.sources[s as usize].name, e))?;
                read.push((s, ids, batches));
            }
            let r: Vec<(u16, &[u64], &[RecordBatch])> = read
                .iter()
                .map(|(s, i, b)| (*s, i.as_slice(), b.as_slice()))
                .collect();
            p.hydrate_sources(&r)?;
        }
        let mut more = |p: &mut Packer| self.pull_docs(p);
        p.emit(n, &mut more)
    }

    /// Take the mixture's next rows (at most the packer's pull) into the packer, in mixing
    /// order; false once the mixture has no more rows.
    fn pull_docs(&mut self, p: &mut Packer) -> Result<bool> {
        let want = p.pull_rows();
        let mut avail = self.avail();
        let k = self.streams.len();
        let mut counts = vec![0u64; k];
        let mut choices = Vec::with_capacity(want);
        while choices.len() < want {
            let Some(s) = self.mixer.peek(&avail) else {
                break;
            };
            self.mixer.take(&mut avail);
            counts[s] += 1;
            choices.push(s as u16);
        }
        if choices.is_empty() {
            return Ok(false);
        }
        let mut parts = Vec::with_capacity(k);
        for (s, &c) in counts.iter().enumerate() {
            parts.push(if c > 0 {
                Some(self.pull_with_ids(s, c)?)
            } else {
                None
            });
        }
        p.take_mixed(&parts, &choices)?;
        Ok(true)
    }

    /// Exactly `n` rows of source `s` (the mixer counted them as there) and their row ids.
    fn pull_with_ids(&mut self, s: usize, n: u64) -> Result<(RecordBatch, Vec<u64>)> {
        let name = &self.cfg.sources[s].name;
        let stream = &mut self.streams[s];
        let mut ids = Vec::with_capacity(n as usize);
        let mut batches = Vec::with_capacity(1);
        while (ids.len() as u64) < n {
            let want = usize::try_from(n - ids.len() as u64).unwrap_or(usize::MAX);
            match stream.next_batch(want).map_err(|e| in_source(name, e))? {
                Some(b) => {
                    ids.extend_from_slice(stream.last_ids());
                    batches.push(b);
                }
                None => {
                    return Err(Error::Internal(format!(
                        "source {name:?} ended after {} of the {n} rows the mixer counted",
                        ids.len()
                    )))
                }
            }
        }
        let b = if batches.len() == 1 {
            batches.pop().expect("one batch")
        } else {
            concat_batches(self.cfg.sources[s].catalog.schema(), &batches)
                .map_err(|e| Error::Internal(format!("concat: {e}")))?
        };
        Ok((b, ids))
    }
}

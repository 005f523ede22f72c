//! The stream of packed rows: the slot's rows fed to its packer (`pack/`), items of
//! `batch_size` packed rows (one in row mode).

use arrow_array::RecordBatch;

use super::Stream;
use crate::error::{Error, Result};
use crate::pack::Packer;
use crate::reader::read_rows;

impl Stream {
    /// The next item of packed rows, or `None` at the end of the pass (the last item may be
    /// short unless `drop_last`).
    pub(super) fn next_packed(&mut self) -> Result<Option<RecordBatch>> {
        let n = crate::pack::item_rows(self.settings.batch_size)?;
        let mut packer = self.pack.take().expect("a packing stream");
        let out = self.pack_rows(&mut packer, n, None);
        self.pack = Some(packer);
        match out? {
            Some(b) if !(self.settings.drop_last && b.num_rows() < n) => Ok(Some(b)),
            _ => {
                self.ended = true;
                Ok(None)
            }
        }
    }

    /// Up to `n` packed rows of the documents before epoch `until` (a source packing inside a
    /// mixture: its epochs are capped there); fewer, or `None`, only when its input has ended.
    pub fn next_packed_rows(
        &mut self,
        n: usize,
        until: Option<u64>,
    ) -> Result<Option<RecordBatch>> {
        let mut packer = self.pack.take().ok_or_else(|| {
            Error::Internal("next_packed_rows on a stream without packing".into())
        })?;
        let out = self.pack_rows(&mut packer, n, until);
        self.pack = Some(packer);
        out
    }

    fn pack_rows(
        &mut self,
        p: &mut Packer,
        n: usize,
        until: Option<u64>,
    ) -> Result<Option<RecordBatch>> {
        if let Some(ids) = p.needs_rows() {
            // The pending documents of a resumed state: read just those rows again.
            let threads = self.opts.readahead_threads.max(1);
            let batches = read_rows(&self.catalog, &ids, self.opts.read_batch_rows, threads)?;
            p.hydrate(&ids, &batches)?;
        }
        // The epoch in which reads began to add no document (all empty, or dropped as too
        // long): once a whole later epoch has added none, no document ever will, and an
        // endless stream would read forever without making a row.
        let mut barren_since: Option<u64> = None;
        let mut more = |p: &mut Packer| -> Result<bool> {
            let want = match until {
                Some(_) => p
                    .pull_rows()
                    .min(self.rows_ahead(until).min(usize::MAX as u64) as usize),
                None => p.pull_rows(),
            };
            if want == 0 {
                return Ok(false);
            }
            match self.next_batch(want)? {
                None => Ok(false),
                Some(b) => {
                    let ids = std::mem::take(&mut self.ids);
                    let before = p.queued();
                    p.take(&b, &ids)?;
                    self.ids = ids;
                    if p.queued() > before {
                        barren_since = None;
                    } else if self.epoch >= *barren_since.get_or_insert(self.epoch) + 2 {
                        let s = p.settings();
                        return Err(Error::Config(format!(
                            "Pack: a whole epoch gave the packer no document: every row's {:?} \
                             is empty{} (the stream would read forever without making a row)",
                            s.column,
                            if s.long_docs == "drop" {
                                format!(" or longer than seq_len={} (long_docs='drop')", s.seq_len)
                            } else {
                                String::new()
                            }
                        )));
                    }
                    Ok(true)
                }
            }
        };
        p.emit(n, &mut more)
    }
}

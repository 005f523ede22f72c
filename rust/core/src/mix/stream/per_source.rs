//! Packing per source, then mixing packed rows: each source's stream packs its own documents
//! (`stream/packed.rs`, its packer's pending documents in its own stream state), and the mixer
//! picks each next packed row's source exactly as it picks rows without packing, so the weights
//! are proportions of packed rows, i.e. of tokens, each source within one row of its target in
//! every prefix since the last rebase.
//!
//! A packing source's rows are not countable ahead (they depend on its documents' lengths), so
//! it counts as unbounded until its packer cannot make a row when the mixer picks it: then that
//! choice is taken back (`Mixer::unpeek`), the source is marked run out and the mixer decides
//! again, so the boundary applies its policy right there (`drop`: it leaves and the others
//! rebase). This happens at the same item in the uninterrupted run and in every resumed one (the
//! discovery depends only on the source's stream state and the mixer's), so resume stays exact;
//! what differs from unpacked sources is that slots find a source run out at different items.

use std::sync::Arc;

use arrow_array::{Array, FixedSizeListArray, Int32Array, RecordBatch};
use arrow_schema::{DataType, Field};
use arrow_select::concat::concat_batches;

use super::{in_source, MixItem, MixStream};
use crate::error::{Error, Result};
use crate::mix::rule::{Avail, Mixer};

/// What the mixer may count on: a packing source in the mix is unbounded until found run out
/// (`dry`), one out of the mix has nothing.
pub(super) fn avail(mixer: &Mixer, dry: &[bool]) -> Avail {
    Avail {
        left: mixer
            .active()
            .iter()
            .enumerate()
            .map(|(s, a)| {
                if *a && !dry.get(s).copied().unwrap_or(false) {
                    u64::MAX
                } else {
                    0
                }
            })
            .collect(),
    }
}

impl MixStream {
    /// The next item of `batch_size` packed rows (one in row mode), each from one source, in
    /// mixing order; `None` at the end.
    pub(super) fn next_source_packed(&mut self) -> Result<Option<MixItem>> {
        if self.ended {
            return Ok(None);
        }
        let n = crate::pack::item_rows(self.cfg.settings.batch_size)?;
        let k = self.streams.len();
        let mut dry = vec![false; k];
        let mut rows: Vec<RecordBatch> = Vec::with_capacity(n.min(1 << 12));
        let mut tags: Vec<u16> = Vec::with_capacity(n.min(1 << 12));
        while rows.len() < n {
            let mut a = avail(&self.mixer, &dry);
            let Some(s) = self.mixer.peek(&a) else {
                break;
            };
            let until = self.cfg.until(s);
            let row = self.streams[s]
                .next_packed_rows(1, until)
                .map_err(|e| in_source(&self.cfg.sources[s].name, e))?;
            match row {
                Some(b) => {
                    self.mixer.take(&mut a);
                    rows.push(b);
                    tags.push(s as u16);
                }
                None => {
                    // Run out: decide this item again with the source's policy applied.
                    dry[s] = true;
                    self.mixer.unpeek();
                }
            }
        }
        if rows.is_empty() || (self.cfg.settings.drop_last && rows.len() < n) {
            self.ended = true;
            return Ok(None);
        }
        Ok(Some(MixItem::Mixed(self.tagged(&rows, &tags)?)))
    }

    /// The rows as one batch, plus `source_ids`: each real token's row source, -1 on padding.
    fn tagged(&self, rows: &[RecordBatch], tags: &[u16]) -> Result<RecordBatch> {
        let internal = |e: arrow_schema::ArrowError| Error::Internal(format!("packed rows: {e}"));
        let p = self.cfg.source_pack.as_ref().expect("packing sources");
        let schema = p.schema();
        let b = concat_batches(&schema, rows).map_err(internal)?;
        let seg = b
            .column_by_name("segment_ids")
            .and_then(|c| c.as_any().downcast_ref::<FixedSizeListArray>())
            .ok_or_else(|| Error::Internal("packed rows without segment_ids".into()))?;
        let seg = seg
            .values()
            .as_any()
            .downcast_ref::<Int32Array>()
            .ok_or_else(|| Error::Internal("segment_ids are not int32".into()))?;
        let len = p.seq_len as usize;
        let src: Vec<i32> = seg
            .values()
            .iter()
            .enumerate()
            .map(|(i, &g)| if g > 0 { i32::from(tags[i / len]) } else { -1 })
            .collect();
        let list = FixedSizeListArray::try_new(
            Arc::new(Field::new("item", DataType::Int32, false)),
            len as i32,
            Arc::new(Int32Array::from(src)),
            None,
        )
        .map_err(internal)?;
        let mut cols = b.columns().to_vec();
        cols.push(Arc::new(list));
        RecordBatch::try_new(self.cfg.schema.clone(), cols).map_err(internal)
    }
}

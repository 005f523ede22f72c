//! The packer's part of a slot's state (`state['position']['pack']`) and of the settings
//! (`state['settings']['pack']`): pending documents as row references, never tokens.
//!
//! A pending document is `(row id, start, end)` in the document's token sequence (BOS/EOS
//! included): the tail of a document that spans packed rows, or a whole document waiting in
//! the bin packer's window. Rows are stored as base64 ids in queue order; only references that
//! are not a whole document are listed in `spans` as `[index, start, end]` (`end = 0`: to the
//! document's end). So a state holds 8 bytes per pending document, whatever `seq_len` is; on
//! resume the rows are read again and each reference checked against its row's length.

use serde::{Deserialize, Serialize};

use super::{ids_from_base64, ids_to_base64};
use crate::error::{Error, Result};

/// One pending document: tokens `start..end` of row `row` (`end = None`: to the end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DocRef {
    pub row: u64,
    pub start: u64,
    pub end: Option<u64>,
}

/// The saved queue of pending documents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackRecord {
    pub rows: String,
    pub spans: Vec<[u64; 3]>,
}

impl PackRecord {
    pub fn of(refs: &[DocRef]) -> Self {
        let ids: Vec<u64> = refs.iter().map(|r| r.row).collect();
        let spans = refs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.start != 0 || r.end.is_some())
            .map(|(i, r)| [i as u64, r.start, r.end.unwrap_or(0)])
            .collect();
        PackRecord {
            rows: ids_to_base64(&ids),
            spans,
        }
    }

    /// The references, checked for shape (spans in order, `start < end`); that each span fits
    /// its row is checked when the rows are read. A row may be pending more than once: the
    /// packer's window can hold the same row of two epochs (a slot with fewer rows an epoch
    /// than the packer reads ahead).
    pub fn refs(&self, what: &str) -> Result<Vec<DocRef>> {
        let ids = ids_from_base64(&self.rows, &format!("{what}['rows']"))?;
        apply_spans(&ids, &self.spans, what)
    }
}

/// References of `ids` with `spans` applied, checked for shape.
fn apply_spans(ids: &[u64], spans: &[[u64; 3]], what: &str) -> Result<Vec<DocRef>> {
    let mut refs: Vec<DocRef> = ids
        .iter()
        .map(|&row| DocRef {
            row,
            start: 0,
            end: None,
        })
        .collect();
    let mut last = None;
    for (k, &[i, start, end]) in spans.iter().enumerate() {
        let w = format!("{what}['spans'][{k}]");
        if i as usize >= refs.len() || last.is_some_and(|l| i <= l) {
            return Err(Error::State(format!(
                "{w}: index {i} is not an increasing index into the {} pending rows",
                refs.len()
            )));
        }
        if end != 0 && start >= end {
            return Err(Error::State(format!(
                "{w}: [{i}, {start}, {end}] needs start < end (or end = 0: to the end)"
            )));
        }
        last = Some(i);
        refs[i as usize].start = start;
        refs[i as usize].end = (end != 0).then_some(end);
    }
    Ok(refs)
}

/// The saved queue of a packer after a mixture (`state['pack']` of a mixture state): as
/// [`PackRecord`], plus each pending document's source as runs `[name, count]` in queue order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixPackRecord {
    pub rows: String,
    pub spans: Vec<[u64; 3]>,
    pub sources: Vec<(String, u64)>,
}

impl MixPackRecord {
    pub fn of(refs: &[(String, DocRef)]) -> Self {
        let plain: Vec<DocRef> = refs.iter().map(|(_, r)| *r).collect();
        let p = PackRecord::of(&plain);
        let mut sources: Vec<(String, u64)> = Vec::new();
        for (n, _) in refs {
            match sources.last_mut() {
                Some((last, k)) if last == n => *k += 1,
                _ => sources.push((n.clone(), 1)),
            }
        }
        MixPackRecord {
            rows: p.rows,
            spans: p.spans,
            sources,
        }
    }

    /// The references by source name, checked for shape (runs covering the rows, spans in
    /// order, `start < end`); a (source, row) may be pending more than once, as in
    /// [`PackRecord::refs`].
    pub fn refs(&self, what: &str) -> Result<Vec<(String, DocRef)>> {
        let ids = ids_from_base64(&self.rows, &format!("{what}['rows']"))?;
        let total = self
            .sources
            .iter()
            .try_fold(0u64, |a, (_, k)| a.checked_add(*k));
        if total != Some(ids.len() as u64) || self.sources.iter().any(|(_, k)| *k == 0) {
            return Err(Error::State(format!(
                "{what}['sources']: runs [name, count] must be positive and cover the {} \
                 pending rows",
                ids.len()
            )));
        }
        let names: Vec<&String> = self
            .sources
            .iter()
            .flat_map(|(n, k)| std::iter::repeat_n(n, *k as usize))
            .collect();
        let refs = apply_spans(&ids, &self.spans, what)?;
        Ok(names.into_iter().cloned().zip(refs).collect())
    }
}

//! Test fixtures shared by the core's unit tests: small shard sets written with arrow-rs, and
//! helpers that read the `id` column out of a stream.

use std::sync::Arc;

use arrow_array::types::Int32Type;
use arrow_array::{ArrayRef, Int64Array, ListArray, RecordBatch, StringArray};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

use crate::stream::Stream;

/// Shards with uneven row groups (arrow-rs writes an offset index by default).
pub(crate) fn write_shards(dir: &std::path::Path, rows: &[usize], rg: usize) -> Vec<String> {
    write_shards_with(dir, rows, rg, true)
}

/// [`write_shards`], with or without a page index (offset and column index).
pub(crate) fn write_shards_with(
    dir: &std::path::Path,
    rows: &[usize],
    rg: usize,
    page_index: bool,
) -> Vec<String> {
    write_shards_from(dir, rows, rg, page_index, 0)
}

/// [`write_shards_with`], ids (and the values derived from them) starting at `first_id`.
pub(crate) fn write_shards_from(
    dir: &std::path::Path,
    rows: &[usize],
    rg: usize,
    page_index: bool,
    first_id: i64,
) -> Vec<String> {
    let mut id = first_id;
    let mut out = Vec::new();
    for (i, &n) in rows.iter().enumerate() {
        let path = dir.join(format!("s{i:03}.parquet"));
        let ids: Vec<i64> = (id..id + n as i64).collect();
        id += n as i64;
        let tokens = ListArray::from_iter_primitive::<Int32Type, _, _>(ids.iter().map(|&x| {
            Some(
                (0..(x % 5) as i32)
                    .map(|k| Some(x as i32 + k))
                    .collect::<Vec<_>>(),
            )
        }));
        let text = StringArray::from_iter_values(ids.iter().map(|x| format!("row-{x}")));
        let batch = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(ids)) as ArrayRef),
            ("tokens", Arc::new(tokens) as ArrayRef),
            ("text", Arc::new(text) as ArrayRef),
        ])
        .unwrap();
        let mut props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(rg.max(1)))
            .set_data_page_row_count_limit(7)
            .set_write_batch_size(7);
        if !page_index {
            // Page statistics would bring the offset index back with the column index.
            props = props
                .set_statistics_enabled(parquet::file::properties::EnabledStatistics::Chunk)
                .set_offset_index_disabled(true);
        }
        let props = props.build();
        let mut w = ArrowWriter::try_new(
            std::fs::File::create(&path).unwrap(),
            batch.schema(),
            Some(props),
        )
        .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        out.push(path.display().to_string());
    }
    out
}

pub(crate) fn ids(b: &RecordBatch) -> Vec<i64> {
    let col = b.column_by_name("id").unwrap();
    col.as_any()
        .downcast_ref::<Int64Array>()
        .unwrap()
        .values()
        .to_vec()
}

pub(crate) fn drain_ids(s: &mut Stream, bs: usize) -> Vec<Vec<i64>> {
    let mut out = Vec::new();
    while let Some(b) = s.next_batch(bs).unwrap() {
        out.push(ids(&b));
    }
    out
}

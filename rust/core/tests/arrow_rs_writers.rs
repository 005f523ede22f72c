//! Reliability corpus, arrow-rs side: files written by arrow-rs' own `ArrowWriter` with every
//! writer knob that changes the bytes on disk (encodings, compressions, data page v1/v2,
//! dictionary on/off, tiny pages, one-row row groups, no statistics, no offset index), over
//! nested and nullable columns. Each file set must read back to exactly the rows written — in
//! order without a shuffle buffer, as the same rows with one — and resume exactly from several
//! positions. (The pyarrow-written corpus is tests/test_reliability_corpus.py.)

use std::sync::Arc;

use arrow_array::builder::{Int32Builder, ListBuilder, StringDictionaryBuilder};
use arrow_array::types::Int32Type;
use arrow_array::{
    ArrayRef, BooleanArray, Float32Array, Float64Array, Int32Array, Int64Array, RecordBatch,
    StringArray, StructArray,
};
use arrow_schema::{DataType, Field};
use parquet::arrow::ArrowWriter;
use parquet::basic::{BrotliLevel, Compression, Encoding, GzipLevel, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;
use shardstream_core::{Catalog, Slot, Stream, StreamOptions};

/// Rows `first..first + n`: every column a function of the id, with nulls and empty lists.
fn table(first: i64, n: usize) -> RecordBatch {
    let ids: Vec<i64> = (first..first + n as i64).collect();
    let mut tokens = ListBuilder::new(Int32Builder::new());
    for &id in &ids {
        if id % 11 == 3 {
            tokens.append_null();
        } else {
            for k in 0..(id % 6) as i32 {
                tokens
                    .values()
                    .append_option((k != 2).then_some(id as i32 * 10 + k));
            }
            tokens.append(true);
        }
    }
    let text =
        StringArray::from_iter(ids.iter().map(|id| {
            (id % 7 != 0).then(|| format!("row-{id}-{}", "é".repeat((id % 4) as usize)))
        }));
    let score = Float64Array::from_iter(
        ids.iter()
            .map(|&id| (id % 5 != 1).then_some(id as f64 * 0.25 - 3.0)),
    );
    let small = Float32Array::from_iter_values(ids.iter().map(|&id| id as f32 / 3.0));
    let flag = BooleanArray::from_iter(ids.iter().map(|&id| (id % 9 != 8).then_some(id % 3 == 0)));
    let mut cat = StringDictionaryBuilder::<Int32Type>::new();
    for &id in &ids {
        cat.append_value(["red", "green", "blue"][(id % 3) as usize]);
    }
    let pair = StructArray::from(vec![
        (
            Arc::new(Field::new("a", DataType::Int32, true)),
            Arc::new(Int32Array::from_iter(
                ids.iter().map(|&id| (id % 4 != 0).then_some(-(id as i32))),
            )) as ArrayRef,
        ),
        (
            Arc::new(Field::new("b", DataType::Utf8, false)),
            Arc::new(StringArray::from_iter_values(
                ids.iter().map(|id| format!("b{id}")),
            )) as ArrayRef,
        ),
    ]);
    RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(ids)) as ArrayRef),
        ("tokens", Arc::new(tokens.finish()) as ArrayRef),
        ("text", Arc::new(text) as ArrayRef),
        ("score", Arc::new(score) as ArrayRef),
        ("small", Arc::new(small) as ArrayRef),
        ("flag", Arc::new(flag) as ArrayRef),
        ("cat", Arc::new(cat.finish()) as ArrayRef),
        ("pair", Arc::new(pair) as ArrayRef),
    ])
    .unwrap()
}

fn col(name: &str) -> ColumnPath {
    ColumnPath::from(name)
}

/// Writer configurations: each changes what the bytes on disk look like.
fn configs() -> Vec<(&'static str, WriterProperties)> {
    let b = WriterProperties::builder;
    vec![
        ("defaults", b().build()),
        (
            "plain-v1-uncompressed",
            b().set_dictionary_enabled(false)
                .set_encoding(Encoding::PLAIN)
                .set_compression(Compression::UNCOMPRESSED)
                .build(),
        ),
        (
            "dictionary-snappy",
            b().set_dictionary_enabled(true)
                .set_compression(Compression::SNAPPY)
                .build(),
        ),
        (
            "v2-pages-zstd-delta",
            b().set_writer_version(WriterVersion::PARQUET_2_0)
                .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).unwrap()))
                .set_dictionary_enabled(false)
                .set_column_encoding(col("id"), Encoding::DELTA_BINARY_PACKED)
                .set_column_encoding(col("text"), Encoding::DELTA_BYTE_ARRAY)
                .set_column_encoding(
                    ColumnPath::new(vec!["pair".into(), "b".into()]),
                    Encoding::DELTA_LENGTH_BYTE_ARRAY,
                )
                .build(),
        ),
        (
            "byte-stream-split-lz4",
            b().set_dictionary_enabled(false)
                .set_compression(Compression::LZ4_RAW)
                .set_column_encoding(col("score"), Encoding::BYTE_STREAM_SPLIT)
                .set_column_encoding(col("small"), Encoding::BYTE_STREAM_SPLIT)
                .build(),
        ),
        (
            "tiny-pages-gzip-no-stats-no-offset-index",
            b().set_compression(Compression::GZIP(GzipLevel::default()))
                .set_data_page_row_count_limit(3)
                .set_write_batch_size(3)
                .set_dictionary_page_size_limit(64)
                .set_statistics_enabled(EnabledStatistics::None)
                .set_offset_index_disabled(true)
                .build(),
        ),
        (
            "one-row-row-groups-brotli-v2",
            b().set_writer_version(WriterVersion::PARQUET_2_0)
                .set_compression(Compression::BROTLI(BrotliLevel::default()))
                .set_max_row_group_row_count(Some(1))
                .build(),
        ),
        (
            "chunk-stats-small-row-groups",
            b().set_statistics_enabled(EnabledStatistics::Chunk)
                .set_max_row_group_row_count(Some(9))
                .set_data_page_row_count_limit(4)
                .set_write_batch_size(4)
                .build(),
        ),
    ]
}

fn write(dir: &std::path::Path, props: &WriterProperties) -> (Vec<String>, RecordBatch) {
    let mut files = Vec::new();
    let mut parts = Vec::new();
    for (i, (first, n)) in [(0i64, 37usize), (37, 53), (90, 1)].into_iter().enumerate() {
        let batch = table(first, n);
        let path = dir.join(format!("part-{i}.parquet"));
        let mut w = ArrowWriter::try_new(
            std::fs::File::create(&path).unwrap(),
            batch.schema(),
            Some(props.clone()),
        )
        .unwrap();
        // Several writes, so row groups and pages split at odd places.
        for off in (0..n).step_by(10) {
            w.write(&batch.slice(off, 10.min(n - off))).unwrap();
        }
        w.close().unwrap();
        files.push(path.display().to_string());
        parts.push(batch);
    }
    let all = arrow_select::concat::concat_batches(&parts[0].schema(), &parts).unwrap();
    (files, all)
}

fn opts(shuffle: usize, threads: usize) -> StreamOptions {
    StreamOptions {
        seed: 5,
        shuffle_buffer: shuffle,
        epochs: Some(2),
        read_batch_rows: 4,
        readahead_threads: threads,
        piece_rows: 5,
        ..Default::default()
    }
}

fn drain(s: &mut Stream, bs: usize) -> Vec<RecordBatch> {
    let mut out = Vec::new();
    while let Some(b) = s.next_batch(bs).unwrap() {
        out.push(b);
    }
    out
}

fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .values()
                .to_vec()
        })
        .collect()
}

/// Output rows reordered by id, as one batch (to compare a shuffled epoch with the written rows).
fn by_id(batches: &[RecordBatch]) -> RecordBatch {
    let all = arrow_select::concat::concat_batches(&batches[0].schema(), batches).unwrap();
    let ids = ids(std::slice::from_ref(&all));
    let mut order: Vec<u32> = (0..ids.len() as u32).collect();
    order.sort_by_key(|&i| ids[i as usize]);
    arrow_select::take::take_record_batch(&all, &arrow_array::UInt32Array::from(order)).unwrap()
}

fn same_rows(got: &RecordBatch, want: &RecordBatch, what: &str) {
    assert_eq!(got.num_rows(), want.num_rows(), "{what}: row count");
    for (i, f) in want.schema().fields().iter().enumerate() {
        assert_eq!(
            got.column(i).as_ref(),
            want.column(i).as_ref(),
            "{what}: column {}",
            f.name()
        );
    }
}

#[test]
fn arrow_rs_written_files_read_and_resume_exactly() {
    for (name, props) in configs() {
        let dir = tempfile::tempdir().unwrap();
        let (files, written) = write(dir.path(), &props);
        let cat = Arc::new(Catalog::open(&files, None).unwrap());
        assert_eq!(cat.total_rows(), 91, "{name}");
        let slot = Slot::new(0, 1).unwrap();
        for shuffle in [0usize, 13] {
            for threads in [0usize, 2] {
                let what = format!("{name}, shuffle {shuffle}, readahead {threads}");
                let reference = drain(
                    &mut Stream::new(cat.clone(), opts(shuffle, threads), slot).unwrap(),
                    6,
                );
                // Two epochs, 91 rows each, batches never spanning an epoch.
                let per_epoch = reference.len() / 2;
                let (first, second) = reference.split_at(per_epoch);
                for epoch in [first, second] {
                    if shuffle == 0 {
                        let got = arrow_select::concat::concat_batches(&epoch[0].schema(), epoch)
                            .unwrap();
                        same_rows(&got, &written, &what);
                    } else {
                        same_rows(&by_id(epoch), &written, &what);
                    }
                }
                // Resume from several points (including mid-second-epoch) continues exactly.
                for cut in [
                    0,
                    1,
                    per_epoch / 2,
                    per_epoch,
                    per_epoch + 3,
                    reference.len() - 1,
                ] {
                    let mut s = Stream::new(cat.clone(), opts(shuffle, threads), slot).unwrap();
                    for _ in 0..cut {
                        s.next_batch(6).unwrap();
                    }
                    let st = s.state();
                    let mut resumed =
                        Stream::new(cat.clone(), opts(shuffle, threads), slot).unwrap();
                    resumed.restore(&st).unwrap();
                    let rest = drain(&mut resumed, 6);
                    assert_eq!(rest.len(), reference.len() - cut, "{what}: cut {cut}");
                    for (a, b) in rest.iter().zip(&reference[cut..]) {
                        same_rows(a, b, &format!("{what}: resumed at batch {cut}"));
                    }
                }
            }
        }
    }
}

/// Offset index presence follows the writer: seeking works with and without it.
#[test]
fn offset_index_presence_is_detected() {
    for (name, props) in configs() {
        let dir = tempfile::tempdir().unwrap();
        let (files, _) = write(dir.path(), &props);
        let cat = Catalog::open(&files, None).unwrap();
        let expect = !name.contains("no-offset-index");
        for s in cat.shards() {
            assert_eq!(s.has_offset_index(), expect, "{name}: {}", s.rel_path);
        }
    }
}

/// The remote read path (object_store + arrow-rs's push decoder, `reader::open_remote_row_group`)
/// over `file://` URLs must give exactly what the local path gives, for every writer config:
/// same fingerprint (a state moves between a local copy and an object-store copy), same batches,
/// and a state saved on the local catalog resumes exactly on the URL one.
#[test]
fn file_urls_take_the_object_store_path_and_match_local_reads() {
    for (name, props) in configs() {
        let dir = tempfile::tempdir().unwrap();
        let (files, _) = write(dir.path(), &props);
        let local = Arc::new(Catalog::open(&files, None).unwrap());
        let url = format!("file://{}/", dir.path().display());
        let remote = Arc::new(
            Catalog::open_with(&[url], None, &Default::default()).unwrap_or_else(|e| panic!("{e}")),
        );
        assert!(remote.is_remote() && !local.is_remote());
        assert_eq!(remote.fingerprint(), local.fingerprint(), "{name}");
        let slot = Slot::new(0, 1).unwrap();
        for shuffle in [0usize, 13] {
            for threads in [0usize, 2] {
                let what = format!("{name} over file://, shuffle {shuffle}, readahead {threads}");
                let reference = drain(
                    &mut Stream::new(local.clone(), opts(shuffle, threads), slot).unwrap(),
                    6,
                );
                let got = drain(
                    &mut Stream::new(remote.clone(), opts(shuffle, threads), slot).unwrap(),
                    6,
                );
                assert_eq!(got.len(), reference.len(), "{what}");
                for (a, b) in got.iter().zip(&reference) {
                    same_rows(a, b, &what);
                }
                for cut in [1, reference.len() / 2 + 1, reference.len() - 1] {
                    let mut s = Stream::new(local.clone(), opts(shuffle, threads), slot).unwrap();
                    for _ in 0..cut {
                        s.next_batch(6).unwrap();
                    }
                    let mut resumed =
                        Stream::new(remote.clone(), opts(shuffle, threads), slot).unwrap();
                    resumed.restore(&s.state()).unwrap();
                    let rest = drain(&mut resumed, 6);
                    assert_eq!(rest.len(), reference.len() - cut, "{what}: cut {cut}");
                    for (a, b) in rest.iter().zip(&reference[cut..]) {
                        same_rows(a, b, &format!("{what}: resumed at batch {cut}"));
                    }
                }
            }
        }
        assert!(
            remote.stats().bytes > 0 && local.stats().bytes == 0,
            "{name}"
        );
    }
}

/// A deep resume fetches a small fraction of what reading from the start fetches: the footer
/// was read at open, and the offset index lets the push decoder ask only for the pages that hold
/// the rows after the resume point.
#[test]
fn deep_remote_resume_fetches_a_small_fraction_of_the_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(100_000))
        .set_data_page_row_count_limit(500)
        .set_write_batch_size(500)
        .build();
    let batch = table(0, 400_000);
    let path = dir.path().join("big.parquet");
    let mut w = ArrowWriter::try_new(
        std::fs::File::create(&path).unwrap(),
        batch.schema(),
        Some(props),
    )
    .unwrap();
    for off in (0..400_000).step_by(10_000) {
        w.write(&batch.slice(off, 10_000)).unwrap();
    }
    w.close().unwrap();
    let url = format!("file://{}", path.display());
    let cat = Arc::new(Catalog::open_with(&[url], None, &Default::default()).unwrap());
    let slot = Slot::new(0, 1).unwrap();
    let o = StreamOptions {
        epochs: Some(1),
        read_batch_rows: 1024,
        ..Default::default()
    };
    let opened = cat.stats().bytes;
    let all = drain(
        &mut Stream::new(cat.clone(), o.clone(), slot).unwrap(),
        1000,
    );
    assert_eq!(ids(&all), (0..400_000).collect::<Vec<i64>>());
    let full = cat.stats().bytes - opened;

    // 90% in, positioned on coordinates only (nothing read), then one batch.
    let mut s = Stream::new(cat.clone(), o.clone(), slot).unwrap();
    s.skip(360, 1000, false).unwrap();
    let st = s.state();
    let mut resumed = Stream::new(cat.clone(), o, slot).unwrap();
    resumed.restore(&st).unwrap();
    let before = cat.stats().bytes;
    let first = resumed.next_batch(1000).unwrap().unwrap();
    let deep = cat.stats().bytes - before;
    assert_eq!(ids(&[first]), (360_000..361_000).collect::<Vec<i64>>());
    let ratio = deep as f64 / full as f64;
    eprintln!(
        "deep resume fetched {deep} of {full} bytes ({:.2}%)",
        ratio * 100.0
    );
    assert!(
        deep > 0 && ratio < 0.05,
        "deep resume fetched {deep} of {full} bytes"
    );
}

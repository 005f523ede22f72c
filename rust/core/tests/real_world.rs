//! Shard sets as real users have them (issue 13): narrow dictionary keys with different
//! dictionaries per shard, schemas that differ only in presentation, files replaced while a
//! stream is open. Each is read through the stream exactly (concatenated batches and the
//! shuffle buffer's gathers), or refused with an error naming the file.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int16Type, Int8Type, UInt8Type};
use arrow_array::{
    Array, ArrayRef, DictionaryArray, Int64Array, ListArray, NullArray, RecordBatch, StringArray,
};
use arrow_schema::{DataType, Field};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use shardstream_core::{Catalog, Slot, Stream, StreamOptions};

fn write(path: &std::path::Path, batch: &RecordBatch, rg: usize) -> String {
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(rg))
        .build();
    let mut w = ArrowWriter::try_new(
        std::fs::File::create(path).unwrap(),
        batch.schema(),
        Some(props),
    )
    .unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
    path.display().to_string()
}

/// Every row as (id, value of column `col` as a string or None), in stream order.
fn drain(
    files: &[String],
    opts: StreamOptions,
    bs: usize,
    col: &str,
) -> Vec<(i64, Option<String>)> {
    let cat = Arc::new(Catalog::open(files, None).unwrap());
    let mut s = Stream::new(cat, opts, Slot::new(0, 1).unwrap()).unwrap();
    let mut out = Vec::new();
    while let Some(b) = s.next_batch(bs).unwrap() {
        let ids = b
            .column_by_name("id")
            .unwrap()
            .as_primitive::<arrow_array::types::Int64Type>();
        let vals = arrow_cast::cast(b.column_by_name(col).unwrap(), &DataType::Utf8).unwrap();
        let vals = vals.as_string::<i32>();
        for i in 0..b.num_rows() {
            out.push((
                ids.value(i),
                vals.is_valid(i).then(|| vals.value(i).to_string()),
            ));
        }
    }
    out
}

/// Shards whose dictionaries together hold more values than the keys can number.
fn dictionary_shards(
    dir: &std::path::Path,
    key: &DataType,
) -> (Vec<String>, Vec<(i64, Option<String>)>) {
    let mut files = Vec::new();
    let mut want = Vec::new();
    for s in 0..3i64 {
        let values = StringArray::from_iter_values((0..100).map(|k| format!("s{s}-v{k}")));
        let idx: Vec<Option<i64>> = (0..150)
            .map(|k| (k % 9 != 4).then_some((k * 7) % 100))
            .collect();
        let keys: ArrayRef = match key {
            DataType::Int8 => Arc::new(arrow_array::PrimitiveArray::<Int8Type>::from_iter(
                idx.iter().map(|k| k.map(|k| k as i8)),
            )),
            DataType::Int16 => Arc::new(arrow_array::PrimitiveArray::<Int16Type>::from_iter(
                idx.iter().map(|k| k.map(|k| k as i16)),
            )),
            _ => Arc::new(arrow_array::PrimitiveArray::<UInt8Type>::from_iter(
                idx.iter().map(|k| k.map(|k| k as u8)),
            )),
        };
        let dict: ArrayRef = match key {
            DataType::Int8 => Arc::new(
                DictionaryArray::<Int8Type>::try_new(
                    keys.as_primitive().clone(),
                    Arc::new(values.clone()),
                )
                .unwrap(),
            ),
            DataType::Int16 => Arc::new(
                DictionaryArray::<Int16Type>::try_new(
                    keys.as_primitive().clone(),
                    Arc::new(values.clone()),
                )
                .unwrap(),
            ),
            _ => Arc::new(
                DictionaryArray::<UInt8Type>::try_new(
                    keys.as_primitive().clone(),
                    Arc::new(values.clone()),
                )
                .unwrap(),
            ),
        };
        let ids = Int64Array::from_iter_values(s * 150..(s + 1) * 150);
        for (i, k) in idx.iter().enumerate() {
            want.push((ids.value(i), k.map(|k| format!("s{s}-v{k}"))));
        }
        let batch =
            RecordBatch::try_from_iter([("id", Arc::new(ids) as ArrayRef), ("d", dict)]).unwrap();
        files.push(write(&dir.join(format!("p{s}.parquet")), &batch, 40));
    }
    (files, want)
}

#[test]
fn narrow_dictionary_keys_across_shards_concat_and_gather() {
    for key in [DataType::Int8, DataType::Int16, DataType::UInt8] {
        let dir = tempfile::tempdir().unwrap();
        let (files, want) = dictionary_shards(dir.path(), &key);
        let cat = Catalog::open(&files, None).unwrap();
        assert_eq!(
            cat.schema().field_with_name("d").unwrap().data_type(),
            &DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            "{key}"
        );
        // One batch holding every row: concatenated across all three shards.
        let seq = StreamOptions {
            epochs: Some(1),
            ..Default::default()
        };
        assert_eq!(drain(&files, seq, 1000, "d"), want, "{key}");
        // Through the shuffle buffer: rows of all shards gathered into each batch.
        let shuffled = StreamOptions {
            shuffle_buffer: 300,
            epochs: Some(1),
            seed: 3,
            ..Default::default()
        };
        let mut got = drain(&files, shuffled, 97, "d");
        got.sort();
        let mut sorted = want.clone();
        sorted.sort();
        assert_eq!(got, sorted, "{key}");
    }
}

#[test]
fn null_typed_and_list_child_names_unify() {
    let dir = tempfile::tempdir().unwrap();
    let ids = |r: std::ops::Range<i64>| Arc::new(Int64Array::from_iter_values(r)) as ArrayRef;
    let list = |name: &str, vals: Vec<Option<Vec<Option<i32>>>>| -> ArrayRef {
        let l = ListArray::from_iter_primitive::<arrow_array::types::Int32Type, _, _>(vals);
        let (_, offsets, values, nulls) = l.into_parts();
        Arc::new(ListArray::new(
            Arc::new(Field::new(name, DataType::Int32, true)),
            offsets,
            values,
            nulls,
        ))
    };
    let a = RecordBatch::try_from_iter([
        ("id", ids(0..3)),
        ("s", Arc::new(NullArray::new(3)) as ArrayRef),
        (
            "l",
            list("item", vec![Some(vec![Some(1)]), None, Some(vec![])]),
        ),
    ])
    .unwrap();
    let b = RecordBatch::try_from_iter([
        ("id", ids(3..5)),
        (
            "s",
            Arc::new(StringArray::from(vec![Some("x"), None])) as ArrayRef,
        ),
        (
            "l",
            list(
                "element",
                vec![Some(vec![Some(2), None]), Some(vec![Some(3)])],
            ),
        ),
    ])
    .unwrap();
    let files = vec![
        write(&dir.path().join("a.parquet"), &a, 10),
        write(&dir.path().join("b.parquet"), &b, 10),
    ];
    let cat = Catalog::open(&files, None).unwrap();
    assert_eq!(
        cat.schema().field_with_name("s").unwrap().data_type(),
        &DataType::Utf8
    );
    let opts = StreamOptions {
        epochs: Some(1),
        ..Default::default()
    };
    let got = drain(&files, opts.clone(), 100, "s");
    assert_eq!(
        got,
        vec![
            (0, None),
            (1, None),
            (2, None),
            (3, Some("x".into())),
            (4, None)
        ]
    );
    let cat = Arc::new(Catalog::open(&files, None).unwrap());
    let mut s = Stream::new(cat, opts, Slot::new(0, 1).unwrap()).unwrap();
    let batch = s.next_batch(100).unwrap().unwrap();
    let l = batch.column_by_name("l").unwrap().as_list::<i32>();
    let rows: Vec<Option<Vec<Option<i32>>>> = (0..l.len())
        .map(|i| {
            l.is_valid(i).then(|| {
                l.value(i)
                    .as_primitive::<arrow_array::types::Int32Type>()
                    .iter()
                    .collect()
            })
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            Some(vec![Some(1)]),
            None,
            Some(vec![]),
            Some(vec![Some(2), None]),
            Some(vec![Some(3)])
        ]
    );
}

#[test]
fn a_shard_replaced_while_open_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (files, _) = dictionary_shards(dir.path(), &DataType::Int8);
    let cat = Arc::new(Catalog::open(&files, None).unwrap());
    let opts = StreamOptions {
        epochs: Some(1),
        readahead_threads: 0,
        ..Default::default()
    };
    let mut s = Stream::new(cat, opts, Slot::new(0, 1).unwrap()).unwrap();
    assert!(s.next_batch(10).unwrap().is_some());
    // Another file (same schema, other rows) renamed over the last shard.
    let other = tempfile::tempdir().unwrap();
    let (fresh, _) = dictionary_shards(other.path(), &DataType::Int8);
    std::fs::rename(&fresh[0], &files[2]).unwrap();
    let err = loop {
        match s.next_batch(50) {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("a replaced shard was read without error"),
            Err(e) => break e.to_string(),
        }
    };
    assert!(
        err.contains("p2.parquet") && err.contains("changed"),
        "{err}"
    );
}

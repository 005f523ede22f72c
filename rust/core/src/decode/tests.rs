//! The fast path against arrow-rs: files written by arrow-rs's `ArrowWriter` with random data
//! (nulls at every level, empty lists, every integer width), random writer settings (dictionary
//! on/off, data page v1/v2, tiny pages, plain/delta/byte-stream-split encodings, compressions)
//! read under random row selections and batch sizes must give exactly arrow-rs's arrays. Plus
//! corrupted page bytes, which must give errors, never panics.

use std::ops::Range;
use std::sync::Arc;

use arrow_array::builder::{GenericListBuilder, Int32Builder, PrimitiveBuilder, StringBuilder};
use arrow_array::types::{
    Float32Type, Int16Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{
    Array, ArrayRef, ArrowPrimitiveType, Float64Array, Int32Array, Int64Array, RecordBatch,
    StructArray,
};
use arrow_schema::{DataType, Field, Schema};
use bytes::Bytes;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection,
    RowSelector,
};
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::{Compression, Encoding};
use parquet::column::page::{Page, PageMetadata, PageReader};
use parquet::errors::Result;
use parquet::file::page_index::offset_index::PageLocation;
use parquet::file::properties::{WriterProperties, WriterVersion};
use parquet::file::reader::ChunkReader;
use parquet::file::serialized_reader::SerializedPageReader;
use parquet::schema::types::ColumnPath;
use proptest::prelude::*;

/// A small deterministic generator (splitmix64): tests need no RNG crate.
struct ChaCha8Rng(u64);

impl ChaCha8Rng {
    fn seed_from_u64(s: u64) -> Self {
        ChaCha8Rng(s)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn random_bool(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
    /// Uniform in `lo..hi`.
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % (hi - lo) as u64) as i64
    }
    fn random<T: FromBits>(&mut self) -> T {
        T::from_bits(self.next())
    }
}

trait FromBits {
    fn from_bits(b: u64) -> Self;
}
macro_rules! from_bits {
    ($($t:ty),*) => { $(impl FromBits for $t { fn from_bits(b: u64) -> Self { b as $t } })* };
}
from_bits!(i8, i16, i32, i64, u8, u16, u32, u64);
impl FromBits for f32 {
    fn from_bits(b: u64) -> Self {
        (b >> 40) as f32 / 7.0 - 1000.0
    }
}
impl FromBits for f64 {
    fn from_bits(b: u64) -> Self {
        (b >> 11) as f64 / 3.0 - 1e12
    }
}

use super::*;

/// Random values for one batch of `n` rows, deterministic in `seed`.
struct Gen {
    rng: ChaCha8Rng,
    /// Chance of a null (at each nullable level).
    nulls: f64,
}

impl Gen {
    fn null(&mut self) -> bool {
        self.rng.random_bool(self.nulls)
    }

    fn prim<T: ArrowPrimitiveType>(
        &mut self,
        n: usize,
        nullable: bool,
        mut v: impl FnMut(&mut ChaCha8Rng) -> T::Native,
    ) -> ArrayRef {
        let mut b = PrimitiveBuilder::<T>::new();
        for _ in 0..n {
            if nullable && self.null() {
                b.append_null();
            } else {
                b.append_value(v(&mut self.rng));
            }
        }
        Arc::new(b.finish())
    }

    /// Lists of 0..max items (few distinct values, so dictionaries form), null lists and null
    /// items when allowed.
    fn list<O: arrow_array::OffsetSizeTrait, T: ArrowPrimitiveType>(
        &mut self,
        n: usize,
        list_nullable: bool,
        item_nullable: bool,
        max: usize,
        mut v: impl FnMut(&mut ChaCha8Rng) -> T::Native,
    ) -> ArrayRef {
        let item = Field::new("item", T::DATA_TYPE, item_nullable);
        let mut b = GenericListBuilder::<O, _>::new(PrimitiveBuilder::<T>::new()).with_field(item);
        for _ in 0..n {
            if list_nullable && self.null() {
                b.append(false);
                continue;
            }
            let len = self.rng.range(0, max as i64 + 1) as usize;
            for _ in 0..len {
                if item_nullable && self.null() {
                    b.values().append_null();
                } else {
                    b.values().append_value(v(&mut self.rng));
                }
            }
            b.append(true);
        }
        Arc::new(b.finish())
    }
}

/// Column names of [`table`], and whether the fast path should take each (given an offset index
/// and only plain/dictionary encodings).
const COLUMNS: &[(&str, bool)] = &[
    ("i32", true),
    ("i64", true),
    ("f64", true),
    ("i8", true),
    ("u16", true),
    ("u32", true),
    ("u64", true),
    ("tokens", true),
    ("req_list", true),
    ("large", true),
    ("small_ints", true),
    ("text", false),
    ("pair", false),
    ("i16_req", true),
    ("u8", true),
];

fn table(seed: u64, n: usize, nulls: f64) -> RecordBatch {
    let mut g = Gen {
        rng: ChaCha8Rng::seed_from_u64(seed),
        nulls,
    };
    let few = |r: &mut ChaCha8Rng| r.range(0, 20);
    let cols: Vec<(Field, ArrayRef)> = vec![
        (
            Field::new("i32", DataType::Int32, true),
            g.prim::<arrow_array::types::Int32Type>(n, true, |r| r.random()),
        ),
        (
            Field::new("i64", DataType::Int64, false),
            g.prim::<arrow_array::types::Int64Type>(n, false, |r| r.range(-5, 5)),
        ),
        (
            Field::new("f64", DataType::Float64, true),
            g.prim::<arrow_array::types::Float64Type>(n, true, |r| r.random()),
        ),
        (
            Field::new("i8", DataType::Int8, true),
            g.prim::<Int8Type>(n, true, |r| r.random()),
        ),
        (
            Field::new("u16", DataType::UInt16, true),
            g.prim::<UInt16Type>(n, true, |r| r.random()),
        ),
        (
            Field::new("u32", DataType::UInt32, false),
            g.prim::<UInt32Type>(n, false, |r| r.random()),
        ),
        (
            Field::new("u64", DataType::UInt64, true),
            g.prim::<UInt64Type>(n, true, |r| r.random()),
        ),
        {
            let a = g.list::<i32, arrow_array::types::Int32Type>(n, true, true, 12, |r| {
                r.range(0, 1000) as i32
            });
            (Field::new("tokens", a.data_type().clone(), true), a)
        },
        {
            let a =
                g.list::<i32, arrow_array::types::Int64Type>(n, false, false, 5, |r| r.random());
            (Field::new("req_list", a.data_type().clone(), false), a)
        },
        {
            let a = g.list::<i64, Float32Type>(n, true, true, 4, |r| r.random());
            (Field::new("large", a.data_type().clone(), true), a)
        },
        {
            let a = g.list::<i32, UInt8Type>(n, true, false, 40, |r| few(r) as u8);
            (Field::new("small_ints", a.data_type().clone(), true), a)
        },
        {
            let mut b = StringBuilder::new();
            for i in 0..n {
                if g.null() {
                    b.append_null();
                } else {
                    b.append_value(format!("s{}", i % 7));
                }
            }
            (
                Field::new("text", DataType::Utf8, true),
                Arc::new(b.finish()) as ArrayRef,
            )
        },
        {
            let inner = g.prim::<arrow_array::types::Int32Type>(n, true, |r| r.random());
            let s = StructArray::from(vec![(
                Arc::new(Field::new("x", DataType::Int32, true)),
                inner,
            )]);
            (
                Field::new("pair", s.data_type().clone(), false),
                Arc::new(s) as ArrayRef,
            )
        },
        (
            Field::new("i16_req", DataType::Int16, false),
            g.prim::<Int16Type>(n, false, |r| r.random()),
        ),
        (
            Field::new("u8", DataType::UInt8, true),
            g.prim::<UInt8Type>(n, true, |r| r.random()),
        ),
    ];
    let (fields, arrays): (Vec<Field>, Vec<ArrayRef>) = cols.into_iter().unzip();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap()
}

#[derive(Debug, Clone)]
struct Settings {
    dictionary: bool,
    v2: bool,
    page_rows: usize,
    row_group: usize,
    /// Encoding of values not in the dictionary: PLAIN, DELTA_BINARY_PACKED for the integers,
    /// BYTE_STREAM_SPLIT for floats, or the writer's default (for v2 pages: delta for integers).
    encoding: u8,
    compression: u8,
    /// Write the page index (offset index); pyarrow's default is not to.
    page_index: bool,
}

fn settings() -> impl Strategy<Value = Settings> {
    (
        any::<bool>(),
        any::<bool>(),
        1usize..60,
        1usize..400,
        0u8..4,
        0u8..3,
    )
        .prop_map(
            |(dictionary, v2, page_rows, row_group, encoding, compression)| Settings {
                dictionary,
                v2,
                page_rows,
                row_group,
                encoding,
                compression,
                page_index: true,
            },
        )
}

fn write(batch: &RecordBatch, s: &Settings) -> Bytes {
    let mut p = WriterProperties::builder()
        .set_dictionary_enabled(s.dictionary)
        .set_writer_version(if s.v2 {
            WriterVersion::PARQUET_2_0
        } else {
            WriterVersion::PARQUET_1_0
        })
        .set_data_page_row_count_limit(s.page_rows)
        .set_write_batch_size(s.page_rows)
        .set_max_row_group_row_count(Some(s.row_group))
        .set_compression(match s.compression {
            0 => Compression::UNCOMPRESSED,
            1 => Compression::SNAPPY,
            _ => Compression::ZSTD(Default::default()),
        });
    if !s.page_index {
        // Page statistics would bring the offset index back with the column index.
        p = p
            .set_statistics_enabled(parquet::file::properties::EnabledStatistics::Chunk)
            .set_offset_index_disabled(true);
    }
    if s.encoding == 0 {
        p = p.set_encoding(Encoding::PLAIN);
    }
    if s.encoding == 1 || s.encoding == 2 {
        for f in batch.schema().fields() {
            let leaf = |name: &str| match f.data_type() {
                DataType::List(_) | DataType::LargeList(_) => {
                    ColumnPath::new(vec![f.name().clone(), "list".into(), name.into()])
                }
                _ => ColumnPath::new(vec![f.name().clone()]),
            };
            let t = match f.data_type() {
                DataType::List(i) | DataType::LargeList(i) => i.data_type().clone(),
                t => t.clone(),
            };
            let e = match (s.encoding, &t) {
                (1, t) if t.is_integer() => Encoding::DELTA_BINARY_PACKED,
                (2, DataType::Float32 | DataType::Float64) => Encoding::BYTE_STREAM_SPLIT,
                _ => continue,
            };
            p = p
                .set_column_encoding(leaf("item"), e)
                .set_column_encoding(leaf("element"), e);
        }
    }
    let mut buf = Vec::new();
    let mut w = ArrowWriter::try_new(&mut buf, batch.schema(), Some(p.build())).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
    Bytes::from(buf)
}

fn meta(file: &Bytes) -> ArrowReaderMetadata {
    ArrowReaderMetadata::load(
        file,
        ArrowReaderOptions::new()
            .with_page_index_policy(parquet::file::metadata::PageIndexPolicy::Optional),
    )
    .unwrap()
}

/// `file` as a local file (its name already removed), for [`open_local_row_group`].
fn local(file: &Bytes) -> std::fs::File {
    use std::io::Write;
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(file).unwrap();
    f
}

/// Random selectors covering `rows` rows.
fn selection(rng: &mut ChaCha8Rng, rows: usize) -> Vec<RowSelector> {
    let mut out = Vec::new();
    let mut left = rows;
    while left > 0 {
        let n = rng.range(1, left.min(90) as i64 + 1) as usize;
        out.push(if rng.random_bool(0.4) {
            RowSelector::skip(n)
        } else {
            RowSelector::select(n)
        });
        left -= n;
    }
    out
}

#[allow(clippy::type_complexity)]
fn fetch_from(
    file: &Bytes,
) -> impl FnMut(Vec<Range<u64>>, &[Range<u64>]) -> crate::Result<Vec<Bytes>> + '_ {
    move |ranges, _| {
        Ok(ranges
            .into_iter()
            .map(|r| file.slice(r.start as usize..r.end as usize))
            .collect())
    }
}

fn bad(e: parquet::errors::ParquetError) -> crate::Error {
    crate::Error::Internal(e.to_string())
}

/// Read row group `rg` projected to `roots` under `sel` both ways; compare. Returns how many
/// of the roots took the fast path.
fn compare(
    file: &Bytes,
    m: &ArrowReaderMetadata,
    rg: usize,
    roots: &[usize],
    sel: &[RowSelector],
    batch: usize,
) -> usize {
    let expected: Vec<RecordBatch> =
        ParquetRecordBatchReaderBuilder::new_with_metadata(file.clone(), m.clone())
            .with_row_groups(vec![rg])
            .with_projection(ProjectionMask::roots(
                m.parquet_schema(),
                roots.iter().copied(),
            ))
            .with_row_selection(RowSelection::from(sel.to_vec()))
            .with_batch_size(batch)
            .build()
            .unwrap()
            .collect::<std::result::Result<_, _>>()
            .unwrap();
    let pushed = open_row_group(
        m,
        rg,
        roots,
        sel.to_vec(),
        batch,
        file.len() as u64,
        fetch_from(file),
        bad,
    )
    .unwrap();
    let indexed = m.metadata().offset_index().is_some();
    // Without an offset index a local file is read page by page (the fetched path reads whole
    // chunks): both must match arrow-rs.
    let streamed = (!indexed).then(|| {
        open_local_row_group(m, rg, roots, sel.to_vec(), batch, local(file), bad).unwrap()
    });
    for ours in std::iter::once(pushed).chain(streamed) {
        same_as(ours, &expected, m, rg, roots, sel, batch);
    }
    roots
        .iter()
        .filter(|&&r| plan_root(m, rg, r).is_some())
        .count()
}

/// `ours`'s batches hold `expected`'s rows, column by column, in batches of at most `batch`.
fn same_as(
    mut ours: Batches,
    expected: &[RecordBatch],
    m: &ArrowReaderMetadata,
    rg: usize,
    roots: &[usize],
    sel: &[RowSelector],
    batch: usize,
) {
    let mut got: Vec<Vec<ArrayRef>> = Vec::new();
    while let Some((n, cols)) = ours.next_batch().unwrap() {
        assert!(n <= batch && n > 0);
        assert!(cols.iter().all(|c| c.len() == n));
        got.push(cols);
    }
    for (k, &root) in roots.iter().enumerate() {
        let want: Vec<&dyn Array> = expected.iter().map(|b| b.column(k).as_ref()).collect();
        let have: Vec<&dyn Array> = got.iter().map(|c| c[k].as_ref()).collect();
        let want = if want.is_empty() {
            None
        } else {
            Some(arrow_select::concat::concat(&want).unwrap())
        };
        let have = if have.is_empty() {
            None
        } else {
            Some(arrow_select::concat::concat(&have).unwrap())
        };
        assert_eq!(
            want.as_ref().map(|a| a.to_data()),
            have.as_ref().map(|a| a.to_data()),
            "column {} of row group {rg}, selection {sel:?}, batch {batch}, offset index {}",
            m.schema().field(root).name(),
            m.metadata().offset_index().is_some()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    #[test]
    fn equals_arrow_rs(seed in any::<u64>(), n in 0usize..700, nulls in prop_oneof![Just(0.0), Just(0.1), Just(0.5), Just(1.0)],
                       s in settings(), batch in 1usize..300) {
        let data = table(seed, n, nulls);
        // The same data with and without a page index, under the same selections.
        for page_index in [true, false] {
            let s = Settings { page_index, ..s.clone() };
            let file = write(&data, &s);
            let m = meta(&file);
            prop_assert_eq!(m.metadata().offset_index().is_some(), page_index && n > 0);
            check_file(&file, &m, &s, seed, batch)?;
        }
    }
}

/// [`equals_arrow_rs`] for one written file.
fn check_file(
    file: &Bytes,
    m: &ArrowReaderMetadata,
    s: &Settings,
    seed: u64,
    batch: usize,
) -> std::result::Result<(), TestCaseError> {
    let (file, m) = (file, m);
    {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
        let all: Vec<usize> = (0..COLUMNS.len()).collect();
        let mut fast = 0;
        for rg in 0..m.metadata().num_row_groups() {
            let rows = m.metadata().row_group(rg).num_rows() as usize;
            // everything selected, then a random selection over a random subset of columns
            fast += compare(file, m, rg, &all, &[RowSelector::select(rows)], batch);
            let roots: Vec<usize> = all
                .iter()
                .copied()
                .filter(|_| rng.random_bool(0.5))
                .collect();
            if !roots.is_empty() {
                let sel = selection(&mut rng, rows);
                compare(file, m, rg, &roots, &sel, batch);
            }
        }
        // The fast path is not vacuous: with plain or dictionary encodings it takes its columns.
        if m.metadata().num_row_groups() > 0 && s.encoding == 0 {
            let want = COLUMNS.iter().filter(|c| c.1).count() * m.metadata().num_row_groups();
            prop_assert_eq!(fast, want);
        }
    }
    Ok(())
}

#[test]
fn plans() {
    let file = write(
        &table(1, 50, 0.2),
        &Settings {
            dictionary: true,
            v2: false,
            page_rows: 7,
            row_group: 50,
            encoding: 0,
            compression: 1,
            page_index: true,
        },
    );
    let m = meta(&file);
    for (root, (name, fast)) in COLUMNS.iter().enumerate() {
        assert_eq!(plan_root(&m, 0, root).is_some(), *fast, "{name}");
    }
    // Delta-encoded integers fall back to arrow-rs; so does a file without an offset index.
    let file = write(
        &table(1, 50, 0.2),
        &Settings {
            dictionary: false,
            v2: true,
            page_rows: 7,
            row_group: 50,
            encoding: 1,
            compression: 0,
            page_index: true,
        },
    );
    let m = meta(&file);
    assert!(plan_root(&m, 0, 0).is_none());
    assert!(plan_root(&m, 0, 2).is_some(), "f64 stays plain");
    let no_index = ArrowReaderMetadata::load(
        &file,
        ArrowReaderOptions::new()
            .with_page_index_policy(parquet::file::metadata::PageIndexPolicy::Skip),
    )
    .unwrap();
    assert!(no_index.metadata().offset_index().is_none());
    assert!(plan_root(&no_index, 0, 2).is_some_and(|p| !p.indexed));
    assert!(
        plan_root(&no_index, 0, 0).is_none(),
        "delta stays with arrow-rs"
    );
    assert!(plan_root(&m, 0, 2).is_some_and(|p| p.indexed));
}

#[test]
fn lists_by_hand() {
    // [[1, 2], [], null, [null, 3]] then 70 rows of [7; 40] (long runs), v1 and v2 pages
    let mut b = GenericListBuilder::<i32, _>::new(Int32Builder::new());
    b.append_value([Some(1), Some(2)]);
    b.append_value([]);
    b.append_null();
    b.append_value([None, Some(3)]);
    for _ in 0..70 {
        b.append_value(std::iter::repeat_n(Some(7), 40));
    }
    let a: ArrayRef = Arc::new(b.finish());
    let batch = RecordBatch::try_from_iter([("l", a)]).unwrap();
    for (v2, dictionary, page_index) in (0..8).map(|i| (i & 1 > 0, i & 2 > 0, i & 4 > 0)) {
        {
            let s = Settings {
                dictionary,
                v2,
                page_rows: 3,
                row_group: 1000,
                encoding: 0,
                compression: 0,
                page_index,
            };
            let file = write(&batch, &s);
            let m = meta(&file);
            assert_eq!(m.metadata().offset_index().is_some(), page_index);
            assert!(plan_root(&m, 0, 0).is_some());
            for sel in [
                vec![RowSelector::select(74)],
                vec![
                    RowSelector::skip(3),
                    RowSelector::select(5),
                    RowSelector::skip(60),
                    RowSelector::select(6),
                ],
            ] {
                for bs in [1, 2, 5, 100] {
                    compare(&file, &m, 0, &[0], &sel, bs);
                }
            }
        }
    }
}

#[test]
fn flat_by_hand() {
    let a: ArrayRef = Arc::new(Int64Array::from_iter(
        (0..500).map(|i| (i % 3 != 0).then_some(i / 10)),
    ));
    let b: ArrayRef = Arc::new(Float64Array::from_iter_values((0..500).map(|i| i as f64)));
    let c: ArrayRef = Arc::new(Int32Array::from_iter_values(0..500));
    let batch = RecordBatch::try_from_iter([("a", a), ("b", b), ("c", c)]).unwrap();
    for (dictionary, page_index) in [(false, true), (true, true), (false, false), (true, false)] {
        let s = Settings {
            dictionary,
            v2: false,
            page_rows: 64,
            row_group: 300,
            encoding: 0,
            compression: 2,
            page_index,
        };
        let file = write(&batch, &s);
        let m = meta(&file);
        for rg in 0..2 {
            let rows = m.metadata().row_group(rg).num_rows() as usize;
            assert_eq!(
                compare(&file, &m, rg, &[0, 1, 2], &[RowSelector::select(rows)], 128),
                3
            );
            compare(
                &file,
                &m,
                rg,
                &[0, 2],
                &[RowSelector::skip(130), RowSelector::select(rows - 130)],
                50,
            );
        }
    }
}

/// Pages from a list, for feeding corrupted buffers to the column decoder.
struct Pages(std::collections::VecDeque<Page>);

impl Iterator for Pages {
    type Item = Result<Page>;
    fn next(&mut self) -> Option<Result<Page>> {
        self.0.pop_front().map(Ok)
    }
}

impl PageReader for Pages {
    fn get_next_page(&mut self) -> Result<Option<Page>> {
        Ok(self.0.pop_front())
    }
    fn peek_next_page(&mut self) -> Result<Option<PageMetadata>> {
        Ok(self.0.front().map(|p| PageMetadata {
            num_rows: None,
            num_levels: None,
            is_dict: p.is_dictionary_page(),
        }))
    }
    fn skip_next_page(&mut self) -> Result<()> {
        self.0.pop_front();
        Ok(())
    }
}

fn pages(file: &Bytes, m: &ArrowReaderMetadata, leaf: usize) -> Vec<Page> {
    let chunk = m.metadata().row_group(0).column(leaf);
    let locations: Vec<PageLocation> = m.metadata().offset_index().unwrap()[0][leaf]
        .page_locations()
        .clone();
    let rows = m.metadata().row_group(0).num_rows() as usize;
    SerializedPageReader::new(Arc::new(file.clone()), chunk, rows, Some(locations))
        .unwrap()
        .collect::<Result<_>>()
        .unwrap()
}

fn with_buf(p: &Page, buf: Bytes) -> Page {
    let mut p = p.clone();
    match &mut p {
        Page::DataPage { buf: b, .. }
        | Page::DataPageV2 { buf: b, .. }
        | Page::DictionaryPage { buf: b, .. } => *b = buf,
    }
    p
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// Flipped, truncated or extended page bytes: an error or some output, never a panic.
    #[test]
    fn corrupt_pages_never_panic(seed in any::<u64>(), dictionary in any::<bool>(), v2 in any::<bool>(), root in 0usize..11,
                                 flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
                                 cut in any::<prop::sample::Index>(), how in 0u8..3) {
        let data = table(seed, 80, 0.2);
        let s = Settings { dictionary, v2, page_rows: 20, row_group: 1000, encoding: 0, compression: 0, page_index: true };
        let file = write(&data, &s);
        let m = meta(&file);
        let Some(plan) = plan_root(&m, 0, root) else { return Ok(()) };
        let mut ps = pages(&file, &m, plan.leaf);
        let k = cut.index(ps.len());
        let mut buf = ps[k].buffer().to_vec();
        match how {
            0 => for (i, b) in &flips { if !buf.is_empty() { let i = i.index(buf.len()); buf[i] ^= b | 1; } },
            1 => buf.truncate(cut.index(buf.len() + 1)),
            _ => buf.extend(flips.iter().map(|f| f.1)),
        }
        ps[k] = with_buf(&ps[k], Bytes::from(buf));
        let mut col = column_over(&plan, Box::new(Pages(ps.into())));
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = col.skip(3).and_then(|_| col.read(40)).and_then(|_| col.finish());
            let _ = col.read(100).and_then(|_| col.finish());
        }));
        prop_assert!(outcome.is_ok(), "the decoder panicked");
    }
}

#[test]
fn fetched_reads_only_what_it_holds() {
    let f = Fetched::new(
        vec![10..20, 30..35],
        vec![Bytes::from(vec![1u8; 10]), Bytes::from(vec![2u8; 5])],
        100,
    );
    assert_eq!(f.get_bytes(12, 8).unwrap().len(), 8);
    assert_eq!(f.get_bytes(30, 5).unwrap()[0], 2);
    assert!(f.get_bytes(15, 10).is_err());
    assert!(f.get_bytes(0, 1).is_err());
    assert!(f.get_read(40).is_err());
}

#[test]
fn first_batch_realigns_then_full_batches() {
    let a: ArrayRef = Arc::new(Int64Array::from_iter_values(0..300));
    let batch = RecordBatch::try_from_iter([("a", a)]).unwrap();
    let s = Settings {
        dictionary: true,
        v2: false,
        page_rows: 64,
        row_group: 300,
        encoding: 0,
        compression: 0,
        page_index: true,
    };
    let file = write(&batch, &s);
    let m = meta(&file);
    let sel = vec![RowSelector::skip(10), RowSelector::select(290)];
    let open = || {
        open_row_group(
            &m,
            0,
            &[0],
            sel.clone(),
            50,
            file.len() as u64,
            fetch_from(&file),
            bad,
        )
        .unwrap()
    };
    let sizes = |mut b: Batches| {
        let mut out = Vec::new();
        while let Some((n, cols)) = b.next_batch().unwrap() {
            let ids = cols[0].as_any().downcast_ref::<Int64Array>().unwrap();
            out.push((n, ids.value(0)));
        }
        out
    };
    assert_eq!(
        sizes(open().with_first_batch(7)),
        vec![
            (7, 10),
            (50, 17),
            (50, 67),
            (50, 117),
            (50, 167),
            (50, 217),
            (33, 267)
        ]
    );
    assert_eq!(sizes(open()).first(), Some(&(50, 10)));
}

/// A level section (RLE hybrid) for `levels`: runs of equal levels as repeated runs, and where
/// `packed` says so, groups of 8 bit-packed (the last padded, as writers do).
fn rle(levels: &[u32], width: u32, packed: &mut impl FnMut() -> bool) -> Vec<u8> {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < levels.len() {
        if packed() {
            let group: Vec<u32> = (0..8)
                .map(|k| levels.get(i + k).copied().unwrap_or(0))
                .collect();
            varint(&mut out, (1 << 1) | 1);
            let mut bits = vec![0u8; width as usize];
            for (k, v) in group.iter().enumerate() {
                for b in 0..width as usize {
                    if v >> b & 1 == 1 {
                        let at = k * width as usize + b;
                        bits[at / 8] |= 1 << (at % 8);
                    }
                }
            }
            out.extend(bits);
            i += 8;
        } else {
            let n = levels[i..].iter().take_while(|&&l| l == levels[i]).count();
            varint(&mut out, (n as u64) << 1);
            out.extend_from_slice(&levels[i].to_le_bytes()[..(width as usize).div_ceil(8)]);
            i += n;
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// Without an offset index pages may end inside a row (parquet-cpp's v1 pages without a page
    /// index do): hand-made v1 pages cut at random levels, plain or dictionary values, read and
    /// skipped at random, must give the source rows.
    #[test]
    fn rows_across_pages(seed in any::<u64>(), n in 1usize..150, nulls in prop_oneof![Just(0.0), Just(0.2)],
                         max_page in 1usize..40, dictionary in any::<bool>()) {
        let mut g = Gen { rng: ChaCha8Rng::seed_from_u64(seed), nulls };
        let src = g.list::<i32, arrow_array::types::Int32Type>(n, true, true, 25, |r| r.range(0, 9) as i32);
        let src = src.as_any().downcast_ref::<arrow_array::ListArray>().unwrap().clone();
        // levels and present values
        let (mut rep, mut def, mut vals) = (Vec::new(), Vec::new(), Vec::new());
        for row in 0..n {
            if src.is_null(row) {
                rep.push(0);
                def.push(0);
                continue;
            }
            let items = src.value(row);
            let items = items.as_any().downcast_ref::<Int32Array>().unwrap();
            if items.is_empty() {
                rep.push(0);
                def.push(1);
            }
            for k in 0..items.len() {
                rep.push(u32::from(k > 0));
                if items.is_null(k) {
                    def.push(2);
                } else {
                    def.push(3);
                    vals.push(items.value(k));
                }
            }
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 1);
        let mut packed = move || rng.random_bool(0.3);
        let mut ps = std::collections::VecDeque::new();
        if dictionary {
            let dict: Vec<u8> = (0..9i32).flat_map(|v| v.to_le_bytes()).collect();
            ps.push_back(Page::DictionaryPage { buf: Bytes::from(dict), num_values: 9, encoding: Encoding::PLAIN, is_sorted: false });
        }
        let mut at = 0;
        let mut val_at = 0;
        let mut cut = ChaCha8Rng::seed_from_u64(seed ^ 2);
        let mut splits_inside_a_row = 0;
        while at < rep.len() {
            let end = (at + cut.range(1, max_page as i64 + 1) as usize).min(rep.len());
            splits_inside_a_row += usize::from(end < rep.len() && rep[end] == 1);
            let present = def[at..end].iter().filter(|&&d| d == 3).count();
            let mut buf = Vec::new();
            for (levels, width) in [(&rep[at..end], 1), (&def[at..end], 2)] {
                let section = rle(levels, width, &mut packed);
                buf.extend((section.len() as u32).to_le_bytes());
                buf.extend(section);
            }
            let page_vals = &vals[val_at..val_at + present];
            let encoding = if dictionary {
                let idx: Vec<u32> = page_vals.iter().map(|&v| v as u32).collect();
                buf.push(4);
                buf.extend(rle(&idx, 4, &mut packed));
                Encoding::RLE_DICTIONARY
            } else {
                buf.extend(page_vals.iter().flat_map(|v| v.to_le_bytes()));
                Encoding::PLAIN
            };
            ps.push_back(Page::DataPage {
                buf: Bytes::from(buf),
                num_values: (end - at) as u32,
                encoding,
                def_level_encoding: Encoding::RLE,
                rep_level_encoding: Encoding::RLE,
                statistics: None,
            });
            val_at += present;
            at = end;
        }
        // the plan of a file of this type without an offset index
        let batch = RecordBatch::try_from_iter_with_nullable([("l", Arc::new(src.clone()) as ArrayRef, true)]).unwrap();
        prop_assert_eq!(batch.schema().field(0).data_type().clone(), src.data_type().clone());
        let s = Settings { dictionary: false, v2: false, page_rows: 1000, row_group: 1000, encoding: 0, compression: 0, page_index: false };
        let file = write(&batch, &s);
        let plan = plan_root(&meta(&file), 0, 0).unwrap();
        prop_assert_eq!((plan.shape.max_def, plan.shape.list_def), (3, 1));
        prop_assert!(!plan.indexed);
        let mut col = column_over(&plan, Box::new(Pages(ps)));
        let mut ops = ChaCha8Rng::seed_from_u64(seed ^ 3);
        let mut row = 0;
        while row < n {
            let k = ops.range(1, (n - row).min(40) as i64 + 1) as usize;
            if ops.random_bool(0.4) {
                col.skip(k).unwrap();
            } else {
                col.read(k).unwrap();
                let got = col.finish().unwrap();
                prop_assert_eq!(got.to_data(), src.slice(row, k).to_data(), "rows {}..{}", row, row + k);
            }
            row += k;
        }
        prop_assert!(col.read(1).is_err(), "reading past the end is an error");
        // the cases do cut rows (not a vacuous test): most multi-page ones with long lists
        if max_page < 10 && rep.len() > 100 {
            prop_assert!(splits_inside_a_row > 0);
        }
    }
}

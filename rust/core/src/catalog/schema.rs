//! The output schema: the requested columns, unified across shards, and each shard's projection.
//!
//! Shards need not have identical schemas. Their types are unified the way
//! `pyarrow.unify_schemas` does (default options), plus two relaxations that only change how
//! the same values are presented; the output schema is the result, and every batch is cast to
//! it as it is read (`reader::to_output`):
//!
//! * the `null` type (pyarrow's type for an all-null or empty column) becomes the other
//!   shards' type, as an all-null column;
//! * the names of list / map child fields (`item` vs `element`, older vs newer writers) and
//!   nullability are not significant: a column or child is nullable if it is in any shard, and
//!   the first shard's child names win (as in pyarrow);
//! * dictionary key types: the output key type is wide enough to number every row of the
//!   dataset (see [`dictionary_key_type`]) — pyarrow refuses `dictionary<int8>` vs
//!   `dictionary<int32>` by default, but the values are the same;
//! * timestamps that both carry a time zone are the same instants whatever the zone (a file
//!   written with `store_schema=False` reads its zone as `UTC`): a named zone wins over UTC,
//!   and between two named zones the first shard's wins. pyarrow's `unify_schemas` refuses
//!   these; `pyarrow.dataset` reads them in the first file's zone.
//!
//! Everything else that differs (int vs string, int32 vs int64, string vs large_string, a
//! time zone vs none, dictionary vs plain, different struct fields) is refused with a
//! [`Error::Schema`] naming the column, both files and both types, spelled as pyarrow does.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow_schema::{DataType, Field, FieldRef, Fields, Schema, SchemaRef, TimeUnit, UnionMode};
use sha2::{Digest, Sha256};

use super::Shard;
use crate::error::{Error, Result};

pub(crate) fn schema_digest(schema: &Schema) -> [u8; 16] {
    let d = Sha256::digest(format!("{:?}", schema.fields()).as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    out
}

/// Check the shards agree on the requested columns and compute each shard's projection.
/// Returns the output schema: the requested columns in the requested order, each with the
/// type unified over every shard (see the module docs).
pub(super) fn project(
    shards: &mut [Shard],
    columns: Option<&[String]>,
    total_rows: u64,
) -> Result<SchemaRef> {
    if columns.is_some_and(|c| c.is_empty()) {
        return Err(Error::Config(
            "columns=[] selects no column: pass columns=None to read every column, or name at \
             least one"
                .into(),
        ));
    }
    let Some(first) = shards.first() else {
        return Ok(Arc::new(Schema::empty()));
    };
    let first_schema = first.schema.clone();
    let first_path = first.path.display().to_string();
    let names: Vec<String> = match columns {
        Some(cols) => {
            let mut seen = BTreeSet::new();
            for c in cols {
                if !seen.insert(c) {
                    return Err(Error::Schema(format!("column {c:?} requested twice")));
                }
            }
            cols.to_vec()
        }
        None => first_schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect(),
    };
    // (field, the shard it was first seen with that type) per requested column
    let mut fields: Vec<(Field, String)> = Vec::with_capacity(names.len());
    for name in &names {
        let f = first_schema.field_with_name(name).map_err(|_| {
            Error::Schema(format!(
                "unknown column {name:?}: {first_path} has columns {:?}",
                first_schema
                    .fields()
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
            ))
        })?;
        if let Some(bad) = nul_name(f) {
            return Err(Error::Schema(format!(
                "column {bad:?} in {first_path} has a NUL byte in its name: Arrow's C data \
                 interface (how batches reach Python) cannot carry it; rename the column or \
                 leave it out with columns=[...]"
            )));
        }
        fields.push((
            f.as_ref().clone().with_metadata(Default::default()),
            first_path.clone(),
        ));
    }
    for shard in shards.iter_mut() {
        let schema = shard.schema.clone();
        let path = shard.path.display().to_string();
        check_duplicates(&schema, &names, columns.is_none(), &path)?;
        if columns.is_none() {
            if let Some(extra) = schema.fields().iter().find(|f| !names.contains(f.name())) {
                return Err(Error::Schema(format!(
                    "incompatible shards: column {:?} is in {path} but not in {first_path} \
                     (pass columns=[...] to read only the shared columns)",
                    extra.name()
                )));
            }
        }
        let mut roots = Vec::with_capacity(names.len());
        for (name, (field, seen_in)) in names.iter().zip(fields.iter_mut()) {
            let (idx, f) = schema.column_with_name(name).ok_or_else(|| {
                Error::Schema(format!(
                    "incompatible shards: column {name:?} is in {first_path} but missing from {path}"
                ))
            })?;
            let unified = unify_type(field.data_type(), f.data_type()).ok_or_else(|| {
                Error::Schema(format!(
                    "incompatible shards: column {name:?} is {} in {seen_in} but {} in {path}{}",
                    type_name(field.data_type()),
                    type_name(f.data_type()),
                    hint(field.data_type(), f.data_type()),
                ))
            })?;
            if &unified != field.data_type() {
                *field = field.clone().with_data_type(unified);
                *seen_in = path.clone();
            }
            if f.is_nullable() && !field.is_nullable() {
                *field = field.clone().with_nullable(true);
            }
            roots.push(idx);
        }
        let mut sorted = roots.clone();
        sorted.sort_unstable();
        shard.reorder = roots
            .iter()
            .map(|r| sorted.binary_search(r).expect("root is in the sorted list"))
            .collect();
        shard.roots = sorted;
    }
    let key = dictionary_key_type(total_rows);
    Ok(Arc::new(Schema::new(
        fields
            .into_iter()
            .map(|(f, _)| {
                let t = widen_keys(f.data_type(), &key);
                // A column that is `null` in every shard stays null-typed, hence nullable.
                let nullable = f.is_nullable() || t == DataType::Null;
                f.with_data_type(t).with_nullable(nullable)
            })
            .collect::<Vec<_>>(),
    )))
}

/// A requested name that is the name of two or more top-level columns of this file (legal
/// Parquet, and pyarrow writes it) cannot be told apart by name: refuse it rather than
/// reading one of them under a schema that claims both.
fn check_duplicates(schema: &Schema, names: &[String], all: bool, path: &str) -> Result<()> {
    let mut seen = BTreeSet::new();
    for f in schema.fields() {
        if !seen.insert(f.name()) && (all || names.contains(f.name())) {
            return Err(Error::Schema(format!(
                "{path}: column name {:?} appears more than once; shardstream selects columns \
                 by name, so it cannot read them apart (rename one{})",
                f.name(),
                if all {
                    ", or pass columns=[...] without it"
                } else {
                    ""
                }
            )));
        }
    }
    Ok(())
}

/// The key type of dictionary columns in the output: wide enough that concatenating or
/// gathering decoded batches (each with its own dictionary) never overflows it. arrow-rs merges
/// the dictionaries when their total length would overflow, keeping only the values the output
/// rows reference, so a key type that can number every row of the dataset (an output batch
/// never holds more) cannot overflow. pandas writes `category` columns with `int8` keys; a few
/// hundred categories across shards would overflow those.
pub(super) fn dictionary_key_type(total_rows: u64) -> DataType {
    if total_rows <= i32::MAX as u64 {
        DataType::Int32
    } else {
        DataType::Int64
    }
}

fn key_max(t: &DataType) -> u64 {
    match t {
        DataType::Int8 => i8::MAX as u64,
        DataType::Int16 => i16::MAX as u64,
        DataType::Int32 => i32::MAX as u64,
        DataType::Int64 => i64::MAX as u64,
        DataType::UInt8 => u8::MAX as u64,
        DataType::UInt16 => u16::MAX as u64,
        DataType::UInt32 => u32::MAX as u64,
        _ => u64::MAX,
    }
}

/// `t` with every dictionary key type narrower than `key` replaced by `key` (nested too).
fn widen_keys(t: &DataType, key: &DataType) -> DataType {
    let field = |f: &FieldRef| -> FieldRef {
        Arc::new(
            f.as_ref()
                .clone()
                .with_data_type(widen_keys(f.data_type(), key)),
        )
    };
    match t {
        DataType::Dictionary(k, v) => {
            let k = if key_max(k) < key_max(key) {
                key.clone()
            } else {
                k.as_ref().clone()
            };
            DataType::Dictionary(Box::new(k), Box::new(widen_keys(v, key)))
        }
        DataType::List(f) => DataType::List(field(f)),
        DataType::LargeList(f) => DataType::LargeList(field(f)),
        DataType::ListView(f) => DataType::ListView(field(f)),
        DataType::LargeListView(f) => DataType::LargeListView(field(f)),
        DataType::FixedSizeList(f, n) => DataType::FixedSizeList(field(f), *n),
        DataType::Map(f, sorted) => DataType::Map(field(f), *sorted),
        DataType::Struct(fs) => DataType::Struct(fs.iter().map(field).collect()),
        other => other.clone(),
    }
}

fn is_utc(tz: &str) -> bool {
    matches!(tz, "UTC" | "utc" | "+00:00" | "Z" | "Etc/UTC" | "GMT")
}

/// The type both `a` (the columns's type so far) and `b` (another shard's) read as, or `None`
/// for a real conflict (see the module docs).
pub(crate) fn unify_type(a: &DataType, b: &DataType) -> Option<DataType> {
    use DataType as T;
    if a == b {
        return Some(a.clone());
    }
    Some(match (a, b) {
        (T::Null, t) | (t, T::Null) => t.clone(),
        (T::List(x), T::List(y)) => T::List(unify_child(x, y)?),
        (T::LargeList(x), T::LargeList(y)) => T::LargeList(unify_child(x, y)?),
        (T::ListView(x), T::ListView(y)) => T::ListView(unify_child(x, y)?),
        (T::LargeListView(x), T::LargeListView(y)) => T::LargeListView(unify_child(x, y)?),
        (T::FixedSizeList(x, n), T::FixedSizeList(y, m)) if n == m => {
            T::FixedSizeList(unify_child(x, y)?, *n)
        }
        (T::Map(x, s), T::Map(y, t)) if s == t => T::Map(unify_child(x, y)?, *s),
        (T::Struct(x), T::Struct(y)) if x.len() == y.len() => {
            let mut out = Vec::with_capacity(x.len());
            for (p, q) in x.iter().zip(y.iter()) {
                if p.name() != q.name() {
                    return None;
                }
                out.push(unify_child(p, q)?);
            }
            T::Struct(Fields::from(out))
        }
        (T::Dictionary(k, v), T::Dictionary(l, w)) => {
            let values = unify_type(v, w)?;
            let key = if key_max(l) > key_max(k) { l } else { k };
            T::Dictionary(key.clone(), Box::new(values))
        }
        (T::Timestamp(u, Some(x)), T::Timestamp(v, Some(y))) if u == v => {
            let zone = if is_utc(x) && !is_utc(y) { y } else { x };
            T::Timestamp(*u, Some(zone.clone()))
        }
        _ => return None,
    })
}

/// A child field of both: the first one's name (and metadata), either's nullability.
fn unify_child(a: &FieldRef, b: &FieldRef) -> Option<FieldRef> {
    let t = unify_type(a.data_type(), b.data_type())?;
    Some(Arc::new(
        a.as_ref()
            .clone()
            .with_data_type(t)
            .with_nullable(a.is_nullable() || b.is_nullable()),
    ))
}

/// A hint for the conflicts users most often meet.
fn hint(a: &DataType, b: &DataType) -> &'static str {
    match (a, b) {
        (DataType::Timestamp(_, x), DataType::Timestamp(_, y)) if x.is_some() != y.is_some() => {
            " (a time zone vs none: instants vs wall-clock times, which shardstream will not mix)"
        }
        (DataType::Dictionary(..), _) | (_, DataType::Dictionary(..)) => {
            " (dictionary-encoded in one and not the other; rewrite one set of shards)"
        }
        _ => "",
    }
}

fn unit(u: &TimeUnit) -> &'static str {
    match u {
        TimeUnit::Second => "s",
        TimeUnit::Millisecond => "ms",
        TimeUnit::Microsecond => "us",
        TimeUnit::Nanosecond => "ns",
    }
}

fn child(f: &Field) -> String {
    format!(
        "{}: {}{}",
        f.name(),
        type_name(f.data_type()),
        if f.is_nullable() { "" } else { " not null" }
    )
}

/// An Arrow type spelled as pyarrow prints it (`list<element: int32>`, `timestamp[ms,
/// tz=UTC]`, `dictionary<values=string, indices=int8, ordered=0>`): what users see in
/// `ds.schema` and in pyarrow's own errors, unlike arrow-rs's Rust spelling.
pub(crate) fn type_name(t: &DataType) -> String {
    use DataType as T;
    match t {
        T::Null => "null".into(),
        T::Boolean => "bool".into(),
        T::Int8 => "int8".into(),
        T::Int16 => "int16".into(),
        T::Int32 => "int32".into(),
        T::Int64 => "int64".into(),
        T::UInt8 => "uint8".into(),
        T::UInt16 => "uint16".into(),
        T::UInt32 => "uint32".into(),
        T::UInt64 => "uint64".into(),
        T::Float16 => "halffloat".into(),
        T::Float32 => "float".into(),
        T::Float64 => "double".into(),
        T::Timestamp(u, None) => format!("timestamp[{}]", unit(u)),
        T::Timestamp(u, Some(tz)) => format!("timestamp[{}, tz={tz}]", unit(u)),
        T::Date32 => "date32[day]".into(),
        T::Date64 => "date64[ms]".into(),
        T::Time32(u) => format!("time32[{}]", unit(u)),
        T::Time64(u) => format!("time64[{}]", unit(u)),
        T::Duration(u) => format!("duration[{}]", unit(u)),
        T::Interval(arrow_schema::IntervalUnit::YearMonth) => "month_interval".into(),
        T::Interval(arrow_schema::IntervalUnit::DayTime) => "day_time_interval".into(),
        T::Interval(arrow_schema::IntervalUnit::MonthDayNano) => "month_day_nano_interval".into(),
        T::Binary => "binary".into(),
        T::FixedSizeBinary(n) => format!("fixed_size_binary[{n}]"),
        T::LargeBinary => "large_binary".into(),
        T::BinaryView => "binary_view".into(),
        T::Utf8 => "string".into(),
        T::LargeUtf8 => "large_string".into(),
        T::Utf8View => "string_view".into(),
        T::List(f) => format!("list<{}>", child(f)),
        T::LargeList(f) => format!("large_list<{}>", child(f)),
        T::ListView(f) => format!("list_view<{}>", child(f)),
        T::LargeListView(f) => format!("large_list_view<{}>", child(f)),
        T::FixedSizeList(f, n) => format!("fixed_size_list<{}>[{n}]", child(f)),
        T::Struct(fs) => format!(
            "struct<{}>",
            fs.iter().map(|f| child(f)).collect::<Vec<_>>().join(", ")
        ),
        T::Union(fs, mode) => format!(
            "{}_union<{}>",
            if *mode == UnionMode::Dense {
                "dense"
            } else {
                "sparse"
            },
            fs.iter()
                .map(|(id, f)| format!("{}={id}", child(f)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        T::Dictionary(k, v) => format!(
            "dictionary<values={}, indices={}, ordered=0>",
            type_name(v),
            type_name(k)
        ),
        T::Decimal32(p, s) => format!("decimal32({p}, {s})"),
        T::Decimal64(p, s) => format!("decimal64({p}, {s})"),
        T::Decimal128(p, s) => format!("decimal128({p}, {s})"),
        T::Decimal256(p, s) => format!("decimal256({p}, {s})"),
        T::Map(f, _) => match f.data_type() {
            T::Struct(kv) if kv.len() == 2 => {
                let v = &kv[1];
                format!(
                    "map<{}, {}{}>",
                    type_name(kv[0].data_type()),
                    type_name(v.data_type()),
                    if v.is_nullable() { "" } else { " not null" }
                )
            }
            other => format!("map<{}>", type_name(other)),
        },
        T::RunEndEncoded(r, v) => format!(
            "run_end_encoded<run_ends={}, values={}>",
            type_name(r.data_type()),
            type_name(v.data_type())
        ),
    }
}

/// `array` (a column as one shard decodes it) in the unified output type `to`: an all-null
/// array for a `null` column, else arrow-rs's cast, which for the differences [`unify_type`]
/// accepts only relabels (child names, nullability, time zone) or widens dictionary keys.
pub(crate) fn conform(
    array: &arrow_array::ArrayRef,
    to: &DataType,
) -> std::result::Result<arrow_array::ArrayRef, arrow_schema::ArrowError> {
    if array.data_type() == &DataType::Null {
        return Ok(arrow_array::new_null_array(to, array.len()));
    }
    let options = arrow_cast::CastOptions {
        safe: false,
        ..Default::default()
    };
    arrow_cast::cast_with_options(array, to, &options)
}

/// The first field name (this one or nested) containing a NUL byte.
fn nul_name(f: &Field) -> Option<String> {
    if f.name().contains('\0') {
        return Some(f.name().clone());
    }
    let children: Vec<&Field> = match f.data_type() {
        DataType::List(c)
        | DataType::LargeList(c)
        | DataType::ListView(c)
        | DataType::LargeListView(c)
        | DataType::FixedSizeList(c, _)
        | DataType::Map(c, _) => vec![c.as_ref()],
        DataType::Struct(fs) => fs.iter().map(|c| c.as_ref()).collect(),
        DataType::Union(fs, _) => fs.iter().map(|(_, c)| c.as_ref()).collect(),
        DataType::Dictionary(_, v) => {
            return nul_name(&Field::new("v", v.as_ref().clone(), true));
        }
        DataType::RunEndEncoded(a, b) => vec![a.as_ref(), b.as_ref()],
        _ => vec![],
    };
    children.into_iter().find_map(nul_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(name: &str, t: DataType, nullable: bool) -> DataType {
        DataType::List(Arc::new(Field::new(name, t, nullable)))
    }

    #[test]
    fn unify_follows_pyarrow_and_refuses_real_conflicts() {
        use DataType as T;
        assert_eq!(unify_type(&T::Null, &T::Utf8), Some(T::Utf8));
        assert_eq!(unify_type(&T::Int64, &T::Null), Some(T::Int64));
        // child names: the first wins; nullability: either
        assert_eq!(
            unify_type(
                &list("item", T::Int32, false),
                &list("element", T::Int32, true)
            ),
            Some(list("item", T::Int32, true))
        );
        assert_eq!(
            unify_type(
                &list("element", T::Null, true),
                &list("item", T::Int64, true)
            ),
            Some(list("element", T::Int64, true))
        );
        let berlin = T::Timestamp(TimeUnit::Millisecond, Some("Europe/Berlin".into()));
        let utc = T::Timestamp(TimeUnit::Millisecond, Some("UTC".into()));
        assert_eq!(unify_type(&utc, &berlin), Some(berlin.clone()));
        assert_eq!(unify_type(&berlin, &utc), Some(berlin.clone()));
        let dict = |k: T| T::Dictionary(Box::new(k), Box::new(T::Utf8));
        assert_eq!(
            unify_type(&dict(T::Int8), &dict(T::Int32)),
            Some(dict(T::Int32))
        );
        for (a, b) in [
            (T::Int64, T::Utf8),
            (T::Int32, T::Int64),
            (T::Utf8, T::LargeUtf8),
            (dict(T::Int8), T::Utf8),
            (berlin.clone(), T::Timestamp(TimeUnit::Millisecond, None)),
            (
                utc.clone(),
                T::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            ),
            (list("item", T::Int32, true), list("item", T::Int64, true)),
        ] {
            assert_eq!(unify_type(&a, &b), None, "{a} vs {b}");
        }
        let s = |n: &str| T::Struct(Fields::from(vec![Field::new(n, T::Int32, true)]));
        assert_eq!(unify_type(&s("a"), &s("b")), None);
    }

    #[test]
    fn keys_are_widened_to_number_every_row() {
        use DataType as T;
        let dict = |k: T| T::Dictionary(Box::new(k), Box::new(T::Utf8));
        for k in [T::Int8, T::Int16, T::UInt8, T::UInt16, T::Int32] {
            assert_eq!(
                widen_keys(&dict(k), &dictionary_key_type(1000)),
                dict(T::Int32)
            );
        }
        assert_eq!(
            widen_keys(&dict(T::UInt32), &dictionary_key_type(1000)),
            dict(T::UInt32)
        );
        let big = dictionary_key_type(1 << 40);
        assert_eq!(widen_keys(&dict(T::Int32), &big), dict(T::Int64));
        assert_eq!(widen_keys(&dict(T::UInt64), &big), dict(T::UInt64));
        let nested = list("item", dict(T::Int8), true);
        assert_eq!(
            widen_keys(&nested, &T::Int32),
            list("item", dict(T::Int32), true)
        );
    }

    #[test]
    fn type_names_are_pyarrows() {
        use DataType as T;
        assert_eq!(
            type_name(&list("element", T::Int32, true)),
            "list<element: int32>"
        );
        assert_eq!(
            type_name(&list("item", T::Int32, false)),
            "list<item: int32 not null>"
        );
        assert_eq!(
            type_name(&T::Dictionary(Box::new(T::Int8), Box::new(T::Utf8))),
            "dictionary<values=string, indices=int8, ordered=0>"
        );
        assert_eq!(
            type_name(&T::Timestamp(TimeUnit::Millisecond, Some("UTC".into()))),
            "timestamp[ms, tz=UTC]"
        );
        assert_eq!(
            type_name(&T::Struct(Fields::from(vec![
                Field::new("a", T::Int32, false),
                Field::new("b", T::LargeUtf8, true)
            ]))),
            "struct<a: int32 not null, b: large_string>"
        );
    }
}

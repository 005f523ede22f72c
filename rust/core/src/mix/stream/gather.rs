//! The mixed batch's columns gathered from the sources' batches by runs of consecutive rows.
//!
//! `arrow_select::interleave` copies row by row; a mixed batch takes each source's rows in
//! order, so its rows are runs of consecutive rows of one input batch. Here each run is one
//! slice copy (a run of one row one element copy), the offsets of list and byte columns are
//! computed once, and the result is built through arrow's validating constructors (no unsafe).
//! Primitive columns (fixed width 1-8 bytes), lists of them (without child nulls) and
//! utf8/binary are gathered so; every other type goes to `interleave` (the proptest below checks
//! both against `interleave_record_batch`).

use std::mem::{align_of, size_of};

use arrow_array::{make_array, Array, ArrayRef, OffsetSizeTrait, RecordBatch};
use arrow_buffer::{ArrowNativeType, BooleanBufferBuilder, Buffer, NullBuffer};
use arrow_data::{ArrayData, ArrayDataBuilder};
use arrow_schema::{ArrowError, DataType};
use arrow_select::interleave::interleave;

/// `len` consecutive rows of input `batch` from row `row`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    pub batch: usize,
    pub row: usize,
    pub len: usize,
}

/// Append row `row` of input `batch` to `runs`, extending the last run when it is the next row.
#[inline]
pub(crate) fn push(runs: &mut Vec<Run>, batch: usize, row: usize) {
    if let Some(last) = runs.last_mut() {
        if last.batch == batch && last.row + last.len == row {
            last.len += 1;
            return;
        }
    }
    runs.push(Run { batch, row, len: 1 });
}

/// The columns of the batch made of `runs` of `inputs` (all of one schema), `n` rows.
pub(crate) fn columns(
    inputs: &[RecordBatch],
    runs: &[Run],
    n: usize,
) -> Result<Vec<ArrayRef>, ArrowError> {
    let width = inputs.first().map_or(0, RecordBatch::num_columns);
    (0..width)
        .map(|c| {
            let arrays: Vec<&ArrayRef> = inputs.iter().map(|b| b.column(c)).collect();
            column(&arrays, runs, n)
        })
        .collect()
}

fn column(arrays: &[&ArrayRef], runs: &[Run], n: usize) -> Result<ArrayRef, ArrowError> {
    let data: Vec<ArrayData> = arrays.iter().map(|a| a.to_data()).collect();
    let dt = arrays[0].data_type();
    let fast = match dt {
        DataType::List(f) => list::<i32>(dt, f.data_type(), &data, runs, n)?,
        DataType::LargeList(f) => list::<i64>(dt, f.data_type(), &data, runs, n)?,
        DataType::Utf8 | DataType::Binary => bytes::<i32>(dt, &data, runs, n)?,
        DataType::LargeUtf8 | DataType::LargeBinary => bytes::<i64>(dt, &data, runs, n)?,
        _ => fixed(dt, &data, runs, n)?,
    };
    match fast {
        Some(a) => Ok(a),
        None => {
            let indices: Vec<(usize, usize)> = runs
                .iter()
                .flat_map(|r| (r.row..r.row + r.len).map(move |i| (r.batch, i)))
                .collect();
            let refs: Vec<&dyn Array> = arrays.iter().map(|a| a.as_ref()).collect();
            interleave(&refs, &indices)
        }
    }
}

/// The byte width of a type gathered as plain values (native alignment = width).
fn width_of(dt: &DataType) -> Option<usize> {
    if !dt.is_primitive() || matches!(dt, DataType::Interval(_)) {
        return None;
    }
    dt.primitive_width().filter(|w| matches!(w, 1 | 2 | 4 | 8))
}

/// Buffer `i` of `d` as `U`s, if aligned for them (arrow's own buffers are; a foreign one that
/// is not goes to `interleave`).
fn typed<U: ArrowNativeType>(d: &ArrayData, i: usize) -> Option<&[U]> {
    let b = d.buffers().get(i)?;
    let ok = b.as_ptr().align_offset(align_of::<U>()) == 0 && b.len() % size_of::<U>() == 0;
    ok.then(|| b.typed_data::<U>())
}

/// `$body` with `$U` the unsigned type of byte width `$w` (1, 2, 4 or 8).
macro_rules! by_width {
    ($w:expr, $U:ident => $body:expr) => {
        match $w {
            1 => {
                type $U = u8;
                $body
            }
            2 => {
                type $U = u16;
                $body
            }
            4 => {
                type $U = u32;
                $body
            }
            _ => {
                type $U = u64;
                $body
            }
        }
    };
}

/// The output's validity: `None` when no input has nulls.
fn nulls(data: &[ArrayData], runs: &[Run], n: usize) -> Option<NullBuffer> {
    if data.iter().all(|d| d.nulls().is_none()) {
        return None;
    }
    let mut b = BooleanBufferBuilder::new(n);
    for r in runs {
        match data[r.batch].nulls() {
            None => b.append_n(r.len, true),
            Some(v) if r.len == 1 => b.append(v.is_valid(r.row)),
            Some(v) => b.append_buffer(&v.inner().slice(r.row, r.len)),
        }
    }
    Some(NullBuffer::new(b.finish())).filter(|v| v.null_count() > 0)
}

/// Append `values[b][a..z]` for each span `(b, a, z)`.
fn copy_values<U: ArrowNativeType>(
    values: &[&[U]],
    spans: impl Iterator<Item = (usize, usize, usize)>,
    out: &mut Vec<U>,
) {
    for (b, a, z) in spans {
        if z - a == 1 {
            out.push(values[b][a]);
        } else {
            out.extend_from_slice(&values[b][a..z]);
        }
    }
}

fn fixed(
    dt: &DataType,
    data: &[ArrayData],
    runs: &[Run],
    n: usize,
) -> Result<Option<ArrayRef>, ArrowError> {
    let Some(w) = width_of(dt) else {
        return Ok(None);
    };
    let values = by_width!(w, U => {
        let mut vals: Vec<&[U]> = Vec::with_capacity(data.len());
        for d in data {
            let Some(v) = typed::<U>(d, 0) else { return Ok(None) };
            vals.push(&v[d.offset()..d.offset() + d.len()]);
        }
        let mut out: Vec<U> = Vec::with_capacity(n);
        copy_values(&vals, runs.iter().map(|r| (r.batch, r.row, r.row + r.len)), &mut out);
        Buffer::from_vec(out)
    });
    let out = ArrayDataBuilder::new(dt.clone())
        .len(n)
        .add_buffer(values)
        .nulls(nulls(data, runs, n))
        .build()?;
    Ok(Some(make_array(out)))
}

/// The output offsets of `runs` over inputs with these offsets, or `None` if they overflow `O`.
fn offsets<O: OffsetSizeTrait>(offs: &[&[O]], runs: &[Run], n: usize) -> Option<Vec<O>> {
    let mut out = Vec::with_capacity(n + 1);
    let mut at = 0usize;
    out.push(O::usize_as(0));
    for r in runs {
        let o = &offs[r.batch][r.row..=r.row + r.len];
        let base = o[0].as_usize();
        for x in &o[1..] {
            out.push(O::usize_as(at + (x.as_usize() - base)));
        }
        at += o[r.len].as_usize() - base;
    }
    O::from_usize(at)?;
    Some(out)
}

/// Each input's offsets (`len + 1` of them, from its offset).
fn offsets_of<'a, O: OffsetSizeTrait>(data: &'a [ArrayData]) -> Option<Vec<&'a [O]>> {
    data.iter()
        .map(|d| typed::<O>(d, 0).map(|o| &o[d.offset()..=d.offset() + d.len()]))
        .collect()
}

fn list<O: OffsetSizeTrait>(
    dt: &DataType,
    child_dt: &DataType,
    data: &[ArrayData],
    runs: &[Run],
    n: usize,
) -> Result<Option<ArrayRef>, ArrowError> {
    let Some(w) = width_of(child_dt) else {
        return Ok(None);
    };
    if data
        .iter()
        .any(|d| d.child_data()[0].nulls().is_some() || d.child_data()[0].data_type() != child_dt)
    {
        return Ok(None);
    }
    let Some(offs) = offsets_of::<O>(data) else {
        return Ok(None);
    };
    let Some(out_offsets) = offsets(&offs, runs, n) else {
        return Ok(None);
    };
    let total = out_offsets[n].as_usize();
    let spans = runs.iter().map(|r| {
        let o = offs[r.batch];
        (r.batch, o[r.row].as_usize(), o[r.row + r.len].as_usize())
    });
    let values = by_width!(w, U => {
        let mut vals: Vec<&[U]> = Vec::with_capacity(data.len());
        for d in data {
            let c = &d.child_data()[0];
            let Some(v) = typed::<U>(c, 0) else { return Ok(None) };
            vals.push(&v[c.offset()..c.offset() + c.len()]);
        }
        let mut out: Vec<U> = Vec::with_capacity(total);
        copy_values(&vals, spans, &mut out);
        Buffer::from_vec(out)
    });
    let child = ArrayDataBuilder::new(child_dt.clone())
        .len(total)
        .add_buffer(values)
        .build()?;
    let out = ArrayDataBuilder::new(dt.clone())
        .len(n)
        .add_buffer(Buffer::from_vec(out_offsets))
        .add_child_data(child)
        .nulls(nulls(data, runs, n))
        .build()?;
    Ok(Some(make_array(out)))
}

fn bytes<O: OffsetSizeTrait>(
    dt: &DataType,
    data: &[ArrayData],
    runs: &[Run],
    n: usize,
) -> Result<Option<ArrayRef>, ArrowError> {
    let Some(offs) = offsets_of::<O>(data) else {
        return Ok(None);
    };
    let Some(out_offsets) = offsets(&offs, runs, n) else {
        return Ok(None);
    };
    let total = out_offsets[n].as_usize();
    let vals: Vec<&[u8]> = data
        .iter()
        .map(|d| d.buffers().get(1).map_or(&[][..], |b| b.as_slice()))
        .collect();
    let mut out: Vec<u8> = Vec::with_capacity(total);
    for r in runs {
        let o = offs[r.batch];
        out.extend_from_slice(&vals[r.batch][o[r.row].as_usize()..o[r.row + r.len].as_usize()]);
    }
    let out = ArrayDataBuilder::new(dt.clone())
        .len(n)
        .add_buffer(Buffer::from_vec(out_offsets))
        .add_buffer(Buffer::from_vec(out))
        .nulls(nulls(data, runs, n))
        .build()?;
    Ok(Some(make_array(out)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::builder::{GenericListBuilder, Int32Builder};
    use arrow_array::{BooleanArray, Int64Array, StringArray};
    use arrow_schema::{Field, Schema};
    use arrow_select::interleave::interleave_record_batch;
    use proptest::prelude::*;
    use std::sync::Arc;

    /// A batch of `rows` rows from `seed`: int64, list<int32> (empty lists and nulls), utf8, a
    /// boolean and a list with child nulls (both through `interleave`), with nulls when `nulls`.
    fn batch(rows: usize, seed: u64, nulls: bool) -> RecordBatch {
        let v = |i: usize| (seed.wrapping_mul(31).wrapping_add(i as u64 * 7919)) % 97;
        let null = |i: usize| nulls && v(i) % 5 == 0;
        let ids: Int64Array = (0..rows)
            .map(|i| (!null(i)).then_some(v(i) as i64 * 1000 + seed as i64))
            .collect();
        let mut lb = GenericListBuilder::<i32, _>::new(Int32Builder::new());
        let mut cb = GenericListBuilder::<i32, _>::new(Int32Builder::new());
        for i in 0..rows {
            for j in 0..(v(i) % 4) as i32 {
                lb.values().append_value(j + v(i) as i32);
                cb.values().append_option((j % 2 == 0).then_some(j));
            }
            lb.append(!null(i));
            cb.append(true);
        }
        let text: StringArray = (0..rows)
            .map(|i| (!null(i + 1)).then(|| "é".repeat((v(i) % 3) as usize) + &i.to_string()))
            .collect();
        let flags: BooleanArray = (0..rows).map(|i| Some(v(i) % 2 == 0)).collect();
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("tokens", DataType::new_list(DataType::Int32, true), true),
            Field::new("text", DataType::Utf8, true),
            Field::new("flag", DataType::Boolean, true),
            Field::new("holes", DataType::new_list(DataType::Int32, true), true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(ids),
                Arc::new(lb.finish()),
                Arc::new(text),
                Arc::new(flags),
                Arc::new(cb.finish()),
            ],
        )
        .unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        /// Gathering by runs gives exactly `interleave_record_batch`'s batch: inputs with and
        /// without nulls, sliced at an offset, with empty lists, rows taken in runs and singly.
        #[test]
        fn runs_equal_interleave(
            shapes in proptest::collection::vec((1usize..40, 0usize..10, any::<bool>()), 1..5),
            picks in proptest::collection::vec((0usize..5, 1usize..6), 0..60),
        ) {
            let inputs: Vec<RecordBatch> = shapes
                .iter()
                .enumerate()
                .map(|(i, (rows, skip, nulls))| {
                    let b = batch(rows + skip, i as u64, *nulls);
                    b.slice(*skip, *rows)
                })
                .collect();
            // take each input's rows in order, in runs of the picked lengths
            let mut next = vec![0usize; inputs.len()];
            let (mut runs, mut indices) = (Vec::new(), Vec::new());
            for (b, len) in picks {
                let b = b % inputs.len();
                for _ in 0..len {
                    if next[b] < inputs[b].num_rows() {
                        push(&mut runs, b, next[b]);
                        indices.push((b, next[b]));
                        next[b] += 1;
                    }
                }
            }
            let got = columns(&inputs, &runs, indices.len()).unwrap();
            let refs: Vec<&RecordBatch> = inputs.iter().collect();
            let want = interleave_record_batch(&refs, &indices).unwrap();
            prop_assert_eq!(got.len(), want.num_columns());
            for (c, (g, w)) in got.iter().zip(want.columns()).enumerate() {
                prop_assert_eq!(g.data_type(), w.data_type(), "column {}", c);
                prop_assert_eq!(g.len(), indices.len());
                prop_assert_eq!(g.as_ref(), w.as_ref(), "column {}", c);
                g.to_data().validate_full().unwrap();
            }
        }
    }
}

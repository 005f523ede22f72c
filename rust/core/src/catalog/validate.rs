//! arrow-rs's full validation of a decoded IPC record batch, with the offsets of list, map,
//! binary and string arrays checked in one branch-free pass each.
//!
//! arrow-ipc validates every array it decodes (`ArrayData::validate_data`); for offsets that is
//! arrow-data's `validate_each_offset`, an iterator chain costing ~16 instructions an offset:
//! 16k of the ~65k a 1,000-row `list<int32>` batch cost end to end (callgrind, release build),
//! more than pyarrow's whole read of the batch. The IPC decoder is therefore run with its
//! validation off and [`batch`] redoes it here: arrow-data's own `validate`, `validate_nulls`
//! and `validate_values` on every array and child (as `ArrayData::validate_full` does), except
//! that the offsets of those types are checked by [`offsets`] (same conditions: every offset
//! `>= 0`, non-decreasing, `<=` the child's length or the values' bytes; for strings, every
//! offset on a UTF-8 character boundary of a buffer that is valid UTF-8). Where a check fails,
//! arrow-data's own validation runs to produce its error message. Nothing reads the batch's
//! values before this has passed, so a corrupt file stays an error, never undefined behaviour.

use arrow_array::{Array, RecordBatch, RecordBatchOptions};
use arrow_buffer::ArrowNativeType;
use arrow_data::ArrayData;
use arrow_schema::{ArrowError, DataType};

/// `batch` (decoded without validation) validated in full, rebuilt through
/// `RecordBatch::try_new_with_options` (columns match the schema's types, nullability and the
/// row count), as the decoder itself does when it validates.
pub(crate) fn batch(batch: RecordBatch) -> Result<RecordBatch, ArrowError> {
    for c in batch.columns() {
        array(&c.to_data())?;
    }
    let rows = batch.num_rows();
    let (schema, columns, _) = batch.into_parts();
    RecordBatch::try_new_with_options(
        schema,
        columns,
        &RecordBatchOptions::new().with_row_count(Some(rows)),
    )
}

/// `ArrayData::validate_full`, with [`offsets`] for the offsets of lists, maps, binary and
/// strings.
fn array(data: &ArrayData) -> Result<(), ArrowError> {
    data.validate()?;
    data.validate_nulls()?;
    let fast = match data.data_type() {
        DataType::List(_) | DataType::Map(..) => {
            offsets::<i32>(data, data.child_data().first().map(|c| c.len()), None)
        }
        DataType::LargeList(_) => {
            offsets::<i64>(data, data.child_data().first().map(|c| c.len()), None)
        }
        DataType::Binary => offsets::<i32>(data, data.buffers().get(1).map(|b| b.len()), None),
        DataType::LargeBinary => offsets::<i64>(data, data.buffers().get(1).map(|b| b.len()), None),
        DataType::Utf8 => utf8::<i32>(data),
        DataType::LargeUtf8 => utf8::<i64>(data),
        _ => false,
    };
    if !fast {
        // Any other type, or a failed check: arrow-data decides, with its own message.
        data.validate_values()?;
    }
    for (i, child) in data.child_data().iter().enumerate() {
        array(child).map_err(|e| {
            ArrowError::InvalidArgumentError(format!(
                "{} child #{i} invalid: {e}",
                data.data_type()
            ))
        })?;
    }
    Ok(())
}

/// Whether `data`'s offsets (buffer 0, `len + 1` of them from `offset`) are all `>= 0`,
/// non-decreasing and `<= limit`; with `text`, also each on a character boundary of it.
/// `false` also for anything unexpected (a missing buffer, misalignment): the caller then
/// lets arrow-data judge.
fn offsets<T: ArrowNativeType + Into<i64>>(
    data: &ArrayData,
    limit: Option<usize>,
    text: Option<&[u8]>,
) -> bool {
    let (Some(limit), Some(buf)) = (limit, data.buffers().first()) else {
        return false;
    };
    if data.is_empty() && buf.is_empty() {
        return true; // no offsets at all: valid for an empty array
    }
    // SAFETY: any bit pattern is a valid `T` (an integer); misalignment is refused below.
    let (head, all, _) = unsafe { buf.as_slice().align_to::<T>() };
    let Some(offs) = head
        .is_empty()
        .then(|| all.get(data.offset()..data.offset() + data.len() + 1))
        .flatten()
    else {
        return false;
    };
    let (first, last): (i64, i64) = (offs[0].into(), offs[offs.len() - 1].into());
    // No early exit: the loop vectorizes, and a valid batch (the common case) reads it all.
    let rising = offs
        .iter()
        .zip(&offs[1..])
        .fold(true, |ok, (a, b)| ok & ((*a).into() <= (*b).into()));
    if !(rising && first >= 0 && last as u64 <= limit as u64) {
        return false;
    }
    match text {
        // A UTF-8 continuation byte is 0b10xxxxxx: as an `i8`, below -0x40.
        Some(bytes) => offs.iter().fold(true, |ok, o| {
            let o: i64 = (*o).into();
            ok & bytes.get(o as usize).is_none_or(|b| *b as i8 >= -0x40)
        }),
        None => true,
    }
}

/// A string array's offsets (as [`offsets`]) and values: valid UTF-8, every string starting and
/// ending on a character boundary — arrow-data's conditions, checked on the whole buffer as it
/// does first.
fn utf8<T: ArrowNativeType + Into<i64>>(data: &ArrayData) -> bool {
    let Some(values) = data.buffers().get(1) else {
        return false;
    };
    std::str::from_utf8(values.as_slice()).is_ok()
        && offsets::<T>(data, Some(values.len()), Some(values.as_slice()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, BinaryArray, Int32Array, ListArray, StringArray};
    use arrow_buffer::Buffer;
    use arrow_schema::Field;

    use super::*;

    /// `data` with its offsets buffer replaced (nothing validated).
    fn with_offsets(data: &ArrayData, offs: &[i32]) -> ArrayData {
        let mut bufs = data.buffers().to_vec();
        bufs[0] = Buffer::from_slice_ref(offs);
        let b = data.clone().into_builder().buffers(bufs);
        // SAFETY: the result is only ever validated, never read.
        unsafe { b.build_unchecked() }
    }

    /// Whether ours and arrow-data's `validate_full` agree on `data`, and ours' verdict.
    fn agree(data: &ArrayData) -> bool {
        let ours = array(data);
        let arrow = data.validate_full();
        assert_eq!(ours.is_ok(), arrow.is_ok(), "{ours:?} vs {arrow:?}");
        ours.is_ok()
    }

    #[test]
    fn offsets_checked_as_arrow_does() {
        let list = ListArray::from_iter_primitive::<arrow_array::types::Int32Type, _, _>(vec![
            Some(vec![Some(1), Some(2)]),
            Some(vec![]),
            Some(vec![Some(3)]),
        ])
        .to_data();
        let text = StringArray::from(vec!["ab", "", "é"]).to_data(); // bytes: a b 0xC3 0xA9
        let bin = BinaryArray::from(vec![&b"ab"[..], b"", b"c"]).to_data();
        assert!(agree(&list) && agree(&text) && agree(&bin));
        assert!(agree(&list.slice(1, 2)) && agree(&text.slice(2, 1)));
        let bad = [
            [0, 2, 1, 3],  // falls
            [-1, 2, 2, 3], // negative
            [0, 2, 2, 5],  // past the end
        ];
        for offs in bad {
            assert!(!agree(&with_offsets(&list, &offs)), "{offs:?}");
            assert!(!agree(&with_offsets(&bin, &offs)), "{offs:?}");
            assert!(!agree(&with_offsets(&text, &offs)), "{offs:?}");
        }
        // A string ending inside 'é' (its second byte 0xA9 is a continuation byte).
        assert!(!agree(&with_offsets(&text, &[0, 2, 2, 3])));
        assert!(agree(&with_offsets(&text, &[0, 1, 2, 4])));
    }

    #[test]
    fn a_bad_child_is_found_and_named() {
        // The list's values: a string column with falling offsets, two levels down.
        let text = StringArray::from(vec!["ab", "c"]).to_data();
        let text = with_offsets(&text, &[0, 2, 1]);
        let list = ArrayData::builder(DataType::List(Arc::new(Field::new(
            "item",
            DataType::Utf8,
            true,
        ))))
        .len(1)
        .add_buffer(Buffer::from_slice_ref([0i32, 2]))
        .add_child_data(text)
        .build()
        .unwrap();
        let err = array(&list).unwrap_err().to_string();
        assert!(err.contains("child #0 invalid"), "{err}");
        assert!(list.validate_full().is_err());
        let ok: ArrayRef = Arc::new(Int32Array::from(vec![1, 2]));
        assert!(agree(&ok.to_data()));
    }
}

//! The allocator's age limit follows the streams reading data (`alloc::Reading`): a stream
//! counts from its first read until it is dropped, so a mixture's K sources count K times. Its
//! own test binary, alone in its process: the count is process-wide.

use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch};
use parquet::arrow::ArrowWriter;
use shardstream_core::alloc::reading;
use shardstream_core::{Catalog, Slot, Stream, StreamOptions};

#[test]
fn streams_count_as_reading_from_their_first_read_until_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.parquet");
    let batch =
        RecordBatch::try_from_iter([("id", Arc::new(Int64Array::from_iter_values(0..100)) as _)])
            .unwrap();
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let cat = Arc::new(Catalog::open(&[path.to_string_lossy().into_owned()], None).unwrap());
    let opts = || StreamOptions {
        epochs: Some(1),
        shuffle_buffer: 10,
        ..Default::default()
    };
    let slot = Slot::new(0, 1).unwrap();
    let mut a = Stream::new(cat.clone(), opts(), slot).unwrap();
    let mut b = Stream::new(cat, opts(), slot).unwrap();
    assert_eq!(reading(), 0, "made, not read yet");
    assert!(a.next_batch(7).unwrap().is_some());
    assert_eq!(reading(), 1);
    assert!(b.next_batch(7).unwrap().is_some());
    assert_eq!(reading(), 2);
    drop(a);
    assert_eq!(reading(), 1);
    drop(b);
    assert_eq!(reading(), 0);
}

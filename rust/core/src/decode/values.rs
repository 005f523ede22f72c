//! Leaf values: the arrow types the fast path produces, how each is stored in Parquet, and the
//! two value encodings it decodes (PLAIN, and dictionary indices into a PLAIN dictionary page).

use arrow_array::types::{
    Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type,
    UInt64Type, UInt8Type,
};
use arrow_array::ArrowPrimitiveType;
use arrow_schema::DataType;
use bytes::Bytes;
use parquet::basic::Type as Physical;
use parquet::errors::{ParquetError, Result};

use super::rle::{Dict, Rle};

/// An arrow primitive type read from one Parquet physical type, converted value by value as
/// arrow-rs converts it (`INT32` to `Int8` truncates like `as i8`, to `UInt32` reinterprets).
pub(crate) trait Kind: Send + 'static {
    type Arrow: ArrowPrimitiveType;
    /// Bytes per value in PLAIN encoding.
    const WIDTH: usize;
    /// One value from exactly `WIDTH` little-endian bytes.
    fn read(b: &[u8]) -> Native<Self>;
}

pub(crate) type Native<K> = <<K as Kind>::Arrow as ArrowPrimitiveType>::Native;

macro_rules! kind {
    ($name:ident, $arrow:ty, $raw:ty, $width:expr, $conv:expr) => {
        pub(crate) struct $name;
        impl Kind for $name {
            type Arrow = $arrow;
            const WIDTH: usize = $width;
            #[inline(always)]
            fn read(b: &[u8]) -> Native<Self> {
                let raw = <$raw>::from_le_bytes(b.try_into().expect("WIDTH bytes"));
                $conv(raw)
            }
        }
    };
}

kind!(I32, Int32Type, i32, 4, |v: i32| v);
kind!(I32AsI8, Int8Type, i32, 4, |v: i32| v as i8);
kind!(I32AsI16, Int16Type, i32, 4, |v: i32| v as i16);
kind!(I32AsU8, UInt8Type, i32, 4, |v: i32| v as u8);
kind!(I32AsU16, UInt16Type, i32, 4, |v: i32| v as u16);
kind!(I32AsU32, UInt32Type, i32, 4, |v: i32| v as u32);
kind!(I64, Int64Type, i64, 8, |v: i64| v);
kind!(I64AsU64, UInt64Type, i64, 8, |v: i64| v as u64);
kind!(F32, Float32Type, f32, 4, |v: f32| v);
kind!(F64, Float64Type, f64, 8, |v: f64| v);

/// Which [`Kind`] reads arrow type `t` from physical type `p`, if the fast path has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KindId {
    I32,
    I32AsI8,
    I32AsI16,
    I32AsU8,
    I32AsU16,
    I32AsU32,
    I64,
    I64AsU64,
    F32,
    F64,
}

impl KindId {
    pub(crate) fn of(t: &DataType, p: Physical) -> Option<KindId> {
        Some(match (t, p) {
            (DataType::Int32, Physical::INT32) => KindId::I32,
            (DataType::Int8, Physical::INT32) => KindId::I32AsI8,
            (DataType::Int16, Physical::INT32) => KindId::I32AsI16,
            (DataType::UInt8, Physical::INT32) => KindId::I32AsU8,
            (DataType::UInt16, Physical::INT32) => KindId::I32AsU16,
            (DataType::UInt32, Physical::INT32) => KindId::I32AsU32,
            (DataType::Int64, Physical::INT64) => KindId::I64,
            (DataType::UInt64, Physical::INT64) => KindId::I64AsU64,
            (DataType::Float32, Physical::FLOAT) => KindId::F32,
            (DataType::Float64, Physical::DOUBLE) => KindId::F64,
            _ => return None,
        })
    }
}

/// `n` PLAIN values from the front of `data`.
pub(crate) fn plain<K: Kind>(data: &[u8], n: usize, out: &mut Vec<Native<K>>) -> Result<()> {
    let bytes = n
        .checked_mul(K::WIDTH)
        .filter(|&b| b <= data.len())
        .ok_or_else(|| {
            ParquetError::General(format!(
                "{n} values of {} bytes do not fit the {} bytes left in the page",
                K::WIDTH,
                data.len()
            ))
        })?;
    out.extend(data[..bytes].chunks_exact(K::WIDTH).map(K::read));
    Ok(())
}

/// A PLAIN dictionary page read in place: entries are converted as they are gathered, so a large
/// dictionary whose entries are each used about once (ids, scores) is not copied first.
pub(crate) struct PlainDict<'a, K: Kind> {
    bytes: &'a [u8],
    _kind: std::marker::PhantomData<K>,
}

impl<'a, K: Kind> PlainDict<'a, K> {
    /// `bytes` holds exactly the entries (see [`dictionary`]).
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        PlainDict {
            bytes,
            _kind: std::marker::PhantomData,
        }
    }
}

impl<K: Kind> Dict for PlainDict<'_, K> {
    type Value = Native<K>;
    fn len(&self) -> usize {
        self.bytes.len() / K::WIDTH
    }
    #[inline(always)]
    fn get(&self, i: usize) -> Option<Native<K>> {
        let at = i.checked_mul(K::WIDTH)?;
        self.bytes.get(at..at + K::WIDTH).map(K::read)
    }
}

/// The entries of a PLAIN dictionary page of `n` values: its first `n * WIDTH` bytes.
pub(crate) fn dictionary<K: Kind>(buf: Bytes, n: usize) -> Result<Bytes> {
    n.checked_mul(K::WIDTH)
        .filter(|&b| b <= buf.len())
        .map(|b| buf.slice(..b))
        .ok_or_else(|| {
            ParquetError::General(format!(
                "dictionary page of {} bytes holds fewer than {n} values",
                buf.len()
            ))
        })
}

/// Where a data page's values come from.
pub(crate) enum Source {
    Plain { data: Bytes, pos: usize },
    Dict(Box<Rle>),
}

impl Source {
    pub(crate) fn read<K: Kind>(
        &mut self,
        n: usize,
        dict: &[u8],
        out: &mut Vec<Native<K>>,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        match self {
            Source::Plain { data, pos } => {
                plain::<K>(&data[*pos..], n, out)?;
                *pos += n * K::WIDTH;
                Ok(())
            }
            Source::Dict(idx) => idx.gather(&PlainDict::<K>::new(dict), n, out),
        }
    }

    pub(crate) fn skip<K: Kind>(&mut self, n: usize) -> Result<()> {
        match self {
            Source::Plain { data, pos } => {
                let end = n
                    .checked_mul(K::WIDTH)
                    .and_then(|b| pos.checked_add(b))
                    .filter(|&e| e <= data.len())
                    .ok_or_else(|| {
                        ParquetError::General(format!("{n} values to skip run past the page"))
                    })?;
                *pos = end;
                Ok(())
            }
            Source::Dict(idx) => idx.skip(n),
        }
    }
}

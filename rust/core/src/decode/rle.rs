//! The RLE / bit-packed hybrid encoding of Parquet levels and dictionary indices, decoded a run at
//! a time: a repeated run is one (value, count) pair whatever its length, so a page whose
//! definition levels are all "present" costs one step, not one per value.
//!
//! Format (parquet-format Encodings.md): a sequence of runs, each a ULEB128 header then either
//! `header >> 1` copies of one value stored in `ceil(bit_width / 8)` little-endian bytes
//! (`header & 1 == 0`), or `header >> 1` groups of 8 values bit-packed LSB first
//! (`header & 1 == 1`). Corrupt input is an error, never a panic or an unbounded loop: every
//! header consumes at least one byte.

use bytes::Bytes;
use parquet::errors::{ParquetError, Result};

fn err(msg: impl Into<String>) -> ParquetError {
    ParquetError::General(msg.into())
}

/// What dictionary indices point into.
pub(crate) trait Dict {
    type Value: Copy;
    fn len(&self) -> usize;
    /// Entry `i`, `None` past the end.
    fn get(&self, i: usize) -> Option<Self::Value>;
}

impl<T: Copy> Dict for [T] {
    type Value = T;
    fn len(&self) -> usize {
        <[T]>::len(self)
    }
    #[inline(always)]
    fn get(&self, i: usize) -> Option<T> {
        <[T]>::get(self, i).copied()
    }
}

/// Values unpacked per literal window (a packed run longer than this is served in windows).
const WINDOW: usize = 64;

#[derive(Clone, Copy, Debug)]
enum Current {
    /// No run loaded.
    None,
    Repeat {
        value: u32,
        left: usize,
    },
    /// A bit-packed run of `len` values starting at byte `start` of `data`, `pos` consumed.
    Packed {
        start: usize,
        pos: usize,
        len: usize,
    },
}

/// A decoder over one buffer of hybrid-encoded values of `bit_width` bits (at most 32).
pub(crate) struct Rle {
    data: Bytes,
    /// Next unread byte (the header of the run after the current one).
    pos: usize,
    bit_width: u32,
    mask: u64,
    run: Current,
    /// Unpacked values of the current packed run (level reads), `lit[at..len]` not yet consumed.
    lit: [u32; WINDOW],
    at: usize,
    len: usize,
}

/// The next values of a level stream, borrowed until consumed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Run<'a> {
    /// `.1` copies of `.0`.
    Repeat(u32, usize),
    /// Values one by one (never empty).
    Literal(&'a [u32]),
}

impl Rle {
    pub(crate) fn new(data: Bytes, bit_width: u32) -> Result<Self> {
        if bit_width > 32 {
            return Err(err(format!("bit width {bit_width} is over 32")));
        }
        Ok(Rle {
            data,
            pos: 0,
            bit_width,
            mask: if bit_width == 0 {
                0
            } else {
                u64::MAX >> (64 - bit_width)
            },
            run: Current::None,
            lit: [0; WINDOW],
            at: 0,
            len: 0,
        })
    }

    /// Load the next run; `false` when the buffer has no more runs.
    fn next_run(&mut self) -> Result<bool> {
        loop {
            if self.pos >= self.data.len() {
                return Ok(false);
            }
            let header = self.varint()?;
            let count = (header >> 1) as usize;
            if header & 1 == 0 {
                let width = self.bit_width.div_ceil(8) as usize;
                let bytes = self
                    .data
                    .get(self.pos..self.pos + width)
                    .ok_or_else(|| err("repeated run cut off"))?;
                let mut le = [0u8; 4];
                le[..width].copy_from_slice(bytes);
                let value = u32::from_le_bytes(le);
                if u64::from(value) > self.mask {
                    return Err(err(format!(
                        "repeated value {value} does not fit {} bits",
                        self.bit_width
                    )));
                }
                self.pos += width;
                if count > 0 {
                    self.run = Current::Repeat { value, left: count };
                    return Ok(true);
                }
            } else {
                let bytes = count
                    .checked_mul(self.bit_width as usize)
                    .ok_or_else(|| err("bit-packed run too long"))?;
                let start = self.pos;
                let avail = self.data.len() - start;
                // A writer may stop the last run at the last value it needs, not at a group of 8.
                let values = if bytes <= avail || self.bit_width == 0 {
                    count * 8
                } else {
                    avail * 8 / self.bit_width as usize
                };
                self.pos = start + bytes.min(avail);
                if values > 0 {
                    self.run = Current::Packed {
                        start,
                        pos: 0,
                        len: values,
                    };
                    self.at = 0;
                    self.len = 0;
                    return Ok(true);
                }
            }
        }
    }

    fn varint(&mut self) -> Result<u32> {
        let mut v: u64 = 0;
        for i in 0..5 {
            let b = *self
                .data
                .get(self.pos)
                .ok_or_else(|| err("run header cut off"))?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return u32::try_from(v).map_err(|_| err("run header over 32 bits"));
            }
        }
        Err(err("run header over 5 bytes"))
    }

    /// The value at bit `bit` of the buffer (bits past its end read as zero).
    #[inline(always)]
    fn unpack(&self, bit: usize) -> u32 {
        let byte = bit >> 3;
        let word = match self.data.get(byte..byte + 8) {
            Some(b) => u64::from_le_bytes(b.try_into().expect("8 bytes")),
            None => {
                let mut w = [0u8; 8];
                let tail = self.data.get(byte..).unwrap_or(&[]);
                w[..tail.len()].copy_from_slice(tail);
                u64::from_le_bytes(w)
            }
        };
        ((word >> (bit & 7)) & self.mask) as u32
    }

    /// The values ahead without consuming them; `None` at the end of the buffer. A packed run is
    /// shown a window at a time. Every value is checked to be at most `max`.
    pub(crate) fn peek(&mut self, max: u32) -> Result<Option<Run<'_>>> {
        loop {
            match self.run {
                Current::None => {
                    if !self.next_run()? {
                        return Ok(None);
                    }
                }
                Current::Repeat { value, left } => {
                    if value > max {
                        return Err(err(format!("level {value} is over the maximum {max}")));
                    }
                    return Ok(Some(Run::Repeat(value, left)));
                }
                Current::Packed { start, pos, len } => {
                    if self.at == self.len {
                        let n = (len - pos).min(WINDOW);
                        let w = self.bit_width as usize;
                        let bit = start * 8 + pos * w;
                        let mut top = 0;
                        for i in 0..n {
                            let v = self.unpack(bit + i * w);
                            top = top.max(v);
                            self.lit[i] = v;
                        }
                        if top > max {
                            return Err(err(format!("level {top} is over the maximum {max}")));
                        }
                        self.at = 0;
                        self.len = n;
                    }
                    return Ok(Some(Run::Literal(&self.lit[self.at..self.len])));
                }
            }
        }
    }

    /// Consume `n` values of what [`Rle::peek`] showed (`n` at most its length).
    pub(crate) fn consume(&mut self, n: usize) {
        match &mut self.run {
            Current::None => debug_assert_eq!(n, 0),
            Current::Repeat { left, .. } => {
                *left -= n;
                if *left == 0 {
                    self.run = Current::None;
                }
            }
            Current::Packed { pos, len, .. } => {
                *pos += n;
                // past the unpacked window (a skip or gather) leaves it empty: the next peek refills
                self.at = (self.at + n).min(self.len);
                if *pos == *len {
                    self.run = Current::None;
                }
            }
        }
    }

    /// Skip `n` values (an error if the buffer has fewer).
    pub(crate) fn skip(&mut self, mut n: usize) -> Result<()> {
        while n > 0 {
            if let Current::None = self.run {
                if !self.next_run()? {
                    return Err(err(format!("{n} values missing")));
                }
            }
            let k = match self.run {
                Current::Repeat { left, .. } => left.min(n),
                Current::Packed { pos, len, .. } => (len - pos).min(n),
                Current::None => unreachable!("a run was just loaded"),
            };
            self.consume(k);
            n -= k;
        }
        Ok(())
    }

    /// Append `dict[i]` for the next `n` indices `i` (an error if one is out of range or the
    /// buffer ends first).
    pub(crate) fn gather<D: Dict + ?Sized>(
        &mut self,
        dict: &D,
        mut n: usize,
        out: &mut Vec<D::Value>,
    ) -> Result<()> {
        out.reserve(n);
        while n > 0 {
            if let Current::None = self.run {
                if !self.next_run()? {
                    return Err(err(format!("{n} dictionary indices missing")));
                }
            }
            match self.run {
                Current::Repeat { value, left } => {
                    let k = left.min(n);
                    let v = dict
                        .get(value as usize)
                        .ok_or_else(|| bad_index(value, dict.len()))?;
                    out.extend(std::iter::repeat_n(v, k));
                    self.consume(k);
                    n -= k;
                }
                Current::Packed { start, pos, len } => {
                    let k = (len - pos).min(n);
                    self.gather_packed(start, pos, k, dict, out)?;
                    self.consume(k);
                    n -= k;
                }
                Current::None => unreachable!("a run was just loaded"),
            }
        }
        Ok(())
    }
}

impl Rle {
    /// `dict[i]` for values `pos..pos + k` of the packed run at byte `start`: whole groups of 8
    /// by a loop specialised to the bit width, the ragged ends one by one.
    fn gather_packed<D: Dict + ?Sized>(
        &self,
        start: usize,
        pos: usize,
        k: usize,
        dict: &D,
        out: &mut Vec<D::Value>,
    ) -> Result<()> {
        let w = self.bit_width as usize;
        if w == 0 {
            let v = dict.get(0).ok_or_else(|| bad_index(0, 0))?;
            out.extend(std::iter::repeat_n(v, k));
            return Ok(());
        }
        let one = |i: usize| {
            let idx = self.unpack(start * 8 + (pos + i) * w);
            dict.get(idx as usize)
                .ok_or_else(|| bad_index(idx, dict.len()))
        };
        let mut i = 0;
        while i < k && (pos + i) % 8 != 0 {
            out.push(one(i)?);
            i += 1;
        }
        let first = start + (pos + i) / 8 * w; // byte of the next whole group
        let groups = ((k - i) / 8).min(self.data.len().saturating_sub(first) / w);
        if groups > 0 {
            gather_groups(w, &self.data[first..first + groups * w], dict, out)?;
            i += groups * 8;
        }
        while i < k {
            out.push(one(i)?);
            i += 1;
        }
        Ok(())
    }
}

/// `dict[i]` for the indices in `src`: groups of 8 values of `w` bits (`w` bytes each).
fn gather_groups<D: Dict + ?Sized>(
    w: usize,
    src: &[u8],
    dict: &D,
    out: &mut Vec<D::Value>,
) -> Result<()> {
    let n = src.len() / w.max(1) * 8;
    let len = out.len();
    out.reserve(n);
    let spare = &mut out.spare_capacity_mut()[..n];
    macro_rules! widths {
        ($($w:literal)*) => {
            match w {
                $($w => {
                    for (g, o) in src.chunks_exact($w).zip(spare.chunks_exact_mut(8)) {
                        let mut idx = [0u32; 8];
                        unpack8::<$w>(g.try_into().expect("w bytes"), &mut idx);
                        for (slot, &i) in o.iter_mut().zip(&idx) {
                            let v = dict.get(i as usize).ok_or_else(|| bad_index(i, dict.len()))?;
                            slot.write(v);
                        }
                    }
                })*
                _ => return Err(err(format!("bit width {w} is not 1..=32"))),
            }
        };
    }
    widths!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32);
    // SAFETY: the loop above wrote all `n` slots after `len` (an error returns before this line).
    unsafe { out.set_len(len + n) };
    Ok(())
}

/// 8 values of `W` bits from `W` bytes (LSB first): every shift and mask a constant.
#[inline(always)]
fn unpack8<const W: usize>(src: &[u8; W], out: &mut [u32; 8]) {
    let mut buf = [0u8; 40];
    buf[..W].copy_from_slice(src);
    let mask = if W == 32 {
        u64::from(u32::MAX)
    } else {
        (1u64 << W) - 1
    };
    for (j, o) in out.iter_mut().enumerate() {
        let bit = j * W;
        let word = u64::from_le_bytes(buf[bit / 8..bit / 8 + 8].try_into().expect("8 bytes"));
        *o = ((word >> (bit % 8)) & mask) as u32;
    }
}

fn bad_index(idx: u32, len: usize) -> ParquetError {
    err(format!(
        "dictionary index {idx} out of range (dictionary of {len})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A reference encoder: runs of >= 8 equal values as repeated runs, the rest bit-packed.
    pub(crate) fn encode(values: &[u32], bit_width: u32) -> Vec<u8> {
        let mut out = Vec::new();
        let mut i = 0;
        let uleb = |out: &mut Vec<u8>, mut v: u64| loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                break;
            }
            out.push(b | 0x80);
        };
        while i < values.len() {
            let mut j = i;
            while j < values.len() && values[j] == values[i] {
                j += 1;
            }
            if j - i >= 8 {
                uleb(&mut out, ((j - i) as u64) << 1);
                let width = bit_width.div_ceil(8) as usize;
                out.extend_from_slice(&values[i].to_le_bytes()[..width]);
                i = j;
                continue;
            }
            // a bit-packed stretch up to the next run of 8 equal values, in groups of 8
            let mut end = i;
            while end < values.len() {
                let mut k = end;
                while k < values.len() && values[k] == values[end] {
                    k += 1;
                }
                if k - end >= 8 {
                    break;
                }
                end = k;
            }
            // a bit-packed run holds whole groups of 8 real values; only the last may be padded
            let groups = (end - i).div_ceil(8);
            let end = (i + groups * 8).min(values.len());
            uleb(&mut out, ((groups as u64) << 1) | 1);
            let mut bits: Vec<bool> = Vec::new();
            for g in 0..groups * 8 {
                let v = values
                    .get(i + g)
                    .copied()
                    .filter(|_| i + g < end)
                    .unwrap_or(0);
                for b in 0..bit_width {
                    bits.push(v >> b & 1 == 1);
                }
            }
            for chunk in bits.chunks(8) {
                out.push(chunk.iter().enumerate().map(|(k, &b)| (b as u8) << k).sum());
            }
            i = end;
        }
        out
    }

    fn read_levels(data: Vec<u8>, bw: u32, n: usize, max: u32) -> Result<Vec<u32>> {
        let mut d = Rle::new(Bytes::from(data), bw)?;
        let mut out = Vec::new();
        while out.len() < n {
            match d.peek(max)? {
                None => break,
                Some(Run::Repeat(v, k)) => {
                    let k = k.min(n - out.len()).min(3); // consume in odd steps
                    out.extend(std::iter::repeat_n(v, k));
                    d.consume(k);
                }
                Some(Run::Literal(s)) => {
                    let k = s.len().min(n - out.len()).min(5);
                    out.extend_from_slice(&s[..k]);
                    d.consume(k);
                }
            }
        }
        Ok(out)
    }

    #[test]
    fn known_bytes() {
        // parquet-format's example: bit-packed 0..7 with width 3
        let data = vec![0x03, 0b10001000, 0b11000110, 0b11111010];
        assert_eq!(
            read_levels(data, 3, 8, 7).unwrap(),
            (0..8).collect::<Vec<_>>()
        );
        // a repeated run of 300 copies of 5 (width 3: one value byte)
        let data = vec![0xd8, 0x04, 5];
        assert_eq!(read_levels(data, 3, 300, 7).unwrap(), vec![5; 300]);
    }

    #[test]
    fn corrupt_input_is_an_error() {
        assert!(read_levels(vec![0x80, 0x80, 0x80, 0x80, 0x80, 0x01], 2, 10, 3).is_err());
        assert!(read_levels(vec![0x04], 8, 2, 3).is_err()); // repeated value cut off
        assert!(read_levels(vec![0x04, 9], 4, 2, 3).is_err()); // level over the maximum
        assert!(Rle::new(Bytes::new(), 33).is_err());
        let mut d = Rle::new(Bytes::from(vec![0x04, 7]), 3).unwrap();
        let mut out = Vec::new();
        assert!(d.gather(&[1i32, 2][..], 2, &mut out).is_err()); // index 7 of 2
        let mut d = Rle::new(Bytes::from(vec![0x04, 1]), 3).unwrap();
        assert!(d.gather(&[1i32, 2][..], 3, &mut out).is_err()); // only 2 indices
    }

    proptest! {
        #[test]
        fn roundtrip(bw in 0u32..=32, raw in proptest::collection::vec((any::<u32>(), 1usize..20), 0..60),
                     skip in 0usize..40) {
            let mask = if bw == 0 { 0 } else { u32::MAX >> (32 - bw) };
            let values: Vec<u32> = raw.iter().flat_map(|&(v, n)| std::iter::repeat_n(v & mask, n)).collect();
            let data = encode(&values, bw);
            prop_assert_eq!(read_levels(data.clone(), bw, values.len(), u32::MAX).unwrap(), values.clone());
            let dict: Vec<u64> = (0..=u64::from(mask)).take(1 << 12).collect();
            if values.iter().all(|&v| (v as usize) < dict.len()) {
                let mut d = Rle::new(Bytes::from(data), bw).unwrap();
                let skip = skip.min(values.len());
                d.skip(skip).unwrap();
                let mut out = Vec::new();
                d.gather(&dict[..], values.len() - skip, &mut out).unwrap();
                let want: Vec<u64> = values[skip..].iter().map(|&v| v as u64).collect();
                prop_assert_eq!(out, want);
            }
        }

        #[test]
        fn random_bytes_never_panic(bw in 0u32..=32, data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = read_levels(data.clone(), bw, 500, 3);
            let mut d = Rle::new(Bytes::from(data), bw).unwrap();
            let mut out = Vec::new();
            let _ = d.gather(&[0u8; 5][..], 500, &mut out);
        }
    }
}

//! Files from other writers that pyarrow (Arrow C++) reads but arrow-rs refuses, read the way
//! Arrow C++ reads them. Each workaround is narrow, runs only where the writer's bug is known
//! to produce the file, and changes nothing for any file arrow-rs reads as is:
//!
//! * **A footer field of an unexpected Thrift type** (seen: Dremio's parquet-mr 1.12 fork
//!   writes `ColumnMetaData` field 15 as a list of page headers; the Parquet spec has
//!   `15: optional i32 bloom_filter_length`). Thrift's generated readers (C++, Java) skip a
//!   field whose wire type is not the declared one; arrow-rs 59 decodes field 15 as an i32
//!   whatever its wire type, loses its place, and fails ("Expected list element type of I64
//!   but got I16"). Only when arrow-rs fails to parse a footer, [`sanitize_footer`] drops
//!   such fields from `FileMetaData`, `RowGroup`, `ColumnChunk` and `ColumnMetaData` (as the
//!   generated readers would) and the result is parsed again.
//! * **A footer `num_rows` that disagrees with the row groups** (old parquet-rs wrote 0):
//!   arrow-rs caps its batch size at the footer's count and reads no row; the count is set to
//!   the row groups' sum, which every reader goes by ([`fix_num_rows`]).
//! * **`dictionary_page_offset = 0`** (parquet-mr writes it for "no dictionary page"): arrow-rs
//!   would start the column chunk at byte 0, inside the file's magic. An offset inside the
//!   magic is dropped, as Arrow C++ ignores it.
//! * **Dictionary page headers left out of the column chunk size** (parquet-mr before 1.2.9,
//!   IMPALA-694 / PARQUET-816): `total_compressed_size` excludes the dictionary page's header,
//!   so the last page of the chunk seems to run past its end ("Invalid page header"). Arrow
//!   C++ pads such chunks; here, for files from those writers only, the chunk's pages are
//!   walked and, if they end exactly one dictionary page header past the recorded size, the
//!   size is corrected by that header's length.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use parquet::file::metadata::{
    FileMetaData, PageIndexPolicy, ParquetMetaData, ParquetMetaDataBuilder, ParquetMetaDataReader,
};

use crate::error::{Error, Result};

// Thrift compact protocol wire types.
const STOP: u8 = 0;
const BOOL_TRUE: u8 = 1;
const BOOL_FALSE: u8 = 2;
const I8: u8 = 3;
const I16: u8 = 4;
const I32: u8 = 5;
const I64: u8 = 6;
const DOUBLE: u8 = 7;
const BINARY: u8 = 8;
const LIST: u8 = 9;
const SET: u8 = 10;
const MAP: u8 = 11;
const STRUCT: u8 = 12;
const UUID: u8 = 13;
/// Nesting deeper than this is not a Parquet footer (and would risk the stack).
const MAX_DEPTH: usize = 64;

/// A cursor over compact-protocol bytes; every read is bounds-checked (`None`: malformed).
struct Cursor<'a> {
    b: &'a [u8],
    p: usize,
}

impl Cursor<'_> {
    fn byte(&mut self) -> Option<u8> {
        let x = *self.b.get(self.p)?;
        self.p += 1;
        Some(x)
    }

    fn varint(&mut self) -> Option<u64> {
        let mut out = 0u64;
        for shift in (0..64).step_by(7) {
            let x = self.byte()?;
            out |= u64::from(x & 0x7f) << shift;
            if x & 0x80 == 0 {
                return Some(out);
            }
        }
        None
    }

    fn zigzag(&mut self) -> Option<i64> {
        let z = self.varint()?;
        Some((z >> 1) as i64 ^ -((z & 1) as i64))
    }

    fn advance(&mut self, n: u64) -> Option<()> {
        let end = self.p.checked_add(usize::try_from(n).ok()?)?;
        (end <= self.b.len()).then(|| self.p = end)
    }

    /// A field header: `Some((id, wire type))`, `Some((_, STOP))` at the struct's end.
    fn field(&mut self, last: i16) -> Option<(i16, u8)> {
        let h = self.byte()?;
        let t = h & 0x0f;
        if t == STOP {
            return Some((0, STOP));
        }
        let delta = h >> 4;
        let id = if delta != 0 {
            last.checked_add(i16::from(delta))?
        } else {
            i16::try_from(self.zigzag()?).ok()?
        };
        Some((id, t))
    }

    fn skip(&mut self, t: u8, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match t {
            BOOL_TRUE | BOOL_FALSE => Some(()),
            I8 => self.advance(1),
            I16 | I32 | I64 => self.varint().map(|_| ()),
            DOUBLE => self.advance(8),
            UUID => self.advance(16),
            BINARY => {
                let n = self.varint()?;
                self.advance(n)
            }
            LIST | SET => {
                let h = self.byte()?;
                let et = h & 0x0f;
                let n = match h >> 4 {
                    15 => self.varint()?,
                    n => u64::from(n),
                };
                for _ in 0..n {
                    if matches!(et, BOOL_TRUE | BOOL_FALSE) {
                        self.advance(1)?;
                    } else {
                        self.skip(et, depth + 1)?;
                    }
                }
                Some(())
            }
            MAP => {
                let n = self.varint()?;
                if n == 0 {
                    return Some(());
                }
                let kv = self.byte()?;
                for _ in 0..n {
                    self.skip(kv >> 4, depth + 1)?;
                    self.skip(kv & 0x0f, depth + 1)?;
                }
                Some(())
            }
            STRUCT => {
                let mut last = 0;
                loop {
                    let (id, t) = self.field(last)?;
                    if t == STOP {
                        return Some(());
                    }
                    self.skip(t, depth + 1)?;
                    last = id;
                }
            }
            _ => None,
        }
    }
}

/// The structs whose fields are checked, and the declared wire type of each known field.
#[derive(Clone, Copy)]
enum Struct {
    FileMetaData,
    RowGroup,
    ColumnChunk,
    ColumnMetaData,
}

impl Struct {
    fn declared(self, id: i16) -> Option<u8> {
        use Struct::*;
        Some(match (self, id) {
            (FileMetaData, 1) => I32,
            (FileMetaData, 2 | 4 | 5 | 7) => LIST,
            (FileMetaData, 3) => I64,
            (FileMetaData, 6 | 9) => BINARY,
            (FileMetaData, 8) => STRUCT,
            (RowGroup, 1 | 4) => LIST,
            (RowGroup, 2 | 3 | 5 | 6) => I64,
            (RowGroup, 7) => I16,
            (ColumnChunk, 1 | 9) => BINARY,
            (ColumnChunk, 2 | 4 | 6) => I64,
            (ColumnChunk, 3 | 8) => STRUCT,
            (ColumnChunk, 5 | 7) => I32,
            (ColumnMetaData, 1 | 4 | 15) => I32,
            (ColumnMetaData, 2 | 3 | 8 | 13) => LIST,
            (ColumnMetaData, 5 | 6 | 7 | 9 | 10 | 11 | 14) => I64,
            (ColumnMetaData, 12 | 16 | 17) => STRUCT,
            _ => return None,
        })
    }

    /// The struct a field's value is (or, for a list field, holds), if it is checked too.
    fn child(self, id: i16) -> Option<Struct> {
        use Struct::*;
        match (self, id) {
            (FileMetaData, 4) => Some(RowGroup),
            (RowGroup, 1) => Some(ColumnChunk),
            (ColumnChunk, 3) => Some(ColumnMetaData),
            _ => None,
        }
    }
}

fn write_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn write_field_header(out: &mut Vec<u8>, last: i16, id: i16, t: u8) {
    let delta = i32::from(id) - i32::from(last);
    if (1..=15).contains(&delta) {
        out.push(((delta as u8) << 4) | t);
    } else {
        out.push(t);
        let z = ((i64::from(id) << 1) ^ (i64::from(id) >> 63)) as u64;
        write_varint(out, z);
    }
}

/// Copy struct `s` from `c` to `out`, dropping fields whose wire type is not the declared one.
/// Returns how many fields were dropped (in this struct and the checked ones inside it).
fn copy_struct(c: &mut Cursor, out: &mut Vec<u8>, s: Struct) -> Option<usize> {
    let (mut last_in, mut last_out, mut dropped) = (0i16, 0i16, 0usize);
    loop {
        let (id, t) = c.field(last_in)?;
        if t == STOP {
            out.push(STOP);
            return Some(dropped);
        }
        last_in = id;
        let start = c.p;
        let is_bool = |x: u8| matches!(x, BOOL_TRUE | BOOL_FALSE);
        match s.declared(id) {
            Some(want) if want != t && !(is_bool(want) && is_bool(t)) => {
                c.skip(t, 1)?;
                dropped += 1;
                continue;
            }
            _ => {}
        }
        write_field_header(out, last_out, id, t);
        last_out = id;
        match s.child(id) {
            Some(child) if t == STRUCT => dropped += copy_struct(c, out, child)?,
            Some(child) if t == LIST => {
                let h = c.byte()?;
                out.push(h);
                let n = match h >> 4 {
                    15 => {
                        let n = c.varint()?;
                        write_varint(out, n);
                        n
                    }
                    n => u64::from(n),
                };
                if h & 0x0f != STRUCT {
                    // Not a list of structs: copied as is (arrow-rs reports it).
                    let from = c.p;
                    for _ in 0..n {
                        c.skip(h & 0x0f, 1)?;
                    }
                    out.extend_from_slice(&c.b[from..c.p]);
                    continue;
                }
                for _ in 0..n {
                    dropped += copy_struct(c, out, child)?;
                }
            }
            _ => {
                c.skip(t, 1)?;
                out.extend_from_slice(&c.b[start..c.p]);
            }
        }
    }
}

/// The footer (`FileMetaData` bytes) without fields of an undeclared wire type, or `None` if
/// it has none (or is too malformed to walk): then there is nothing to work around.
pub(super) fn sanitize_footer(footer: &[u8]) -> Option<Vec<u8>> {
    let mut c = Cursor { b: footer, p: 0 };
    let mut out = Vec::with_capacity(footer.len());
    let dropped = copy_struct(&mut c, &mut out, Struct::FileMetaData)?;
    (dropped > 0).then_some(out)
}

/// Parse the footer of `file` the way Arrow C++ would after arrow-rs failed to: `None` if the
/// workaround does not apply (the caller reports arrow-rs's error).
pub(super) fn parse_lenient(file: &File, size: u64) -> Option<ParquetMetaData> {
    if size < 12 {
        return None;
    }
    let mut tail = [0u8; 8];
    file.read_exact_at(&mut tail, size - 8).ok()?;
    let len = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    let start = (size - 8).checked_sub(len)?;
    let mut footer = vec![0u8; usize::try_from(len).ok()?];
    file.read_exact_at(&mut footer, start).ok()?;
    let md = decode_lenient(&footer)?;
    let mut reader = ParquetMetaDataReader::new_with_metadata(md)
        .with_column_index_policy(PageIndexPolicy::Skip)
        .with_offset_index_policy(PageIndexPolicy::Optional);
    reader.read_page_indexes_sized(file, size).ok()?;
    reader.finish().ok()
}

/// The footer bytes `footer` (without page indexes) after [`sanitize_footer`], if that changed
/// anything and arrow-rs parses the result.
pub(super) fn decode_lenient(footer: &[u8]) -> Option<ParquetMetaData> {
    ParquetMetaDataReader::decode_metadata(&sanitize_footer(footer)?).ok()
}

/// Is `created_by` a parquet-mr older than 1.2.9 (or without a version), whose dictionary page
/// headers are not counted in the column chunk size?
fn writes_short_dictionary_chunks(created_by: Option<&str>) -> bool {
    let Some(rest) = created_by.and_then(|c| c.trim().strip_prefix("parquet-mr")) else {
        return false;
    };
    let version = rest.trim().strip_prefix("version").unwrap_or("").trim();
    let nums: Vec<u32> = version
        .split(|c: char| !c.is_ascii_digit())
        .take(3)
        .map_while(|n| n.parse().ok())
        .collect();
    nums.is_empty()
        || (
            nums[0],
            *nums.get(1).unwrap_or(&0),
            *nums.get(2).unwrap_or(&0),
        ) < (1, 2, 9)
}

/// A page header at `pos`: (header length, page type, compressed payload size). Headers are
/// small unless they carry statistics of long values: read more only when needed.
fn page_header(file: &File, pos: u64, end: u64) -> Option<(u64, i64, u64)> {
    for want in [1u64 << 10, 1 << 16, 1 << 22] {
        let len = want.min(end.saturating_sub(pos));
        let mut buf = vec![0u8; len as usize];
        file.read_exact_at(&mut buf, pos).ok()?;
        if let Some(h) = parse_page_header(&buf) {
            return Some(h);
        }
        if len < want {
            return None;
        }
    }
    None
}

fn parse_page_header(buf: &[u8]) -> Option<(u64, i64, u64)> {
    let mut c = Cursor { b: buf, p: 0 };
    let (mut last, mut kind, mut size) = (0i16, None, None);
    loop {
        let (id, t) = c.field(last)?;
        if t == STOP {
            break;
        }
        match (id, t) {
            (1, I32) => kind = Some(c.zigzag()?),
            (3, I32) => size = Some(u64::try_from(c.zigzag()?).ok()?),
            _ => c.skip(t, 1)?,
        }
        last = id;
    }
    Some((c.p as u64, kind?, size?))
}

/// A footer `num_rows` other than the row groups' sum (old parquet-rs wrote 0) replaced by the
/// sum: arrow-rs caps its batch size at the footer's count, and so reads no row at all from a
/// file whose footer says 0. The row groups are what every reader goes by.
pub(super) fn fix_num_rows(md: ParquetMetaData) -> ParquetMetaData {
    let rows: i64 = md.row_groups().iter().map(|rg| rg.num_rows()).sum();
    let f = md.file_metadata();
    if f.num_rows() == rows {
        return md;
    }
    let file = FileMetaData::new(
        f.version(),
        rows,
        f.created_by().map(str::to_string),
        f.key_value_metadata().cloned(),
        f.schema_descr_ptr(),
        f.column_orders().cloned(),
    );
    let offset_index = md.offset_index().cloned();
    let column_index = md.column_index().cloned();
    ParquetMetaDataBuilder::new(file)
        .set_row_groups(md.row_groups().to_vec())
        .set_offset_index(offset_index)
        .set_column_index(column_index)
        .build()
}

/// Column chunk metadata that arrow-rs would read wrongly, corrected (see the module docs):
/// a `dictionary_page_offset` inside the file's leading magic (parquet-mr writes 0 for "none"),
/// and, for parquet-mr < 1.2.9, chunk sizes that leave out the dictionary page header.
/// `file`: the local file and its size (`None` for a remote object: only the offsets are fixed).
pub(super) fn fix_column_chunks(
    md: ParquetMetaData,
    file: Option<(&File, u64)>,
    path: &Path,
) -> Result<ParquetMetaData> {
    const DICTIONARY_PAGE: i64 = 2;
    let short_chunks =
        file.filter(|_| writes_short_dictionary_chunks(md.file_metadata().created_by()));
    // (row group, column, corrected dictionary page offset, corrected size)
    let mut fixes = Vec::new();
    for (g, rg) in md.row_groups().iter().enumerate() {
        for (i, col) in rg.columns().iter().enumerate() {
            let mut dict = col.dictionary_page_offset();
            // No page starts inside the 4-byte magic: "no dictionary page" (Arrow C++ too).
            let bad_offset = dict.is_some_and(|d| (0..4).contains(&d));
            if bad_offset {
                dict = None;
            }
            let mut size = col.compressed_size();
            if let Some((file, file_size)) = short_chunks {
                let start = dict.unwrap_or(col.data_page_offset()).max(0) as u64;
                let declared_end = start + size.max(0) as u64;
                if let Some((hlen, DICTIONARY_PAGE, _)) = page_header(file, start, file_size) {
                    let mut pos = start;
                    while pos < declared_end {
                        match page_header(file, pos, file_size) {
                            Some((h, _, n)) => pos += h + n,
                            None => break,
                        }
                    }
                    if pos == declared_end + hlen {
                        size += hlen as i64;
                    }
                }
            }
            if bad_offset || size != col.compressed_size() {
                fixes.push((g, i, dict, size));
            }
        }
    }
    if fixes.is_empty() {
        return Ok(md);
    }
    let bad = |e: parquet::errors::ParquetError| {
        Error::shard(path, format!("not a readable Parquet file: {e}"))
    };
    let mut builder = md.into_builder();
    let mut row_groups = builder.take_row_groups();
    for (g, i, dict, size) in fixes {
        let rg = row_groups[g].clone();
        let mut cols = rg.columns().to_vec();
        cols[i] = cols[i]
            .clone()
            .into_builder()
            .set_dictionary_page_offset(dict)
            .set_total_compressed_size(size)
            .build()
            .map_err(bad)?;
        row_groups[g] = rg
            .into_builder()
            .set_column_metadata(cols)
            .build()
            .map_err(bad)?;
    }
    Ok(builder.set_row_groups(row_groups).build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_of_the_writers_with_short_dictionary_chunks() {
        for (c, yes) in [
            (Some("parquet-mr"), true),
            (Some("parquet-mr version 1.2.8"), true),
            (Some("parquet-mr version 1.2.9"), false),
            (Some("parquet-mr version 1.12.0-2018 (build x)"), false),
            (Some("parquet-cpp-arrow version 14.0.0"), false),
            (Some("parquet-rs version 0.3.0"), false),
            (None, false),
        ] {
            assert_eq!(writes_short_dictionary_chunks(c), yes, "{c:?}");
        }
    }

    /// A `ColumnMetaData` with field 15 written as a list of structs (not i32) loses the field
    /// and keeps everything else, with the next field's header re-encoded.
    #[test]
    fn sanitize_drops_fields_of_an_undeclared_type() {
        // FileMetaData { 4: list<RowGroup>[ RowGroup { 1: list<ColumnChunk>[ ColumnChunk {
        //   3: ColumnMetaData { 5: i64 7, 15: list<struct>[{1: i32 1}], 16: struct{} } } ] } ] }
        let cmd = [
            0x56, 0x0e, // field 5 (delta 5), i64 zigzag(7) = 14
            0xa9, 0x1c, 0x15, 0x02, 0x00, // field 15 (delta 10), list<struct> 1: {1: i32 1}
            0x1c, 0x00, // field 16 (delta 1), struct {}
            0x00,
        ];
        let mut fmd = vec![0x49, 0x1c, 0x19, 0x1c, 0x3c];
        fmd.extend_from_slice(&cmd);
        fmd.extend_from_slice(&[0x00, 0x00, 0x00]); // end ColumnChunk, RowGroup, FileMetaData
        let fixed = sanitize_footer(&fmd).expect("a field to drop");
        let mut want = vec![0x49, 0x1c, 0x19, 0x1c, 0x3c];
        // field 5, then field 16 with its header re-encoded as a delta of 11 from field 5
        want.extend_from_slice(&[0x56, 0x0e, 0xbc, 0x00, 0x00, 0x00, 0x00, 0x00]);
        assert_eq!(fixed, want);
        // Nothing to drop: no rewrite.
        assert_eq!(sanitize_footer(&want), None);
        // Malformed: never a panic, no rewrite.
        for cut in 0..fmd.len() {
            let _ = sanitize_footer(&fmd[..cut]);
        }
    }
}

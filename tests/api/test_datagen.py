"""datagen itself and the fixture layouts the other suites rely on (pyarrow only)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
from conftest import SPECIAL_LAYOUT
from harness import all_ids, row_group_layout
from shardstream import datagen


def test_fixture_layouts(small, small_nopi, special, big, tiny):
    # special: empty file without row groups, a file with only a zero-row row group, and
    # zero-row row groups between normal ones (pyarrow writes them)
    assert row_group_layout(special.paths) == SPECIAL_LAYOUT
    assert [] in row_group_layout(special.paths) and [0] in row_group_layout(special.paths)
    # small: uneven row groups, same layout with and without page index
    lay = row_group_layout(small.paths)
    assert [sum(s) for s in lay] == [130, 75, 210, 95]
    assert len({x for s in lay for x in s}) > 3
    assert row_group_layout(small_nopi.paths) == lay
    assert len(tiny.paths) == 40 and 0 in [sum(s) for s in row_group_layout(tiny.paths)]
    assert row_group_layout(big.paths) == [[1000, 1000, 500]] * 2
    for ss in (small, small_nopi, special, big, tiny):
        assert all_ids(ss.paths) == list(range(ss.num_rows))


def _col_meta(path, name):
    md = pq.ParquetFile(path).metadata
    i = md.schema.names.index(name) if name in md.schema.names else None
    rg = md.row_group(0)
    for j in range(rg.num_columns):
        if rg.column(j).path_in_schema.split(".")[0] == name:
            return rg.column(j)
    raise KeyError((name, i))


def test_page_index_and_dictionary(small, small_nopi):
    c = _col_meta(small.paths[0], "id")
    assert c.has_offset_index and c.has_column_index
    c = _col_meta(small_nopi.paths[0], "id")
    assert not c.has_offset_index and not c.has_column_index
    dict_type = pa.dictionary(pa.int32(), pa.string())
    assert pq.read_schema(small.paths[0]).field("cat").type == dict_type
    dict_enc = {"PLAIN_DICTIONARY", "RLE_DICTIONARY"}
    assert dict_enc & set(_col_meta(small.paths[0], "cat").encodings)
    assert pq.read_schema(small_nopi.paths[0]).field("cat").type == pa.string()
    assert not dict_enc & set(_col_meta(small_nopi.paths[0], "cat").encodings)


def test_content_matches_expected(small, tiny):
    for ss in (small, tiny):
        for p in ss.paths:
            for row in pq.read_table(p).to_pylist():
                assert row == datagen.expected_row(row["id"], ss.tokens_len, ss.nulls)


def test_deterministic_and_options(tmp_path):
    a = datagen.write_shards(
        tmp_path / "a",
        num_shards=3,
        rows_per_shard=[10, 0, 7],
        seed=4,
        start_id=100,
        prefix="p",
        tokens_len=(2, 5),
        nulls=False,
    )
    b = datagen.write_shards(
        tmp_path / "b",
        num_shards=3,
        rows_per_shard=[10, 0, 7],
        seed=4,
        start_id=100,
        prefix="p",
        tokens_len=(2, 5),
        nulls=False,
    )
    assert [x.rsplit("/", 1)[1] for x in a] == [
        "p-00000.parquet",
        "p-00001.parquet",
        "p-00002.parquet",
    ]
    ta, tb = (pa.concat_tables([pq.read_table(x) for x in s]) for s in (a, b))
    assert ta.equals(tb)
    assert row_group_layout(a) == row_group_layout(b)
    assert ta.column("id").to_pylist() == list(range(100, 117))
    assert ta.column("label").null_count == 0
    assert all(2 <= len(t) < 5 for t in ta.column("tokens").to_pylist())
    assert pq.ParquetFile(a[1]).metadata.num_rows == 0
    fixed = datagen.write_shards(tmp_path / "c", num_shards=2, rows_per_shard=25, row_group_size=10)
    assert row_group_layout(fixed) == [[10, 10, 5]] * 2
    assert datagen.expected_tokens(5, (3, 3)) == [5, 6, 7]
    assert datagen.expected_label(14) is None and datagen.expected_label(15) == 15

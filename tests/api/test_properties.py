"""Property tests over random shard layouts (hypothesis)."""

from __future__ import annotations

import tempfile
from collections import Counter

from harness import (
    all_ids,
    check_epochs,
    full_stream,
    is_batched,
    keys_of,
    make_ds,
    resume_rest,
    take,
    torch_roundtrip,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from shardstream import datagen

layouts = st.lists(
    st.lists(st.integers(min_value=0, max_value=40), min_size=0, max_size=4),
    min_size=1,
    max_size=5,
)
stream_settings = st.fixed_dictionaries(
    {
        "shuffle_buffer": st.one_of(st.just(0), st.just(1), st.integers(0, 60), st.just(10**6)),
        "batch_size": st.one_of(st.none(), st.integers(1, 12)),
        "drop_last": st.booleans(),
        "seed": st.integers(0, 2**32),
        "epochs": st.integers(1, 2),
        "output": st.sampled_from(["python", "numpy", "torch", "arrow"]),
        "page_index": st.booleans(),
    }
)


def _write(tmp, layout, page_index):
    return datagen.write_shards(
        tmp, row_group_size=layout, page_index=page_index, tokens_len=(0, 3)
    )


@settings(max_examples=40, deadline=None)
@given(layout=layouts, s=stream_settings, data=st.data())
def test_resume_equals_uninterrupted(layout, s, data):
    s = dict(s)
    page_index = s.pop("page_index")
    with tempfile.TemporaryDirectory() as tmp:
        paths = _write(tmp, layout, page_index)
        full = full_stream(tmp, s)
        check_epochs(full, paths, s)
        n = len(full)
        k = data.draw(st.integers(0, n), label="k")
        ds = make_ds(tmp, s)
        head = keys_of(take(iter(ds), k), is_batched(s))
        assert head == full[:k]
        state = torch_roundtrip(ds.state_dict())
        rest = resume_rest(tmp, s, state)
        assert head + rest == full, f"k={k} n={n}"
        # and once more from inside the resumed run
        if n - k >= 2:
            j = data.draw(st.integers(1, n - k - 1), label="j")
            ds2 = make_ds(tmp, s)
            ds2.load_state_dict(state)
            mid = keys_of(take(iter(ds2), j), is_batched(s))
            rest2 = resume_rest(tmp, s, torch_roundtrip(ds2.state_dict()))
            assert head + mid + rest2 == full, f"k={k} j={j} n={n}"


@settings(max_examples=40, deadline=None)
@given(
    layout=layouts,
    world=st.integers(1, 4),
    buf=st.sampled_from([0, 1, 5, 10**6]),
    bs=st.one_of(st.none(), st.integers(1, 7)),
    seed=st.integers(0, 1000),
)
def test_ranks_cover_every_row_once_per_epoch(layout, world, buf, bs, seed):
    with tempfile.TemporaryDirectory() as tmp:
        paths = _write(tmp, layout, True)
        want = Counter(all_ids(paths))
        union0, union1 = Counter(), Counter()
        sizes = []
        for r in range(world):
            s = dict(
                output="python",
                rank=r,
                world_size=world,
                shuffle_buffer=buf,
                seed=seed,
                batch_size=bs,
                epochs=2,
                even=None,
            )
            keys = full_stream(tmp, s)
            flat = [i for k in keys for i in (k if isinstance(k, tuple) else (k,))]
            assert len(flat) % 2 == 0
            half = len(flat) // 2
            union0.update(flat[:half])
            union1.update(flat[half:])
            sizes.append(half)
        assert union0 == want, "epoch 0"
        assert union1 == want, "epoch 1"
        assert max(sizes) - min(sizes) <= 1, sizes

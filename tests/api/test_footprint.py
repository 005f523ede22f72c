"""``import shardstream`` and numpy/python/arrow output never import torch, yet a ParquetStream is
a torch ``IterableDataset`` in any process that has torch, whenever torch was imported.

Each case runs in a fresh interpreter: whether torch is in ``sys.modules`` is process-wide.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from shardstream import datagen

PY = sys.executable


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("footprint")
    datagen.write_shards(d, num_shards=2, rows_per_shard=[30, 20], tokens_len=(1, 5), seed=3)
    return str(d)


def run(code: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [PY, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.mark.parametrize("output", ["numpy", "python", "arrow"])
def test_non_torch_output_never_imports_torch(data, output):
    """Batches, rows, state_dict and a resume: torch stays out of the process."""
    out = run(
        f"""
        import sys
        from shardstream import ParquetStream
        ds = ParquetStream({data!r}, batch_size=8, output={output!r}, shuffle_buffer=10)
        it = iter(ds)
        first = next(it)
        state = ds.state_dict()
        rest = sum(1 for _ in it)
        ds2 = ParquetStream({data!r}, batch_size=8, output={output!r}, shuffle_buffer=10)
        ds2.load_state_dict(state)
        rows = list(ParquetStream({data!r}, output={output!r}))
        print(rest, sum(1 for _ in ds2), len(rows), "torch" in sys.modules)
        """
    )
    assert out == ["6", "6", "50", "False"]


def test_torch_imported_after_the_dataset(data):
    """The dataset made before ``import torch`` is an IterableDataset for the DataLoader, which
    then reads every row once (two workers)."""
    out = run(
        f"""
        import sys
        from shardstream import ParquetStream
        ds = ParquetStream({data!r}, columns=["id"], batch_size=4, output="numpy")
        print("torch" in sys.modules)
        import torch
        from torch.utils.data import DataLoader, IterableDataset
        print(isinstance(ds, IterableDataset), issubclass(ParquetStream, IterableDataset))
        ids = sorted(int(x) for b in DataLoader(ds, batch_size=None, num_workers=2)
                     for x in b["id"])
        print(ids == list(range(50)))
        """
    )
    assert out == ["False", "True", "True", "True"]


def test_torch_imported_first_and_torch_output(data):
    out = run(
        f"""
        import sys
        import torch.utils.data
        import shardstream
        print(isinstance(shardstream.ParquetStream({data!r}), torch.utils.data.IterableDataset))
        """
    )
    assert out == ["True"]
    out = run(
        f"""
        import sys
        from shardstream import ParquetStream
        print("torch" in sys.modules)
        ds = ParquetStream({data!r}, columns=["id"], batch_size=50, output="torch")
        import torch
        print("torch" in sys.modules, isinstance(ds, torch.utils.data.IterableDataset))
        print(isinstance(next(iter(ds))["id"], torch.Tensor))
        # numbers and lists of numbers, in every list format: views of Arrow's buffers, without
        # the pandas import of Array.to_numpy() (~0.3-0.5 s on the first batch)
        cols = ["id", "tokens", "label"]
        for out, fmt in [("numpy", "split"), ("numpy", "padded"), ("torch", "offsets")]:
            next(iter(ParquetStream({data!r}, columns=cols, output=out, list_format=fmt)))
        print("pandas" in sys.modules)
        """
    )
    assert out == ["False", "True", "True", "True", "False"]


def test_without_torch_installed(data):
    """torch missing altogether: numpy output works and importing torch still fails normally."""
    out = run(
        f"""
        import sys
        sys.modules["torch"] = None  # as if torch were not installed: `import torch` fails
        from shardstream import ParquetStream
        ds = ParquetStream({data!r}, columns=["id"], batch_size=50, output="numpy")
        print(len(next(iter(ds))["id"]))
        try:
            import torch.utils.data
        except ImportError:
            print("ImportError")
        """
    )
    assert out == ["50", "ImportError"]


def test_mixture_without_torch_then_torch_imported(data):
    """A Mixture with numpy output never imports torch; made before ``import torch``, it and a
    ParquetStream are both IterableDatasets afterwards (one import hook registers both)."""
    out = run(
        f"""
        import sys
        from shardstream import Mixture, ParquetStream
        # A source's own output is not used by the mixture: its default ("torch") imports
        # nothing until the source itself is iterated.
        src = {{"a": ParquetStream({data!r}, columns=["id"]),
                "b": ParquetStream({data!r}, columns=["id"], shuffle_buffer=5)}}
        m = Mixture(src, weights={{"a": 1, "b": 1}}, batch_size=4, output="numpy",
                    on_exhausted="drop")
        n = sum(len(b["id"]) for b in m)
        print(n, "torch" in sys.modules)
        import torch
        from torch.utils.data import IterableDataset
        print(isinstance(m, IterableDataset), isinstance(src["a"], IterableDataset))
        """
    )
    assert out == ["100", "False", "True", "True"]

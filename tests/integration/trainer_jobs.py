"""Helpers of the framework recipes (tests/integration/test_*.py).

Each test file is also the job its processes run: ``torchrun test_X.py SPEC.json`` calls its
``job(spec, rank, world)``, which returns a dict of results written to ``spec["out"]``
(``{rank}`` filled in). :func:`run_job` launches it (harness.torchrun: gloo on CPU) and returns
the results of every rank. Nothing here downloads: HF libraries run offline.
"""

from __future__ import annotations

import json
import os

from harness import torchrun

# 402 rows: a short last batch of 2 at batch size 16 (and of 1 per rank at 8 x 2 ranks).
LAYOUT = dict(num_shards=3, rows_per_shard=[130, 97, 175], seed=5, tokens_len=(0, 4))
N_ROWS = 402

OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TRANSFORMERS_VERBOSITY": "error",
}


def run_job(script: str, tmp_path, tag: str, nproc: int, **spec) -> list[dict]:
    """Run ``script``'s ``job`` in ``nproc`` processes; the result dict of every rank."""
    spec["out"] = str(tmp_path / f"{tag}-out-{{rank}}.json")
    spec_file = tmp_path / f"{tag}-spec.json"
    spec_file.write_text(json.dumps(spec))
    torchrun(nproc, script, str(spec_file), env=OFFLINE)
    results = []
    for r in range(nproc):
        with open(spec["out"].format(rank=r)) as f:
            res = json.load(f)
        assert (res["rank"], res["world"]) == (r, nproc)
        results.append(res)
    return results


def job_main(job) -> None:
    """``if __name__ == "__main__"`` of a test file run by torchrun: call ``job``, write results."""
    import sys

    with open(sys.argv[1]) as f:
        spec = json.load(f)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    res = job(spec, rank, world)
    with open(spec["out"].format(rank=rank), "w") as f:
        json.dump({"rank": rank, "world": world, **res}, f)


def accelerator(**config):
    """An accelerate ``Accelerator`` on the CPU with ``DataLoaderConfiguration(**config)``."""
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    return Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(**config))


def refusal(fn) -> str:
    """The message of the ``ValueError`` ``fn()`` raises, or ``"no error"``."""
    try:
        fn()
    except ValueError as e:
        return str(e)
    return "no error"


def global_steps(results: list[dict], key: str) -> list[list[int]]:
    """Per training step, the ids of every rank's batch in rank order (the global batch)."""
    per_rank = [r[key] for r in results]
    assert len({len(p) for p in per_rank}) == 1, f"{key}: ranks ran {[len(p) for p in per_rank]}"
    return [[i for rank_batch in step for i in rank_batch] for step in zip(*per_rank, strict=True)]

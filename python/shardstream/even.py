"""``EvenBatches``: every rank yields the same number of batches, found out at run time.

A packed stream's ranks read equal numbers of documents (``even=``), but how many packed rows
those documents make depends on their token lengths, which no rank knows for the others without
reading them. Under DDP a rank that runs out first leaves the others waiting in their next
collective (a hang). So the ranks agree as they go: before each batch, one all_reduce (MAX)
over the group of "this rank has a batch", "this rank has none" (and "cannot pad"), in the
main process (DataLoader workers have no process group), then either every rank yields
(padding batches on the ranks that ran out: ``"pad"``) or all stop (``"drop"``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["EvenBatches"]

POLICIES = ("pad", "drop")
KEY = "even_batches"  # this wrapper's own entry in its state_dict(); "loader": the loader's
# The outputs of a packed item (pack.py) and their value on padding; cu_seqlens and max_seqlen
# are derived from the shape (one padding run per row).
_PAD_FILL = {"labels": -100, "position_ids": 0, "segment_ids": 0, "source_ids": -1}
_PACKED = {"input_ids", "labels", "position_ids", "segment_ids", "cu_seqlens", "max_seqlen"}


def _dist() -> Any:
    """``torch.distributed`` if it is usable and initialized, else ``None`` (not imported:
    then no process group exists, and importing torch costs seconds)."""
    dist = sys.modules.get("torch.distributed")
    return dist if dist is not None and dist.is_available() and dist.is_initialized() else None


def _pack_of(dataset: Any) -> Any:
    """The :class:`Pack` a shardstream dataset packs with (a per-source Mixture: the first
    source's, by name), or ``None``."""
    from .dataset import ParquetStream
    from .mixture import Mixture

    if isinstance(dataset, ParquetStream):
        return dataset._pack
    if isinstance(dataset, Mixture):
        if dataset._pack is not None:
            return dataset._pack
        packs = [s._pack for _, s in sorted(dataset.sources.items())]
        return packs[0] if packs and all(p is not None for p in packs) else None
    return None


class EvenBatches:
    """Wraps one rank's loader so that every rank of ``group`` yields the same number of
    batches per pass, for a finite pass whose ranks may run out at different batches (packed
    streams, mixtures with sources that run out).

    Args:
        loader: what the rank iterates: a ``StatefulDataLoader`` or ``DataLoader`` over a
            shardstream dataset (``batch_size=None``), or the dataset itself; any iterable
            for ``"drop"``.
        policy: what happens once some rank has no batch left:

            * ``"pad"``: the ranks that ran out yield padding batches until every rank is out,
              so every token is trained on exactly once (use ``even=None`` on the dataset).
              A padding batch has the shape of the rank's last real batch: ``input_ids`` =
              the Pack's ``pad_id``, ``labels`` = -100, ``position_ids`` = ``segment_ids`` = 0,
              ``source_ids`` = -1, ``cu_seqlens`` one padding run per row and ``max_seqlen`` =
              ``seq_len``. It holds no label token: a mean-reduced loss over it is NaN (0/0);
              see :attr:`padding`. Needs a packed dataset (``pack=``) with ``output="torch"``
              or ``"numpy"`` whose items the loader passes on as they are.
            * ``"drop"``: every rank stops when the first one runs out; the others read the
              rest of their loader's pass without yielding it (at most the imbalance), so
              their loader ends the pass and the next one starts cleanly. :attr:`dropped`
              says how many batches this rank dropped.
        group: the process group whose ranks must agree (default: the whole world; under
            tensor or pipeline parallelism, the data-parallel group).

    Without ``torch.distributed`` initialized, or with one rank in ``group``, it yields the
    loader's batches unchanged. Each step costs one all_reduce of three integers (on the current
    CUDA device under ``nccl``, on the CPU otherwise), which every rank of the group makes
    together: iterate it in the main process, on every rank, in step.

    ``state_dict()`` holds the loader's ``state_dict()`` (``"loader"``) and this wrapper's
    position in the pass (``"even_batches"``: plain values); a rank resumed while padding
    pads again until the other ranks are out, so every rank yields the same remaining
    batches as without the interruption. ``load_state_dict`` also takes a bare loader state.
    The wrapper's position applies to the same rank of the same number of ranks only; on a
    resize it starts the pass's accounting afresh (load the dataset states as usual).
    """

    def __init__(self, loader: Iterable[Any], policy: str, group: Any = None) -> None:
        if policy not in POLICIES:
            raise ValueError(f"EvenBatches policy must be one of {POLICIES}, got {policy!r}")
        if not isinstance(loader, Iterable):
            raise TypeError(
                f"EvenBatches loader must be an iterable (a DataLoader or a dataset), got "
                f"{type(loader).__name__}"
            )
        self.loader = loader
        self.policy = policy
        self.group = group
        self._pad_id = 0
        if policy == "pad":
            self._pad_id = self._check_pad(loader)
        #: batches this rank dropped at the end of its last pass (``"drop"``).
        self.dropped = 0
        #: padding batches this rank yielded in the current (or last) pass (``"pad"``).
        self.padded = 0
        #: whether the batch yielded last is a padding batch.
        self.padding = False
        self._steps = 0  # batches yielded in this pass, padding included
        self._out = False  # this rank's loader ran out in this pass
        self._like: dict[str, Any] | None = None  # the last real batch's structure
        self._resume: dict[str, Any] | None = None  # own state loaded, applied at iter()

    @staticmethod
    def _check_pad(loader: Any) -> int:
        dataset = getattr(loader, "dataset", loader)
        pack = _pack_of(dataset)
        if pack is None:
            raise ValueError(
                'EvenBatches policy="pad" needs a packed shardstream dataset (ParquetStream or '
                f"Mixture with pack=), got a loader over {type(dataset).__name__} without "
                'packing: a padding batch is defined only for packed rows (use policy="drop")'
            )
        if dataset._output not in ("torch", "numpy"):
            raise ValueError(
                f'EvenBatches policy="pad" needs output="torch" or "numpy", got '
                f"output={dataset._output!r}"
            )
        if dataset is not loader and getattr(loader, "batch_size", None) is not None:
            raise ValueError(
                f'EvenBatches policy="pad" needs the loader to pass items on as they are '
                f"(DataLoader batch_size=None), got batch_size={loader.batch_size!r}"
            )
        return int(pack.pad_id)

    # -- state ----------------------------------------------------------------------------
    def _own(self) -> dict[str, Any]:
        if self._resume is not None:  # loaded, not iterated yet: still the loaded position
            return dict(self._resume)
        dist = _dist()
        rank, world = (
            (dist.get_rank(self.group), dist.get_world_size(self.group)) if dist else (0, 1)
        )
        return {
            "policy": self.policy,
            "rank": rank,
            "world_size": world,
            "steps": self._steps,
            "padded": self.padded,
            "out": self._out,
            "like": self._like,
        }

    def state_dict(self) -> dict[str, Any]:
        """``{"even_batches": this wrapper's position, "loader": loader.state_dict()}``."""
        if not hasattr(self.loader, "state_dict"):
            raise TypeError(
                f"EvenBatches: the loader ({type(self.loader).__name__}) has no state_dict(); "
                "use torchdata's StatefulDataLoader to save and resume"
            )
        return {KEY: self._own(), "loader": self.loader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a :meth:`state_dict` (or a bare loader state) before iterating."""
        if not isinstance(state, dict):
            raise TypeError(f"EvenBatches state must be a dict, got {type(state).__name__}")
        own = state.get(KEY)
        if own is None:
            self.loader.load_state_dict(state)  # type: ignore[attr-defined]
            self._resume = None
            return
        if set(state) != {KEY, "loader"} or not isinstance(own, dict):
            raise ValueError(
                f"EvenBatches state must have keys {KEY!r} and 'loader' (its state_dict()), "
                f"got {sorted(state)}"
            )
        want = {"policy", "rank", "world_size", "steps", "padded", "out", "like"}
        if set(own) != want:
            raise ValueError(
                f"EvenBatches state[{KEY!r}] must have keys {sorted(want)}, got {sorted(own)}"
            )
        if own["policy"] != self.policy:
            raise ValueError(
                f"EvenBatches state was saved with policy={own['policy']!r}, this wrapper has "
                f"policy={self.policy!r}"
            )
        for k in ("rank", "world_size", "steps", "padded"):
            v = own[k]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(
                    f"EvenBatches state[{KEY!r}][{k!r}] must be an int >= 0, got {v!r}"
                )
        if not isinstance(own["out"], bool) or not (own["like"] is None or _is_like(own["like"])):
            raise ValueError(f"EvenBatches state[{KEY!r}] has a bad 'out' or 'like' entry")
        self.loader.load_state_dict(state["loader"])  # type: ignore[attr-defined]
        self._resume = own

    # -- iteration --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        resume, self._resume = self._resume, None
        self._steps = self.padded = self.dropped = 0
        self._out = self.padding = False
        dist = _dist()
        world = dist.get_world_size(self.group) if dist else 1
        if resume is not None and (resume["rank"], resume["world_size"]) == (
            dist.get_rank(self.group) if dist else 0,
            world,
        ):
            self._steps, self.padded = resume["steps"], resume["padded"]
            self._out, self._like = resume["out"], resume["like"]
        if world == 1:
            for batch in self.loader:
                self._steps += 1
                yield batch
            return
        import torch

        device = (
            torch.device("cuda", torch.cuda.current_device())
            if dist.get_backend(self.group) == "nccl"
            else torch.device("cpu")
        )
        # A rank resumed after its loader ran out must not iterate it again in this pass (a
        # finished StatefulDataLoader starts its next pass).
        it = None if self._out else iter(self.loader)
        while True:
            batch = None
            if it is not None:
                try:
                    batch = next(it)
                except StopIteration:
                    it, self._out = None, True
            has = batch is not None
            # A rank that would pad without knowing a padding batch's shape: all ranks raise
            # together (alone, it would leave the others waiting in this all_reduce).
            stuck = self.policy == "pad" and not has and self._like is None
            flags = torch.tensor([has, not has, stuck], dtype=torch.int32, device=device)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
            any_has, any_out, any_stuck = (bool(x) for x in flags.tolist())
            if not any_has:
                break
            if any_stuck:
                raise ValueError(
                    'EvenBatches policy="pad": a rank ran out before yielding any batch of '
                    "packed rows in this pass, so it has no batch shape to pad with (every "
                    "rank needs at least one packed batch per pass: more data or fewer ranks)"
                )
            if self.policy == "drop" and any_out:
                if it is not None:
                    self.dropped = 1 + sum(1 for _ in it)  # this batch and the rest of the pass
                    self._out = True
                break
            self._steps += 1
            if has:
                if self.policy == "pad":
                    self._like = _like(batch)
                self.padding = False
                yield batch
            else:
                self.padded += 1
                self.padding = True
                like = self._like
                assert like is not None  # any_stuck otherwise
                yield _padding(like, self._pad_id)
        # The pass is over on every rank: the next one starts afresh (a state saved now
        # resumes there).
        self._steps = 0
        self._out = False

    def __repr__(self) -> str:
        return f"EvenBatches({self.loader!r}, policy={self.policy!r})"


def _like(batch: Any) -> dict[str, Any] | None:
    """A packed batch's structure as plain values: ``{key: [kind, dtype, shape]}`` (kind
    ``"torch"``/``"numpy"``), ``max_seqlen`` as ``["int", None, []]``; ``None`` if it is not
    a packed batch (only padding needs it)."""
    if not isinstance(batch, dict) or not _PACKED <= set(batch):
        return None
    out: dict[str, Any] = {}
    for k, v in batch.items():
        if k == "max_seqlen":
            out[k] = ["int", None, []]
        elif type(v).__module__ == "numpy":
            out[k] = ["numpy", str(v.dtype), list(v.shape)]
        else:
            out[k] = ["torch", str(v.dtype).removeprefix("torch."), list(v.shape)]
    return out


_INT_DTYPES = {f"{u}int{b}" for u in ("", "u") for b in (8, 16, 32, 64)}


def _is_like(like: Any) -> bool:
    """Whether a saved ``like`` is one :func:`_like` makes (it names dtypes to build)."""
    return (
        isinstance(like, dict)
        and _PACKED <= set(like) <= _PACKED | {"source_ids"}
        and all(
            isinstance(v, list)
            and len(v) == 3
            and (v[:2] == ["int", None] if k == "max_seqlen" else v[0] in ("numpy", "torch"))
            and (k == "max_seqlen" or v[1] in _INT_DTYPES)
            and isinstance(v[2], list)
            and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**31 for d in v[2])
            for k, v in like.items()
        )
    )


def _padding(like: dict[str, Any], pad_id: int) -> dict[str, Any]:
    """A padding batch shaped like ``like``: no document, no label token."""
    kind, _, shape = like["input_ids"]
    rows, seq_len = (shape[0], shape[1]) if len(shape) == 2 else (1, shape[0])
    import numpy as np

    if kind == "torch":
        import torch

        def full(dtype: str, shape: list[int], value: int) -> Any:
            return torch.full(shape, value, dtype=getattr(torch, dtype))

        def cu(dtype: str) -> Any:
            return torch.arange(rows + 1, dtype=getattr(torch, dtype)) * seq_len
    else:

        def full(dtype: str, shape: list[int], value: int) -> Any:
            return np.full(shape, value, dtype=dtype)

        def cu(dtype: str) -> Any:
            return np.arange(rows + 1, dtype=dtype) * seq_len

    out: dict[str, Any] = {}
    for k, (_, dtype, shp) in like.items():
        if k == "max_seqlen":
            out[k] = seq_len
        elif k == "cu_seqlens":
            out[k] = cu(dtype)
        elif k == "input_ids":
            out[k] = full(dtype, shp, pad_id)
        elif k in _PAD_FILL:
            out[k] = full(dtype, shp, _PAD_FILL[k])
        else:
            raise ValueError(f"EvenBatches: no padding value for the output {k!r}")
    return out

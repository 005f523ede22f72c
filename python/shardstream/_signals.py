"""What the main process's dataset tells its DataLoader workers after they started.

A DataLoader worker iterates its own copy of the dataset, made when the worker started (forked,
or pickled into a spawned one). With ``persistent_workers=True`` the workers live across
epochs, so ``ds.set_epoch(e)`` in the training loop — what the guide asks for before every
epoch — changed only the main process's copy: every epoch repeated the first one's order,
silently. And a ``load_state_dict()`` or ``skip()`` in the main process after the workers
started never reached them.

So each dataset owns a small block of shared memory, made when it is constructed (before any
worker starts): the main process writes each ``set_epoch`` and counts its position changes
there; a worker reads the block when it starts a pass, applies a new epoch as ``set_epoch``
would, and refuses (naming the call) a position it cannot see. Without persistent workers a
worker is a copy of the current object and the block says nothing new. Pickled outside a
process start (``pickle.dumps``, ``copy.deepcopy``) the copy gets a block of its own.
"""

from __future__ import annotations

import os
from multiprocessing import RawArray
from multiprocessing.context import get_spawning_popen
from typing import Any

# Slots of the block: the count of set_epoch() calls, the last epoch set, the count of
# position changes (load_state_dict(), skip()).
_EPOCHS, _EPOCH, _MOVES = 0, 1, 2


class MainSignals:
    __slots__ = ("_block", "_pid", "_seen")

    def __init__(self) -> None:
        self._block: Any = RawArray("q", 3)
        self._pid = os.getpid()  # the process whose calls are signalled (the dataset's maker)
        self._seen = [0, 0]  # (set_epoch calls, position changes) this copy has applied

    def _in_main(self) -> bool:
        return os.getpid() == self._pid

    def in_worker(self) -> bool:
        """This copy is in another process than the dataset's maker (a DataLoader worker)."""
        return not self._in_main()

    def set_epoch(self, epoch: int) -> None:
        """The main process set the epoch (a worker's own calls signal nothing)."""
        if self._in_main():
            self._block[_EPOCH] = epoch
            self._block[_EPOCHS] += 1
            self._seen[0] = self._block[_EPOCHS]

    def moved(self) -> None:
        """The main process gave the dataset a position (``load_state_dict``, ``skip``)."""
        if self._in_main():
            self._block[_MOVES] += 1
            self._seen[1] = self._block[_MOVES]

    def new_epoch(self) -> int | None:
        """In a worker, at the start of a pass: the epoch the main process set since this copy
        was made or last looked (``None``: none)."""
        if self._in_main() or self._block[_EPOCHS] == self._seen[0]:
            return None
        self._seen[0] = self._block[_EPOCHS]
        return int(self._block[_EPOCH])

    def check_moved(self, kind: str) -> None:
        """In a worker, at a pass's first item (where a DataLoader forwards the error to the
        main process; from ``iter()`` the worker would just die): a ``RuntimeError`` if the
        main process moved the position since this copy was made, which it cannot follow."""
        if not self._in_main() and self._block[_MOVES] != self._seen[1]:
            self._seen[1] = self._block[_MOVES]
            raise RuntimeError(
                f"{kind}.load_state_dict() or skip() was called in the main process after this "
                "DataLoader worker started (persistent_workers=True): the worker iterates its "
                "own copy and cannot follow it. Give the position before the workers start "
                "(a new DataLoader, or persistent_workers=False), or load it through "
                "torchdata's StatefulDataLoader.load_state_dict()"
            )

    def __getstate__(self) -> Any:
        if get_spawning_popen() is None:
            return "own"  # not a worker's start: the copy is a dataset of its own
        return (self._block, self._pid, list(self._seen))

    def __setstate__(self, state: Any) -> None:
        if state == "own":
            MainSignals.__init__(self)
        else:
            self._block, self._pid, self._seen = state

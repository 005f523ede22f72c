"""``ParquetStream`` is a torch ``IterableDataset`` without ``import shardstream`` importing torch.

torch costs a process ~540 MB and over a second to import; numpy/python/arrow output does not
need it. But a ``DataLoader`` (and torchdata's, Lightning's, accelerate's loaders) picks its
iterable-dataset path by ``isinstance(dataset, IterableDataset)``, so the class must pass that
check in any process that has torch, including one that imports torch only after creating the
dataset. ``IterableDataset`` is an ABC (``collections.abc.Iterable`` is among its bases), so
``ParquetStream`` is registered as a virtual subclass: at once if ``torch.utils.data`` is already
imported, else the moment torch defines the class (a one-shot import hook that runs right after
the module ``torch.utils.data.dataset`` executes and then removes itself). Type checkers see the
real base class (``dataset.py``, under ``TYPE_CHECKING``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any

_MODULE = "torch.utils.data.dataset"  # defines IterableDataset; torch imports it in `import torch`


def register_as_iterable_dataset(cls: type) -> None:
    """Make ``isinstance(x, torch.utils.data.IterableDataset)`` true for instances of ``cls``,
    now or as soon as torch defines the class, without importing torch."""
    if register_if_loaded(cls):
        return
    for finder in sys.meta_path:  # one watcher for every class (the first one found imports)
        if isinstance(finder, _Watcher):
            finder.classes.append(cls)
            return
    sys.meta_path.insert(0, _Watcher(cls))


def register_if_loaded(cls: type) -> bool:
    """Register ``cls`` if torch has defined ``IterableDataset``; true if it has."""
    base = getattr(sys.modules.get(_MODULE), "IterableDataset", None)
    if base is None:
        return False
    if not issubclass(cls, base):
        base.register(cls)
    return True


class _Watcher(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for ``torch.utils.data.dataset`` it asks the other finders and
    wraps that module's loader so the class is registered right after the module runs."""

    def __init__(self, cls: type) -> None:
        self.classes = [cls]

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if not isinstance(loader, _FILE_LOADERS):
            return None  # an unusual loader: leave the import alone (checked again in __init__)
        run = loader.exec_module
        watcher = self

        def exec_module(module: Any) -> None:
            run(module)
            if watcher in sys.meta_path:
                sys.meta_path.remove(watcher)
            for cls in watcher.classes:
                register_if_loaded(cls)

        # The finder made this loader instance for this one module: patch only it.
        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_FILE_LOADERS = (importlib.machinery.SourceFileLoader, importlib.machinery.SourcelessFileLoader)

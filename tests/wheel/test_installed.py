"""When run by ``make test-wheel``: the suite really tests the installed wheel.

``tests/wheel/run.sh`` installs the built wheel into a fresh venv and runs ``pytest tests``
with ``SHARDSTREAM_WHEEL_VENV`` set to that venv; these checks then make sure the
``shardstream`` being tested is the wheel's (not the editable install, not the source tree)
and that no Rust toolchain was needed. Skipped in a normal run.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from importlib import metadata

import pytest

VENV = os.environ.get("SHARDSTREAM_WHEEL_VENV")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(not VENV, reason="only under make test-wheel")


def _inside(path: str, parent: str) -> bool:
    path, parent = os.path.realpath(path), os.path.realpath(parent)
    return os.path.commonpath([path, parent]) == parent


def test_shardstream_comes_from_the_wheel_in_the_fresh_venv():
    import shardstream
    import shardstream._core as core

    assert VENV is not None
    assert _inside(sys.prefix, VENV), (sys.prefix, VENV)
    site = sysconfig.get_paths()["purelib"]
    assert _inside(site, VENV)
    assert _inside(shardstream.__file__, site), shardstream.__file__
    assert _inside(core.__file__, site) and core.__file__.endswith(".abi3.so"), core.__file__
    assert not _inside(shardstream.__file__, REPO)
    dist = metadata.distribution("shardstream")
    assert dist.version == shardstream.__version__
    # A regular install (files listed in RECORD), not an editable .pth pointing at the repo.
    files = {str(f) for f in dist.files or ()}
    assert "shardstream/_core.abi3.so" in files and "shardstream/cli/__init__.py" in files
    direct = dist.read_text("direct_url.json") or ""
    assert '"editable": true' not in direct


def test_source_tree_is_not_importable():
    src = os.path.join(REPO, "python")
    assert not any(p and _inside(p, src) for p in sys.path), sys.path


def test_no_rust_toolchain_on_path():
    assert shutil.which("cargo") is None and shutil.which("rustc") is None


def test_console_script_installed():
    assert shutil.which("shardstream") is not None
    assert _inside(shutil.which("shardstream") or "", VENV or "/nonexistent")

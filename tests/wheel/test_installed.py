"""When run by ``make test-wheel``: the suite really tests the installed wheel.

``tests/wheel/run.sh`` installs the built wheel into a fresh venv and runs ``pytest tests``
with ``SHARDSTREAM_WHEEL_VENV`` set to that venv (and ``SHARDSTREAM_WHEEL_FILE`` to the wheel);
these checks then make sure the ``shardstream`` being tested is the wheel's (not the editable
install, not the source tree), that no Rust toolchain was needed, and, on Linux, that the
installed extension needs nothing newer than glibc 2.17 (the ``manylinux2014`` promise of its
tag). Skipped in a normal run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from importlib import metadata

import pytest

VENV = os.environ.get("SHARDSTREAM_WHEEL_VENV")
WHEEL_FILE = os.environ.get("SHARDSTREAM_WHEEL_FILE")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# manylinux2014 = manylinux_2_17: the oldest glibc the release wheel promises to load on.
MAX_GLIBC = (2, 17)

pytestmark = pytest.mark.skipif(not VENV, reason="only under make test-wheel")
linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="glibc symbol versions: Linux wheels only"
)


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


def _installed_extension() -> str:
    import shardstream._core as core

    return core.__file__


def glibc_versions_needed(path: str) -> set[tuple[int, ...]]:
    """Every ``GLIBC_x.y[.z]`` version that ``path`` requires (its ELF version-needed entries,
    ``.gnu.version_r``): the dynamic loader refuses the file on a glibc older than any of them."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    found: set[tuple[int, ...]] = set()
    with open(path, "rb") as f:
        sections = [s for s in ELFFile(f).iter_sections() if isinstance(s, GNUVerNeedSection)]
        assert sections, f"{path}: no version-needed section (not a dynamically linked ELF?)"
        for section in sections:
            for _verneed, auxiliaries in section.iter_versions():
                for aux in auxiliaries:
                    m = re.fullmatch(r"GLIBC_(\d+(?:\.\d+)+)", aux.name)
                    if m:
                        found.add(tuple(int(x) for x in m.group(1).split(".")))
    return found


@linux_only
def test_extension_needs_glibc_2_17_at_most():
    needed = glibc_versions_needed(_installed_extension())
    # A reader that finds nothing would pass anything: the extension uses libc, so there are some.
    assert needed, "no GLIBC_ symbol versions found in the extension"
    newest = max(needed)
    too_new = sorted(v for v in needed if v > MAX_GLIBC)
    assert newest <= MAX_GLIBC, (
        f"the installed extension needs glibc {'.'.join(map(str, newest))} "
        f"(versions above 2.17: {['.'.join(map(str, v)) for v in too_new]}): "
        "the release wheel must load on glibc 2.17 (manylinux2014)"
    )


@linux_only
def test_auditwheel_confirms_the_wheel_tag():
    """auditwheel, from the extension's symbol versions, finds the same manylinux tag as the
    wheel's name and WHEEL file carry: manylinux_2_17 (manylinux2014)."""
    assert WHEEL_FILE, "run.sh sets SHARDSTREAM_WHEEL_FILE to the wheel it installed"
    out = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", WHEEL_FILE],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = " ".join(out.stdout.split())  # auditwheel wraps its lines
    m = re.search(r'consistent with the following platform tag: "(manylinux_\d+_\d+_\w+)"', text)
    assert m, text
    arch = sysconfig.get_platform().split("-", 1)[1].replace("-", "_")
    assert m.group(1) == f"manylinux_2_17_{arch}", text
    dist = metadata.distribution("shardstream")
    tags = re.findall(r"^Tag: (.+)$", dist.read_text("WHEEL") or "", re.M)
    assert f"cp310-abi3-manylinux_2_17_{arch}" in tags, tags
    assert f"manylinux_2_17_{arch}" in os.path.basename(WHEEL_FILE), WHEEL_FILE

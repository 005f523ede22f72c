"""Check the built wheel and sdist before installing them (``make test-wheel``).

Usage: ``python tests/wheel/check_dist.py WHEEL SDIST``. Exits 1 naming what is wrong:

* wheel: an abi3 wheel for CPython >= 3.10 (``cp310-abi3``) with a ``manylinux_*`` /
  ``manylinux20xx`` platform tag on Linux (maturin's auditwheel check passed, so no external
  shared libraries), holding every module of ``python/shardstream``, the compiled
  ``_core.abi3.so``, ``py.typed``, the console script, ``Requires-Python: >=3.10``;
* sdist: everything needed to build the wheel from source (pyproject and the PEP 517 backend it
  names, Cargo workspace and lock file, both crates, the Python package, README) and no build
  products.
"""

from __future__ import annotations

import configparser
import os
import re
import sys
import tarfile
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.join(REPO, "python", "shardstream")

WHEEL_RE = re.compile(r"^shardstream-(?P<version>[^-]+)-cp310-abi3-(?P<platform>[a-z0-9_.]+)\.whl$")


def package_files() -> list[str]:
    tracked = []
    for name in sorted(os.listdir(PKG)):
        if name.endswith((".py", ".pyi")) or name == "py.typed":
            tracked.append(f"shardstream/{name}")
    return tracked


def check_wheel(path: str) -> list[str]:
    errors: list[str] = []
    name = os.path.basename(path)
    m = WHEEL_RE.match(name)
    if not m:
        return [f"{name}: not a cp310-abi3 wheel (expected shardstream-V-cp310-abi3-PLATFORM.whl)"]
    platform = m.group("platform")
    if sys.platform.startswith("linux") and not re.match(
        r"^(manylinux_\d+_\d+|manylinux20(10|14))_", platform
    ):
        errors.append(f"{name}: platform tag {platform!r} is not manylinux (not uploadable)")
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        for f in package_files():
            if f not in names:
                errors.append(f"{name}: missing {f}")
        if "shardstream/_core.abi3.so" not in names:
            errors.append(f"{name}: missing the extension shardstream/_core.abi3.so")
        stray = sorted(n for n in names if n.endswith(".so") and n != "shardstream/_core.abi3.so")
        if stray:
            errors.append(f"{name}: unexpected shared libraries {stray}")
        dist_info = f"shardstream-{m.group('version')}.dist-info"
        meta = z.read(f"{dist_info}/METADATA").decode()
        if "Requires-Python: >=3.10" not in meta:
            errors.append(f"{name}: METADATA lacks Requires-Python: >=3.10")
        for dep in ("numpy", "pyarrow"):
            if not re.search(rf"^Requires-Dist: {dep}\b", meta, re.M):
                errors.append(f"{name}: METADATA does not require {dep}")
        wheel_meta = z.read(f"{dist_info}/WHEEL").decode()
        if "Tag: cp310-abi3-" not in wheel_meta:
            errors.append(f"{name}: WHEEL file has no cp310-abi3 tag")
        eps = configparser.ConfigParser()
        eps.read_string(z.read(f"{dist_info}/entry_points.txt").decode())
        script = eps.get("console_scripts", "shardstream", fallback=None)
        if script not in ("shardstream.cli:main", "shardstream.__main__:main"):
            errors.append(f"{name}: console script 'shardstream' is {script!r}")
    return errors


SDIST_REQUIRED = [
    "PKG-INFO",
    "pyproject.toml",
    "build_backend/shardstream_backend.py",
    "README.md",
    "Cargo.toml",
    "Cargo.lock",
    "rust/core/Cargo.toml",
    "rust/core/src/lib.rs",
    "rust/python/Cargo.toml",
    "rust/python/src/lib.rs",
]


def check_sdist(path: str) -> list[str]:
    errors: list[str] = []
    name = os.path.basename(path)
    m = re.match(r"^shardstream-(?P<version>[^-]+)\.tar\.gz$", name)
    if not m:
        return [f"{name}: not named shardstream-VERSION.tar.gz"]
    top = f"shardstream-{m.group('version')}/"
    with tarfile.open(path) as t:
        names = {n[len(top) :] for n in t.getnames() if n.startswith(top)}
    wanted = SDIST_REQUIRED + [f"python/{f}" for f in package_files()]
    errors += [f"{name}: missing {f}" for f in wanted if f not in names]
    junk = sorted(
        n
        for n in names
        if n.endswith((".so", ".pyd", ".whl"))
        or n.startswith(("target/", ".venv/", "dist/"))
        or "__pycache__" in n
    )
    if junk:
        errors.append(f"{name}: build products in the sdist: {junk[:5]}")
    return errors


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    wheel, sdist = argv
    errors = check_wheel(wheel) + check_sdist(sdist)
    for e in errors:
        print(f"check_dist: {e}", file=sys.stderr)
    if errors:
        return 1
    print(f"check_dist: OK {os.path.basename(wheel)}, {os.path.basename(sdist)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

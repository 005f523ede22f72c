"""PEP 517 build backend: maturin's, plus the release-wheel settings for glibc Linux.

maturin's own backend builds a plain ``linux_x86_64`` wheel (``--compatibility off``) and
``[tool.maturin]`` has no zig setting, so ``pip wheel .`` / ``pip install .`` / ``python -m
build`` come through here: on glibc Linux (x86_64, aarch64) a regular (non-editable) wheel build
gets ``[tool.shardstream.linux-wheel] build-args`` from pyproject.toml (zig links against glibc
2.17: an abi3 ``manylinux2014`` wheel) and installs that table's ``requires`` (ziglang) in an
isolated build. An editable install gets the same settings when asked with ``-C
release-wheel=true`` (``make venv`` / ``make build`` do: ``make test-wheel``'s wheel build then
reuses that cargo build instead of compiling everything again). Everything else -- other
editable installs (``pip install -e .``, ``maturin develop``), the sdist, macOS, musl -- is
maturin's backend unchanged.

Build arguments given to the build (``-C maturin.build-args=...`` or ``MATURIN_PEP517_ARGS``)
replace these settings instead of adding to them (maturin's ``--zig`` cannot be switched off
again by a later argument): ``pip wheel . -C maturin.build-args=`` is maturin's default build.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from typing import Any

import maturin

if sys.version_info >= (3, 11):
    import tomllib
else:  # maturin requires tomli on Python < 3.11
    import tomli as tomllib

# maturin's hooks that stay as they are (sdist); the optional ones only if this maturin has them.
for _hook in ("build_sdist", "get_requires_for_build_sdist"):
    if hasattr(maturin, _hook):
        globals()[_hook] = getattr(maturin, _hook)

TABLE = "tool.shardstream.linux-wheel"
# maturin warns on every build that build-backend is not "maturin": this backend is maturin's.
os.environ.setdefault("MATURIN_NO_MISSING_BUILD_BACKEND_WARNING", "1")


def _settings() -> dict[str, list[str]]:
    """``[tool.shardstream.linux-wheel]`` of ./pyproject.toml (hooks run in the source tree)."""
    with open("pyproject.toml", "rb") as f:
        table = tomllib.load(f).get("tool", {}).get("shardstream", {}).get("linux-wheel", {})
    out = {}
    for key in ("requires", "build-args"):
        value = table.get(key)
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise SystemExit(
                f"pyproject.toml: [{TABLE}] {key} must be a list of strings, got {value!r}"
            )
        out[key] = value
    return out


def _applies(config_settings: Mapping[str, Any] | None) -> bool:
    """glibc Linux on a manylinux2014 architecture, and no build arguments given by the caller."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    if platform.machine() not in ("x86_64", "aarch64"):
        return False
    given = config_settings and (
        "maturin.build-args" in config_settings or "build-args" in config_settings
    )
    return not given and "MATURIN_PEP517_ARGS" not in os.environ


def get_requires_for_build_wheel(config_settings: Mapping[str, Any] | None = None) -> list[str]:
    extra = _settings()["requires"] if _applies(config_settings) else []
    return [*maturin.get_requires_for_build_wheel(config_settings), *extra]


def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: Mapping[str, Any] | None = None
) -> str:
    # The WHEEL file written here carries the platform tag: same arguments as build_wheel.
    return maturin.prepare_metadata_for_build_wheel(
        metadata_directory, _release_settings(config_settings)
    )


def build_wheel(
    wheel_directory: str,
    config_settings: Mapping[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    settings = _release_settings(config_settings)
    return maturin.build_wheel(wheel_directory, settings, metadata_directory)


# Config setting that builds an editable install exactly as the release wheel is built
# (``pip install -e . -C release-wheel=true``, what ``make venv`` does): the same cargo
# command, so a later ``pip wheel .`` finds every artifact built and only packages them.
EDITABLE_AS_RELEASE = "release-wheel"


def _as_release(config_settings: Mapping[str, Any] | None) -> tuple[bool, dict[str, Any]]:
    """(whether ``release-wheel=true`` was given, the settings without that key)."""
    settings = dict(config_settings or {})
    value = settings.pop(EDITABLE_AS_RELEASE, "false")
    if value not in ("true", "false"):
        raise SystemExit(f"-C {EDITABLE_AS_RELEASE}= must be true or false, got {value!r}")
    return value == "true", settings


def _editable_settings(config_settings: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """Editable builds are maturin's, unless ``release-wheel=true`` asks for the wheel's."""
    release, settings = _as_release(config_settings)
    return _release_settings(settings) if release else settings


def get_requires_for_build_editable(
    config_settings: Mapping[str, Any] | None = None,
) -> list[str]:
    release, settings = _as_release(config_settings)
    extra = _settings()["requires"] if release and _applies(settings) else []
    return [*maturin.get_requires_for_build_editable(settings), *extra]


def prepare_metadata_for_build_editable(
    metadata_directory: str, config_settings: Mapping[str, Any] | None = None
) -> str:
    return maturin.prepare_metadata_for_build_editable(
        metadata_directory, _editable_settings(config_settings)
    )


def build_editable(
    wheel_directory: str,
    config_settings: Mapping[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    settings = _editable_settings(config_settings)
    return maturin.build_editable(wheel_directory, settings, metadata_directory)


def _release_settings(config_settings: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    if not _applies(config_settings):
        return config_settings
    args = _settings()["build-args"]
    if "--zig" in args:
        _require_zig()
        # maturin runs `python3 -m ziglang` from PATH unless told which Python: this one has it.
        os.environ.setdefault("CARGO_ZIGBUILD_PYTHON_PATH", sys.executable)
    print(f"shardstream build backend: maturin {' '.join(args)} (from [{TABLE}])", flush=True)
    return {**(config_settings or {}), "maturin.build-args": args}


def _require_zig() -> None:
    try:
        import ziglang  # noqa: F401
    except ImportError:
        raise SystemExit(
            f"shardstream build backend: [{TABLE}] links with zig, but the Python package "
            "'ziglang' is not installed in this build environment. Install it "
            "(pip install ziglang; a build with isolation installs it itself), or build "
            "without zig: pip wheel . -C maturin.build-args='--compatibility off'"
        ) from None

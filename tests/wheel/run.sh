#!/usr/bin/env bash
# make test-wheel: the built wheel, installed into a fresh venv, passes the test suite.
#
#   bash tests/wheel/run.sh DIST_DIR [pytest args...]
#
# 1. check_dist.py: the wheel in DIST_DIR is cp310-abi3 + manylinux with every module, the
#    sdist has everything needed to build from source.
# 2. A fresh venv (--system-site-packages, only to reuse the machine-wide torch/pyarrow/pytest
#    instead of downloading GBs; shardstream itself is NOT there) gets the wheel installed
#    (pip install --no-deps --ignore-installed WHEEL, then WHEEL[test] for the dependencies).
# 3. pytest runs the repo's tests/ against it from an empty directory, so the source tree's
#    python/ is not importable, with cargo and rustc removed from PATH.  tests/wheel/test_installed.py
#    (active because SHARDSTREAM_WHEEL_VENV is set) asserts shardstream.__file__ is in the
#    venv's site-packages, no Rust toolchain is reachable and, on Linux, that the installed
#    extension needs glibc <= 2.17 and auditwheel finds the wheel (SHARDSTREAM_WHEEL_FILE)
#    manylinux_2_17.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DIST=${1:?usage: run.sh DIST_DIR [pytest args...]}
shift
PYTHON=${PYTHON:-python3}

shopt -s nullglob
wheels=("$DIST"/shardstream-*.whl)
sdists=("$DIST"/shardstream-*.tar.gz)
shopt -u nullglob
if [ ${#wheels[@]} -ne 1 ] || [ ${#sdists[@]} -ne 1 ]; then
    echo "test-wheel: expected exactly one wheel and one sdist in $DIST, found: ${wheels[*]-} ${sdists[*]-}" >&2
    exit 1
fi
whl=$(cd "$(dirname "${wheels[0]}")" && pwd)/$(basename "${wheels[0]}")
"$PYTHON" "$ROOT/tests/wheel/check_dist.py" "$whl" "${sdists[0]}"

work=$(mktemp -d "${TMPDIR:-/tmp}/shardstream-wheel-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo ">>> fresh venv $work/venv ($("$PYTHON" --version 2>&1), --system-site-packages for torch)"
"$PYTHON" -m venv --system-site-packages "$work/venv"
VPY="$work/venv/bin/python"
PIP=("$VPY" -m pip --disable-pip-version-check --no-input -q)
"${PIP[@]}" install --no-deps --ignore-installed --no-compile "$whl"
"${PIP[@]}" install "$whl[test]"   # dependencies (already satisfied where the machine has them)

# PATH without any directory that holds cargo or rustc.
clean_path="$work/venv/bin"
IFS=: read -ra dirs <<< "$PATH"
for d in "${dirs[@]}"; do
    [ -n "$d" ] || continue
    if [ -e "$d/cargo" ] || [ -e "$d/rustc" ]; then
        echo ">>> PATH without $d (has cargo/rustc)"
        continue
    fi
    clean_path+=":$d"
done

mkdir "$work/run"
cd "$work/run"
run() {
    env -u PYTHONPATH -u VIRTUAL_ENV -u PYO3_PYTHON -u CARGO_TARGET_DIR -u RUSTUP_TOOLCHAIN \
        PATH="$clean_path" SHARDSTREAM_WHEEL_VENV="$work/venv" SHARDSTREAM_WHEEL_FILE="$whl" "$@"
}
run "$VPY" -c 'import shardstream, shardstream._core as c; print(">>> testing", shardstream.__version__, "from", shardstream.__file__)'
run shardstream --version
rc=0
run "$VPY" -m pytest "$@" "$ROOT/tests" || rc=$?
if [ $rc -eq 5 ]; then echo "test-wheel: pytest collected no tests (exit 5)" >&2; fi
exit $rc

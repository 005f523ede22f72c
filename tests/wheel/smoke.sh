#!/usr/bin/env bash
# make wheel-smoke: the abi3 wheel on other CPython versions (>= 3.10).
#
#   bash tests/wheel/smoke.sh DIST_DIR PYTHON...
#
# For each interpreter that runs and is >= 3.10 (one per minor version; others are skipped with
# a note): a fresh venv, pip install the wheel (numpy and pyarrow come from the package index,
# torch is not installed), then tests/wheel/smoke.py from outside the source tree.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DIST=${1:?usage: smoke.sh DIST_DIR PYTHON...}
shift
shopt -s nullglob
wheels=("$DIST"/shardstream-*.whl)
shopt -u nullglob
[ ${#wheels[@]} -eq 1 ] || { echo "smoke: expected one wheel in $DIST" >&2; exit 1; }
whl=$(cd "$(dirname "${wheels[0]}")" && pwd)/$(basename "${wheels[0]}")

work=$(mktemp -d "${TMPDIR:-/tmp}/shardstream-smoke.XXXXXX")
trap 'rm -rf "$work"' EXIT
declare -A seen=()
tested=0
for py in "$@"; do
    ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2]) if sys.version_info >= (3, 10) else print("old")' 2>/dev/null) || {
        echo ">>> skip $py (not runnable here)"; continue; }
    if [ "$ver" = old ]; then echo ">>> skip $py (older than 3.10)"; continue; fi
    if [ -n "${seen[$ver]-}" ]; then continue; fi
    seen[$ver]=1
    echo ">>> CPython $ver ($py)"
    "$py" -m venv "$work/venv-$ver"
    "$work/venv-$ver/bin/python" -m pip install -q --disable-pip-version-check --no-input "$whl"
    (cd "$work" && env -u PYTHONPATH "$work/venv-$ver/bin/python" "$ROOT/tests/wheel/smoke.py")
    tested=$((tested + 1))
done
if [ $tested -eq 0 ]; then
    echo "smoke: no usable interpreter among: $*" >&2
    exit 1
fi

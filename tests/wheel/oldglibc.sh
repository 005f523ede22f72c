#!/usr/bin/env bash
# make wheel-oldglibc: the release wheel installed, imported and used under an older glibc than
# the build machine's, in a Debian 11 "bullseye" chroot (glibc 2.31; the oldest Debian release
# Debian's archive still serves). Needs root and the network (Debian's archive, PyPI): optional,
# not part of `make test`.
#
#   bash tests/wheel/oldglibc.sh DIST_DIR ROOTFS_DIR
#
# 1. ROOTFS_DIR: debootstrap --variant=minbase bullseye (once; reused while it is complete).
# 2. CPython 3.11 built inside it with bullseye's gcc and glibc, from the upstream tarball of
#    Debian's python3.11 source package (bullseye's own Python is 3.9, below the wheel's
#    cp310-abi3 floor). Once, ~5 min on 2 cores.
# 3. numpy + pyarrow: pip here downloads the wheels that CPython 3.11 on glibc 2.31 can use;
#    inside, that Python's own pip installs them and the shardstream wheel from local files
#    only, so its tag check (manylinux_2_17 <= 2.31) is the real one.
# 4. tests/wheel/smoke.py inside the chroot: import, shuffled stream, exact resume from JSON,
#    the CLI. The chroot runs in its own mount namespace, so /proc is unmounted when it exits.
set -euo pipefail

ROOT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DIST=${1:?usage: oldglibc.sh DIST_DIR ROOTFS_DIR}
RFS=${2:?usage: oldglibc.sh DIST_DIR ROOTFS_DIR}
SUITE=bullseye
PYSRC=python3.11           # Debian source package (bookworm's) whose upstream tarball is built
PREFIX=/opt/python3.11
PYTHON=${PYTHON:-python3}

die() { echo "wheel-oldglibc: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot)"
command -v debootstrap > /dev/null || die "needs debootstrap: apt-get install debootstrap"
shopt -s nullglob
wheels=("$DIST"/shardstream-*.whl)
shopt -u nullglob
[ ${#wheels[@]} -eq 1 ] || die "expected one wheel in $DIST (make wheel), found: ${wheels[*]-none}"
whl=$(cd "$(dirname "${wheels[0]}")" && pwd)/$(basename "${wheels[0]}")
mkdir -p "$(dirname "$RFS")"
RFS=$(cd "$(dirname "$RFS")" && pwd)/$(basename "$RFS")

in_root() {  # in_root CMD...: run CMD in the chroot, with /proc, in a private mount namespace
    unshare --mount --propagation private -- bash -c \
        'mount -t proc proc "$0/proc" && exec chroot "$0" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 "$@"' \
        "$RFS" "$@"
}

if [ ! -e "$RFS/.shardstream-rootfs-ok" ]; then
    echo ">>> debootstrap $SUITE into $RFS"
    # An interrupted debootstrap can leave its /proc or /sys mounted there: never rm -rf those.
    if grep -qF " $RFS/" /proc/mounts; then die "something is mounted under $RFS; unmount it first"; fi
    rm -rf "$RFS"
    debootstrap --variant=minbase "$SUITE" "$RFS"
    # deb-src of the next release (same archive as debootstrap chose) for the CPython source.
    sed -n "s/^deb \(.*\) $SUITE main\$/deb-src \1 bookworm main/p" "$RFS/etc/apt/sources.list" \
        > "$RFS/etc/apt/sources.list.d/src.list"
    [ -s "$RFS/etc/apt/sources.list.d/src.list" ] || die "unexpected $RFS/etc/apt/sources.list"
    in_root apt-get update -q
    in_root apt-get install -y -q --no-install-recommends \
        gcc make libc6-dev zlib1g-dev libffi-dev libssl-dev xz-utils ca-certificates
    touch "$RFS/.shardstream-rootfs-ok"
fi
if [ ! -x "$RFS$PREFIX/bin/python3" ]; then
    echo ">>> CPython from Debian's $PYSRC source package, built in the chroot"
    in_root bash -euc "
        rm -rf /build && mkdir /build && cd /build
        apt-get source -q --download-only $PYSRC
        tar xf ${PYSRC}_*.orig.tar.*
        cd Python-*/
        ./configure -q --prefix=$PREFIX > /dev/null
        make -s -j\$(nproc) > /dev/null
        make -s install > /dev/null
        cd / && rm -rf /build"
fi
echo ">>> chroot: $(in_root ldd --version | head -n1); $(in_root $PREFIX/bin/python3 --version)"

# Wheels for that interpreter and glibc; the wheelhouse is fresh for every run.
house="$RFS/wheelhouse"
rm -rf "$house" && mkdir -p "$house"
pyver=$(in_root $PREFIX/bin/python3 -c 'import sys; print("%d%d" % sys.version_info[:2])')
platforms=()  # pip takes --platform tags literally: every manylinux glibc 2.31 accepts
for minor in $(seq 31 -1 5); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
"$PYTHON" -m pip download -q --disable-pip-version-check --no-input --dest "$house" \
    --only-binary=:all: --implementation cp --python-version "$pyver" "${platforms[@]}" "$whl"
cp "$ROOT_DIR/tests/wheel/smoke.py" "$house/"
in_root rm -rf /venv
in_root $PREFIX/bin/python3 -m venv /venv
in_root /venv/bin/python -m pip install -q --disable-pip-version-check --no-input \
    --no-index --find-links /wheelhouse shardstream
in_root bash -c 'cd /tmp && /venv/bin/python -c "import os; print(\">>> glibc\", os.confstr(\"CS_GNU_LIBC_VERSION\"))" && /venv/bin/python /wheelhouse/smoke.py'

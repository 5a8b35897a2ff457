#!/usr/bin/env bash
# Build the ichord image without a Docker engine and start it.
#
# The same recipe as the Dockerfile: a Debian bookworm root filesystem with python3 (mmdebstrap,
# cached under ~/.cache/ichord/image keyed by its inputs), ichord's wheel and the pinned wheels of
# its dependencies (constraints.txt) installed into a venv at /opt/ichord, user 65532, packed as an
# OCI image layout with umoci (entrypoint, user, env and OCI labels in the image config). The
# packed image is then unpacked again and its entrypoint started from that root filesystem,
# mounted read-only, as UID 65532 in a private mount and PID namespace (chroot + unshare, root
# needed): `--help`, `--version` (or the version from the package metadata when that flag does
# not exist yet), then `ichord run` against `ichord sim kube` on loopback until /readyz is 200.
#
#   scripts/image.sh [OUT_DIR]      # default build/image; prints the build time and the image size
#
# Skips (exit 0, the reason printed) without root, unshare or a Debian mirror; installs mmdebstrap
# and umoci with apt when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${1:-build/image}
PY=${PYTHON:-$ROOT/.venv/bin/python}
SUITE=bookworm
# Runtime packages of the image (the Dockerfile's final stage installs the same).
PACKAGES=python3,ca-certificates,libstdc++6  # libstdc++6: google-re2 (cel-python, health gates) links it
DPKG_OPTS=(--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
           --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*'
           --dpkgopt='path-exclude=/usr/share/info/*')
CACHE=${ICHORD_IMAGE_CACHE:-$HOME/.cache/ichord/image}

skip() { echo "image.sh: SKIPPED: $*"; exit 0; }
say() { echo "image.sh: $*"; }

[ "$(id -u)" = 0 ] || skip "needs root (chroot, mounts and unshare for the daemonless build)"
command -v unshare >/dev/null || skip "no unshare(1)"
unshare -m -p -f --mount-proc true 2>/dev/null || skip "unshare cannot create mount and PID namespaces here"
if ! command -v mmdebstrap >/dev/null || ! command -v umoci >/dev/null; then
    say "installing mmdebstrap and umoci with apt"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap umoci >/dev/null; } \
        || skip "mmdebstrap/umoci are not installed and apt cannot install them"
fi
[ -x "$PY" ] || { echo "image.sh: $PY missing; run make venv first" >&2; exit 2; }

start=$(date +%s)
VERSION=$("$PY" -c 'import ichord; print(ichord.__version__)')
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
rm -rf "$OUT"
mkdir -p "$OUT" "$CACHE"
OUT=$(cd "$OUT" && pwd)

# 1. The base root filesystem, cached by its inputs (suite, packages, dpkg filters, mmdebstrap version).
key=$(printf '%s\n' "$SUITE" "$PACKAGES" "${DPKG_OPTS[@]}" "$(mmdebstrap --version)" | sha256sum | cut -c1-16)
base="$CACHE/base-$SUITE-$key.tar"
if [ ! -s "$base" ]; then
    say "building the base root filesystem ($SUITE + $PACKAGES) with mmdebstrap"
    mmdebstrap --quiet --format=tar --variant=essential --include="$PACKAGES" "${DPKG_OPTS[@]}" "$SUITE" "$base.tmp" \
        || skip "mmdebstrap could not build $SUITE (no Debian mirror reachable?)"
    mv "$base.tmp" "$base"
else
    say "base root filesystem from the cache: $base"
fi

# 2. The wheels: ichord's and the pinned ones of its runtime dependencies (host Python 3.11 = bookworm's).
"$PY" - <<'EOF'
import sys
if sys.version_info[:2] != (3, 11):
    sys.exit(f"image.sh: the wheels must be built by Python 3.11 (bookworm's python3), not {sys.version.split()[0]}")
EOF
# From a copy of the tracked files: setuptools' in-tree build/ may hold modules deleted since.
WHEELS="$OUT/wheels"
SRC="$OUT/src"
mkdir -p "$SRC"
if git rev-parse --git-dir >/dev/null 2>&1; then
    git ls-files -z | tar --null -T - -cf - | tar -x -C "$SRC"
else
    cp -a pyproject.toml README.md LICENSE constraints.txt ichord "$SRC/"
fi
"$PY" -m pip wheel --quiet --no-cache-dir --wheel-dir "$WHEELS" -c constraints.txt "$SRC" pip
rm -rf "$SRC"

# 3. The root filesystem: base + venv + user, as the Dockerfile's stages do.
ROOTFS="$OUT/rootfs"
mkdir -p "$ROOTFS"
tar -C "$ROOTFS" -xf "$base"
mkdir -p "$ROOTFS/wheels"
cp "$WHEELS"/*.whl "$ROOTFS/wheels/"
pipwhl=$(cd "$ROOTFS/wheels" && ls pip-*.whl)
# A clean environment in the chroot: the host's PIP_* settings do not apply to the image.
in_rootfs() { chroot "$ROOTFS" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }
in_rootfs /usr/bin/python3 -m venv --without-pip /opt/ichord
in_rootfs /opt/ichord/bin/python "/wheels/$pipwhl/pip" install --quiet --no-cache-dir --no-index \
    --disable-pip-version-check --find-links /wheels ichord
rm -rf "$ROOTFS/wheels"
echo 'nonroot:x:65532:65532:nonroot:/home/nonroot:/usr/sbin/nologin' >> "$ROOTFS/etc/passwd"
echo 'nonroot:x:65532:' >> "$ROOTFS/etc/group"
install -d -o 65532 -g 65532 -m 0700 "$ROOTFS/home/nonroot"
# The apt lists and caches mmdebstrap leaves, as the Dockerfile's rm -rf does.
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/* "$ROOTFS"/var/log/*

# 4. The OCI image layout.
LAYOUT="$OUT/oci"
IMAGE="$LAYOUT:$VERSION"
umoci init --layout "$LAYOUT"
umoci new --image "$IMAGE"
umoci unpack --image "$IMAGE" "$OUT/bundle" >/dev/null
rm -rf "$OUT/bundle/rootfs"
mv "$ROOTFS" "$OUT/bundle/rootfs"
umoci repack --image "$IMAGE" "$OUT/bundle"
umoci config --image "$IMAGE" \
    --config.entrypoint ichord --config.cmd run --config.user 65532:65532 --config.workingdir /home/nonroot \
    --config.env PATH=/opt/ichord/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.env PYTHONDONTWRITEBYTECODE=1 --config.env PYTHONUNBUFFERED=1 \
    --config.label org.opencontainers.image.title=ichord \
    --config.label "org.opencontainers.image.version=$VERSION" \
    --config.label "org.opencontainers.image.revision=$REVISION" \
    --config.label org.opencontainers.image.licenses=Apache-2.0 \
    --config.label org.opencontainers.image.source=https://github.com/maesh/ichord \
    --config.label "org.opencontainers.image.base.name=debian:$SUITE (mmdebstrap --variant=essential)"
umoci gc --layout "$LAYOUT"
rm -rf "$OUT/bundle" "$WHEELS"
built=$(date +%s)
layer_bytes=$(find "$LAYOUT/blobs" -type f -size +1M -printf '%s\n' | awk '{s+=$1} END {print s+0}')

# 5. Start what was packed: unpack the layout and run its entrypoint with its config.
umoci unpack --image "$IMAGE" "$OUT/run" >/dev/null
RUNROOT="$OUT/run/rootfs"
"$PY" - "$OUT/run/config.json" "$VERSION" > "$OUT/run/process.env" <<'EOF'
import json, shlex, sys
cfg = json.load(open(sys.argv[1]))
proc = cfg["process"]
assert proc["args"][:1] == ["ichord"], proc["args"]
assert (proc["user"]["uid"], proc["user"]["gid"]) == (65532, 65532), proc["user"]
print("IMAGE_ENV=" + shlex.quote(" ".join(proc["env"])))
print("IMAGE_CWD=" + shlex.quote(proc["cwd"]))
EOF
# shellcheck disable=SC1091
. "$OUT/run/process.env"
unpacked_bytes=$(du -sb "$RUNROOT" | cut -f1)

SIMDIR=$(mktemp -d)
chmod 0755 "$SIMDIR"  # traversed by UID 65532 inside the image
SIMPID=""
cleanup() {
    if [ -n "${DAEMON:-}" ]; then kill -KILL "$DAEMON" 2>/dev/null || true; fi
    if [ -n "$SIMPID" ]; then
        kill "$SIMPID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$SIMPID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$SIMPID" 2>/dev/null || true
        wait "$SIMPID" 2>/dev/null || true
    fi
    rm -rf "$SIMDIR"
}
trap cleanup EXIT
# The simulator on the host, the daemon in the image (same network namespace: loopback is shared).
"$PY" -m ichord.cli sim kube --host 127.0.0.1 --port 0 --kubeconfig "$SIMDIR/kubeconfig" > "$SIMDIR/sim.out" 2>&1 &
SIMPID=$!
for _ in $(seq 300); do grep -q '"url"' "$SIMDIR/sim.out" 2>/dev/null && break; sleep 0.1; done
grep -q '"url"' "$SIMDIR/sim.out" || { cat "$SIMDIR/sim.out"; echo "image.sh: the simulator did not start" >&2; exit 1; }
chmod 0644 "$SIMDIR/kubeconfig"  # read by UID 65532 inside the image

# run_in_image CMD...: the image's root read-only, a tmpfs /tmp, /proc of a new PID namespace, the
# kubeconfig read-only at /config, as 65532 with exactly the image's environment.
cat > "$OUT/run/enter.sh" <<'EOF'
#!/bin/sh
set -e
root=$1; cfgdir=$2; shift 2
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount -t tmpfs -o mode=1777,size=64m tmpfs "$root/tmp"
mkdir -p "$root/config" 2>/dev/null || true
mount --bind "$cfgdir" "$root/config"
mount -o remount,bind,ro "$root"
mount -t tmpfs -o size=1m tmpfs "$root/dev" && for d in null zero random urandom; do
    touch "$root/dev/$d"; mount --bind "/dev/$d" "$root/dev/$d"; done
exec chroot --userspec=65532:65532 "$root" /usr/bin/env -i $IMAGE_ENV HOME=/home/nonroot sh -c 'cd "$0" && exec "$@"' "$IMAGE_CWD" "$@"
EOF
chmod +x "$OUT/run/enter.sh"
mkdir -p "$RUNROOT/config"
# --kill-child: whatever happens to this script, the image's processes do not outlive it.
run_in_image() {
    IMAGE_ENV=$IMAGE_ENV IMAGE_CWD=$IMAGE_CWD exec unshare -m -p -f --kill-child "$OUT/run/enter.sh" "$RUNROOT" \
        "$SIMDIR" "$@"
}

(run_in_image ichord --help) > "$OUT/run/help.txt"
grep -q "usage: ichord" "$OUT/run/help.txt" || { cat "$OUT/run/help.txt"; echo "image.sh: ichord --help failed" >&2; exit 1; }
if (run_in_image ichord --version) > "$OUT/run/version.txt" 2>&1; then
    image_version=$(tr -d '\n' < "$OUT/run/version.txt")
else
    image_version=$( (run_in_image python3 -c 'import importlib.metadata as m; print(m.version("ichord"))') )
fi
case "$image_version" in *"$VERSION"*) ;; *) echo "image.sh: the image says version '$image_version', not $VERSION" >&2; exit 1;; esac
say "in the image: ichord --help ok, version $image_version"

port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(run_in_image ichord run --kubeconfig /config/kubeconfig --namespace default --metrics-addr "127.0.0.1:$port" \
    --log-level info) > "$OUT/run/daemon.log" 2>&1 &
DAEMON=$!  # unshare's PID (the subshell exec'd it); the daemon is its child
ready=""
for _ in $(seq 300); do
    if "$PY" - "$port" <<'EOF' 2>/dev/null
import sys, urllib.request
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/readyz", timeout=1) as r:
    sys.exit(0 if r.status == 200 else 1)
EOF
    then ready=yes; break; fi
    kill -0 "$DAEMON" 2>/dev/null || break
    sleep 0.2
done
# SIGTERM to the daemon itself (PID 1 of its namespace): it stops and hands the Lease over, exit 0.
child=$(pgrep -P "$DAEMON" || true)
[ -n "$child" ] && kill -TERM "$child" 2>/dev/null
for _ in $(seq 150); do kill -0 "$DAEMON" 2>/dev/null || break; sleep 0.1; done
kill -KILL "$DAEMON" 2>/dev/null || true
daemon_rc=0
wait "$DAEMON" || daemon_rc=$?
if [ -n "$ready" ] && [ "$daemon_rc" != 0 ]; then
    tail -n 30 "$OUT/run/daemon.log"
    echo "image.sh: ichord run in the image exited $daemon_rc on SIGTERM, not 0" >&2
    exit 1
fi
if [ -z "$ready" ]; then
    tail -n 30 "$OUT/run/daemon.log"
    echo "image.sh: ichord run in the image never answered /readyz 200" >&2
    exit 1
fi
rm -rf "$OUT/run"
total=$(date +%s)
say "ichord run in the image: /readyz 200 against the simulator"
say "built $IMAGE in $((built - start)) s (total with the run $((total - start)) s);" \
    "compressed layer $((layer_bytes / 1048576)) MiB, root filesystem $((unpacked_bytes / 1048576)) MiB"

#!/usr/bin/env bash
# Build the real Kubernetes that mgpu's tests/k8s tier runs, from Debian 12's own archive.
#
#   scripts/k8s/build.sh          build once (minutes), then answer from the cache (instant)
#   scripts/k8s/build.sh --print  print the cache directory and exit 0 only when it is ready
#
# What it makes, under $MGPU_K8S_CACHE (default /var/cache/mgpu-k8s), outside the clone so
# that a machine builds once whatever checkout runs the tests:
#
#   <version>/bin/   kube-apiserver kube-scheduler kube-controller-manager kubelet
#                    (Debian's source package `kubernetes`, its Go modules vendored, built
#                    with Debian's golang-go), mgpu-fakegpu (a device plugin advertising fake
#                    nvidia.com/gpu devices: scripts/k8s/fakegpu), pause (Kubernetes' own
#                    pause.c, linked statically)
#   <version>/images/ pause.tar busybox.tar  docker-archive images for `ctr images import`
#                    (no registry here: built from busybox-static with a private podman store)
#   <version>/READY  written last; its content says what was built from what
#
# etcd, containerd, runc and the CNI plugins come from Debian's binary packages, installed
# here when missing.  Idempotent; serialised by a lock, so concurrent runs build once.
set -euo pipefail

K8S_VERSION=1.20.2
ROOT=${MGPU_K8S_CACHE:-/var/cache/mgpu-k8s}
OUT=$ROOT/$K8S_VERSION
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FAKEGPU_SRC=$HERE/fakegpu/main.go
PACKAGES=(golang-go rsync jq dpkg-dev gcc libc6-dev etcd-server containerd runc
          containernetworking-plugins podman busybox-static iproute2 util-linux)
BINARIES=(kube-apiserver kube-scheduler kube-controller-manager kubelet)
IMAGE_PAUSE=mgpu.test/pause:1
IMAGE_BUSYBOX=mgpu.test/busybox:1

log() { printf 'k8s-build: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# What READY must say for the cache to be current: the inputs that are ours to change.
want_stamp() {
    printf 'kubernetes %s\nfakegpu %s\nimages %s %s %s\n' "$K8S_VERSION" \
        "$(sha256sum <"$FAKEGPU_SRC" | cut -c1-16)" "$IMAGE_PAUSE" "$IMAGE_BUSYBOX" \
        "$(dpkg-query -W -f='${Version}' busybox-static 2>/dev/null || echo none)"
}

ready() { [[ -f $OUT/READY && "$(cat "$OUT/READY")" == "$(want_stamp)" ]]; }

if [[ ${1:-} == --print ]]; then
    ready && { echo "$OUT"; exit 0; }
    exit 1
fi
ready && { log "cached in $OUT"; exit 0; }

[[ $(id -u) -eq 0 ]] || die "needs root (apt-get, and the cache in $ROOT); not built"
command -v apt-get >/dev/null || die "no apt-get here (Debian 12 needed); not built"

mkdir -p "$ROOT"
exec 9>"$ROOT/.build.lock"
flock 9  # a concurrent run builds; this one then finds the cache ready
ready && { log "cached in $OUT (built by a concurrent run)"; exit 0; }

logfile=$ROOT/build.log
: >"$logfile"
run() {
    if ! "$@" >>"$logfile" 2>&1; then
        log "failed: $*"
        tail -n 40 "$logfile" >&2
        exit 1
    fi
}
export DEBIAN_FRONTEND=noninteractive

missing=()
for pkg in "${PACKAGES[@]}"; do
    [[ $(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true) == ii* ]] \
        || missing+=("$pkg")
done
if ((${#missing[@]})); then
    log "installing: ${missing[*]}"
    run apt-get update -qq
    run apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# --- the source: Debian's `kubernetes` source package (deb-src may need enabling).
find_source() {
    find "$ROOT/src" -maxdepth 1 -type d -name "kubernetes-*$K8S_VERSION" 2>/dev/null | head -n1 || true
}
srcdir=$(find_source)
if [[ -z $srcdir ]]; then
    if ! apt-cache showsrc kubernetes 2>/dev/null | grep -q "^Version: .*$K8S_VERSION"; then
        log "enabling Debian's source archive (deb-src bookworm main)"
        cat >/etc/apt/sources.list.d/mgpu-deb-src.sources <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
        run apt-get update -qq
    fi
    log "fetching the kubernetes source package"
    mkdir -p "$ROOT/src"
    (cd "$ROOT/src" && run apt-get source -qq kubernetes)
    srcdir=$(find_source)
    [[ -n $srcdir ]] || die "apt-get source kubernetes gave no kubernetes-*$K8S_VERSION"
fi

# --- the binaries, as debian/rules builds kubectl (GOPATH with the tree linked in).
export GOPATH=$srcdir/.go GOCACHE=$ROOT/gocache HOME=$ROOT/home GOFLAGS=
mkdir -p "$GOPATH/src/k8s.io" "$HOME" "$OUT/bin" "$OUT/images"
ln -sfn ../../.. "$GOPATH/src/k8s.io/kubernetes"
need_make=0
for b in "${BINARIES[@]}"; do [[ -x $OUT/bin/$b ]] || need_make=1; done
if ((need_make)); then
    log "building ${BINARIES[*]} (about 6 minutes on 2 cores, once; log: $logfile)"
    start=$SECONDS
    (cd "$srcdir" && run make WHAT="${BINARIES[*]/#/cmd/}")
    for b in "${BINARIES[@]}"; do
        install -m 0755 "$srcdir/_output/bin/$b" "$OUT/bin/$b"
    done
    log "built in $((SECONDS - start)) s"
fi

log "building mgpu-fakegpu and pause"
mkdir -p "$srcdir/cmd/mgpu-fakegpu"
cp "$FAKEGPU_SRC" "$srcdir/cmd/mgpu-fakegpu/main.go"
# GOPATH mode with the tree's vendor/, as Kubernetes 1.20's own build (hack/lib/golang.sh).
(cd "$GOPATH/src/k8s.io/kubernetes" \
    && GO111MODULE=off CGO_ENABLED=0 run go build -o "$OUT/bin/mgpu-fakegpu" ./cmd/mgpu-fakegpu)
run gcc -Os -static -DVERSION=mgpu -o "$OUT/bin/pause" "$srcdir/build/pause/linux/pause.c"

# --- images, from tarred root filesystems, through a private podman store (no registry,
# nothing left in the machine's own /var/lib/containers).
work=$(mktemp -d /tmp/mgpu-k8s-images.XXXXXX)
trap 'rm -rf "$work"' EXIT
podman=(podman --root "$work/store" --runroot "$work/run" --storage-driver vfs)
image() {  # image NAME ROOTFS-DIR OUTPUT CHANGE...
    local name=$1 rootfs=$2 output=$3
    shift 3
    local changes=()
    for c in "$@"; do changes+=(--change "$c"); done
    run tar -C "$rootfs" -cf "$work/rootfs.tar" .
    run "${podman[@]}" import "${changes[@]}" "$work/rootfs.tar" "$name"
    rm -f "$output.tmp"
    run "${podman[@]}" save --format docker-archive -o "$output.tmp" "$name"
    mv "$output.tmp" "$output"
}
mkdir -p "$work/pause"
install -m 0755 "$OUT/bin/pause" "$work/pause/pause"
image "$IMAGE_PAUSE" "$work/pause" "$OUT/images/pause.tar" 'ENTRYPOINT ["/pause"]'

bb=$work/busybox
mkdir -p "$bb/bin" "$bb/etc" "$bb/tmp" "$bb/root"
chmod 1777 "$bb/tmp"
install -m 0755 "$(command -v busybox)" "$bb/bin/busybox"
for applet in $("$bb/bin/busybox" --list); do
    [[ -e $bb/bin/$applet ]] || ln -s busybox "$bb/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n' >"$bb/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$bb/etc/group"
image "$IMAGE_BUSYBOX" "$bb" "$OUT/images/busybox.tar" 'CMD ["/bin/sh"]' 'ENV PATH=/bin'
run "${podman[@]}" system reset --force  # vfs layers are plain directories: drop them now

want_stamp >"$OUT/READY"
log "ready in $OUT"

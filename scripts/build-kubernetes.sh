#!/usr/bin/env bash
# Build a real Kubernetes v1.20.2 (the control plane and a node's programs) from Debian
# bookworm's `kubernetes` source package and cache it, for tandem's Kubernetes tests (tests/k8s).
# Registry-only route: no Kubernetes binary is packaged anywhere reachable; see
# shared/research/k8s-feasibility.md and docs/kubernetes-test-bed.md.
#
#   scripts/build-kubernetes.sh [CACHE_ROOT]      (default /var/cache/tandem-k8s)
#
# Result, in CACHE_ROOT/<debian source version>/: kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kube-proxy (one `make`, so the packages they share compile once) and
# `pause`, the pod sandbox's program, compiled from the same tree's build/pause/linux/pause.c.
# The folder is printed on stdout's last line. A later run finds every program and exits at once.
# Needs root for apt-get (golang-go, rsync, make, gcc). Built with the tags `providerless` (no
# cloud provider's SDK) and `dockerless` (no dockershim), and without symbol tables (-s -w):
# nothing here needs them, and cold on 2 cores it took 3.6 min (6 CPU-min; 9.5 without);
# 2 GB of scratch disk (removed afterwards).
set -euo pipefail
SRC_VERSION="${KUBE_SRC_VERSION:-1.20.5+really1.20.2-1.1+deb12u1}"
CACHE_ROOT="${1:-${TANDEM_K8S_CACHE:-/var/cache/tandem-k8s}}"
KEY="kubernetes_${SRC_VERSION//[^A-Za-z0-9._-]/_}"
OUT="$CACHE_ROOT/$KEY"
PROGRAMS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)
log() { echo "build-kubernetes: $*" >&2; }

built() {
  local p
  for p in "${PROGRAMS[@]}"; do
    [[ -x "$OUT/$p" ]] && "$OUT/$p" --version >/dev/null 2>&1 || return 1
  done
  [[ -x "$OUT/pause" ]] && "$OUT/pause" -v >/dev/null 2>&1
}

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.build.lock"
flock 9   # one build at a time; a waiting run then finds the finished programs
if built; then
  log "cached: $OUT"; echo "$OUT"; exit 0
fi

export DEBIAN_FRONTEND=noninteractive
need=()
command -v go >/dev/null || need+=(golang-go)
command -v rsync >/dev/null || need+=(rsync)
command -v make >/dev/null || need+=(make)
command -v flock >/dev/null || need+=(util-linux)
{ command -v gcc >/dev/null && [[ -e /usr/lib/x86_64-linux-gnu/libc.a ]]; } || need+=(gcc libc6-dev)
if ((${#need[@]})); then
  log "installing ${need[*]}"
  apt-get update -q >&2 && apt-get install -y -q --no-install-recommends "${need[@]}" >&2
fi
# Debian's golang-go puts go under /usr/lib/go/bin with a /usr/bin/go link.
export PATH="$PATH:/usr/lib/go/bin"

WORK="$CACHE_ROOT/work-$KEY"
rm -rf "$WORK"; mkdir -p "$WORK/apt/lists/partial" "$WORK/src"
# A private apt configuration with deb-src lines, so the system's apt setup stays untouched.
cat >"$WORK/apt/sources.list" <<SRC
deb-src http://deb.debian.org/debian bookworm main
deb-src http://deb.debian.org/debian bookworm-updates main
deb-src http://deb.debian.org/debian-security bookworm-security main
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian-security bookworm-security main
SRC
APT=(-o "Dir::Etc::SourceList=$WORK/apt/sources.list" -o "Dir::Etc::SourceParts=$WORK/apt/none"
     -o "Dir::State::Lists=$WORK/apt/lists" -o "Dir::Cache::archives=$WORK/apt/archives"
     -o "APT::Sandbox::User=root")
mkdir -p "$WORK/apt/none" "$WORK/apt/archives/partial"
log "apt-get update (private deb-src lists)"
apt-get "${APT[@]}" update -q >&2
cd "$WORK/src"
log "apt-get source kubernetes=$SRC_VERSION"
apt-get "${APT[@]}" source --download-only "kubernetes=$SRC_VERSION" >&2
apt-get "${APT[@]}" download golang-github-modern-go-reflect2-dev >&2
orig=$(ls kubernetes_*.orig.tar.gz | head -1)
mkdir tree && tar -xzf "$orig" -C tree --strip-components=1
# The vendored reflect2 1.0.1 crashes under Go >= 1.18 on the first custom-resource request;
# take the .go/.s files of Debian's reflect2 1.0.2 instead.
dpkg-deb -x golang-github-modern-go-reflect2-dev_*.deb reflect2
r2new=$(find reflect2 -type d -path '*github.com/modern-go/reflect2' | head -1)
r2old=tree/vendor/github.com/modern-go/reflect2
[[ -n "$r2new" && -d "$r2old" ]] || { log "reflect2 sources not found"; exit 1; }
find "$r2old" -maxdepth 1 \( -name '*.go' -o -name '*.s' \) -delete
find "$r2new" -maxdepth 1 \( -name '*.go' -o -name '*.s' \) ! -name '*_test.go' -exec cp {} "$r2old/" \;

cd tree
what="${PROGRAMS[*]/#/cmd/}"
log "make WHAT='$what' (go $(go version | awk '{print $3}'); several minutes)"
export GOPROXY=off CGO_ENABLED=0 GOCACHE="$WORK/gocache"   # removed with WORK: only the programs are kept
make WHAT="$what" GOFLAGS="-tags=providerless,dockerless" GOLDFLAGS="-s -w" \
  KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20 \
  KUBE_GIT_TREE_STATE=clean KUBE_GIT_COMMIT=faecb196815e248d3ecfb03c680a4507229c2a56 >&2
# The sandbox every pod starts first, as upstream's build/pause/Makefile compiles it.
gcc -Os -Wall -Werror -static -DVERSION=v3.4.1-debian-source -o _output/bin/pause \
  build/pause/linux/pause.c >&2
mkdir -p "$OUT"
for p in "${PROGRAMS[@]}" pause; do
  cp "_output/bin/$p" "$OUT/$p.tmp" && mv "$OUT/$p.tmp" "$OUT/$p"
done
cd / && rm -rf "$WORK"
built || { log "a program does not run: $(ls "$OUT")"; exit 1; }
log "built: $("$OUT/kube-apiserver" --version), $(ls "$OUT" | tr '\n' ' ')"
echo "$OUT"

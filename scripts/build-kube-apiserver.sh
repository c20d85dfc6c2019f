#!/usr/bin/env bash
# Build a real kube-apiserver (v1.20.2) from Debian bookworm's `kubernetes` source package and
# cache it, for tandem's Kubernetes integration tests (tests/k8s). Registry-only route: no
# Kubernetes binary is packaged anywhere reachable; see shared/research/k8s-feasibility.md.
#
#   scripts/build-kube-apiserver.sh [CACHE_ROOT]      (default /var/cache/tandem-k8s)
#
# Result: CACHE_ROOT/<debian source version>/kube-apiserver, printed on stdout's last line.
# A later run finds it and exits at once. Needs root for apt-get (golang-go, rsync, make).
# Cold: about 5.5 min on 2 cores, 1.3 GB RSS, 2 GB of scratch disk (removed afterwards).
set -euo pipefail
SRC_VERSION="${KUBE_SRC_VERSION:-1.20.5+really1.20.2-1.1+deb12u1}"
CACHE_ROOT="${1:-${TANDEM_K8S_CACHE:-/var/cache/tandem-k8s}}"
KEY="kubernetes_${SRC_VERSION//[^A-Za-z0-9._-]/_}"
OUT="$CACHE_ROOT/$KEY"
BIN="$OUT/kube-apiserver"
log() { echo "build-kube-apiserver: $*" >&2; }

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.build.lock"
flock 9   # one build at a time; a waiting run then finds the finished binary
if [[ -x "$BIN" ]] && "$BIN" --version >/dev/null 2>&1; then
  log "cached: $BIN"; echo "$BIN"; exit 0
fi

export DEBIAN_FRONTEND=noninteractive
need=()
command -v go >/dev/null || need+=(golang-go)
command -v rsync >/dev/null || need+=(rsync)
command -v make >/dev/null || need+=(make)
command -v flock >/dev/null || need+=(util-linux)
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
log "make WHAT=cmd/kube-apiserver (go $(go version | awk '{print $3}'); several minutes)"
export GOPROXY=off CGO_ENABLED=0 GOFLAGS= GOCACHE="$WORK/gocache"   # removed with WORK: only the binary is kept
make WHAT=cmd/kube-apiserver KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20 \
  KUBE_GIT_TREE_STATE=clean KUBE_GIT_COMMIT=faecb196815e248d3ecfb03c680a4507229c2a56 >&2
mkdir -p "$OUT"
cp _output/bin/kube-apiserver "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
cd / && rm -rf "$WORK"
log "built: $("$BIN" --version)"
echo "$BIN"

#!/usr/bin/env bash
# Build Kubernetes 1.20.2 components from Debian bookworm's `kubernetes` source package (which
# ships its Go dependencies in vendor/) and cache the binaries outside the clone. Debian
# packages none of them, so this is how the end-to-end tiers get real ones.
#
#   build-kube-components.sh COMPONENT...   (kube-apiserver kubelet kube-scheduler
#                                            kube-controller-manager)
#   FRACGPU_CACHE   cache directory (default: $HOME/.cache/fracgpu)
#   FRACGPU_JOBS    parallel compile jobs (default: number of CPUs)
#
# Reuses a cached binary when it is present, answers --version and was built by the current
# recipe; only the missing ones are compiled (in one `make`, sharing one Go build cache).
# Prints each binary's path on its own line in argument order, so callers can do:
#   APISERVER=$(scripts/build-kube-components.sh kube-apiserver | tail -n1)
# scripts/build-kube-apiserver.sh and scripts/build-kube-node.sh are the two callers.
set -euo pipefail

ALLOWED=(kube-apiserver kubelet kube-scheduler kube-controller-manager)
NAME=${FRACGPU_BUILD_LOG_NAME:-build-kube-components}
log() { echo "$NAME: $*" >&2; }
if [[ $# -eq 0 ]]; then
  log "no component named (allowed: ${ALLOWED[*]})"
  exit 2
fi
for comp in "$@"; do
  if [[ " ${ALLOWED[*]} " != *" $comp "* ]]; then
    log "unknown component '$comp' (allowed: ${ALLOWED[*]})"
    exit 2
  fi
done
COMPONENTS=("$@")

VERSION=1.20.2
# Bump when the build recipe changes what the binary contains; older caches are rebuilt.
RECIPE=2-reflect2-1.0.2
CACHE=${FRACGPU_CACHE:-$HOME/.cache/fracgpu}
# Vendored modern-go/reflect2 1.0.1 iterates maps through runtime internals that changed in
# Go 1.18; built with Go 1.19 the apiserver crashes (SIGSEGV in mapiterinit) when it
# serialises a map. Debian's reflect2 1.0.2 has the fix and the same API.
REFLECT2_SRC=/usr/share/gocode/src/github.com/modern-go/reflect2
WORK="$CACHE/kube-apiserver-build"
JOBS=${FRACGPU_JOBS:-$(nproc)}

bin_of() { echo "$CACHE/$1-$VERSION"; }

cached_binary_works() {
  local bin
  bin=$(bin_of "$1")
  [[ -x "$bin" ]] && "$bin" --version 2>/dev/null | grep -q "v$VERSION"
}

cached_binary_current() {
  cached_binary_works "$1" && [[ "$(cat "$(bin_of "$1").recipe" 2>/dev/null)" == "$RECIPE" ]]
}

print_paths() {
  local comp
  for comp in "${COMPONENTS[@]}"; do bin_of "$comp"; done
}

mkdir -p "$CACHE"
# One build at a time per cache directory (all components share one source tree and its Go
# build cache); a second caller waits and then reuses the result. The lock keeps the name it
# had when only kube-apiserver was built here, so older and newer checkouts exclude each other.
exec 9>"$CACHE/.kube-apiserver.lock"
if ! flock -n 9; then
  log "another build holds $CACHE/.kube-apiserver.lock; waiting for it"
  flock 9
fi

TODO=()
for comp in "${COMPONENTS[@]}"; do
  if cached_binary_current "$comp"; then
    log "using cached $comp $("$(bin_of "$comp")" --version)"
  else
    TODO+=("$comp")
  fi
done
if [[ ${#TODO[@]} -eq 0 ]]; then
  print_paths
  exit 0
fi
log "to build: ${TODO[*]} (a cold build takes ~10 min per 2 cores; progress follows)"

SUDO=()
if [[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null 2>&1; then SUDO=(sudo); fi

for tool in go rsync jq dpkg-source make gcc; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    log "missing '$tool'; run scripts/install-system-deps.sh first (as root)"
    exit 1
  fi
done
if [[ ! -f "$REFLECT2_SRC/go_above_118.go" ]]; then
  log "missing $REFLECT2_SRC (reflect2 >= 1.0.2); run scripts/install-system-deps.sh first"
  exit 1
fi

# --- source package -------------------------------------------------------------------
# Add a deb-src entry for bookworm that reuses the mirror the machine already uses for
# binary packages (deb822 .sources files or the classic sources.list format).
have_bookworm_deb_src() {
  grep -rhsE '^(deb-src[[:space:]].*[[:space:]]bookworm[[:space:]]|Types:.*deb-src)' \
    /etc/apt/sources.list /etc/apt/sources.list.d/ >/dev/null 2>&1
}

debian_mirror() {
  local uri
  # deb822: the URIs line of the stanza whose Suites include plain "bookworm".
  uri=$(awk '
    /^[[:space:]]*$/ { if (suite && uris != "") { print uris; exit } suite = 0; uris = "" }
    /^URIs:/ { uris = $2 }
    /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == "bookworm") suite = 1 }
    END { if (suite && uris != "") print uris }
  ' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
  if [[ -z "$uri" && -f /etc/apt/sources.list ]]; then
    uri=$(awk '$1 == "deb" && $0 ~ / bookworm / { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' \
      /etc/apt/sources.list | head -n1)
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

if ! have_bookworm_deb_src; then
  mirror=$(debian_mirror)
  log "adding deb-src for bookworm from $mirror"
  printf 'Types: deb-src\nURIs: %s\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$mirror" | "${SUDO[@]}" tee /etc/apt/sources.list.d/fracgpu-deb-src.sources >/dev/null
  "${SUDO[@]}" apt-get update -q >&2
elif ! apt-cache showsrc kubernetes >/dev/null 2>&1; then
  "${SUDO[@]}" apt-get update -q >&2
fi

mkdir -p "$WORK"
cd "$WORK"
SRC=$(find "$WORK" -maxdepth 1 -type d -name "kubernetes-*$VERSION" | head -n1)
if [[ -z "$SRC" || ! -f "$SRC/Makefile" ]]; then
  log "fetching Debian source package kubernetes into $WORK"
  rm -rf "$WORK"/kubernetes-*
  apt-get source -q kubernetes >&2
  SRC=$(find "$WORK" -maxdepth 1 -type d -name "kubernetes-*$VERSION" | head -n1)
fi
if [[ -z "$SRC" || ! -d "$SRC/vendor" ]]; then
  log "no kubernetes-*$VERSION source tree with vendor/ under $WORK"
  exit 1
fi
log "source tree: $SRC"
rsync -a --delete --exclude '*_test.go' "$REFLECT2_SRC/" "$SRC/vendor/github.com/modern-go/reflect2/"
log "vendored reflect2 replaced with $(dpkg-query -W -f='${Version}' golang-github-modern-go-reflect2-dev)"

# --- build ----------------------------------------------------------------------------
# Kubernetes 1.20 builds in GOPATH mode from vendor/: lay the tree out as k8s.io/kubernetes
# (what the fallback `go build` needs; the make wrapper makes its own under _output/).
mkdir -p "$WORK/.go/src/k8s.io"
ln -sfn "$SRC" "$WORK/.go/src/k8s.io/kubernetes"

export GOPATH="$WORK/.go"
export GO111MODULE=off
export GOFLAGS=""
export GOMAXPROCS="$JOBS"
export GOTOOLCHAIN=local
export CGO_ENABLED=0
# No git metadata in a source package: stamp the version explicitly.
export KUBE_GIT_VERSION="v$VERSION"
export KUBE_GIT_TREE_STATE=clean
export KUBE_GIT_MAJOR=1
export KUBE_GIT_MINOR=20

start=$(date +%s)
cd "$WORK/.go/src/k8s.io/kubernetes"
# A cold build prints nothing for minutes at a time: say every minute that it is still going.
(
  while sleep 60; do log "still building ${TODO[*]} ($(( $(date +%s) - start ))s so far)"; done
) &
ticker=$!
trap 'kill "$ticker" 2>/dev/null || true' EXIT
what=""
for comp in "${TODO[@]}"; do what+="${what:+ }cmd/$comp"; done
declare -A built=()
# hack/lib/golang.sh sets its own GOPATH/GOCACHE under _output and parses GOFLAGS for build
# tags, so parallelism is bounded through GOMAXPROCS (go build's default -p) only.
if make WHAT="$what" KUBE_BUILD_PLATFORMS=linux/amd64 >&2; then
  for comp in "${TODO[@]}"; do
    found=$(find _output -type f -name "$comp" -perm -u+x | head -n1)
    if [[ -n "$found" ]]; then built[$comp]=$found; fi
  done
fi
for comp in "${TODO[@]}"; do
  if [[ -n "${built[$comp]:-}" ]]; then continue; fi
  log "make WHAT=cmd/$comp gave no binary; falling back to go build from vendor/"
  mkdir -p "$WORK/out"
  # In GOPATH mode the vendored package's import path carries the vendor/ prefix.
  vpkg=k8s.io/kubernetes/vendor/k8s.io/component-base/version
  ldflags="-s -w -X $vpkg.gitVersion=v$VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=20"
  ldflags+=" -X $vpkg.gitTreeState=clean"
  go build -p "$JOBS" -ldflags "$ldflags" -o "$WORK/out/$comp" "./cmd/$comp" >&2
  built[$comp]="$WORK/out/$comp"
done
kill "$ticker" 2>/dev/null || true
log "built ${TODO[*]} in $(( $(date +%s) - start ))s"

for comp in "${TODO[@]}"; do
  bin=$(bin_of "$comp")
  install -m 0755 "${built[$comp]}" "$bin.tmp"
  mv -f "$bin.tmp" "$bin"
  echo "$RECIPE" >"$bin.recipe"
  if ! cached_binary_works "$comp"; then
    log "$bin does not report v$VERSION: $("$bin" --version 2>&1 || true)"
    exit 1
  fi
  log "cached $comp $("$bin" --version) at $bin"
done
print_paths

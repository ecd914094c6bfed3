#!/usr/bin/env bash
# images.sh: build the images the cluster tests run, as docker-archive tarballs (no registry, no
# daemon), into $AIRLOCK_K8S_CACHE/images, and print their paths:
#   airlock.tar  airlock.local/airlock:dev   /airlock-agent + /airlock-operator, this checkout's code
#   sandbox.tar  airlock.local/sandbox:test  hack/mkrootfs.sh's minimal root (sh, coreutils, python3)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"
OUT="$CACHE/images"
mkdir -p "$OUT/bin"
cd "$REPO"
log "building airlock-agent and airlock-operator (static)"
CGO_ENABLED=0 go build -trimpath -o "$OUT/bin/airlock-agent" ./cmd/airlock-agent
CGO_ENABLED=0 go build -trimpath -o "$OUT/bin/airlock-operator" ./cmd/airlock-operator
go run ./hack/testcluster/imgpack -out "$OUT/airlock.tar" -tag airlock.local/airlock:dev \
  -entrypoint /airlock-operator \
  -file "/airlock-agent=$OUT/bin/airlock-agent" -file "/airlock-operator=$OUT/bin/airlock-operator"
log "building the sandbox test image"
hack/mkrootfs.sh --docker-archive "$OUT/sandbox.tar" --tag airlock.local/sandbox:test "$OUT/sandbox-rootfs" >&2
echo "$OUT/airlock.tar"
echo "$OUT/sandbox.tar"

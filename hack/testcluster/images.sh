#!/usr/bin/env bash
# images.sh: build the images the cluster tests run, as docker-archive tarballs (no registry, no
# daemon), into $AIRLOCK_K8S_CACHE/images, and print their paths:
#   airlock.tar  airlock.local/airlock:dev   /airlock-agent + /airlock-operator, this checkout's code
#   sandbox.tar  airlock.local/sandbox:test  hack/mkrootfs.sh's minimal root (sh, coreutils, python3)
#   incluster.tar airlock.local/incluster:test  backend/kubernetes' cluster test binary, run in a pod
#                 by TestInClusterDiscovery (discovery from a pod's own ServiceAccount)
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
hack/mkrootfs.sh "$OUT/sandbox-rootfs" >&2
# The conformance suite also needs echo, pwd, test, true and false as programs (argv exec, not
# shell builtins); they are coreutils, linked only against the libc the root already holds.
rm -rf "$OUT/sandbox-rootfs-k8s"
cp -a "$OUT/sandbox-rootfs" "$OUT/sandbox-rootfs-k8s"
for b in echo pwd test true false sleep cat env printf; do
  [[ -e "$OUT/sandbox-rootfs-k8s/usr/bin/$b" ]] || cp -p "/usr/bin/$b" "$OUT/sandbox-rootfs-k8s/usr/bin/$b"
done
go run ./image/cmd/mkimage -rootfs "$OUT/sandbox-rootfs-k8s" -docker-archive "$OUT/sandbox.tar" \
  -tag airlock.local/sandbox:test >&2
log "building the in-cluster test image"
CGO_ENABLED=0 go test -c -trimpath -tags cluster -o "$OUT/bin/kubernetes.test" ./backend/kubernetes
go run ./hack/testcluster/imgpack -out "$OUT/incluster.tar" -tag airlock.local/incluster:test \
  -entrypoint /kubernetes.test -file "/kubernetes.test=$OUT/bin/kubernetes.test"
echo "$OUT/airlock.tar"
echo "$OUT/sandbox.tar"
echo "$OUT/incluster.tar"

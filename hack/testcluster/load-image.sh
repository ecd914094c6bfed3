#!/usr/bin/env bash
# load-image.sh: import docker-archive (or OCI) tarballs into the test cluster's containerd, in the
# namespace the kubelet uses, so pods can run them with imagePullPolicy IfNotPresent/Never.
#   hack/testcluster/load-image.sh IMAGE.tar...
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"
(($#)) || { echo "usage: $0 IMAGE.tar..." >&2; exit 2; }
pid_alive containerd || die "the test cluster's containerd is not running (hack/testcluster/up.sh)"
for f in "$@"; do
  [[ -f "$f" ]] || die "$f: no such file"
  ctr --address "$CTR_SOCK" -n k8s.io images import "$f"
done

#!/usr/bin/env bash
# ci.sh: the Kubernetes suites end to end on a real single-node cluster built on this machine:
# build (cached) → up → images (this checkout) → load → deploy → go test -tags cluster → down.
# Then, on a full run (no go test flags), the scale test on a second, KWOK cluster (kwok.sh).
# The clusters are stopped whatever happens (set AIRLOCK_K8S_KEEP=1 to leave it running).
#   hack/testcluster/ci.sh [go test flags...]     e.g. -run TestConformance -v
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"

cleanup() {
  local rc=$?
  if ((rc != 0)) && [[ -d "$LOGS" ]]; then
    log "failed (rc=$rc); last lines of the component logs:"
    for f in "$LOGS"/*.log; do echo "== $f"; tail -n 15 "$f"; done >&2
    "$BIN/kubectl" --kubeconfig "$KUBECONFIG_OUT" -n airlock-system logs statefulset/airlock-operator --tail=40 >&2 2>/dev/null || true
  fi
  if [[ "${AIRLOCK_K8S_KEEP:-0}" != 1 ]]; then "$HERE/down.sh"; "$HERE/kwok.sh" down; fi
  exit "$rc"
}
trap cleanup EXIT

"$HERE/build.sh"
"$HERE/up.sh" >/dev/null
mapfile -t images < <("$HERE/images.sh")
"$HERE/load-image.sh" "${images[@]}" >&2
"$HERE/deploy.sh"
cd "$REPO"
AIRLOCK_K8S_KUBECONFIG="$KUBECONFIG_OUT" AIRLOCK_K8S_KUBECTL="$BIN/kubectl" AIRLOCK_K8S_BROKER_CA="$STATE/broker-tls/ca.crt" \
  go test -tags cluster -count=1 -timeout 30m "$@" ./backend/kubernetes/... ./operator/...
if (($# == 0)); then
  # The scale test on KWOK (fake nodes, a pool of 1,000): the real cluster goes first, so the
  # figures are the KWOK cluster's and this process's alone.
  if [[ "${AIRLOCK_K8S_KEEP:-0}" != 1 ]]; then "$HERE/down.sh"; fi
  kwok_kc="$("$HERE/kwok.sh" up)"
  AIRLOCK_KWOK_KUBECONFIG="$kwok_kc" AIRLOCK_K8S_KUBECTL="$BIN/kubectl" \
    go test -tags kwok -count=1 -timeout 15m -run TestScaleKWOK -v ./operator/scale/
fi

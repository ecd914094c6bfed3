#!/usr/bin/env bash
# deploy.sh: install deploy/base (CRD, RBAC, operator) into the running test cluster, create the
# master Secret if absent, and wait for the operator to be ready. Images must be loaded first.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"
kc() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_OUT" "$@"; }
kc apply -k "$REPO/deploy/base" >&2
kc wait --for condition=established --timeout=60s crd/sandboxes.airlock.dev >&2
if ! kc -n airlock-system get secret airlock-master >/dev/null 2>&1; then
  kc -n airlock-system create secret generic airlock-master --from-literal=master="$(openssl rand -hex 32)" >&2
fi
# No kube-proxy runs here, so the kubernetes Service IP does not route: point the operator's
# in-cluster config at the API server's node address (its certificate names it).
kc -n airlock-system set env deployment/airlock-operator \
  KUBERNETES_SERVICE_HOST="$(cat "$STATE/node-ip")" KUBERNETES_SERVICE_PORT=6443 >&2
# A re-deploy of the same tag must run the freshly loaded image.
kc -n airlock-system rollout restart deployment/airlock-operator >&2
kc -n airlock-system rollout status deployment/airlock-operator --timeout=120s >&2

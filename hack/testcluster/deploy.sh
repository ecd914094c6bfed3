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
# The broker's TLS certificate, from a CA made for this cluster: the tests trust $TLS/ca.crt and
# verify the name airlock-broker.airlock-system.svc while dialling the broker pod's IP.
TLS="$STATE/broker-tls"
if ! kc -n airlock-system get secret airlock-broker-tls >/dev/null 2>&1; then
  mkdir -p "$TLS"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 7 -subj /CN=airlock-test-broker-ca \
    -keyout "$TLS/ca.key" -out "$TLS/ca.crt" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=airlock-broker.airlock-system.svc \
    -keyout "$TLS/tls.key" -out "$TLS/tls.csr" 2>/dev/null
  printf 'subjectAltName=DNS:airlock-broker.airlock-system.svc,DNS:airlock-broker.airlock-system.svc.cluster.local\nextendedKeyUsage=serverAuth\n' >"$TLS/ext"
  openssl x509 -req -in "$TLS/tls.csr" -CA "$TLS/ca.crt" -CAkey "$TLS/ca.key" -CAcreateserial -days 7 \
    -extfile "$TLS/ext" -out "$TLS/tls.crt" 2>/dev/null
  kc -n airlock-system create secret tls airlock-broker-tls --cert "$TLS/tls.crt" --key "$TLS/tls.key" >&2
fi
# No kube-proxy runs here, so the kubernetes Service IP does not route: point the operator's
# in-cluster config at the API server's node address (its certificate names it).
kc -n airlock-system set env deployment/airlock-operator \
  KUBERNETES_SERVICE_HOST="$(cat "$STATE/node-ip")" KUBERNETES_SERVICE_PORT=6443 >&2
# A re-deploy of the same tag must run the freshly loaded image.
kc -n airlock-system rollout restart deployment/airlock-operator >&2
kc -n airlock-system rollout status deployment/airlock-operator --timeout=120s >&2

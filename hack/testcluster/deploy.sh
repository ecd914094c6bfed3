#!/usr/bin/env bash
# deploy.sh: install airlock into the running test cluster with its Helm chart (deploy/helm/airlock:
# CRD, RBAC, operator StatefulSet with 2 broker replicas, the master Secret made by the chart), after
# making the broker's TLS Secret, and wait for the operator to be ready. Images must be loaded first.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"
kc() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_OUT" "$@"; }
NS=airlock-system
kc get namespace "$NS" >/dev/null 2>&1 || kc create namespace "$NS" >&2
# The broker's TLS certificate, from a CA made for this cluster: the tests trust $TLS/ca.crt and
# verify the name airlock-broker.airlock-system.svc while dialling a broker pod's IP.
TLS="$STATE/broker-tls"
if ! kc -n "$NS" get secret airlock-broker-tls >/dev/null 2>&1; then
  mkdir -p "$TLS"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 7 -subj /CN=airlock-test-broker-ca \
    -keyout "$TLS/ca.key" -out "$TLS/ca.crt" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=airlock-broker.airlock-system.svc \
    -keyout "$TLS/tls.key" -out "$TLS/tls.csr" 2>/dev/null
  printf 'subjectAltName=DNS:airlock-broker.airlock-system.svc,DNS:airlock-broker.airlock-system.svc.cluster.local\nextendedKeyUsage=serverAuth\n' >"$TLS/ext"
  openssl x509 -req -in "$TLS/tls.csr" -CA "$TLS/ca.crt" -CAkey "$TLS/ca.key" -CAcreateserial -days 7 \
    -extfile "$TLS/ext" -out "$TLS/tls.crt" 2>/dev/null
  kc -n "$NS" create secret tls airlock-broker-tls --cert "$TLS/tls.crt" --key "$TLS/tls.key" >&2
fi
# The egress tests' fake internet (a TEST-NET range in a network namespace they make on the node)
# counts as public for public-only sandboxes; the node's own address stays non-public.
FAKE_INTERNET=203.0.113.0/24
# ...and the allowDomains tests' fake DNS server there is what the pods' egress proxy asks.
FAKE_DNS=203.0.113.90:53
# No kube-proxy runs here, so the kubernetes Service IP does not route: point the operator's
# in-cluster config at the API server's node address (its certificate names it).
"$BIN/helm" --kubeconfig "$KUBECONFIG_OUT" upgrade --install airlock "$REPO/deploy/helm/airlock" \
  --namespace "$NS" --set masterSecret.create=true --set sandboxImagePullPolicy=IfNotPresent \
  --set-json "egressPublic=[\"$FAKE_INTERNET\"]" --set-json "egressDNS=[\"$FAKE_DNS\"]" \
  --set-json "extraEnv=[{\"name\":\"KUBERNETES_SERVICE_HOST\",\"value\":\"$(cat "$STATE/node-ip")\"},{\"name\":\"KUBERNETES_SERVICE_PORT\",\"value\":\"6443\"}]" \
  --wait --timeout 3m >&2
kc wait --for condition=established --timeout=60s crd/sandboxes.airlock.dev >&2
# A re-deploy of the same tag must run the freshly loaded image.
kc -n "$NS" rollout restart statefulset/airlock-operator >&2
kc -n "$NS" rollout status statefulset/airlock-operator --timeout=180s >&2

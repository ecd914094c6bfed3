#!/usr/bin/env bash
# kwok.sh up|down: a second, node-less cluster for the scale test (operator/scale_kwok_test.go):
# etcd, kube-apiserver on 127.0.0.1:6446, kube-scheduler and KWOK, which plays 10 fake nodes and
# makes every pod bound to them Running and Ready with a fake IP. No kubelet, no containers, no
# host networking: pools of 1,000 pods cost the API server and etcd only. State in
# /var/lib/airlock-kwok (removed by down); binaries from build.sh plus kwok (built here, cached).
# `up` prints the admin kubeconfig path.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
export AIRLOCK_K8S_STATE="${AIRLOCK_KWOK_STATE:-/var/lib/airlock-kwok}"
# shellcheck source=lib.sh
source "$HERE/lib.sh"
KWOK_VERSION="${KWOK_VERSION:-v0.7.0}"
API="127.0.0.1:6446"
ETCD_C="127.0.0.1:23792"
ETCD_P="127.0.0.1:23802"
NODES=10
kc() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_OUT" "$@"; }

stop_all() {
  local n pid i
  for n in kwok kube-scheduler kube-apiserver etcd; do
    pid_alive "$n" || continue
    pid="$(cat "$PIDS/$n")"
    kill -TERM "$pid" 2>/dev/null
    for ((i = 0; i < 60; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  case "$STATE" in /var/lib/airlock-kwok*) rm -rf "$STATE" ;; *) [[ -d "$STATE" ]] && log "left $STATE (not ours to remove)" ;; esac
}

if [[ "${1:-}" == down ]]; then
  [[ -d "$STATE" ]] && stop_all
  exit 0
fi
[[ "${1:-}" == up ]] || die "usage: kwok.sh up|down"

"$HERE/build.sh"
want="$KWOK_VERSION $(go env GOVERSION)"
if [[ ! -x "$BIN/kwok" || "$(cat "$BIN/.kwok-stamp" 2>/dev/null)" != "$want" ]]; then
  log "go install kwok $KWOK_VERSION — a clean build takes ~10 min"
  mkdir -p "$CACHE/gobin"
  (cd "$CACHE" && CGO_ENABLED=0 GOFLAGS= GOBIN="$CACHE/gobin" go install -trimpath "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION")
  mv "$CACHE/gobin/kwok" "$BIN/kwok"
  echo "$want" >"$BIN/.kwok-stamp"
fi

[[ -d "$STATE" ]] && stop_all
mkdir -p "$PIDS" "$LOGS" "$PKI"
start() {
  local name="$1"; shift
  setsid "$@" >"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! >"$PIDS/$name"
}
wait_for() {
  local what="$1" secs="$2" i; shift 2
  for ((i = 0; i < secs * 4; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
  die "$what not ready after ${secs}s (logs in $LOGS)"
}
ossl() { openssl "$@" 2>>"$LOGS/openssl.log"; }
ossl ecparam -name prime256v1 -genkey -noout -out "$PKI/ca.key"
ossl req -x509 -new -key "$PKI/ca.key" -subj "/CN=airlock-kwok-ca" -days 7 -out "$PKI/ca.crt"
cert() {
  local n="$1" subj="$2" ext="$3"
  ossl ecparam -name prime256v1 -genkey -noout -out "$PKI/$n.key"
  ossl req -new -key "$PKI/$n.key" -subj "$subj" -out "$PKI/$n.csr"
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n%s\n' "$ext" >"$PKI/$n.ext"
  ossl x509 -req -in "$PKI/$n.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial -days 7 -extfile "$PKI/$n.ext" -out "$PKI/$n.crt"
}
cert apiserver "/CN=kube-apiserver" $'extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost'
cert admin "/O=system:masters/CN=airlock-admin" "extendedKeyUsage=clientAuth"
ossl ecparam -name prime256v1 -genkey -noout -out "$PKI/sa.key"
ossl ec -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"
# Certificates inline, not as files: client-go watches client certificate files with a goroutine
# that never stops, which the scale test's leak check would count.
b64() { base64 -w0 "$1"; }
cat >"$KUBECONFIG_OUT" <<KC
apiVersion: v1
kind: Config
clusters:
- name: kwok
  cluster: {server: "https://$API", certificate-authority-data: $(b64 "$PKI/ca.crt")}
users:
- name: admin
  user: {client-certificate-data: $(b64 "$PKI/admin.crt"), client-key-data: $(b64 "$PKI/admin.key")}
contexts:
- name: kwok
  context: {cluster: kwok, user: admin}
current-context: kwok
KC

start etcd etcd --name kwok --data-dir "$STATE/etcd" \
  --listen-client-urls "http://$ETCD_C" --advertise-client-urls "http://$ETCD_C" \
  --listen-peer-urls "http://$ETCD_P" --initial-advertise-peer-urls "http://$ETCD_P" \
  --initial-cluster "kwok=http://$ETCD_P" --log-level warn --unsafe-no-fsync
wait_for etcd 30 curl -fsS "http://$ETCD_C/health"
start kube-apiserver "$BIN/kube-apiserver" --etcd-servers "http://$ETCD_C" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "${API##*:}" \
  --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" --client-ca-file "$PKI/ca.crt" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
  --service-cluster-ip-range 10.0.0.0/24 --authorization-mode Node,RBAC \
  --enable-priority-and-fairness=false --profiling=false \
  --disable-admission-plugins TaintNodesByCondition
wait_for kube-apiserver 60 kc get --raw /readyz
start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$KUBECONFIG_OUT" \
  --authentication-kubeconfig "$KUBECONFIG_OUT" --authorization-kubeconfig "$KUBECONFIG_OUT" \
  --leader-elect=false --bind-address 127.0.0.1 --secure-port 10269 \
  --kube-api-qps 500 --kube-api-burst 1000
# No controller-manager runs here, so nothing would lift a new node's not-ready taint: the
# apiserver is told not to add it (TaintNodesByCondition off above).
# KWOK's default stages (node-fast, pod-fast): nodes Ready, pods Running and Ready at once.
start kwok "$BIN/kwok" --kubeconfig "$KUBECONFIG_OUT" --manage-all-nodes=true \
  --cidr 10.250.0.0/16 --node-ip 10.250.255.254 --server-address 127.0.0.1:10270
for ((n = 0; n < NODES; n++)); do
  cat <<NODE
---
apiVersion: v1
kind: Node
metadata:
  name: kwok-$n
  annotations: {kwok.x-k8s.io/node: fake}
  labels: {type: kwok, kubernetes.io/hostname: kwok-$n}
status:
  allocatable: {cpu: "64", memory: 512Gi, pods: "200"}
  capacity: {cpu: "64", memory: 512Gi, pods: "200"}
NODE
done | kc apply -f - >/dev/null
ready_nodes() { [[ "$(kc get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True)" == "$NODES" ]]; }
wait_for "$NODES KWOK nodes Ready" 60 ready_nodes
log "kwok cluster up: KUBECONFIG=$KUBECONFIG_OUT"
echo "$KUBECONFIG_OUT"

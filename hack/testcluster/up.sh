#!/usr/bin/env bash
# up.sh: start a real single-node Kubernetes (etcd, kube-apiserver, containerd+runc, kubelet,
# kube-scheduler, kube-controller-manager) from the binaries build.sh cached, and wait for the node
# to be Ready. Idempotent: a healthy running cluster is left alone; a half-started one is stopped
# (down.sh) and started again. Prints the admin kubeconfig path on stdout.
#
# Host changes, all undone by down.sh: processes recorded in $STATE/pids, mounts below $STATE,
# the CNI bridge "airlock0" (pods 10.244.0.0/24; the bridge plugin also turns on ip_forward), and the
# cgroup "airlock-k8s" below each cgroup v1 hierarchy, bridge-nf-call-iptables set to 1, and
# kube-router's iptables chains and ipsets (its own --cleanup-config removes them).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"

export KUBECONFIG="$KUBECONFIG_OUT"
kc() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_OUT" "$@"; }

healthy() {
  for p in etcd kube-apiserver containerd kubelet kube-scheduler kube-controller-manager kube-router; do
    pid_alive "$p" || return 1
  done
  kc get --raw /readyz >/dev/null 2>&1 || return 1
  [[ "$(kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}

if healthy; then
  log "cluster already running"
  echo "$KUBECONFIG_OUT"
  exit 0
fi
if [[ -d "$STATE" ]]; then
  log "stale or partial cluster state in $STATE: stopping it first"
  "$HERE/down.sh"
fi

"$HERE/build.sh"
for b in kube-apiserver kubelet kube-scheduler kube-controller-manager kubectl; do
  [[ -x "$BIN/$b" ]] || die "$BIN/$b missing: build.sh failed"
done

NODE_IP="$(node_ip)"
[[ -n "$NODE_IP" ]] || die "cannot read the node IP"
log "node $NODE_NAME at $NODE_IP, state in $STATE"
mkdir -p "$PIDS" "$LOGS" "$PKI" "$STATE/etc"
echo "$NODE_IP" >"$STATE/node-ip"

# start NAME CMD...: run CMD in its own session (so the caller's shell ending does not take it
# down), logging to $LOGS/NAME.log, and record its pid.
start() {
  local name="$1"; shift
  setsid "$@" >"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! >"$PIDS/$name"
}

# wait_for WHAT SECONDS CMD...: poll CMD until it succeeds.
wait_for() {
  local what="$1" secs="$2"; shift 2
  local i
  for ((i = 0; i < secs * 4; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.25
  done
  die "$what not ready after ${secs}s (logs in $LOGS)"
}

# ---------------------------------------------------------------- PKI (openssl, EC P-256)
ossl() { openssl "$@" 2>>"$LOGS/openssl.log"; }
ossl ecparam -name prime256v1 -genkey -noout -out "$PKI/ca.key"
ossl req -x509 -new -key "$PKI/ca.key" -subj "/CN=airlock-test-ca" -days 30 -out "$PKI/ca.crt"
# cert NAME SUBJECT [SAN] [EKU]
cert() {
  local n="$1" subj="$2" san="${3:-}" eku="${4:-clientAuth}"
  ossl ecparam -name prime256v1 -genkey -noout -out "$PKI/$n.key"
  ossl req -new -key "$PKI/$n.key" -subj "$subj" -out "$PKI/$n.csr"
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    [[ -n "$san" ]] && echo "subjectAltName=$san"
  } >"$PKI/$n.ext"
  ossl x509 -req -in "$PKI/$n.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 30 -extfile "$PKI/$n.ext" -out "$PKI/$n.crt"
}
cert apiserver "/CN=kube-apiserver" \
  "IP:127.0.0.1,IP:10.0.0.1,IP:$NODE_IP,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" serverAuth
cert kubelet-serving "/CN=$NODE_NAME" "IP:$NODE_IP,DNS:$NODE_NAME" serverAuth
cert admin "/O=system:masters/CN=airlock-admin"
cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
cert scheduler "/CN=system:kube-scheduler"
cert controller-manager "/CN=system:kube-controller-manager"
ossl ecparam -name prime256v1 -genkey -noout -out "$PKI/sa.key"
ossl ec -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"

# kubeconfig FILE NAME: a kubeconfig for the client cert NAME.
kubeconfig() {
  cat >"$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: airlock
  cluster:
    server: https://$NODE_IP:6443
    certificate-authority: $PKI/ca.crt
users:
- name: $2
  user:
    client-certificate: $PKI/$2.crt
    client-key: $PKI/$2.key
contexts:
- name: airlock
  context: {cluster: airlock, user: $2}
current-context: airlock
KC
}
kubeconfig "$STATE/etc/kubelet.kubeconfig" kubelet
kubeconfig "$STATE/etc/scheduler.kubeconfig" scheduler
kubeconfig "$STATE/etc/controller-manager.kubeconfig" controller-manager
kubeconfig "$KUBECONFIG_OUT.tmp" admin

# ---------------------------------------------------------------- etcd
start etcd etcd --name airlock --data-dir "$STATE/etcd" \
  --listen-client-urls "http://$ETCD_CLIENT" --advertise-client-urls "http://$ETCD_CLIENT" \
  --listen-peer-urls "http://$ETCD_PEER" --initial-advertise-peer-urls "http://$ETCD_PEER" \
  --initial-cluster "airlock=http://$ETCD_PEER" --log-level warn
wait_for etcd 30 curl -fsS "http://$ETCD_CLIENT/health"

# ---------------------------------------------------------------- kube-apiserver
start kube-apiserver "$BIN/kube-apiserver" \
  --etcd-servers "http://$ETCD_CLIENT" \
  --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port 6443 \
  --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
  --client-ca-file "$PKI/ca.crt" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
  --service-cluster-ip-range "$SERVICE_CIDR" \
  --authorization-mode Node,RBAC --allow-privileged=true \
  --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
  --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority "$PKI/ca.crt" \
  --kubelet-preferred-address-types InternalIP \
  --enable-priority-and-fairness=false \
  --profiling=false
wait_for kube-apiserver 60 curl -fsS --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "https://$NODE_IP:6443/readyz"
mv "$KUBECONFIG_OUT.tmp" "$KUBECONFIG_OUT"

# ---------------------------------------------------------------- containerd (private instance)
mkdir -p "$STATE/containerd" "$STATE/cni/net.d" "$STATE/cni/ipam" "$STATE/runc"
cat >"$STATE/etc/containerd.toml" <<TOML
version = 2
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$CTR_SOCK"
[ttrpc]
  address = "$CTR_SOCK.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # This machine lacks CAP_SYS_RESOURCE: without this every pod fails ("can't get final child's PID").
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$STATE/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
    max_conf_num = 1
TOML
cat >"$STATE/cni/net.d/10-airlock.conflist" <<CNI
{
  "cniVersion": "0.4.0",
  "name": "airlock-pods",
  "plugins": [{
    "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "dataDir": "$STATE/cni/ipam",
             "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}
  }]
}
CNI
start containerd containerd --config "$STATE/etc/containerd.toml"
ctr_() { ctr --address "$CTR_SOCK" "$@"; }
wait_for containerd 30 ctr_ version

# The sandbox (pause) image: a static Go binary packed as a docker-archive, imported locally.
if ! ctr_ -n k8s.io images ls -q | grep -qx "$PAUSE_IMAGE"; then
  mkdir -p "$CACHE/images"
  if [[ ! -f "$CACHE/images/pause.tar" ]]; then
    (cd "$REPO" && CGO_ENABLED=0 go build -trimpath -o "$CACHE/images/pause" ./hack/testcluster/pause)
    (cd "$REPO" && go run ./hack/testcluster/imgpack -out "$CACHE/images/pause.tar.tmp" -tag "$PAUSE_IMAGE" \
      -entrypoint /pause -file "/pause=$CACHE/images/pause")
    mv "$CACHE/images/pause.tar.tmp" "$CACHE/images/pause.tar"
  fi
  ctr_ -n k8s.io images import "$CACHE/images/pause.tar" >/dev/null
fi

# ---------------------------------------------------------------- kubelet
# Pods' cgroups live below /airlock-k8s in every v1 hierarchy, so down.sh removes exactly ours.
for h in /sys/fs/cgroup/*/; do
  h="${h%/}"
  [[ -f "$h/cgroup.procs" && ! -L "$h" ]] || continue
  mkdir -p "$h/$CGROUP_ROOT"
  if [[ -f "$h/cpuset.cpus" ]]; then
    # A new v1 cpuset cgroup starts empty: give it the parent's cpus and mems.
    [[ -n "$(cat "$h/$CGROUP_ROOT/cpuset.cpus")" ]] || cat "$h/cpuset.cpus" >"$h/$CGROUP_ROOT/cpuset.cpus"
    [[ -n "$(cat "$h/$CGROUP_ROOT/cpuset.mems")" ]] || cat "$h/cpuset.mems" >"$h/$CGROUP_ROOT/cpuset.mems"
  fi
done
mkdir -p "$STATE/kubelet" "$STATE/pod-logs"
cat >"$STATE/etc/kubelet.yaml" <<KY
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$CTR_SOCK
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: AlwaysAllow}
makeIPTablesUtilChains: false
podLogsDir: $STATE/pod-logs
serializeImagePulls: false
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 250
KY
start kubelet "$BIN/kubelet" --config "$STATE/etc/kubelet.yaml" \
  --kubeconfig "$STATE/etc/kubelet.kubeconfig" --root-dir "$STATE/kubelet" \
  --hostname-override "$NODE_NAME" --node-ip "$NODE_IP"

# ---------------------------------------------------------------- scheduler, controller-manager
start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$STATE/etc/scheduler.kubeconfig" \
  --authentication-kubeconfig "$STATE/etc/scheduler.kubeconfig" \
  --authorization-kubeconfig "$STATE/etc/scheduler.kubeconfig" \
  --leader-elect=false --bind-address 127.0.0.1 --secure-port 10259
start kube-controller-manager "$BIN/kube-controller-manager" \
  --kubeconfig "$STATE/etc/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$STATE/etc/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$STATE/etc/controller-manager.kubeconfig" \
  --leader-elect=false --bind-address 127.0.0.1 --secure-port 10257 \
  --controllers '*,-nodeipam,-cloud-node-lifecycle' \
  --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
  --use-service-account-credentials=true

node_ready() {
  [[ "$(kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]]
}
wait_for "node $NODE_NAME Ready" 120 node_ready
# The node lifecycle controller lifts the not-ready taint; until then nothing schedules.
untainted() { [[ -z "$(kc get node "$NODE_NAME" -o jsonpath='{.spec.taints}')" ]]; }
wait_for "node $NODE_NAME untainted" 120 untainted
sa_ready() { kc -n default get serviceaccount default; }
wait_for "default ServiceAccount" 60 sa_ready

# ---------------------------------------------------------------- NetworkPolicy (kube-router)
# Only its network policy controller: pods keep the bridge CNI; kube-router filters their
# traffic in the FORWARD/INPUT/OUTPUT chains by pod IP (ipsets), which sees bridged pod-to-pod
# traffic only with bridge-nf-call-iptables on (the value found is restored by down.sh).
BRNF=/proc/sys/net/bridge/bridge-nf-call-iptables
[[ -f "$BRNF" ]] || die "$BRNF missing: the kernel needs br_netfilter for NetworkPolicy between pods on one bridge"
cat "$BRNF" >"$STATE/bridge-nf-call-iptables.orig"
echo 1 >"$BRNF"
start kube-router "$BIN/kube-router" --kubeconfig "$KUBECONFIG_OUT" --hostname-override "$NODE_NAME" \
  --run-router=false --run-service-proxy=false --run-firewall=true --enable-cni=false \
  --service-cluster-ip-range "$SERVICE_CIDR" --health-port 0 --metrics-port 0 --iptables-sync-period 1m
npc_ready() { iptables -w 5 -S KUBE-ROUTER-FORWARD; }
wait_for "kube-router's iptables chains" 60 npc_ready
for p in etcd kube-apiserver containerd kubelet kube-scheduler kube-controller-manager kube-router; do
  pid_alive "$p" || die "$p exited (log: $LOGS/$p.log)"
done
log "cluster up: KUBECONFIG=$KUBECONFIG_OUT"
echo "$KUBECONFIG_OUT"

# lib.sh: paths and helpers shared by the test-cluster scripts (sourced, not run).
# Every path the cluster writes is below $STATE (removed by down.sh) except the build cache.
CACHE="${AIRLOCK_K8S_CACHE:-/var/cache/airlock-k8s}"
BIN="$CACHE/bin"
STATE="${AIRLOCK_K8S_STATE:-/var/lib/airlock-k8s}"
PIDS="$STATE/pids"
LOGS="$STATE/logs"
PKI="$STATE/pki"
KUBECONFIG_OUT="$STATE/admin.kubeconfig"
NODE_NAME="${AIRLOCK_K8S_NODE:-airlock-node}"
CTR_SOCK="$STATE/containerd/containerd.sock"
# The pod bridge and the cgroup root below every v1 hierarchy: both created by up.sh, removed by down.sh.
BRIDGE="airlock0"
CGROUP_ROOT="airlock-k8s"
POD_CIDR="10.244.0.0/24"
SERVICE_CIDR="10.0.0.0/24"
ETCD_CLIENT="127.0.0.1:23790"
ETCD_PEER="127.0.0.1:23800"
PAUSE_IMAGE="airlock.local/pause:3"

log() { printf '[%s %s] %s\n' "${0##*/}" "$(date +%T)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# node_ip is the address of the interface holding the default route, read at run time.
node_ip() {
  if [[ -n "${AIRLOCK_K8S_NODE_IP:-}" ]]; then echo "$AIRLOCK_K8S_NODE_IP"; return; fi
  local dev
  dev="$(ip -4 route show default | awk '{for(i=1;i<=NF;i++) if($i=="dev"){print $(i+1); exit}}')"
  [[ -n "$dev" ]] || die "no default route: set AIRLOCK_K8S_NODE_IP"
  ip -4 -o addr show dev "$dev" scope global | awk '{split($4,a,"/"); print a[1]; exit}'
}

# pid_alive NAME: the recorded process is running and is still the one we started (its command
# line names our state dir or our binary), so a recycled pid is never mistaken for ours.
pid_alive() {
  local f="$PIDS/$1" pid
  [[ -f "$f" ]] || return 1
  pid="$(cat "$f")"
  [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -e "$STATE" -e "$BIN"
}

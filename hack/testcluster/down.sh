#!/usr/bin/env bash
# down.sh: stop the test cluster up.sh started — only the processes whose pids it recorded (and the
# containerd shims serving our private socket), unmount everything below $STATE, remove our pod
# cgroups, kube-router's iptables chains and ipsets and the CNI bridge, and delete $STATE. The build cache ($AIRLOCK_K8S_CACHE) stays.
# Safe to run when nothing is up.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"

if [[ ! -d "$STATE" ]]; then
  log "nothing to stop ($STATE absent)"
  exit 0
fi
case "$STATE" in /|/var|/var/lib|/tmp|/run) die "refusing to remove STATE=$STATE" ;; esac

# stop NAME: SIGTERM the recorded process, SIGKILL after 15 s.
stop() {
  local name="$1" pid i
  pid_alive "$name" || { rm -f "$PIDS/$name"; return 0; }
  pid="$(cat "$PIDS/$name")"
  kill -TERM "$pid" 2>/dev/null
  for ((i = 0; i < 60; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.25
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "$name ($pid) ignored SIGTERM: SIGKILL"
    kill -KILL "$pid" 2>/dev/null
    sleep 0.2
  fi
  rm -f "$PIDS/$name"
}

# npc_cleanup removes kube-router's network policy rules: the jumps from INPUT/FORWARD/OUTPUT,
# its chains (KUBE-ROUTER-*, KUBE-POD-FW-*, KUBE-NWPLCY-*) and ipsets (KUBE-SRC-*, KUBE-DST-*).
# By name, because kube-router v2.1.0's own --cleanup-config leaves them all and then panics in
# its IPVS cleanup. Only the filter table holds them (no service proxy, no router runs).
npc_cleanup() {
  local c rule
  command -v iptables >/dev/null || return 0
  for c in INPUT FORWARD OUTPUT; do
    while read -r rule; do
      [[ -n "$rule" ]] && eval "iptables -w 5 ${rule/#-A/-D}"
    done < <(iptables -w 5 -S "$c" 2>/dev/null | grep -- "-j KUBE-ROUTER-$c\$")
  done
  local chains
  mapfile -t chains < <(iptables -w 5 -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^(KUBE-ROUTER-|KUBE-POD-FW-|KUBE-NWPLCY-)/ {print $2}')
  for c in "${chains[@]}"; do iptables -w 5 -F "$c"; done
  for c in "${chains[@]}"; do iptables -w 5 -X "$c"; done
  if command -v ipset >/dev/null; then
    ipset list -n 2>/dev/null | grep -E '^KUBE-(SRC|DST)-' | while read -r c; do ipset destroy "$c"; done
  fi
}

# The kubelet goes first so it does not restart what we are about to stop.
stop kubelet
if pid_alive containerd; then
  ctr_() { timeout 20 ctr --address "$CTR_SOCK" -n k8s.io "$@"; }
  # Every pod container and sandbox is a task of our containerd: kill and delete them all.
  for t in $(ctr_ tasks ls -q 2>/dev/null); do
    ctr_ tasks kill -s SIGKILL "$t" >/dev/null 2>&1
  done
  for t in $(ctr_ tasks ls -q 2>/dev/null); do
    for _ in 1 2 3 4 5 6 7 8 9 10; do ctr_ tasks rm -f "$t" >/dev/null 2>&1 && break; sleep 0.3; done
  done
fi
stop containerd
# Shims outlive containerd by design; ours are the ones serving our private socket.
for p in /proc/[0-9]*; do
  [[ -r "$p/cmdline" ]] || continue
  cmd="$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)" || continue
  if [[ "$cmd" == *containerd-shim* && "$cmd" == *"-address $CTR_SOCK "* ]]; then
    kill -KILL "${p#/proc/}" 2>/dev/null
  fi
done
stop kube-router
npc_cleanup
if [[ -f "$STATE/bridge-nf-call-iptables.orig" ]]; then
  cat "$STATE/bridge-nf-call-iptables.orig" >/proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null
fi
stop kube-controller-manager
stop kube-scheduler
stop kube-apiserver
stop etcd

# Any process still running inside our pod cgroups (a container whose shim died first).
for h in /sys/fs/cgroup/*/"$CGROUP_ROOT"; do
  [[ -d "$h" ]] || continue
  find "$h" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | xargs -r kill -KILL 2>/dev/null
done
sleep 0.3

# Unmount below $STATE, deepest first (pod volumes, overlay rootfs, netns, shm).
for _ in 1 2 3; do
  mapfile -t mnts < <(awk -v s="$STATE/" 'index($5, s) == 1 {print $5}' /proc/self/mountinfo | sort -r)
  ((${#mnts[@]})) || break
  for m in "${mnts[@]}"; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
done

for h in /sys/fs/cgroup/*/"$CGROUP_ROOT"; do
  [[ -d "$h" ]] || continue
  find "$h" -depth -type d -exec rmdir {} \; 2>/dev/null
  [[ -d "$h" ]] && log "warning: could not remove cgroup $h"
done
if ip link show "$BRIDGE" >/dev/null 2>&1; then
  ip link delete "$BRIDGE" type bridge
fi
rm -rf "$STATE"
log "cluster stopped, $STATE removed (build cache kept in $CACHE)"

#!/usr/bin/env bash
# Runs issue 3's and issue 6's benchmarks in one `go test -bench` run: airlock (library and CLI)
# side by side with host python, bubblewrap, runc, crun, runsc (gVisor) and `docker run`, every
# row a fresh sandbox with the same rootfs; sandboxes per second and run_code throughput on this
# machine's cores; idle host memory per sandbox. Installs what is missing; starts a private
# dockerd only with flags that leave host networking alone, and stops it (by its pid) at the end.
#
#   sudo bench/run.sh [extra go test flags]
#
# Environment:
#   BENCH        benchmarks to run (default 'SideBySide|SandboxesPerSecond|RunCodeThroughput|IdleMemory$');
#                BENCH=issue6 is issue 6's set in one run: pre-started run_code vs host python, warm
#                claim -> first exec, exec round trip, throughput (airlock's and every runtime's),
#                200 idle sandboxes' memory; BENCH=backtoback is issue 26's back-to-back rows and a pooled call with its refill beside it (airlock mcp's
#                run_code and airlock run, each against host python; BENCHTIME 1x unless set)
#   BENCHTIME    go test -benchtime (default 20x: ~5-10 minutes on a loaded 2-core machine)
#   AIRLOCK_BENCH_CACHE  where the static runsc, the rootfs, the image and dockerd's roots live
#                (default /var/cache/airlock-bench); the output goes to $AIRLOCK_BENCH_CACHE/last.txt
#   SKIP_DOCKER=1, SKIP_RUNSC=1  leave those rows out (otherwise every row is required: a runtime
#                that fails to install or run fails the benchmark instead of vanishing from it)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
cache=${AIRLOCK_BENCH_CACHE:-/var/cache/airlock-bench}
mkdir -p "$cache/bin"
log() { printf 'bench/run.sh: %s\n' "$*" >&2; }
(($(id -u) == 0)) || { log "run as root (sandboxes, cgroups, runc, dockerd)"; exit 2; }

# ---- install -------------------------------------------------------------------------------
# Debian's packages; policy-rc.d exiting 101 keeps the package scripts from starting dockerd
# with its defaults (which rewrite the host's firewall and routing). An existing one is kept.
pkgs=()
for b in bwrap:bubblewrap runc:runc crun:crun file:file; do command -v "${b%%:*}" >/dev/null || pkgs+=("${b##*:}"); done
[[ ${SKIP_DOCKER:-0} == 1 ]] || [[ -x /usr/sbin/dockerd && -x /usr/bin/docker ]] || pkgs+=(docker.io)
if ((${#pkgs[@]})); then
	if [[ ! -e /usr/sbin/policy-rc.d ]]; then printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod 0755 /usr/sbin/policy-rc.d; fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -o DPkg::Lock::Timeout=600 --no-install-recommends "${pkgs[@]}" ||
		{ apt-get update -o DPkg::Lock::Timeout=600 && apt-get install -y -o DPkg::Lock::Timeout=600 --no-install-recommends "${pkgs[@]}"; }
fi

# runsc from the Go module proxy, built without cgo: airlock's gvisor engine (and this
# benchmark, for the same binary) refuses a dynamically linked runsc. ~8 minutes once; cached.
if [[ ${SKIP_RUNSC:-0} != 1 ]]; then
	./hack/runsc.sh "$cache/bin" >/dev/null
fi
# Our runsc first; nothing else of ours is in $cache/bin.
export PATH="$cache/bin:$PATH"

# ---- the rootfs every row runs in ----------------------------------------------------------
# From this host's own binaries (no registry here); the same directory for airlock, bwrap, runc,
# crun and runsc, and the same files as a docker image.
hack/mkrootfs.sh --docker-archive "$cache/rootfs.tar" "$cache/rootfs"
export AIRLOCK_BENCH_ROOTFS="$cache/rootfs"

# ---- a private dockerd ---------------------------------------------------------------------
dockerd_pid=""
cleanup() {
	[[ -n $dockerd_pid ]] || return 0
	kill -TERM "$dockerd_pid" 2>/dev/null || true
	for _ in $(seq 300); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.1; done
	if kill -0 "$dockerd_pid" 2>/dev/null; then
		log "dockerd $dockerd_pid did not stop within 30 s; killing it"
		kill -KILL "$dockerd_pid" 2>/dev/null || true
	fi
	wait "$dockerd_pid" 2>/dev/null || true
	log "dockerd $dockerd_pid stopped"
}
trap cleanup EXIT
require=host,airlock-library,airlock-cli,bwrap,runc,crun
[[ ${SKIP_RUNSC:-0} == 1 ]] || require+=,runsc
if [[ ${SKIP_DOCKER:-0} != 1 ]]; then
	droot=$cache/docker
	mkdir -p "$droot/data" "$droot/exec"
	export DOCKER_HOST="unix://$droot/docker.sock"
	# A dockerd a killed earlier run of this script left on the same roots would hold them.
	if [[ -f $droot/docker.pid ]] && old=$(<"$droot/docker.pid") && [[ $(cat "/proc/$old/comm" 2>/dev/null) == dockerd ]]; then
		log "stopping dockerd $old left by an earlier run on $droot"
		kill -TERM "$old"
		for _ in $(seq 300); do [[ -d /proc/$old ]] || break; sleep 0.1; done
	fi
	rm -f "$droot/docker.sock" "$droot/docker.pid"
	dockerd --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false --bridge=none \
		--data-root "$droot/data" --exec-root "$droot/exec" --pidfile "$droot/docker.pid" \
		-H "$DOCKER_HOST" >"$droot/dockerd.log" 2>&1 &
	dockerd_pid=$!
	up=0
	for _ in $(seq 600); do
		if /usr/bin/docker version >/dev/null 2>&1; then up=1; break; fi
		kill -0 "$dockerd_pid" 2>/dev/null || break
		sleep 0.1
	done
	((up)) || { log "dockerd did not answer; the end of $droot/dockerd.log:"; tail -n 20 "$droot/dockerd.log" >&2; exit 1; }
	/usr/bin/docker load -i "$cache/rootfs.tar" >/dev/null
	# The docker.io package's CLI, whatever else is on PATH.
	export AIRLOCK_BENCH_DOCKER_CLI=/usr/bin/docker AIRLOCK_BENCH_DOCKER_IMAGE=airlock.local/rootfs:host
	require+=,docker
fi
export AIRLOCK_BENCH_REQUIRE=$require

# ---- run -----------------------------------------------------------------------------------
if [[ ${BENCH:-} == backtoback ]]; then
	BENCH='BackToBack|RefillBeside'
	BENCHTIME=${BENCHTIME:-1x}
fi
if [[ ${BENCH:-} == issue6 ]]; then
	BENCH='PrestartVsHostInterleaved|WarmClaimFirstExec|ExecRoundTrip|RunCodeThroughput|ThroughputSideBySide|IdleMemory200$'
fi
out=$cache/last.txt
# The benchmarks' tables (longer than go test prints of a benchmark's log) go here, then to $out.
export AIRLOCK_BENCH_REPORT=$cache/report.md
rm -f "$AIRLOCK_BENCH_REPORT"
{
	echo "# $(date -u '+%Y-%m-%d %H:%M UTC') commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (+ uncommitted changes in the tree)')"
	echo "# $(nproc) cores, $(uname -r), load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "# python $(/usr/bin/python3 -V 2>&1 | cut -d' ' -f2), bwrap $(bwrap --version | cut -d' ' -f2), runc $(runc --version | sed -n 's/^runc version //p'), crun $(crun --version | sed -n 's/^crun version //p')$([[ ${SKIP_RUNSC:-0} == 1 ]] || echo ", runsc $(cat "$cache/bin/runsc.version")")$([[ ${SKIP_DOCKER:-0} == 1 ]] || echo ", docker $(/usr/bin/docker version -f '{{.Server.Version}}')")"
	echo "# cd bench && go test -run '^\$' -bench '${BENCH:-SideBySide|SandboxesPerSecond|RunCodeThroughput|IdleMemory\$}' -benchtime ${BENCHTIME:-20x} $*"
} | tee "$out"
cd "$repo/bench"
set +e
go test -run '^$' -bench "${BENCH:-SideBySide|SandboxesPerSecond|RunCodeThroughput|IdleMemory\$}" \
	-benchtime "${BENCHTIME:-20x}" -timeout 60m "$@" . 2>&1 | tee -a "$out"
status=${PIPESTATUS[0]}
set -e
{
	echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
	echo
	cat "$AIRLOCK_BENCH_REPORT" 2>/dev/null || true # a run of rows that write no table
} | tee -a "$out"
exit "$status"

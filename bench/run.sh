#!/usr/bin/env bash
# Runs every benchmark side by side in one `go test -bench` run: airlock (library and CLI) next to
# host python, bubblewrap, runc, crun, runsc and docker. Installs what is missing; starts dockerd
# only with flags that leave host networking alone, and stops it at the end.
#
#   sudo bench/run.sh [-benchtime 20x] [-count 1] [extra go test flags]
#
# Environment: AIRLOCK_BENCH_CACHE (default /var/cache/airlock-bench), SKIP_DOCKER=1, SKIP_RUNSC=1.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
cache=${AIRLOCK_BENCH_CACHE:-/var/cache/airlock-bench}
mkdir -p "$cache"

pkgs=()
for b in bwrap:bubblewrap runc:runc crun:crun; do command -v "${b%%:*}" >/dev/null || pkgs+=("${b##*:}"); done
[[ ${SKIP_DOCKER:-0} == 1 ]] || command -v dockerd >/dev/null || pkgs+=(docker.io)
if ((${#pkgs[@]})); then
	# policy-rc.d keeps the package scripts from starting dockerd with its defaults.
	if [[ ! -e /usr/sbin/policy-rc.d ]]; then printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${pkgs[@]}"
fi

if [[ ${SKIP_RUNSC:-0} != 1 ]] && ! command -v runsc >/dev/null; then
	# ~8 minutes once; the Go build cache keeps it afterwards (see shared/notes).
	GOBIN="$cache/bin" go install gvisor.dev/gvisor/runsc@v0.0.0-20260905035102-160fafc42237 || echo "runsc build failed; skipping it" >&2
fi
export PATH="$cache/bin:$HOME/go/bin:$PATH"

hack/mkrootfs.sh --docker-archive "$cache/rootfs.tar" "$cache/rootfs"
export AIRLOCK_BENCH_ROOTFS="$cache/rootfs"

dockerd_pid=""
cleanup() {
	if [[ -n $dockerd_pid ]]; then kill "$dockerd_pid" 2>/dev/null || true; wait "$dockerd_pid" 2>/dev/null || true; fi
}
trap cleanup EXIT
if [[ ${SKIP_DOCKER:-0} != 1 ]] && command -v dockerd >/dev/null; then
	droot="$cache/docker"
	mkdir -p "$droot/data" "$droot/exec"
	export DOCKER_HOST="unix://$droot/docker.sock"
	dockerd --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false --bridge=none \
		--data-root "$droot/data" --exec-root "$droot/exec" --pidfile "$droot/docker.pid" \
		-H "$DOCKER_HOST" >"$droot/dockerd.log" 2>&1 &
	dockerd_pid=$!
	for _ in $(seq 100); do docker info >/dev/null 2>&1 && break; sleep 0.2; done
	docker load -i "$cache/rootfs.tar" >/dev/null
	export AIRLOCK_BENCH_DOCKER_IMAGE=airlock.local/rootfs:host
fi

cd "$repo/bench"
go test -run '^$' -bench . -benchtime "${BENCHTIME:-20x}" "$@" . | tee "$cache/last.txt"

#!/usr/bin/env bash
# dockerd.sh: a private Docker engine that leaves host networking alone, for tests and benchmarks.
#
#   hack/dockerd.sh [start] [--dir DIR]     install docker.io if missing, start dockerd, print DOCKER_HOST=...
#   hack/dockerd.sh stop [--dir DIR]        stop the dockerd whose pid is in DIR/docker.pid (only that one)
#   hack/dockerd.sh load FILE [--dir DIR]   docker load FILE into that engine (starting it if needed)
#   hack/dockerd.sh test-image [--dir DIR]  build the test rootfs (hack/mkrootfs.sh) as a docker-archive and load it
#
# dockerd runs only with --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false
# --bridge=none and its own data/exec roots: its default start rewrites the host's firewall and
# routing. Idempotent and serialised (a lock in DIR): a running engine in DIR is reused. DIR defaults to /var/cache/airlock-docker
# ($AIRLOCK_DOCKER_DIR); the engine's socket is DIR/docker.sock, its log DIR/dockerd.log.
set -euo pipefail

usage() { sed -n '2,12s/^# \{0,1\}//p' "$0"; exit "${1:-2}"; }

cmd=start dir=${AIRLOCK_DOCKER_DIR:-/var/cache/airlock-docker} file=""
case "${1:-}" in
start | stop | load | test-image) cmd=$1; shift ;;
-h | --help) usage 0 ;;
esac
while (($#)); do
	case "$1" in
	--dir) dir=${2:?--dir needs a directory}; shift ;;
	-h | --help) usage 0 ;;
	-*) echo "dockerd.sh: unknown option $1" >&2; usage ;;
	*)
		[[ $cmd == load && -z $file ]] || { echo "dockerd.sh: unexpected argument $1" >&2; usage; }
		file=$1
		;;
	esac
	shift
done
[[ $cmd != load || -n $file ]] || { echo "dockerd.sh: load needs a FILE" >&2; usage; }
dir=$(realpath -m "$dir")
sock=$dir/docker.sock
pidfile=$dir/docker.pid
export DOCKER_HOST=unix://$sock
repo=$(cd "$(dirname "$0")/.." && pwd)

log() { printf 'dockerd.sh: %s\n' "$*" >&2; }

# The socket path must fit sockaddr_un (107 bytes).
((${#sock} <= 100)) || { log "--dir $dir is too long for a unix socket path"; exit 2; }

# running: the pid in the pidfile is alive and is a dockerd.
running() {
	[[ -f $pidfile ]] || return 1
	local pid
	pid=$(<"$pidfile")
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	[[ $(cat "/proc/$pid/comm" 2>/dev/null) == dockerd ]]
}

# client: the docker CLI talking to our engine (any docker CLI works; docker.io brings one).
client() { docker -H "$DOCKER_HOST" "$@"; }

install() {
	command -v dockerd >/dev/null && command -v docker >/dev/null && return 0
	log "installing docker.io"
	# policy-rc.d exiting 101 keeps the package scripts from starting dockerd with its defaults.
	# An existing one is kept as it is.
	if [[ ! -e /usr/sbin/policy-rc.d ]]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
		chmod 0755 /usr/sbin/policy-rc.d
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -o DPkg::Lock::Timeout=600 --no-install-recommends docker.io ||
		{ apt-get update -o DPkg::Lock::Timeout=600 && apt-get install -y -o DPkg::Lock::Timeout=600 --no-install-recommends docker.io; }
	command -v dockerd >/dev/null || { log "docker.io installed but dockerd is not on PATH"; exit 1; }
}

start() {
	if running && client version >/dev/null 2>&1; then
		echo "DOCKER_HOST=$DOCKER_HOST"
		return 0
	fi
	if running; then
		log "dockerd $(<"$pidfile") is running but does not answer on $sock; see $dir/dockerd.log"
		exit 1
	fi
	install
	mkdir -p "$dir/data" "$dir/exec"
	rm -f "$sock" "$pidfile"
	# setsid + nohup: the engine outlives this script (and a test's process group) until `stop`.
	setsid nohup dockerd \
		--iptables=false --ip6tables=false --ip-forward=false --ip-masq=false --bridge=none \
		--data-root "$dir/data" --exec-root "$dir/exec" \
		-H "unix://$sock" --pidfile "$pidfile" \
		</dev/null >>"$dir/dockerd.log" 2>&1 9>&- &
	local i
	for ((i = 0; i < 600; i++)); do
		if client version >/dev/null 2>&1; then
			echo "DOCKER_HOST=$DOCKER_HOST"
			return 0
		fi
		if ! kill -0 $! 2>/dev/null; then
			log "dockerd exited; the end of $dir/dockerd.log:"
			tail -n 20 "$dir/dockerd.log" >&2
			exit 1
		fi
		sleep 0.1
	done
	log "dockerd did not answer on $sock within 60s; see $dir/dockerd.log"
	exit 1
}

stop() {
	if ! running; then
		rm -f "$pidfile"
		return 0
	fi
	local pid i
	pid=$(<"$pidfile")
	kill -TERM "$pid"
	for ((i = 0; i < 300; i++)); do
		[[ -d /proc/$pid ]] || return 0
		sleep 0.1
	done
	log "dockerd $pid did not stop within 30s; killing it"
	kill -KILL "$pid" 2>/dev/null || true
}

load() {
	start >/dev/null
	client load -i "$1" >&2
}

# One invocation at a time per DIR: two test binaries starting the engine at once must not both
# launch a dockerd (the second would fail on the pidfile) or pack the same image file.
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9

case $cmd in
start) start ;;
stop) stop ;;
load) load "$file" ;;
test-image)
	start
	"$repo/hack/mkrootfs.sh" --docker-archive "$dir/rootfs.tar" "$dir/rootfs"
	load "$dir/rootfs.tar"
	echo "IMAGE=airlock.local/rootfs:host"
	;;
esac

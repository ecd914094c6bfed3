#!/usr/bin/env bash
# sidebyside.sh: the backend/local and backend/docker suites in one go test run (side by side,
# as a single `go test ./...` runs them), watched from outside for interference between them.
#
#   hack/sidebyside.sh [-n RUNS] [-- GO_TEST_ARGS...]
#
# Runs as root, with the private dockerd (hack/dockerd.sh; started here when none runs, and
# stopped again at the end only then) and gVisor's runsc (hack/setup.sh). While the suites run,
# two watchers poll the host:
#   - every live process in a docker container whose root has no /bin/sh (the symptom CI saw
#     twice: "stat /bin/sh: no such file or directory" from agents in live containers) is
#     reported, and fails the run;
#   - every change to the host's mounts under the engine's data and exec roots and the docker
#     suite's state dirs ($TMPDIR/ad*) is logged, with the time, for reading next to the
#     suites' output.
# Logs go to a fresh directory under $TMPDIR (printed). Exit status: the suites', else 1 when
# a container lost its root.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=1
while (($#)); do
	case "$1" in
	-n) runs=${2:?-n needs a count}; shift 2 ;;
	--) shift; break ;;
	-h | --help) sed -n '2,17s/^# \{0,1\}//p' "$0"; exit 0 ;;
	*) echo "sidebyside.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
[[ $(id -u) == 0 ]] || { echo "sidebyside.sh: run as root" >&2; exit 2; }

# shellcheck source=hack/setup.sh
source ./hack/setup.sh
export AIRLOCK_REQUIRE_ROOT=1

docker_dir=${AIRLOCK_DOCKER_DIR:-/var/cache/airlock-docker}
docker_pid=$(cat "$docker_dir/docker.pid" 2>/dev/null || true)
if [ -z "$docker_pid" ] || [ "$(cat "/proc/$docker_pid/comm" 2>/dev/null)" != dockerd ]; then
	./hack/dockerd.sh start --dir "$docker_dir" >/dev/null
	trap './hack/dockerd.sh stop --dir "$docker_dir"' EXIT
fi

logs=$(mktemp -d "${TMPDIR:-/tmp}/sidebyside.XXXXXX")
echo "sidebyside.sh: logs in $logs"
stop=$logs/stop

# mounts: the host's mount points (and their options) under the engine's roots and the docker
# suite's state dirs.
tmp=$(realpath "${TMPDIR:-/tmp}")
mounts() {
	awk -v d="$docker_dir" -v t="$tmp/ad" 'index($5, d) == 1 || index($5, t) == 1 { print $5, $7 }' /proc/self/mountinfo | sort
}

watch_mounts() {
	local prev cur
	prev=$(mounts)
	while [ ! -e "$stop" ]; do
		cur=$(mounts)
		if [ "$cur" != "$prev" ]; then
			echo "== $(date +%T.%N)"
			diff <(echo "$prev") <(echo "$cur") | grep '^[<>]' || true
			prev=$cur
		fi
		sleep 0.05
	done
}

# watch_roots reports each live process in a docker container (cgroup v1 cgroupfs: pids/docker/<id>;
# v2: docker/<id>) whose root has no /bin/sh once one of that container's processes was seen
# with it (images without a shell are no finding), once per pid.
watch_roots() {
	declare -A seen had
	local c id pid
	while [ ! -e "$stop" ]; do
		for c in /sys/fs/cgroup/pids/docker/*/cgroup.procs /sys/fs/cgroup/docker/*/cgroup.procs; do
			[ -e "$c" ] || continue
			id=$(basename "$(dirname "$c")")
			for pid in $(cat "$c" 2>/dev/null); do
				if [ -e "/proc/$pid/root/bin/sh" ]; then
					had[$id]=1
					continue
				fi
				[ -n "${had[$id]:-}" ] && [ -z "${seen[$pid]:-}" ] || continue
				[ -r "/proc/$pid/stat" ] || continue
				[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] || continue
				# An exiting process has no root at all (not a finding); one whose root is
				# there but has no shell is.
				[ -d "/proc/$pid/root/." ] || continue
				[ -e "/proc/$pid/root/bin/sh" ] && continue
				echo "$(date +%T.%N) container ${id:0:12} pid $pid ($(cat "/proc/$pid/comm" 2>/dev/null)): its root has no /bin/sh any more; it holds: $(ls "/proc/$pid/root" 2>&1 | head -5 | tr '\n' ' ')"
				seen[$pid]=1
			done
		done
		sleep 0.3
	done
}

mounts >"$logs/mounts.before"
watch_mounts >"$logs/mounts.log" 2>&1 &
wm=$!
watch_roots >"$logs/roots.log" 2>&1 &
wr=$!

rc=0
for ((i = 1; i <= runs; i++)); do
	echo "== run $i of $runs: go test -race ./backend/local/ ./backend/docker/ $* ($(date +%T))"
	if ! go test -race -count=1 -timeout 40m "$@" ./backend/local/ ./backend/docker/ 2>&1 | tee "$logs/run$i.log"; then
		rc=1
	fi
done

touch "$stop"
wait "$wm" "$wr" || true
mounts >"$logs/mounts.after"
echo "== mounts left under $docker_dir and $tmp/ad* that were not there before:"
comm -13 "$logs/mounts.before" "$logs/mounts.after" || true
if [ -s "$logs/roots.log" ]; then
	echo "== containers that lost their root while the suites ran:"
	cat "$logs/roots.log"
	[ "$rc" != 0 ] || rc=1
else
	echo "== no container lost its root"
fi
echo "== mount changes logged: $(grep -c '^==' "$logs/mounts.log" || true) (in $logs/mounts.log)"
exit "$rc"

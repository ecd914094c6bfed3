#!/usr/bin/env bash
# The local runtime's tests on cgroup v2 (docs/cgroups.md): backend/local's whole suite, root
# tests required (AIRLOCK_REQUIRE_ROOT=1), in the hack/v2vm VM booted with cgroup_no_v1=all.
# Binaries are built here on the host (the agent static, as shipped) into a dir of this run's;
# the VM sees them through its read-only view of the host's /. Extra args go to the test
# binary, e.g. hack/v2vm/test-local.sh -test.run TestAbuse -test.v
# Cost on this 2-core host (software emulation): ~30 min, ~7 of them TestThousandCycles.
set -euo pipefail
cd "$(dirname "$0")/../.."

cache="${V2VM_CACHE:-/var/cache/airlock-v2vm}"
mkdir -p "$cache"
bin=$(mktemp -d "$cache/bin.XXXXXX")
trap 'rm -rf "$bin"' EXIT
chmod 755 "$bin" # the sandbox's mapped root runs the agent from a copy, but the test binary reads it

CGO_ENABLED=0 go build -o "$bin/selftest" ./hack/v2vm/selftest
CGO_ENABLED=0 go build -o "$bin/airlock-agent" ./cmd/airlock-agent
go test -c -o "$bin/local.test" ./backend/local

# The guest kernel sometimes panics under software emulation within seconds of boot (CFS,
# "Fatal exception in interrupt"; 2 of ~8 runs on 2026-12-02, twice in a row in a CI run on
# 2026-12-06 while the host was busy): the run then ends 125 with no result from the guest, and
# is made again, up to three times in all. Any other status is the run's.
vm() {
  local rc=0 try
  for try in 1 2 3; do
    rc=0
    "$@" || rc=$?
    [ "$rc" = 125 ] && [ "$try" -lt 3 ] || break
    echo "v2vm: the VM gave no result (exit 125): running it again" >&2
  done
  return "$rc"
}

echo "-- the VM (cgroup2 with cpu/memory/pids, user namespaces, python3, overlay over the shared root)"
vm hack/v2vm/run "$bin/selftest"
echo "-- backend/local on cgroup v2"
cd backend/local
AIRLOCK_TEST_AGENT="$bin/airlock-agent" AIRLOCK_REQUIRE_ROOT=1 V2VM_TIMEOUT="${V2VM_TIMEOUT:-3000}" \
  vm ../../hack/v2vm/run "$bin/local.test" -test.count=1 -test.timeout 45m "$@"

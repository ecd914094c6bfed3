#!/usr/bin/env bash
# What the test suites need on a fresh Debian 12 machine, installed when missing: sourced by
# hack/test-all.sh (so the README's one test command does the whole set-up), run as root.
# Exports AIRLOCK_RUNSC (gVisor's runsc, built once and cached) for the gvisor tests.

export PATH="/usr/local/go/bin:$PATH"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"

need=()
for bin in python3:python3 node:nodejs npm:npm ip:iproute2 bash:bash newuidmap:uidmap file:file openssl:openssl; do
  command -v "${bin%%:*}" >/dev/null || need+=("${bin##*:}")
done
if [ "${#need[@]}" -gt 0 ]; then
  echo "== installing ${need[*]}"
  # A fresh machine's package lists may be empty: fetched once, only when something is missing.
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" ||
    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}"; }
fi

# gVisor's runsc for the local runtime's gvisor tests, which fail rather than skip when
# AIRLOCK_RUNSC is set: built once (~8 min), cached outside the clone.
if [ -z "${AIRLOCK_RUNSC:-}" ]; then
  AIRLOCK_RUNSC=$(./hack/runsc.sh /var/cache/airlock-runsc)
fi
export AIRLOCK_RUNSC

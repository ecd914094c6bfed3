#!/bin/sh
# Starts airlock serve (platform gcp, from /etc/airlock/config.yaml) on its unix socket, waits
# until it answers, then runs the workload's command. The daemon is this instance's: its
# sandboxes live in this instance and end with it.
set -eu
mkdir -p /run/airlock /var/lib/airlock
airlock serve --log-format json &
i=0
until [ -S /run/airlock/airlock.sock ]; do
  i=$((i + 1))
  if [ "$i" -gt 100 ]; then echo "airlock serve did not start" >&2; exit 1; fi
  sleep 0.1
done
exec "$@"

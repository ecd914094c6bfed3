#!/usr/bin/env bash
# hack/runsc.sh DIR: make sure DIR/runsc is gVisor's runsc at the version airlock is tested
# with, built from the Go module proxy without cgo (airlock refuses a dynamically linked runsc),
# and print its path. ~8 minutes once on a 2-core machine; then cached (DIR/runsc.version).
set -euo pipefail
version=v0.0.0-20260905035102-160fafc42237 # also in backend/local/gvisor/gvisor.go (Install)
dir=${1:?usage: hack/runsc.sh DIR}
runsc=$dir/runsc
if [[ ! -x $runsc || $(cat "$runsc.version" 2>/dev/null) != "$version" ]] || ! file "$runsc" | grep -q 'statically linked'; then
	echo "hack/runsc.sh: building runsc $version (static) into $dir" >&2
	mkdir -p "$dir"
	rm -f "$runsc"
	CGO_ENABLED=0 GOBIN=$dir go install "gvisor.dev/gvisor/runsc@$version"
	file "$runsc" | grep -q 'statically linked' || { echo "hack/runsc.sh: $runsc is not statically linked: $(file "$runsc")" >&2; exit 1; }
	echo "$version" >"$runsc.version"
fi
echo "$runsc"

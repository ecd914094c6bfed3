#!/usr/bin/env bash
# mkrootfs.sh: assemble a minimal root filesystem from this host's own binaries (bash, coreutils
# basics, python3 with its stdlib, optionally node, and every library they load), and optionally
# pack it as an OCI image layout or docker-archive tarball, with no registry and no daemon.
#
#   hack/mkrootfs.sh [--node] [--oci-layout DIR] [--docker-archive FILE] [--tag NAME] [--no-check] OUTDIR
#
# Programs that are also bash builtins (echo, printf, test, [, pwd, true, false, kill) go in as
# files and are run as files in the new root (a sandbox exec runs argv[0], not a shell).
#
# Idempotent and cacheable: the inputs (this script, the options, and the size and mtime of every
# file copied) are fingerprinted into OUTDIR.stamp; a rerun with the same fingerprint does nothing.
# The rootfs is built beside OUTDIR and swapped in whole. Packing goes through
# `go run ./image/cmd/mkimage`, which is reproducible: the same rootfs gives the same image digest.
#
# Environment: PYTHON (default /usr/bin/python3), NODE (default /usr/bin/node), GO (default go).
set -euo pipefail

usage() { sed -n '2,16s/^# \{0,1\}//p' "$0"; exit "${1:-2}"; }

with_node=0 oci="" archive="" tag="airlock.local/rootfs:host" check=1 out=""
while (($#)); do
	case "$1" in
	--node) with_node=1 ;;
	--oci-layout) oci=${2:?--oci-layout needs a directory}; shift ;;
	--docker-archive) archive=${2:?--docker-archive needs a file}; shift ;;
	--tag) tag=${2:?--tag needs a name}; shift ;;
	--no-check) check=0 ;;
	-h | --help) usage 0 ;;
	-*) echo "mkrootfs: unknown option $1" >&2; usage ;;
	*) [[ -z $out ]] || { echo "mkrootfs: one OUTDIR only" >&2; usage; }; out=$1 ;;
	esac
	shift
done
[[ -n $out ]] || usage
out=$(realpath -m "$out")
[[ $out != / ]] || { echo "mkrootfs: refusing to build into /" >&2; exit 2; }

PYTHON=${PYTHON:-/usr/bin/python3}
NODE=${NODE:-/usr/bin/node}
GO=${GO:-go}
repo=$(cd "$(dirname "$0")/.." && pwd)
# Look binaries up in the system directories only: version-manager shims (pyenv, nvm) are
# scripts that would not work inside the sandbox.
syspath=/usr/bin:/bin:/usr/sbin:/sbin

bins=(bash sh env cat ls echo mkdir rmdir rm cp mv ln chmod touch head tail wc sort uniq tr cut
	grep sed id uname date pwd sleep true false printf test '[' readlink realpath dirname basename
	tee xargs find seq expr mktemp stat du df nproc whoami hostname timeout kill ps)
required=(bash sh env python3)
# Programs that are also bash builtins: a script never notices their absence, but a sandbox
# exec runs argv[0] as a file. They must be in the root (checked after the build).
builtin_too=(echo printf test '[' pwd true false kill)

log() { printf 'mkrootfs: %s\n' "$*" >&2; }

# ---- collect the input files -------------------------------------------------------------
declare -A files=()  # absolute host path -> 1 (files and symlinks, canonical directory)
declare -A elfs=()   # files to run ldd on

# add PATH: record a host path by its canonical directory (so /lib/x/libc.so.6 on a merged-/usr
# host is recorded under /usr/lib), and the chain of symlinks it goes through. Process spawns
# are slow on loaded machines, so directories are resolved once and names split in bash.
declare -A canon=()
canondir() {
	local d=$1
	[[ -n ${canon[$d]:-} ]] || canon[$d]=$(realpath -e "$d")
	REPLY=${canon[$d]}
}
add() {
	local p=$1 hops=0 t
	while :; do
		[[ -e $p || -L $p ]] || { log "warning: $1: missing, skipped"; return 0; }
		canondir "${p%/*}"
		p=$REPLY/${p##*/}
		files[$p]=1
		if [[ -L $p ]] && ((hops++ < 16)); then
			t=$(readlink "$p")
			[[ $t == /* ]] || t=$REPLY/$t
			p=$t
			continue
		fi
		[[ -f $p ]] && elfs[$p]=1
		return 0
	done
}

# type -P: the file on PATH, never a shell builtin of the same name (command -v answers "echo"
# for echo, and the binary was silently left out).
declare -A binpath=()
for b in "${bins[@]}" python3; do
	if p=$(PATH=$syspath type -P "$b"); then
		add "$p"
		binpath[$b]=$p
	else
		for r in "${required[@]}"; do [[ $b != "$r" ]] || { log "$b not found on $syspath"; exit 1; }; done
		log "warning: $b not found, skipped"
	fi
done
[[ -x $PYTHON ]] || { log "PYTHON=$PYTHON is not executable"; exit 1; }
add "$PYTHON"

stdlib=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
dynload=$("$PYTHON" -c 'import sys; print(next((p for p in sys.path if p.endswith("lib-dynload")), ""))')
# The stdlib goes in whole, __pycache__ included: the root is read-only, so python could not
# write bytecode there and would recompile every import on every run.
while IFS= read -r -d '' p; do
	files[$p]=1
	[[ $p == *.so ]] && elfs[$p]=1
done < <(find "$(realpath -e "$stdlib")" ${dynload:+"$(realpath -e "$dynload")"} \
	\( -name site-packages -o -name dist-packages \) -prune -o -name "*.a" -o \( -type f -o -type l \) -print0)
# Debian's sitecustomize and friends live under /etc/python3.X.
pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [[ -d /etc/python$pyver ]]; then
	while IFS= read -r -d '' p; do files[$p]=1; done < <(find "/etc/python$pyver" \( -type f -o -type l \) -print0)
fi

if ((with_node)); then
	[[ -x $NODE ]] || { log "--node: NODE=$NODE is not executable"; exit 1; }
	add "$NODE"
fi
for p in /etc/ssl/certs/ca-certificates.crt; do [[ -e $p ]] && add "$p"; done

# Libraries: ldd of every ELF file, to a fixed point (libraries need libraries).
declare -A done_ldd=()
while :; do
	todo=()
	for e in "${!elfs[@]}"; do [[ -n ${done_ldd[$e]:-} ]] || todo+=("$e"); done
	((${#todo[@]})) || break
	for e in "${todo[@]}"; do
		done_ldd[$e]=1
		out_ldd=$(ldd "$e" 2>/dev/null) || continue # not a dynamic executable
		while read -r a b c _; do
			lib=""
			if [[ $b == "=>" && $c == /* ]]; then lib=$c; elif [[ $a == /* ]]; then lib=$a; fi
			[[ $b == "=>" && $c == not ]] && log "warning: $e needs $a, not found on this host"
			[[ -n $lib && -z ${files[$lib]:-} && -z ${done_ldd[$lib]:-} ]] && add "$lib"
		done <<<"$out_ldd"
	done
done

mapfile -t list < <(printf '%s\n' "${!files[@]}" | LC_ALL=C sort)
fingerprint=$(
	{
		sha256sum "$0" "$repo/image/cmd/mkimage/main.go" 2>/dev/null || true
		echo "node=$with_node python=$PYTHON"
		for l in bin sbin lib lib64 lib32 libx32; do [[ -L /$l ]] && echo "/$l -> $(readlink "/$l")"; done
		stat -c '%n %s %Y %a %F' -- "${list[@]}"
	} | sha256sum | cut -d' ' -f1
)

# ---- build ---------------------------------------------------------------------------------
if [[ -d $out && -f $out.stamp && $(<"$out.stamp") == "$fingerprint" ]]; then
	log "$out is up to date (${#list[@]} files)"
else
	tmp=$out.tmp.$$
	trap 'rm -rf "$tmp"' EXIT
	rm -rf "$tmp"
	mkdir -p "$tmp"
	# Merged /usr: keep the host's top-level symlinks so /bin/sh and /lib64/ld-linux resolve.
	for l in bin sbin lib lib64 lib32 libx32; do
		[[ -L /$l ]] && ln -s "$(readlink "/$l")" "$tmp/$l"
	done
	# From /: coreutils 9.1 `cp -a --parents` resolves ACL paths against the working directory.
	(cd / && printf '%s\0' "${list[@]}" | xargs -0 cp -a --parents -t "$tmp")
	mkdir -p "$tmp"/{dev,proc,sys,run,etc,root,home,workspace,usr/local/bin} "$tmp/tmp"
	chmod 1777 "$tmp/tmp"
	chmod 0700 "$tmp/root"
	cat >"$tmp/etc/passwd" <<-'EOF'
		root:x:0:0:root:/root:/bin/bash
		nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
	EOF
	cat >"$tmp/etc/group" <<-'EOF'
		root:x:0:
		nogroup:x:65534:
	EOF
	printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$tmp/etc/hosts"
	printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$tmp/etc/nsswitch.conf"
	: >"$tmp/etc/resolv.conf"
	echo sandbox >"$tmp/etc/hostname"
	# Fixed times on what we wrote ourselves, so the packed image is reproducible.
	find "$tmp" -newer "$0" -exec touch -h -d @0 {} + 2>/dev/null || true

	# Every program found on the host is in the root, as a file (or a link to one).
	for b in "${!binpath[@]}"; do
		[[ -e $tmp${binpath[$b]} ]] || { log "check failed: $b (${binpath[$b]}) is missing from the new root"; exit 1; }
	done
	if ((check)) && (($(id -u) == 0)); then
		chroot "$tmp" /bin/sh -c 'echo ok' >/dev/null || { log "check failed: /bin/sh does not run in the new root"; exit 1; }
		# The builtin-shadowed programs, run as files (no shell in between).
		for b in "${builtin_too[@]}"; do
			p=${binpath[$b]:-}
			[[ -n $p ]] || { log "check failed: $b is not on this host's $syspath"; exit 1; }
			case $b in
			echo) got=$(chroot "$tmp" "$p" ok) ;;
			printf) got=$(chroot "$tmp" "$p" '%s' ok) ;;
			test) got=$(chroot "$tmp" "$p" 1 -eq 1 && echo ok) ;;
			\[) got=$(chroot "$tmp" "$p" 1 = 1 ] && echo ok) ;;
			pwd) got=$(cd / && chroot "$tmp" "$p" | sed 's|^/$|ok|') ;;
			true) got=$(chroot "$tmp" "$p" && echo ok) ;;
			false) got=$(chroot "$tmp" "$p" || echo ok) ;;
			kill) got=$(chroot "$tmp" "$p" -l 9 | sed 's/^KILL$/ok/') ;;
			esac
			[[ $got == ok ]] || { log "check failed: $p does not run in the new root (got ${got@Q})"; exit 1; }
		done
		got=$(chroot "$tmp" /usr/bin/env -i PATH=/usr/bin:/bin "$PYTHON" -c \
			'import json, ssl, sqlite3, hashlib, ctypes, decimal, zlib, lzma, bz2; print(json.dumps(2+2))') ||
			{ log "check failed: $PYTHON with its stdlib does not run in the new root"; exit 1; }
		[[ $got == 4 ]] || { log "check failed: python printed $got"; exit 1; }
		if ((with_node)); then
			chroot "$tmp" "$NODE" -e 'process.stdout.write(String(2+2))' | grep -qx 4 ||
				{ log "check failed: node does not run in the new root"; exit 1; }
		fi
	fi

	rm -rf "$out.old"
	[[ -e $out ]] && mv "$out" "$out.old"
	mv "$tmp" "$out"
	rm -rf "$out.old"
	trap - EXIT
	echo "$fingerprint" >"$out.stamp"
	log "built $out ($(du -sh "$out" | cut -f1), ${#list[@]} files)"
fi

# ---- pack ----------------------------------------------------------------------------------
pack() { # pack FLAG TARGET
	local flag=$1 target=$2 want="$fingerprint $tag"
	if [[ -e $target && -f $target.stamp && $(<"$target.stamp") == "$want" ]]; then
		log "$target is up to date"
		return
	fi
	mkdir -p "$(dirname "$target")"
	local digest
	digest=$(cd "$repo" && "$GO" run ./image/cmd/mkimage -rootfs "$out" "$flag" "$target" -tag "$tag" -workdir /workspace)
	echo "$want" >"$target.stamp"
	log "packed $target ($digest)"
}
[[ -z $oci ]] || pack -oci-layout "$(realpath -m "$oci")"
[[ -z $archive ]] || pack -docker-archive "$(realpath -m "$archive")"

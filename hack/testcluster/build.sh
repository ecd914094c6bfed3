#!/usr/bin/env bash
# build.sh: install (apt) and build (Go module proxy) everything the single-node test cluster needs.
# Idempotent: the Kubernetes binaries are built once into $AIRLOCK_K8S_CACHE/bin and reused while the
# version and flags stamp matches. Nothing here touches host networking.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.4}"
CACHE="${AIRLOCK_K8S_CACHE:-/var/cache/airlock-k8s}"
BIN="$CACHE/bin"
MOD="$CACHE/module"
COMPONENTS=(kube-apiserver kubelet kube-scheduler kube-controller-manager kubectl)

log() { printf '[build %s] %s\n' "$(date +%T)" "$*" >&2; }

install_apt() {
  local want=(etcd-server containerd runc containernetworking-plugins openssl iproute2 ipset iptables)
  local missing=()
  for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # --no-install-recommends: containerd must not pull in anything that starts a host service.
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  # The Debian package enables a system containerd; the cluster uses its own private instance.
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet containerd 2>/dev/null; then
    log "note: a system containerd is running; the test cluster does not use it"
  fi
}

stamp_want() {
  printf '%s %s CGO_ENABLED=0 -trimpath %s\n' "$K8S_VERSION" "$(go env GOVERSION)" "${COMPONENTS[*]}"
}

build_k8s() {
  local want; want="$(stamp_want)"
  if [[ -f "$BIN/.stamp" && "$(cat "$BIN/.stamp")" == "$want" ]]; then
    local ok=1
    for c in "${COMPONENTS[@]}"; do [[ -x "$BIN/$c" ]] || ok=0; done
    if ((ok)); then log "kubernetes $K8S_VERSION binaries cached in $BIN"; return; fi
  fi
  log "building kubernetes $K8S_VERSION (${COMPONENTS[*]}) — a clean build takes ~14 min"
  mkdir -p "$MOD" "$BIN"
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local staging_version="v0.${K8S_VERSION#v1.}"
  # k8s.io/kubernetes replaces its staging modules with ./staging/...; a throwaway module outside the
  # project replaces each with the published k8s.io/<name> release of the same minor.
  local gomod
  gomod="$(cd "$MOD" && GOFLAGS= go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')"
  [[ -f "$gomod" ]] || { log "cannot read k8s.io/kubernetes@$K8S_VERSION go.mod"; exit 1; }
  {
    echo "module airlock.local/k8sbuild"
    echo
    echo "go 1.24.0"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\t\1 => \1 '"$staging_version"'#p' "$gomod"
    echo ")"
  } >"$MOD/go.mod.new"
  if ! cmp -s "$MOD/go.mod.new" "$MOD/go.mod.base" 2>/dev/null; then
    cp "$MOD/go.mod.new" "$MOD/go.mod"; cp "$MOD/go.mod.new" "$MOD/go.mod.base"; rm -f "$MOD/go.sum"
  fi
  rm -f "$MOD/go.mod.new"
  local pkgs=()
  for c in "${COMPONENTS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  (cd "$MOD" && GOFLAGS=-mod=mod go get "${pkgs[@]/%/@$K8S_VERSION}" >/dev/null 2>&1 || GOFLAGS=-mod=mod go get "k8s.io/kubernetes@$K8S_VERSION")
  local ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  for c in "${COMPONENTS[@]}"; do
    log "go build $c"
    (cd "$MOD" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ld" -o "$BIN/$c.tmp" "k8s.io/kubernetes/cmd/$c")
    mv "$BIN/$c.tmp" "$BIN/$c"
  done
  echo "$want" >"$BIN/.stamp"
  log "built: $("$BIN/kube-apiserver" --version)"
}

# helm, pinned by hack/tools (the same module the chart tests build it from), cached beside the
# Kubernetes binaries and rebuilt when that module changes.
build_helm() {
  local tools; tools="$(cd "$(dirname "$0")/../tools" && pwd)"
  local want; want="$(sha256sum "$tools/go.sum" | cut -c1-12) $(go env GOVERSION)"
  if [[ -x "$BIN/helm" && -f "$BIN/.helm-stamp" && "$(cat "$BIN/.helm-stamp")" == "$want" ]]; then
    log "helm cached in $BIN"; return
  fi
  log "go build helm (hack/tools)"
  mkdir -p "$BIN"
  (cd "$tools" && CGO_ENABLED=0 go build -trimpath -o "$BIN/helm.tmp" helm.sh/helm/v4/cmd/helm)
  mv "$BIN/helm.tmp" "$BIN/helm"
  echo "$want" >"$BIN/.helm-stamp"
}

# kube-router, run with only its network policy controller: the bridge CNI enforces no
# NetworkPolicy, and kube-router's does it with iptables + ipset (kube-network-policies needs
# the kernel's nft "queue" expression, CONFIG_NFT_QUEUE, which this kernel lacks). Pinned here;
# `go install` builds it from the Go module proxy.
KUBE_ROUTER_VERSION="${KUBE_ROUTER_VERSION:-v2.1.0}"
build_kube_router() {
  local want; want="$KUBE_ROUTER_VERSION $(go env GOVERSION)"
  if [[ -x "$BIN/kube-router" && -f "$BIN/.kube-router-stamp" && "$(cat "$BIN/.kube-router-stamp")" == "$want" ]]; then
    log "kube-router cached in $BIN"; return
  fi
  log "go install kube-router $KUBE_ROUTER_VERSION — a clean build takes ~9 min"
  mkdir -p "$BIN" "$CACHE/gobin"
  (cd "$CACHE" && CGO_ENABLED=0 GOFLAGS= GOBIN="$CACHE/gobin" go install -trimpath \
    "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION")
  mv "$CACHE/gobin/kube-router" "$BIN/kube-router"
  echo "$want" >"$BIN/.kube-router-stamp"
}

install_apt
build_k8s
build_helm
build_kube_router

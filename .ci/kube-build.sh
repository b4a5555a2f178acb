#!/usr/bin/env bash
# Builds the Kubernetes binaries the test cluster needs (.ci/kube-up.sh) from the Go module
# proxy: kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy and
# kube-router (only its NetworkPolicy controller is run: the bridge CNI plugin enforces
# no policy). No kubectl: the tests use the Python client. Idempotent: binaries of the
# wanted versions already in $SK_KUBE_BIN are kept.
#
#   .ci/kube-build.sh            # prints the folder of the binaries on its last line
#
# Settings (environment): SK_KUBE_VERSION (1.34.4), SK_KUBE_ROUTER_VERSION (2.1.0),
# SK_KUBE_BIN (/var/cache/sk-kube/bin), SK_KUBE_WORK (/var/cache/sk-kube/build).
# Kubernetes 1.34: the newest line whose kubelet still runs on cgroup v1 by default and
# speaks to containerd 1.6 (Debian 12's). kube-router, not kube-network-policies: the
# latter needs the kernel's nftables "queue" expression, which these machines' kernel
# lacks; kube-router's policies are iptables rules and ipsets (k3s embeds the same
# controller). Its advisories concern its service proxy, which is not run.
set -euo pipefail
version=${SK_KUBE_VERSION:-1.34.4}
router_version=${SK_KUBE_ROUTER_VERSION:-2.1.0}
bin=${SK_KUBE_BIN:-/var/cache/sk-kube/bin}
work=${SK_KUBE_WORK:-/var/cache/sk-kube/build}
export GOTOOLCHAIN=${GOTOOLCHAIN:-local} GOFLAGS=-mod=mod CGO_ENABLED=0
command -v go >/dev/null || { echo "kube-build: Go is missing (Debian: golang-go >= 1.24)"; exit 1; }
mkdir -p "$bin" "$work"
stamp="$bin/.versions"
want="kubernetes $version kube-router $router_version"
programs=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kube-router)
have_all() { for p in "${programs[@]}"; do [ -x "$bin/$p" ] || return 1; done; }
if have_all && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "kube-build: binaries for $want already in $bin"
  echo "$bin"
  exit 0
fi
start=$SECONDS

# Kubernetes itself: a wrapper module that requires k8s.io/kubernetes and points every
# staging module (a relative replace in its go.mod, which Go ignores in a dependency) at
# its published version.
k8s="$work/kubernetes-$version"
mkdir -p "$k8s"
cd "$k8s"
minor=${version#*.}
minor=${minor%%.*}
staging_version="v0.${version#*.}"
kmod=$(go mod download -json "k8s.io/kubernetes@v$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
[ -f "$kmod" ] || { echo "kube-build: could not download k8s.io/kubernetes v$version"; exit 1; }
{
  echo "module sk-kube-build"
  echo
  echo "go $(sed -n 's/^go //p' "$kmod")"
  echo
  echo "require k8s.io/kubernetes v$version"
  echo
  echo "replace ("
  sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\t\1 => \1 '"$staging_version"'#p' "$kmod"
  echo ")"
} >go.mod
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$version \
  -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
  -X k8s.io/component-base/version.gitTreeState=clean"
packages=()
for p in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
  packages+=("k8s.io/kubernetes/cmd/$p")
done
echo "kube-build: building Kubernetes v$version (${packages[*]##*/}) in $k8s"
go build -trimpath -ldflags "$ldflags" -o "$bin/" "${packages[@]}"
echo "kube-build: Kubernetes built in $((SECONDS - start)) s"

# kube-router: its own module (it needs other client versions than Kubernetes').
router_start=$SECONDS
kr="$work/kube-router-$router_version"
mkdir -p "$kr"
cd "$kr"
printf 'module sk-kube-router-build\n\ngo 1.21\n\nrequire github.com/cloudnativelabs/kube-router/v2 v%s\n' \
  "$router_version" >go.mod
go build -trimpath -ldflags "-s -w" -o "$bin/kube-router" github.com/cloudnativelabs/kube-router/v2/cmd/kube-router
echo "kube-build: kube-router built in $((SECONDS - router_start)) s"
echo "$want" >"$stamp"
echo "kube-build: all built in $((SECONDS - start)) s ($(du -sh "$bin" | cut -f1) of binaries)"
echo "$bin"

#!/usr/bin/env bash
# Builds what a local node runs besides the kubelet: containerd (with its runc shim and ctr),
# runc, the CNI plugins, CoreDNS (cluster DNS) and a static pause binary, all from Go modules
# (and a few lines of C for pause). CoreDNS is its release with only the plugins the local
# cluster uses (hack/node/coredns; go.sum pins the contents). The kubelet, kube-scheduler and
# kubemark come from the Kubernetes module (hack/build-controlplane.sh).
#
# Cached under $CACHE/node/<versions>-<hash of this script>/bin: a second run builds nothing.
# Prints that directory on its last line.
set -euo pipefail
cd "$(dirname "$0")"

CONTAINERD=v2.2.9   # containerd 2.x: Kubernetes 1.36 supports containerd 1.x no longer
RUNC=v1.3.6
CNI=v1.9.1
COREDNS=$(sed -n 's/^require github.com\/coredns\/coredns //p' node/coredns/go.mod)  # its pin

CACHE=${ETOPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/etoperator}
id=$(cat build-node.sh node/pause.c node/coredns/* | sha256sum | cut -c1-12)
OUT="$CACHE/node/containerd-$CONTAINERD-runc-$RUNC-cni-$CNI-coredns-$COREDNS-$id/bin"
BINS=(containerd containerd-shim-runc-v2 ctr runc coredns pause
      cni/bridge cni/host-local cni/loopback cni/portmap)

have_all() {
    local b
    for b in "${BINS[@]}"; do [ -x "$OUT/$b" ] || return 1; done
}
if have_all; then
    echo "$OUT"
    exit 0
fi
command -v go >/dev/null || { echo "build-node: go is not installed" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/etoperator-node.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin/cni"
start=$SECONDS
echo "build-node: containerd $CONTAINERD, runc $RUNC, CNI $CNI, CoreDNS $COREDNS (cold: 2-6 min)" >&2

# No debug information compiled (the linker's -w drops it anyway): 12 % less to build.
export GOFLAGS=-gcflags=all=-dwarf=false
# containerd without the storage drivers that need cgo or kernel headers we do not use.
CGO_ENABLED=0 GOBIN="$tmp/bin" go install -trimpath -ldflags "-s -w" \
    -tags "no_btrfs no_zfs no_devmapper no_aufs" \
    "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD" \
    "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD"
# runc needs cgo for seccomp (libseccomp-dev).
CGO_ENABLED=1 GOBIN="$tmp/bin" go install -trimpath -ldflags "-s -w" -tags seccomp \
    "github.com/opencontainers/runc@$RUNC"
CGO_ENABLED=0 GOBIN="$tmp/bin/cni" go install -trimpath -ldflags "-s -w" \
    "github.com/containernetworking/plugins/plugins/main/bridge@$CNI" \
    "github.com/containernetworking/plugins/plugins/main/loopback@$CNI" \
    "github.com/containernetworking/plugins/plugins/ipam/host-local@$CNI" \
    "github.com/containernetworking/plugins/plugins/meta/portmap@$CNI"
(cd node/coredns && CGO_ENABLED=0 GOFLAGS="$GOFLAGS -mod=readonly" \
    go build -trimpath -ldflags "-s -w" -o "$tmp/bin/coredns" .)
cc -static -Os -o "$tmp/bin/pause" node/pause.c

mkdir -p "$(dirname "$OUT")"
rm -rf "$OUT"
mv "$tmp/bin" "$OUT"
echo "build-node: built in $((SECONDS - start)) s" >&2
echo "$OUT"

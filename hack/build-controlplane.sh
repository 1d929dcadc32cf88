#!/usr/bin/env bash
# Builds the Kubernetes binaries the tests and the local cluster run, all from Go modules
# (hack/controlplane/*/go.mod pin the versions; go.sum pins the contents): the control plane
# (etcd, kube-apiserver, kube-controller-manager, kube-scheduler), kubectl, the node's kubelet
# and kube-proxy, and kubemark (hollow nodes: the real kubelet with a fake runtime).
#
# Binaries are cached per version and content under $CACHE/controlplane/k8s-<version>-etcd-
# <version>-<hash>/bin: a second run builds nothing. Prints that directory on its last line.
set -euo pipefail
cd "$(dirname "$0")/controlplane"

CACHE=${ETOPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/etoperator}
K8S=$(sed -n 's/^require k8s.io\/kubernetes v//p' kubernetes/go.mod)
ETCD=$(sed -n 's/^require go.etcd.io\/etcd\/server\/v3 v//p' etcd/go.mod)
id=$(cat ../build-controlplane.sh kubernetes/go.sum etcd/go.sum etcd/main.go | sha256sum | cut -c1-12)
OUT="$CACHE/controlplane/k8s-$K8S-etcd-$ETCD-$id/bin"
K8S_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy kubemark)
BINS=("${K8S_BINS[@]}" etcd)

have_all() {
    local b
    for b in "${BINS[@]}"; do [ -x "$OUT/$b" ] || return 1; done
}
if have_all; then
    echo "$OUT"
    exit 0
fi
command -v go >/dev/null || { echo "build-controlplane: go is not installed" >&2; exit 1; }

mkdir -p "$OUT"
tmp=$(mktemp -d "$OUT/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# No debug information compiled (the linker's -w drops it anyway): 12 % less to build.
export CGO_ENABLED=0 GOFLAGS="-mod=readonly -gcflags=all=-dwarf=false"
minor=${K8S#*.}; minor=${minor%%.*}
v=k8s.io/component-base/version
# What `kubectl version` and /version report: the release, not "v0.0.0-master".
ldflags="-s -w -X $v.gitVersion=v$K8S -X $v.gitMajor=1 -X $v.gitMinor=$minor \
 -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"

start=$SECONDS
echo "build-controlplane: building Kubernetes v$K8S and etcd v$ETCD (cold: 6-15 min on two cores)" >&2
(cd kubernetes && go build -trimpath -ldflags "$ldflags" -o "$tmp/" \
    "${K8S_BINS[@]/#/k8s.io/kubernetes/cmd/}")
(cd etcd && go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" .)
for b in "${BINS[@]}"; do mv "$tmp/$b" "$OUT/"; done
echo "build-controlplane: built in $((SECONDS - start)) s" >&2
echo "$OUT"

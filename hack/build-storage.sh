#!/usr/bin/env bash
# Builds the local-path provisioner (github.com/rancher/local-path-provisioner, what kind ships)
# from its Go module, as released: the local cluster's dynamic provisioning of volumes, in its
# shared-filesystem mode (ReadWriteMany: every node of the local cluster shares this machine's
# disk, as every node of a real cluster mounts the same NFS export or file share).
#
# Cached per version and content under $CACHE/storage/local-path-<version>-<hash>: a second run
# builds nothing. Prints that directory on its last line (bin/local-path-provisioner).
set -euo pipefail
cd "$(dirname "$0")"

VERSION=${LOCAL_PATH_VERSION:-v0.0.30}
CACHE=${ETOPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/etoperator}
id=$(cat build-storage.sh | sha256sum | cut -c1-12)
OUT="$CACHE/storage/local-path-$VERSION-$id"
if [ -x "$OUT/bin/local-path-provisioner" ]; then
    echo "$OUT"
    exit 0
fi
command -v go >/dev/null || { echo "build-storage: go is not installed" >&2; exit 1; }

mkdir -p "$CACHE/storage"
tmp=$(mktemp -d "$CACHE/storage/.build.XXXXXX")
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
start=$SECONDS
echo "build-storage: building local-path-provisioner $VERSION (cold: about a minute)" >&2
mkdir -p "$tmp/out/bin"
GOBIN="$tmp/out/bin" CGO_ENABLED=0 GOFLAGS="-buildvcs=false -gcflags=all=-dwarf=false" \
    go install -trimpath -ldflags "-s -w" "github.com/rancher/local-path-provisioner@$VERSION"
rm -rf "$OUT"
mv "$tmp/out" "$OUT"
echo "build-storage: built in $((SECONDS - start)) s" >&2
echo "$OUT"

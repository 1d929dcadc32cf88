#!/usr/bin/env bash
# One-command set-up: system packages, the Kubernetes binaries and the node's runtime (built
# from Go modules), the images (built from the shipped Dockerfiles), and a virtualenv with
# torch 2.13.0, the project's Horovod build and the test tools.
#
# Idempotent, and cached across checkouts: the virtualenv lives under
# ~/.cache/etoperator/venvs/<hash of requirements.lock and the Horovod build>, and .venv links to
# it, so a fresh clone of the same lock (CI) installs nothing. The project itself is not
# installed there: it is imported from the checkout (python -m ... from its root).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
CACHE=${ETOPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/etoperator}
t0=$SECONDS
step() { echo "setup: $* ($((SECONDS - t0)) s)"; }

need_apt=()
[ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
command -v ssh >/dev/null || need_apt+=(openssh-client)
command -v pgrep >/dev/null || need_apt+=(procps)
command -v cmake >/dev/null || need_apt+=(cmake)
command -v unshare >/dev/null || need_apt+=(util-linux)
command -v curl >/dev/null || need_apt+=(curl)
# Real nodes: namespaces and links (iproute2, util-linux), iptables for kube-proxy and the CNI
# bridge, libseccomp for runc, and images without a registry (mmdebstrap, buildah).
command -v ip >/dev/null || need_apt+=(iproute2)
command -v iptables >/dev/null || need_apt+=(iptables)
command -v mmdebstrap >/dev/null || need_apt+=(mmdebstrap)
command -v buildah >/dev/null || need_apt+=(buildah)
[ -f /usr/include/seccomp.h ] || need_apt+=(libseccomp-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
    step "installing ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
mkdir -p /run/sshd
[ -f /etc/ssh/ssh_host_ed25519_key ] || ssh-keygen -A >/dev/null

# The virtualenv is made beside the Go builds: its downloads (torch with its CUDA libraries, a
# few GB) overlap their compiling, and the base and operator images (60 s alone) are made beside
# it; then the training image (its Horovod wheel is the virtualenv's). The Go builds end first
# since they collect less garbage (860 s against the images' 907, 2026-11-30): this path is the
# longer one. The pause image needs the node binaries: last.
lock_id=$(cat requirements.lock hack/build-horovod.sh | sha256sum | cut -c1-16)
venv="$CACHE/venvs/$("$PY" -c 'import sys; print("py%d.%d" % sys.version_info[:2])')-$lock_id"
make_venv() {
    rm -rf "$venv"
    "$PY" -m venv "$venv"
    pip() { "$venv/bin/python" -m pip --disable-pip-version-check -q "$@"; }
    # torch first and pinned: anything that lets pip choose pulls another build (gigabytes).
    pip install "$(grep '^torch==' requirements.lock)"
    pip install -r requirements.lock
    echo "setup: building or reusing Horovod"
    wheel=$(hack/build-horovod.sh "$venv/bin/python" | tail -n 1)
    pip install --no-deps "$wheel"
    "$venv/bin/python" -c 'import horovod.torch as hvd; assert hvd.gloo_built()'
    touch "$venv/.complete"
}
beside() {  # the virtualenv beside the base and operator images, then the training image
    hack/build-images.sh --base >"$CACHE/base.log" 2>&1 &
    local base_pid=$!
    [ -f "$venv/.complete" ] || make_venv
    wait "$base_pid" || { cat "$CACHE/base.log"; return 1; }
    cat "$CACHE/base.log"
    echo "setup: virtualenv, base and operator images ready; the training image"
    hack/build-images.sh ""
}
mkdir -p "$CACHE"
step "the virtualenv $venv and the images, beside the builds (their log: $CACHE/beside.log)"
beside >"$CACHE/beside.log" 2>&1 &
beside_pid=$!
trap '[ -z "$beside_pid" ] || { pkill -P "$beside_pid"; kill "$beside_pid"; } 2>/dev/null || true' EXIT

# The Kubernetes binaries (control plane, kubelet, kube-proxy, kubemark, kubectl) and etcd; then
# what a node runs beside them (containerd, runc, CNI, CoreDNS, pause), Kueue, and the images.
# Go's caches are kept apart from the user's and removed once the binaries are (7 GB). Where
# memory allows, in memory (/dev/shm): 7 GB not written to disk, and removed in moments (from
# the disk, 15 s at set-up's end). A set-up killed midway leaves them: the next builds on them
# and removes them, as `make clean` does.
mem_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
shm_kb=$(df -k --output=avail /dev/shm 2>/dev/null | tail -n 1 || echo 0)
go_dir="$CACHE/go"
if [ "${mem_kb:-0}" -ge $((20 * 1024 * 1024)) ] && [ "${shm_kb:-0}" -ge $((10 * 1024 * 1024)) ]; then
    go_dir=/dev/shm/etoperator-go
fi
export GOCACHE="$go_dir/build" GOMODCACHE="$go_dir/mod"
# Where memory allows, the compiler and linker collect garbage only as a process nears 3 GiB:
# (measured from cold: client-go and the apiserver's library 203 s of CPU at Go's default, 162
# at GOGC=400; kubectl with kube-scheduler 306 s at GOGC=400, 278 this way, the largest process
# 1.2 GB either way). Two run at a time: at most 6 GiB, beside the virtualenv's build.
[ "${mem_kb:-0}" -lt $((16 * 1024 * 1024)) ] || export GOGC=off GOMEMLIMIT=3GiB
bin=$(hack/build-controlplane.sh | tail -n 1)
step "Kubernetes binaries in $bin"
node_bin=$(hack/build-node.sh | tail -n 1)
step "node binaries in $node_bin"
# The provisioner beside Kueue: two small builds, each leaving a core idle while it links.
hack/build-storage.sh >"$CACHE/storage.out" &
storage_pid=$!
kueue=$(hack/build-kueue.sh | tail -n 1)
step "Kueue in $kueue"
wait "$storage_pid"
storage=$(tail -n 1 "$CACHE/storage.out")
step "the local-path provisioner in $storage"
# 7 GB of files to remove: beside the rest of set-up (with what a set-up killed meanwhile left).
[ ! -d "$go_dir" ] || mv "$go_dir" "$go_dir.gone.$$"
shopt -s nullglob
gone=("$CACHE"/go.gone.* /dev/shm/etoperator-go.gone.*)
shopt -u nullglob
gone_pid=
if [ ${#gone[@]} -gt 0 ]; then
    (chmod -R u+w "${gone[@]}" && rm -rf "${gone[@]}") &
    gone_pid=$!
fi
if ! wait "$beside_pid"; then
    beside_pid=
    tail -n 40 "$CACHE/beside.log" >&2
    echo "setup: the virtualenv or the images failed (above: the end of $CACHE/beside.log)" >&2
    exit 1
fi
beside_pid=
step "virtualenv and images but the pause image ready"
images=$(hack/build-images.sh "$node_bin" | tail -n 1)
step "images in $images"
# buildah keeps each image a rebuild replaced (untagged); the archives hold what nodes run.
dangling=$(buildah images --filter dangling=true --noheading --format '{{.ID}}')
[ -z "$dangling" ] || buildah rmi $dangling >/dev/null 2>&1 || true

if [ ! -L .venv ] || [ "$(readlink .venv)" != "$venv" ]; then
    rm -rf .venv
    ln -s "$venv" .venv
fi
# What set-up built for another lock or version goes once no set-up has used it for two days
# (another checkout set up meanwhile keeps its own): a virtualenv (5 GB: torch with its CUDA
# libraries), a set of binaries (0.9 GB; an edit of a build script or a pin builds a new one).
prune() {  # DIR KEEP: DIR's entries but KEEP, where nothing was touched for two days
    local entry
    for entry in "$1"/*/; do
        entry=${entry%/}
        [ -d "$entry" ] && [ "$entry" != "$2" ] \
            && [ -z "$(find "$entry" -maxdepth 1 -mmin -2880 -print -quit)" ] || continue
        step "removing $entry (not used for two days)"
        chmod -R u+w "$entry" && rm -rf "$entry"
    done
}
touch "$venv/.used" "${bin%/bin}" "${node_bin%/bin}" "$kueue" "$storage"
prune "$CACHE/venvs" "$venv"
prune "$CACHE/controlplane" "${bin%/bin}"
prune "$CACHE/node" "${node_bin%/bin}"
prune "$CACHE/kueue" "$kueue"
prune "$CACHE/storage" "$storage"
[ -z "$gone_pid" ] || { wait "$gone_pid"; step "removed the Go build caches"; }
step "done ($(.venv/bin/python -c 'import torch, horovod; print("torch", torch.__version__, "horovod", horovod.__version__)'))"

#!/usr/bin/env bash
# Builds the images the local cluster runs, without a registry or a container engine:
#   - a Python 3.11 base from Debian's packages (mmdebstrap), standing in for python:3.11-slim
#     (python3 with its headers and pip, `python` and `pip` on PATH);
#     it trusts the CA certificates this machine added locally (/usr/local/share/ca-certificates),
#     so that builds behind an HTTPS-inspecting proxy can reach PyPI;
#   - the training image from examples/Dockerfile.train and the operator image from
#     deploy/Dockerfile, each from the Dockerfile as shipped with only BASE passed in (buildah);
#   - the pod sandbox's pause image (hack/node/pause.c, built by hack/build-node.sh).
# Each image is saved as an uncompressed docker-archive under $CACHE/images/, named by the hash
# of everything it is built from: a second run with the same inputs builds nothing.
#
# Usage: hack/build-images.sh NODE_BIN   Prints the archive directory on its last line.
# With NODE_BIN empty, every image but the pause image (set-up builds them beside the Go builds,
# before the node binaries are there); `current` is written only with it. With NODE_BIN
# `--base`, the base and operator images only (set-up builds them beside the virtualenv: they
# need nothing of it).
set -euo pipefail
shopt -s inherit_errexit  # a failed build inside $(...) fails the script
cd "$(dirname "$0")/.."

NODE_BIN=$1
CACHE=${ETOPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/etoperator}
OUT="$CACHE/images"
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$OUT"
# One build at a time on this machine: clusters starting side by side (the suite's workers, a
# demo) wait for the first to finish instead of building the same image twice.
exec 9>"$OUT/.build.lock"
flock 9
rm -f "$OUT"/*.part  # what a build killed midway left (none runs now: the lock is ours)
start=$SECONDS
say() { echo "build-images: $* ($((SECONDS - start)) s)" >&2; }
BUD=(buildah bud --isolation chroot --network host --pull=never --layers --quiet)

# Content hashes: a file list's contents, or a directory's files (sorted by name).
# requirements.lock counts up to its test tools' section: no image installs those.
pins=$(mktemp -d)/requirements.lock
trap 'rm -rf "$(dirname "$pins")"' EXIT
sed '/^# --- test tools/,$d' requirements.lock > "$pins"
hash_of() { for f in "$@"; do find "$f" -type f -not -name '*.pyc' | LC_ALL=C sort; done \
    | xargs cat | sha256sum | cut -c1-12; }

# The archive of buildah's image REF, named NAME in it, from inputs hashing to H: kept, or built
# by the command that follows.
archive() {
    local ref=$1 name=$2 h=$3; shift 3
    local file="$OUT/${name//[\/:]/_}-$h.tar"
    if [ ! -f "$file" ]; then
        "$@"
        rm -f "$OUT/${name//[\/:]/_}"-*.tar
        buildah push --quiet --disable-compression "$ref" "docker-archive:$file.part:$name" >/dev/null
        mv "$file.part" "$file"
        # The archive is what nodes import: buildah keeps only the base (builds start from it;
        # pulled back from its archive when missing), not a second copy of each image (6 GB).
        [ "$ref" = "$base_ref" ] || buildah rmi "$ref" >/dev/null 2>&1 || true
        say "$ref saved"
    fi
    echo "$file"
}

base_ref=localhost/etoperator/python-base:3.11-$SUITE
cas=$(ls /usr/local/share/ca-certificates/*.crt 2>/dev/null || true)
build_base() {
    say "base image from Debian $SUITE (mmdebstrap)"
    local tmp; tmp=$(mktemp -d)
    mkdir -p "$tmp/ca"; [ -z "$cas" ] || cp $cas "$tmp/ca/"
    mmdebstrap --quiet --variant=minbase \
        --include=python3,python3-dev,python3-pip,python3-venv,ca-certificates \
        --customize-hook="cp $tmp/ca/. \"\$1/usr/local/share/ca-certificates/\" -r" \
        --customize-hook='chroot "$1" update-ca-certificates >/dev/null 2>&1' \
        --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
        --customize-hook='ln -sf python3 "$1/usr/bin/python"; ln -sf pip3 "$1/usr/bin/pip"' \
        "$SUITE" "$tmp/rootfs.tar" "$MIRROR"
    local c; c=$(buildah from scratch)
    buildah add --quiet "$c" "$tmp/rootfs.tar" / >/dev/null
    buildah config --cmd '["python3"]' --env LANG=C.UTF-8 \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$c"
    buildah commit --quiet "$c" "$base_ref" >/dev/null
    buildah rm "$c" >/dev/null
    rm -rf "$tmp"
}
# The base is named by what makes it (its function's text, the suite, the mirror, the CAs), not
# by this whole script: an edit elsewhere here rebuilds no image.
base_hash=$(printf '%s\n' "$SUITE" "$MIRROR" "$(declare -f build_base)" | cat - $cas | sha256sum | cut -c1-12)
base_tar=$(archive "$base_ref" "$base_ref" "$base_hash" build_base)
buildah inspect "$base_ref" >/dev/null 2>&1 || buildah pull --quiet "docker-archive:$base_tar" >/dev/null

bud() {  # REF DOCKERFILE: a shipped Dockerfile, built on our base
    say "building $1 from $2"
    "${BUD[@]}" --build-arg "BASE=$base_ref" -f "$2" -t "$1" . >&2
}
# Named as the examples and deploy/ name them (docker.io/ is what a bare name means).
operator_ref=localhost/etoperator/operator:0.1.0
operator_hash=$(hash_of deploy/Dockerfile "$pins" pyproject.toml README.md etoperator \
    | cat - <(echo "$base_hash") | sha256sum | cut -c1-12)
operator_tar=$(archive "$operator_ref" docker.io/etoperator/operator:0.1.0 "$operator_hash" bud "$operator_ref" deploy/Dockerfile)
if [ "$NODE_BIN" = --base ]; then
    say "the base and operator images ready"
    echo "$OUT"
    exit 0
fi

pause_ref=localhost/etoperator/pause:local
build_pause() {
    local c; c=$(buildah from scratch)
    buildah copy --quiet "$c" "$NODE_BIN/pause" /pause >/dev/null
    buildah config --entrypoint '["/pause"]' "$c"
    buildah commit --quiet "$c" "$pause_ref" >/dev/null
    buildah rm "$c" >/dev/null
}
pause_tar=
[ -z "$NODE_BIN" ] || pause_tar=$(archive "$pause_ref" "$pause_ref" "$(hash_of "$NODE_BIN/pause")" build_pause)

# Horovod is compiled once on this machine: the virtualenv's wheel (same script, same torch)
# goes where the training image's build looks for it, the directory of its cache mount
# (/root/.cache/etoperator) under buildah's cache root, when this host is the base's Debian
# release, whose python3 is 3.11 (the wheel links against its libc and CPython's ABI).
# Elsewhere, or with a buildah that keeps its cache mounts another way, the image compiles it.
BUILDAH_CACHE_MOUNT=${TMPDIR:-/var/tmp}/buildah-cache/root/.cache/etoperator
seed_horovod() {
    local codename torch wheels
    codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
    [ "$codename" = "$SUITE" ] || return 0
    torch=$(sed -n 's/^torch==//p' "$pins")
    wheels="wheels/torch-$torch-$(sha256sum hack/build-horovod.sh | cut -c1-12)"
    for wheel in "$CACHE/$wheels"/horovod-*-cp311-cp311-linux_x86_64.whl; do
        [ -f "$wheel" ] || continue
        mkdir -p "$BUILDAH_CACHE_MOUNT/$wheels"
        cp -n "$wheel" "$BUILDAH_CACHE_MOUNT/$wheels/"
        say "Horovod's wheel from the virtualenv's build: $wheel"
    done
}
seed_horovod
train_ref=localhost/etoperator/train:latest
train_hash=$(hash_of examples/Dockerfile.train examples/*.py examples/torchrun/*.py examples/image hack/build-horovod.sh "$pins" | cat - <(echo "$base_hash") | sha256sum | cut -c1-12)
train_tar=$(archive "$train_ref" docker.io/etoperator/train:latest "$train_hash" bud "$train_ref" examples/Dockerfile.train)

# What the node imports: one archive per line, then the directory.
if [ -n "$pause_tar" ]; then
    printf '%s\n' "$pause_tar" "$train_tar" "$operator_tar" > "$OUT/current"
    say "images ready"
else
    say "images but the pause image ready"
fi
echo "$OUT"

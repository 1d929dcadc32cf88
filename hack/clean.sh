#!/usr/bin/env bash
# `make clean`: removes everything the project put on this machine outside the checkout (the
# cached binaries, images, virtualenvs and node stores under $CACHE, buildah's images of ours,
# the .venv link) and says how much that freed. `make setup` builds it all again.
# It refuses while a local cluster runs (a demo, a test run): `make demo-down` first.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${ETOPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/etoperator}
LOCKS=/run/etoperator-slots

# A running cluster holds its slot's lock: try each one.
for lock in "$LOCKS"/slot-*.lock; do
    [ -e "$lock" ] || continue
    if ! flock -n "$lock" true; then
        echo "clean: a local cluster is running (${lock##*/}): stop it first (make demo-down)" >&2
        exit 2
    fi
done

used() { df -B1 --output=used / | tail -n 1; }
before=$(used)
gone=()
if [ -d "$CACHE" ]; then
    chmod -R u+w "$CACHE" 2>/dev/null || true  # Go's module cache is read-only
    rm -rf "$CACHE"
    gone+=("$CACHE")
fi
if command -v buildah >/dev/null; then
    ours=$(buildah images --format '{{.Name}}:{{.Tag}}' 2>/dev/null | grep '^localhost/etoperator/' || true)
    if [ -n "$ours" ]; then
        # shellcheck disable=SC2086
        buildah rmi $ours >/dev/null
        buildah rmi --prune >/dev/null 2>&1 || true  # the layers only they used
        gone+=("buildah's images localhost/etoperator/*")
    fi
fi
# What the training image's build cached (its Horovod wheel): our cache mount's directory only.
mount=${TMPDIR:-/var/tmp}/buildah-cache/root/.cache/etoperator
if [ -d "$mount" ]; then
    rm -rf "$mount"
    gone+=("$mount")
fi
# Go's caches of a set-up killed midway, kept in memory (hack/setup.sh).
for d in /dev/shm/etoperator-go /dev/shm/etoperator-go.gone.*; do
    [ -d "$d" ] || continue
    chmod -R u+w "$d" 2>/dev/null || true
    rm -rf "$d"
    gone+=("$d")
done
if [ -L .venv ]; then
    rm -f .venv
    gone+=(".venv")
fi
rm -rf "$LOCKS"
freed=$(( (before - $(used)) / 1024 / 1024 ))
if [ ${#gone[@]} -eq 0 ]; then
    echo "clean: nothing to remove"
else
    printf 'clean: removed %s\n' "${gone[@]}"
    echo "clean: freed $freed MiB; \`make setup\` builds it all again"
fi

#!/usr/bin/env bash
# One-command set-up: system packages, a virtualenv with the operator and its test tools,
# torch 2.13.0 (CPU) and the project's Horovod build. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${VENV:-.venv}

need_apt=()
[ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
command -v ssh >/dev/null || need_apt+=(openssh-client)
command -v pgrep >/dev/null || need_apt+=(procps)
command -v cmake >/dev/null || need_apt+=(cmake)
command -v kubectl >/dev/null || need_apt+=(kubernetes-client)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
mkdir -p /run/sshd

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
# torch first and pinned: anything that lets pip choose pulls a newer CUDA build (gigabytes).
if ! "$VENV/bin/python" -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null; then
    echo "setup: installing torch 2.13.0 (CPU)"
    pip install "torch==2.13.0"
fi
pip install numpy cloudpickle psutil pyyaml packaging setuptools wheel
pip install -e '.[dev]'

# Horovod: built once per machine (a few minutes), then taken from the cache.
if ! "$VENV/bin/python" -c 'import horovod.torch' 2>/dev/null; then
    wheel=$(hack/build-horovod.sh "$VENV/bin/python" | tail -n 1)
    pip install --no-deps "$wheel"
fi
"$VENV/bin/python" -c 'import horovod.torch as hvd; assert hvd.gloo_built()'
echo "setup: done ($("$VENV/bin/python" -c 'import torch, horovod; print("torch", torch.__version__, "horovod", horovod.__version__)'))"

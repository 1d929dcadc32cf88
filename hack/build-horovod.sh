#!/usr/bin/env bash
# Builds Horovod 0.28.1 (CPU, Gloo, no MPI) for torch 2.13.0 and caches the wheel.
#
# Horovod's last release asks CMake for C++14 while torch 2.13's headers need C++20, turns CUDA
# on whenever nvcc is found, and compiles debug information (-g) into its library; the three are
# patched here. Five behaviours are changed:
# - once a Gloo context is connected, its operations wait HOROVOD_GLOO_OP_TIMEOUT_SECONDS
#   (default 5) for a peer instead of the rendezvous timeout (HOROVOD_GLOO_TIMEOUT_SECONDS, 30):
#   when a worker dies, the ranks waiting on a survivor that stopped answering fail within
#   seconds and the elastic reset follows, while a new worker still has the rendezvous timeout
#   to start;
# - the elastic driver runs its host-discovery script (every second) as a plain child process:
#   upstream starts a new Python interpreter for each call (a `spawn` middleman), 0.2 s of CPU
#   a call on the launcher, 1-3 s on a loaded one, which also slowed how soon a host-list
#   change was seen. Its exit code and output are used as before;
# - the driver's notice of a host change to rank 0 gives up on a connect after 2 s (twice):
#   it is sent holding the lock the elastic reset needs, and a killed rank 0 never answers;
# - a Gloo pair that receives more than was posted for it fails with an I/O error (a reset),
#   where Gloo ended the process and Horovod blacklisted its healthy host;
# - a rank waiting for its operation to finish (torch's synchronize) spins only a moment, then
#   sleeps 100 us at a time: upstream spun the whole wait, most of a cycle (5 ms here), and that
#   spin was half of each rank's CPU, taken from the other ranks and pods of its node.
# The wheel is cached under this script's hash: an edit here builds a new one.
#
# Usage: hack/build-horovod.sh [PYTHON]   (PYTHON: an interpreter that already has torch 2.13.0)
# Prints the path of the wheel on its last line. HOROVOD_GPU=nccl builds for GPUs instead (in a
# CUDA image with nvcc and NCCL, examples/Dockerfile.train.gpu; not built on the CI machine,
# which has no GPU toolkit).
set -euo pipefail

PY=${1:-python3}
VERSION=0.28.1
CACHE=${ETOPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/etoperator}
TORCH=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')
GPU=${HOROVOD_GPU:-}
BUILD=$(sha256sum "$0" | cut -c1-12)
OUT="$CACHE/wheels/torch-$TORCH${GPU:+-$GPU}-$BUILD"
mkdir -p "$OUT"

existing=$(ls "$OUT"/horovod-"$VERSION"-*.whl 2>/dev/null | head -n 1 || true)
if [ -n "$existing" ]; then
    echo "$existing"
    exit 0
fi

if ! command -v cmake >/dev/null || ! cmake --version | head -n1 | grep -q ' 3\.'; then
    # CMake 4 refuses Gloo's old cmake_minimum_required; Debian's 3.x works.
    export CMAKE_POLICY_VERSION_MINIMUM=3.5
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PY" -m pip download --quiet --no-deps --no-binary :all: "horovod==$VERSION" -d "$work" >&2
tar -xzf "$work/horovod-$VERSION.tar.gz" -C "$work"
src="$work/horovod-$VERSION"

# C++ standard: torch's headers need C++20.
sed -i 's/^set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 20)/' "$src/CMakeLists.txt"
sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 20)/' "$src/horovod/torch/CMakeLists.txt"
grep -q 'CMAKE_CXX_STANDARD 20' "$src/horovod/torch/CMakeLists.txt"
# No debug information: upstream builds RelWithDebInfo (-O3 -g); -g over torch's headers was a
# sixth of the compile's CPU (242 -> 204 s here) and 62 of the library's 64 MB.
sed -i '/^string(REPLACE "-O2" "-O3" CMAKE_CXX_FLAGS_RELWITHDEBINFO/a string(REPLACE "-g" "" CMAKE_C_FLAGS_RELWITHDEBINFO "${CMAKE_C_FLAGS_RELWITHDEBINFO}")\nstring(REPLACE "-g" "" CMAKE_CXX_FLAGS_RELWITHDEBINFO "${CMAKE_CXX_FLAGS_RELWITHDEBINFO}")' "$src/CMakeLists.txt"
grep -q 'REPLACE "-g" "" CMAKE_CXX_FLAGS_RELWITHDEBINFO' "$src/CMakeLists.txt"

# Operations after the rendezvous: their own, shorter timeout.
"$PY" - "$src/horovod/common/gloo/gloo_context.cc" <<'PATCH'
import sys
path = sys.argv[1]
text = open(path).read()
op_timeout = """
std::chrono::milliseconds GetOpTimeoutFromEnv() {
  // How long a connected context's operations wait for a peer: a rank that stops answering
  // (its peer died, its loop is resetting) fails the others this soon, not after the
  // rendezvous timeout that a joining worker's start needs.
  auto s = std::chrono::seconds(GetIntEnvOrDefault("HOROVOD_GLOO_OP_TIMEOUT_SECONDS", 5));
  return std::chrono::duration_cast<std::chrono::milliseconds>(s);
}

std::shared_ptr<gloo::Context> Rendezvous("""
finalize = "  store->Finalize();\n  return context;\n"
assert text.count("\nstd::shared_ptr<gloo::Context> Rendezvous(") == 1
assert text.count(finalize) == 1
text = text.replace("\nstd::shared_ptr<gloo::Context> Rendezvous(", op_timeout, 1)
text = text.replace(finalize, "  store->Finalize();\n  context->setTimeout(GetOpTimeoutFromEnv());\n  return context;\n")
open(path, "w").write(text)
PATCH
# The discovery script: one child process a call, no new interpreter.
"$PY" - "$src/horovod/runner/elastic/discovery.py" <<'PATCH'
import sys
path = sys.argv[1]
text = open(path).read()
old = """        stdout = io.StringIO()
        exit_code = safe_shell_exec.execute(
            self._discovery_script, stdout=stdout)
        if exit_code != 0:
            raise RuntimeError(
                'Failed to execute discovery script: {}. Exit code: {}' .format(
                    self._discovery_script, exit_code))
        return stdout.getvalue()
"""
new = """        import subprocess
        out = subprocess.run(self._discovery_script, shell=True, stdout=subprocess.PIPE,
                             stdin=subprocess.DEVNULL)
        if out.returncode != 0:
            raise RuntimeError(
                'Failed to execute discovery script: {}. Exit code: {}' .format(
                    self._discovery_script, out.returncode))
        return out.stdout.decode(errors='replace')
"""
assert text.count(old) == 1
open(path, "w").write(text.replace(old, new))
PATCH
# Telling the coordinator (rank 0) of a host change: its connect bounded (2 s, twice). The
# driver does it holding the lock its reset needs; a killed rank 0's address answers nothing,
# so every reset waited out connects to it (53-86 s of a kill's recovery, or past 300 s).
"$PY" - "$src/horovod/runner/common/util/network.py" "$src/horovod/runner/elastic/worker.py" <<'PATCH'
import sys
net, worker = sys.argv[1:3]
text = open(net).read()
old = """            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.connect(addr)
                rfile = sock.makefile('rb')"""
new = """            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.settimeout(getattr(self, '_connect_timeout', None))
                sock.connect(addr)
                sock.settimeout(None)
                rfile = sock.makefile('rb')"""
assert text.count(old) == 1
open(net, "w").write(text.replace(old, new))
text = open(worker).read()
old = """                                                       match_intf=match_intf)
"""
new = """                                                       match_intf=match_intf)
        self._connect_timeout, self._attempts = 2.0, 2
"""
assert text.count(old) == 1
open(worker, "w").write(text.replace(old, new))
PATCH
# A peer's message larger than the receive posted for it (ranks out of step as a dead peer's
# reset begins): Gloo's check threw in its event loop's thread and ended the process
# (std::terminate), so Horovod blacklisted a healthy host for the rest of the run (seen: a
# rank-0 kill that took a second worker with it). The pair now fails as an I/O error does:
# the operation waiting on it raises, and the elastic reset follows.
"$PY" - "$src/third_party/gloo/gloo/transport/tcp/pair.cc" <<'PATCH'
import sys
path = sys.argv[1]
text = open(path).read()
bound = """    GLOO_ENFORCE_LE(op.preamble.roffset + op.preamble.length, op.buf->size_);
    return iov.iov_len;"""
bound_new = """    if (op.preamble.roffset + op.preamble.length > op.buf->size_) {
      signalException(GLOO_ERROR_MSG("Read of ", op.preamble.length, " bytes at ",
          op.preamble.roffset, " beyond a buffer of ", op.buf->size_, " from ", peer_.str()));
      return -1;
    }
    return iov.iov_len;"""
unbound = """    GLOO_ENFORCE_LE(op.preamble.length, op.nbytes);
    return iov.iov_len;"""
unbound_new = """    if (op.preamble.length > op.nbytes) {
      auto ex = std::make_exception_ptr(::gloo::IoException(GLOO_ERROR_MSG("Read of ",
          op.preamble.length, " bytes into a receive of ", op.nbytes, " from ", peer_.str())));
      buf->signalException(ex);  // taken off the pending receives: signal it as well
      signalException(ex);
      return -1;
    }
    return iov.iov_len;"""
for old, new in ((bound, bound_new), (unbound, unbound_new)):
    assert text.count(old) == 1
    text = text.replace(old, new)
open(path, "w").write(text)
PATCH
# Waiting on an operation (every handle of a step's synchronize): spin a moment, then sleep.
"$PY" - "$src/horovod/torch/mpi_ops_v2.cc" <<'PATCH'
import sys
path = sys.argv[1]
text = open(path).read()
old = """void WaitAndClear(int handle) {
  while (true) {
    if (handle_manager.PollHandle(handle)) break;
    {
      py::gil_scoped_release release_python_gil;
      std::this_thread::yield();
    }
  }
"""
new = """void WaitAndClear(int handle) {
  // An operation done within microseconds (most handles of a step, once the first is) is
  // seen at once; a longer wait, on the background loop's next cycle or on a peer, sleeps
  // 100 us at a time instead of spinning a core through it.
  for (int spins = 0; !handle_manager.PollHandle(handle); ++spins) {
    py::gil_scoped_release release_python_gil;
    if (spins < 200) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
"""
assert text.count(old) == 1
open(path, "w").write(text.replace(old, new))
PATCH
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=GLOO
if [ "$GPU" = nccl ]; then
    export HOROVOD_GPU_OPERATIONS=NCCL   # allreduce on the GPUs through NCCL
else
    # CPU only: never probe for a CUDA compiler or toolkit, even where nvcc is installed.
    sed -i 's/^check_language(CUDA)/set(CMAKE_CUDA_COMPILER "")/; s/^    check_language(CUDA)/    set(CMAKE_CUDA_COMPILER "")/' "$src/CMakeLists.txt"
    sed -i 's/^    find_package(CUDAToolkit)$/    set(CUDAToolkit_BIN_DIR "")/' "$src/CMakeLists.txt"
    ! grep -q '^check_language(CUDA)' "$src/CMakeLists.txt"
    export HOROVOD_GPU_OPERATIONS= HOROVOD_WITHOUT_GPU=1
fi
export MAKEFLAGS="-j$(nproc)"
"$PY" -m pip wheel --quiet --no-deps --no-build-isolation -w "$work/dist" "$src" >&2
cp "$work"/dist/horovod-"$VERSION"-*.whl "$OUT/"
ls "$OUT"/horovod-"$VERSION"-*.whl | head -n 1

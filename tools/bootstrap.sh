#!/usr/bin/env bash
# Installs every Debian package that building, running and testing hgemm-serve needs.
# Idempotent: apt runs only when a package is missing. Used by the README's commands, .ci/run
# and deploy/docker/Dockerfile, so there is one install path.
set -euo pipefail

packages=(
  bazel-bootstrap bazel-platforms          # Bazel 4.2.3, offline
  g++ ca-certificates
  protobuf-compiler libprotobuf-dev        # protoc
  protobuf-compiler-grpc libgrpc++-dev     # grpc_cpp_plugin, gRPC C++ (health, reflection)
  grpc-proto                               # health.proto, reflection.proto
  libabsl-dev                              # absl::Status (server/core/status.h)
  libspdlog-dev libfmt-dev                 # logging
  libssl-dev openssl                       # server/auth (libcrypto); test certificates
  nlohmann-json3-dev                       # --log_format=json (header only)
  libcli11-dev                             # flag parsing
  prometheus-cpp-dev                       # --metrics_listen (core + pull with civetweb)
  libopenblas-dev                          # CPU backend
  libgtest-dev libgmock-dev                # tests
  yamllint                                 # deploy/check.sh
  clang libclang-rt-14-dev                 # tools/fuzz.sh (libFuzzer, ASan, UBSan)
  clang-format                             # tools/format_check.sh
  python3-grpcio python3-numpy python3-protobuf   # client/python (the hgemm package)
  python3-pip python3-setuptools python3-wheel python3-venv  # pip install ./client/python
  patchelf                                 # client/python/bundle_libs.py (the portable wheel)
  python3-pytest python3-tqdm                     # tools/test_python.sh; transfer progress bars
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
command -v npm >/dev/null || missing+=(nodejs npm)  # deploy/check.sh (the image ships Node)
if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}" >&2
  sudo=; ((EUID == 0)) || sudo=sudo
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The CUDA toolkit is not a Debian package here: the build uses it where it is installed and
# otherwise builds the CPU backend alone (tools/bazel/cuda_configure.bzl).
cuda=${HGEMM_CUDA_PATH:-/usr/local/cuda}
if [[ ! -x $cuda/bin/nvcc ]]; then
  echo "bootstrap: no CUDA toolkit at $cuda (no bin/nvcc): building the CPU backend only" >&2
fi

#!/usr/bin/env bash
# The server's layering, checked on its sources: below the transport (server/core, session,
# scheduler, resident, backend) no source file, tests included, includes a protobuf or gRPC
# header, and no BUILD file there depends on the wire's libraries (the generated protobuf and
# gRPC code, proto/ring_execution.h over it, Debian's grpc and protobuf). The wire belongs to
# server/transport, which converts at its edge (server/transport/convert.h).
# Prints each offending line and fails; run by `bazel test //tools:layering_test`, or by hand
# on any tree:
#   tools/layering_test.sh [root]   (default root: the test's runfiles)
set -uo pipefail
shopt -s nullglob
root=${1:-${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-hgemm_serve}}
packages=(server/core server/session server/scheduler server/resident server/backend)
include='^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]'
include+='([^">]*\.pb\.h|grpcpp?/[^">]*|google/protobuf/[^">]*)[">]'
dependency='"(//proto:hgemm_cc_grpc|//proto:ring_execution|//proto/grpc(:[^"]*)?|'
dependency+='@system//:(grpc|protobuf)[^"]*)"'
broken=0
for package in "${packages[@]}"; do
  dir=$root/$package
  sources=("$dir"/*.h "$dir"/*.cc "$dir"/*.cu)
  if [[ ! -f $dir/BUILD || ${#sources[@]} -eq 0 ]]; then
    echo "layering: no sources of $package under $root"
    exit 2
  fi
  if grep -nHE "$include" "${sources[@]}"; then broken=1; fi
  if grep -nHE "$dependency" "$dir/BUILD"; then broken=1; fi
done
if ((broken)); then
  echo "layering: protobuf or gRPC below server/transport (lines above); convert at the" \
       "transport's edge (server/transport/convert.h) instead"
  exit 1
fi
echo "layering: ${packages[*]} are free of protobuf and gRPC"

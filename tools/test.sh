#!/usr/bin/env bash
# Every test: install what is missing, then `bazel test //...` (GoogleTest; tests that need a
# GPU skip without one), the server's tests again under ASan + UBSan and the threaded ones under
# TSan (.bazelrc configs asan, tsan), deploy/check.sh (lint and schema checks of the container
# and Kubernetes manifests), tools/curl_check.sh (the README's grpcurl walk-through over TLS with
# buf curl), the Python client's tests, and the fuzz targets for $HGEMM_FUZZ_SECONDS (default 60)
# each (tools/fuzz.sh). Ends with a summary line "N passed, N failed, N skipped" counted over all
# GoogleTest cases (sanitizer runs included), deploy and curl checks, Python tests and fuzz targets.
set -uo pipefail
cd "$(dirname "$0")/.."

tools/bootstrap.sh || exit 1
bazel test //... "$@"
status=$?
logdirs=("$(bazel info bazel-testlogs)")
# Sanitizer runs: outputs under their own platform suffix; no symlinks, so bazel-bin stays the
# normal build's.
asan_tests=(//server/session:validation_test //server/session:stream_assembler_test //server/session:host_buffer_pool_test
            //server/core:logging_test //server/core:status_test //client:metrics_scrape_test
            //server:server_test //server:server_process_test //server:metrics_test //server:memory_pressure_test
            //server:security_test //server/session:stream_session_test //server/session:upload_session_test //server/session:arriving_buffer_test //server/backend:device_memory_test //server/auth:token_table_test //server/auth:server_tls_test
            //server:peer_credentials_test //server/auth:unix_peers_test
            //server/scheduler:scheduler_test
            //server/scheduler:upload_queue_test //server/resident:matrix_store_test
            //server/backend:cpu_backend_test //server:gemm_forms_test //bench:soak_test //bench:echo_service_test //client:cli_test
            //server/session:part_session_test //server:parts_test //server:grouped_gemm_test
            //server/transport:part_chunk_test //server/resident:region_store_test //server:shm_test
            //server/session:ring_executor_test //server:ring_test //client/c:hgemm_test //client:stream_wire_test)
tsan_tests=(//server/session:host_buffer_pool_test //server/session:stream_session_test //server/session:upload_session_test //server/session:arriving_buffer_test //server/scheduler:scheduler_test //server/auth:token_table_test //server/auth:unix_peers_test
            //server/scheduler:upload_queue_test //server/resident:matrix_store_test //server/session:part_session_test
            //server/resident:region_store_test //server/session:ring_executor_test)
for config in asan tsan; do
  tests_var="${config}_tests[@]"
  bazel test --config=$config --symlink_prefix=/ "${!tests_var}" || status=1
  logdirs+=("$(bazel info --config=$config bazel-testlogs)")
done
passed=0 failed=0 skipped=0
# run_step NAME COMMAND...: runs a step that ends with the line "NAME: N passed, N failed" (and
# ", N skipped" if it skips); adds its counts, and one failure if it died before that line.
run_step() {
  local name=$1 log rc p f s
  shift
  log=$(mktemp)
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  ((status == 0)) && status=$rc
  read -r p f s < <(awk -v name="$name:" '$1 == name && $3 == "passed," {p = $2; f = $4; s = $6}
                                          END {print p+0, f+0, s+0}' "$log")
  ((rc == 0 || f > 0)) || f=1
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
}
run_step deploy bash deploy/check.sh
# The README's grpcurl walk-through over TLS and tokens, run with buf curl.
run_step curl tools/curl_check.sh
# The Python client (client/python): its own venv and servers.
run_step python tools/test_python.sh
run_step fuzz tools/fuzz.sh "${HGEMM_FUZZ_SECONDS:-60}"

for log in $(find -L "${logdirs[@]}" -name test.log 2>/dev/null); do
  read -r p f s < <(awk '
    /^\[  PASSED  \] [0-9]+ test/ {p += $4}
    /^\[  FAILED  \] [0-9]+ test/ {f += $4}
    /^\[  SKIPPED \] [0-9]+ test/ {s += $4}
    END {print p+0, f+0, s+0}' "$log")
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
done
echo "tests: $passed passed, $failed failed, $skipped skipped"
exit $status

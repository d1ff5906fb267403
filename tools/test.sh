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
asan_tests=(//server:validation_test //server:stream_assembler_test //server:host_buffer_pool_test
            //server/core:logging_test //server/core:status_test //client:metrics_scrape_test
            //server:server_test //server:server_process_test //server:metrics_test
            //server:security_test //server:stream_session_test //server/backend:device_memory_test //server/auth:token_table_test //server/auth:server_tls_test
            //server/scheduler:scheduler_test
            //server/scheduler:upload_queue_test //server/resident:matrix_store_test
            //server/backend:cpu_backend_test //bench:soak_test //bench:echo_service_test //client:cli_test)
tsan_tests=(//server:host_buffer_pool_test //server:stream_session_test //server/scheduler:scheduler_test //server/auth:token_table_test
            //server/scheduler:upload_queue_test //server/resident:matrix_store_test)
for config in asan tsan; do
  tests_var="${config}_tests[@]"
  bazel test --config=$config --symlink_prefix=/ "${!tests_var}" || status=1
  logdirs+=("$(bazel info --config=$config bazel-testlogs)")
done
deploy_log=$(mktemp)
bash deploy/check.sh 2>&1 | tee "$deploy_log"
deploy_status=${PIPESTATUS[0]}
((status == 0)) && status=$deploy_status

# The README's grpcurl walk-through over TLS and tokens, run with buf curl: line "curl: ...".
curl_log=$(mktemp)
tools/curl_check.sh 2>&1 | tee "$curl_log"
curl_status=${PIPESTATUS[0]}
((status == 0)) && status=$curl_status

# The Python client (client/python): its own venv and servers; line "python: N passed, ...".
python_log=$(mktemp)
tools/test_python.sh 2>&1 | tee "$python_log"
python_status=${PIPESTATUS[0]}
((status == 0)) && status=$python_status

fuzz_log=$(mktemp)
tools/fuzz.sh "${HGEMM_FUZZ_SECONDS:-60}" 2>&1 | tee "$fuzz_log"
fuzz_status=${PIPESTATUS[0]}
((status == 0)) && status=$fuzz_status

passed=0 failed=0 skipped=0
for log in $(find -L "${logdirs[@]}" -name test.log 2>/dev/null); do
  read -r p f s < <(awk '
    /^\[  PASSED  \] [0-9]+ test/ {p += $4}
    /^\[  FAILED  \] [0-9]+ test/ {f += $4}
    /^\[  SKIPPED \] [0-9]+ test/ {s += $4}
    END {print p+0, f+0, s+0}' "$log")
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
done
read -r dp df < <(awk '/^deploy: [0-9]+ passed, [0-9]+ failed/ {p = $2; f = $4} END {print p+0, f+0}' "$deploy_log")
((deploy_status == 0 || df > 0)) || df=1  # a check that died before its summary still fails
passed=$((passed + dp)) failed=$((failed + df))
read -r cp cf < <(awk '/^curl: [0-9]+ passed, [0-9]+ failed/ {p = $2; f = $4} END {print p+0, f+0}' "$curl_log")
((curl_status == 0 || cf > 0)) || cf=1
passed=$((passed + cp)) failed=$((failed + cf))
read -r pp pf ps < <(awk '/^python: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped/ {p = $2; f = $4; s = $6} END {print p+0, f+0, s+0}' "$python_log")
((python_status == 0 || pf > 0)) || pf=1
passed=$((passed + pp)) failed=$((failed + pf)) skipped=$((skipped + ps))
read -r fp ff < <(awk '/^fuzz: [0-9]+ passed, [0-9]+ failed/ {p = $2; f = $4} END {print p+0, f+0}' "$fuzz_log")
((fuzz_status == 0 || ff > 0)) || ff=1
passed=$((passed + fp)) failed=$((failed + ff))
echo "tests: $passed passed, $failed failed, $skipped skipped"
exit $status

#!/usr/bin/env bash
# Every test: install what is missing, then `bazel test //...` (GoogleTest; tests that need a
# GPU skip without one) and deploy/check.sh (lint and schema checks of the container and
# Kubernetes manifests). Ends with a summary line "N passed, N failed, N skipped" counted over
# all GoogleTest cases and deploy checks.
set -uo pipefail
cd "$(dirname "$0")/.."

tools/bootstrap.sh || exit 1
bazel test //... "$@"
status=$?
deploy_log=$(mktemp)
bash deploy/check.sh 2>&1 | tee "$deploy_log"
deploy_status=${PIPESTATUS[0]}
((status == 0)) && status=$deploy_status

passed=0 failed=0 skipped=0
for log in $(find -L bazel-testlogs/ -name test.log 2>/dev/null); do
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
echo "tests: $passed passed, $failed failed, $skipped skipped"
exit $status

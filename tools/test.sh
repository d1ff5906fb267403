#!/usr/bin/env bash
# Every test: install what is missing, then `bazel test //...` (GoogleTest; tests that need a
# GPU skip without one). Ends with a summary line "N passed, N failed, N skipped" counted
# over all GoogleTest cases.
set -uo pipefail
cd "$(dirname "$0")/.."

tools/bootstrap.sh || exit 1
bazel test //... "$@"
status=$?

passed=0 failed=0 skipped=0
for log in $(find -L bazel-testlogs/ -name test.log 2>/dev/null); do
  read -r p f s < <(awk '
    /^\[  PASSED  \] [0-9]+ test/ {p += $4}
    /^\[  FAILED  \] [0-9]+ test/ {f += $4}
    /^\[  SKIPPED \] [0-9]+ test/ {s += $4}
    END {print p+0, f+0, s+0}' "$log")
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
done
echo "tests: $passed passed, $failed failed, $skipped skipped"
exit $status

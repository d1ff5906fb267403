#!/usr/bin/env bash
# Every test: install what is missing, then `bazel test //...` (GoogleTest; tests that need a GPU
# skip without one) but for the tests tagged "asan", which run under ASan + UBSan instead, those
# tagged "tsan" again under TSan (.bazelrc configs asan, tsan), tools/format_check.sh (C++ and
# CUDA as clang-format writes them), deploy/check.sh (lint and schema checks of the container
# and Kubernetes manifests), tools/curl_check.sh (the README's grpcurl walk-through over TLS with
# buf curl), the Python client's tests, and the fuzz targets for $HGEMM_FUZZ_SECONDS (default 30)
# each (tools/fuzz.sh). Ends with a summary line "N passed, N failed, N skipped" counted over all
# GoogleTest cases (sanitizer runs included; a test that died before GoogleTest's summary counts
# as one failure), deploy and curl checks, Python tests and fuzz targets, and a line "time: STAGE
# N s, ..." (the wall time of each stage, to keep CI's length in view).
set -uo pipefail
cd "$(dirname "$0")/.."

times=() last=$SECONDS
# timed STAGE: records the wall time since the previous stage ended.
timed() { times+=("$1 $((SECONDS - last)) s"); last=$SECONDS; }

tools/bootstrap.sh || exit 1
timed bootstrap
# Every other target is built here, and every test runs once: one tagged "asan" runs under ASan +
# UBSan below and not here as well (compiling them here too took over a third of this stage).
bazel test //... --build_tag_filters=-asan --test_tag_filters=-asan "$@"
status=$?
timed test
logdirs=("$(bazel info bazel-testlogs)")
# Sanitizer runs: the tests tagged "asan" (ASan + UBSan, built by clang in the fuzz targets'
# output base: they share its objects) and "tsan" in their BUILD files; outputs under their own
# platform suffix, no symlinks, so bazel-bin stays the normal build's.
bazel_clang=(bazel --output_base="${FUZZ_OUTPUT_BASE:-$HOME/.cache/bazel-clang}")
# The workspace's packages by name: that output base takes the normal build's bazel-* links for
# folders of the workspace.
packages=(//:all)
for d in */; do
  [[ $d != bazel-* && -n $(find "$d" -name BUILD -print -quit) ]] && packages+=("//${d%/}/...")
done
for config in asan tsan; do
  runner=(bazel)
  [[ $config == asan ]] && runner=("${bazel_clang[@]}")
  "${runner[@]}" test --config=$config --symlink_prefix=/ --build_tag_filters=$config \
    --test_tag_filters=$config "${packages[@]}" || status=1
  logdirs+=("$("${runner[@]}" info --config=$config bazel-testlogs)")
  timed $config
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
  timed "$name"
}
# C++ and CUDA as clang-format writes them (.clang-format).
run_step format tools/format_check.sh
run_step deploy bash deploy/check.sh
# The README's grpcurl walk-through over TLS and tokens, run with buf curl.
run_step curl tools/curl_check.sh
# The Python client (client/python): its own venv and servers.
run_step python tools/test_python.sh
# 30 s a target from the seed corpus keeps CI short; depth is docs/soak.md's longer campaigns.
run_step fuzz tools/fuzz.sh "${HGEMM_FUZZ_SECONDS:-30}"

for log in $(find -L "${logdirs[@]}" -name test.log 2>/dev/null); do
  read -r p f s summary < <(awk '
    /^\[  PASSED  \] [0-9]+ test/ {p += $4; summary = 1}
    /^\[  FAILED  \] [0-9]+ test/ {f += $4}
    /^\[  SKIPPED \] [0-9]+ test/ {s += $4}
    END {print p+0, f+0, s+0, summary+0}' "$log")
  # No GoogleTest summary: not a GoogleTest, or one that died before it (a sanitizer's abort);
  # Bazel's test.xml beside the log says which way the target went.
  if ((!summary)); then
    if grep -q '<error message=\|<failure' "${log%.log}.xml" 2>/dev/null; then f=1; else p=1; fi
  fi
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
done
(IFS=,; echo "time: ${times[*]}" | sed 's/,/, /g')
echo "tests: $passed passed, $failed failed, $skipped skipped"
exit $status

#!/usr/bin/env bash
# Builds the libFuzzer targets of //server/fuzz and //client/fuzz with clang (ASan + UBSan, leak
# detection on) in a separate Bazel output base, then runs each for a bounded time (default
# 60 s) from its seed corpus (<package>/corpus/<target>), $FUZZ_JOBS (default: the number of
# cores) at a time.
# Fails on any crash, leak, hang (-timeout: 30 s, since an input of validation_fuzz may fill a
# 512 MiB operand, seconds under ASan on a loaded 2-core machine) or OOM (-rss_limit_mb). Leaks
# are checked when each target exits (LeakSanitizer), not after every input (-detect_leaks=0):
# the services keep state across inputs, so nearly every input allocates more than it frees and
# libFuzzer would re-run it and scan the heap, 3-15x the cost of an execution
# (docs/soak.md, "Fuzzing at depth"). Crash inputs go to $FUZZ_ARTIFACTS (default
# /tmp/hgemm-fuzz/artifacts).
# Prints "fuzz: N passed, N failed" and one "fuzz <target>: <executions> execs" line per target.
#   tools/fuzz.sh [seconds per target]
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
targets=(validation stream_assembler upload service transport ring stream_answer)
# package_of TARGET: the folder of its fuzz target and seed corpus.
package_of() { [[ $1 == stream_answer ]] && echo client/fuzz || echo server/fuzz; }
parallel=${FUZZ_JOBS:-$(nproc)}
work=${FUZZ_WORK:-/tmp/hgemm-fuzz}
artifacts=${FUZZ_ARTIFACTS:-$work/artifacts}
mkdir -p "$artifacts"

# CC=clang re-runs the cc autoconfig: a second output base keeps the gcc build's cache intact,
# and the symlink prefix keeps this server off the workspace's bazel-bin / bazel-testlogs.
bazel_clang=(bazel --output_base="${FUZZ_OUTPUT_BASE:-$HOME/.cache/bazel-clang}")
labels=()
for t in "${targets[@]}"; do labels+=("//$(package_of "$t"):${t}_fuzz"); done
if ! "${bazel_clang[@]}" build --config=fuzz --symlink_prefix=/tmp/bazel-clang- "${labels[@]}"; then
  echo "fuzz: 0 passed, ${#targets[@]} failed (build)"
  exit 1
fi
bin=$("${bazel_clang[@]}" info --config=fuzz bazel-bin)

# run_target TARGET: one bounded run; its exit status goes to $work/TARGET.rc.
run_target() {
  local t=$1 corpus=$work/corpus/$1
  mkdir -p "$corpus"
  rm -f "$work/$t.rc"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$bin/$(package_of "$t")/${t}_fuzz" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 \
    -max_len=65536 -detect_leaks=0 -print_final_stats=1 -artifact_prefix="$artifacts/$t-" \
    "$corpus" "$(package_of "$t")/corpus/$t" >"$work/$t.log" 2>&1
  echo $? >"$work/$t.rc"
}
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= parallel)); do wait -n; done
  run_target "$t" &
done
wait

passed=0 failed=0
for t in "${targets[@]}"; do
  log=$work/$t.log
  rc=$(cat "$work/$t.rc" 2>/dev/null || echo 1)
  execs=$(awk '/stat::number_of_executed_units/ {n = $2} END {print n + 0}' "$log")
  echo "fuzz $t: ${execs:-0} execs, exit $rc (log $log)"
  if ((rc == 0)); then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    grep -m1 -A30 "ERROR: \|FUZZ INVARIANT\|runtime error" "$log" | head -40
  fi
done
echo "fuzz: $passed passed, $failed failed"
((failed == 0))

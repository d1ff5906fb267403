#!/usr/bin/env bash
# A long fuzzing campaign on a machine with many cores (e.g. the GPU machine, which has no
# Bazel): runs the fuzz targets bundled by `gpu-bundle.sh --out .gpu-fuzz` (with their corpora
# under .gpu-fuzz/corpus/<target>) in libFuzzer's fork mode, all at once, each on its share of
# the cores, and prints "campaign <target>: <executions> execs, exit <rc>" per target.
#   tools/fuzz_campaign.sh SECONDS TARGET=JOBS...
#   e.g. 500 service=12 upload=8 transport=6 validation=2 stream_assembler=2: the session-level
#   targets (service, upload) idle on thread hand-offs most of the time, so give them about
#   twice as many jobs as the cores they should use (bench/results/fuzz_depth_2core).
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=$1
shift
source .gpu-fuzz/env.sh
out=${OUT:-/tmp/hgemm-fuzz-campaign}
mkdir -p "$out/artifacts"
pids=()
for spec in "$@"; do
  t=${spec%%=*} jobs=${spec#*=}
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "${t}_fuzz" -fork="$jobs" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
    -max_len=65536 -artifact_prefix="$out/artifacts/$t-" ".gpu-fuzz/corpus/$t" \
    >"$out/$t.log" 2>&1 &
  pids+=("$!:$t")
done
failed=0
for p in "${pids[@]}"; do
  wait "${p%%:*}"
  rc=$?
  t=${p#*:}
  execs=$(grep -oE '^#[0-9]+' "$out/$t.log" | tail -1 | tr -d '#')
  echo "campaign $t: ${execs:-0} execs, exit $rc"
  ((rc == 0)) || { failed=1; grep -m1 -A20 "ERROR: \|FUZZ INVARIANT\|runtime error" "$out/$t.log"; }
done
exit $failed

#!/usr/bin/env bash
# A long fuzzing campaign on a machine with many cores (e.g. the GPU machine, which has no
# Bazel): runs the fuzz targets bundled by `gpu-bundle.sh --out .gpu-fuzz` (with their corpora
# under .gpu-fuzz/corpus/<target>) all at once, each as WORKERS long-lived libFuzzer processes
# sharing the target's corpus directory (each picks up the others' new inputs), for SECONDS.
#   tools/fuzz_campaign.sh SECONDS [TARGET=WORKERS...]
# Without TARGET=WORKERS, the schedule for 16 cores: 19 processes (ring's workers spend most of
# their time waiting on the ring's thread hand-offs, ~0.3 core each; service's and upload's part
# of it), projected from the rates per CPU second measured on the loaded 2-core dev VM
# (docs/soak.md, "Fuzzing at depth"), a worker taken as a full core except ring's (half):
#   transport        8 x 540 s x   275/s = 1.19 M   (275 per CPU s)
#   ring             5 x 540 s x   370/s = 1.0 M    (740 per CPU s; no margin at half a core,
#                                                    2.0 M at a full one)
#   service          2 x 540 s x 1 390/s = 1.50 M
#   upload           2 x 540 s x 1 700/s = 1.84 M
#   validation       1 x 540 s x 4 230/s = 2.28 M
#   stream_assembler 1 x 540 s x 4 930/s = 2.66 M
# transport's and ring's margins are thin: the table at the end says whether each got 10^6.
#
# Not fork mode: libFuzzer's -fork restarts each job after 1, 2, 3... seconds, so every job
# pays the process start (transport_fuzz: a server), the replay of its corpus and libFuzzer's
# warm-up again; long-lived workers pay them once. Leaks are checked at each worker's exit
# (LeakSanitizer, ASAN_OPTIONS=detect_leaks=1) rather than after every input (-detect_leaks=0):
# the services keep state across inputs, so nearly every input allocates more than it frees,
# and libFuzzer re-ran it and scanned the heap each time (3-15x the cost of an execution).
# A worker that stops early (crash, hang, OOM, leak) is started again for the time left; its
# input is kept under $OUT/artifacts (crash-*, timeout-*, oom-*, leak-*) and its log under
# $OUT/logs ($FUZZ_BUNDLE: another bundle than .gpu-fuzz); the grown corpora go to
# $OUT/corpus.tgz. Ends with a table: target, workers, executions, crashes, hangs; exit status
# 0 when no worker found anything. A run takes SECONDS plus the workers' exit (LeakSanitizer's
# scan: seconds).
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=$1
shift
schedule=("$@")
((${#schedule[@]})) ||
  schedule=(transport=11 ring=3 service=2 upload=1 validation=1 stream_assembler=1)
bundle=${FUZZ_BUNDLE:-.gpu-fuzz}
source "$bundle/env.sh"
out=${OUT:-/tmp/hgemm-fuzz-campaign}
mkdir -p "$out/artifacts" "$out/logs"
end=$((SECONDS + seconds))

# worker TARGET INDEX: runs TARGET until the campaign's end, again after an early stop (at most
# 10 runs: a leak that each run's exit finds again would otherwise loop).
worker() {
  local t=$1 w=$2 run=0 left
  while left=$((end - SECONDS)) && ((left > 5 && run < 10)); do
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      "${t}_fuzz" -max_total_time="$left" -timeout=10 -rss_limit_mb=4096 -max_len=65536 \
      -detect_leaks=0 -print_final_stats=1 -seed=$((1000 * w + run + 1)) \
      -artifact_prefix="$out/artifacts/$t-w$w-" "$bundle/corpus/$t" \
      >"$out/logs/$t-w$w-r$run.log" 2>&1
    echo $? >"$out/logs/$t-w$w-r$run.rc"
    run=$((run + 1))
  done
}
for spec in "${schedule[@]}"; do
  t=${spec%%=*} workers=${spec#*=}
  mkdir -p "$bundle/corpus/$t"
  for ((w = 0; w < workers; w++)); do worker "$t" "$w" & done
done
wait
# The grown corpora, one file (to minimise with -merge=1 into server/fuzz/corpus).
tar czf "$out/corpus.tgz" -C "$bundle" corpus

# A run's executions: its final stats, else (killed) its last status line.
executions() {
  awk '/stat::number_of_executed_units/ {n = $2; final = 1}
       /^#[0-9]+/ && !final {n = substr($1, 2)}
       END {print n + 0}' "$1"
}
failed=0
printf '%-18s %8s %12s %8s %6s\n' target workers executions crashes hangs
for spec in "${schedule[@]}"; do
  t=${spec%%=*} workers=${spec#*=} execs=0 crashes=0 hangs=0
  for log in "$out/logs/$t"-w*-r*.log; do
    [[ -e $log ]] || continue
    execs=$((execs + $(executions "$log")))
    if grep -q "ERROR: libFuzzer: timeout" "$log"; then
      hangs=$((hangs + 1))
    elif [[ $(cat "${log%.log}.rc" 2>/dev/null) != 0 ]]; then
      crashes=$((crashes + 1))
    fi
  done
  printf '%-18s %8d %12d %8d %6d\n' "$t" "$workers" "$execs" "$crashes" "$hangs"
  ((crashes + hangs == 0)) || failed=1
done
if ((failed)); then
  for rc in $(grep -L "^0$" "$out"/logs/*.rc); do
    log=${rc%.rc}.log
    echo "== $log (exit $(cat "$rc"))"
    grep -m1 -A20 "ERROR: \|FUZZ INVARIANT\|runtime error" "$log"
  done
  echo "artifacts: $(ls "$out/artifacts" | tr '\n' ' ')"
fi
exit $failed

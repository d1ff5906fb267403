#!/usr/bin/env bash
# One device call: correctness sweep, compute-sanitizer (memcheck, racecheck) on odd shapes, and
# the kernel benchmark with its plot. Run from the repository root on the GPU machine after
#   ../shared/tools/gpu-bundle.sh [--out $GPU_DIR] bazel-bin/kernels/gemm_correctness_test \
#       bazel-bin/kernels/registry_test bazel-bin/kernels/batched_gemm_test \
#       bazel-bin/kernels/split_k_test bazel-bin/bench/kernel_bench
# usage: bench/kernel_bench_device.sh OUT_DIR [SANITIZER_TIMEOUT_S] [BENCH_ARGS...]
# CORRECTNESS_FILTER (gtest filter of the sweep), MEMCHECK_FILTER and RACECHECK_FILTER narrow the
# sections, e.g. to one family: CORRECTNESS_FILTER='*wgmma*' MEMCHECK_FILTER='Small/*wgmma*';
# BATCHED_FILTER the strided-batch and group sweep (batched_gemm_test, where bundled). Where
# split_k_test is bundled it runs too (skinny M, M <= 256); `--modes skinny` among BENCH_ARGS
# adds the split-K benchmark.
set -uo pipefail
out=${1:?out dir}; shift
san_timeout=${1:-120}; shift || true
gpu=${GPU_DIR:-.gpu}
source "$gpu/env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
  --format=csv | tee "$out/device.txt"

echo "== correctness"
t0=$SECONDS
"$gpu"/bin/registry_test --gtest_brief=1 > "$out/correctness.log" 2>&1; echo "registry_test rc=$?"
"$gpu"/bin/gemm_correctness_test --gtest_brief=1 --gtest_filter="${CORRECTNESS_FILTER:-*}" \
  >> "$out/correctness.log" 2>&1
echo "gemm_correctness_test rc=$? ($((SECONDS - t0)) s)"
if [ -x "$gpu"/bin/batched_gemm_test ]; then
  t0=$SECONDS
  "$gpu"/bin/batched_gemm_test --gtest_brief=1 --gtest_filter="${BATCHED_FILTER:-*}" \
    > "$out/batched.log" 2>&1
  echo "batched_gemm_test rc=$? ($((SECONDS - t0)) s):" \
    "$(grep -cE '^\[  FAILED  \] Batches' "$out/batched.log") failed"
fi
if [ -x "$gpu"/bin/split_k_test ]; then
  t0=$SECONDS
  "$gpu"/bin/split_k_test --gtest_brief=1 > "$out/split_k.log" 2>&1
  echo "split_k_test rc=$? ($((SECONDS - t0)) s):" \
    "$(grep -cE '^\[  FAILED  \] (SplitK|Reduce)' "$out/split_k.log") failed"
fi
python3 - "$out/correctness.log" <<'PY'
import re, sys
worst = {}
fails = []
for line in open(sys.argv[1]):
    m = re.match(r"\[ result \] (\S+)\s+(fp16|fp32)\s+(\d+)x\s*(\d+)x\s*(\d+) "
                 r"rel_frob=(\S+) max_abs=(\S+) nan=(\d+)", line)
    if m:
        key = (m.group(1), m.group(2)); err = float(m.group(6))
        n, w = worst.get(key, (0, 0.0)); worst[key] = (n + 1, max(w, err))
    if "[  FAILED  ]" in line and "listed below" not in line:
        fails.append(line.strip())
print("%-34s %-4s %5s %s" % ("variant", "acc", "cases", "worst rel_frob"))
for (v, a), (n, w) in sorted(worst.items()):
    print("%-34s %-4s %5d %.2e" % (v, a, n, w))
print("failed:", len(fails)); [print(" ", f) for f in fails[:20]]
PY

echo "== sanitizers (timeout ${san_timeout}s each)"
small=${MEMCHECK_FILTER:-'Small/*:-*cublas*:*auto*'}
odd_shapes='Small/*_33x72x24:Small/*_7x5x3:Small/*_255x264x104:Small/*_129x136x40'
odd=${RACECHECK_FILTER:-"$odd_shapes:-*cublas*:*auto*"}
t0=$SECONDS
timeout "$san_timeout" compute-sanitizer --tool memcheck --error-exitcode 9 \
  "$gpu"/bin/gemm_correctness_test --gtest_brief=1 --gtest_filter="$small" \
  > "$out/memcheck.log" 2>&1
echo "memcheck rc=$? ($((SECONDS - t0)) s):" \
  "$(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -1)"
t0=$SECONDS
timeout "$san_timeout" compute-sanitizer --tool racecheck --racecheck-report all \
  --error-exitcode 9 \
  "$gpu"/bin/gemm_correctness_test --gtest_brief=1 --gtest_filter="$odd" \
  > "$out/racecheck.log" 2>&1
echo "racecheck rc=$? ($((SECONDS - t0)) s):" \
  "$(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$out/racecheck.log" | tail -1)"
if [ -x "$gpu"/bin/batched_gemm_test ]; then
  t0=$SECONDS  # one-launch batches and groups: out-of-item reads and writes
  timeout "$san_timeout" compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$gpu"/bin/batched_gemm_test --gtest_brief=1 \
    --gtest_filter='*wgmma_64x128_s8_g8_*_fp16_fp32acc' \
    > "$out/memcheck_batched.log" 2>&1
  echo "memcheck batched rc=$? ($((SECONDS - t0)) s):" \
    "$(grep -E 'ERROR SUMMARY' "$out/memcheck_batched.log" | tail -1)"
fi

if [ -x "$gpu"/bin/split_k_test ]; then
  t0=$SECONDS  # slices read at offsets inside A and B, partials and the reduce's row padding
  timeout "$san_timeout" compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$gpu"/bin/split_k_test --gtest_brief=1 \
    --gtest_filter='*splitk*_64x128_*_7x264x72:*splitk*_64x128_*_65x264x1000:*_ld:Reduce/*' \
    > "$out/memcheck_split_k.log" 2>&1
  echo "memcheck split_k rc=$? ($((SECONDS - t0)) s):" \
    "$(grep -E 'ERROR SUMMARY' "$out/memcheck_split_k.log" | tail -1)"
fi

echo "== benchmark"
t0=$SECONDS
"$gpu"/bin/kernel_bench --csv "$out/kernel_bench.csv" "$@" > "$out/bench.log" 2>&1
echo "kernel_bench rc=$? ($((SECONDS - t0)) s)"
python3 "$(dirname "$0")/kernel_bench_plot.py" "$out/kernel_bench.csv" "$out/kernel_bench.png" ||
  echo "plot failed"
sed -n "/^fastest own kernel/,\$p" "$out/bench.log"

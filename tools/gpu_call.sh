#!/usr/bin/env bash
# One device call, within its limits: sections of tools/gpu_e2e.sh (or the short steps below),
# each under its own time limit, all under a budget, with a fuzz campaign in the background on
# the cores they leave, and every log in one file ($OUT/results.tgz: a call returns at most 8
# files). Unpacks the bundles that tools/gpu_e2e.sh --bundle (.gpu-pack/serve.tar.xz) and the
# fuzz bundle (.gpu-pack/fuzz.tar.xz, docs/soak.md "The campaign") made here; the device call
# carries .gpu-pack.
#   tools/gpu_call.sh BUDGET_S FUZZ NAME=LIMIT_S...
#     BUDGET_S  seconds the whole call may take (sections that no longer fit are skipped)
#     FUZZ      a tools/fuzz_campaign.sh schedule ("transport=11 ring=3 ...", niced) or -
#     NAME      a gpu_e2e.sh section, or: batched, layouts, kb_table, kb_small, resident_ring,
#               python_shm, skinny_check, skinny_server, scaled_quick, python_quick, python_stream,
#               samehost_quick, samehost_8192
# Why: one long call can spend its whole limit on a few sections (7 sections took 150 s of a
# 600 s limit, several stopping at their first failure), and the next call may get no machine.
# Short steps with their own limits make each call count.
set -u
cd "$(dirname "$0")/.." || exit 1
budget=$1 fuzz=$2
shift 2
start=$SECONDS final=${OUT:-out}
results=/tmp/gpu_call_results
rm -rf $results && mkdir -p $results "$final"
tar xJf .gpu-pack/serve.tar.xz
[[ $fuzz != - ]] && tar xJf .gpu-pack/fuzz.tar.xz
source .gpu-serve/env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; } |
  tee $results/gpu.txt
elapsed() { echo $((SECONDS - start)); }

# Every batched and grouped case (cuBLAS fp32-C groups and ping-pong α/β among them).
batched() {
  batched_gemm_test --gtest_brief=1 >"$OUT/batched_gemm_test.log" 2>&1
  echo "batched_gemm_test rc=$?"
  grep -E "^\[  (PASSED|FAILED) " "$OUT/batched_gemm_test.log" | head -20
}
# The layout table: 4096³ and 8192³, every layout, fp16 and bf16, fp32 accumulation; the
# plain 128x256 kernel against its stream-K and cluster-pair variants (the ping-pong, at
# 0.75-0.93x, is left out).
layouts() {
  kernel_bench --modes plain --acc fp32 --layouts NN,NT,TN,TT --types fp16,bf16 \
    --shapes 4096x4096x4096,8192x8192x8192 \
    --variants cublas,wgmma_128x256_s4_g8,wgmma_128x256_s4_g8_sk,wgmma_128x256_s4_g4_cluster2 \
    --csv "$OUT/layouts.csv" >"$OUT/layouts.log" 2>&1
  echo "kernel_bench layouts rc=$?"
  sed -n "/^fastest own kernel/,\$p" "$OUT/layouts.log"
}
# kb_plain SHAPES: the table's plain rows (every layout and type pair, the three wgmma tiles:
# 64x128 is the fastest at M = 128).
kb_plain() {
  kernel_bench --modes plain --acc fp32 --layouts NN,NT,TN,TT \
    --types fp16,bf16,fp16_fp32,bf16_fp32 \
    --shapes "$1" --variants cublas,wgmma_128x256_s4_g8,wgmma_128x128_s6_g8,wgmma_64x128_s8_g8 \
    --csv "$OUT/plain.csv" >"$OUT/plain.log" 2>&1
  echo "kernel_bench plain rc=$?"
}
# The table's small shapes alone (2048³ and 128x8192x8192).
kb_small() {
  kb_plain 2048x2048x2048,128x8192x8192
  sed -n "/^fastest own kernel/,\$p" "$OUT/plain.log"
}
# The feature table (docs/kernels.md, "cuBLAS entry points and ours") on one card: every
# row's shapes against the matching cuBLAS call, one CSV per mode (skinny M with the experimental
# splitk variants in auto's choice).
kb_table() {
  local shapes=4096x4096x4096,8192x8192x8192,2048x2048x2048,128x8192x8192
  kb_plain "$shapes"
  kernel_bench --modes ld,scaled --acc fp32 --layouts NN,TT --types fp16,bf16 \
    --shapes 4096x4096x4096,8192x8192x8192,2048x2048x2048,4097x4096x4095 \
    --variants cublas,wgmma_128x256_s4_g8,wgmma_128x128_s6_g8 \
    --csv "$OUT/ld_scaled.csv" >"$OUT/ld_scaled.log" 2>&1
  echo "kernel_bench ld,scaled rc=$?"
  kernel_bench --modes batched,grouped --acc fp32 --layouts NN,NT --types fp16,bf16 \
    --variants cublas,wgmma_128x256_s4_g8,wgmma_128x128_s6_g8,wgmma_64x128_s8_g8 \
    --csv "$OUT/batched_grouped.csv" >"$OUT/batched_grouped.log" 2>&1
  echo "kernel_bench batched,grouped rc=$?"
  HGEMM_AUTO_EXPERIMENTAL=1 kernel_bench --modes skinny --acc fp32 --layouts NN,NT \
    --types fp16,bf16 --csv "$OUT/skinny.csv" >"$OUT/skinny.log" 2>&1
  echo "kernel_bench skinny rc=$?"
  for mode in plain ld_scaled batched_grouped skinny; do
    sed -n "/^fastest own kernel/,\$p" "$OUT/$mode.log"
  done
}
# skinny_m16's checks: its correctness cases (the split-K edge shapes among them) plain
# and under compute-sanitizer memcheck, the multi-slab ones under racecheck (~20 s a case: give
# it 300 s), then ncu on M = 16 x 8192 x 8192 NT and NN against the 64x128 wgmma kernel (blocks
# per SM, DRAM throughput, shared-memory bank conflicts: NT has run 6-10 % under NN).
skinny_check() {
  local filter='*skinny_m16*'
  gemm_correctness_test --gtest_filter="$filter" --gtest_brief=1 >"$OUT/correctness.log" 2>&1
  echo "gemm_correctness_test skinny_m16 rc=$?"
  grep -E "^\[  (PASSED|FAILED)  \]|tests ran" "$OUT/correctness.log" | head -20
  compute-sanitizer --tool memcheck --error-exitcode 9 gemm_correctness_test \
    --gtest_filter="$filter" --gtest_brief=1 >"$OUT/memcheck.log" 2>&1
  echo "compute-sanitizer memcheck rc=$?"
  grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED)  \]" "$OUT/memcheck.log" | head -5
  # racecheck's hazards in cuBLAS's own split-K kernels (the reference the tests compare with)
  # are not ours: only Skinny* counts.
  compute-sanitizer --tool racecheck gemm_correctness_test \
    --gtest_filter='*skinny_m16*13x1000x4104*:*skinny_m16*8x4096x1024*' >"$OUT/racecheck.log" 2>&1
  echo "compute-sanitizer racecheck rc=$?"
  grep -cE "^\[       OK" "$OUT/racecheck.log"
  grep -E "Race reported.*Skinny|FAILED" "$OUT/racecheck.log" | head -5
  local layout variant
  for layout in NT NN; do
    for variant in skinny_m16 wgmma_64x128_s8_g8; do
      ncu --clock-control none -k regex:'Skinny|Wgmma' --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section MemoryWorkloadAnalysis_Tables kernel_bench --modes skinny --skinny 16x8192x8192 \
        --layouts $layout --types fp16 --acc fp32 --variants $variant \
        >"$OUT/ncu_${layout}_$variant.log" 2>&1
      echo "ncu $layout $variant rc=$?"
    done
  done
}
# skinny_m16 through the server (the backend's LaunchContext scratch, its separate α/β epilogue,
# a stream) and as auto's candidate (no HGEMM_AUTO_EXPERIMENTAL): each --check'ed against the CPU
# reference, then kernel_bench skinny's auto rows at M = 1, 8, 16.
skinny_server() {
  start_samehost_server || return 1
  local c=(hgemm_client --server="unix:$sock" --check --repeat=2)
  "${c[@]}" --shape=1x8192x8192 || echo "FAILED: auto 1x8192x8192"
  "${c[@]}" --shape=13x1000x4104 --kernel=skinny_m16 || echo "FAILED: skinny_m16 13x1000x4104"
  "${c[@]}" --shape=16x8192x8192 --dtype=bf16 --transpose_b --c_dtype=fp32 --kernel=skinny_m16 ||
    echo "FAILED: skinny_m16 bf16 NT fp32 C"
  "${c[@]}" --shape=8x4096x4096 --alpha=0.5 --beta=2 --kernel=skinny_m16 ||
    echo "FAILED: skinny_m16 alpha/beta"
  "${c[@]}" --shape=5x8192x8192 --mode=stream --kernel=skinny_m16 ||
    echo "FAILED: skinny_m16 stream"
  kill -TERM $server_pid; wait $server_pid
  kernel_bench --modes skinny --skinny 1x8192x8192,8x8192x8192,16x8192x8192 --layouts NN,NT \
    --types fp16,bf16 --acc fp32 --csv "$OUT/skinny_auto.csv" >"$OUT/skinny_auto.log" 2>&1
  echo "kernel_bench skinny rc=$?"
  grep -E "^(auto|skinny_m16|wgmma_64x128_s8_g8|cublas) " "$OUT/skinny_auto.log"
}
# Fused vs separate α/β (whether --fused_scale should be the default), NN only.
scaled_quick() {
  kernel_bench --modes scaled --acc fp32 --layouts NN --types fp16,bf16 \
    --shapes 2048x2048x2048,4096x4096x4096,8192x8192x8192 \
    --variants wgmma_128x256_s4_g8,auto,cublas --csv "$OUT/scaled.csv" >"$OUT/scaled.log" 2>&1
  echo "kernel_bench scaled rc=$?"
  sed -n "/^fastest own kernel/,\$p" "$OUT/scaled.log"
}
# The Python client's table (gpu_e2e.sh's python section: its default points, no aio),
# the stream point at 1, 4 and 8 workers (req/s must rise with workers as hgemm_load's does).
python_quick() {
  PYTHON_BENCH_ARGS="--points 2048x2048x2048:unary:none:16 128x8192x8192:unary:b:1,4
    128x8192x8192:stream:b:1,4,8 --aio_points
    --duration_s ${PY_DURATION_S:-4}" tools/gpu_e2e.sh python
}
# The Python client's stream points alone (and unary c=1), for a short call.
python_stream() {
  PYTHON_BENCH_ARGS="--points 128x8192x8192:unary:b:1 128x8192x8192:stream:b:1,4,8 --aio_points
    --duration_s 3" tools/gpu_e2e.sh python
}
# The same-host table at 8192³ alone (every path, gRPC among them), for a short call.
samehost_8192() {
  POINTS="8192x8192x8192:1" MAX_POINT_S=8 \
    bench/dataplane.sh --same_host --bin "$PWD/.gpu-serve/bin" --certs .gpu-serve/certs
}
# The same-host table at 2048³ (c=1 and 16) and 8192³ (c=1).
samehost_quick() {
  POINTS="2048x2048x2048:1 2048x2048x2048:16 8192x8192x8192:1" MAX_POINT_S=8 \
    bench/dataplane.sh --same_host --bin "$PWD/.gpu-serve/bin" --certs .gpu-serve/certs
}

# A CUDA server on a Unix socket with shared memory allowed, for the same-host steps below.
start_samehost_server() {
  sock=$(mktemp -d)/hgemm.sock
  hgemm_server --listen=127.0.0.1:50231 --listen="unix:$sock" --backend=cuda --allow_shared_memory \
    --log_level=warn >"$OUT/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 150); do
    hgemm_client --server="unix:$sock" --info >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "FAILED: the server did not start"
  return 1
}
# Same host, all-resident 8192³ (gRPC unary vs the ring, 21 runs each; hgemm_client's run 1
# warms up; the ring's C checked at 1024x2048x512) and CUDA IPC 8192³ c=1 (unary Gemm calls,
# then a ring), one server.
resident_ring() {
  start_samehost_server || return 1
  hgemm_client --server="unix:$sock" --shape=1024x2048x512 --resident=all --transport=ring \
    --check | tail -3
  for path in --mode=unary --transport=ring; do
    hgemm_client --server="unix:$sock" --shape=8192x8192x8192 --resident=all --repeat=21 $path |
      tail -23
  done
  # The kernel on IPC memory ran 7-14 % slower than on the server's own: gap 0 and 2.25 MiB
  # between A, B and C tell whether their power-of-two offsets are why.
  for transport in grpc ring; do
    for gap in 0 2359296; do
      echo "gap_bytes $gap"
      cuda_ipc_load --server="unix:$sock" --shape=8192x8192x8192 --concurrency=1 --seconds=4 \
        --transport=$transport --gap_bytes=$gap
    done
  done
  kill -TERM $server_pid; wait $server_pid
}
# Same host, the Python point: shared buffers (native core) against hgemm_load --transport=shm,
# with a PreparedGemm per worker first, then c.gemm per GEMM.
python_shm() {
  start_samehost_server || return 1
  for call in prepared gemm; do
    HGEMM_NATIVE_LIB=$PWD/.gpu-serve/bin/libhgemm_client.so PYTHONPATH=client/python \
      python3 bench/python_client_bench.py --server="unix:$sock" --transports native \
      --hgemm_load="$(command -v hgemm_load)" --points 2048x2048x2048:shm:none:1,16 \
      8192x8192x8192:shm:none:1 --aio_points --duration_s 3 \
      --csv "$OUT/python_shm_$call.csv" $([[ $call == prepared ]] && echo --prepared)
  done
  kill -TERM $server_pid; wait $server_pid
}
export -f start_samehost_server kb_plain  # the steps run in child shells

fuzzer=
if [[ $fuzz != - ]]; then
  fuzz_s=$((budget - 45))
  # shellcheck disable=SC2086
  (OUT=$results/fuzz nice -n 19 timeout -k 10 $((fuzz_s + 40)) tools/fuzz_campaign.sh $fuzz_s \
    $fuzz >$results/fuzz_table.txt 2>&1) &
  fuzzer=$!
fi
for spec in "$@"; do
  name=${spec%%=*} limit=${spec#*=}
  left=$((budget - $(elapsed) - 30))
  if ((left < 30)); then
    echo "SKIP $name ($left s left)"
    continue
  fi
  ((limit > left)) && limit=$left
  echo "=== $name (limit $limit s) at $(elapsed) s"
  export OUT=$results/$name
  mkdir -p "$OUT"
  if declare -F "$name" >/dev/null; then
    export -f "${name?}"
    timeout -k 5 "$limit" bash -c "$name" >"$results/$name.log" 2>&1
  else
    timeout -k 5 "$limit" tools/gpu_e2e.sh "$name" >"$results/$name.log" 2>&1
  fi
  echo "$name rc=$? at $(elapsed) s"
  grep -E "FAILED|PASSED|rc=|tests ran|lost|wrong|exit status" "$results/$name.log" | head -20
done
if [[ -n $fuzzer ]]; then
  wait $fuzzer
  echo "== fuzz at $(elapsed) s"
  tail -9 $results/fuzz_table.txt
fi
# The fuzz logs' last 20 kB each: whole, they reach hundreds of MB (a call returns a few tens).
for log in "$results"/fuzz/logs/*.log; do
  [[ -f $log ]] && tail -c 20000 "$log" >"$log.tail" && rm "$log"
done
tar czf "$final/results.tgz" -C $results . && ls -la "$final"
echo "done at $(elapsed) s"

#!/usr/bin/env bash
# End to end on a GPU machine, in sections (default: all but load):
#   tests     the CUDA backend's GoogleTests, shm_dma_test (shared-memory regions by DMA) and
#             cuda_ipc_test (CUDA IPC regions, against hgemm_server as a child process)
#   e2e       hgemm_server (CUDA) on 127.0.0.1 driven by hgemm_client: odd shapes, both
#             accumulations, cuBLAS, a streamed 8192³, all checked against a CPU reference
#   overlap   aggregate throughput with 1 vs 4 CUDA streams at the same client concurrency:
#             8 hgemm_client processes sending 2048³ operands (transport-bound), and hgemm_load
#             with B resident (128x8192x8192, 16 workers: bound by the server's copies and kernels)
#   resident  operands kept on the GPU: B resident vs both sent (128x8192 by 8192x8192), and
#             A, B, C resident at 4096³ and 8192³ (client-visible time vs kernel time)
#   latency   bench/completion_latency: how soon a waiting host thread sees a kernel end, and
#             cudaMalloc/cudaFree costs (the fixed costs of a resident GEMM)
#   copy      --resident_copy_to_idle_device on one GPU posing as two devices (--devices=0,0)
#   floor     all-resident 8192³ at concurrency 1 (hgemm_load unary and stream, hgemm_client)
#             next to the RPC floor with the same idle time: echo_server --reply_delay_us set to
#             the kernel time, so the echo pays the same idle wake-ups (the fixed costs)
#   load      bench/load_run.sh (the load generator's sweep), when its binaries are bundled
#   load-resident  bench/load_run.sh --resident-only (all-resident latency vs the RPC floor)
#   metrics   bench/metrics_cost.sh: 256³ unary c=64 req/s without and with --metrics_listen, and
#             /metrics after the point next to hgemm_load's numbers
#   python    the Python client (client/python) vs hgemm_load: bench/python_client_bench.py
#             (2048³ unary c=16, 128x8192x8192 with B resident; needs python3 with grpcio, numpy;
#             PYTHON_BENCH_ARGS: more flags, e.g. other --points)
#   skinny    skinny M (M <= 256): kernels/split_k_test (every splitk variant, layout and type on
#             edge shapes, SplitKReduce's alpha/beta), gemm_correctness_test's skinny_m16 cases,
#             then kernel_bench --modes skinny (M = 1..128
#             by 8192x8192, NN and NT, fp16 and bf16: the splitk variants, their kernels, auto and
#             cuBLAS, TFLOP/s and TB/s; CSV in $OUT), then hgemm_client --check through the server
#             with a splitk kernel named and with auto (in section blas's server)
#   scaled    fused α/β: gemm_correctness_test Scaled/* (every fused variant, layout,
#             type pair, α × β, in place, β = 0 with NaN C_in), batched_gemm_test's and
#             split_k_test's scaled cases, then kernel_bench --modes scaled (rows fused and
#             separate against cublasGemmEx with α, β and C_in; CSV in $OUT) at 2048³, 4096³,
#             8192³, 128 and 16 × 8192 × 8192
#   pingpong  the ping-pong kernel (wgmma_pp_*, experimental: out of auto until this has
#             run): gemm_correctness_test on every wgmma_pp_ case (NN both accumulations, every
#             layout × type pair on odd shapes and 2-8 tiles per block, long K, row strides; C
#             poisoned; within 2× cuBLAS's error) and batched_gemm_test's, then kernel_bench
#             (plain, fp32 accumulation) at 2048³, 4096³ (twice) and 8192³, NN/NT/TN/TT × fp16,
#             bf16, fp16→fp32, bf16→fp32: cuBLAS, the cooperative 128x256 and 128x128 kernels
#             and the ping-pong ones, TFLOP/s and ratios; CSV in $OUT. docs/kernels_notes.md
#             ("Ping-pong consumers") holds the prediction to compare with
#   cluster   the cluster-pair kernel (wgmma_128x256_s4_g4_cluster2, experimental): the
#             same steps as pingpong for it, kernel_bench at 4096³, 8192³ (twice) and
#             8320x8192x8192 (an odd count of tile rows) against cuBLAS and the 128x256 kernel
#             (docs/kernels_notes.md, "operand traffic from L2")
#   streamk   the stream-K kernel (wgmma_128x256_s4_g8_sk, experimental): the same steps
#             for it, kernel_bench at 4096³, 8192³ (twice) and 8320x8192x8192 against cuBLAS and
#             the 128x256 kernel (docs/kernels_notes.md, "stream-K tail")
#   blas      the BLAS forms through the server: bf16 with transpose_b, fp32 C, alpha/beta with
#             C_in, a strided batch, grouped GEMMs, each --check'ed by hgemm_client against the CPU
#             reference
#   dataplane bench/dataplane.sh: one GEMM's bytes over gRPC, parallel parts and shared memory
#             (then --same_host: gRPC vs shm staging vs shm DMA vs CUDA IPC next to pinned
#             cudaMemcpy: the same-host table)
#             (plaintext and TLS) next to bench/tcp_ceiling's raw-TCP ceiling
#   bulk      the bulk channel against gRPC parts: one 8192³ GEMM's bytes by bench/bulk_bench
#             (1, 4, 8 lanes; gRPC parts and bulk, client and server CPU) next to
#             bench/tcp_ceiling's raw TCP in the same run, bulk_bench --gemm (Run against its
#             steps) at 8192³ and 2048³, then hgemm_load 8192³ parts 8 and 2048³ c=1 and 16,
#             parts 4 and 8 (GEMMs included) against a server without and with --bulk_listen
#   verify    Freivalds' check (docs/verification.md): its kernels against the host
#             (cuda_verify_kernels_test), verified GEMMs of every form and damaged ones through
#             the scheduler (cuda_verify_test), its cost at 4096³ and 8192³ with B sent and
#             resident (bench/verify_overhead), and its detections of 10⁵ damaged C against
#             what the bound promises, 1 and 3 repetitions (bench/verify_detection)
#   batch     operand-aware batching (docs/operations.md): hgemm_load with one resident B per
#             worker's shape, M = 16 × 8192 × 8192 (1 and 64 workers) and M = 1 (1 and 256)
#             over shared memory and the ring, M = 16 over gRPC unary and stream, against a
#             server with --batching=on and one with --batching=off; the batch histograms
#   knobs     bench/grpc_knobs.sh: gRPC's transport knobs (--grpc_arg on the server and
#             hgemm_load) each alone and together at 2048³ c=1 parts 4, 8192³ c=1 parts 8 and
#             2048³ c=16 unary and parts 4, next to the raw-TCP ceiling
#   tls       bench/tls_cost.sh: hgemm_load at 2048³ unary c=16 and 256³ c=64 against plaintext,
#             TLS and TLS + token servers (certificates made at --bundle, valid for 2 days)
#   faults    injected CUDA faults (cuda_fault_test), a real sticky fault (cuda_sticky_fault_test,
#             device_failure_test: health, hgemm_device_failed, UNAVAILABLE through the server),
#             then hgemm_server_fault_injection with a sticky fault after GEMM kernel launch
#             3001 under hgemm_soak's mix: UNAVAILABLE from then on, never a wrong C, the
#             server drains and exits 3
#   soak      bench/hgemm_soak against hgemm_server --backend=cuda: 64 clients, the soak's mix
#             plus large unary GEMMs up to 8192³ (--weight_large=1, Freivalds-checked), until
#             SOAK_REQUESTS (1000000) or SOAK_SECONDS (300); SOAK_IDLE_S (20) idle; SOAK_ARGS
#             more flags, SOAK_SERVER_ARGS the server's (e.g. "--verify
#             --verify_failures_to_retire=0": every GEMM checked, the checks counted from
#             /metrics); GPU memory (nvidia-smi) before the server, after its start, after
#             the soak and its idle time, and after the server
#   pressure  device memory pressure: server/memory_pressure_test against hgemm_server
#             --backend=cuda, LRU eviction off then on: 3 clients upload PRESSURE_UPLOADS (100)
#             matrices of 512 MiB each and keep them (150 GiB: more than the card), beside GEMMs
#             keeping a 512 MiB C, streamed and unrelated unary GEMMs; refusals must name the
#             bytes, unrelated GEMMs must all be right; one table row per run, GPU memory
#             before, at the peak and after
#
# Here:   tools/gpu_e2e.sh --bundle     (builds -c opt, gathers the binaries into .gpu-serve/ and
#                                        packs them into .gpu-pack/serve.tar.xz, small enough
#                                        to carry)
# There:  tar xJf .gpu-pack/serve.tar.xz && tools/gpu_e2e.sh   (logs under $OUT or ./out)
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ${1:-} == --bundle ]]; then
  bazel build -c opt //server:hgemm_server //client:hgemm_client \
    //server/backend:cuda_backend_test \
    //bench:hgemm_load //bench:echo_server //bench:completion_latency //bench:hgemm_soak \
    //server/backend:cuda_fault_test //server/backend:cuda_sticky_fault_test \
    //server:device_failure_test //server:hgemm_server_fault_injection \
    //server:memory_pressure_test //client/c:libhgemm_client.so //bench:tcp_ceiling \
    //bench:bulk_bench //server:cuda_verify_test //server/backend:cuda_verify_kernels_test \
    //bench:verify_overhead //bench:verify_detection \
    //bench:kernel_bench //kernels:batched_gemm_test //kernels:split_k_test \
    //kernels:gemm_correctness_test //server:shm_dma_test //server:cuda_ipc_test \
    //bench:cuda_ipc_load
  ../shared/tools/gpu-bundle.sh --out .gpu-serve bazel-bin/server/hgemm_server \
    bazel-bin/client/hgemm_client bazel-bin/server/backend/cuda_backend_test \
    bazel-bin/bench/hgemm_load bazel-bin/bench/echo_server bazel-bin/bench/completion_latency \
    bazel-bin/bench/hgemm_soak bazel-bin/server/backend/cuda_fault_test \
    bazel-bin/server/backend/cuda_sticky_fault_test bazel-bin/server/device_failure_test \
    bazel-bin/server/hgemm_server_fault_injection bazel-bin/server/memory_pressure_test \
    bazel-bin/client/c/libhgemm_client.so bazel-bin/bench/tcp_ceiling bazel-bin/bench/bulk_bench \
    bazel-bin/server/cuda_verify_test bazel-bin/server/backend/cuda_verify_kernels_test \
    bazel-bin/bench/verify_overhead bazel-bin/bench/verify_detection \
    bazel-bin/bench/kernel_bench bazel-bin/kernels/batched_gemm_test \
    bazel-bin/kernels/split_k_test bazel-bin/kernels/gemm_correctness_test \
    bazel-bin/server/shm_dma_test bazel-bin/server/cuda_ipc_test bazel-bin/bench/cuda_ipc_load
  tools/make_test_certs.sh .gpu-serve/certs  # the GPU machine may have no openssl
  mkdir -p .gpu-pack
  grep -qx "/.gpu-pack/" .git/info/exclude || echo "/.gpu-pack/" >> .git/info/exclude
  tar -cJf .gpu-pack/serve.tar.xz .gpu-serve
  ls -la .gpu-pack
  exit 0
fi

sections=${*:-tests e2e overlap resident}
want() { [[ " $sections " == *" $1 "* ]]; }
out=${OUT:-out}
mkdir -p "$out"
source .gpu-serve/env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"

if want tests; then
  echo "== cuda_backend_test"
  timeout 300 cuda_backend_test 2>&1 | tee "$out/cuda_backend_test.log" |
    grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) |Failure|error" | head -40 || true
  echo "== shm_dma_test"
  timeout 300 shm_dma_test 2>&1 | tee "$out/shm_dma_test.log" |
    grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) |Failure|error" | head -20 || true
  echo "== cuda_ipc_test"
  HGEMM_SERVER_BINARY="$(command -v hgemm_server)" timeout 300 cuda_ipc_test 2>&1 |
    tee "$out/cuda_ipc_test.log" | grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) |Failure|error" |
    head -20 || true
fi

if want latency; then
  echo "== completion latency"
  timeout 120 completion_latency 2>&1 | tee "$out/completion_latency.log"
fi

if want skinny; then
  echo "== skinny M: split-K"
  # The splitk wrappers are experimental (out of auto): opted in here so auto's rows and the
  # auto test show what it would pick with them.
  HGEMM_AUTO_EXPERIMENTAL=1 timeout 300 split_k_test --gtest_brief=1 \
    >"$out/split_k_test.log" 2>&1 &&
    echo "split_k_test rc=0" || echo "split_k_test rc=$?"
  grep -E "^\[  (PASSED|FAILED)  \]|^\[ auto   \]|tests ran" "$out/split_k_test.log" |
    head -30 || true
  # skinny_m16 (among auto's candidates): every case of it, every layout and type.
  timeout 300 gemm_correctness_test --gtest_filter='*skinny_m16*' --gtest_brief=1 \
    >"$out/skinny_correctness.log" 2>&1 && echo "gemm_correctness_test skinny_m16 rc=0" ||
    echo "gemm_correctness_test skinny_m16 rc=$?"
  grep -E "^\[  (PASSED|FAILED)  \]|tests ran" "$out/skinny_correctness.log" | head -20 || true
  HGEMM_AUTO_EXPERIMENTAL=1 timeout 400 kernel_bench --modes skinny --layouts NN,NT \
    --types fp16,bf16 --acc fp32 \
    --csv "$out/kernel_bench_skinny.csv" >"$out/kernel_bench_skinny.log" 2>&1 &&
    echo "kernel_bench skinny rc=0" || echo "kernel_bench skinny rc=$?"
  sed -n "/^fastest own kernel/,\$p" "$out/kernel_bench_skinny.log"
fi

if want scaled; then
  echo "== fused alpha/beta"
  timeout 400 gemm_correctness_test --gtest_filter='Scaled/*' --gtest_brief=1 \
    >"$out/scaled_correctness.log" 2>&1 && echo "gemm_correctness_test Scaled rc=0" ||
    echo "gemm_correctness_test Scaled rc=$?"
  timeout 300 batched_gemm_test --gtest_filter='*Scaled*' --gtest_brief=1 \
    >"$out/scaled_batched.log" 2>&1 && echo "batched_gemm_test Scaled rc=0" ||
    echo "batched_gemm_test Scaled rc=$?"
  timeout 300 split_k_test --gtest_filter='*_alpha*' --gtest_brief=1 \
    >"$out/scaled_split_k.log" 2>&1 && echo "split_k_test scaled rc=0" ||
    echo "split_k_test scaled rc=$?"
  grep -hE "^\[  (PASSED|FAILED)  \]|tests ran" "$out"/scaled_*.log | head -30 || true
  scaled_variants=wgmma_128x256_s4_g8,wgmma_128x128_s6_g8,wgmma_64x128_s8_g8
  scaled_variants+=,splitk2_wgmma_64x128_s8_g8,auto,cublas
  timeout 500 kernel_bench --modes scaled --acc fp32 --layouts NN,NT --types fp16,bf16,fp16_fp32 \
    --shapes 2048x2048x2048,4096x4096x4096,8192x8192x8192,128x8192x8192,16x8192x8192 \
    --variants "$scaled_variants" \
    --csv "$out/kernel_bench_scaled.csv" >"$out/kernel_bench_scaled.log" 2>&1 &&
    echo "kernel_bench scaled rc=0" || echo "kernel_bench scaled rc=$?"
  sed -n "/^fastest own kernel/,\$p" "$out/kernel_bench_scaled.log"
fi

# experimental_kernel NAME PATTERN VARIANTS SHAPES TYPES: an experimental kernel's first run
# (beyond cuBLAS parity): gemm_correctness_test's and batched_gemm_test's cases of the
# variants whose names match PATTERN, then kernel_bench (plain, fp32 accumulation) of VARIANTS at
# SHAPES, every layout, the kernel_bench --types TYPES; CSV in $OUT.
experimental_kernel() {
  local name=$1 pattern=$2 variants=$3 shapes=$4 types=$5 rc=0
  echo "== $name (experimental: out of auto until this has run)"
  timeout 500 gemm_correctness_test --gtest_filter="$pattern" --gtest_brief=1 \
    >"$out/${name}_correctness.log" 2>&1 || rc=$?
  echo "gemm_correctness_test ($pattern) rc=$rc"
  grep -E "^\[  (PASSED|FAILED)  \]|tests ran" "$out/${name}_correctness.log" | head -30 || true
  rc=0
  timeout 300 batched_gemm_test --gtest_filter="$pattern" --gtest_brief=1 \
    >"$out/${name}_batched.log" 2>&1 || rc=$?
  echo "batched_gemm_test ($pattern) rc=$rc"
  grep -E "^\[  (PASSED|FAILED)  \]|tests ran" "$out/${name}_batched.log" | head -30 || true
  rc=0
  timeout 500 kernel_bench --modes plain --acc fp32 --layouts NN,NT,TN,TT \
    --types "$types" --shapes "$shapes" --variants "$variants" \
    --csv "$out/kernel_bench_$name.csv" >"$out/kernel_bench_$name.log" 2>&1 || rc=$?
  echo "kernel_bench $name rc=$rc"
  sed -n "/^fastest own kernel/,\$p" "$out/kernel_bench_$name.log"
}
if want pingpong; then
  experimental_kernel pingpong '*wgmma_pp_*' \
    cublas,wgmma_128x256_s4_g8,wgmma_128x128_s6_g8,wgmma_pp_128x128_s6_g8 \
    2048x2048x2048,4096x4096x4096,8192x8192x8192,4096x4096x4096 fp16,bf16,fp16_fp32,bf16_fp32
fi
if want cluster; then
  experimental_kernel cluster '*cluster2*' cublas,wgmma_128x256_s4_g8,wgmma_128x256_s4_g4_cluster2 \
    4096x4096x4096,8192x8192x8192,8192x8192x8192,8320x8192x8192 fp16,bf16  # C of the input type
fi
if want streamk; then
  experimental_kernel streamk '*g8_sk*' cublas,wgmma_128x256_s4_g8,wgmma_128x256_s4_g8_sk \
    4096x4096x4096,8192x8192x8192,8192x8192x8192,8320x8192x8192 fp16,bf16  # C of the input type
fi

# Waits until a server answers on 127.0.0.1:$1 (30 s at most).
wait_for_server() {
  for _ in $(seq 150); do
    hgemm_client --server=127.0.0.1:$1 --info >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  return 1
}
gpu_memory() { nvidia-smi --query-gpu=memory.used --format=csv,noheader | head -1; }

if want faults; then
  echo "== injected and sticky device faults"
  for t in cuda_fault_test cuda_sticky_fault_test device_failure_test; do
    echo "-- $t"
    timeout 300 "$t" 2>&1 | tee "$out/$t.log" |
      grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) |Failure|NOT_SERVING|other slots|tests ran" |
      head -60 || true
  done
  echo "-- hgemm_server_fault_injection under the soak's mix:" \
    "a sticky fault after GEMM kernel launch 3001"
  fport=50181
  HGEMM_FAULT_STICKY_AFTER=3000 hgemm_server_fault_injection --listen=127.0.0.1:$fport \
    --backend=cuda --streams_per_device=4 --drain_deadline_s=5 >"$out/fault_server.log" 2>&1 &
  fault_pid=$!
  if wait_for_server $fport; then
    # Every C that comes back OK is checked; after the fault every call is refused (UNAVAILABLE),
    # first by the server, then by the closed port. hgemm_soak's own exit status is 1 then (the
    # server is gone): what counts are its lost and wrong figures.
    timeout 200 hgemm_soak --target=127.0.0.1:$fport --server_pid=$fault_pid --clients=64 \
      --requests=20000 --idle_s=0 --call_timeout_s=30 >"$out/fault_soak.log" 2>&1 || true
    grep -vE "^\s*$" "$out/fault_soak.log" | head -40 || true
    timeout 60 tail --pid=$fault_pid -f /dev/null || true
    wait $fault_pid && rc=0 || rc=$?
    echo "hgemm_server_fault_injection exit status $rc (3 expected: every device failed)"
    grep -E "fault injection|FAILED|NOT_SERVING|every device|exit status|stopped|draining" \
      "$out/fault_server.log" | cut -c1-400 | head -20 || true
  else
    echo "FAILED: the fault-injection server did not start"; cat "$out/fault_server.log"
  fi
fi

if want soak; then
  echo "== soak against the CUDA backend (bench/hgemm_soak)"
  sport=50191
  echo "GPU memory used before the server: $(gpu_memory)" | tee "$out/soak_memory.txt"
  # shellcheck disable=SC2086
  hgemm_server --listen=127.0.0.1:$sport --backend=cuda --streams_per_device=4 \
    --resident_ttl_s=3600 --metrics_listen=127.0.0.1:$((sport + 1)) ${SOAK_SERVER_ARGS:-} \
    >"$out/soak_server.log" 2>&1 &
  soak_pid=$!
  if wait_for_server $sport; then
    echo "GPU memory used after the server's start: $(gpu_memory)" | tee -a "$out/soak_memory.txt"
    # The server's VmRSS and the GPU's memory every 10 s: flat after the first minute?
    (while kill -0 $soak_pid 2>/dev/null; do
      echo "$(date +%T) VmRSS" \
        "$(awk '/VmRSS/ {print int($2 / 1024)}' /proc/$soak_pid/status 2>/dev/null) MiB," \
        "GPU $(gpu_memory)"
      sleep 10
    done) >"$out/soak_samples.txt" 2>/dev/null &
    sampler_pid=$!
    # shellcheck disable=SC2086
    timeout $((${SOAK_SECONDS:-300} + 120)) hgemm_soak --target=127.0.0.1:$sport \
      --server_pid=$soak_pid --clients=64 --requests="${SOAK_REQUESTS:-1000000}" \
      --max_seconds="${SOAK_SECONDS:-300}" --idle_s="${SOAK_IDLE_S:-20}" --weight_large=1 \
      ${SOAK_ARGS:-} 2>&1 | tee "$out/soak.log" ||
      echo "FAILED: hgemm_soak (exit status above)"
    echo "GPU memory used after the soak and its idle time: $(gpu_memory)" |
      tee -a "$out/soak_memory.txt"
    curl -s "http://127.0.0.1:$((sport + 1))/metrics" |
      grep -E "^hgemm_(verified_gemms|verify_failures|verify_reruns)_total" || true
    kill -TERM $soak_pid; wait $soak_pid && rc=0 || rc=$?
    echo "soak server exit status $rc"
    kill $sampler_pid 2>/dev/null; wait $sampler_pid 2>/dev/null || true
    echo "every 10 s:"; cat "$out/soak_samples.txt"
    echo "GPU memory used after the server: $(gpu_memory)" | tee -a "$out/soak_memory.txt"
  else
    echo "FAILED: the soak's server did not start"; cat "$out/soak_server.log"
  fi
fi

if want pressure; then
  echo "== device memory pressure (server/memory_pressure_test against the CUDA backend)"
  pport=50195
  for lru in off on; do
    flags=()
    [[ $lru == on ]] && flags=(--resident_lru_eviction)
    echo "-- LRU eviction $lru; GPU memory used before the server: $(gpu_memory)"
    # The per-client quota (32 GiB by default) raised past the card, so that device memory is
    # what runs out.
    hgemm_server --listen=127.0.0.1:$pport --backend=cuda --streams_per_device=4 "${flags[@]}" \
      --resident_quota_bytes=$((1 << 40)) \
      >"$out/pressure_server_lru_$lru.log" 2>&1 &
    pressure_pid=$!
    if wait_for_server $pport; then
      (while kill -0 $pressure_pid 2>/dev/null; do gpu_memory; sleep 2; done) \
        >"$out/pressure_gpu_memory_lru_$lru.txt" 2>/dev/null &
      sampler_pid=$!
      HGEMM_PRESSURE_TARGET=127.0.0.1:$pport HGEMM_PRESSURE_ROWS=262144 \
        HGEMM_PRESSURE_UPLOADS="${PRESSURE_UPLOADS:-100}" timeout 540 memory_pressure_test 2>&1 |
        tee "$out/pressure_lru_$lru.log" |
        grep -E "^LRU|^\[ +(OK|FAILED|SKIPPED) |Failure|Expected|Which|differs|unrelated" |
        head -30 || true
      kill -TERM $pressure_pid; wait $pressure_pid || true
      kill $sampler_pid 2>/dev/null; wait $sampler_pid 2>/dev/null || true
      echo "GPU memory at the peak: $(sort -n "$out/pressure_gpu_memory_lru_$lru.txt" | tail -1);" \
        "after the server: $(gpu_memory)"
    else
      echo "FAILED: the pressure server did not start"; cat "$out/pressure_server_lru_$lru.log"
    fi
  done
fi

port=50151
server_pid=
start_server() {  # $1: streams per device
  hgemm_server --listen=127.0.0.1:$port --backend=cuda --streams_per_device="$1" --log_level=debug \
    >"$out/server_s$1.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 150); do
    hgemm_client --server=127.0.0.1:$port --info >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "server did not start"; cat "$out/server_s$1.log"; exit 1
}
stop_server() { kill -TERM "$server_pid"; wait "$server_pid" || true; }
trap '[[ -n $server_pid ]] && kill -9 $server_pid 2>/dev/null || true' EXIT

client() { timeout 120 hgemm_client --server=127.0.0.1:$port "$@"; }

# Medians of the client table's columns in a log: "client_ms kernel_ms server_ms h2d_ms".
medians() {
  python3 - "$1" <<'PY'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])
        if l.split() and l.split()[0].isdigit() and len(l.split()) > 8]
rows = rows[1:] if len(rows) > 2 else rows  # the first run pays for tuning and warm-up
col = lambda i: statistics.median(float(r[i]) for r in rows)
print(f"n={len(rows)} median client {col(6):.3f} ms, server {col(5):.3f} ms, "
      f"kernel {col(3):.3f} ms, "
      f"h2d {col(2):.3f} ms, d2h {col(4):.3f} ms, queue {col(1):.3f} ms")
PY
}

start_server 4
if want e2e; then
echo "== correctness and timing (4 streams)"
client --info
for shape in 1x1x1 7x5x3 33x65x17 255x257x100 1000x1000x1000 8192x64x4096; do
  for acc in fp16 fp32; do
    client --shape=$shape --accumulation=$acc --check --repeat=2 || echo "FAILED: $shape $acc"
  done
done
client --shape=4096x4096x4096 --kernel=cublas --check --repeat=3 || echo "FAILED: cublas"
client --shape=4097x4096x4095 --check --repeat=2 || echo "FAILED: 4097x4096x4095"
client --shape=8192x8192x8192 --mode=stream --check --repeat=2 || echo "FAILED: streamed 8192"

fi

if want blas; then
  echo "== BLAS forms through the server (bf16, transposes, fp32 C, alpha/beta, batch)"
  client --shape=4096x4096x4096 --dtype=bf16 --transpose_b --check --repeat=2 ||
    echo "FAILED: bf16 NT"
  client --shape=1000x999x1001 --transpose_a --c_dtype=fp32 --check --repeat=2 ||
    echo "FAILED: TN fp32 C"
  client --shape=2048x2048x2048 --alpha=0.5 --beta=2 --check --repeat=2 || echo "FAILED: alpha/beta"
  client --shape=1024x1024x1024 --dtype=bf16 --alpha=1.5 --beta=-1 --mode=stream --check ||
    echo "FAILED: streamed bf16 alpha/beta"
  client --shape=512x512x512 --batch=64 --check --repeat=2 || echo "FAILED: batch 64"
  if want skinny; then  # split-K through the backend's LaunchContext scratch
    client --shape=16x8192x8192 --kernel=splitk2_wgmma_64x128_s8_g8 --check --repeat=2 ||
      echo "FAILED: splitk2 16x8192x8192"
    client --shape=64x4096x8192 --dtype=bf16 --transpose_b --kernel=splitk4_wgmma_128x128_s6_g8 \
      --alpha=0.5 --beta=2 --check --repeat=2 || echo "FAILED: splitk4 bf16 NT alpha/beta"
    client --shape=1x8192x8192 --check --repeat=3 || echo "FAILED: auto 1x8192x8192"
  fi
  # Grouped: shapes from 1 to 2048 (odd ones too), a per-problem launch for now.
  client --group=2048x2048x2048,64x64x64,1x4096x4096,1000x999x1001,512x128x2048,37x5x3 \
    --check --repeat=2 || echo "FAILED: group"
  client --group=1024x512x256,33x17x65,256x1024x512 --dtype=bf16 --transpose_b --c_dtype=fp32 \
    --alpha=0.5 --beta=-1 --check || echo "FAILED: group bf16 NT alpha/beta"
fi

if want resident; then
  echo "== resident operands"
  for mode in none b; do
    client --shape=128x8192x8192 --resident=$mode --repeat=11 --check \
      >"$out/resident_b_$mode.log" ||
      echo "FAILED: resident $mode"
    grep -E "uploaded|check" "$out/resident_b_$mode.log" || true
    echo "128x8192x8192 resident=$mode: $(medians "$out/resident_b_$mode.log")"
  done
  for size in 4096 8192; do
    client --shape=${size}x${size}x${size} --resident=all --repeat=21 --check \
      >"$out/resident_all_$size.log" || echo "FAILED: resident all $size"
    grep -E "uploaded|downloaded|check" "$out/resident_all_$size.log" || true
    echo "${size}^3 resident=all: $(medians "$out/resident_all_$size.log")"
  done
  tail -4 "$out/resident_all_8192.log"
fi

if want floor; then
  echo "== all-resident 8192^3 at concurrency 1 vs the RPC floor with the same idle time"
  load_point() {  # $1: mode; the rest: more hgemm_load flags
    local mode=$1
    shift
    timeout 60 hgemm_load --server=127.0.0.1:$port --shapes=8192x8192x8192 --resident=all \
      --mode="$mode" --concurrency=1 --max_point_s=6 "$@"
  }
  load_point stream >"$out/floor_kernel.log" 2>&1 || echo "FAILED: floor kernel point"
  kernel_us=$(awk '$1 == "service" {k = $(NF - 5)} END {printf "%d", k * 1000}' \
    "$out/floor_kernel.log")
  echo "kernel: ${kernel_us} us"
  echo_server --listen=127.0.0.1:$((port + 3)) --reply_delay_us="$kernel_us" \
    >"$out/floor_echo.log" 2>&1 &
  echo_pid=$!
  sleep 1
  for mode in stream unary; do
    load_point "$mode" --baseline --echo_server=127.0.0.1:$((port + 3)) 2>&1 |
      tee "$out/floor_$mode.log" | grep -E "^(target|service|echo)"
  done
  kill "$echo_pid"
  client --shape=8192x8192x8192 --resident=all --repeat=21 >"$out/floor_client.log" ||
    echo "FAILED: floor hgemm_client"
  echo "hgemm_client 8192^3 resident=all: $(medians "$out/floor_client.log")"
fi

if want overlap; then
echo "== aggregate throughput: 8 concurrent clients x 10 GEMMs of 2048^3, 1 vs 4 streams"
for streams in 1 4; do
  stop_server; start_server "$streams"
  start=$(date +%s.%N)
  clients=()
  for c in $(seq 8); do
    client --shape=2048x2048x2048 --repeat=10 --seed=$c >"$out/load_s${streams}_$c.log" &
    clients+=($!)
  done
  wait "${clients[@]}" || echo "FAILED: a load client"
  end=$(date +%s.%N)
  python3 - "$streams" "$start" "$end" "$out" <<'PY'
import sys, glob, statistics
streams, start, end, out = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
rows = []
for path in glob.glob(f"{out}/load_s{streams}_*.log"):
    for line in open(path):
        f = line.split()
        if len(f) > 8 and f[0].isdigit():
            rows.append([float(x) for x in f[1:8]])
wall = end - start
n = len(rows)
print(f"streams={streams}: {n} GEMMs in {wall:.2f} s = {n/wall:.1f} GEMM/s, "
      f"{n*2*2048**3/wall/1e12:.2f} TFLOP/s end to end; mean server ms: "
      f"queue {statistics.mean(r[0] for r in rows):.2f} "
      f"h2d {statistics.mean(r[1] for r in rows):.2f} "
      f"kernel {statistics.mean(r[2] for r in rows):.3f} "
      f"d2h {statistics.mean(r[3] for r in rows):.2f} "
      f"total {statistics.mean(r[4] for r in rows):.2f}; "
      f"client ms {statistics.mean(r[5] for r in rows):.1f}")
PY
  # The same with little transport: B resident, A sent (2 MiB each way), so that the server's
  # copies and kernels, not gRPC, bound the rate.
  timeout 60 hgemm_load --server=127.0.0.1:$port --shapes=128x8192x8192 --resident=b \
    --concurrency=16 \
    --verify=1 --max_point_s=6 2>&1 | grep -E "^target|^service" | sed "s/^/streams=$streams: /"
done
fi
stop_server
grep -c "status=OK" "$out"/server_s*.log || true

if want copy; then
  echo "== resident operands copied to an idle device" \
    "(--devices=0,0: two schedulers' devices on one GPU)"
  for flag in "" --resident_copy_to_idle_device; do
    hgemm_server --listen=127.0.0.1:$((port + 2)) --backend=cuda --devices=0,0 \
      --streams_per_device=1 \
      --device_memory_fraction=0.4 $flag >"$out/server_copy.log" 2>&1 &
    copy_pid=$!
    timeout 60 hgemm_load --server=127.0.0.1:$((port + 2)) --shapes=2048x2048x2048 --resident=all \
      --concurrency=4 --verify=2 --max_point_s=5 2>&1 | grep -E "^verify|^target|^service" |
      sed "s/^/${flag:-no copy}: /"
    kill -TERM $copy_pid; wait $copy_pid || true
  done
fi

if want load; then
  echo "== load generator sweep"
  timeout 260 bench/load_run.sh --bin "$PWD/.gpu-serve/bin" || echo "FAILED: load_run.sh"
fi
if want load-resident; then
  echo "== load generator: resident operands"
  timeout 400 bench/load_run.sh --resident-only --bin "$PWD/.gpu-serve/bin" ||
    echo "FAILED: load_run.sh"
fi
if want metrics; then
  echo "== cost of the metrics (bench/metrics_cost.sh)"
  OUT="$out" timeout 200 bench/metrics_cost.sh --bin "$PWD/.gpu-serve/bin" ||
    echo "FAILED: metrics_cost.sh"
fi
if want python; then
  echo "== Python client vs hgemm_load (bench/python_client_bench.py)"
  hgemm_server --listen=127.0.0.1:$((port + 4)) --backend=cuda --streams_per_device=4 \
    >"$out/server_python.log" 2>&1 &
  python_pid=$!
  for _ in $(seq 150); do
    hgemm_client --server=127.0.0.1:$((port + 4)) --info >/dev/null 2>&1 && break
    sleep 0.2
  done
  # The Python client's native core (client/c) from the bundle.
  # shellcheck disable=SC2086  # PYTHON_BENCH_ARGS: flags, split on purpose
  HGEMM_NATIVE_LIB=$PWD/.gpu-serve/bin/libhgemm_client.so PYTHONPATH=client/python \
    timeout 420 python3 bench/python_client_bench.py \
    --server=127.0.0.1:$((port + 4)) --hgemm_load="$(command -v hgemm_load)" \
    --csv="$out/python_client_bench.csv" ${PYTHON_BENCH_ARGS:-} |
    tee "$out/python_client_bench.md" ||
    echo "FAILED: python_client_bench"
  kill -TERM $python_pid; wait $python_pid || true
fi
if want dataplane; then
  echo "== the data plane (bench/dataplane.sh)"
  OUT=$out timeout 580 bench/dataplane.sh --bin "$PWD/.gpu-serve/bin" --certs .gpu-serve/certs ||
    echo "FAILED: dataplane.sh"
  OUT=$out timeout 580 bench/dataplane.sh --same_host --bin "$PWD/.gpu-serve/bin" \
    --certs .gpu-serve/certs || echo "FAILED: dataplane.sh --same_host"
fi
if want bulk; then
  echo "== the bulk channel (bench/bulk_bench, hgemm_load)"
  hgemm_server --listen=127.0.0.1:50071 --bulk_listen=127.0.0.1:50072 \
    > "$out/bulk_server.log" 2>&1 &
  bulk_pid=$!
  hgemm_server --listen=127.0.0.1:50073 > "$out/grpc_server.log" 2>&1 &
  grpc_pid=$!
  sleep 5
  for round in 1 2; do
    timeout 120 tcp_ceiling --shape=8192x8192x8192 --sockets=1,4,8 --repeat=5 |
      tee -a "$out/bulk_bench.txt"
    timeout 240 bulk_bench --server=127.0.0.1:50071 --server_pid=$bulk_pid \
      --shape=8192x8192x8192 --lanes=1,4,8 --repeat=5 | tee -a "$out/bulk_bench.txt"
  done
  # Where one GEMM's time goes: Run against its steps, at both sizes the targets name.
  for shape in 8192x8192x8192 2048x2048x2048; do
    timeout 120 bulk_bench --server=127.0.0.1:50071 --shape=$shape --lanes=4,8 --repeat=5 \
      --gemm | tee -a "$out/bulk_bench.txt"
  done
  for server in 127.0.0.1:50073 127.0.0.1:50071; do
    timeout 120 hgemm_load --server=$server --shapes=8192x8192x8192 --concurrency=1 \
      --parallel_parts=8 --max_point_s=20 | tee -a "$out/bulk_load.txt"
    # Many GEMMs at once: lanes run out and the client falls back to gRPC, no errors.
    timeout 120 hgemm_load --server=$server --shapes=2048x2048x2048 --concurrency=1,16 \
      --parallel_parts=4,8 --max_point_s=6 | tee -a "$out/bulk_load.txt"
  done
  kill $bulk_pid $grpc_pid; wait $bulk_pid $grpc_pid 2>/dev/null || true
fi
if want knobs; then
  echo "== gRPC's transport knobs (bench/grpc_knobs.sh)"
  OUT=$out timeout 3000 bench/grpc_knobs.sh --bin "$PWD/.gpu-serve/bin" ||
    echo "FAILED: grpc_knobs.sh"
fi
if want tls; then
  echo "== the cost of TLS (bench/tls_cost.sh)"
  OUT=$out timeout 540 bench/tls_cost.sh --bin "$PWD/.gpu-serve/bin" --certs .gpu-serve/certs ||
    echo "FAILED: tls_cost.sh"
fi
if want verify; then
  echo "== Freivalds' check (docs/verification.md)"
  for t in cuda_verify_kernels_test cuda_verify_test; do
    timeout 300 "$t" --gtest_brief=1 >"$out/$t.log" 2>&1 && echo "$t rc=0" || echo "$t rc=$?"
    grep -E "^\[  (PASSED|FAILED)  \]|tests ran" "$out/$t.log" | head -20 || true
  done
  timeout 200 verify_overhead --sizes 4096,8192 --repeat 20 --csv "$out/verify_overhead.csv" |
    tee "$out/verify_overhead.txt" | sed -n 1,11p
  for repetitions in 1 3; do
    timeout 300 verify_detection --trials $((repetitions == 1 ? 100000 : 30000)) \
      --repetitions $repetitions --csv "$out/verify_detection_$repetitions.csv" || echo "FAILED"
  done
fi
if want batch; then
  echo "== operand-aware batching: --batching=on against off"
  sock=/tmp/hgemm-batch.sock
  for batching in on off; do
    rm -f $sock
    hgemm_server --listen=127.0.0.1:50091 --listen=unix:$sock --allow_shared_memory \
      --batching=$batching --max_queued_requests=4096 --max_queued_per_client=0 \
      --max_regions_per_client=1024 --max_rings_per_client=512 \
      --metrics_listen=127.0.0.1:9491 >"$out/batch_server_$batching.log" 2>&1 &
    batch_pid=$!
    wait_for_server 50091 || { echo "FAILED: the server did not start"; continue; }
    load=(hgemm_load --server=127.0.0.1:50091 --shm_server=unix:$sock --resident=b
          --max_point_s=6 --metrics_url=http://127.0.0.1:9491/metrics
          --csv="$out/batching.csv" --csv_append)
    echo "-- batching $batching"
    timeout 120 "${load[@]}" --transport=shm,ring --shapes=16x8192x8192 --concurrency=1,64
    timeout 120 "${load[@]}" --transport=shm,ring --shapes=1x8192x8192 --concurrency=1,256
    timeout 100 "${load[@]}" --transport=grpc --shapes=16x8192x8192 --concurrency=1,64
    timeout 100 "${load[@]}" --transport=grpc --mode=stream --shapes=16x8192x8192 --concurrency=64
    curl -s http://127.0.0.1:9491/metrics | grep -E "^hgemm_batch_(members|rows)_(sum|count)"
    kill -TERM $batch_pid; wait $batch_pid || true
  done
fi

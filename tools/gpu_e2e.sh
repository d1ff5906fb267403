#!/usr/bin/env bash
# End to end on a GPU machine: the CUDA backend's tests, then hgemm_server (CUDA backend) on
# 127.0.0.1 driven by hgemm_client: correctness for odd shapes and a streamed 8192³, the timing
# metadata, and aggregate throughput with 1 vs 4 CUDA streams at the same client concurrency.
#
# Here:   tools/gpu_e2e.sh --bundle     (builds -c opt, gathers the binaries into .gpu-serve/ and
#                                        packs them into .gpu-pack/serve.tar.xz, small enough to carry)
# There:  tar xJf .gpu-pack/serve.tar.xz && tools/gpu_e2e.sh   (logs under $OUT or ./out)
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ${1:-} == --bundle ]]; then
  bazel build -c opt //server:hgemm_server //client:hgemm_client //server/backend:cuda_backend_test
  ../shared/tools/gpu-bundle.sh --out .gpu-serve bazel-bin/server/hgemm_server \
    bazel-bin/client/hgemm_client bazel-bin/server/backend/cuda_backend_test
  mkdir -p .gpu-pack
  grep -qx "/.gpu-pack/" .git/info/exclude || echo "/.gpu-pack/" >> .git/info/exclude
  tar -cJf .gpu-pack/serve.tar.xz .gpu-serve
  ls -la .gpu-pack
  exit 0
fi

out=${OUT:-out}
mkdir -p "$out"
source .gpu-serve/env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"

echo "== cuda_backend_test"
timeout 300 cuda_backend_test 2>&1 | tee "$out/cuda_backend_test.log" | grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) |Failure|error" || true

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

echo "== correctness and timing (4 streams)"
start_server 4
client --info
for shape in 1x1x1 7x5x3 33x65x17 255x257x100 1000x1000x1000 8192x64x4096; do
  for acc in fp16 fp32; do
    client --shape=$shape --accumulation=$acc --check --repeat=2 || echo "FAILED: $shape $acc"
  done
done
client --shape=4096x4096x4096 --kernel=cublas --check --repeat=3 || echo "FAILED: cublas"
client --shape=4097x4096x4095 --check --repeat=2 || echo "FAILED: 4097x4096x4095"
client --shape=8192x8192x8192 --mode=stream --check --repeat=2 || echo "FAILED: streamed 8192"

echo "== aggregate throughput: 8 concurrent clients x 10 GEMMs of 2048^3, 1 vs 4 streams"
for streams in 1 4; do
  ((streams == 4)) || { stop_server; start_server "$streams"; }
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
      f"queue {statistics.mean(r[0] for r in rows):.2f} h2d {statistics.mean(r[1] for r in rows):.2f} "
      f"kernel {statistics.mean(r[2] for r in rows):.3f} d2h {statistics.mean(r[3] for r in rows):.2f} "
      f"total {statistics.mean(r[4] for r in rows):.2f}; client ms {statistics.mean(r[5] for r in rows):.1f}")
PY
done
stop_server
grep -c "status=0" "$out"/server_s*.log || true

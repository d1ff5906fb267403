#!/usr/bin/env bash
# The data plane in one run: how fast one GEMM's bytes move through each
# path, next to the raw-TCP ceiling of the same bytes. One server listens on TCP and on a Unix
# socket with shared memory allowed; per security mode (plaintext, tls) hgemm_load runs every
# point over gRPC (one call per GEMM), over parallel parts (--parallel_parts), and (plaintext
# only: the socket has no TLS) through shared memory over the socket. bench/tcp_ceiling runs the
# same shapes over 1, 2, 4 and 8 plain sockets first.
#   bench/dataplane.sh [--quick] [--same_host] [--bin DIR] [--certs DIR] [--backend cuda|cpu]
#   --quick    small shapes on the CPU backend (a check of the script, not a measurement)
#   --same_host  instead: the same-host table, one run, plaintext: per point gRPC (one
#              Gemm call over TCP), shm staging (a server with --pin_shared_memory=false), shm
#              DMA (regions pinned, the default), the same regions through a submission ring
#              (--transport=ring) and CUDA IPC (bench/cuda_ipc_load: A, B, C in the client's GPU
#              memory), next to pinned cudaMemcpy bandwidth and the ideal H2D(A+B) + kernel +
#              D2H(C) at that bandwidth; then all-resident (ALL_RESIDENT_SHAPE, 8192³: A, B and
#              C on the GPU) over gRPC unary and through the ring, hgemm_client --repeat=21,
#              against the kernel alone; $OUT/same_host.csv and .md, and with matplotlib
#              the picture bench/same_host_plot.py draws ($OUT/same_host.png)
#              Without a GPU (--quick) the CUDA IPC and memcpy figures are n/a.
#   --bin DIR  where the binaries are (default: tools/gpu_e2e.sh's bundle, else bazel-bin)
#   --certs DIR  made by tools/make_test_certs.sh (default: made now with openssl)
# Env: POINTS ("SHAPE:CONCURRENCY ..."), PARTS (the --parallel_parts sweep), MAX_POINT_S (20),
# MODES ("plaintext tls"), CHANNELS ("grpc bulk": the parts sweep BULK_PARTS (4,8) again against
# a server with --bulk_listen, whose parts move their bytes over its lanes). Writes $OUT (default
# ./out)/dataplane.csv, dataplane_tcp.txt and dataplane.md, the table: per point req/s, p50 and
# wire GB/s of each path, and the best raw-TCP GB/s.
set -euo pipefail
quick=0 same_host=0 bin="" certs="" backend=""
cd "$(dirname "$0")/.."
# shellcheck source=bench/run_lib.sh
source bench/run_lib.sh
while (($#)); do
  bench_option "$@"
  ((taken)) && { shift "$taken"; continue; }
  case $1 in
    --same_host) same_host=1; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "dataplane.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
out=${OUT:-./out}
mkdir -p "$out"
if ((quick)); then
  backend=${backend:-cpu}
  points=${POINTS:-"256x256x256:1 256x256x256:4"}
  parts=${PARTS:-"1,2"}
  window_flags=(--warmup_s=0.3 --window_s=0.5 --stable_windows=2 --max_windows=3 --max_point_s=6)
else
  backend=${backend:-cuda}
  points=${POINTS:-"2048x2048x2048:1 2048x2048x2048:16 8192x8192x8192:1"}
  parts=${PARTS:-"1,2,4,8"}
  window_flags=(--max_point_s="${MAX_POINT_S:-20}")
fi
modes=${MODES:-"plaintext tls"}
channels=${CHANNELS:-"grpc bulk"}
bulk_parts=${BULK_PARTS:-$( ((quick)) && echo 2 || echo 4,8)}

pick_bundle_or_bin_dirs "$bin"
server_bin=$(find_bin hgemm_server)
load_bin=$(find_bin hgemm_load)
tcp_bin=$(find_bin tcp_ceiling)

work=$(mktemp -d)
trap 'rm -rf "$work"; cleanup' EXIT INT TERM
make_certs_unless_given "$work"
port=50181
socket=$work/hgemm.sock

# start_server LOG FLAGS...: hgemm_server on 127.0.0.1:$port with FLAGS besides the ones every
# run has (backend, quiet log, short drain, 2 CPU workers), its output in LOG; returns once it
# listens. stop_server ends it.
start_server() {
  local log=$1
  shift
  local flags=(--listen="127.0.0.1:$port" --backend="$backend" --log_level=warn
               --drain_deadline_s=2 "$@")
  [[ $backend == cpu ]] && flags+=(--cpu_workers=2)
  echo "== hgemm_server ${flags[*]}"
  "$server_bin" "${flags[@]}" >"$log" 2>&1 &
  current=$!
  pids+=("$current")
  wait_port "$port" 120 "$current" "$log"
}
stop_server() {
  kill -TERM "$current"
  wait "$current" || true
  current=""
  pids=()
}

# The same-host table: the paths of one GEMM's bytes on this host, in one run.
if ((same_host)); then
  ipc_bin=$(find_bin cuda_ipc_load 2>/dev/null || true)
  has_gpu=0
  [[ $backend == cuda && -n $ipc_bin ]] && has_gpu=1
  table=$out/same_host.csv
  echo "path,shape,concurrency,requests_per_s,p50_ms,p99_ms,kernel_ms,errors,h2d_gb_per_s\
,d2h_gb_per_s,ideal_ms" >"$table"
  # Pinned cudaMemcpy of each shape's bytes: A + B up, C down.
  declare -A memcpy_line
  for point in $points; do
    shape=${point%%:*}
    if ((has_gpu)) && [[ -z ${memcpy_line[$shape]:-} ]]; then
      memcpy_line[$shape]=$(timeout 120 "$ipc_bin" --memcpy --shape="$shape" | tail -1)
      echo "${memcpy_line[$shape]}"
    fi
  done
  # hgemm_load over one transport against the server now running: its row in the table.
  load_point() {  # path shape concurrency transport-flags...
    local path=$1 shape=$2 concurrency=$3 rows=$work/rows.csv
    shift 3
    rm -f "$rows"
    timeout 540 "$load_bin" --server="127.0.0.1:$port" --shm_server="unix:$socket" --verify=1 \
      --wait_for_server_s=120 --shapes="$shape" --mode=unary --parallel_parts=1 \
      --concurrency="$concurrency" "${window_flags[@]}" --csv="$rows" "$@" \
      >>"$out/same_host_load.log" 2>&1
    python3 - "$rows" "$path" >>"$table" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    if r["target"] in ("service", "shm", "ring"):
        print(",".join([sys.argv[2], r["shape"], r["concurrency"], r["requests_per_s"],
                        r["p50_ms"], r["p99_ms"], r["server_kernel_ms"] or "", r["errors"],
                        "", "", ""]))
PY
  }
  for pinned in false true; do
    start_server "$out/same_host_server_pinned_$pinned.log" --listen="unix:$socket" \
      --allow_shared_memory --allow_cuda_ipc --pin_shared_memory="$pinned"
    for point in $points; do
      IFS=: read -r shape concurrency <<<"$point"
      if [[ $pinned == false ]]; then
        load_point grpc "$shape" "$concurrency" --transport=grpc
        load_point "shm staging" "$shape" "$concurrency" --transport=shm
      else
        load_point "shm dma" "$shape" "$concurrency" --transport=shm
        load_point "ring" "$shape" "$concurrency" --transport=ring
        if ((has_gpu)); then
          # Gemm calls naming the IPC handles, then the same through a submission ring.
          for transport in grpc ring; do
            line=$(timeout 300 "$ipc_bin" --server="unix:$socket" --shape="$shape" \
                     --concurrency="$concurrency" --seconds=5 --transport=$transport | tail -1) ||
              true
            echo "$line"
            # cuda_ipc[_ring] SHAPE CONC REQ/S P50 P99 KERNEL ERRORS
            read -r _ ishape iconc irate ip50 ip99 ikernel ierrors <<<"$line"
            if [[ $transport == ring ]]; then path="cuda ipc ring"; else path="cuda ipc"; fi
            [[ -n ${ierrors:-} ]] &&
              echo "$path,$ishape,$iconc,$irate,$ip50,$ip99,$ikernel,$ierrors,,," >>"$table"
          done
        fi
      fi
    done
    if [[ $pinned == true ]]; then
      # All resident, one GEMM at a time: gRPC unary (kept C) vs the ring (C written in place);
      # the row's p50 and kernel are the medians of hgemm_client's runs 2..21.
      client_bin=$(find_bin hgemm_client)
      resident_shape=${ALL_RESIDENT_SHAPE:-$( ((quick)) && echo 256x256x256 || echo 8192x8192x8192)}
      for path in "all-resident grpc" "all-resident ring"; do
        flags=(--server="unix:$socket" --shape="$resident_shape" --resident=all --repeat=21)
        [[ $path == *ring ]] && flags+=(--transport=ring) || flags+=(--mode=unary)
        timeout 600 "$client_bin" "${flags[@]}" >"$work/client.txt" 2>&1 || true
        cat "$work/client.txt" >>"$out/same_host_load.log"
        python3 - "$work/client.txt" "$path" "$resident_shape" >>"$table" <<'PY'
import statistics, sys
runs = [l.split() for l in open(sys.argv[1]) if l.split() and l.split()[0].isdigit()]
runs = runs[1:] or runs  # run 1 warms up
if runs:
    client = statistics.median(float(r[6]) for r in runs)
    kernel = statistics.median(float(r[3]) for r in runs)
    print(f"{sys.argv[2]},{sys.argv[3]},1,{1000 / client:.1f},{client:.3f},"
          f"{max(float(r[6]) for r in runs):.3f},{kernel:.3f},0,,,")
else:
    print(f"{sys.argv[2]},{sys.argv[3]},1,0,0,0,,1,,,")
PY
      done
    fi
    stop_server
  done
  for shape in "${!memcpy_line[@]}"; do
    # pinned_memcpy SHAPE H2D_GBPS D2H_GBPS H2D_AB_MS D2H_C_MS
    read -r _ _ h2d d2h h2d_ms d2h_ms <<<"${memcpy_line[$shape]}"
    echo "pinned memcpy,$shape,,,,,,,$h2d,$d2h,$h2d_ms+$d2h_ms" >>"$table"
  done
  python3 - "$table" <<'PY' | tee "$out/same_host.md"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
copy = {r["shape"]: r for r in rows if r["path"] == "pinned memcpy"}
kernel = {}
for r in rows:  # a row without a kernel time (gRPC's) is measured against the first row's
    if r["kernel_ms"] and r["shape"] not in kernel:
        kernel[r["shape"]] = float(r["kernel_ms"])
print("ideal: H2D of A+B + kernel + D2H of C at the pinned cudaMemcpy rate, the kernel as the "
      "row reports it (CUDA IPC and all-resident: the kernel alone; all-resident p99 is the "
      "slowest of 20 runs)\n")
print("| shape | conc | path | req/s | p50 ms | p99 ms | kernel ms | p50 / ideal | errors |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    if r["path"] == "pinned memcpy":
        continue
    c = copy.get(r["shape"])
    ideal = None
    own = float(r["kernel_ms"]) if r["kernel_ms"] else kernel.get(r["shape"])
    if r["path"].startswith("all-resident") and r["kernel_ms"]:
        ideal = own  # nothing moves: the kernel alone (its own median)
    elif c and own:
        h2d, d2h = (float(x) for x in c["ideal_ms"].split("+"))
        ideal = own + (0 if r["path"].startswith("cuda ipc") else h2d + d2h)
    ratio = f"{float(r['p50_ms']) / ideal:.2f}" if ideal else "n/a"
    print(f"| {r['shape']} | {r['concurrency']} | {r['path']} | {float(r['requests_per_s']):.1f} | "
          f"{float(r['p50_ms']):.2f} | {float(r['p99_ms']):.2f} | {r['kernel_ms'] or 'n/a'} | "
          f"{ratio} | {r['errors']} |")
print()
for shape, c in copy.items():
    print(f"pinned cudaMemcpy {shape}: A+B up {c['h2d_gb_per_s']} GB/s, C down "
          f"{c['d2h_gb_per_s']} GB/s ({c['ideal_ms']} ms)")
if not copy:
    print("pinned cudaMemcpy and CUDA IPC: n/a (no GPU)")
PY
  py=$(python_with_matplotlib)
  if [[ -n $py ]]; then
    "$py" bench/same_host_plot.py "$table" "$out/same_host.png" ||
      echo "dataplane.sh: the plot failed"
  else
    echo "dataplane.sh: no matplotlib; skipped the plot (bench/same_host_plot.py $table OUT.png)"
  fi
  exit 0
fi

echo "== raw TCP: the same bytes over N plain sockets"
: >"$out/dataplane_tcp.txt"
for point in $points; do
  shape=${point%%:*}
  timeout 120 "$tcp_bin" --shape="$shape" --sockets=1,2,4,8 | tee -a "$out/dataplane_tcp.txt"
done

csv=$out/dataplane.csv
rm -f "$csv"
for mode in $modes; do
  for channel in $channels; do
    server_flags=()
    load_flags=(--server="127.0.0.1:$port" --verify=1 --wait_for_server_s=120)
    # Parallel parts over gRPC (1: one Gemm call), then shared memory (parts do not apply).
    sweeps=("--transport=grpc --parallel_parts=$parts")
    if [[ $mode == tls ]]; then
      server_flags+=(--tls_cert="$certs/server.pem" --tls_key="$certs/server.key")
      load_flags+=(--tls_ca="$certs/ca.pem")
    elif [[ $channel == grpc ]]; then
      server_flags+=(--listen="unix:$socket" --allow_shared_memory)
      load_flags+=(--shm_server="unix:$socket")
      sweeps+=("--transport=shm")
    fi
    if [[ $channel == bulk ]]; then
      # Parallel parts move their bytes over the bulk lanes when the server offers them.
      server_flags+=(--bulk_listen="127.0.0.1:$((port + 1))")
      sweeps=("--transport=grpc --parallel_parts=$bulk_parts")
    fi
    echo "== $mode, bytes over $channel"
    start_server "$out/dataplane_server_${mode}_$channel.log" "${server_flags[@]}"
    for point in $points; do
      IFS=: read -r shape concurrency <<<"$point"
      for sweep in "${sweeps[@]}"; do
        rows=$work/rows.csv
        rm -f "$rows"
        # shellcheck disable=SC2086
        timeout 540 "$load_bin" "${load_flags[@]}" --shapes="$shape" --mode=unary \
          --concurrency="$concurrency" "${window_flags[@]}" --csv="$rows" $sweep 2>&1 |
          tee -a "$out/dataplane_load_$mode.log"
        [[ -f $csv ]] || { printf 'security,channel,'; head -1 "$rows"; } >"$csv"
        tail -n +2 "$rows" | sed "s/^/$mode,$channel,/" >>"$csv"
      done
    done
    stop_server
  done
done

python3 - "$csv" "$out/dataplane_tcp.txt" <<'PY' | tee "$out/dataplane.md"
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["target"] in ("service", "shm")]
tcp = {}
for line in open(sys.argv[2]):
    f = line.split()
    if len(f) >= 5 and f[1].isdigit():
        tcp[f[0]] = max(tcp.get(f[0], 0.0), float(f[4]))
print(f"device: {rows[0]['device']} ({rows[0]['backend']}); wire GB/s = a GEMM's A + B + C bytes "
      "over its p50\n")
print("| shape | conc | security | path | req/s | p50 ms | p99 ms | wire GB/s "
      "| raw TCP best GB/s |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    path = "shm" if r["target"] == "shm" else r["mode"]
    if r["channel"] == "bulk":
        path = f"bulk {path}"
    print(f"| {r['shape']} | {r['concurrency']} | {r['security']} | {path} | "
          f"{float(r['requests_per_s']):.1f} | {float(r['p50_ms']):.2f} | "
          f"{float(r['p99_ms']):.2f} | "
          f"{float(r['gemm_gb_per_s'] or 0):.2f} | {tcp.get(r['shape'], 0.0):.2f} |")
errors = sum(int(r["errors"]) for r in rows)
print(f"\nerrors over all points: {errors}")
PY

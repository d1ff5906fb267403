#!/usr/bin/env bash
# Load benchmark of hgemm-serve: hgemm_server and echo_server on 127.0.0.1, then
# hgemm_load sweeps concurrency for 256³ (unary), 2048³ (stream and unary) and 8192³ (stream),
# every point also against the gRPC byte-echo baseline. Writes under $OUT (default ./out):
#   load.csv  load.png  load_summary.md  load_<shape>.log  load_server.log  load_echo.log
#   load_device.txt
#
# usage (from the repository root):
#   bench/load_run.sh            the full run (GPU machine, CUDA backend; about 3-4 minutes)
#   bench/load_run.sh --quick    small shapes on the CPU backend, about 1 minute (any machine)
#   bench/load_run.sh --resident       also the resident-operand sweep, after the above
#   bench/load_run.sh --resident-only  only the resident-operand sweep (about 4 minutes on a GPU;
#                                      with --quick: small shapes on the CPU backend, ~1 minute)
#     writes load_resident.csv, load_resident_summary.md (p50 vs server kernel time per point)
#     and load_res_<name>.log: 128x8192x8192 with B resident vs none (stream, and unary for B);
#     4096³ and 8192³ with A, B and C resident at concurrency 1,2,4 (unary and stream), and
#     4096³ sent as bytes (stream) for reference. Every point also runs the echo baseline with
#     the bytes the service calls carry (with everything resident: an empty echo, the RPC floor).
# options: --bin DIR (where hgemm_server, hgemm_load, echo_server are; default .gpu/bin when it
#          exists, sourcing .gpu/env.sh, else bazel-bin), --port N (default 50151; echo uses N+1),
#          --backend auto|cuda|cpu (default: cuda, or cpu with --quick)
# env: SERVER_ARGS (extra hgemm_server flags), LOAD_ARGS (extra hgemm_load flags, every run)
#
# Binaries for a GPU machine:
#   ../shared/tools/gpu-bundle.sh //server:hgemm_server //bench:hgemm_load //bench:echo_server
set -euo pipefail

quick=0 bin="" port=50151 backend="" resident=0 plain=1
while (($#)); do
  case $1 in
    --quick) quick=1; shift ;;
    --resident) resident=1; shift ;;
    --resident-only) resident=1; plain=0; shift ;;
    --bin) bin=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "load_run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
out=${OUT:-./out}
mkdir -p "$out"
[[ -n $backend ]] || backend=$([[ $quick == 1 ]] && echo cpu || echo cuda)

# shellcheck source=bench/run_lib.sh
source bench/run_lib.sh
pick_bin_dirs "$bin"
server_bin=$(find_bin hgemm_server)
load_bin=$(find_bin hgemm_load)
echo_bin=$(find_bin echo_server)
bin=$(dirname "$load_bin")

trap cleanup EXIT INT TERM
describe_host "$backend" "$bin" > "$out/load_device.txt" 2>&1
cat "$out/load_device.txt"

server_flags=(--listen="127.0.0.1:$port" --backend="$backend" --log_level=warn --drain_deadline_s=2)
[[ $backend == cpu ]] && server_flags+=(--cpu_workers=2)
# shellcheck disable=SC2206
server_flags+=(${SERVER_ARGS:-})
timeout -s TERM 900 "$server_bin" "${server_flags[@]}" > "$out/load_server.log" 2>&1 &
pids+=($!)
timeout -s TERM 900 "$echo_bin" --listen="127.0.0.1:$((port + 1))" > "$out/load_echo.log" 2>&1 &
pids+=($!)
wait_port "$port" 120 "${pids[0]}" "$out/load_server.log"
wait_port "$((port + 1))" 30 "${pids[1]}" "$out/load_echo.log"

csv=$out/load.csv
failed=0
# run NAME SECONDS hgemm_load-flags...: one sweep, bounded by SECONDS; a failure is noted and
# the next sweep still runs. CSV rows are written point by point, so a cut-off sweep keeps its
# finished points. It runs in the background so that a TERM to this script is handled at once.
run() {
  local name=$1 limit=$2 rc=0
  shift 2
  echo "== $name (at most ${limit} s)"
  # shellcheck disable=SC2086
  timeout -s TERM -k 10 "$limit" "$load_bin" --server="127.0.0.1:$port" --baseline \
      --echo_server="127.0.0.1:$((port + 1))" --csv="$csv" --csv_append "$@" ${LOAD_ARGS:-} \
      > "$out/load_$name.log" 2>&1 &
  current=$!
  wait "$current" || rc=$?
  current=""
  cat "$out/load_$name.log"
  if ((rc != 0)); then
    echo "load_run.sh: $name failed (exit status $rc; 124: timed out)"
    failed=1
  fi
}

if [[ $plain == 0 ]]; then
  :
elif [[ $quick == 1 ]]; then
  rm -f "$csv"
  window=(--warmup_s=0.2 --window_s=0.3 --min_window_requests=5 --max_windows=4 --max_point_s=3)
  run 64_unary 60 --shapes=64x64x64 --mode=unary --concurrency=1,2,4 "${window[@]}"
  run 256_stream 60 --shapes=256x256x256 --mode=stream --concurrency=1,2 "${window[@]}"
  run mix_unary 60 --shapes=64x64x64:3,128x96x160 --mode=unary --concurrency=2 "${window[@]}"
else
  rm -f "$csv"
  window=(--warmup_s=0.5 --window_s=1 --min_window_requests=20 --max_windows=5 --max_point_s=5)
  run 256_unary 100 --shapes=256x256x256 --mode=unary --concurrency=1,2,4,8,16,32,64 "${window[@]}"
  run 2048_stream 100 --shapes=2048x2048x2048 --mode=stream --concurrency=1,2,4,8,16,32,64 \
      "${window[@]}"
  run 2048_unary 60 --shapes=2048x2048x2048 --mode=unary --concurrency=1,4,16,64 "${window[@]}"
  # 384 MiB per call: fewer points, longer windows with fewer calls each.
  run 8192_stream 100 --shapes=8192x8192x8192 --mode=stream --concurrency=1,2,4,8 --verify=1 \
      --warmup_s=1 --window_s=1.5 --min_window_requests=4 --max_windows=4 --max_point_s=8
fi

# Resident operands. Own CSV: load_plot.py draws one line per (shape, mode, target)
# and would mix the resident modes; load_resident_summary.md has the table instead.
if [[ $resident == 1 ]]; then
  plain_csv=$csv
  csv=$out/load_resident.csv
  rm -f "$csv"
  if [[ $quick == 1 ]]; then
    window=(--warmup_s=0.2 --window_s=0.3 --min_window_requests=5 --max_windows=3 --max_point_s=3)
    run res_b_none 60 --shapes=128x512x512 --mode=stream --resident=none --concurrency=1,2 \
        "${window[@]}"
    run res_b_stream 60 --shapes=128x512x512 --mode=stream --resident=b --concurrency=1,2 \
        "${window[@]}"
    run res_b_unary 60 --shapes=128x512x512 --mode=unary --resident=b --concurrency=1,2 \
        "${window[@]}"
    run res_all_unary 60 --shapes=256x256x256 --mode=unary --resident=all --concurrency=1,2,4 \
        "${window[@]}"
    run res_all_stream 60 --shapes=256x256x256 --mode=stream --resident=all --concurrency=1,2,4 \
        "${window[@]}"
  else
    window=(--warmup_s=0.5 --window_s=1 --min_window_requests=10 --max_windows=4 --max_point_s=5)
    # (1) B resident, A sent: 2 MiB up and 2 MiB down per call instead of 130 MiB up.
    run res_b_none 90 --shapes=128x8192x8192 --mode=stream --resident=none --concurrency=1,2,4,8 \
        --verify=1 "${window[@]}"
    run res_b_stream 90 --shapes=128x8192x8192 --mode=stream --resident=b --concurrency=1,2,4,8 \
        --verify=1 "${window[@]}"
    run res_b_unary 90 --shapes=128x8192x8192 --mode=unary --resident=b --concurrency=1,2,4,8 \
        --verify=1 "${window[@]}"
    # (2) A, B and C resident: client-visible latency vs the server's kernel time.
    run res_4096_none 60 --shapes=4096x4096x4096 --mode=stream --resident=none --concurrency=1,2 \
        --verify=1 "${window[@]}"
    run res_4096_all_unary 60 --shapes=4096x4096x4096 --mode=unary --resident=all \
        --concurrency=1,2,4 --verify=1 "${window[@]}"
    run res_4096_all_stream 60 --shapes=4096x4096x4096 --mode=stream --resident=all \
        --concurrency=1,2,4 --verify=1 "${window[@]}"
    run res_8192_all_unary 90 --shapes=8192x8192x8192 --mode=unary --resident=all \
        --concurrency=1,2,4 --verify=1 "${window[@]}"
    run res_8192_all_stream 90 --shapes=8192x8192x8192 --mode=stream --resident=all \
        --concurrency=1,2,4 --verify=1 "${window[@]}"
  fi
  if command -v python3 >/dev/null; then
    if ! timeout 60 python3 - "$csv" > "$out/load_resident_summary.md" <<'PY'; then
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1]))
        if r["target"] == "service" and r["shape"] != "mix"]
with open(sys.argv[1]) as f:
    device = next(csv.DictReader(f), {}).get("device", "?")
print(f"Resident operands, {device} (p50 = client-visible median latency; kernel and server "
      "times are the server's means)\n")
print("| shape | mode | resident | conc | req/s | p50 ms | p99 ms | GB/s on the wire | kernel ms | "
      "server ms | p50 / kernel | p50 - kernel ms | errors |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    p50, kernel = float(r["p50_ms"] or 0), float(r["server_kernel_ms"] or 0)
    ratio = f"{p50 / kernel:.2f}" if kernel > 0 else "-"
    print(f"| {r['shape']} | {r['mode']} | {r['resident']} | {r['concurrency']} | "
          f"{float(r['requests_per_s']):.1f} | {p50:.3f} | {float(r['p99_ms']):.3f} | "
          f"{float(r['payload_gb_per_s']):.3f} | {kernel:.3f} | "
          f"{float(r['server_total_ms'] or 0):.3f} | "
          f"{ratio} | {p50 - kernel:.3f} | {r['errors']} |")
echo = [r for r in csv.DictReader(open(sys.argv[1]))
        if r["target"] == "echo" and r["resident"] == "all"]
if echo:
    print("\nRPC floor (empty echo, same concurrency): " + ", ".join(
        f"{r['shape']} {r['mode']} c{r['concurrency']} p50 {float(r['p50_ms']):.3f} ms"
        for r in echo))
PY
      echo "load_run.sh: resident summary failed"
      failed=1
    fi
    cat "$out/load_resident_summary.md"
  fi
  csv=$plain_csv
fi

py=$(python_with_matplotlib)
if [[ $plain == 0 ]]; then
  :
elif [[ -n $py ]]; then
  timeout 120 "$py" bench/load_plot.py "$csv" "$out/load.png" --summary "$out/load_summary.md" \
      || { echo "load_run.sh: plot failed"; failed=1; }
else
  echo "load_run.sh: no matplotlib; skipped the plot (python3 bench/load_plot.py $csv out.png)"
fi
if [[ -s $out/load_server.log ]]; then
  echo "hgemm_server log (warnings and errors), last lines:"
  tail -5 "$out/load_server.log"
fi
echo "load_run.sh: results in $out (failed=$failed)"
exit "$failed"

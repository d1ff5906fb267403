#!/usr/bin/env bash
# The data plane in one run (issues 27 and 31): how fast one GEMM's bytes move through each
# path, next to the raw-TCP ceiling of the same bytes. One server listens on TCP and on a Unix
# socket with shared memory allowed; per security mode (plaintext, tls) hgemm_load runs every
# point over gRPC (one call per GEMM), over parallel parts (--parallel_parts), and (plaintext
# only: the socket has no TLS) through shared memory over the socket. bench/tcp_ceiling runs the
# same shapes over 1, 2, 4 and 8 plain sockets first.
#   bench/dataplane.sh [--quick] [--bin DIR] [--certs DIR] [--backend cuda|cpu]
#   --quick    small shapes on the CPU backend (a check of the script, not a measurement)
#   --bin DIR  where the binaries are (default: tools/gpu_e2e.sh's bundle, else bazel-bin)
#   --certs DIR  made by tools/make_test_certs.sh (default: made now with openssl)
# Env: POINTS ("SHAPE:CONCURRENCY ..."), PARTS (the --parallel_parts sweep), MAX_POINT_S (20), MODES ("plaintext
# tls"). Writes $OUT (default ./out)/dataplane.csv, dataplane_tcp.txt and dataplane.md, the
# table: per point req/s, p50 and wire GB/s of each path, and the best raw-TCP GB/s.
set -euo pipefail
quick=0 bin="" certs="" backend=""
cd "$(dirname "$0")/.."
# shellcheck source=bench/run_lib.sh
source bench/run_lib.sh
while (($#)); do
  bench_option "$@"
  ((taken)) && { shift "$taken"; continue; }
  case $1 in
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
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

pick_bundle_or_bin_dirs "$bin"
server_bin=$(find_bin hgemm_server)
load_bin=$(find_bin hgemm_load)
tcp_bin=$(find_bin tcp_ceiling)

work=$(mktemp -d)
trap 'rm -rf "$work"; cleanup' EXIT INT TERM
make_certs_unless_given "$work"
port=50181
socket=$work/hgemm.sock

echo "== raw TCP: the same bytes over N plain sockets"
: >"$out/dataplane_tcp.txt"
for point in $points; do
  shape=${point%%:*}
  timeout 120 "$tcp_bin" --shape="$shape" --sockets=1,2,4,8 | tee -a "$out/dataplane_tcp.txt"
done

csv=$out/dataplane.csv
rm -f "$csv"
for mode in $modes; do
  server_flags=(--listen="127.0.0.1:$port" --backend="$backend" --log_level=warn
                --drain_deadline_s=2)
  load_flags=(--server="127.0.0.1:$port" --verify=1 --wait_for_server_s=120)
  # Parallel parts over gRPC (1: one Gemm call), then shared memory (parts do not apply).
  sweeps=("--transport=grpc --parallel_parts=$parts")
  if [[ $mode == tls ]]; then
    server_flags+=(--tls_cert="$certs/server.pem" --tls_key="$certs/server.key")
    load_flags+=(--tls_ca="$certs/ca.pem")
  else
    server_flags+=(--listen="unix:$socket" --allow_shared_memory)
    load_flags+=(--shm_server="unix:$socket")
    sweeps+=("--transport=shm")
  fi
  [[ $backend == cpu ]] && server_flags+=(--cpu_workers=2)
  echo "== $mode: hgemm_server ${server_flags[*]}"
  "$server_bin" "${server_flags[@]}" >"$out/dataplane_server_$mode.log" 2>&1 &
  current=$!
  pids+=("$current")
  wait_port "$port" 120 "$current" "$out/dataplane_server_$mode.log"
  for point in $points; do
    IFS=: read -r shape concurrency <<<"$point"
    for sweep in "${sweeps[@]}"; do
      rows=$work/rows.csv
      rm -f "$rows"
      # shellcheck disable=SC2086
      timeout 540 "$load_bin" "${load_flags[@]}" --shapes="$shape" --mode=unary \
        --concurrency="$concurrency" "${window_flags[@]}" --csv="$rows" $sweep 2>&1 |
        tee -a "$out/dataplane_load_$mode.log"
      [[ -f $csv ]] || { printf 'security,'; head -1 "$rows"; } >"$csv"
      tail -n +2 "$rows" | sed "s/^/$mode,/" >>"$csv"
    done
  done
  kill -TERM "$current"
  wait "$current" || true
  current=""
  pids=()
done

python3 - "$csv" "$out/dataplane_tcp.txt" <<'PY' | tee "$out/dataplane.md"
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["target"] in ("service", "shm")]
tcp = {}
for line in open(sys.argv[2]):
    f = line.split()
    if len(f) == 5 and f[1].isdigit():
        tcp[f[0]] = max(tcp.get(f[0], 0.0), float(f[4]))
print(f"device: {rows[0]['device']} ({rows[0]['backend']}); wire GB/s = a GEMM's A + B + C bytes "
      "over its p50\n")
print("| shape | conc | security | path | req/s | p50 ms | p99 ms | wire GB/s | raw TCP best GB/s |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    path = "shm" if r["target"] == "shm" else r["mode"]
    print(f"| {r['shape']} | {r['concurrency']} | {r['security']} | {path} | "
          f"{float(r['requests_per_s']):.1f} | {float(r['p50_ms']):.2f} | {float(r['p99_ms']):.2f} | "
          f"{float(r['gemm_gb_per_s'] or 0):.2f} | {tcp.get(r['shape'], 0.0):.2f} |")
errors = sum(int(r["errors"]) for r in rows)
print(f"\nerrors over all points: {errors}")
PY

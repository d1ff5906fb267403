#!/usr/bin/env bash
# gRPC's transport knobs, each alone and all together, on the remote data plane: per setting
# one hgemm_server started with its --grpc_arg flags and hgemm_load given the same ones (every
# channel of the client, part connections included), at the points below; per point the wire
# GB/s, the p50 and the client's and the server's CPU milliseconds per GEMM, next to the
# baseline (no --grpc_arg) and bench/tcp_ceiling's best raw-TCP GB/s of the same bytes.
#   bench/grpc_knobs.sh [--quick] [--bin DIR] [--backend cuda|cpu] [--settings "NAME ..."]
#   --quick    small shapes on the CPU backend, short windows (a check of the script)
#   --bin DIR  where hgemm_server, hgemm_load and tcp_ceiling are (default: tools/gpu_e2e.sh's
#              bundle, else bazel-bin)
#   --settings  which of the settings below to run (default: all, baseline first)
# Settings (NAME: the --grpc_arg values; the server and the client get the same):
#   baseline     none: gRPC's defaults
#   read_chunks  grpc.experimental.tcp_read_chunk_size, _min_ and _max_read_chunk_size: reads
#                of 1 MiB to 16 MiB (defaults: 8 KiB first, 256 B to 4 MiB as it adapts)
#   frame        grpc.http2.max_frame_size=16777215 (HTTP/2's largest; default 16 KiB)
#   no_bdp       grpc.http2.bdp_probe=0 (windows stay where lookahead puts them)
#   window       grpc.http2.lookahead_bytes=67108864 (a 64 MiB stream window to start from)
#   zerocopy     grpc.experimental.tcp_tx_zerocopy_enabled=1 with its threshold at 256 KiB
#   together     read_chunks, frame, window and zerocopy at once (BDP probing left on)
# Env: POINTS ("SHAPE:CONCURRENCY:PARTS ...", PARTS a --parallel_parts list, 1 = one Gemm
# call), MAX_POINT_S (20), SETTINGS (as --settings).
# Writes $OUT (default ./out)/grpc_knobs.csv (a row per setting, point and parts),
# grpc_knobs_tcp.txt, the logs, and grpc_knobs.md: the table, and each setting's ratio to the
# baseline.
set -euo pipefail
quick=0 bin="" certs="" backend=""
settings_wanted=${SETTINGS:-}
cd "$(dirname "$0")/.."
# shellcheck source=bench/run_lib.sh
source bench/run_lib.sh
while (($#)); do
  bench_option "$@"
  ((taken)) && { shift "$taken"; continue; }
  case $1 in
    --settings) settings_wanted=$2; shift 2 ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "grpc_knobs.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
out=${OUT:-./out}
mkdir -p "$out"

declare -A setting_args=(
  [baseline]=""
  [read_chunks]="grpc.experimental.tcp_read_chunk_size=1048576
                 grpc.experimental.tcp_min_read_chunk_size=1048576
                 grpc.experimental.tcp_max_read_chunk_size=16777216"
  [frame]="grpc.http2.max_frame_size=16777215"
  [no_bdp]="grpc.http2.bdp_probe=0"
  [window]="grpc.http2.lookahead_bytes=67108864"
  [zerocopy]="grpc.experimental.tcp_tx_zerocopy_enabled=1
              grpc.experimental.tcp_tx_zerocopy_send_bytes_threshold=262144"
)
setting_args[together]="${setting_args[read_chunks]} ${setting_args[frame]}
                        ${setting_args[window]} ${setting_args[zerocopy]}"
settings=${settings_wanted:-"baseline read_chunks frame no_bdp window zerocopy together"}
for s in $settings; do
  [[ -v setting_args[$s] ]] || { echo "grpc_knobs.sh: no setting $s" >&2; exit 2; }
done

if ((quick)); then
  backend=${backend:-cpu}
  points=${POINTS:-"256x256x256:1:2 256x256x256:4:1,2"}
  window_flags=(--warmup_s=0.3 --window_s=0.5 --stable_windows=2 --max_windows=3
                --max_point_s=6)
else
  backend=${backend:-cuda}
  points=${POINTS:-"2048x2048x2048:1:4 8192x8192x8192:1:8 2048x2048x2048:16:1,4"}
  window_flags=(--max_point_s="${MAX_POINT_S:-20}")
fi

pick_bundle_or_bin_dirs "$bin"
server_bin=$(find_bin hgemm_server)
load_bin=$(find_bin hgemm_load)
tcp_bin=$(find_bin tcp_ceiling)
work=$(mktemp -d)
trap 'rm -rf "$work"; cleanup' EXIT INT TERM
port=50183

cpu_ms() {  # pid: its user + system CPU time so far, in ms
  awk -v hz="$(getconf CLK_TCK)" '{ sub(/.*\) /, ""); print ($12 + $13) * 1000 / hz }' \
    "/proc/$1/stat"
}

describe_host "$backend" "$(dirname "$server_bin")" | tee "$out/grpc_knobs_host.txt"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/grpc_knobs_host.txt"

echo "== raw TCP: the same bytes over N plain sockets"
: >"$out/grpc_knobs_tcp.txt"
for point in $points; do
  shape=${point%%:*}
  grep -q "^$shape " "$out/grpc_knobs_tcp.txt" 2>/dev/null && continue
  timeout 120 "$tcp_bin" --shape="$shape" --sockets=1,2,4,8 | tee -a "$out/grpc_knobs_tcp.txt"
done

csv=$out/grpc_knobs.csv
{
  printf 'setting,grpc_args,shape,concurrency,parts,requests,requests_per_s,p50_ms,p99_ms,'
  echo 'gemm_gb_per_s,client_cpu_ms_per_gemm,server_cpu_ms_per_gemm,errors'
} >"$csv"
for setting in $settings; do
  grpc_flags=()
  for arg in ${setting_args[$setting]}; do grpc_flags+=("--grpc_arg=$arg"); done
  server_flags=(--listen="127.0.0.1:$port" --backend="$backend" --log_level=warn
                --drain_deadline_s=2 "${grpc_flags[@]}")
  [[ $backend == cpu ]] && server_flags+=(--cpu_workers=2)
  echo "== $setting: hgemm_server ${server_flags[*]}"
  "$server_bin" "${server_flags[@]}" >"$out/grpc_knobs_server_$setting.log" 2>&1 &
  current=$!
  pids=("$current")
  wait_port "$port" 120 "$current" "$out/grpc_knobs_server_$setting.log"
  for point in $points; do
    IFS=: read -r shape concurrency parts_list <<<"$point"
    for parts in ${parts_list//,/ }; do
      rows=$work/rows.csv
      rm -f "$rows"
      server_before=$(cpu_ms "$current")
      timeout 540 "$load_bin" --server="127.0.0.1:$port" --verify=1 --wait_for_server_s=120 \
        --shapes="$shape" --mode=unary --concurrency="$concurrency" --parallel_parts="$parts" \
        "${window_flags[@]}" "${grpc_flags[@]}" --csv="$rows" 2>&1 |
        tee -a "$out/grpc_knobs_load_$setting.log"
      server_after=$(cpu_ms "$current")
      # The server's CPU over the whole run (warm-up and the verified GEMM included) per GEMM
      # it served; the client's is hgemm_load's own, over its measured windows.
      python3 - "$rows" "$setting" "${setting_args[$setting]}" "$parts" \
        "$((${server_after%.*} - ${server_before%.*}))" >>"$csv" <<'PY'
import csv, sys
rows_path, setting, args, parts, server_ms = sys.argv[1:6]
for r in csv.DictReader(open(rows_path)):
    if r["target"] != "service":
        continue
    served = int(r["requests"]) + int(r["warmup_requests"] or 0) + 1
    print(",".join([setting, '"' + " ".join(args.split()) + '"', r["shape"], r["concurrency"],
                    parts, r["requests"], r["requests_per_s"], r["p50_ms"], r["p99_ms"],
                    r["gemm_gb_per_s"] or "0", r["client_cpu_ms"] or "",
                    f"{int(server_ms) / served:.2f}", r["errors"]]))
PY
    done
  done
  kill -TERM "$current"
  wait "$current" || true
  current=""
  pids=()
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/grpc_knobs_host.txt"

python3 - "$csv" "$out/grpc_knobs_tcp.txt" "$out/grpc_knobs_host.txt" <<'PY' |
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
tcp = {}
for line in open(sys.argv[2]):
    f = line.split()
    if len(f) >= 5 and f[1].isdigit():
        tcp[f[0]] = max(tcp.get(f[0], 0.0), float(f[4]))
print("".join(f"{line}  \n" for line in open(sys.argv[3]).read().splitlines()))
print("wire GB/s = a GEMM's A + B + C bytes over its p50; CPU ms per GEMM: the client's over its "
      "measured windows, the server's over the whole run (warm-up included); × baseline: "
      "GB/s against the baseline's at the same point\n")
print("| setting | shape | conc | parts | req/s | p50 ms | wire GB/s | × baseline | client CPU ms "
      "| server CPU ms | raw TCP best GB/s | errors |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
base = {(r["shape"], r["concurrency"], r["parts"]): float(r["gemm_gb_per_s"])
        for r in rows if r["setting"] == "baseline"}
for r in rows:
    key = (r["shape"], r["concurrency"], r["parts"])
    gbps = float(r["gemm_gb_per_s"])
    ratio = f"{gbps / base[key]:.2f}" if base.get(key) else "n/a"
    print(f"| {r['setting']} | {r['shape']} | {r['concurrency']} | {r['parts']} | "
          f"{float(r['requests_per_s']):.1f} | {float(r['p50_ms']):.2f} | {gbps:.2f} | {ratio} | "
          f"{r['client_cpu_ms_per_gemm']} | {r['server_cpu_ms_per_gemm']} | "
          f"{tcp.get(r['shape'], 0.0):.2f} | {r['errors']} |")
print("\nsettings: " + "; ".join(sorted({f"{r['setting']}: {r['grpc_args'] or 'defaults'}"
                                         for r in rows})))
PY
  tee "$out/grpc_knobs.md"

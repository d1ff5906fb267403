#!/usr/bin/env bash
# What the server's metrics cost: one hgemm_load point (default 256³ unary, 64
# workers, closed loop) against an hgemm_server without --metrics_listen, then against a fresh
# one with it; same flags otherwise and the same process layout (server and hgemm_load as
# separate processes on 127.0.0.1). The run with metrics also reads /metrics around its point
# (hgemm_load --metrics_url: the server's own call count and stage means in the table, checked
# against the client's count) and keeps the text of /metrics after the point.
# Writes under $OUT (default ./out):
#   metrics_cost_summary.md   req/s, p50, p99 without and with metrics, the difference, the
#                             server's view of the point and the main series of /metrics
#   metrics_cost_{off,on}[_N].csv / .log       hgemm_load's CSV and table per run
#   metrics_cost_server_{off,on}[_N].log      the servers' logs
#   metrics_after_point.txt   GET /metrics after the (last) point with metrics
#   metrics_cost_device.txt   where it ran
#
# usage (from the repository root):
#   bench/metrics_cost.sh           the H200 measurement: 256x256x256 unary c=64, CUDA backend
#   bench/metrics_cost.sh --quick   CPU backend, 64x64x64, c=8, short windows (any machine)
# options: --shape MxNxK, --concurrency N, --mode unary|stream, --runs N (N off/on pairs,
#          alternating; default 1), --bin DIR (as bench/load_run.sh), --port N (default 50161;
#          metrics on N+1), --backend auto|cuda|cpu (default cuda, or cpu with --quick)
# env: SERVER_ARGS (extra hgemm_server flags), LOAD_ARGS (extra hgemm_load flags)
set -euo pipefail

quick=0 bin="" port=50161 backend="" shape="" concurrency="" mode=unary runs=1
while (($#)); do
  case $1 in
    --quick) quick=1; shift ;;
    --shape) shape=$2; shift 2 ;;
    --concurrency) concurrency=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "metrics_cost.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
out=${OUT:-./out}
mkdir -p "$out"
if [[ $quick == 1 ]]; then
  : "${backend:=cpu}" "${shape:=64x64x64}" "${concurrency:=8}"
  window=(--warmup_s=0.3 --window_s=0.5 --min_window_requests=10 --max_windows=4 --max_point_s=4)
else
  : "${backend:=cuda}" "${shape:=256x256x256}" "${concurrency:=64}"
  window=(--warmup_s=1 --window_s=1 --min_window_requests=50 --max_windows=8 --max_point_s=12)
fi

# shellcheck source=bench/run_lib.sh
source bench/run_lib.sh
pick_bin_dirs "$bin"
server_bin=$(find_bin hgemm_server)
load_bin=$(find_bin hgemm_load)
trap cleanup EXIT INT TERM
describe_host "$backend" "$(dirname "$load_bin")" > "$out/metrics_cost_device.txt" 2>&1
cat "$out/metrics_cost_device.txt"

metrics_port=$((port + 1))
http_get() {  # port path: the body of GET path from 127.0.0.1:port (bash's /dev/tcp, no curl)
  local response
  exec 3<>"/dev/tcp/127.0.0.1/$1"
  printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
  response=$(cat <&3)
  exec 3<&-
  [[ $response == "HTTP/1."?" 200 "* ]] ||
    { echo "metrics_cost.sh: GET $2: ${response%%$'\r'*}" >&2; return 1; }
  printf '%s\n' "${response#*$'\r\n\r\n'}"
}

# measure NAME with|without: a fresh server, one hgemm_load point, the server stopped again.
failed=0
measure() {
  local name=$1 flags=() load_flags=() rc=0
  flags=(--listen="127.0.0.1:$port" --backend="$backend" --log_level=warn --drain_deadline_s=2)
  [[ $backend == cpu ]] && flags+=(--cpu_workers=2)
  if [[ $2 == with ]]; then
    flags+=(--metrics_listen="127.0.0.1:$metrics_port")
    load_flags=(--metrics_url="http://127.0.0.1:$metrics_port/metrics")
  fi
  # shellcheck disable=SC2206
  flags+=(${SERVER_ARGS:-})
  timeout -s TERM 600 "$server_bin" "${flags[@]}" > "$out/metrics_cost_server_$name.log" 2>&1 &
  pids=($!)
  wait_port "$port" 120 "${pids[0]}" "$out/metrics_cost_server_$name.log"
  echo "== $name: $shape $mode c=$concurrency, server ${2} --metrics_listen"
  # shellcheck disable=SC2086
  timeout -s TERM -k 10 120 "$load_bin" --server="127.0.0.1:$port" --shapes="$shape" \
      --mode="$mode" \
      --concurrency="$concurrency" --verify=1 --csv="$out/metrics_cost_$name.csv" "${window[@]}" \
      "${load_flags[@]}" ${LOAD_ARGS:-} > "$out/metrics_cost_$name.log" 2>&1 &
  current=$!
  wait "$current" || rc=$?
  current=""
  cat "$out/metrics_cost_$name.log"
  if ((rc != 0)); then
    echo "metrics_cost.sh: hgemm_load ($name) failed (exit status $rc; 124: timed out)"
    failed=1
  fi
  if [[ $2 == with ]]; then
    http_get "$metrics_port" /metrics > "$out/metrics_after_point.txt" || failed=1
  fi
  kill -TERM "${pids[0]}"
  wait "${pids[0]}" || true
  pids=()
}

names=()
for ((i = 1; i <= runs; i++)); do
  suffix=$([[ $runs == 1 ]] && echo "" || echo "_$i")
  measure "off$suffix" without
  measure "on$suffix" with
  names+=("off$suffix" "on$suffix")
done

if command -v python3 >/dev/null; then
  if ! timeout 60 python3 - "$out" "${names[@]}" > "$out/metrics_cost_summary.md" <<'PY'; then
import csv, os, re, sys
out, names = sys.argv[1], sys.argv[2:]
rows = {}
for n in names:
    with open(os.path.join(out, f"metrics_cost_{n}.csv")) as f:
        r = [x for x in csv.DictReader(f) if x["target"] == "service"]
    rows[n] = r[0] if r else None
first = next((r for r in rows.values() if r), {})
print(f"# Cost of --metrics_listen: {first.get('shape', '?')} {first.get('mode', '?')}, "
      f"concurrency {first.get('concurrency', '?')}, {first.get('device', '?')} "
      f"({first.get('backend', '?')})\n")
print("| run | metrics | req/s | p50 ms | p99 ms | server ms (client's view) | errors | calls | "
      "/metrics count | agree |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
for n, r in rows.items():
    if not r:
        print(f"| {n} | | no result | | | | | | | |")
        continue
    on = n.startswith("on")
    agree = ('yes' if r['metrics_agree'] == '1' else 'NO') if on else '-'
    print(f"| {n} | {'on' if on else 'off'} | {float(r['requests_per_s']):.1f} | "
          f"{float(r['p50_ms']):.3f} | {float(r['p99_ms']):.3f} | "
          f"{float(r['server_total_ms'] or 0):.3f} | {r['errors']} | {r['calls']} | "
          f"{r['metrics_requests'] or '-'} | {agree} |")
def mean(prefix):
    v = [float(r["requests_per_s"]) for n, r in rows.items() if r and n.startswith(prefix)]
    return sum(v) / len(v) if v else 0
off, on = mean("off"), mean("on")
if off > 0 and on > 0:
    print(f"\nreq/s with metrics {on:.1f} vs without {off:.1f}: {100 * (on - off) / off:+.2f} % "
          f"({len(names) // 2} run(s) each; a single run's noise is a few %)")
last_on = [n for n in names if n.startswith("on")][-1]
with open(os.path.join(out, f"metrics_cost_{last_on}.log")) as f:
    server_lines = [l.rstrip() for l in f if "/metrics:" in l or "WARNING" in l]
print(f"\n## The server's view of the point ({last_on}, hgemm_load --metrics_url)\n")
print("```\n" + "\n".join(server_lines) + "\n```")
r = rows.get(last_on)
if r:
    print(f"\nhgemm_load's own numbers for the same point: "
          f"{float(r['requests_per_s']):.1f} req/s over the "
          f"measured windows, {r['calls']} calls in all (warm-up included); server timing from the "
          f"replies: queue {float(r['server_queue_ms'] or 0):.3f} ms, "
          f"kernel {float(r['server_kernel_ms'] or 0):.3f} ms, "
          f"server total {float(r['server_total_ms'] or 0):.3f} ms.")
keep = re.compile(r"^(hgemm_requests_total|hgemm_gemm_stage_seconds_(sum|count)|"
                  r"hgemm_(received|sent)_bytes_total|"
                  r"hgemm_queued_gemms|hgemm_running_gemms|hgemm_kernel_tflops|hgemm_build_info)\b")
path = os.path.join(out, "metrics_after_point.txt")
if os.path.exists(path):
    with open(path) as f:
        series = [l.rstrip() for l in f if keep.match(l)]
    print("\n## /metrics after the point (main series; all of it in metrics_after_point.txt)\n")
    print("```\n" + "\n".join(series) + "\n```")
PY
    echo "metrics_cost.sh: summary failed"
    failed=1
  fi
  cat "$out/metrics_cost_summary.md"
fi
echo "metrics_cost.sh: results in $out (failed=$failed)"
exit "$failed"

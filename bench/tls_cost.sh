#!/usr/bin/env bash
# The cost of TLS: hgemm_server on 127.0.0.1 once per security mode, hgemm_load at
# the same points against each, then one table (req/s and latency per mode, and TLS vs
# plaintext). Modes:
#   plaintext   no TLS, no authentication (the baseline)
#   tls         TLS (test certificates: EC P-256), no authentication
#   tls+token   TLS and a bearer token checked against --auth_tokens_file on every call
# Writes under $OUT (default ./out): tls_cost.csv (hgemm_load's CSV plus a security column),
# tls_cost.md (the table), tls_cost_<mode>.log (server logs), tls_cost_load_<mode>.log.
#
# usage (from the repository root):
#   bench/tls_cost.sh             on the GPU machine: 2048x2048x2048 unary c=16, 256x256x256 c=64
#   bench/tls_cost.sh --quick     small shapes on the CPU backend (any machine, about a minute)
# options: --bin DIR (hgemm_server and hgemm_load; default .gpu-serve/bin, else bazel-bin),
#          --certs DIR (made by tools/make_test_certs.sh; default: made now with openssl),
#          --points "SHAPE:MODE:CONCURRENCY ..." (MODE unary or stream),
#          --modes "plaintext tls ...",
#          --port N (default 50171), --backend auto|cuda|cpu (default cuda, cpu with --quick)
# env: SERVER_ARGS (extra hgemm_server flags), LOAD_ARGS (extra hgemm_load flags)
set -euo pipefail

quick=0 bin="" certs="" port=50171 backend="" points="" modes="plaintext tls tls+token"
cd "$(dirname "$0")/.."
# shellcheck source=bench/run_lib.sh
source bench/run_lib.sh
while (($#)); do
  bench_option "$@"
  ((taken)) && { shift "$taken"; continue; }
  case $1 in
    --points) points=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "tls_cost.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
out=${OUT:-./out}
mkdir -p "$out"
if ((quick)); then
  backend=${backend:-cpu}
  points=${points:-"128x128x128:unary:4 64x64x64:unary:16"}
  window_flags=(--warmup_s=0.5 --window_s=1 --stable_windows=2 --max_windows=4 --max_point_s=10)
else
  backend=${backend:-cuda}
  points=${points:-"2048x2048x2048:unary:16 256x256x256:unary:64"}
  window_flags=()
fi

pick_bundle_or_bin_dirs "$bin"
server_bin=$(find_bin hgemm_server)
load_bin=$(find_bin hgemm_load)

work=$(mktemp -d)
server_pid=""
# shellcheck disable=SC2317  # invoked by the trap
cleanup() {
  [[ -n $server_pid ]] && kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
make_certs_unless_given "$work"
token=tls-cost-token
echo "$token" >"$work/token"
echo "bench $(printf %s "$token" | sha256sum | cut -d' ' -f1)" >"$work/tokens"

csv=$out/tls_cost.csv
rm -f "$csv"
for mode in $modes; do
  server_flags=(--listen="127.0.0.1:$port" --backend="$backend" --log_level=warn
    --drain_deadline_s=2)
  load_flags=(--server="127.0.0.1:$port" --verify=1 --wait_for_server_s=120)
  case $mode in
    plaintext) ;;
    tls | tls+token)
      server_flags+=(--tls_cert="$certs/server.pem" --tls_key="$certs/server.key")
      load_flags+=(--tls_ca="$certs/ca.pem")
      if [[ $mode == tls+token ]]; then
        server_flags+=(--auth_tokens_file="$work/tokens")
        load_flags+=(--token_file="$work/token")
      fi ;;
    *) echo "tls_cost.sh: unknown mode $mode" >&2; exit 2 ;;
  esac
  [[ $backend == cpu ]] && server_flags+=(--cpu_workers=2)
  # shellcheck disable=SC2206
  server_flags+=(${SERVER_ARGS:-})
  echo "== $mode: hgemm_server ${server_flags[*]}"
  "$server_bin" "${server_flags[@]}" >"$out/tls_cost_$mode.log" 2>&1 &
  server_pid=$!
  for point in $points; do
    IFS=: read -r shape call concurrency <<<"$point"
    rows=$work/rows.csv
    rm -f "$rows"
    # shellcheck disable=SC2086,SC2206
    "$load_bin" "${load_flags[@]}" --shapes="$shape" --mode="$call" --concurrency="$concurrency" \
      "${window_flags[@]}" --csv="$rows" ${LOAD_ARGS:-} 2>&1 | tee -a "$out/tls_cost_load_$mode.log"
    # hgemm_load's rows with the mode in front (one header).
    [[ -f $csv ]] || { printf 'security,'; head -1 "$rows"; } >"$csv"
    tail -n +2 "$rows" | sed "s/^/$mode,/" >>"$csv"
  done
  kill -TERM "$server_pid"
  wait "$server_pid" || true
  server_pid=""
done

python3 - "$csv" <<'PY' | tee "$out/tls_cost.md"
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["target"] == "service"]
modes = list(dict.fromkeys(r["security"] for r in rows))
points = list(dict.fromkeys((r["shape"], r["mode"], r["concurrency"]) for r in rows))
by = {(r["security"], r["shape"], r["mode"], r["concurrency"]): r for r in rows}
print(f"device: {rows[0]['device']} ({rows[0]['backend']})\n")
head = ["shape", "call", "conc"]
for m in modes:
    head += [f"{m} req/s", f"{m} p50 ms", f"{m} p99 ms"]
head += [f"{m} vs plaintext req/s" for m in modes if m != "plaintext" and "plaintext" in modes]
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for shape, call, conc in points:
    cells = [shape, call, conc]
    for m in modes:
        r = by.get((m, shape, call, conc))
        cells += [f"{float(r['requests_per_s']):.1f}", f"{float(r['p50_ms']):.2f}",
                  f"{float(r['p99_ms']):.2f}"] if r else ["-"] * 3
    base = by.get(("plaintext", shape, call, conc))
    for m in modes:
        if m == "plaintext" or "plaintext" not in modes:
            continue
        r = by.get((m, shape, call, conc))
        cells.append(f"{float(r['requests_per_s']) / float(base['requests_per_s']):.3f}"
                     if r and base and float(base["requests_per_s"]) > 0 else "-")
    print("| " + " | ".join(cells) + " |")
errors = sum(int(r["errors"]) for r in rows)
print(f"\nfailed calls: {errors}")
PY

#!/usr/bin/env bash
# A/B of two hgemm_server builds on one machine in one run: the servers take turns (new, old,
# new, old, ...), each driven by the same hgemm_load at the same points, so that host and GPU
# drift hit both alike. Prints a markdown table (one row per server run) and the mean of each
# point per server; writes every point to OUT/ab.csv.
#   bench/ab_servers.sh OLD_SERVER NEW_SERVER OUT_DIR [ROUNDS]
# Both servers' libraries must be on LD_LIBRARY_PATH (one gpu-bundle.sh bundle holding both,
# its env.sh sourced) and hgemm_load on PATH. Points (does a change keep speed?): 2048³ unary
# c=16, 128×8192×8192 with B resident c=4, 8192³ all resident c=1; AB_POINTS (hgemm_load flag
# sets separated by ';') replaces them, e.g. for a quick try on the CPU backend.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/run_lib.sh
source bench/run_lib.sh
(($# >= 3)) || { sed -n '2,9p' "$0"; exit 2; }
old=$1 new=$2 out=$3 rounds=${4:-2}
mkdir -p "$out"
trap cleanup EXIT INT TERM
load=$(command -v hgemm_load)
points=(
  "--shapes=2048x2048x2048 --mode=unary --concurrency=16"
  "--shapes=128x8192x8192 --mode=unary --resident=b --concurrency=4"
  "--shapes=8192x8192x8192 --mode=unary --resident=all --concurrency=1"
)
[[ -n ${AB_POINTS:-} ]] && IFS=';' read -r -a points <<<"$AB_POINTS"
describe_host cuda "$old vs $new" | tee "$out/ab_host.txt"
rm -f "$out/ab.csv"
port=50400
rows=()
for round in $(seq "$rounds"); do
  for side in new old; do
    server=$new
    [[ $side == old ]] && server=$old
    port=$((port + 1))
    timeout 600 "$server" \
      --listen=127.0.0.1:$port --backend=auto >"$out/server_${side}_$round.log" 2>&1 &
    pids+=($!)
    wait_port $port 60 $! "$out/server_${side}_$round.log"
    row="| $round | $side |"
    for point in "${points[@]}"; do
      csv=$out/point.csv
      # shellcheck disable=SC2086  # the point is a list of flags
      "$load" --server=127.0.0.1:$port $point --max_point_s=5 --verify=1 --csv="$csv" \
        >>"$out/load_${side}_$round.log" 2>&1
      rps=$(awk -F, 'NR == 2 {print $12}' "$csv")
      p50=$(awk -F, 'NR == 2 {print $13}' "$csv")
      row+=" $rps | $p50 |"
      awk -F, -v side="$side" -v round="$round" 'NR == 2 {print side "," round "," $0}' "$csv" \
        >>"$out/ab.csv"
    done
    rows+=("$row")
    kill -TERM "${pids[-1]}"
    wait "${pids[-1]}" || true
  done
done
echo
header="| round | server |" rule="| --- | --- |"
for i in "${!points[@]}"; do
  echo "point $((i + 1)): ${points[$i]}"
  header+=" $((i + 1)) req/s | $((i + 1)) p50 ms |" rule+=" ---: | ---: |"
done
echo
echo "$header"
echo "$rule"
printf '%s\n' "${rows[@]}"
echo
# Means per server and point (CSV columns: side, round, then hgemm_load's; shape is 10, req/s 14).
awk -F, '{n[$1 "," $10 "," $7]++; s[$1 "," $10 "," $7] += $14}
         END {for (k in n) printf "mean %s: %.1f req/s over %d runs\n", k, s[k] / n[k], n[k]}' \
  "$out/ab.csv" | sort

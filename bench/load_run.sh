#!/usr/bin/env bash
# Load benchmark of hgemm-serve (issue 6): hgemm_server and echo_server on 127.0.0.1, then
# hgemm_load sweeps concurrency for 256³ (unary), 2048³ (stream and unary) and 8192³ (stream),
# every point also against the gRPC byte-echo baseline. Writes under $OUT (default ./out):
#   load.csv  load.png  load_summary.md  load_<shape>.log  load_server.log  load_echo.log  load_device.txt
#
# usage (from the repository root):
#   bench/load_run.sh            the full run (GPU machine, CUDA backend; about 3-4 minutes)
#   bench/load_run.sh --quick    small shapes on the CPU backend, about 1 minute (any machine)
# options: --bin DIR (where hgemm_server, hgemm_load, echo_server are; default .gpu/bin when it
#          exists, sourcing .gpu/env.sh, else bazel-bin), --port N (default 50151; echo uses N+1),
#          --backend auto|cuda|cpu (default: cuda, or cpu with --quick)
# env: SERVER_ARGS (extra hgemm_server flags), LOAD_ARGS (extra hgemm_load flags, every run)
#
# Binaries for a GPU machine:
#   ../shared/tools/gpu-bundle.sh //server:hgemm_server //bench:hgemm_load //bench:echo_server
set -euo pipefail

quick=0 bin="" port=50151 backend=""
while (($#)); do
  case $1 in
    --quick) quick=1; shift ;;
    --bin) bin=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "load_run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
out=${OUT:-./out}
mkdir -p "$out"
[[ -n $backend ]] || backend=$([[ $quick == 1 ]] && echo cpu || echo cuda)

bin_dirs=()
if [[ -n $bin ]]; then
  bin_dirs=("$bin")
elif [[ -x .gpu/bin/hgemm_load ]]; then
  # shellcheck disable=SC1091
  source .gpu/env.sh
  bin_dirs=(.gpu/bin)
else
  # bazel-bin follows the last build's configuration; look in each.
  bin_dirs=(bazel-bin bazel-out/k8-fastbuild/bin bazel-out/k8-opt/bin)
fi
find_bin() {  # name → path (a flat bundle dir, or <bazel bin>/<package>/<name>)
  local d p
  for d in "${bin_dirs[@]}"; do
    for p in "$d/$1" "$d/server/$1" "$d/bench/$1"; do [[ -f $p && -x $p ]] && { echo "$p"; return 0; }; done
  done
  echo "load_run.sh: $1 not found under ${bin_dirs[*]} (bundle it or bazel build it)" >&2
  return 1
}
server_bin=$(find_bin hgemm_server)
load_bin=$(find_bin hgemm_load)
echo_bin=$(find_bin echo_server)
bin=$(dirname "$load_bin")

pids=()     # the servers (their `timeout` wrappers, which pass TERM on)
current=""  # the sweep running now
# shellcheck disable=SC2317  # invoked by the trap
cleanup() {
  local rc=$?
  [[ -n $current ]] && kill -TERM "$current" 2>/dev/null
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  exit "$rc"
}
trap cleanup EXIT INT TERM

wait_port() {  # port seconds pid log: until something accepts connections there
  local deadline=$((SECONDS + $2))
  until (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do
    if ! kill -0 "$3" 2>/dev/null; then
      echo "load_run.sh: the process for port $1 exited; $4 says:" >&2
      tail -20 "$4" >&2
      return 1
    fi
    ((SECONDS < deadline)) || { echo "load_run.sh: nothing listening on port $1 after $2 s" >&2; return 1; }
    sleep 0.2
  done
}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "host: $(uname -srm), $(nproc) CPUs"
  if command -v nvidia-smi >/dev/null; then
    timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  fi
  echo "backend: $backend, binaries: $bin"
} > "$out/load_device.txt" 2>&1
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
rm -f "$csv"
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

if [[ $quick == 1 ]]; then
  window=(--warmup_s=0.2 --window_s=0.3 --min_window_requests=5 --max_windows=4 --max_point_s=3)
  run 64_unary 60 --shapes=64x64x64 --mode=unary --concurrency=1,2,4 "${window[@]}"
  run 256_stream 60 --shapes=256x256x256 --mode=stream --concurrency=1,2 "${window[@]}"
  run mix_unary 60 --shapes=64x64x64:3,128x96x160 --mode=unary --concurrency=2 "${window[@]}"
else
  window=(--warmup_s=0.5 --window_s=1 --min_window_requests=20 --max_windows=5 --max_point_s=5)
  run 256_unary 100 --shapes=256x256x256 --mode=unary --concurrency=1,2,4,8,16,32,64 "${window[@]}"
  run 2048_stream 100 --shapes=2048x2048x2048 --mode=stream --concurrency=1,2,4,8,16,32,64 "${window[@]}"
  run 2048_unary 60 --shapes=2048x2048x2048 --mode=unary --concurrency=1,4,16,64 "${window[@]}"
  # 384 MiB per call: fewer points, longer windows with fewer calls each.
  run 8192_stream 100 --shapes=8192x8192x8192 --mode=stream --concurrency=1,2,4,8 --verify=1 \
      --warmup_s=1 --window_s=1.5 --min_window_requests=4 --max_windows=4 --max_point_s=8
fi

py=""
for p in python3 /usr/bin/python3; do
  if "$p" -c 'import matplotlib' 2>/dev/null; then py=$p; break; fi
done
if [[ -n $py ]]; then
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

#!/usr/bin/env bash
# The main job, end to end: install what is missing, build, start hgemm_server on 127.0.0.1
# (CUDA backend when a usable GPU is present, CPU otherwise), push demo GEMMs through
# hgemm_client (unary and streamed, checked against a local fp32 reference; the 2048³ one in
# parallel parts over the bulk channel on the next port), stop the server.
#   tools/demo.sh [--port=50051] [--keep]   (--keep leaves the server running in the foreground)
set -euo pipefail
cd "$(dirname "$0")/.."

port=50051 keep=0
for arg in "$@"; do
  case $arg in
    --port=*) port=${arg#--port=} ;;
    --keep) keep=1 ;;
    *) echo "usage: tools/demo.sh [--port=N] [--keep]" >&2; exit 2 ;;
  esac
done

tools/bootstrap.sh
bazel build -c opt //server:hgemm_server //client:hgemm_client
server=bazel-bin/server/hgemm_server client=bazel-bin/client/hgemm_client
address=127.0.0.1:$port
bulk=127.0.0.1:$((port + 1))

if ((keep)); then
  echo "demo: serving on $address until Ctrl-C"
  exec "$server" --listen="$address" --bulk_listen="$bulk"
fi

"$server" --listen="$address" --bulk_listen="$bulk" --log_level=debug &
server_pid=$!
trap 'kill -TERM $server_pid 2>/dev/null; wait $server_pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  "$client" --server="$address" --info >/dev/null 2>&1 && break
  kill -0 $server_pid 2>/dev/null || { echo "demo: the server exited" >&2; exit 1; }
  sleep 0.2
done

set -x
"$client" --server="$address" --info
"$client" --server="$address" --shape=1000x1000x1000 --check --repeat=3
"$client" --server="$address" --shape=2048x2048x2048 --check
info=$("$client" --server="$address" --info)  # not piped into grep -q: SIGPIPE + pipefail
if [[ $info == *"backend cuda"* ]]; then
  "$client" --server="$address" --shape=255x257x100 --accumulation=fp16 --check
else  # the CPU backend has no FP16 accumulation: it says so instead of running FP32
  { set +x; } 2>/dev/null
  if refusal=$("$client" --server="$address" --shape=255x257x100 --accumulation=fp16 --check \
    2>&1); then
    echo "demo: the CPU backend ran an FP16-accumulation GEMM it does not have" >&2
    exit 1
  fi
  echo "demo: FP16 accumulation refused, as expected on the CPU backend (it accumulates in FP32):"
  sed 's/^/  /' <<<"$refusal"
fi
{ set +x; } 2>/dev/null
echo "demo: OK: every GEMM above matched the fp32 reference"

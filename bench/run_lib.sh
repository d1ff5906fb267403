# shellcheck shell=bash
# Shared by the benchmark scripts that start hgemm_server and friends as processes
# (bench/load_run.sh, bench/metrics_cost.sh, bench/tls_cost.sh, bench/dataplane.sh). Source it
# from the repository root after `set -euo pipefail`; messages name the sourcing script.

# bench_option ARGS...: takes the first word of ARGS (and its value) when it is an option every
# measuring script has: --quick (quick=1), --bin DIR, --certs DIR, --backend NAME (into the
# variables of those names). Sets `taken` to how many words it took, 0 for another option.
# shellcheck disable=SC2034  # the variables are the sourcing script's
bench_option() {
  taken=0
  case $1 in
    --quick) quick=1; taken=1 ;;
    --bin | --certs | --backend)
      (($# >= 2)) || { echo "${0##*/}: $1 needs a value" >&2; exit 2; }
      printf -v "${1#--}" %s "$2"
      taken=2 ;;
  esac
}

# pick_bin_dirs DIR: where find_bin looks. DIR if given; else the GPU bundle .gpu/bin (its
# env.sh sourced for the libraries); else Bazel's output trees.
pick_bin_dirs() {
  bin_dirs=()
  if [[ -n $1 ]]; then
    bin_dirs=("$1")
  elif [[ -x .gpu/bin/hgemm_load ]]; then
    # shellcheck disable=SC1091
    source .gpu/env.sh
    bin_dirs=(.gpu/bin)
  else
    # bazel-bin follows the last build's configuration; look in each.
    bin_dirs=(bazel-bin bazel-out/k8-fastbuild/bin bazel-out/k8-opt/bin)
  fi
}

# pick_bundle_or_bin_dirs DIR: pick_bin_dirs, with tools/gpu_e2e.sh's bundle (.gpu-serve/bin, its
# env.sh sourced for the libraries) first when DIR is empty.
pick_bundle_or_bin_dirs() {
  local dir=$1
  if [[ -z $dir && -x .gpu-serve/bin/hgemm_load ]]; then
    dir=.gpu-serve/bin
    # shellcheck disable=SC1091
    [[ -f .gpu-serve/env.sh ]] && source .gpu-serve/env.sh
  fi
  pick_bin_dirs "$dir"
}

# make_certs_unless_given WORK: keeps $certs (a tools/make_test_certs.sh folder) when set, else
# makes test certificates under WORK/certs with openssl and points $certs there.
make_certs_unless_given() {
  if [[ -z $certs ]]; then
    certs=$1/certs
    tools/make_test_certs.sh "$certs"
  fi
}

find_bin() {  # name → path (a flat bundle dir, or <bazel bin>/<package>/<name>)
  local d p
  for d in "${bin_dirs[@]}"; do
    for p in "$d/$1" "$d/server/$1" "$d/bench/$1" "$d/client/$1"; do
      [[ -f $p && -x $p ]] && { echo "$p"; return 0; }
    done
  done
  echo "${0##*/}: $1 not found under ${bin_dirs[*]} (bundle it or bazel build it)" >&2
  return 1
}

wait_port() {  # port seconds pid log: until something accepts connections there
  local deadline=$((SECONDS + $2))
  until (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do
    if ! kill -0 "$3" 2>/dev/null; then
      echo "${0##*/}: the process for port $1 exited; $4 says:" >&2
      tail -20 "$4" >&2
      return 1
    fi
    ((SECONDS < deadline)) ||
      { echo "${0##*/}: nothing listening on port $1 after $2 s" >&2; return 1; }
    sleep 0.2
  done
}

# The processes started (their `timeout` wrappers, which pass TERM on) and the one being waited
# for now; `trap cleanup EXIT INT TERM` ends them all, the waited-for one first.
pids=()
current=""
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

describe_host() {  # backend bin-dir: what a result file should say about where it was measured
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "host: $(uname -srm), $(nproc) CPUs"
  if command -v nvidia-smi >/dev/null; then
    timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  fi
  echo "backend: $1, binaries: $2"
}

python_with_matplotlib() {  # the first of python3, /usr/bin/python3 that has matplotlib, or ""
  local p
  for p in python3 /usr/bin/python3; do
    if "$p" -c 'import matplotlib' 2>/dev/null; then echo "$p"; return; fi
  done
}

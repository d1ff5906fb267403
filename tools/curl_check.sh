#!/usr/bin/env bash
# The README's grpcurl walk-through, run with an independent reflection-driven client: `buf curl`
# (npm @bufbuild/buf, pinned in tools/curl_check/; grpcurl itself is neither in Debian 12 nor on
# npm). Against a real hgemm_server on 127.0.0.1 with TLS (certificates made now by
# tools/make_test_certs.sh) and a tokens file:
#   1. reflection over TLS lists the three services
#   2. the README's 2×2 GEMM with `-H authorization: Bearer …` returns C = fp16 7, 10, 15, 22
#   3. the same call without a token, and with a wrong one, is UNAUTHENTICATED
#   4. plaintext to the TLS port gets no answer
# Prints "curl: N passed, N failed" and exits non-zero on any failure.
#
# usage: tools/curl_check.sh [--bin DIR]   (DIR holds hgemm_server; default bazel-bin/server)
# Needs node and npm (the registry the first time), openssl. Environment:
# HGEMM_CURL_CHECK_CACHE (default ~/.cache/hgemm-serve/curl-check).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=bazel-bin/server
[[ ${1:-} == --bin ]] && bin=$2
cache=${HGEMM_CURL_CHECK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hgemm-serve/curl-check}

# shellcheck source=tools/npm_cache.sh
source tools/npm_cache.sh
npm_ci_cached tools/curl_check "$cache"
buf=$cache/node_modules/@bufbuild/buf-linux-x64/bin/buf

work=$(mktemp -d "${TMPDIR:-/tmp}/hgemm-curl-check.XXXXXX")
server_pid=
cleanup() {
  [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
tools/make_test_certs.sh "$work" >/dev/null
token=$(openssl rand -hex 32)
echo "alice $(printf %s "$token" | sha256sum | cut -d' ' -f1)" >"$work/tokens"

port=$((20000 + RANDOM % 20000))
"$bin/hgemm_server" --listen=127.0.0.1:$port --backend=cpu --tls_cert="$work/server.pem" \
  --tls_key="$work/server.key" --auth_tokens_file="$work/tokens" >"$work/server.log" 2>&1 &
server_pid=$!
url=https://127.0.0.1:$port
curl_tls() { timeout 30 "$buf" curl --protocol grpc --cacert "$work/ca.pem" "$@"; }
for _ in $(seq 100); do
  curl_tls --list-services "$url" >/dev/null 2>&1 && break
  sleep 0.1
done

passed=0 failed=0
check() {  # $1: name; $2: a regular expression the output must match; the rest: the command
  local name=$1 want=$2 out
  shift 2
  out=$("$@" 2>&1) || true
  if [[ $out =~ $want ]]; then
    echo "ok    $name"
    passed=$((passed + 1))
  else
    echo "FAIL  $name: wanted /$want/ in:"
    echo "$out" | sed 's/^/      /'
    failed=$((failed + 1))
  fi
}
gemm='{"m": 2, "n": 2, "k": 2, "a": "ADwAQABCAEQ=", "b": "ADwAQABCAEQ="}'
services=$(curl_tls --list-services "$url" 2>&1 | sort | tr '\n' ' ') || true
check "reflection over TLS lists the services" \
  "grpc.health.v1.Health grpc.reflection.v1alpha.ServerReflection hgemm.v1.GemmService" \
  echo "$services"
check "2x2 GEMM over TLS with a bearer token" '"c": "AEcASYBLgE0="' \
  curl_tls -H "authorization: Bearer $token" -d "$gemm" "$url/hgemm.v1.GemmService/Gemm"
check "no token: UNAUTHENTICATED" '"code": "unauthenticated"' \
  curl_tls -d "$gemm" "$url/hgemm.v1.GemmService/Gemm"
check "wrong token: UNAUTHENTICATED" '"code": "unauthenticated"' \
  curl_tls -H "authorization: Bearer not-$token" -d "$gemm" "$url/hgemm.v1.GemmService/Gemm"
# From the .proto, since reflection can't be reached in plaintext either. The TLS server drops
# the connection: buf reports that as unavailable, or as canceled when its write loses the race.
check "plaintext to the TLS port: no answer" '"code": "(unavailable|canceled)"' \
  timeout 30 "$buf" curl --protocol grpc --http2-prior-knowledge --schema proto/hgemm.proto \
  -H "authorization: Bearer $token" -d "$gemm" "http://127.0.0.1:$port/hgemm.v1.GemmService/Gemm"
((failed == 0)) || { echo "server log:"; sed 's/^/      /' "$work/server.log"; }
echo "curl: $passed passed, $failed failed"
((failed == 0))

#!/usr/bin/env bash
# The Python client's tests (client/python/tests, pytest), on both of its cores: builds
# //client/c:libhgemm_client.so and //server:hgemm_server (the tests' real servers on 127.0.0.1,
# CPU backend), installs the hgemm package offline with the library bundled into a fresh venv
# over Debian's packages (/usr/bin/python3 -m venv --system-site-packages; the python3 on PATH
# may be a pyenv one without them), checks that the installed package loads it, and runs pytest
# twice: HGEMM_TRANSPORT=native (the C ABI, client/c) and HGEMM_TRANSPORT=grpcio (the
# pure-Python fallback); the suite also checks the committed gRPC stubs against the proto and
# the native core's ctypes declarations against client/c/hgemm.h (gen_*.py --check), and
# (native run) builds the portable wheel and runs its native core in a bare venv. Each
# run ends with its line "python-native: ..." / "python-grpcio: ...", and the script with their
# sum, "python: N passed, N failed, N skipped" (pytest's errors count as failed), which
# tools/test.sh folds into its summary.
#   tools/test_python.sh [pytest args...]      e.g. -k aio, -x
set -uo pipefail
cd "$(dirname "$0")/.."

# summary PASSED FAILED SKIPPED [NAME]
summary() { echo "${4:-python}: $1 passed, $2 failed, $3 skipped"; }

tools/bootstrap.sh >&2 || { summary 0 1 0; exit 1; }
bazel build //server:hgemm_server //client/c:libhgemm_client.so || { summary 0 1 0; exit 1; }
bin=$(bazel info bazel-bin)
export HGEMM_SERVER_BIN="${HGEMM_SERVER_BIN:-$bin/server/hgemm_server}"
export HGEMM_CLIENT_LIB="$bin/client/c/libhgemm_client.so"  # test_wheel.py bundles it

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 -m venv --system-site-packages "$work/venv" &&
  HGEMM_NATIVE_LIB="$bin/client/c/libhgemm_client.so" \
    "$work/venv/bin/python" -m pip install -q --no-build-isolation --no-index ./client/python ||
  { echo "test_python: installing client/python failed" >&2; summary 0 1 0; exit 1; }
# A native run that silently fell back to grpcio would pass unseen.
(cd "$work" &&
  HGEMM_TRANSPORT=native "$work/venv/bin/python" -c "import hgemm; print(hgemm.info())") ||
  { echo "test_python: the installed hgemm does not load its library" >&2; summary 0 1 0; exit 1; }

status=0 total_passed=0 total_failed=0 total_skipped=0
# run_pytest CORE [pytest args...]: one run on CORE, from inside tests/ (so `import hgemm` is
# the installed package and its library, not the source tree); prints its line, adds its counts.
run_pytest() {
  local core=$1 rc passed failed skipped
  shift
  (cd client/python/tests && env -u HGEMM_NATIVE_LIB HGEMM_TRANSPORT="$core" \
     "$work/venv/bin/python" -m pytest -p no:cacheprovider -rs --junitxml="$work/$core.xml" "$@")
  rc=$?
  read -r passed failed skipped < <("$work/venv/bin/python" - "$work/$core.xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    print(0, 1, 0)  # pytest died before writing its report
    sys.exit()
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
n = lambda key: sum(int(s.get(key, 0)) for s in suites)
failed = n("failures") + n("errors")
print(n("tests") - failed - n("skipped"), failed, n("skipped"))
EOF
  )
  ((rc == 0 || failed > 0)) || failed=1  # e.g. pytest usage errors, no tests collected
  summary "$passed" "$failed" "$skipped" "python-$core"
  ((status == 0)) && status=$rc
  total_passed=$((total_passed + passed)) total_failed=$((total_failed + failed))
  total_skipped=$((total_skipped + skipped))
}

run_pytest native "$@"
run_pytest grpcio "$@"
summary "$total_passed" "$total_failed" "$total_skipped"
exit $status

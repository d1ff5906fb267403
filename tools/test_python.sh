#!/usr/bin/env bash
# The Python client's tests (client/python/tests, pytest): installs the hgemm package offline
# into a fresh venv over Debian's packages (/usr/bin/python3 -m venv --system-site-packages; the
# python3 on PATH may be a pyenv one without them), checks the committed gRPC stubs against
# proto/hgemm.proto, builds //server:hgemm_server for the tests' real servers on 127.0.0.1 (CPU
# backend), runs pytest. Ends with the line "python: N passed, N failed, N skipped" (pytest's
# errors count as failed), which tools/test.sh folds into its summary.
#   tools/test_python.sh [pytest args...]      e.g. -k aio, -x
set -uo pipefail
cd "$(dirname "$0")/.."

summary() { echo "python: $1 passed, $2 failed, $3 skipped"; }

tools/bootstrap.sh >&2 || { summary 0 1 0; exit 1; }
if [[ -z "${HGEMM_SERVER_BIN:-}" ]]; then
  bazel build //server:hgemm_server || { summary 0 1 0; exit 1; }
  export HGEMM_SERVER_BIN="$(bazel info bazel-bin)/server/hgemm_server"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 -m venv --system-site-packages "$work/venv" &&
  "$work/venv/bin/python" -m pip install -q --no-build-isolation --no-index ./client/python ||
  { echo "test_python: installing client/python failed" >&2; summary 0 1 0; exit 1; }

# From inside tests/, `import hgemm` is the installed package, not the source tree.
(cd client/python/tests &&
   "$work/venv/bin/python" -m pytest -p no:cacheprovider -rs --junitxml="$work/junit.xml" "$@")
status=$?

read -r passed failed skipped < <("$work/venv/bin/python" - "$work/junit.xml" <<'EOF'
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
((status == 0 || failed > 0)) || failed=1  # e.g. pytest usage errors, no tests collected
summary "$passed" "$failed" "$skipped"
exit $status

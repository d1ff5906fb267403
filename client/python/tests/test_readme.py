"""The README's same-host quickstart, its two blocks run as they are written there: the shell
block (but its `bazel build` line: tools/test_python.sh built the server) in a fresh directory
whose bazel-bin/server/hgemm_server is the server under test, then the Python block there."""
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import hgemm
from conftest import REPO

SECTION = "### Same host: Unix socket and shared memory (Python)"


def quickstart_blocks():
    """(shell block, Python block) of the README's same-host quickstart."""
    text = (REPO / "README.md").read_text()
    assert SECTION in text, f"README.md has no section {SECTION!r}"
    section = re.split(r"\n##+ ", text.split(SECTION, 1)[1], maxsplit=1)[0]
    sh = re.search(r"```sh\n(.*?)```", section, re.S)
    py = re.search(r"```python\n(.*?)```", section, re.S)
    assert sh and py, "the section lost its ```sh or ```python block"
    return sh.group(1), py.group(1)


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)  # the orphaned server is reaped by init once it exits
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def test_readme_same_host_quickstart(tmp_path):
    sh, py = quickstart_blocks()
    lines = sh.splitlines()
    assert lines[0].startswith("bazel build "), lines[0]
    binary = os.environ.get("HGEMM_SERVER_BIN") or str(REPO / "bazel-bin/server/hgemm_server")
    (tmp_path / "bazel-bin/server").mkdir(parents=True)
    (tmp_path / "bazel-bin/server/hgemm_server").symlink_to(binary)
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        # $! after the block: the server it started in the background.
        subprocess.run(["bash", "-euc", "\n".join(lines[1:]) + "\necho $! > server.pid\n"],
                       cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, timeout=120,
                       check=True)
    pid = int((tmp_path / "server.pid").read_text())
    try:
        # The hgemm under test (the installed one, or the source tree's) whatever the cwd.
        env = dict(os.environ, PYTHONPATH=str(pathlib.Path(hgemm.__file__).parents[1]))
        run = subprocess.run([sys.executable, "-c", py], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, (f"the README's Python block failed:\n{run.stderr}\n"
                                     f"server log:\n{log_path.read_text()}")
        assert "C matches numpy" in run.stdout, run.stdout
        # Its three shared buffers and the arena of the ordinary GEMM.
        assert "regions: 4" in run.stdout, run.stdout
    finally:
        _stop(pid)

"""The README's quickstarts run as they are written there. The Python quickstart: its Python
block against a test server (its address in place of 127.0.0.1:50051), printing the core in use.
The same-host quickstart: its shell block (but its `bazel build` line: tools/test_python.sh built
the server) in a fresh directory whose bazel-bin/server/hgemm_server is the server under test,
then its Python block there."""
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import hgemm
from conftest import REPO

QUICKSTART = "## Quickstart (Python)"
SAME_HOST = "### Same host: Unix socket and shared memory (Python)"


def quickstart_blocks(heading):
    """(shell block, Python block) of the README's section under `heading`."""
    text = (REPO / "README.md").read_text()
    assert heading in text, f"README.md has no section {heading!r}"
    section = re.split(r"\n##+ ", text.split(heading, 1)[1], maxsplit=1)[0]
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


def _run_python_block(py, cwd):
    # The hgemm under test (the installed one, or the source tree's) whatever the cwd.
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(hgemm.__file__).parents[1]))
    return subprocess.run([sys.executable, "-c", py], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_readme_quickstart(server, tmp_path):
    sh, py = quickstart_blocks(QUICKSTART)
    lines = sh.splitlines()
    serve = next(i for i, line in enumerate(lines) if line.startswith("tools/demo.sh --keep &"))
    # The Python block runs only once the server answers: the shell block waits for it.
    assert lines[serve + 1].startswith("until ") and "--info" in lines[serve + 1], lines
    assert py.count("127.0.0.1:50051") == 1, py
    run = _run_python_block(py.replace("127.0.0.1:50051", server.address), tmp_path)
    assert run.returncode == 0, (f"the README's Python block failed:\n{run.stderr}\n"
                                 f"server log:\n{server.log_text()}")
    assert run.stdout.split() == [hgemm.info()["core"]], run.stdout


def test_readme_same_host_quickstart(tmp_path):
    sh, py = quickstart_blocks(SAME_HOST)
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
        run = _run_python_block(py, tmp_path)
        assert run.returncode == 0, (f"the README's Python block failed:\n{run.stderr}\n"
                                     f"server log:\n{log_path.read_text()}")
        assert "C matches numpy" in run.stdout, run.stdout
        # Its three shared buffers and the arena of the ordinary GEMM.
        assert "regions: 4" in run.stdout, run.stdout
    finally:
        _stop(pid)


def _names_in(text):
    """Every word of the README that names something of this repository: inline code, link
    targets and the words of code blocks whose first path component is a top-level entry of
    the repository (so `hgemm.v1.GemmService/Gemm` or `/usr/local/cuda` are not taken), and
    Bazel labels (`//pkg:name`, `@hgemm_serve//pkg:name`)."""
    words = re.findall(r"`([^`\n]+)`", text) + re.findall(r"\]\(([^)\s]+)\)", text)
    for block in re.findall(r"```\w*\n(.*?)```", text, re.S):
        words += block.split()
    top = {p.name for p in REPO.iterdir()} | {"bazel-bin"}
    names = set()
    for word in words:
        for token in re.split(r"[\s=,'\"();]+", word):
            token = token.rstrip(".:")
            if re.fullmatch(r"(@hgemm_serve)?//[\w/.-]*:[\w.+-]+", token):
                names.add(token)
            elif "/" in token and token.split("/")[0] in top and "*" not in token:
                names.add(token)
    return names


def _exists(name):
    """Whether `name` (a path, a bazel-bin/ output or a label) is in the repository."""
    if name.startswith(("//", "@hgemm_serve//")):
        package, target = name.split("//", 1)[1].split(":")
    elif name.startswith("bazel-bin/"):
        package, _, target = name[len("bazel-bin/"):].rpartition("/")
    else:
        return (REPO / name).exists()
    build = REPO / package / "BUILD"
    return build.exists() and f'name = "{target}"' in build.read_text()


def test_readme_names_only_what_exists():
    names = _names_in((REPO / "README.md").read_text())
    # The check must see the README's paths, commands and labels at all.
    assert {"tools/demo.sh", "docs/errors.md", "bazel-bin/client/hgemm_client",
            "@hgemm_serve//client:gemm_client"} <= names, sorted(names)
    missing = sorted(n for n in names if not _exists(n))
    assert not missing, f"README.md names what the repository does not have: {missing}"

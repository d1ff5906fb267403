"""Fixtures: real hgemm_server processes on 127.0.0.1 (CPU backend), started once per session.

The binary is $HGEMM_SERVER_BIN, else <repo>/bazel-bin/server/hgemm_server
(`bazel build //server:hgemm_server`; tools/test_python.sh builds it). Each server listens on
port 0 and the fixture reads the port it got from its log, so runs never collide on a port.
"""
import os
import pathlib
import re
import shutil
import socket
import subprocess
import tempfile
import time

import numpy as np
import pytest

import hgemm

REPO = pathlib.Path(__file__).resolve().parents[3]
_PORT = re.compile(r"listening on \S+ \(port (\d+)\)")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """hgemm_server with `flags`; `client` are the hgemm.Client options that reach it (TLS,
    token), used to wait until it serves; `backend` its --backend."""

    def __init__(self, *flags, client=None, listen="127.0.0.1:0", backend="cpu"):
        binary = os.environ.get("HGEMM_SERVER_BIN") or str(REPO / "bazel-bin/server/hgemm_server")
        if not os.access(binary, os.X_OK):
            pytest.fail(f"no server binary at {binary}: run `bazel build //server:hgemm_server` "
                        f"or set HGEMM_SERVER_BIN")
        self.log = tempfile.NamedTemporaryFile(prefix="hgemm_server_", suffix=".log", delete=False)
        self.process = subprocess.Popen(
            [binary, f"--listen={listen}", f"--backend={backend}", *flags],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.address = None
        deadline = time.monotonic() + 120
        while self.address is None:
            if self.process.poll() is not None:
                pytest.fail(f"hgemm_server exited with {self.process.returncode}:\n"
                            f"{self.log_text()}")
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"hgemm_server did not report its port:\n{self.log_text()}")
            m = _PORT.search(self.log_text())
            if m:
                self.address = f"127.0.0.1:{m.group(1)}"
            else:
                time.sleep(0.05)
        with hgemm.Client(self.address, **(client or {})) as c:  # serving: GetServerInfo answers
            c.info(timeout=30)

    def log_text(self) -> str:
        return pathlib.Path(self.log.name).read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        os.unlink(self.log.name)


@pytest.fixture(scope="session")
def server():
    """A server with the default limits."""
    s = Server("--cpu_workers=2")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def small_server():
    """A server with the smallest message limit (4 MiB) and 2^20 elements per matrix."""
    s = Server("--cpu_workers=2", f"--max_message_bytes={4 << 20}",
               f"--max_elements_per_matrix={1 << 20}")
    yield s
    s.stop()


class UnixServer(Server):
    """A Server that also listens on a Unix socket in a directory of its own; `unix` is the
    target that reaches it there ("unix:/tmp/.../hgemm.sock")."""

    def __init__(self, *flags, backend="cpu"):
        self.socket_dir = tempfile.mkdtemp(prefix="hgemm_sock_")
        self.unix = f"unix:{self.socket_dir}/hgemm.sock"
        super().__init__(f"--listen={self.unix}", *flags, backend=backend)

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.socket_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def shm_server():
    """A server with shared memory on, over its Unix socket."""
    s = UnixServer("--cpu_workers=2", "--allow_shared_memory")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def no_shm_server():
    """A server with a Unix socket and shared memory off."""
    s = UnixServer("--cpu_workers=2")
    yield s
    s.stop()


@pytest.fixture
def client(server):
    with hgemm.Client(server.address, timeout=120) as c:
        yield c


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def fp16(rng, rows, cols):
    return rng.uniform(-1, 1, size=(rows, cols)).astype(np.float16)


def rel_error(c, a, b) -> float:
    """Relative Frobenius error of c against A·B computed in float64."""
    ref = np.asarray(a, dtype=np.float64) @ np.asarray(b, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    assert c.shape == ref.shape, f"C is {c.shape}, expected {ref.shape}"
    return float(np.linalg.norm(c - ref) / np.linalg.norm(ref))


# fp32 accumulation with fp16 output: the output rounding alone is ~3e-4 (proto: around 1e-4).
FP32_TOLERANCE = 1e-3
# fp16 accumulation: around 1e-3 for k ≈ 1000 on uniform inputs (proto); k here is at most 300.
FP16_TOLERANCE = 1e-2

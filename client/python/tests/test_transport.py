"""Without hgemm_server: retries, the status mapping, token metadata and TLS (against a small
in-process Python gRPC server), and the committed stubs."""
import concurrent.futures
import pathlib
import shutil
import subprocess
import sys

import grpc
import numpy as np
import pytest

import hgemm
from hgemm import _wire
from hgemm._proto import hgemm_pb2 as pb
from hgemm._proto import hgemm_pb2_grpc as pb_grpc

HERE = pathlib.Path(__file__).resolve().parent


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


class FlakyGemm:
    """A stub method failing with `errors` (in order), then answering."""

    def __init__(self, errors, m, n):
        self.errors = list(errors)
        self.calls = 0
        self.m, self.n = m, n

    def __call__(self, request, timeout=None, metadata=None):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return _wire.GemmResponse(pb.GemmResponse(
            m=self.m, n=self.n, c=bytes(2 * self.m * self.n),
            c_matrix=pb.MatrixInfo(handle="m-1", rows=self.m, cols=self.n)).SerializeToString())


QUEUE_FULL = FakeRpcError(grpc.StatusCode.UNAVAILABLE,
                          "queue is full (256 GEMMs); retry with backoff")
RESET = FakeRpcError(grpc.StatusCode.UNAVAILABLE, "Connection reset by peer")


@pytest.fixture
def offline_client(monkeypatch):
    monkeypatch.setenv("HGEMM_TRANSPORT", "grpcio")  # the grpcio stub is the one replaced
    with hgemm.Client("127.0.0.1:1", retries=4) as c:  # never connects: the stub is replaced
        c._config.policy.initial_backoff_s = 0.001
        yield c


def test_unavailable_queue_full_is_retried(offline_client):
    a = np.ones((2, 3), np.float16)
    offline_client._stub.Gemm = flaky = FlakyGemm([QUEUE_FULL, QUEUE_FULL], 2, 2)
    assert offline_client.gemm(a, a.T).shape == (2, 2)
    assert flaky.calls == 3
    # keep_c too: the server said it did not run the GEMM.
    offline_client._stub.Gemm = flaky = FlakyGemm([QUEUE_FULL], 2, 2)
    assert isinstance(offline_client.gemm(a, a.T, keep_c=True), hgemm.ResidentMatrix)
    assert flaky.calls == 2


def test_unavailable_of_unknown_outcome_is_retried_only_when_idempotent(offline_client):
    a = np.ones((2, 3), np.float16)
    offline_client._stub.Gemm = flaky = FlakyGemm([RESET], 2, 2)
    assert offline_client.gemm(a, a.T).shape == (2, 2)
    assert flaky.calls == 2
    offline_client._stub.Gemm = flaky = FlakyGemm([RESET], 2, 2)
    with pytest.raises(hgemm.Unavailable, match="reset"):
        offline_client.gemm(a, a.T, keep_c=True)  # may have made a resident C: not repeated
    assert flaky.calls == 1


def test_retries_stop_after_attempts_and_other_codes_are_not_retried(offline_client):
    a = np.ones((2, 3), np.float16)
    offline_client._stub.Gemm = flaky = FlakyGemm([QUEUE_FULL] * 10, 2, 2)
    with pytest.raises(hgemm.Unavailable) as e:
        offline_client.gemm(a, a.T)
    assert flaky.calls == 4 and e.value.status == "UNAVAILABLE"
    offline_client._stub.Gemm = flaky = FlakyGemm(
        [FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "m: must be at least 1")], 2, 2)
    with pytest.raises(hgemm.InvalidArgument):
        offline_client.gemm(a, a.T)
    assert flaky.calls == 1


def test_every_status_code_maps_to_its_subclass():
    from hgemm import _errors
    for code in grpc.StatusCode:
        if code == grpc.StatusCode.OK:
            continue
        err = _errors.from_code(code.value[0], "why", index=3)
        assert isinstance(err, hgemm.Error)
        assert err.code == code and err.status == code.name
        assert type(err).__name__.lower() == code.name.replace("_", "").lower()
        assert str(err) == f"GEMM 3: {code.name}: why"
    assert isinstance(_errors.from_code(99, "?"), hgemm.Unknown)


def test_status_codes_equal_grpcs_without_importing_it():
    """hgemm.StatusCode (what Error.code holds, grpc-free) compares and hashes as the
    grpc.StatusCode member of its name, both ways, so code written against grpcio's codes
    works on either core."""
    assert [c.name for c in hgemm.StatusCode] == [c.name for c in grpc.StatusCode]
    for ours, theirs in zip(hgemm.StatusCode, grpc.StatusCode):
        assert ours == theirs and theirs == ours and not ours != theirs
        assert ours.value == theirs.value and hash(ours) == hash(theirs)
        assert {theirs: 1}[ours] == 1 and ours in (theirs,)
        assert hgemm.StatusCode.of(theirs) is ours is hgemm.StatusCode.of(theirs.value[0])
    assert hgemm.StatusCode.NOT_FOUND != grpc.StatusCode.INTERNAL
    assert hgemm.StatusCode.NOT_FOUND != "NOT_FOUND"
    err = hgemm.NotFound("gone")
    assert err.code == grpc.StatusCode.NOT_FOUND and err.code is hgemm.StatusCode.NOT_FOUND
    assert hgemm.NotFound("gone", code=grpc.StatusCode.NOT_FOUND).code is err.code


class RecordingServicer(pb_grpc.GemmServiceServicer):
    def __init__(self):
        self.metadata = []

    def GetServerInfo(self, request, context):
        self.metadata.append(dict(context.invocation_metadata()))
        return pb.ServerInfo(version="fake", backend="cpu")


def start_fake_server(credentials=None):
    servicer = RecordingServicer()
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_GemmServiceServicer_to_server(servicer, server)
    if credentials is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server, servicer, f"127.0.0.1:{port}"


TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_token_and_client_id_metadata(tmp_path, monkeypatch):
    server, servicer, address = start_fake_server()
    try:
        with hgemm.Client(address, token="s3cret", client_id="alice", traceparent=TRACE) as c:
            assert c.info().version == "fake"
        token_file = tmp_path / "token"
        token_file.write_text("from-file\n")
        with hgemm.Client(address, token_file=str(token_file)) as c:
            c.info()
        monkeypatch.setenv("HGEMM_TOKEN", "from-env")
        with hgemm.Client(address) as c:
            c.info()
        monkeypatch.delenv("HGEMM_TOKEN")
        with hgemm.Client(address) as c:
            c.info()
    finally:
        server.stop(None)
    first, from_file, from_env, none = servicer.metadata
    assert first["authorization"] == "Bearer s3cret" and first["x-client-id"] == "alice"
    assert first["traceparent"] == TRACE
    assert from_file["authorization"] == "Bearer from-file"
    assert from_env["authorization"] == "Bearer from-env"
    assert "authorization" not in none and "x-client-id" not in none and "traceparent" not in none


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    openssl = shutil.which("openssl")
    if not openssl:
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("tls")

    def run(*args):
        subprocess.run([openssl, *args], check=True, capture_output=True, cwd=d)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
        "-keyout", "ca.key", "-out", "ca.pem")
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key",
        "-out", "server.csr")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "1", "-extfile", "san.ext", "-out", "server.pem")
    return d


def test_tls_with_a_root_certificate(certificates):
    d = certificates
    credentials = grpc.ssl_server_credentials(
        [((d / "server.key").read_bytes(), (d / "server.pem").read_bytes())])
    server, servicer, address = start_fake_server(credentials)
    try:
        with hgemm.Client(address, tls_ca=str(d / "ca.pem"), token="t") as c:
            assert c.info(timeout=10).version == "fake"
        assert servicer.metadata[-1]["authorization"] == "Bearer t"
        with hgemm.Client(address, retries=1) as plaintext:
            with pytest.raises(hgemm.Unavailable):
                plaintext.info(timeout=10)
    finally:
        server.stop(None)


def test_tls_options_are_checked():
    with pytest.raises(ValueError, match="tls_cert and tls_key"):
        hgemm.Client("127.0.0.1:1", tls_cert="/nonexistent.pem")
    with pytest.raises(FileNotFoundError):
        hgemm.Client("127.0.0.1:1", tls_ca="/nonexistent/ca.pem")


def test_committed_stubs_match_the_proto():
    if not (shutil.which("protoc") and shutil.which("grpc_python_plugin")):
        pytest.skip("protoc / grpc_python_plugin not installed (protobuf-compiler-grpc)")
    gen = HERE.parent / "gen_stubs.py"
    if not (HERE.parents[2] / "proto" / "hgemm.proto").exists():
        pytest.skip("not in a clone of the repository")
    r = subprocess.run([sys.executable, str(gen), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

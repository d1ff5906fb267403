"""The client against a real TLS server: certificates made now by tools/make_test_certs.sh
(Debian's openssl), a tokens file of SHA-256 hashes, mutual TLS with client certificates."""
import hashlib
import subprocess

import numpy as np
import pytest

import hgemm
from conftest import REPO, Server


def token_line(principal, token, admin=False):
    return f"{principal} {hashlib.sha256(token.encode()).hexdigest()}{' admin' if admin else ''}\n"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    subprocess.run([str(REPO / "tools/make_test_certs.sh"), str(d)], check=True)
    return d


@pytest.fixture(scope="module")
def tls_server(certs):
    tokens = certs / "tokens"
    tokens.write_text(token_line("alice", "alice-token") + token_line("bob", "bob-token"))
    s = Server(f"--tls_cert={certs}/server.pem", f"--tls_key={certs}/server.key",
               f"--tls_client_ca={certs}/ca.pem", "--tls_client_auth=request",
               f"--auth_tokens_file={tokens}", "--auth_principal_from_cert",
               client=dict(tls_ca=str(certs / "ca.pem"), token="alice-token"))
    yield s
    s.stop()


def test_token_over_tls(tls_server, certs, tmp_path):
    a = np.eye(4, dtype=np.float16)
    b = np.arange(16, dtype=np.float16).reshape(4, 4)
    with hgemm.Client(tls_server.address, tls_ca=str(certs / "ca.pem"), token="alice-token") as c:
        np.testing.assert_array_equal(c.gemm(a, b), b)
    token_file = tmp_path / "token"
    token_file.write_text("bob-token\n")
    with hgemm.Client(tls_server.address, tls_ca=str(certs / "ca.pem"),
                      token_file=str(token_file)) as c:
        assert c.info().backend == "cpu"


def test_missing_or_wrong_token_is_unauthenticated(tls_server, certs):
    for token in (None, "not-a-token"):
        with hgemm.Client(tls_server.address, tls_ca=str(certs / "ca.pem"), token=token,
                          retries=1) as c:
            with pytest.raises(hgemm.Unauthenticated):
                c.info()


def test_plaintext_and_other_ca_do_not_connect(tls_server, certs):
    for options in ({}, {"tls_ca": str(certs / "other-ca.pem")}):
        with hgemm.Client(tls_server.address, token="alice-token", retries=1, **options) as c:
            with pytest.raises(hgemm.Unavailable):
                c.info(timeout=5)


def test_client_certificate_names_the_principal(tls_server, certs):
    """alice by certificate (no token) and alice by token own the same matrices; bob's
    certificate does not see them, and gets NotFound for her handle."""
    by_cert = hgemm.Client(tls_server.address, tls_ca=str(certs / "ca.pem"),
                           tls_cert=str(certs / "client-alice.pem"),
                           tls_key=str(certs / "client-alice.key"))
    by_token = hgemm.Client(tls_server.address, tls_ca=str(certs / "ca.pem"), token="alice-token")
    bob = hgemm.Client(tls_server.address, tls_ca=str(certs / "ca.pem"),
                       tls_cert=str(certs / "client-bob.pem"),
                       tls_key=str(certs / "client-bob.key"))
    with by_cert, by_token, bob:
        m = by_cert.upload(np.ones((8, 8), dtype=np.float16), label="alice's")
        assert m.handle in [x.handle for x in by_token.matrices()]
        assert m.handle not in [x.handle for x in bob.matrices()]
        with pytest.raises(hgemm.NotFound):
            bob.release(m)
        assert by_token.release(m) > 0

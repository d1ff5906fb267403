"""Credentials a client presents: its bearer token (argument, file or $HGEMM_TOKEN) and its
TLS channel credentials.

Thread safety: the functions keep no state (they read files).
"""
import os
from typing import Optional


def read_token(token: Optional[str], token_file: Optional[str]) -> Optional[str]:
    if token is None and token_file:
        with open(token_file) as f:
            token = f.read().strip()
    if token is None:
        token = os.environ.get("HGEMM_TOKEN") or None
    return token


def tls_credentials(tls, tls_ca, tls_cert, tls_key):
    """grpc.ChannelCredentials, or None for plaintext (grpc not imported then). TLS is on with
    tls=True (system roots) or any of the certificate paths; tls_cert/tls_key (PEM) are the
    client's certificate for mTLS."""
    if not (tls or tls_ca or tls_cert or tls_key):
        return None
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("tls_cert and tls_key go together (the client's certificate and key)")

    def read(path):
        if not path:
            return None
        with open(path, "rb") as f:
            return f.read()
    import grpc  # TLS on grpcio's channels only: a plaintext client need not load it
    return grpc.ssl_channel_credentials(root_certificates=read(tls_ca),
                                        private_key=read(tls_key),
                                        certificate_chain=read(tls_cert))

"""ClientConfig: the options both clients take, the metadata and channels they make from them,
and the choice of unary or GemmStream for each GEMM.

Thread safety: read-only once made, but for max_message_bytes, which the first GEMM that needs
it sets from GetServerInfo (calls racing to set it store the same value).
"""
import os
from typing import Optional

from . import _malloc
from ._credentials import read_token, tls_credentials
from ._retry import RetryPolicy
from ._spec import Spec

# Every server accepts messages this large (--max_message_bytes is at least 4 MiB); above it, the
# mode choice asks the server (GetServerInfo, once per client).
_ALWAYS_UNARY_BYTES = (4 << 20) - (64 << 10)
_MESSAGE_OVERHEAD_BYTES = 64 << 10


class ClientConfig:
    """The options both clients take (documented on hgemm.Client)."""

    def __init__(self, target, *, tls=False, tls_ca=None, tls_cert=None, tls_key=None,
                 tls_server_name=None, token=None, token_file=None, client_id=None,
                 traceparent=None, timeout=None,
                 mode="auto", unary_limit_bytes=32 << 20, chunk_bytes=1 << 20, retries=5,
                 progress=None, channel_options=(), shared_memory=None,
                 shared_memory_min_bytes=1 << 20, ring=None):
        if mode not in ("auto", "unary", "stream"):
            raise ValueError(f"mode must be 'auto', 'unary' or 'stream'; got {mode!r}")
        if chunk_bytes < 1:
            raise ValueError("chunk_bytes must be at least 1")
        _malloc.tune()
        self.target = target
        self.credentials = tls_credentials(tls, tls_ca, tls_cert, tls_key)
        # The native core's connection (it reads the files itself): as the channels'.
        self.tls_files = dict(tls=tls, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
                              tls_server_name=tls_server_name)
        self.has_channel_options = bool(channel_options)
        self.timeout = timeout
        self.mode = mode
        self.unary_limit_bytes = unary_limit_bytes
        self.chunk_bytes = chunk_bytes
        self.policy = RetryPolicy(attempts=max(1, retries))
        self.progress = progress
        self.shared_memory, self.shared_memory_min_bytes = shared_memory, shared_memory_min_bytes
        # Submission rings for GEMMs of regions (native core): on unless turned off here or by
        # $HGEMM_RING=0.
        self.ring = os.environ.get("HGEMM_RING", "1") != "0" if ring is None else bool(ring)
        metadata = []
        token = read_token(token, token_file)
        self.token, self.client_id, self.traceparent = token, client_id, traceparent
        if token:
            metadata.append(("authorization", f"Bearer {token}"))
        if client_id:
            metadata.append(("x-client-id", client_id))
        if traceparent:
            metadata.append(("traceparent", traceparent))
        self.metadata = tuple(metadata)
        # No message size limits (the server has its own); each client its own connection
        # (gRPC would otherwise share one between channels with equal settings).
        # round_robin: calls naming no handle spread over every address of the target (the
        # replicas), not the first alone.
        self.channel_options = [("grpc.max_receive_message_length", -1),
                                ("grpc.max_send_message_length", -1),
                                ("grpc.use_local_subchannel_pool", 1),
                                ("grpc.lb_policy_name", "round_robin")]
        if tls_server_name:
            self.channel_options.append(("grpc.ssl_target_name_override", tls_server_name))
        self.channel_options += list(channel_options)
        self.max_message_bytes = None  # the server's, once asked

    def make_channel(self, target: str, grpc_module):
        """A channel (grpc_module: grpc or grpc.aio) to `target` with this client's credentials
        and options: the target's and every replica's alike."""
        if self.credentials is None:
            return grpc_module.insecure_channel(target, options=self.channel_options)
        return grpc_module.secure_channel(target, self.credentials, options=self.channel_options)

    def call_timeout(self, timeout):
        return self.timeout if timeout is None else timeout

    @staticmethod
    def _largest_message(spec: Spec) -> int:
        return max(spec.payload_bytes, spec.c_bytes) + _MESSAGE_OVERHEAD_BYTES

    def needs_server_limit(self, spec: Spec, mode: Optional[str]) -> bool:
        """True when the mode choice needs the server's message limit, not yet known."""
        big = self._largest_message(spec)
        return ((mode or self.mode) == "auto" and self.max_message_bytes is None
                and _ALWAYS_UNARY_BYTES < big
                and big - _MESSAGE_OVERHEAD_BYTES <= self.unary_limit_bytes)

    def streams(self, spec: Spec, mode: Optional[str]) -> bool:
        """True when this GEMM goes on a GemmStream. Mode "auto": when its operands or C pass
        unary_limit_bytes, or would make a message over the server's limit."""
        mode = mode or self.mode
        if mode not in ("auto", "unary", "stream"):
            raise ValueError(f"mode must be 'auto', 'unary' or 'stream'; got {mode!r}")
        if mode != "auto":
            return mode == "stream"
        big = self._largest_message(spec)
        if big - _MESSAGE_OVERHEAD_BYTES > self.unary_limit_bytes:
            return True
        if big <= _ALWAYS_UNARY_BYTES:
            return False
        return self.max_message_bytes is None or big > self.max_message_bytes

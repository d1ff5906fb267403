"""Matrices living on the server: ResidentMatrix, MatrixList, and the replica a handle names.

Thread safety: a ResidentMatrix's methods are its client's (thread-safe as that client);
`released` is a flag its client's release() sets once. The functions keep no state.
"""
import inspect
from typing import Any, Union

from . import _errors
from ._proto import hgemm_pb2 as pb


class MatrixList(list):
    """matrices(): the calling client's ResidentMatrix objects, plus client_bytes and
    quota_bytes."""
    client_bytes: int = 0
    quota_bytes: int = 0


class ResidentMatrix:
    """A matrix living on the server (UploadMatrix, or a C kept with keep_c=True).

    Usable wherever an operand goes: client.gemm(A, hb), client.gemm(hc, B), gemm_many pairs.
    Over several replicas, calls naming it go to `replica`, the one that holds it.
    `with client.upload(B) as hb:` releases it at the end of the block (NOT_FOUND there, e.g. an
    expired matrix, is ignored). With hgemm.aio, release() and download() are coroutines and the
    block is `async with`.
    Attributes: handle, rows, cols, shape, bytes, device_id, label, ttl_seconds, replica, dtype
    ("fp16", "bf16", or "fp32" for a C kept with c_dtype="fp32", which no GEMM takes).
    """

    def __init__(self, client, info: pb.MatrixInfo):
        self._client = client
        self.info = info
        self.handle: str = info.handle
        self.rows: int = info.rows
        self.cols: int = info.cols
        self.released = False

    shape = property(lambda self: (self.rows, self.cols))
    bytes = property(lambda self: self.info.bytes)
    device_id = property(lambda self: self.info.device_id)
    label = property(lambda self: self.info.label)
    ttl_seconds = property(lambda self: self.info.ttl_seconds)
    replica = property(lambda self: handle_replica(self.handle))
    dtype = property(lambda self: {pb.DATA_TYPE_BF16: "bf16",
                                   pb.DATA_TYPE_FP32: "fp32"}.get(self.info.dtype, "fp16"))

    def download(self, **kwargs: Any) -> Any:  # Client.download's; on hgemm.aio a coroutine
        """C's (or the upload's) values as a float16 ndarray; see Client.download."""
        return self._client.download(self, **kwargs)

    def release(self, **kwargs: Any) -> Any:  # the int of Client.release; on hgemm.aio a coroutine
        """Frees it on the server; returns the bytes freed (0 if this object released it before)."""
        return self._client.release(self, **kwargs)

    def __enter__(self) -> "ResidentMatrix":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.release()
        except _errors.NotFound:
            pass

    async def __aenter__(self) -> "ResidentMatrix":
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            r = self.release()
            if inspect.isawaitable(r):
                await r
        except _errors.NotFound:
            pass

    def __repr__(self):
        state = ", released" if self.released else ""
        return f"ResidentMatrix({self.handle!r}, {self.rows}x{self.cols}{state})"


def handle_replica(handle: str) -> str:
    """The replica address a handle names (what follows its last '@', proto/hgemm.proto
    "Replicas"); "" for a handle of a single server."""
    at = handle.rfind("@")
    return "" if at < 0 else handle[at + 1:]


def replica_of(where: Union[None, str, ResidentMatrix]) -> str:
    """upload(replica=...)'s argument as an address: a ResidentMatrix (its replica), an
    address, or None ("": balanced)."""
    if where is None:
        return ""
    return where if isinstance(where, str) else handle_replica(where.handle)

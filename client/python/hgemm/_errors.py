"""hgemm.Error and its subclasses: one per gRPC status code, mapped in one place."""
from typing import Optional

import grpc


class Error(Exception):
    """A call (or one GEMM of a stream) failed with a gRPC status.

    Attributes:
      code:    the grpc.StatusCode.
      status:  its name, e.g. "NOT_FOUND".
      message: the server's message (for a transport failure, gRPC's).
      index:   for gemm_many, the position of the failing GEMM in the list; else None.
      results: for gemm_many raising, the list of results, with Error instances in place of the
               GEMMs that failed (None for a GEMM the stream never answered).
    """

    code = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None,
                 index: Optional[int] = None):
        if code is not None:
            self.code = code
        self.message = message
        self.index = index
        self.results = None
        super().__init__(message)

    @property
    def status(self) -> str:
        return self.code.name

    def __str__(self) -> str:
        where = f"GEMM {self.index}: " if self.index is not None else ""
        return f"{where}{self.status}: {self.message}"


class Cancelled(Error):
    code = grpc.StatusCode.CANCELLED


class Unknown(Error):
    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(Error):
    """Malformed request: a dimension of 0, an unknown kernel, a stream out of order."""
    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(Error):
    """The timeout passed; a GEMM still queued then was not run."""
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(Error):
    """A resident matrix handle that does not exist (released, expired, evicted, never did)."""
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(Error):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(Error):
    """A handle that belongs to another client."""
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(Error):
    """Over a server limit: elements per matrix, queue bytes, device memory, resident quota."""
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(Error):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(Error):
    code = grpc.StatusCode.ABORTED


class OutOfRange(Error):
    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(Error):
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(Error):
    """The backend failed (e.g. a GPU fault), or the server broke the protocol."""
    code = grpc.StatusCode.INTERNAL


class Unavailable(Error):
    """The server's queue is full, it is shutting down, or it cannot be reached."""
    code = grpc.StatusCode.UNAVAILABLE


class DataLoss(Error):
    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(Error):
    """No valid token (authorization: Bearer ...)."""
    code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE = {cls.code: cls for cls in (
    Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
    PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange, Unimplemented,
    Internal, Unavailable, DataLoss, Unauthenticated)}
_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}


def from_code(code, message: str, index: Optional[int] = None) -> Error:
    """The Error for a grpc.StatusCode or its integer value (GemmDone.status_code)."""
    if not isinstance(code, grpc.StatusCode):
        code = _BY_VALUE.get(int(code), grpc.StatusCode.UNKNOWN)
    cls = _BY_CODE.get(code, Unknown)
    return cls(message, code=code, index=index)


def from_rpc_error(e: grpc.RpcError, index: Optional[int] = None) -> Error:
    """The Error for a failed gRPC call (sync or aio)."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = e.details() if hasattr(e, "details") else str(e)
    err = from_code(code or grpc.StatusCode.UNKNOWN, details or "", index)
    err.__cause__ = e
    return err


class _DeadlinePassed(grpc.RpcError):
    """A call grpcio failed with INTERNAL after its deadline had passed: DEADLINE_EXCEEDED."""

    def __init__(self, e: grpc.RpcError):
        super().__init__()
        self._details = f"Deadline Exceeded (gRPC reported INTERNAL: {e.details()})"

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self) -> str:
        return self._details


def past_deadline(e: grpc.RpcError, timeout: Optional[float], elapsed: float) -> grpc.RpcError:
    """e, or DEADLINE_EXCEEDED for an INTERNAL that came once the call's timeout had passed:
    grpcio's asyncio client reports some streams whose deadline expires while requests are
    still being sent as INTERNAL "Internal error from Core" (gRPC core's cancellation of the
    stream, not the server: it sends nothing on a call cancelled mid-read)."""
    if (timeout is not None and elapsed >= timeout and hasattr(e, "code")
            and e.code() == grpc.StatusCode.INTERNAL):
        return _DeadlinePassed(e)
    return e


# The server's own UNAVAILABLE messages (server/core/status.cc): the work was refused before it
# ran. With gRPC's own message when no connection could be made, a retry cannot run anything
# twice.
_SERVER_MARKERS = ("retry with backoff", "server is shutting down")
_NOT_RUN_MARKERS = _SERVER_MARKERS + ("failed to connect",)


def sent_by_server(err: Error) -> bool:
    """True for an UNAVAILABLE the server sent (queue full, shutting down), not gRPC's own."""
    return any(m in err.message for m in _SERVER_MARKERS)


def unavailable_not_run(err: Error) -> bool:
    """True for an UNAVAILABLE that certainly did not run the request (safe to repeat)."""
    return isinstance(err, Unavailable) and any(m in err.message for m in _NOT_RUN_MARKERS)

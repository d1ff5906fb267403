"""hgemm.Error and its subclasses: one per gRPC status code, mapped in one place; StatusCode,
gRPC's status codes without importing grpc (the native core never loads grpcio).
"""
import enum
import sys
from typing import Optional


class StatusCode(enum.Enum):
    """gRPC's status codes, as grpc.StatusCode has them (value (int, "name")). A member equals
    grpc.StatusCode's member of the same name and hashes alike, so `e.code ==
    grpc.StatusCode.NOT_FOUND` and dictionaries keyed by either keep working."""
    OK = (0, "ok")
    CANCELLED = (1, "cancelled")
    UNKNOWN = (2, "unknown")
    INVALID_ARGUMENT = (3, "invalid argument")
    DEADLINE_EXCEEDED = (4, "deadline exceeded")
    NOT_FOUND = (5, "not found")
    ALREADY_EXISTS = (6, "already exists")
    PERMISSION_DENIED = (7, "permission denied")
    RESOURCE_EXHAUSTED = (8, "resource exhausted")
    FAILED_PRECONDITION = (9, "failed precondition")
    ABORTED = (10, "aborted")
    OUT_OF_RANGE = (11, "out of range")
    UNIMPLEMENTED = (12, "unimplemented")
    INTERNAL = (13, "internal")
    UNAVAILABLE = (14, "unavailable")
    DATA_LOSS = (15, "data loss")
    UNAUTHENTICATED = (16, "unauthenticated")

    def __eq__(self, other):
        if isinstance(other, enum.Enum):  # ours, or grpc.StatusCode's (compared by name)
            return type(other).__name__ == "StatusCode" and other.name == self.name
        return NotImplemented

    __hash__ = enum.Enum.__hash__  # hash(name), as grpc.StatusCode's members hash

    @classmethod
    def of(cls, code) -> "StatusCode":
        """The member for an int (GemmDone.status_code, the C ABI's codes; UNKNOWN outside
        0..16), one of ours, or a grpc.StatusCode."""
        if isinstance(code, enum.Enum):
            return cls[code.name] if code.name in cls.__members__ else cls.UNKNOWN
        return _BY_INT.get(int(code), cls.UNKNOWN)


_BY_INT = {code.value[0]: code for code in StatusCode}


class CallFailed(Exception):
    """A failed call read like grpcio's errors (code(), details()) without being one: the native
    core's (hgemm._native.NativeRpcError) and a deadline reported by grpcio as INTERNAL."""

    def __init__(self, code: StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def rpc_errors() -> tuple:
    """The exception types a failed call raises: CallFailed, and grpc.RpcError once grpcio is
    imported (only the grpcio path imports it, so before that no call can raise one)."""
    grpc = sys.modules.get("grpc")
    return (CallFailed,) if grpc is None else (CallFailed, grpc.RpcError)


class Error(Exception):
    """A call (or one GEMM of a stream) failed with a gRPC status.

    Attributes:
      code:    the StatusCode (equal to grpc.StatusCode's member of that name).
      status:  its name, e.g. "NOT_FOUND".
      message: the server's message (for a transport failure, gRPC's).
      index:   for gemm_many, the position of the failing GEMM in the list; else None.
      results: for gemm_many raising, the list of results, with Error instances in place of the
               GEMMs that failed (None for a GEMM the stream never answered).
    """

    code = StatusCode.UNKNOWN

    def __init__(self, message: str, code: Optional[StatusCode] = None,
                 index: Optional[int] = None):
        if code is not None:
            self.code = StatusCode.of(code)
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
    code = StatusCode.CANCELLED


class Unknown(Error):
    code = StatusCode.UNKNOWN


class InvalidArgument(Error):
    """Malformed request: a dimension of 0, an unknown kernel, a stream out of order."""
    code = StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(Error):
    """The timeout passed; a GEMM still queued then was not run."""
    code = StatusCode.DEADLINE_EXCEEDED


class NotFound(Error):
    """A resident matrix handle that does not exist (released, expired, evicted, never did)."""
    code = StatusCode.NOT_FOUND


class AlreadyExists(Error):
    code = StatusCode.ALREADY_EXISTS


class PermissionDenied(Error):
    """A handle that belongs to another client."""
    code = StatusCode.PERMISSION_DENIED


class ResourceExhausted(Error):
    """Over a server limit: elements per matrix, queue bytes, device memory, resident quota."""
    code = StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(Error):
    code = StatusCode.FAILED_PRECONDITION


class Aborted(Error):
    code = StatusCode.ABORTED


class OutOfRange(Error):
    code = StatusCode.OUT_OF_RANGE


class Unimplemented(Error):
    code = StatusCode.UNIMPLEMENTED


class Internal(Error):
    """The backend failed (e.g. a GPU fault), or the server broke the protocol."""
    code = StatusCode.INTERNAL


class Unavailable(Error):
    """The server's queue is full, it is shutting down, or it cannot be reached."""
    code = StatusCode.UNAVAILABLE


class DataLoss(Error):
    code = StatusCode.DATA_LOSS


class Unauthenticated(Error):
    """No valid token (authorization: Bearer ...)."""
    code = StatusCode.UNAUTHENTICATED


_BY_CODE = {cls.code: cls for cls in (
    Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
    PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange, Unimplemented,
    Internal, Unavailable, DataLoss, Unauthenticated)}


def from_code(code, message: str, index: Optional[int] = None) -> Error:
    """The Error for a StatusCode, a grpc.StatusCode or its integer value
    (GemmDone.status_code)."""
    code = StatusCode.of(code)
    cls = _BY_CODE.get(code, Unknown)
    return cls(message, code=code, index=index)


def from_rpc_error(e: Exception, index: Optional[int] = None) -> Error:
    """The Error for a failed call (grpcio's, sync or aio, or a CallFailed)."""
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else str(e)
    err = from_code(code or StatusCode.UNKNOWN, details or "", index)
    err.__cause__ = e
    return err


def past_deadline(e: Exception, timeout: Optional[float], elapsed: float) -> Exception:
    """e, or DEADLINE_EXCEEDED for an INTERNAL that came once the call's timeout had passed:
    grpcio's asyncio client reports some streams whose deadline expires while requests are
    still being sent as INTERNAL "Internal error from Core" (gRPC core's cancellation of the
    stream, not the server: it sends nothing on a call cancelled mid-read)."""
    if (timeout is not None and elapsed >= timeout and hasattr(e, "code")
            and e.code() == StatusCode.INTERNAL):
        return CallFailed(StatusCode.DEADLINE_EXCEEDED,
                          f"Deadline Exceeded (gRPC reported INTERNAL: {e.details()})")
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

"""hgemm.Error and its subclasses: one per gRPC status code, mapped in one place, with the
details the server sends (docs/errors.md, "Details"); StatusCode, gRPC's status codes without
importing grpc (the native core never loads grpcio).
"""
import dataclasses
import enum
import sys
from typing import Optional, Tuple

from google.protobuf import message as _message

from ._proto import status_pb2

try:  # googleapis-common-protos' (grpcio-status's), when installed: one copy in the process
    from google.rpc import error_details_pb2
except ImportError:
    from ._proto import error_details_pb2


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
    core's (hgemm._native.NativeRpcError) and a deadline reported by grpcio as INTERNAL.
    rpc_status: the serialized google.rpc.Status the server sent, or None."""

    def __init__(self, code: StatusCode, details: str, rpc_status: Optional[bytes] = None):
        super().__init__(f"{code.name}: {details}")
        self._code, self._details, self.rpc_status = code, details, rpc_status

    def code(self) -> StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@dataclasses.dataclass(frozen=True)
class FieldViolation:
    """A field of the request that is wrong (google.rpc.BadRequest.FieldViolation)."""
    field: str        # its path in the request, e.g. "header.options.kernel"
    description: str  # what is wrong with it


@dataclasses.dataclass(frozen=True)
class QuotaViolation:
    """A limit the request would pass (google.rpc.QuotaFailure.Violation)."""
    subject: str      # the limit: a server flag's name, e.g. "max_queued_bytes"
    description: str


def parse_status(data: Optional[bytes]) -> Optional[status_pb2.Status]:
    """A serialized google.rpc.Status (gRPC's grpc-status-details-bin trailer, the C ABI's
    hgemm_error_status); None for none or bytes that do not parse."""
    if not data:
        return None
    status = status_pb2.Status()
    try:
        status.ParseFromString(data)
    except _message.DecodeError:
        return None
    return status


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
    The server's details (docs/errors.md), for a program to act on without reading the message;
    empty (None, ()) for an error without them (the client's own, gRPC's, an older server's):
      reason:           ErrorInfo.reason, e.g. "QUEUE_FULL", "INVALID_FIELD".
      domain:           ErrorInfo.domain, "hgemm".
      field_violations: the fields that are wrong, FieldViolation(field, description).
      quota_violations: the limits passed, QuotaViolation(subject, description).
      retry_delay:      RetryInfo: nothing ran; send it again after at least this many seconds.
      rpc_status:       the google.rpc.Status itself (for other detail types).
    """

    code = StatusCode.UNKNOWN
    reason: Optional[str] = None
    domain: Optional[str] = None
    field_violations: Tuple[FieldViolation, ...] = ()
    quota_violations: Tuple[QuotaViolation, ...] = ()
    retry_delay: Optional[float] = None
    rpc_status: Optional[status_pb2.Status] = None

    def __init__(self, message: str, code: Optional[StatusCode] = None,
                 index: Optional[int] = None, rpc_status=None):
        if code is not None:
            self.code = StatusCode.of(code)
        self.message = message
        self.index = index
        self.results = None
        if rpc_status is not None:
            self._read_details(rpc_status)
        super().__init__(message)

    def _read_details(self, rpc_status) -> None:
        self.rpc_status = rpc_status
        fields, quotas = [], []
        for detail in rpc_status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                self.reason, self.domain = info.reason, info.domain
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                fields += [FieldViolation(v.field, v.description) for v in bad.field_violations]
            elif detail.Is(error_details_pb2.QuotaFailure.DESCRIPTOR):
                quota = error_details_pb2.QuotaFailure()
                detail.Unpack(quota)
                quotas += [QuotaViolation(v.subject, v.description) for v in quota.violations]
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                self.retry_delay = retry.retry_delay.seconds + retry.retry_delay.nanos * 1e-9
        self.field_violations, self.quota_violations = tuple(fields), tuple(quotas)

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
    """Shared memory over a connection that is not the Unix socket, a uid the socket does not
    allow, a region file the server may not open."""
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
    """The backend failed on this GEMM alone (a CUDA error that is not sticky), or the server
    broke the protocol."""
    code = StatusCode.INTERNAL


class Unavailable(Error):
    """The server's queue is full or it is shutting down (retry_delay set: nothing ran), the
    device the GEMM needed failed (reason "DEVICE_FAILED"), or it cannot be reached."""
    code = StatusCode.UNAVAILABLE


class DataLoss(Error):
    """A GEMM whose server-side verification failed twice: report it, do not retry blindly."""
    code = StatusCode.DATA_LOSS


class Unauthenticated(Error):
    """No valid token (authorization: Bearer ...)."""
    code = StatusCode.UNAUTHENTICATED


_BY_CODE = {cls.code: cls for cls in (
    Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
    PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange, Unimplemented,
    Internal, Unavailable, DataLoss, Unauthenticated)}


def from_code(code, message: str, index: Optional[int] = None, rpc_status=None) -> Error:
    """The Error for a StatusCode, a grpc.StatusCode or its integer value
    (GemmDone.status_code), with the details of rpc_status (a google.rpc.Status, e.g.
    GemmDone.status, or another Error's) if given."""
    code = StatusCode.of(code)
    cls = _BY_CODE.get(code, Unknown)
    return cls(message, code=code, index=index, rpc_status=rpc_status)


def _sent_status(e: Exception) -> Optional[status_pb2.Status]:
    """The google.rpc.Status of a failed call: a CallFailed's, or the grpc-status-details-bin
    trailer of grpcio's (sync or aio)."""
    if isinstance(e, CallFailed):
        return parse_status(e.rpc_status)
    trailing = getattr(e, "trailing_metadata", None)
    for key, value in (trailing() if callable(trailing) else None) or ():
        if key == "grpc-status-details-bin":
            return parse_status(value)
    return None


def from_rpc_error(e: Exception, index: Optional[int] = None) -> Error:
    """The Error for a failed call (grpcio's, sync or aio, or a CallFailed)."""
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else str(e)
    err = from_code(code or StatusCode.UNKNOWN, details or "", index, _sent_status(e))
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


# A server from before error details said it refused work before running it in these words
# only (server/core/status.cc); gRPC says the last when no connection could be made. Either way
# a retry cannot run anything twice.
_SERVER_MARKERS = ("retry with backoff", "server is shutting down")
_NOT_RUN_MARKERS = _SERVER_MARKERS + ("failed to connect",)


def sent_by_server(err: Error) -> bool:
    """True for an UNAVAILABLE the server sent (queue full, shutting down), not gRPC's own."""
    return err.domain == "hgemm" or any(m in err.message for m in _SERVER_MARKERS)


def unavailable_not_run(err: Error) -> bool:
    """True for an UNAVAILABLE that certainly did not run the request (safe to repeat): the
    server said so with a RetryInfo (or its words), or no connection was made."""
    return isinstance(err, Unavailable) and (
        err.retry_delay is not None or any(m in err.message for m in _NOT_RUN_MARKERS))

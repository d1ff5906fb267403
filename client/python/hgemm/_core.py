"""What the sync and asyncio clients share: result types, resident matrices, request building,
stream reassembly, the mode choice, retries and deadlines. No I/O happens here."""
import dataclasses
import inspect
import os
import random
import re
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

import grpc
import numpy as np

from . import _arrays, _errors, _malloc, _wire
from ._proto import hgemm_pb2 as pb
from ._proto import hgemm_pb2_grpc as pb_grpc

# Every server accepts messages this large (--max_message_bytes is at least 4 MiB); above it, the
# mode choice asks the server (GetServerInfo, once per client).
_ALWAYS_UNARY_BYTES = (4 << 20) - (64 << 10)
_MESSAGE_OVERHEAD_BYTES = 64 << 10
_ACCUMULATIONS = {None: pb.ACCUMULATION_UNSPECIFIED, "default": pb.ACCUMULATION_UNSPECIFIED,
                  "fp16": pb.ACCUMULATION_FP16, "fp32": pb.ACCUMULATION_FP32}
_ACCUMULATION_NAMES = {pb.ACCUMULATION_UNSPECIFIED: "default", pb.ACCUMULATION_FP16: "fp16",
                       pb.ACCUMULATION_FP32: "fp32"}
_CULPRIT = re.compile(r"^gemm_id (\d+): ")


@dataclasses.dataclass(frozen=True)
class Timing:
    """Where one GEMM's time went, measured by the server (milliseconds; see proto Timing)."""
    queue_wait_ms: float
    host_to_device_ms: float
    kernel_ms: float
    device_to_host_ms: float
    server_total_ms: float
    tflops: float

    @classmethod
    def from_proto(cls, t: pb.Timing) -> "Timing":
        return cls(t.queue_wait_ms, t.host_to_device_ms, t.kernel_ms, t.device_to_host_ms,
                   t.server_total_ms, t.tflops)


@dataclasses.dataclass(frozen=True)
class Execution:
    """Which hardware ran a GEMM: kernel (never "auto"), accumulation ("fp16"/"fp32"), backend
    ("cuda"/"cpu"), device id (-1 on CPU) and name, worker stream."""
    kernel: str
    accumulation: str
    backend: str
    device_id: int
    device_name: str
    stream_id: int

    @classmethod
    def from_proto(cls, e: pb.Execution) -> "Execution":
        return cls(e.kernel, _ACCUMULATION_NAMES.get(e.accumulation, str(e.accumulation)),
                   e.backend, e.device_id, e.device_name, e.stream_id)


@dataclasses.dataclass
class GemmResult:
    """gemm(..., details=True): c (ndarray, torch tensor, or ResidentMatrix with keep_c),
    timing, execution, request_id, and client_ms (wall time of the call in this process)."""
    c: object
    timing: Timing
    execution: Execution
    request_id: str
    client_ms: float


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A kernel variant from ListKernels: the name for kernel=, and its accumulations."""
    name: str
    description: str
    accumulations: Tuple[str, ...]


class MatrixList(list):
    """matrices(): the calling client's ResidentMatrix objects, plus client_bytes and quota_bytes."""
    client_bytes: int = 0
    quota_bytes: int = 0


class ResidentMatrix:
    """A matrix living on the server (UploadMatrix, or a C kept with keep_c=True).

    Usable wherever an operand goes: client.gemm(A, hb), client.gemm(hc, B), gemm_many pairs.
    Over several replicas, calls naming it go to `replica`, the one that holds it.
    `with client.upload(B) as hb:` releases it at the end of the block (NOT_FOUND there, e.g. an
    expired matrix, is ignored). With hgemm.aio, release() and download() are coroutines and the
    block is `async with`.
    Attributes: handle, rows, cols, shape, bytes, device_id, label, ttl_seconds, replica.
    """

    def __init__(self, client, info: pb.MatrixInfo):
        self._client = client
        self.info = info
        self.handle = info.handle
        self.rows = info.rows
        self.cols = info.cols
        self.released = False

    shape = property(lambda self: (self.rows, self.cols))
    bytes = property(lambda self: self.info.bytes)
    device_id = property(lambda self: self.info.device_id)
    label = property(lambda self: self.info.label)
    ttl_seconds = property(lambda self: self.info.ttl_seconds)
    replica = property(lambda self: handle_replica(self.handle))

    def download(self, **kwargs):
        """C's (or the upload's) values as a float16 ndarray; see Client.download."""
        return self._client.download(self, **kwargs)

    def release(self, **kwargs):
        """Frees it on the server; returns the bytes freed (0 if this object released it before)."""
        return self._client.release(self, **kwargs)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.release()
        except _errors.NotFound:
            pass

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
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


def replica_of(where) -> str:
    """upload(replica=...)'s argument as an address: a ResidentMatrix (its replica), an
    address, or None ("": balanced)."""
    if where is None:
        return ""
    return where if isinstance(where, str) else handle_replica(where.handle)


class Operand:
    """One prepared operand: a float16 ndarray to send, or a handle already on the server."""
    __slots__ = ("rows", "cols", "array", "handle")

    def __init__(self, x, name: str):
        if isinstance(x, ResidentMatrix) or (hasattr(x, "handle") and hasattr(x, "rows")
                                             and not _arrays.is_torch_tensor(x)):
            self.rows, self.cols, self.array, self.handle = int(x.rows), int(x.cols), None, x.handle
        else:
            self.array = _arrays.as_fp16_matrix(x, name)
            self.rows, self.cols = self.array.shape
            self.handle = ""

    @property
    def nbytes(self) -> int:
        return 0 if self.array is None else self.array.nbytes

    def bytes_view(self) -> np.ndarray:
        return _arrays.byte_view(self.array)


class Spec:
    """One GEMM, validated and ready to send (unary or streamed)."""

    def __init__(self, a, b, *, accumulation=None, kernel="auto", keep_c=False, c_ttl=0,
                 request_id="", index=None):
        where = "" if index is None else f"pair {index}: "
        self.a = Operand(a, where + "A")
        self.b = Operand(b, where + "B")
        if self.a.cols != self.b.rows:
            raise ValueError(f"{where}A is {self.a.rows}x{self.a.cols} and B is "
                             f"{self.b.rows}x{self.b.cols}: A's columns must equal B's rows")
        self.m, self.k, self.n = self.a.rows, self.a.cols, self.b.cols
        if accumulation not in _ACCUMULATIONS:
            raise ValueError(f"accumulation must be 'fp16', 'fp32' or None (the server's default, "
                             f"fp32); got {accumulation!r}")
        self.options = pb.GemmOptions(kernel=kernel or "auto",
                                      accumulation=_ACCUMULATIONS[accumulation],
                                      request_id=request_id)
        self.keep_c = bool(keep_c)
        self.c_ttl = int(c_ttl)

    @property
    def payload_bytes(self) -> int:
        return self.a.nbytes + self.b.nbytes

    def replica(self) -> str:
        """The replica this GEMM must run on: that of its handles ("": none, balanced).
        FailedPrecondition, naming both, when A and B live on two replicas."""
        a, b = handle_replica(self.a.handle), handle_replica(self.b.handle)
        if a and b and a != b:
            raise _errors.FailedPrecondition(
                f"A ({self.a.handle}) lives on replica {a} and B ({self.b.handle}) on replica "
                f"{b}: one GEMM runs on one replica; upload B where A lives "
                f"(upload(..., replica=A))")
        return a or b

    @property
    def c_bytes(self) -> int:
        return 0 if self.keep_c else 2 * self.m * self.n

    def unary_request(self) -> bytes:
        """The serialized GemmRequest (A and B copied once, straight from the arrays)."""
        small = pb.GemmRequest(m=self.m, n=self.n, k=self.k, options=self.options,
                               keep_c_resident=self.keep_c, c_ttl_seconds=self.c_ttl)
        if self.a.handle:
            small.a_handle = self.a.handle
        if self.b.handle:
            small.b_handle = self.b.handle
        return _wire.gemm_request(small, None if self.a.handle else self.a.bytes_view(),
                                  None if self.b.handle else self.b.bytes_view())

    def stream_messages(self, gemm_id: int, chunk_bytes: int, progress=None):
        """The header, then A's chunks, then B's (none for an operand given by handle), as
        serialized GemmStreamRequests."""
        yield pb.GemmStreamRequest(header=pb.GemmHeader(
            gemm_id=gemm_id, m=self.m, n=self.n, k=self.k, options=self.options,
            a_handle=self.a.handle, b_handle=self.b.handle, keep_c_resident=self.keep_c,
            c_ttl_seconds=self.c_ttl)).SerializeToString()
        for operand, which in ((self.a, pb.OPERAND_A), (self.b, pb.OPERAND_B)):
            if operand.array is None:
                continue
            view = operand.bytes_view()
            for offset in range(0, len(view), chunk_bytes):
                data = view[offset:offset + chunk_bytes]
                yield _wire.stream_chunk(gemm_id, which, offset, data)
                if progress is not None:
                    progress.update(len(data))


def stream_requests(specs: Dict[int, "Spec"], order: Sequence[int], chunk_bytes: int, progress):
    """Every GEMM of `order`, one after the other (a GEMM is complete before the next starts, so
    a stream that breaks at GEMM X has admitted every GEMM before X and none after it)."""
    for i in order:
        yield from specs[i].stream_messages(i, chunk_bytes, progress)


class StreamCollector:
    """Reassembles a GemmStream's answers: C's chunks into one buffer per GEMM, then its done."""

    def __init__(self, specs: Dict[int, Spec], progress=None):
        self.specs = specs
        self.buffers: Dict[int, np.ndarray] = {}
        self.done: Dict[int, pb.GemmDone] = {}
        self.protocol_error: Optional[_errors.Error] = None
        self.progress = progress

    def consume(self, message: _wire.StreamResponse) -> Optional[int]:
        """Takes one answer; returns its gemm_id when it was the GEMM's done."""
        i = message.gemm_id
        spec = self.specs.get(i)
        if spec is None or i in self.done:
            self._broken(f"the server answered gemm_id {i}, which is not in flight")
            return None
        if message.data is not None:
            end = message.offset + len(message.data)
            if end > spec.c_bytes:
                self._broken(f"gemm_id {i}: result chunk ends at byte {end}, past C's "
                             f"{spec.c_bytes} bytes")
                return None
            buf = self.buffers.get(i)
            if buf is None:
                buf = self.buffers[i] = np.empty(spec.c_bytes, dtype=np.uint8)
            buf[message.offset:end] = message.data
            if self.progress is not None:
                self.progress.update(len(message.data))
        elif message.done is not None:
            self.done[i] = message.done
            if message.done.status_code != 0:
                self.buffers.pop(i, None)  # chunks already sent are void
            return i
        return None

    def _broken(self, what: str) -> None:
        if self.protocol_error is None:
            self.protocol_error = _errors.Internal(what)

    def outcome(self, i: int):
        """None while unanswered; an Error; or (c_array or None, done)."""
        done = self.done.get(i)
        if done is None:
            return None
        if done.status_code != 0:
            return _errors.from_code(done.status_code, done.status_message, index=i)
        spec = self.specs[i]
        if spec.keep_c:
            return None, done
        buf = self.buffers.pop(i, None)
        if buf is None:
            buf = np.empty(spec.c_bytes, dtype=np.uint8)
            if spec.c_bytes:
                return _errors.Internal("the server sent done without C's bytes", index=i)
        return _arrays.c_array(buf, spec.m, spec.n), done


class Routes:
    """The channels of one client: the target's, over which calls naming no handle are
    balanced (round_robin), and one per replica for the calls naming its handles, made with
    ClientConfig.make_channel at first use and kept. Thread-safe."""

    def __init__(self, config: "ClientConfig", grpc_module):
        self._config = config
        self._module = grpc_module  # grpc or grpc.aio
        self._lock = threading.Lock()
        channel = config.make_channel(config.target, grpc_module)
        self.target = (channel, _wire.Stub(channel, pb_grpc.GemmServiceStub(channel)))
        self._replicas = {}

    def stub(self, replica: str):
        """The stub for `replica` ("": the target's)."""
        if not replica:
            return self.target[1]
        with self._lock:
            route = self._replicas.get(replica)
            if route is None:
                channel = self._config.make_channel(replica, self._module)
                route = self._replicas[replica] = (
                    channel, _wire.Stub(channel, pb_grpc.GemmServiceStub(channel)))
            return route[1]

    def channels(self) -> list:
        with self._lock:
            return [self.target[0]] + [channel for channel, _ in self._replicas.values()]


def explain_unreachable(err: _errors.Error, replica: str) -> _errors.Error:
    """A call to `replica` that did not reach it: say what that means for its matrices. An
    UNAVAILABLE the replica itself sent (queue full, shutting down) stays as it is."""
    if not replica or not isinstance(err, _errors.Unavailable) or _errors.sent_by_server(err):
        return err
    out = _errors.Unavailable(f"replica {replica} cannot be reached ({err.message}): if it is "
                              f"gone, the resident matrices it held went with it; upload them "
                              f"again", index=err.index)
    out.__cause__ = err
    return out


def by_replica(specs: Dict[int, "Spec"]):
    """gemm_many's GEMMs grouped by the replica each must run on, in the order each replica
    is first named: ({replica: {index: spec}}, {index: FailedPrecondition})."""
    groups: Dict[str, Dict[int, Spec]] = {}
    refused: Dict[int, _errors.Error] = {}
    for i, spec in specs.items():
        try:
            groups.setdefault(spec.replica(), {})[i] = spec
        except _errors.FailedPrecondition as err:
            err.index = i
            refused[i] = err
    return groups, refused


class Deadline:
    """A call's timeout (seconds, None for none) across its retries."""

    def __init__(self, timeout: Optional[float]):
        self.end = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> Optional[float]:
        return None if self.end is None else max(self.end - time.monotonic(), 0.001)

    def allows(self, delay: float) -> bool:
        return self.end is None or time.monotonic() + delay < self.end


@dataclasses.dataclass
class RetryPolicy:
    """UNAVAILABLE is retried with exponential backoff and jitter: always when the server said the
    request was not run (queue full, shutting down) or no connection was made; for any other
    UNAVAILABLE only when repeating cannot change anything (a GEMM without keep_c, info, kernels,
    matrices, download). Never past the call's timeout."""
    attempts: int = 5               # tries in all, the first included
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    multiplier: float = 2.0

    def delay(self, retry: int) -> float:
        d = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** retry)
        return d * random.uniform(0.5, 1.0)


def should_retry(err: _errors.Error, idempotent: bool) -> bool:
    return isinstance(err, _errors.Unavailable) and (idempotent or _errors.unavailable_not_run(err))


def culprit_of(err: _errors.Error) -> Optional[int]:
    """The gemm_id a stream-ending error names ("gemm_id 3: header.options.kernel: ...")."""
    m = _CULPRIT.match(err.message)
    return int(m.group(1)) if m else None


class ManyRound:
    """Bookkeeping of gemm_many across streams: which GEMMs are answered, which to send again.

    A GEMM answered UNAVAILABLE-not-run goes again after a backoff; a stream that ends naming a
    GEMM (an invalid header) fails that GEMM alone and the GEMMs after it, never admitted, go on
    a fresh stream; a stream that ends otherwise fails (or retries, if safe) the unanswered ones.
    """

    def __init__(self, specs: Dict[int, Spec], policy: RetryPolicy, deadline: Deadline):
        self.specs = specs
        self.policy = policy
        self.deadline = deadline
        self.outcomes: Dict[int, object] = {}
        self.pending: List[int] = sorted(specs)
        self.retries = 0

    def outcome(self, i: int):
        return self.outcomes.get(i) or _errors.Internal("the GEMM was never answered", index=i)

    def settle(self, collector: StreamCollector, stream_err: Optional[_errors.Error]) -> float:
        """Records one stream's answers; returns the backoff before the next round (0: none)."""
        sent = self.pending
        retry, resend, unanswered = [], [], []
        for i in sent:
            o = collector.outcome(i)
            if o is None:
                unanswered.append(i)
            elif isinstance(o, _errors.Error) and should_retry(o, not self.specs[i].keep_c):
                retry.append((i, o))
            else:
                self.outcomes[i] = o
        if stream_err is None and collector.protocol_error is not None:
            stream_err = collector.protocol_error
        if stream_err is not None:
            culprit = culprit_of(stream_err)
            if culprit in unanswered:
                self.outcomes[culprit] = _errors.from_code(stream_err.code, stream_err.message,
                                                           index=culprit)
                after = sent[sent.index(culprit) + 1:]
                resend = [i for i in unanswered if i in after]
                unanswered = [i for i in unanswered if i != culprit and i not in after]
            for i in unanswered:
                err = _errors.from_code(stream_err.code, stream_err.message, index=i)
                if should_retry(err, not self.specs[i].keep_c):
                    retry.append((i, err))
                else:
                    self.outcomes[i] = err
        else:
            for i in unanswered:
                self.outcomes[i] = _errors.Internal("the stream ended without an answer", index=i)
        delay = 0.0
        if retry:
            delay = self.policy.delay(self.retries)
            self.retries += 1
            if self.retries >= self.policy.attempts or not self.deadline.allows(delay):
                for i, err in retry:
                    self.outcomes[i] = err
                retry, delay = [], 0.0
        self.pending = sorted(resend + [i for i, _ in retry])
        return delay


class Pending:
    """One GEMM of a Client.stream() session: its Spec, the future its result goes to, how the
    result is wanted, and its tries so far."""
    __slots__ = ("spec", "future", "details", "as_torch", "started", "attempt")

    def __init__(self, spec: Spec, future, details: bool, as_torch, started: float):
        self.spec, self.future, self.details = spec, future, details
        self.as_torch, self.started, self.attempt = as_torch, started, 0


class SessionBook:
    """The bookkeeping of a Client.stream() session: the GEMMs in flight on its current
    GemmStream, their answers, and what becomes of each when the stream ends. No I/O; not
    thread-safe (the session serializes calls).

    consume() and ended() return (finished, retry): finished are (Pending, outcome) pairs, the
    outcome an Error or (c, done) as StreamCollector.outcome; retry are (Pending, delay_s) to
    send again after the delay, on whatever stream is open then. A GEMM answered UNAVAILABLE is
    retried as gemm_many retries it (RetryPolicy); when the stream ends, the GEMM an error names
    fails alone and the ones after it, never admitted, go again at once; the rest fail with the
    stream's error, or are retried if that is safe.
    """

    def __init__(self, policy: RetryPolicy):
        self.policy = policy
        self.pending: Dict[int, Pending] = {}
        self.collector = StreamCollector({})
        self._next_id = 0

    def add(self, p: Pending) -> int:
        """Registers a GEMM about to be written; returns its gemm_id on this stream."""
        i = self._next_id
        self._next_id += 1
        self.pending[i] = p
        self.collector.specs[i] = p.spec
        return i

    @property
    def protocol_error(self) -> Optional[_errors.Error]:
        return self.collector.protocol_error

    def consume(self, message: _wire.StreamResponse):
        i = self.collector.consume(message)
        if i is None:
            return [], []
        outcome = self.collector.outcome(i)
        self.collector.specs.pop(i)
        self.collector.done.pop(i)
        p = self.pending.pop(i)
        if isinstance(outcome, _errors.Error):
            outcome.index = None
            if self._retryable(p, outcome):
                return [], [(p, self._backoff(p))]
        return [(p, outcome)], []

    def ended(self, err: Optional[_errors.Error]):
        """The stream is over (err None: it ended cleanly); settles every GEMM still pending and
        starts a fresh book for the next stream."""
        if err is None:
            err = self.protocol_error
        order = sorted(self.pending)
        culprit = culprit_of(err) if err is not None else None
        finished, retry = [], []
        for i in order:
            p = self.pending[i]
            if err is None:
                finished.append((p, _errors.Internal("the stream ended without an answer")))
            elif culprit in self.pending and i == culprit:
                finished.append((p, _errors.from_code(err.code, err.message)))
            elif culprit in self.pending and i > culprit:
                retry.append((p, 0.0))  # written after the culprit: never admitted
            else:
                e = _errors.from_code(err.code, err.message)
                e.__cause__ = err.__cause__
                if self._retryable(p, e):
                    retry.append((p, self._backoff(p)))
                else:
                    finished.append((p, e))
        self.pending.clear()
        self.collector = StreamCollector({})
        return finished, retry

    def _retryable(self, p: Pending, err: _errors.Error) -> bool:
        return should_retry(err, not p.spec.keep_c) and p.attempt + 1 < self.policy.attempts

    def _backoff(self, p: Pending) -> float:
        delay = self.policy.delay(p.attempt)
        p.attempt += 1
        return delay


def session_replica(bound: Optional[str], spec: Spec) -> str:
    """The replica a session's stream goes to once `spec` is on it: `bound` (None: not yet
    chosen, so the spec's). FailedPrecondition when the spec names matrices of another replica."""
    wanted = spec.replica()
    if bound is None:
        return wanted
    if wanted and wanted != bound:
        where = f"replica {bound}" if bound else "the client's target"
        raise _errors.FailedPrecondition(
            f"this stream goes to {where}, and the GEMM names matrices on replica {wanted}: "
            f"open a stream there (client.stream(replica=...))")
    return bound


def read_token(token: Optional[str], token_file: Optional[str]) -> Optional[str]:
    if token is None and token_file:
        with open(token_file) as f:
            token = f.read().strip()
    if token is None:
        token = os.environ.get("HGEMM_TOKEN") or None
    return token


def tls_credentials(tls, tls_ca, tls_cert, tls_key) -> Optional[grpc.ChannelCredentials]:
    """Channel credentials, or None for plaintext. TLS is on with tls=True (system roots) or any
    of the certificate paths; tls_cert/tls_key (PEM) are the client's certificate for mTLS."""
    if not (tls or tls_ca or tls_cert or tls_key):
        return None
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("tls_cert and tls_key go together (the client's certificate and key)")

    def read(path):
        if not path:
            return None
        with open(path, "rb") as f:
            return f.read()
    return grpc.ssl_channel_credentials(root_certificates=read(tls_ca),
                                        private_key=read(tls_key),
                                        certificate_chain=read(tls_cert))


class ClientConfig:
    """The options both clients take (documented on hgemm.Client)."""

    def __init__(self, target, *, tls=False, tls_ca=None, tls_cert=None, tls_key=None,
                 tls_server_name=None, token=None, token_file=None, client_id=None, traceparent=None, timeout=None,
                 mode="auto", unary_limit_bytes=32 << 20, chunk_bytes=1 << 20, retries=5,
                 progress=None, channel_options=()):
        if mode not in ("auto", "unary", "stream"):
            raise ValueError(f"mode must be 'auto', 'unary' or 'stream'; got {mode!r}")
        if chunk_bytes < 1:
            raise ValueError("chunk_bytes must be at least 1")
        _malloc.tune()
        self.target = target
        self.credentials = tls_credentials(tls, tls_ca, tls_cert, tls_key)
        self.timeout = timeout
        self.mode = mode
        self.unary_limit_bytes = unary_limit_bytes
        self.chunk_bytes = chunk_bytes
        self.policy = RetryPolicy(attempts=max(1, retries))
        self.progress = progress
        metadata = []
        token = read_token(token, token_file)
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
                and _ALWAYS_UNARY_BYTES < big and big - _MESSAGE_OVERHEAD_BYTES <= self.unary_limit_bytes)

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


def kernels_from_proto(response: pb.ListKernelsResponse) -> List[Kernel]:
    return [Kernel(k.name, k.description,
                   tuple(_ACCUMULATION_NAMES.get(a, str(a)) for a in k.accumulations))
            for k in response.kernels]


def unary_result(client, spec: Spec, raw: _wire.GemmResponse, details: bool, as_torch,
                 started: float):
    response = raw.message
    if spec.keep_c:
        c = ResidentMatrix(client, response.c_matrix)
    else:
        c = raw.c_array(spec.m, spec.n)
        if c is None:
            start, end = raw.c_range or (0, 0)
            raise _errors.Internal(f"the server sent {end - start} bytes of C; "
                                   f"{spec.m}x{spec.n} fp16 is {2 * spec.m * spec.n}")
        c = _arrays.to_output(c, as_torch)
    if not details:
        return c
    return GemmResult(c, Timing.from_proto(response.timing),
                      Execution.from_proto(response.execution), response.request_id,
                      (time.monotonic() - started) * 1e3)


def streamed_result(client, spec: Spec, outcome, details: bool, as_torch, started: float):
    """An Error stays an Error; (c, done) becomes what gemm returns."""
    if isinstance(outcome, _errors.Error):
        return outcome
    c, done = outcome
    c = ResidentMatrix(client, done.c_matrix) if spec.keep_c else _arrays.to_output(c, as_torch)
    if not details:
        return c
    return GemmResult(c, Timing.from_proto(done.timing), Execution.from_proto(done.execution),
                      done.request_id, (time.monotonic() - started) * 1e3)


def normalize_pairs(pairs, defaults: dict) -> List[Spec]:
    """gemm_many's items: (A, B) or (A, B, {per-GEMM options}) → Specs."""
    specs = []
    for i, item in enumerate(pairs):
        if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
            raise ValueError(f"pair {i}: expected (A, B) or (A, B, options); got {type(item).__name__}")
        options = dict(defaults)
        if len(item) == 3:
            unknown = set(item[2]) - set(defaults)
            if unknown:
                raise ValueError(f"pair {i}: unknown options {sorted(unknown)}")
            options.update(item[2])
        specs.append(Spec(item[0], item[1], index=i, **options))
    return specs


def finish_many(results: list, return_exceptions: bool):
    if return_exceptions:
        return results
    for r in results:
        if isinstance(r, _errors.Error):
            r.results = results
            raise r
    return results


def upload_messages(array: np.ndarray, ttl: int, label: str, device_id, chunk_bytes: int,
                    progress=None):
    header = pb.MatrixHeader(rows=array.shape[0], cols=array.shape[1], ttl_seconds=int(ttl),
                             label=label)
    if device_id is not None:
        header.device_id = int(device_id)
    yield pb.UploadMatrixRequest(header=header).SerializeToString()
    view = _arrays.byte_view(array)
    for offset in range(0, len(view), chunk_bytes):
        data = view[offset:offset + chunk_bytes]
        yield _wire.upload_chunk(data)
        if progress is not None:
            progress.update(len(data))


class DownloadBuffer:
    """DownloadMatrix's chunks into one buffer, allocated once from the first chunk's total."""

    def __init__(self, rows: int, cols: int, progress=None):
        self.rows, self.cols = rows, cols
        self.buf = None
        self.received = 0
        self.progress = progress

    def add(self, chunk: _wire.DownloadChunk) -> None:
        if chunk.offset != self.received:
            raise _errors.Internal(f"download chunk at offset {chunk.offset}, expected {self.received}")
        if self.buf is None:
            self.buf = np.empty(chunk.total_bytes or 2 * self.rows * self.cols, dtype=np.uint8)
        end = chunk.offset + len(chunk.data)
        if end > len(self.buf):
            raise _errors.Internal(f"download chunk ends at byte {end}, past {len(self.buf)}")
        self.buf[chunk.offset:end] = chunk.data
        self.received = end
        if self.progress is not None:
            self.progress.update(len(chunk.data))

    def array(self) -> np.ndarray:
        if self.buf is None or self.received != len(self.buf) or len(self.buf) != 2 * self.rows * self.cols:
            raise _errors.Internal(f"download ended after {self.received} bytes of "
                                   f"{2 * self.rows * self.cols}")
        return _arrays.c_array(self.buf, self.rows, self.cols)

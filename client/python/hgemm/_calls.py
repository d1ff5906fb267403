"""The methods of hgemm.Client and hgemm.aio.Client, written once as generators of I/O steps.

A method of Calls checks its arguments, builds the requests, and yields each piece of I/O it
needs as a step: Rpc (one gRPC call), Native (one blocking call of the native core, sync client
only), Sleep (a backoff) or AllOf (several step generators, whose results it gets as a list).
What a step came to is sent back in, or thrown in where it raised (grpc.RpcError: the call
failed); the method's return value is the client method's result.
hgemm.Client does the steps with blocking calls and hgemm.aio.Client with awaits: those drivers
are the clients' only I/O. The methods are annotated with what the clients return.

Thread safety: a Calls is shared by every call of its client (ClientConfig and Routes are
thread-safe); each method call is a generator of its own, driven by one thread or task.
"""
import dataclasses
import time
from typing import Callable, List, Optional

import grpc
import numpy as np

from . import _arrays, _errors, _native, _progress
from ._config import ClientConfig
from ._many_rounds import ManyRound
from ._proto import hgemm_pb2 as pb
from ._resident import MatrixList, ResidentMatrix, handle_replica, replica_of
from ._results import (Kernel, finish_many, kernels_from_proto, native_result, streamed_result,
                       unary_result, with_out)
from ._retry import Deadline, should_retry
from ._routes import Routes, by_replica, explain_unreachable
from ._spec import Spec, batched_spec, normalize_pairs, stream_requests
from ._stream_collector import StreamCollector
from ._transfers import DownloadBuffer, upload_messages


@dataclasses.dataclass
class Rpc:
    """One gRPC call, method(request, timeout=timeout, metadata=metadata); it comes to the
    response. streams_request: the request is an iterator of serialized messages. With
    on_response, each message of the response stream goes to it and the call comes to None."""
    method: Callable
    request: object
    timeout: Optional[float]
    metadata: tuple
    streams_request: bool = False
    on_response: Optional[Callable] = None


@dataclasses.dataclass
class Native:
    """One call of the native core, fn(*args), blocking its thread with the GIL released (ctypes);
    it comes to fn's result. Only a Calls with a native core (the sync client's) yields these."""
    fn: Callable
    args: tuple


@dataclasses.dataclass
class Sleep:
    seconds: float


@dataclasses.dataclass
class AllOf:
    """Step generators to run to their results (a list, in their order): at once on asyncio,
    one after the other on the sync client."""
    steps: list


class Calls:
    """A client's state (config, channels) and its methods as step generators."""

    def __init__(self, client, grpc_module, target: str, **options):
        self.client = client  # what the ResidentMatrix objects made here call back
        self.config = ClientConfig(target, **options)
        self.routes = Routes(self.config, grpc_module)
        # The native core (hgemm/_native.py) for the sync client, when it is chosen and the
        # client needs no grpcio channel options; None: every call goes through grpcio.
        self.native = None
        if grpc_module is grpc and not self.config.has_channel_options and _native.use_native():
            c = self.config
            self.native = _native.NativeClient(target, c.tls_files, c.token, c.client_id,
                                               c.traceparent, c.chunk_bytes)

    # The retry loop around one call (to `replica`, "" for the target).
    def _call(self, attempt, timeout, idempotent: bool, replica: str = ""):
        """attempt(stub, timeout_s): the steps of one try, repeated while RetryPolicy allows."""
        deadline = Deadline(self.config.call_timeout(timeout))
        policy = self.config.policy
        stub = self.routes.stub(replica)
        for tried in range(policy.attempts):
            try:
                return (yield from attempt(stub, deadline.remaining()))
            except grpc.RpcError as e:
                err = _errors.from_rpc_error(e)
            delay = policy.delay(tried)
            if (tried + 1 == policy.attempts or not should_retry(err, idempotent)
                    or not deadline.allows(delay)):
                raise explain_unreachable(err, replica)
            yield Sleep(delay)

    def _rpc(self, method, request, timeout, **how):
        """The one step of a call: comes to its response (None with on_response)."""
        return (yield Rpc(method, request, timeout, self.config.metadata, **how))

    def _native_call(self, fn, *args):
        """The one step of a native call: comes to fn's result."""
        return (yield Native(fn, args))

    def _on_native(self, fn, args, timeout, idempotent: bool, nbytes: int, desc: str = "hgemm"):
        """fn(*args, timeout_s) of the native core, retried as _call. The C++ client routes by
        handle and explains unreachable replicas itself. A progress bar for the nbytes the call
        moves fills when it returns (the native core reports no chunks)."""
        bar = _progress.bar(self.config.progress, nbytes, desc)
        try:
            result = yield from self._call(lambda stub, t: self._native_call(fn, *args, t),
                                           timeout, idempotent)
            if bar is not None:
                bar.update(nbytes)
            return result
        finally:
            _progress.close(bar)

    def _unary(self, name: str, request, timeout, idempotent: bool, replica: str = ""):
        """GemmService.<name>(request), retried as _call."""
        return (yield from self._call(lambda stub, t: self._rpc(getattr(stub, name), request, t),
                                      timeout, idempotent, replica))

    def _server_limit(self, spec, mode, timeout):
        if self.config.needs_server_limit(spec, mode):
            try:
                info = yield from self.info(timeout=timeout)
                self.config.max_message_bytes = info.limits.max_message_bytes
            except _errors.Error:
                self.config.max_message_bytes = 4 << 20  # assume the smallest a server takes

    # GEMMs.
    def gemm(self, a, b, *, accumulation: Optional[str] = None, kernel: str = "auto",
             keep_c: bool = False, c_ttl: int = 0, request_id: str = "", details: bool = False,
             as_torch=False, mode: Optional[str] = None, timeout: Optional[float] = None,
             out: Optional[np.ndarray] = None, c_dtype: Optional[str] = None,
             alpha: Optional[float] = None, beta: float = 0.0, c=None):
        """C = A·B. A (m×k) and B (k×n): float16 numpy arrays, torch tensors, or ResidentMatrix.
        A transposed view (B.T of a C-contiguous B, a weight's .t()) is sent as stored with
        transpose_b (or transpose_a) set, not copied. torch.bfloat16 tensors (both operands) go
        as bf16. c_dtype: None (C of the inputs' type; a bf16 C is float32 in numpy, bfloat16
        with as_torch) or "fp32" (a float32 C).

        Returns C as an m×n float16 ndarray (a torch tensor with as_torch=True, or on a device
        with as_torch="cuda:0"); with keep_c=True a ResidentMatrix instead; with details=True a
        GemmResult (c, timing, execution, request_id, client_ms). out: a writable, C-contiguous
        m×n float16 ndarray to write C into (returned as C); the native core writes it there
        directly, grpcio's copies into it.
        accumulation: None (the server's default, fp32), "fp32" or "fp16". kernel: "auto" or a
        name from kernels(). alpha, beta, c: C = alpha·A·B + beta·c (BLAS semantics, fp32 math,
        one rounding); alpha None is 1; c (m×n, C's type: float16, float32, torch bfloat16 or
        floats rounded to bf16, or a ResidentMatrix) is sent only when beta ≠ 0. Raises an
        hgemm.Error subclass on failure.
        """
        started = time.monotonic()
        spec = Spec(a, b, accumulation=accumulation, kernel=kernel, keep_c=keep_c, c_ttl=c_ttl,
                    request_id=request_id, c_dtype=c_dtype, alpha=alpha, beta=beta, c=c)
        replica = spec.replica()
        if out is not None and spec.c_dtype != "fp16":
            raise ValueError(f"out= takes a float16 C; this GEMM's C is {spec.c_dtype}")
        _arrays.check_out(out, spec.m, spec.n, keep_c, as_torch)
        yield from self._server_limit(spec, mode, timeout)
        if self.native is not None and not keep_c and spec.plain_fp16():
            c, info = yield from self._on_native(self.native.gemm,
                                                 (spec, self.config.streams(spec, mode), out),
                                                 timeout, idempotent=True,
                                                 nbytes=spec.payload_bytes + spec.c_bytes)
            return native_result(spec, c, info, details, as_torch, started, out)
        if self.config.streams(spec, mode):
            result = (yield from self._many([spec], timeout, details, as_torch, started))[0]
            if isinstance(result, _errors.Error):
                result.index = None
                raise result
            return with_out(result, out)
        response = yield from self._unary("Gemm", spec.unary_request(), timeout,
                                          idempotent=not keep_c, replica=replica)
        return with_out(unary_result(self.client, spec, response, details, as_torch, started), out)

    def gemm_batched(self, a, b, *, alpha: Optional[float] = None, beta: float = 0.0, c=None,
                     c_dtype: Optional[str] = None, accumulation: Optional[str] = None,
                     kernel: str = "auto", request_id: str = "", details: bool = False,
                     as_torch=False, mode: Optional[str] = None, timeout: Optional[float] = None):
        """Strided-batched GEMM in one call: C[i] = alpha·A[i]·B[i] + beta·c[i] for A
        (batch×m×k) and B (batch×k×n), e.g. 3-D float16 arrays or lists of matrices; c
        (batch×m×n of C's type) only with beta ≠ 0. Returns C as a batch×m×n array (a GemmResult
        with details=True). Options as gemm's; goes through grpcio (GemmRequest.batch)."""
        started = time.monotonic()
        spec = batched_spec(a, b, accumulation=accumulation, kernel=kernel, request_id=request_id,
                            c_dtype=c_dtype, alpha=alpha, beta=beta, c=c)
        yield from self._server_limit(spec, mode, timeout)
        if self.config.streams(spec, mode):
            result = (yield from self._many([spec], timeout, details, as_torch, started))[0]
            if isinstance(result, _errors.Error):
                result.index = None
                raise result
            return result
        response = yield from self._unary("Gemm", spec.unary_request(), timeout,
                                          idempotent=True, replica="")
        return unary_result(self.client, spec, response, details, as_torch, started)

    def gemm_many(self, pairs, *, accumulation: Optional[str] = None, kernel: str = "auto",
                  keep_c: bool = False, c_ttl: int = 0, details: bool = False, as_torch=False,
                  return_exceptions: bool = False, timeout: Optional[float] = None,
                  c_dtype: Optional[str] = None) -> list:
        """Many GEMMs on one GemmStream, pipelined (the server works on early GEMMs while later
        ones upload); results come back in the order of `pairs`.

        pairs: (A, B) or (A, B, {options}) items, options being any of accumulation, kernel,
        keep_c, c_ttl, request_id, c_dtype for that GEMM (operands as gemm takes them). A failing GEMM does not stop the others. Over
        several replicas, one stream per replica the GEMMs' matrices live on. With
        return_exceptions=False the first failing GEMM's Error is raised once all are done (its
        .index is its position, its .results the whole list); with True, failed GEMMs are
        hgemm.Error objects in the returned list. timeout is for the whole batch.
        """
        started = time.monotonic()
        defaults = dict(accumulation=accumulation, kernel=kernel, keep_c=keep_c, c_ttl=c_ttl,
                        request_id="", c_dtype=c_dtype)
        specs = normalize_pairs(pairs, defaults)
        if not specs:
            return []
        results = yield from self._many(specs, timeout, details, as_torch, started)
        return finish_many(results, return_exceptions)

    def _many(self, specs: List[Spec], timeout, details, as_torch, started):
        groups, outcomes = by_replica(dict(enumerate(specs)))
        deadline = Deadline(self.config.call_timeout(timeout))
        total = sum(s.payload_bytes + s.c_bytes for s in specs)
        bar = _progress.bar(self.config.progress, total, "hgemm")
        try:
            done = yield AllOf([self._stream_rounds(replica, by_id, deadline, bar)
                                for replica, by_id in groups.items()])
            for by_id, rounds in zip(groups.values(), done):
                outcomes.update((i, rounds.outcome(i)) for i in by_id)
        finally:
            _progress.close(bar)
        return [streamed_result(self.client, specs[i], outcomes[i], details, as_torch, started)
                for i in range(len(specs))]

    def _stream_rounds(self, replica: str, by_id, deadline, bar):
        stub = self.routes.stub(replica)
        rounds = ManyRound(by_id, self.config.policy, deadline)
        while rounds.pending:
            collector = StreamCollector({i: by_id[i] for i in rounds.pending}, bar)
            requests = stream_requests(by_id, rounds.pending, self.config.chunk_bytes, bar)
            stream_err = None
            try:
                yield from self._rpc(stub.GemmStream, requests, deadline.remaining(),
                                     streams_request=True, on_response=collector.consume)
            except grpc.RpcError as e:
                stream_err = explain_unreachable(_errors.from_rpc_error(e), replica)
            delay = rounds.settle(collector, stream_err)
            if delay:
                yield Sleep(delay)
        return rounds

    # Resident matrices.
    def upload(self, matrix, *, ttl: int = 0, label: str = "", device_id: Optional[int] = None,
               replica=None, timeout: Optional[float] = None) -> ResidentMatrix:
        """Uploads a matrix (float16 ndarray or tensor, or a torch.bfloat16 tensor: a bf16
        matrix, for GEMMs of bf16) and returns its ResidentMatrix (as stored: a transposed view
        is copied).
        ttl: seconds after its last use at which the server frees it (0: the server's default).
        device_id: the CUDA device to keep it on (None: the one with the most free memory).
        replica: where to put it over several replicas: a ResidentMatrix (onto the replica that
        holds it, so that both can go in one GEMM) or a replica's address; None: balanced."""
        array, dtype, _ = _arrays.as_operand(matrix, "matrix", allow_transposed=False)
        if self.native is not None and device_id is None and dtype == "fp16":
            info = yield from self._on_native(self.native.upload,
                                              (array, ttl, label, replica_of(replica)), timeout,
                                              idempotent=False, nbytes=array.nbytes,
                                              desc="hgemm upload")
            return ResidentMatrix(self.client, info)
        bar = _progress.bar(self.config.progress, array.nbytes, "hgemm upload")

        def attempt(stub, t):
            messages = upload_messages(array, ttl, label, device_id, self.config.chunk_bytes, bar,
                                       dtype=pb.DATA_TYPE_BF16 if dtype == "bf16"
                                       else pb.DATA_TYPE_UNSPECIFIED)
            return self._rpc(stub.UploadMatrix, messages, t, streams_request=True)
        try:
            info = yield from self._call(attempt, timeout, idempotent=False,
                                         replica=replica_of(replica))
        finally:
            _progress.close(bar)
        return ResidentMatrix(self.client, info)

    def download(self, matrix: ResidentMatrix, *, as_torch=False,
                 timeout: Optional[float] = None):
        """A resident matrix's values as a float16 ndarray (float32 for an fp32 or bf16 one; or a
        torch tensor with as_torch)."""
        bar = _progress.bar(self.config.progress, matrix.bytes, "hgemm download")

        def attempt(stub, t):
            buf = DownloadBuffer(matrix.rows, matrix.cols, bar, matrix.dtype)
            yield from self._rpc(stub.DownloadMatrix, pb.DownloadMatrixRequest(handle=matrix.handle),
                                 t, on_response=buf.add)
            return buf.array()
        try:
            array = yield from self._call(attempt, timeout, idempotent=True,
                                          replica=handle_replica(matrix.handle))
            return _arrays.to_output(array, as_torch)
        finally:
            _progress.close(bar)

    def release(self, matrix: ResidentMatrix, *, timeout: Optional[float] = None) -> int:
        """Frees a resident matrix; returns the bytes freed. NotFound if it is gone already."""
        if getattr(matrix, "released", False):
            return 0
        if self.native is not None:
            freed = yield from self._on_native(self.native.release, (matrix.handle,), timeout,
                                               idempotent=False, nbytes=0)
        else:
            response = yield from self._unary("ReleaseMatrix",
                                              pb.ReleaseMatrixRequest(handle=matrix.handle),
                                              timeout, idempotent=False,
                                              replica=handle_replica(matrix.handle))
            freed = response.freed_bytes
        if isinstance(matrix, ResidentMatrix):
            matrix.released = True
        return freed

    def matrices(self, *, replica: Optional[str] = None,
                 timeout: Optional[float] = None) -> MatrixList:
        """This client's resident matrices (a list of ResidentMatrix, with .client_bytes and
        .quota_bytes). Over several replicas, those of `replica` (an address; None: of the one
        the balanced call reaches)."""
        response = yield from self._unary("ListMatrices", pb.ListMatricesRequest(), timeout,
                                          idempotent=True, replica=replica or "")
        out = MatrixList(ResidentMatrix(self.client, m) for m in response.matrices)
        out.client_bytes, out.quota_bytes = response.client_bytes, response.quota_bytes
        return out

    # The server.
    def info(self, *, replica: Optional[str] = None,
             timeout: Optional[float] = None) -> pb.ServerInfo:
        """GetServerInfo: version, backend, devices, limits, load, replica (a
        hgemm_pb2.ServerInfo), of `replica` if given, else of the replica the call reaches."""
        return (yield from self._unary("GetServerInfo", pb.GetServerInfoRequest(), timeout,
                                       idempotent=True, replica=replica or ""))

    def kernels(self, *, timeout: Optional[float] = None) -> List[Kernel]:
        """ListKernels: the kernel names for kernel=, with their accumulations."""
        return kernels_from_proto((yield from self._unary("ListKernels", pb.ListKernelsRequest(),
                                                          timeout, idempotent=True)))

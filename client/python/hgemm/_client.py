"""hgemm.Client: the synchronous client."""
import time
from typing import List, Optional

import grpc

from . import _arrays, _core, _errors, _progress, _wire
from ._proto import hgemm_pb2 as pb
from ._proto import hgemm_pb2_grpc as pb_grpc


class Client:
    """A client of one hgemm-serve server (hgemm.v1.GemmService). Thread-safe: one Client may be
    used from many threads at once (one gRPC channel, calls are independent).

        with hgemm.Client("127.0.0.1:50051") as c:
            C = c.gemm(A, B)

    Args:
      target: "host:port" (any gRPC target, e.g. "dns:///svc:50051").
      tls: True for TLS with the system's root certificates; implied by tls_ca / tls_cert.
      tls_ca: PEM file of the CA that signed the server's certificate.
      tls_cert, tls_key: PEM files of this client's certificate and key (mTLS).
      tls_server_name: the name to check the server's certificate against, if not the target's.
      token: sent as "authorization: Bearer <token>" on every call; token_file: read it from a
        file; neither: $HGEMM_TOKEN if set.
      client_id: sent as "x-client-id" (owner of resident matrices when authentication is off).
      traceparent: a W3C trace context ("00-<32 hex>-<16 hex>-<2 hex>") sent with every call;
        the server logs it with the call (and ignores a malformed one).
      timeout: default deadline in seconds for every call (None: none); each method's timeout=
        overrides it.
      mode: "auto" (unary for small GEMMs, GemmStream above unary_limit_bytes or the server's
        message limit), "unary" or "stream"; each gemm's mode= overrides it.
      unary_limit_bytes: in mode "auto", GEMMs whose operands or C pass this go on a stream.
      chunk_bytes: size of the chunks operands and uploads are sent in (1 MiB, as recommended).
      retries: tries in all for an UNAVAILABLE answer (see RetryPolicy); 1 turns retries off.
      progress: None (a tqdm bar for transfers over 256 MiB when tqdm is installed), True, False.
      channel_options: extra gRPC channel arguments. Message size limits are already lifted.
    """

    def __init__(self, target: str = "127.0.0.1:50051", **options):
        self._config = _core.ClientConfig(target, **options)
        cfg = self._config
        if cfg.credentials is None:
            self._channel = grpc.insecure_channel(target, options=cfg.channel_options)
        else:
            self._channel = grpc.secure_channel(target, cfg.credentials, options=cfg.channel_options)
        self._stub = _wire.Stub(self._channel, pb_grpc.GemmServiceStub(self._channel))

    # Lifetime.
    def close(self) -> None:
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # The retry loop around one call.
    def _call(self, fn, timeout, idempotent: bool):
        deadline = _core.Deadline(self._config.call_timeout(timeout))
        policy = self._config.policy
        for attempt in range(policy.attempts):
            try:
                return fn(deadline.remaining())
            except grpc.RpcError as e:
                err = _errors.from_rpc_error(e)
            delay = policy.delay(attempt)
            if (attempt + 1 == policy.attempts or not _core.should_retry(err, idempotent)
                    or not deadline.allows(delay)):
                raise err
            time.sleep(delay)

    def _server_limit(self, spec, mode, timeout) -> None:
        if self._config.needs_server_limit(spec, mode):
            try:
                self._config.max_message_bytes = self.info(timeout=timeout).limits.max_message_bytes
            except _errors.Error:
                self._config.max_message_bytes = 4 << 20  # assume the smallest a server takes

    # GEMMs.
    def gemm(self, a, b, *, accumulation: Optional[str] = None, kernel: str = "auto",
             keep_c: bool = False, c_ttl: int = 0, request_id: str = "", details: bool = False,
             as_torch=False, mode: Optional[str] = None, timeout: Optional[float] = None):
        """C = A·B. A (m×k) and B (k×n): float16 numpy arrays, torch tensors, or ResidentMatrix.

        Returns C as an m×n float16 ndarray (a torch tensor with as_torch=True, or on a device
        with as_torch="cuda:0"); with keep_c=True a ResidentMatrix instead; with details=True a
        GemmResult (c, timing, execution, request_id, client_ms).
        accumulation: None (the server's default, fp32), "fp32" or "fp16". kernel: "auto" or a
        name from kernels(). Raises an hgemm.Error subclass on failure.
        """
        started = time.monotonic()
        spec = _core.Spec(a, b, accumulation=accumulation, kernel=kernel, keep_c=keep_c,
                          c_ttl=c_ttl, request_id=request_id)
        self._server_limit(spec, mode, timeout)
        if self._config.streams(spec, mode):
            result = self._many([spec], timeout, details, as_torch, started)[0]
            if isinstance(result, _errors.Error):
                result.index = None
                raise result
            return result
        request = spec.unary_request()

        def call(t):
            return self._stub.Gemm(request, timeout=t, metadata=self._config.metadata)
        response = self._call(call, timeout, idempotent=not keep_c)
        return _core.unary_result(self, spec, response, details, as_torch, started)

    def gemm_many(self, pairs, *, accumulation: Optional[str] = None, kernel: str = "auto",
                  keep_c: bool = False, c_ttl: int = 0, details: bool = False, as_torch=False,
                  return_exceptions: bool = False, timeout: Optional[float] = None) -> list:
        """Many GEMMs on one GemmStream, pipelined (the server works on early GEMMs while later
        ones upload); results come back in the order of `pairs`.

        pairs: (A, B) or (A, B, {options}) items, options being any of accumulation, kernel,
        keep_c, c_ttl, request_id for that GEMM. A failing GEMM does not stop the others. With
        return_exceptions=False the first failing GEMM's Error is raised once all are done (its
        .index is its position, its .results the whole list); with True, failed GEMMs are
        hgemm.Error objects in the returned list. timeout is for the whole batch.
        """
        started = time.monotonic()
        defaults = dict(accumulation=accumulation, kernel=kernel, keep_c=keep_c, c_ttl=c_ttl,
                        request_id="")
        specs = _core.normalize_pairs(pairs, defaults)
        if not specs:
            return []
        results = self._many(specs, timeout, details, as_torch, started)
        return _core.finish_many(results, return_exceptions)

    def _many(self, specs: List[_core.Spec], timeout, details, as_torch, started) -> list:
        by_id = dict(enumerate(specs))
        deadline = _core.Deadline(self._config.call_timeout(timeout))
        total = sum(s.payload_bytes + s.c_bytes for s in specs)
        bar = _progress.bar(self._config.progress, total, "hgemm")
        try:
            rounds = _core.ManyRound(by_id, self._config.policy, deadline)
            while rounds.pending:
                collector = _core.StreamCollector({i: by_id[i] for i in rounds.pending}, bar)
                requests = _core.stream_requests(by_id, rounds.pending, self._config.chunk_bytes, bar)
                stream_err = None
                try:
                    call = self._stub.GemmStream(requests, timeout=deadline.remaining(),
                                                 metadata=self._config.metadata)
                    for message in call:
                        collector.consume(message)
                except grpc.RpcError as e:
                    stream_err = _errors.from_rpc_error(e)
                delay = rounds.settle(collector, stream_err)
                if delay:
                    time.sleep(delay)
        finally:
            _progress.close(bar)
        return [_core.streamed_result(self, by_id[i], rounds.outcome(i), details, as_torch, started)
                for i in range(len(specs))]

    # Resident matrices.
    def upload(self, matrix, *, ttl: int = 0, label: str = "", device_id: Optional[int] = None,
               timeout: Optional[float] = None) -> _core.ResidentMatrix:
        """Uploads a matrix (float16 ndarray or tensor) and returns its ResidentMatrix.
        ttl: seconds after its last use at which the server frees it (0: the server's default).
        device_id: the CUDA device to keep it on (None: the one with the most free memory)."""
        array = _arrays.as_fp16_matrix(matrix, "matrix")
        bar = _progress.bar(self._config.progress, array.nbytes, "hgemm upload")

        def call(t):
            messages = _core.upload_messages(array, ttl, label, device_id, self._config.chunk_bytes, bar)
            return self._stub.UploadMatrix(messages, timeout=t, metadata=self._config.metadata)
        try:
            info = self._call(call, timeout, idempotent=False)
        finally:
            _progress.close(bar)
        return _core.ResidentMatrix(self, info)

    def download(self, matrix: _core.ResidentMatrix, *, as_torch=False,
                 timeout: Optional[float] = None):
        """A resident matrix's values as a float16 ndarray (or torch tensor with as_torch)."""
        bar = _progress.bar(self._config.progress, 2 * matrix.rows * matrix.cols, "hgemm download")

        def call(t):
            buf = _core.DownloadBuffer(matrix.rows, matrix.cols, bar)
            for chunk in self._stub.DownloadMatrix(pb.DownloadMatrixRequest(handle=matrix.handle),
                                                   timeout=t, metadata=self._config.metadata):
                buf.add(chunk)
            return buf.array()
        try:
            return _arrays.to_output(self._call(call, timeout, idempotent=True), as_torch)
        finally:
            _progress.close(bar)

    def release(self, matrix: _core.ResidentMatrix, *, timeout: Optional[float] = None) -> int:
        """Frees a resident matrix; returns the bytes freed. NotFound if it is gone already."""
        if getattr(matrix, "released", False):
            return 0

        def call(t):
            return self._stub.ReleaseMatrix(pb.ReleaseMatrixRequest(handle=matrix.handle),
                                            timeout=t, metadata=self._config.metadata)
        freed = self._call(call, timeout, idempotent=False).freed_bytes
        if isinstance(matrix, _core.ResidentMatrix):
            matrix.released = True
        return freed

    def matrices(self, *, timeout: Optional[float] = None) -> _core.MatrixList:
        """This client's resident matrices (a list of ResidentMatrix, with .client_bytes and
        .quota_bytes)."""
        def call(t):
            return self._stub.ListMatrices(pb.ListMatricesRequest(), timeout=t,
                                           metadata=self._config.metadata)
        response = self._call(call, timeout, idempotent=True)
        out = _core.MatrixList(_core.ResidentMatrix(self, m) for m in response.matrices)
        out.client_bytes, out.quota_bytes = response.client_bytes, response.quota_bytes
        return out

    # The server.
    def info(self, *, timeout: Optional[float] = None) -> pb.ServerInfo:
        """GetServerInfo: version, backend, devices, limits, load (a hgemm_pb2.ServerInfo)."""
        def call(t):
            return self._stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=t,
                                            metadata=self._config.metadata)
        return self._call(call, timeout, idempotent=True)

    def kernels(self, *, timeout: Optional[float] = None) -> List[_core.Kernel]:
        """ListKernels: the kernel names for kernel=, with their accumulations."""
        def call(t):
            return self._stub.ListKernels(pb.ListKernelsRequest(), timeout=t,
                                          metadata=self._config.metadata)
        return _core.kernels_from_proto(self._call(call, timeout, idempotent=True))

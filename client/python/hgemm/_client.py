"""hgemm.Client: the synchronous client."""
import time
from typing import List, Optional

import grpc

from . import (_arrays, _config, _errors, _many_rounds, _progress, _resident, _results, _retry,
               _routes, _spec, _stream, _stream_collector, _transfers)
from ._proto import hgemm_pb2 as pb


class Client:
    """A client of an hgemm-serve server or of several replicas (hgemm.v1.GemmService).
    Thread-safe: one Client may be used from many threads at once (calls are independent).

        with hgemm.Client("127.0.0.1:50051") as c:
            C = c.gemm(A, B)

    Replicas: a call naming a ResidentMatrix goes to the replica that holds it (the address in
    its handle), over a channel of its own made with the same options; every other call is
    balanced over the target (round_robin). A GEMM of matrices on two replicas raises
    FailedPrecondition before anything is sent: upload the second with replica=the first. A
    call naming a matrix of a replica that cannot be reached raises Unavailable saying so (its
    matrices are gone if it is; upload them again).

    Args:
      target: "host:port" (any gRPC target, e.g. "dns:///svc:50051"; several replicas:
        "ipv4:10.0.0.1:50051,10.0.0.2:50051" or a DNS name that resolves to all of them).
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
        self._config = _config.ClientConfig(target, **options)
        self._routes = _routes.Routes(self._config, grpc)
        self._channel, self._stub = self._routes.target

    def _stub_for(self, replica: str):
        return self._stub if not replica else self._routes.stub(replica)

    # Lifetime.
    def close(self) -> None:
        for channel in self._routes.channels():
            channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # The retry loop around one call (to `replica`, "" for the target).
    def _call(self, fn, timeout, idempotent: bool, replica: str = ""):
        deadline = _retry.Deadline(self._config.call_timeout(timeout))
        policy = self._config.policy
        stub = self._stub_for(replica)
        for attempt in range(policy.attempts):
            try:
                return fn(stub, deadline.remaining())
            except grpc.RpcError as e:
                err = _errors.from_rpc_error(e)
            delay = policy.delay(attempt)
            if (attempt + 1 == policy.attempts or not _retry.should_retry(err, idempotent)
                    or not deadline.allows(delay)):
                raise _routes.explain_unreachable(err, replica)
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
        spec = _spec.Spec(a, b, accumulation=accumulation, kernel=kernel, keep_c=keep_c,
                          c_ttl=c_ttl, request_id=request_id)
        replica = spec.replica()
        self._server_limit(spec, mode, timeout)
        if self._config.streams(spec, mode):
            result = self._many([spec], timeout, details, as_torch, started)[0]
            if isinstance(result, _errors.Error):
                result.index = None
                raise result
            return result
        request = spec.unary_request()

        def call(stub, t):
            return stub.Gemm(request, timeout=t, metadata=self._config.metadata)
        response = self._call(call, timeout, idempotent=not keep_c, replica=replica)
        return _results.unary_result(self, spec, response, details, as_torch, started)

    def gemm_many(self, pairs, *, accumulation: Optional[str] = None, kernel: str = "auto",
                  keep_c: bool = False, c_ttl: int = 0, details: bool = False, as_torch=False,
                  return_exceptions: bool = False, timeout: Optional[float] = None) -> list:
        """Many GEMMs on one GemmStream, pipelined (the server works on early GEMMs while later
        ones upload); results come back in the order of `pairs`.

        pairs: (A, B) or (A, B, {options}) items, options being any of accumulation, kernel,
        keep_c, c_ttl, request_id for that GEMM. A failing GEMM does not stop the others. Over
        several replicas, one stream per replica the GEMMs' matrices live on. With
        return_exceptions=False the first failing GEMM's Error is raised once all are done (its
        .index is its position, its .results the whole list); with True, failed GEMMs are
        hgemm.Error objects in the returned list. timeout is for the whole batch.
        """
        started = time.monotonic()
        defaults = dict(accumulation=accumulation, kernel=kernel, keep_c=keep_c, c_ttl=c_ttl,
                        request_id="")
        specs = _spec.normalize_pairs(pairs, defaults)
        if not specs:
            return []
        results = self._many(specs, timeout, details, as_torch, started)
        return _results.finish_many(results, return_exceptions)

    def stream(self, *, replica=None) -> _stream.Stream:
        """An hgemm.Stream: one GemmStream kept open for many GEMMs, pipelined
        (`with c.stream() as s: C = s.gemm(A, B)`; s.submit(A, B) returns a Future). For many
        GEMMs over time from a loop or several threads, without a stream's setup per GEMM.
        replica: over several replicas, where the stream goes (a ResidentMatrix or an address);
        default: where its first GEMM's matrices live, else the target."""
        return _stream.Stream(self, None if replica is None else _resident.replica_of(replica))

    def _many(self, specs: List[_spec.Spec], timeout, details, as_torch, started) -> list:
        groups, outcomes = _routes.by_replica(dict(enumerate(specs)))
        deadline = _retry.Deadline(self._config.call_timeout(timeout))
        total = sum(s.payload_bytes + s.c_bytes for s in specs)
        bar = _progress.bar(self._config.progress, total, "hgemm")
        try:
            for replica, by_id in groups.items():
                rounds = self._stream_rounds(replica, by_id, deadline, bar)
                outcomes.update((i, rounds.outcome(i)) for i in by_id)
        finally:
            _progress.close(bar)
        return [_results.streamed_result(self, specs[i], outcomes[i], details, as_torch, started)
                for i in range(len(specs))]

    def _stream_rounds(self, replica: str, by_id, deadline, bar) -> _many_rounds.ManyRound:
        stub = self._stub_for(replica)
        rounds = _many_rounds.ManyRound(by_id, self._config.policy, deadline)
        while rounds.pending:
            collector = _stream_collector.StreamCollector({i: by_id[i] for i in rounds.pending}, bar)
            requests = _spec.stream_requests(by_id, rounds.pending, self._config.chunk_bytes, bar)
            stream_err = None
            try:
                call = stub.GemmStream(requests, timeout=deadline.remaining(),
                                       metadata=self._config.metadata)
                for message in call:
                    collector.consume(message)
            except grpc.RpcError as e:
                stream_err = _routes.explain_unreachable(_errors.from_rpc_error(e), replica)
            delay = rounds.settle(collector, stream_err)
            if delay:
                time.sleep(delay)
        return rounds

    # Resident matrices.
    def upload(self, matrix, *, ttl: int = 0, label: str = "", device_id: Optional[int] = None,
               replica=None, timeout: Optional[float] = None) -> _resident.ResidentMatrix:
        """Uploads a matrix (float16 ndarray or tensor) and returns its ResidentMatrix.
        ttl: seconds after its last use at which the server frees it (0: the server's default).
        device_id: the CUDA device to keep it on (None: the one with the most free memory).
        replica: where to put it over several replicas: a ResidentMatrix (onto the replica that
        holds it, so that both can go in one GEMM) or a replica's address; None: balanced."""
        array = _arrays.as_fp16_matrix(matrix, "matrix")
        bar = _progress.bar(self._config.progress, array.nbytes, "hgemm upload")

        def call(stub, t):
            messages = _transfers.upload_messages(array, ttl, label, device_id, self._config.chunk_bytes, bar)
            return stub.UploadMatrix(messages, timeout=t, metadata=self._config.metadata)
        try:
            info = self._call(call, timeout, idempotent=False, replica=_resident.replica_of(replica))
        finally:
            _progress.close(bar)
        return _resident.ResidentMatrix(self, info)

    def download(self, matrix: _resident.ResidentMatrix, *, as_torch=False,
                 timeout: Optional[float] = None):
        """A resident matrix's values as a float16 ndarray (or torch tensor with as_torch)."""
        bar = _progress.bar(self._config.progress, 2 * matrix.rows * matrix.cols, "hgemm download")

        def call(stub, t):
            buf = _transfers.DownloadBuffer(matrix.rows, matrix.cols, bar)
            for chunk in stub.DownloadMatrix(pb.DownloadMatrixRequest(handle=matrix.handle),
                                             timeout=t, metadata=self._config.metadata):
                buf.add(chunk)
            return buf.array()
        try:
            array = self._call(call, timeout, idempotent=True,
                               replica=_resident.handle_replica(matrix.handle))
            return _arrays.to_output(array, as_torch)
        finally:
            _progress.close(bar)

    def release(self, matrix: _resident.ResidentMatrix, *, timeout: Optional[float] = None) -> int:
        """Frees a resident matrix; returns the bytes freed. NotFound if it is gone already."""
        if getattr(matrix, "released", False):
            return 0

        def call(stub, t):
            return stub.ReleaseMatrix(pb.ReleaseMatrixRequest(handle=matrix.handle),
                                      timeout=t, metadata=self._config.metadata)
        freed = self._call(call, timeout, idempotent=False,
                           replica=_resident.handle_replica(matrix.handle)).freed_bytes
        if isinstance(matrix, _resident.ResidentMatrix):
            matrix.released = True
        return freed

    def matrices(self, *, replica: Optional[str] = None,
                 timeout: Optional[float] = None) -> _resident.MatrixList:
        """This client's resident matrices (a list of ResidentMatrix, with .client_bytes and
        .quota_bytes). Over several replicas, those of `replica` (an address; None: of the one
        the balanced call reaches)."""
        def call(stub, t):
            return stub.ListMatrices(pb.ListMatricesRequest(), timeout=t,
                                     metadata=self._config.metadata)
        response = self._call(call, timeout, idempotent=True, replica=replica or "")
        out = _resident.MatrixList(_resident.ResidentMatrix(self, m) for m in response.matrices)
        out.client_bytes, out.quota_bytes = response.client_bytes, response.quota_bytes
        return out

    # The server.
    def info(self, *, replica: Optional[str] = None,
             timeout: Optional[float] = None) -> pb.ServerInfo:
        """GetServerInfo: version, backend, devices, limits, load, replica (a
        hgemm_pb2.ServerInfo), of `replica` if given, else of the replica the call reaches."""
        def call(stub, t):
            return stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=t,
                                      metadata=self._config.metadata)
        return self._call(call, timeout, idempotent=True, replica=replica or "")

    def kernels(self, *, timeout: Optional[float] = None) -> List[_results.Kernel]:
        """ListKernels: the kernel names for kernel=, with their accumulations."""
        def call(stub, t):
            return stub.ListKernels(pb.ListKernelsRequest(), timeout=t,
                                    metadata=self._config.metadata)
        return _results.kernels_from_proto(self._call(call, timeout, idempotent=True))

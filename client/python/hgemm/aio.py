"""hgemm.aio.Client: the asyncio client (grpc.aio), with the methods of hgemm.Client as
coroutines. ResidentMatrix.release() / .download() are coroutines here, and `async with
await c.upload(B) as hb:` releases at the end of the block.

    async with hgemm.aio.Client("127.0.0.1:50051") as c:
        C = await c.gemm(A, B)
        Cs = await asyncio.gather(*(c.gemm(A, B) for _ in range(16)))
        async with c.stream() as s:          # one GemmStream for many GEMMs
            C = await s.gemm(A, B)
"""
import asyncio
import time
from typing import List, Optional

import grpc
import grpc.aio

from . import (_arrays, _config, _errors, _many_rounds, _progress, _resident, _results, _retry,
               _routes, _session_book, _spec, _stream_collector, _transfers)
from ._client import Client as _SyncClient
from ._proto import hgemm_pb2 as pb


class Client:
    __doc__ = (__doc__ or "") + "\n\nArguments as hgemm.Client:\n" + (_SyncClient.__doc__ or "")

    def __init__(self, target: str = "127.0.0.1:50051", **options):
        self._config = _config.ClientConfig(target, **options)
        self._routes = _routes.Routes(self._config, grpc.aio)
        self._channel, self._stub = self._routes.target

    def _stub_for(self, replica: str):
        return self._stub if not replica else self._routes.stub(replica)

    async def close(self) -> None:
        for channel in self._routes.channels():
            await channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def _call(self, fn, timeout, idempotent: bool, replica: str = ""):
        deadline = _retry.Deadline(self._config.call_timeout(timeout))
        policy = self._config.policy
        stub = self._stub_for(replica)
        for attempt in range(policy.attempts):
            try:
                return await fn(stub, deadline.remaining())
            except grpc.RpcError as e:
                err = _errors.from_rpc_error(e)
            delay = policy.delay(attempt)
            if (attempt + 1 == policy.attempts or not _retry.should_retry(err, idempotent)
                    or not deadline.allows(delay)):
                raise _routes.explain_unreachable(err, replica)
            await asyncio.sleep(delay)

    async def _server_limit(self, spec, mode, timeout) -> None:
        if self._config.needs_server_limit(spec, mode):
            try:
                info = await self.info(timeout=timeout)
                self._config.max_message_bytes = info.limits.max_message_bytes
            except _errors.Error:
                self._config.max_message_bytes = 4 << 20

    async def gemm(self, a, b, *, accumulation: Optional[str] = None, kernel: str = "auto",
                   keep_c: bool = False, c_ttl: int = 0, request_id: str = "",
                   details: bool = False, as_torch=False, mode: Optional[str] = None,
                   timeout: Optional[float] = None):
        """As hgemm.Client.gemm."""
        started = time.monotonic()
        spec = _spec.Spec(a, b, accumulation=accumulation, kernel=kernel, keep_c=keep_c,
                          c_ttl=c_ttl, request_id=request_id)
        replica = spec.replica()
        await self._server_limit(spec, mode, timeout)
        if self._config.streams(spec, mode):
            result = (await self._many([spec], timeout, details, as_torch, started))[0]
            if isinstance(result, _errors.Error):
                result.index = None
                raise result
            return result
        request = spec.unary_request()

        def call(stub, t):
            return stub.Gemm(request, timeout=t, metadata=self._config.metadata)
        response = await self._call(call, timeout, idempotent=not keep_c, replica=replica)
        return _results.unary_result(self, spec, response, details, as_torch, started)

    async def gemm_many(self, pairs, *, accumulation: Optional[str] = None, kernel: str = "auto",
                        keep_c: bool = False, c_ttl: int = 0, details: bool = False,
                        as_torch=False, return_exceptions: bool = False,
                        timeout: Optional[float] = None) -> list:
        """As hgemm.Client.gemm_many."""
        started = time.monotonic()
        defaults = dict(accumulation=accumulation, kernel=kernel, keep_c=keep_c, c_ttl=c_ttl,
                        request_id="")
        specs = _spec.normalize_pairs(pairs, defaults)
        if not specs:
            return []
        results = await self._many(specs, timeout, details, as_torch, started)
        return _results.finish_many(results, return_exceptions)

    def stream(self, *, replica=None) -> "Stream":
        """As hgemm.Client.stream: an hgemm.aio.Stream (`async with c.stream() as s:
        C = await s.gemm(A, B)`)."""
        return Stream(self, None if replica is None else _resident.replica_of(replica))

    async def _many(self, specs: List[_spec.Spec], timeout, details, as_torch, started) -> list:
        groups, outcomes = _routes.by_replica(dict(enumerate(specs)))
        deadline = _retry.Deadline(self._config.call_timeout(timeout))
        total = sum(s.payload_bytes + s.c_bytes for s in specs)
        bar = _progress.bar(self._config.progress, total, "hgemm")
        try:  # the replicas' streams at once
            done = await asyncio.gather(*(self._stream_rounds(replica, by_id, deadline, bar)
                                          for replica, by_id in groups.items()))
            for by_id, rounds in zip(groups.values(), done):
                outcomes.update((i, rounds.outcome(i)) for i in by_id)
        finally:
            _progress.close(bar)
        return [_results.streamed_result(self, specs[i], outcomes[i], details, as_torch, started)
                for i in range(len(specs))]

    async def _stream_rounds(self, replica: str, by_id, deadline, bar) -> _many_rounds.ManyRound:
        stub = self._stub_for(replica)
        rounds = _many_rounds.ManyRound(by_id, self._config.policy, deadline)
        while rounds.pending:
            collector = _stream_collector.StreamCollector({i: by_id[i] for i in rounds.pending}, bar)
            requests = _spec.stream_requests(by_id, rounds.pending, self._config.chunk_bytes, bar)
            stream_err = None
            try:
                call = stub.GemmStream(_aiter(requests), timeout=deadline.remaining(),
                                       metadata=self._config.metadata)
                async for message in call:
                    collector.consume(message)
            except grpc.RpcError as e:
                stream_err = _routes.explain_unreachable(_errors.from_rpc_error(e), replica)
            delay = rounds.settle(collector, stream_err)
            if delay:
                await asyncio.sleep(delay)
        return rounds

    async def upload(self, matrix, *, ttl: int = 0, label: str = "",
                     device_id: Optional[int] = None, replica=None,
                     timeout: Optional[float] = None) -> _resident.ResidentMatrix:
        """As hgemm.Client.upload."""
        array = _arrays.as_fp16_matrix(matrix, "matrix")
        bar = _progress.bar(self._config.progress, array.nbytes, "hgemm upload")

        def call(stub, t):
            messages = _transfers.upload_messages(array, ttl, label, device_id, self._config.chunk_bytes, bar)
            return stub.UploadMatrix(_aiter(messages), timeout=t, metadata=self._config.metadata)
        try:
            info = await self._call(call, timeout, idempotent=False,
                                    replica=_resident.replica_of(replica))
        finally:
            _progress.close(bar)
        return _resident.ResidentMatrix(self, info)

    async def download(self, matrix: _resident.ResidentMatrix, *, as_torch=False,
                       timeout: Optional[float] = None):
        """As hgemm.Client.download."""
        bar = _progress.bar(self._config.progress, 2 * matrix.rows * matrix.cols, "hgemm download")

        async def call(stub, t):
            buf = _transfers.DownloadBuffer(matrix.rows, matrix.cols, bar)
            stream = stub.DownloadMatrix(pb.DownloadMatrixRequest(handle=matrix.handle),
                                         timeout=t, metadata=self._config.metadata)
            async for chunk in stream:
                buf.add(chunk)
            return buf.array()
        try:
            array = await self._call(call, timeout, idempotent=True,
                                     replica=_resident.handle_replica(matrix.handle))
            return _arrays.to_output(array, as_torch)
        finally:
            _progress.close(bar)

    async def release(self, matrix: _resident.ResidentMatrix, *,
                      timeout: Optional[float] = None) -> int:
        """As hgemm.Client.release."""
        if getattr(matrix, "released", False):
            return 0

        def call(stub, t):
            return stub.ReleaseMatrix(pb.ReleaseMatrixRequest(handle=matrix.handle),
                                      timeout=t, metadata=self._config.metadata)
        freed = (await self._call(call, timeout, idempotent=False,
                                  replica=_resident.handle_replica(matrix.handle))).freed_bytes
        if isinstance(matrix, _resident.ResidentMatrix):
            matrix.released = True
        return freed

    async def matrices(self, *, replica: Optional[str] = None,
                       timeout: Optional[float] = None) -> _resident.MatrixList:
        """As hgemm.Client.matrices."""
        def call(stub, t):
            return stub.ListMatrices(pb.ListMatricesRequest(), timeout=t,
                                     metadata=self._config.metadata)
        response = await self._call(call, timeout, idempotent=True, replica=replica or "")
        out = _resident.MatrixList(_resident.ResidentMatrix(self, m) for m in response.matrices)
        out.client_bytes, out.quota_bytes = response.client_bytes, response.quota_bytes
        return out

    async def info(self, *, replica: Optional[str] = None,
                   timeout: Optional[float] = None) -> pb.ServerInfo:
        """As hgemm.Client.info."""
        def call(stub, t):
            return stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=t,
                                      metadata=self._config.metadata)
        return await self._call(call, timeout, idempotent=True, replica=replica or "")

    async def kernels(self, *, timeout: Optional[float] = None) -> List[_results.Kernel]:
        """As hgemm.Client.kernels."""
        def call(stub, t):
            return stub.ListKernels(pb.ListKernelsRequest(), timeout=t,
                                    metadata=self._config.metadata)
        return _results.kernels_from_proto(await self._call(call, timeout, idempotent=True))


class Stream:
    """hgemm.Stream for asyncio: one GemmStream kept open for many GEMMs, pipelined. submit()
    returns an asyncio.Future; gemm() and close() are coroutines; `async with` closes (or
    cancels, if the block raises). Behaviour, errors, retries and replicas as hgemm.Stream. A
    writer and a reader task per open stream, on the loop the stream was first used on."""

    def __init__(self, client: Client, replica: Optional[str]):
        self._client = client
        self._config = client._config
        self._replica = replica
        self._book = _session_book.SessionBook(self._config.policy)
        self._queue = None  # the open stream's asyncio.Queue of message generators
        self._call = None
        self._tasks = set()
        self._outstanding = 0
        self._idle = None  # an asyncio.Event, set when nothing is outstanding
        self._closing = False
        self._cancelled = False

    def submit(self, a, b, *, accumulation: Optional[str] = None, kernel: str = "auto",
               keep_c: bool = False, c_ttl: int = 0, request_id: str = "",
               details: bool = False, as_torch=False) -> "asyncio.Future":
        """As hgemm.Stream.submit; returns an asyncio.Future. Call it from the loop's thread."""
        started = time.monotonic()
        if self._closing:
            raise RuntimeError("the stream is closed")
        spec = _spec.Spec(a, b, accumulation=accumulation, kernel=kernel, keep_c=keep_c,
                          c_ttl=c_ttl, request_id=request_id)
        loop = asyncio.get_running_loop()
        pending = _session_book.Pending(spec, loop.create_future(), details, as_torch, started)
        self._replica = _routes.session_replica(self._replica, spec)
        self._write(pending)
        self._outstanding += 1
        if self._idle is None:
            self._idle = asyncio.Event()
        self._idle.clear()
        return pending.future

    async def gemm(self, a, b, *, timeout: Optional[float] = None, **options):
        """As hgemm.Stream.gemm."""
        future = self.submit(a, b, **options)
        timeout = self._config.call_timeout(timeout)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except asyncio.TimeoutError:
            raise _errors.DeadlineExceeded(
                f"no answer within {timeout:g} s (the GEMM stays on the stream; its result will "
                f"be dropped)") from None

    async def close(self, timeout: Optional[float] = None) -> None:
        """As hgemm.Stream.close."""
        self._closing = True
        if self._outstanding:
            try:
                await asyncio.wait_for(self._idle.wait(), timeout)
            except asyncio.TimeoutError:
                raise _errors.DeadlineExceeded(
                    f"{self._outstanding} GEMMs still unanswered after {timeout:g} s") from None
        self._end_stream()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def cancel(self) -> None:
        """As hgemm.Stream.cancel."""
        self._closing = self._cancelled = True
        if self._call is not None:
            self._call.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self):
        return self

    async def __aexit__(self, exc_type, *exc):
        if exc_type is None:
            await self.close()
        else:
            await self.cancel()

    def _write(self, pending: _session_book.Pending) -> None:
        if self._queue is None:
            self._open()
        i = self._book.add(pending)
        self._queue.put_nowait(pending.spec.stream_messages(i, self._config.chunk_bytes))

    def _open(self) -> None:
        q = asyncio.Queue()
        stub = self._client._stub_for(self._replica or "")
        call = stub.GemmStream(metadata=self._config.metadata)
        self._queue, self._call = q, call
        for coroutine in (self._send(call, q), self._read(call, q)):
            task = asyncio.ensure_future(coroutine)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _end_stream(self) -> None:
        if self._queue is not None:
            self._queue.put_nowait(None)
            self._queue = self._call = None

    @staticmethod
    async def _send(call, q) -> None:
        """The writer task: each GEMM's messages in turn, then the client's half-close."""
        try:
            while True:
                messages = await q.get()
                if messages is None:
                    await call.done_writing()
                    return
                for message in messages:
                    await call.write(message)
        except (grpc.RpcError, asyncio.InvalidStateError):
            return  # the call is over; the reader reports why

    async def _read(self, call, q) -> None:
        """The reader task: answers until the stream ends, then what becomes of the rest."""
        err = None
        try:
            while True:
                message = await call.read()
                if message is grpc.aio.EOF:
                    break
                finished, retry = self._book.consume(message)
                self._settle(finished, retry)
                if self._book.protocol_error is not None:
                    call.cancel()
                    break
        except grpc.RpcError as e:
            err = _routes.explain_unreachable(_errors.from_rpc_error(e), self._replica or "")
        except asyncio.CancelledError:
            err = _errors.Cancelled("the stream was cancelled")
        if self._queue is q:
            self._end_stream()
        else:
            q.put_nowait(None)
        if self._cancelled:
            err = _errors.Cancelled("the stream was cancelled")
        self._settle(*self._book.ended(err))

    def _settle(self, finished, retry) -> None:
        for pending, outcome in finished:
            self._deliver(pending, outcome)
        loop = asyncio.get_running_loop()
        for pending, delay in retry:
            loop.call_later(delay, self._again, pending)

    def _again(self, pending: _session_book.Pending) -> None:
        if self._cancelled:
            self._deliver(pending, _errors.Cancelled("the stream was cancelled"))
        else:
            self._write(pending)

    def _deliver(self, pending: _session_book.Pending, outcome) -> None:
        try:
            result = _results.streamed_result(self._client, pending.spec, outcome, pending.details,
                                           pending.as_torch, pending.started)
        except Exception as e:  # e.g. as_torch without torch: the caller's, not the reader's
            result = e
        if not pending.future.done():
            if isinstance(result, Exception):
                pending.future.set_exception(result)
            else:
                pending.future.set_result(result)
        self._outstanding -= 1
        if self._outstanding == 0:
            self._idle.set()


async def _aiter(iterable):
    """A sync generator as an async one, yielding to the event loop between messages."""
    for item in iterable:
        yield item

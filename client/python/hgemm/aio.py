"""hgemm.aio.Client: the asyncio client, with the methods of hgemm.Client as coroutines: on the
native core each call awaited through a completion callback (no thread of Python's per call,
grpc not imported), else through grpc.aio. ResidentMatrix.release() / .download() are
coroutines here, and `async with await c.upload(B) as hb:` releases at the end of the block.

    async with hgemm.aio.Client("127.0.0.1:50051") as c:
        C = await c.gemm(A, B)
        Cs = await asyncio.gather(*(c.gemm(A, B) for _ in range(16)))
        async with c.stream() as s:          # one GemmStream for many GEMMs
            C = await s.gemm(A, B)

Thread safety: a Client and its streams belong to the event loop's thread.
"""
import asyncio
import contextlib
import functools
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Optional, TypeVar, Union

from . import _calls, _errors, _resident
from ._client import Client as _SyncClient
from ._stream_session import StreamSession
from ._types import Operand, Output

if TYPE_CHECKING:  # typing has them from Python 3.10; type checkers bring typing_extensions
    from typing_extensions import Concatenate, ParamSpec
    _P = ParamSpec("_P")
_R = TypeVar("_R")


# The client: Calls' methods with their steps done by awaits. The stream: StreamSession's I/O as
# tasks of the loop.
async def _run(steps):
    """Does the steps of a Calls generator one by one; returns what the generator returns."""
    value, error = None, None
    while True:
        try:
            step = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as finished:
            return finished.value
        try:
            value, error = await _do(step), None
        except BaseException as e:  # thrown into the generator, whose finally blocks run
            value, error = None, e


async def _do(step):
    if isinstance(step, _calls.Sleep):
        await asyncio.sleep(step.seconds)
        return None
    if isinstance(step, _calls.AllOf):
        return await asyncio.gather(*(_run(s) for s in step.steps))
    if isinstance(step, _calls.Native):
        return await _native(step)
    request = _aiter(step.request) if step.streams_request else step.request
    loop = asyncio.get_running_loop()
    started = loop.time()
    call = step.method(request, timeout=step.timeout, metadata=step.metadata)
    try:
        if step.on_response is None:
            return await call
        async for response in call:
            step.on_response(response)
    except _errors.rpc_errors() as e:
        reported = _errors.past_deadline(e, step.timeout, loop.time() - started)
        if reported is e:
            raise
        raise reported from e


def _settle(future: asyncio.Future, result, error) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


async def _native(step):
    """A native call started with its completion callback (no thread of ours per call)."""
    return await _started(lambda on_done: step.start(*step.args, on_done))


async def _started(start):
    """What start(on_done) comes to: start makes a native call (a NativeCall back) whose
    on_done(result, error) runs on a thread of the core and hands the outcome to this loop.
    Cancelling the task cancels the call; what the call reads and writes stays alive until it
    is over (_native.py)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def on_done(result, error):  # on a core thread
        try:
            loop.call_soon_threadsafe(_settle, future, result, error)
        except RuntimeError:  # the loop is closed: nobody waits for the result any more
            pass
    call = start(on_done)
    try:
        return await future
    except asyncio.CancelledError:
        call.cancel()
        raise
    finally:
        call.close()


def _awaitable(steps: "Callable[Concatenate[_calls.Calls, _P], _R]"
               ) -> "Callable[Concatenate[Client, _P], Coroutine[Any, Any, _R]]":
    """Calls.<method> as the coroutine of hgemm.aio.Client that runs it (its signature, and its
    result awaited, for a type checker too)."""
    @functools.wraps(steps)
    async def method(self, *args, **kwargs):
        return await _run(steps(self._calls, *args, **kwargs))
    return method


class Client:
    __doc__ = (__doc__ or "") + "\n\nArguments as hgemm.Client:\n" + (_SyncClient.__doc__ or "")

    def __init__(self, target: str = "127.0.0.1:50051", **options: Any) -> None:
        self._calls = _calls.Calls(self, False, target, **options)
        self._config = self._calls.config

    # The target's grpcio stub, its channel made at first use (tests wrap its methods).
    _stub = property(lambda self: self._calls.routes.stub(""))

    async def close(self) -> None:
        await _run(self._calls.release_regions())
        for channel in self._calls.routes.channels():
            await channel.close()
        if self._calls.native is not None:
            # hgemm_client_destroy waits for the calls still in flight (those of tasks cancelled
            # meanwhile: a running call is not interrupted) and joins the core's threads: a
            # blocking wait, once per client, kept off the loop on its default executor.
            await asyncio.get_running_loop().run_in_executor(None, self._calls.native.close)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def stream(self, *, replica: Union[None, str, _resident.ResidentMatrix] = None
               ) -> "Stream":
        """As hgemm.Client.stream: an hgemm.aio.Stream (`async with c.stream() as s:
        C = await s.gemm(A, B)`)."""
        return Stream(self, None if replica is None else _resident.replica_of(replica))

    gemm = _awaitable(_calls.Calls.gemm)
    prepare = _awaitable(_calls.Calls.prepare)
    gemm_many = _awaitable(_calls.Calls.gemm_many)
    gemm_batched = _awaitable(_calls.Calls.gemm_batched)
    gemm_grouped = _awaitable(_calls.Calls.gemm_grouped)
    upload = _awaitable(_calls.Calls.upload)
    download = _awaitable(_calls.Calls.download)
    release = _awaitable(_calls.Calls.release)
    matrices = _awaitable(_calls.Calls.matrices)
    info = _awaitable(_calls.Calls.info)
    kernels = _awaitable(_calls.Calls.kernels)
    shared_buffer = _awaitable(_calls.Calls.shared_buffer)
    cuda_gemm = _awaitable(_calls.Calls.cuda_gemm)
    regions = _awaitable(_calls.Calls.regions)


class Stream(StreamSession):
    """hgemm.Stream for asyncio: one GemmStream kept open for many GEMMs, pipelined. submit()
    returns an asyncio.Future; gemm() and close() are coroutines; `async with` closes (or
    cancels, if the block raises). Behaviour, errors, retries and replicas as hgemm.Stream. A
    writer and a reader task per open stream, on the loop the stream was first used on (on the
    native core, a reader task awaiting each answer through hgemm_stream_next_start's
    callback, started only while GEMMs are unanswered or the stream is ending)."""

    def __init__(self, client: Client, replica: Optional[str]):
        super().__init__(client, replica)
        self._lock = contextlib.nullcontext()  # the loop runs one callback at a time
        self._tasks = set()
        self._idle = None  # an asyncio.Event, set when nothing is outstanding
        self._reader_wake = None  # an asyncio.Event: a native stream has something to read

    async def gemm(self, a: Operand, b: Operand, *, timeout: Optional[float] = None,
                   **options: Any) -> Output:
        """As hgemm.Stream.gemm."""
        future = self.submit(a, b, **options)
        timeout = self._config.call_timeout(timeout)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except asyncio.TimeoutError:
            raise self._no_answer(timeout) from None

    async def close(self, timeout: Optional[float] = None) -> None:
        """As hgemm.Stream.close."""
        self._closing = True
        if self._outstanding:
            try:
                await asyncio.wait_for(self._idle.wait(), timeout)
            except asyncio.TimeoutError:
                raise self._unanswered(timeout) from None
        self._end_stream()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def cancel(self) -> None:
        """As hgemm.Stream.cancel."""
        self._cancel_call()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> "Stream":
        return self

    async def __aexit__(self, exc_type: Optional[type], *exc: object) -> None:
        if exc_type is None:
            await self.close()
        else:
            await self.cancel()

    # StreamSession's I/O.
    def _new_future(self) -> "asyncio.Future":
        future = asyncio.get_running_loop().create_future()
        if self._idle is None:  # made on the loop (an Event of Python 3.9 binds to one)
            self._idle = asyncio.Event()
        self._idle.clear()  # the GEMM this future is for is outstanding
        return future

    def _open(self) -> None:
        call = self._open_native()
        if call is not None:
            self._reader_wake = asyncio.Event()
            self._start(self._read_native(call, self._reader_wake))
            return
        q = asyncio.Queue()
        call = self._stub().GemmStream(metadata=self._config.metadata)
        self._queue, self._call = q, call
        for coroutine in (self._send(call, q), self._read(call, q)):
            self._start(coroutine)

    def _start(self, coroutine) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read_native(self, call, wake: asyncio.Event) -> None:
        """The reader of a native stream: each answer awaited through a completion callback
        (hgemm_stream_next_start), started only when there is one to wait for (a waiting next
        holds one of the core's completion threads), then the stream's end."""
        try:
            while True:
                while not call.wants_read():
                    wake.clear()
                    await wake.wait()
                answer = await _started(call.next_start)
                if answer is None:
                    break
                self._native_answer(answer)
        except asyncio.CancelledError:
            # The loop is going: cancelling the next cancels the stream, whose handle is not
            # freed (the next's callback may still be to come).
            call.cancel()
            self._settle(*self._ended(call, _errors.Cancelled("the stream was cancelled")))
            return
        self._settle(*self._ended(call, self._native_end(call)))
        call.close()

    def _put(self, i: int, spec) -> None:
        super()._put(i, spec)
        self._wake_reader()

    def _end_stream(self) -> None:
        super()._end_stream()
        self._wake_reader()

    def _cancel_call(self) -> None:
        super()._cancel_call()
        self._wake_reader()

    def _wake_reader(self) -> None:
        if self._reader_wake is not None:
            self._reader_wake.set()

    def _later(self, delay_s: float, fn, *args) -> None:
        asyncio.get_running_loop().call_later(delay_s, fn, *args)

    def _now_idle(self) -> None:
        self._idle.set()

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
        except _errors.rpc_errors() + (asyncio.InvalidStateError,):
            return  # the call is over; the reader reports why

    async def _read(self, call, q) -> None:
        """The reader task: answers until the stream ends, then what becomes of the rest."""
        import grpc.aio  # loaded by this stream's channel
        err = None
        try:
            while True:
                message = await call.read()
                if message is grpc.aio.EOF or not self._answered(call, message):
                    break
        except _errors.rpc_errors() as e:
            err = self._unreachable(e)
        except asyncio.CancelledError:
            err = _errors.Cancelled("the stream was cancelled")
        self._settle(*self._ended(q, err))


async def _aiter(iterable):
    """A sync generator as an async one, yielding to the event loop between messages."""
    for item in iterable:
        yield item

"""StreamSession: what hgemm.Stream and hgemm.aio.Stream share, one GemmStream kept open for
many GEMMs: submitting, the end of a stream, retries, delivering results.

A subclass brings the I/O:
  _lock: held around the shared state (a threading.Lock; on asyncio, whose callbacks run one at
    a time, a null context).
  _new_future(): the future that submit() returns.
  _open(): opens a GemmStream to self._replica, setting self._call and self._queue (the queue of
    its requests: each GEMM's message generator, then None for the client's half-close).
  On the native core, _open() sets both to _open_native()'s NativeStream instead (GEMMs are
  submitted to it, None half-closes it) and its reader takes (gemm_id, outcome) answers from
  NativeStream.next() to _native_answer(), then the end to _ended().
  _later(delay_s, fn, *args): calls fn(*args) after delay_s seconds.
  _now_idle(): with _lock held, when the last outstanding result has been delivered.
Its reader hands each answer to _answered() and, once the stream is over, _ended()'s outcome
to _settle().

Thread safety: that of the subclass's _lock (hgemm.Stream: thread-safe; hgemm.aio.Stream: the
event loop's thread only).
"""
import asyncio
import concurrent.futures
import time
from typing import Optional, Union


from . import _errors
from ._native import NativeStream
from ._results import streamed_result
from ._routes import explain_unreachable, session_replica
from ._session_book import Pending, SessionBook
from ._spec import Spec
from ._types import AsTorch, Operand


class StreamSession:
    """The shared part of hgemm.Stream and hgemm.aio.Stream (see the module's docstring)."""

    def __init__(self, client, replica: Optional[str]):
        self._client = client
        self._config = client._config
        self._replica = replica  # None: chosen by the first GEMM
        self._book = SessionBook(self._config.policy)
        self._queue = None  # the open stream's request queue; None: no stream open
        self._call = None
        self._outstanding = 0  # submitted, result not yet delivered
        self._closing = False
        self._cancelled = False

    def submit(self, a: Operand, b: Operand, *, accumulation: Optional[str] = None,
               kernel: str = "auto", keep_c: bool = False, c_ttl: int = 0,
               request_id: str = "", details: bool = False,
               as_torch: AsTorch = False) -> Union[concurrent.futures.Future, asyncio.Future]:
        """Writes one GEMM on the stream; returns a Future of what Client.gemm would return
        (its exception: the GEMM's hgemm.Error). Arguments as Client.gemm. hgemm.Stream: a
        concurrent.futures.Future; hgemm.aio.Stream: an asyncio.Future, submitted from the
        loop's thread."""
        started = time.monotonic()
        spec = Spec(a, b, accumulation=accumulation, kernel=kernel, keep_c=keep_c, c_ttl=c_ttl,
                    request_id=request_id)
        pending = Pending(spec, self._new_future(), details, as_torch, started)
        with self._lock:
            if self._closing:
                raise RuntimeError("the stream is closed")
            self._replica = session_replica(self._replica, spec)
            self._write(pending)
            self._outstanding += 1
        return pending.future

    @staticmethod
    def _no_answer(timeout: float) -> _errors.DeadlineExceeded:
        """gemm()'s error when its result is not in within timeout seconds."""
        return _errors.DeadlineExceeded(
            f"no answer within {timeout:g} s (the GEMM stays on the stream; its result will "
            f"be dropped)")

    def _unanswered(self, timeout: float) -> _errors.DeadlineExceeded:
        """close()'s error when GEMMs are still unanswered after timeout seconds."""
        return _errors.DeadlineExceeded(
            f"{self._outstanding} GEMMs still unanswered after {timeout:g} s")

    def _cancel_call(self) -> None:
        """cancel()'s start: marks the session cancelled and cancels the open call."""
        with self._lock:
            self._closing = self._cancelled = True
            call = self._call
        if call is not None:
            call.cancel()

    # The stream. REQUIRES for each: self._lock held.
    def _write(self, pending: Pending) -> None:
        if self._queue is None:
            self._open()
        i = self._book.add(pending)
        self._put(i, pending.spec)

    def _put(self, i: int, spec: Spec) -> None:
        """Queues GEMM i's messages on the open stream, or submits it to the native core's."""
        if not isinstance(self._queue, NativeStream):
            self._queue.put_nowait(spec.stream_messages(i, self._config.chunk_bytes))
            return
        try:
            self._queue.submit(i, spec)
        except _errors.rpc_errors() as e:  # refused before sending
            self._book.drop(i)
            raise _errors.from_rpc_error(e) from None

    def _open_native(self) -> Optional[NativeStream]:
        """A native stream to self._replica, set as the open call and queue, when the client
        uses the native core; else None."""
        native = self._client._calls.native
        if native is None:
            return None
        call = native.open_stream(self._replica or "")
        self._queue = self._call = call
        return call

    def _end_stream(self) -> None:
        if self._queue is not None:
            self._queue.put_nowait(None)
            self._queue = self._call = None

    def _stub(self):
        return self._client._calls.routes.stub(self._replica or "")

    # The reader's side.
    def _answered(self, call, message) -> bool:
        """Takes one answer; False once the server broke the protocol (the call is cancelled)."""
        with self._lock:
            finished, retry = self._book.consume(message)
            broken = self._book.protocol_error is not None
        self._settle(finished, retry)
        if broken:
            call.cancel()
        return not broken

    def _native_answer(self, answer) -> None:
        """One answer of a native stream, (gemm_id, outcome)."""
        with self._lock:
            finished, retry = self._book.answered(*answer)
        self._settle(finished, retry)

    def _native_end(self, call: NativeStream) -> Optional[_errors.Error]:
        return None if call.end is None else self._unreachable(call.end)

    def _unreachable(self, e: Exception) -> _errors.Error:
        return explain_unreachable(_errors.from_rpc_error(e), self._replica or "")

    def _ended(self, q, err: Optional[_errors.Error]):
        """The stream of request queue q is over (err None: it ended cleanly); returns what
        becomes of the GEMMs it left, (finished, retry) for _settle."""
        with self._lock:
            if self._queue is q:
                self._end_stream()
            else:
                q.put_nowait(None)  # already ended: this lets the writer finish
            if self._cancelled:
                err = _errors.Cancelled("the stream was cancelled")
            return self._book.ended(err)

    def _settle(self, finished, retry) -> None:
        for pending, outcome in finished:
            self._deliver(pending, outcome)
        for pending, delay in retry:
            self._later(delay, self._again, pending)

    def _again(self, pending: Pending) -> None:
        with self._lock:
            if self._cancelled:
                failure = _errors.Cancelled("the stream was cancelled")
            else:
                try:
                    self._write(pending)
                    return
                except ValueError as e:  # gRPC: the client's channel is closed
                    failure = _errors.Cancelled(str(e))
        self._deliver(pending, failure)

    def _deliver(self, pending: Pending, outcome) -> None:
        try:
            result = streamed_result(self._client, pending.spec, outcome, pending.details,
                                     pending.as_torch, pending.started)
        except Exception as e:  # e.g. as_torch without torch: the caller's, not the reader's
            result = e
        if not pending.future.done():  # an asyncio future may have been cancelled
            if isinstance(result, Exception):
                pending.future.set_exception(result)
            else:
                pending.future.set_result(result)
        with self._lock:
            self._outstanding -= 1
            if self._outstanding == 0:
                self._now_idle()

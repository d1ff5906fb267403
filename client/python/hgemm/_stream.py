"""hgemm.Stream: one GemmStream kept open for many GEMMs (Client.stream())."""
import concurrent.futures
import queue
import threading
import time
from typing import Optional

import grpc

from . import _errors, _results, _routes, _session_book, _spec

_END = object()  # ends the request iterator: the client's half-close


def _requests(q: "queue.SimpleQueue"):
    """The stream's messages: each GEMM's header and chunks as its generator yields them."""
    while True:
        item = q.get()
        if item is _END:
            return
        yield from item


class Stream:
    """One GemmStream kept open for many GEMMs, pipelined: a GEMM is written as soon as it is
    submitted (after the ones before it) and the server works on it while later ones upload.
    Made by Client.stream(); a context manager (close() at the end of the block, cancel() if the
    block raises). Thread-safe: several threads may submit on one stream.

        with client.stream() as s:
            C = s.gemm(A, hb)                      # as Client.gemm, on this stream
            futures = [s.submit(A, B) for A in As]  # concurrent.futures.Future each
            Cs = [f.result() for f in futures]

    Per GEMM, errors and retries are those of gemm_many: a failing GEMM raises its hgemm.Error
    alone, UNAVAILABLE is retried with backoff where safe. If the stream breaks, the GEMMs it
    leaves unanswered fail (or are sent again on a new stream, where safe) and the next submit
    opens a new stream. The stream has no deadline; gemm(timeout=) bounds the wait for one result
    (DeadlineExceeded; the GEMM stays on the stream and its result is dropped).

    A stream goes to one replica: `replica` of Client.stream(), else the one the first GEMM's
    matrices live on (else the client's target); a GEMM naming matrices of another replica raises
    FailedPrecondition.

    A reader thread per open stream takes the answers; gRPC writes the requests from a thread
    of its own.
    """

    def __init__(self, client, replica: Optional[str]):
        self._client = client
        self._config = client._config
        self._replica = replica  # None: chosen by the first GEMM
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when nothing is outstanding
        self._book = _session_book.SessionBook(self._config.policy)
        self._queue = None  # the open stream's request queue; None: no stream open
        self._call = None
        self._readers = []
        self._outstanding = 0  # submitted, result not yet delivered
        self._closing = False
        self._cancelled = False

    # Submitting.
    def submit(self, a, b, *, accumulation: Optional[str] = None, kernel: str = "auto",
               keep_c: bool = False, c_ttl: int = 0, request_id: str = "",
               details: bool = False, as_torch=False) -> concurrent.futures.Future:
        """Writes one GEMM on the stream; returns a Future of what Client.gemm would return
        (its exception: the GEMM's hgemm.Error). Arguments as Client.gemm."""
        started = time.monotonic()
        spec = _spec.Spec(a, b, accumulation=accumulation, kernel=kernel, keep_c=keep_c,
                          c_ttl=c_ttl, request_id=request_id)
        future = concurrent.futures.Future()
        future.set_running_or_notify_cancel()  # written at once: there is nothing to cancel
        pending = _session_book.Pending(spec, future, details, as_torch, started)
        with self._lock:
            if self._closing:
                raise RuntimeError("the stream is closed")
            self._replica = _routes.session_replica(self._replica, spec)
            self._write(pending)
            self._outstanding += 1
        return pending.future

    def gemm(self, a, b, *, timeout: Optional[float] = None, **options):
        """C = A·B on this stream: submit(...).result(), waiting at most `timeout` seconds (the
        client's default timeout if None)."""
        future = self.submit(a, b, **options)
        timeout = self._config.call_timeout(timeout)
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise _errors.DeadlineExceeded(
                f"no answer within {timeout:g} s (the GEMM stays on the stream; its result will "
                f"be dropped)") from None

    # Ending.
    def close(self, timeout: Optional[float] = None) -> None:
        """Waits (at most `timeout` seconds) for every submitted GEMM's result, then ends the
        stream. Later submits raise RuntimeError. Not from a Future's done-callback, which runs on
        the reader thread that close() would wait for (RuntimeError); cancel() works there."""
        with self._lock:
            if threading.current_thread() in self._readers:
                raise RuntimeError("close() from a result's callback would wait for itself")
            self._closing = True
            if not self._idle.wait_for(lambda: self._outstanding == 0, timeout):
                raise _errors.DeadlineExceeded(
                    f"{self._outstanding} GEMMs still unanswered after {timeout:g} s")
            self._end_stream()
            readers = list(self._readers)
        for reader in readers:
            reader.join()

    def cancel(self) -> None:
        """Cancels the stream: GEMMs not yet answered fail with Cancelled."""
        with self._lock:
            self._closing = self._cancelled = True
            call = self._call
            readers = list(self._readers)
        if call is not None:
            call.cancel()
        for reader in readers:
            if reader is not threading.current_thread():  # e.g. cancel() in a done-callback
                reader.join()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.close()
        else:
            self.cancel()

    # The stream. REQUIRES for each: self._lock held.
    def _write(self, pending: _session_book.Pending) -> None:
        if self._queue is None:
            self._open()
        i = self._book.add(pending)
        self._queue.put(pending.spec.stream_messages(i, self._config.chunk_bytes))

    def _open(self) -> None:
        q = queue.SimpleQueue()
        stub = self._client._calls.routes.stub(self._replica or "")
        call = stub.GemmStream(_requests(q), metadata=self._config.metadata)
        self._queue, self._call = q, call
        reader = threading.Thread(target=self._read, args=(call, q), name="hgemm-stream-reader",
                                  daemon=True)
        self._readers.append(reader)
        reader.start()

    def _end_stream(self) -> None:
        if self._queue is not None:
            self._queue.put(_END)
            self._queue = self._call = None

    # The reader thread: one per stream, until the stream ends.
    def _read(self, call, q) -> None:
        err = None
        try:
            for message in call:
                with self._lock:
                    finished, retry = self._book.consume(message)
                    broken = self._book.protocol_error is not None
                self._settle(finished, retry)
                if broken:
                    call.cancel()
                    break
        except grpc.RpcError as e:
            err = _routes.explain_unreachable(_errors.from_rpc_error(e), self._replica or "")
        with self._lock:
            if self._queue is q:
                self._end_stream()
            else:
                q.put(_END)  # already ended: this lets gRPC's writer thread finish
            if self._cancelled:
                err = _errors.Cancelled("the stream was cancelled")
            finished, retry = self._book.ended(err)
            self._readers.remove(threading.current_thread())
        self._settle(finished, retry)

    def _settle(self, finished, retry) -> None:
        for pending, outcome in finished:
            self._deliver(pending, outcome)
        for pending, delay in retry:
            if delay:
                timer = threading.Timer(delay, self._again, args=(pending,))
                timer.daemon = True
                timer.start()
            else:
                self._again(pending)

    def _again(self, pending: _session_book.Pending) -> None:
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

    def _deliver(self, pending: _session_book.Pending, outcome) -> None:
        try:
            result = _results.streamed_result(self._client, pending.spec, outcome, pending.details,
                                           pending.as_torch, pending.started)
        except Exception as e:  # e.g. as_torch without torch: the caller's, not the reader's
            result = e
        if isinstance(result, Exception):
            pending.future.set_exception(result)
        else:
            pending.future.set_result(result)
        with self._lock:
            self._outstanding -= 1
            if self._outstanding == 0:
                self._idle.notify_all()

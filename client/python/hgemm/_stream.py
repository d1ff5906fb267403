"""hgemm.Stream: one GemmStream kept open for many GEMMs (Client.stream()), with threads: a
reader per open stream, gRPC's own writer, timers for retries. The rest is StreamSession's.
Thread-safe: a lock guards the session's state (see Stream)."""
import concurrent.futures
import queue
import threading
from typing import Any, Optional

from . import _errors
from ._native import NativeStream
from ._stream_session import StreamSession
from ._types import Operand, Output


def _requests(q: "queue.SimpleQueue"):
    """The stream's messages: each GEMM's header and chunks as its generator yields them."""
    while True:
        item = q.get()
        if item is None:  # the client's half-close
            return
        yield from item


class Stream(StreamSession):
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
    of its own. On the native core (hgemm.info()) the stream is the library's (hgemm_stream_t:
    its own writer thread, C written straight into each GEMM's array, the GIL released while
    the reader waits); on grpcio, grpcio's.
    """

    def __init__(self, client, replica: Optional[str]):
        super().__init__(client, replica)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when nothing is outstanding
        self._readers = []

    def gemm(self, a: Operand, b: Operand, *, timeout: Optional[float] = None,
             **options: Any) -> Output:
        """C = A·B on this stream: submit(...).result(), waiting at most `timeout` seconds (the
        client's default timeout if None)."""
        future = self.submit(a, b, **options)
        timeout = self._config.call_timeout(timeout)
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise self._no_answer(timeout) from None

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
                raise self._unanswered(timeout)
            self._end_stream()
            readers = list(self._readers)
        for reader in readers:
            reader.join()

    def cancel(self) -> None:
        """Cancels the stream: GEMMs not yet answered fail with Cancelled."""
        self._cancel_call()
        with self._lock:
            readers = list(self._readers)
        for reader in readers:
            if reader is not threading.current_thread():  # e.g. cancel() in a done-callback
                reader.join()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, exc_type: Optional[type], *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.cancel()

    # StreamSession's I/O.
    def _new_future(self) -> concurrent.futures.Future:
        future = concurrent.futures.Future()
        future.set_running_or_notify_cancel()  # written at once: there is nothing to cancel
        return future

    def _open(self) -> None:
        call = self._open_native()
        if call is not None:
            self._start_reader(self._read_native, call)
            return
        q = queue.SimpleQueue()
        call = self._stub().GemmStream(_requests(q), metadata=self._config.metadata)
        self._queue, self._call = q, call
        self._start_reader(self._read, call, q)

    def _start_reader(self, read, *args) -> None:
        reader = threading.Thread(target=read, args=args, name="hgemm-stream-reader",
                                  daemon=True)
        self._readers.append(reader)
        reader.start()

    def _read_native(self, call: NativeStream) -> None:
        """The reader of a native stream: each answer, then the stream's end (as _read)."""
        while True:
            answer = call.next()  # the GIL released while it waits
            if answer is None:
                break
            self._native_answer(answer)
        finished, retry = self._ended(call, self._native_end(call))
        call.close()
        self._settle(finished, retry)
        with self._lock:  # after settling: cancel() returns once every future is done
            self._readers.remove(threading.current_thread())

    def _later(self, delay_s: float, fn, *args) -> None:
        if not delay_s:
            fn(*args)
            return
        timer = threading.Timer(delay_s, fn, args=args)
        timer.daemon = True
        timer.start()

    def _now_idle(self) -> None:
        self._idle.notify_all()

    # The reader thread: one per stream, until the stream ends.
    def _read(self, call, q) -> None:
        err = None
        try:
            for message in call:
                if not self._answered(call, message):
                    break
        except _errors.rpc_errors() as e:
            err = self._unreachable(e)
        finished, retry = self._ended(q, err)
        self._settle(finished, retry)
        with self._lock:  # after settling: cancel() returns once every future is done
            self._readers.remove(threading.current_thread())

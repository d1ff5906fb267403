"""The bookkeeping of a Client.stream() session: Pending (one submitted GEMM) and SessionBook
(the GEMMs on the open GemmStream and what becomes of each). No I/O.

Thread safety: none; the session serializes its calls (hgemm.Stream under its lock, hgemm.aio
on the event loop).
"""
from typing import Dict, Optional

from . import _errors, _wire
from ._retry import RetryPolicy, culprit_of, should_retry
from ._spec import Spec
from ._stream_collector import StreamCollector


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

    def drop(self, i: int) -> None:
        """Forgets GEMM i, which the stream refused before sending it."""
        self.pending.pop(i)
        self.collector.specs.pop(i)

    @property
    def protocol_error(self) -> Optional[_errors.Error]:
        return self.collector.protocol_error

    def consume(self, message: _wire.StreamResponse):
        i = self.collector.consume(message)
        if i is None:
            return [], []
        outcome = self.collector.outcome(i)
        self.collector.done.pop(i)
        return self.answered(i, outcome)

    def answered(self, i: int, outcome):
        """GEMM i's outcome, assembled (StreamCollector.outcome's; the native core's, whose C
        went straight into its buffer); returns (finished, retry) as consume."""
        self.collector.specs.pop(i)
        p = self.pending.pop(i)
        if isinstance(outcome, _errors.Error):
            outcome.index = None
            if self._retryable(p, outcome):
                return [], [(p, self._backoff(p, outcome))]
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
                finished.append((p, _errors.from_code(err.code, err.message,
                                                      rpc_status=err.rpc_status)))
            elif culprit in self.pending and i > culprit:
                retry.append((p, 0.0))  # written after the culprit: never admitted
            else:
                e = _errors.from_code(err.code, err.message, rpc_status=err.rpc_status)
                e.__cause__ = err.__cause__
                if self._retryable(p, e):
                    retry.append((p, self._backoff(p, e)))
                else:
                    finished.append((p, e))
        self.pending.clear()
        self.collector = StreamCollector({})
        return finished, retry

    def _retryable(self, p: Pending, err: _errors.Error) -> bool:
        return should_retry(err, not p.spec.keep_c) and p.attempt + 1 < self.policy.attempts

    def _backoff(self, p: Pending, err: _errors.Error) -> float:
        delay = self.policy.delay(p.attempt, [err])
        p.attempt += 1
        return delay

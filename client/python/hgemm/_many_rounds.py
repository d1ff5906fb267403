"""ManyRound: gemm_many's bookkeeping across the GemmStreams of one replica, which GEMMs are
answered and which go again on the next stream.

Thread safety: none; one gemm_many call owns each ManyRound.
"""
from typing import Dict, List, Optional

from . import _errors
from ._retry import Deadline, RetryPolicy, culprit_of, should_retry
from ._spec import Spec
from ._stream_collector import StreamCollector


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
                                                           index=culprit,
                                                           rpc_status=stream_err.rpc_status)
                after = sent[sent.index(culprit) + 1:]
                resend = [i for i in unanswered if i in after]
                unanswered = [i for i in unanswered if i != culprit and i not in after]
            for i in unanswered:
                err = _errors.from_code(stream_err.code, stream_err.message, index=i,
                                        rpc_status=stream_err.rpc_status)
                if should_retry(err, not self.specs[i].keep_c):
                    retry.append((i, err))
                else:
                    self.outcomes[i] = err
        else:
            for i in unanswered:
                self.outcomes[i] = _errors.Internal("the stream ended without an answer", index=i)
        delay = 0.0
        if retry:
            delay = self.policy.delay(self.retries, [err for _, err in retry])
            self.retries += 1
            if self.retries >= self.policy.attempts or not self.deadline.allows(delay):
                for i, err in retry:
                    self.outcomes[i] = err
                retry, delay = [], 0.0
        self.pending = sorted(resend + [i for i, _ in retry])
        return delay

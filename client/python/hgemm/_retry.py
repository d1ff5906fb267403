"""When to try again: RetryPolicy (UNAVAILABLE with backoff), a call's Deadline across its
tries, and the GEMM a stream-ending error names.

Thread safety: a RetryPolicy is only read once calls use it, so clients share one; a Deadline
belongs to one call. The functions keep no state.
"""
import dataclasses
import random
import re
import time
from typing import Optional, Sequence

from . import _errors

_CULPRIT = re.compile(r"^gemm_id (\d+): ")


class Deadline:
    """A call's timeout (seconds, None for none) across its retries."""

    def __init__(self, timeout: Optional[float]):
        self.end = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> Optional[float]:
        return None if self.end is None else max(self.end - time.monotonic(), 0.001)

    def allows(self, delay: float) -> bool:
        return self.end is None or time.monotonic() + delay < self.end


@dataclasses.dataclass
class RetryPolicy:
    """UNAVAILABLE is retried with exponential backoff and jitter: always when the server said the
    request was not run (a RetryInfo: queue full, shutting down) or no connection was made; for
    any other UNAVAILABLE only when repeating cannot change anything (a GEMM without keep_c,
    info, kernels, matrices, download). Never past the call's timeout; never sooner than the
    RetryInfo's delay."""
    attempts: int = 5               # tries in all, the first included
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    multiplier: float = 2.0

    def delay(self, retry: int, errors: Sequence[_errors.Error] = ()) -> float:
        """The backoff before retry number `retry` (0 for the first) of what failed with
        `errors`: at least the longest delay their RetryInfo asks for."""
        d = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** retry)
        asked = [e.retry_delay for e in errors if e.retry_delay is not None]
        return max([d * random.uniform(0.5, 1.0)] + asked)


def should_retry(err: _errors.Error, idempotent: bool) -> bool:
    return isinstance(err, _errors.Unavailable) and (idempotent or _errors.unavailable_not_run(err))


def culprit_of(err: _errors.Error) -> Optional[int]:
    """The gemm_id a stream-ending error names ("gemm_id 3: header.options.kernel: ...")."""
    m = _CULPRIT.match(err.message)
    return int(m.group(1)) if m else None

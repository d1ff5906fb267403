"""PreparedGemm: one GEMM made ready once and run as often as asked (Client.prepare).

Thread safety: a PreparedGemm may be called from many threads at once, as its client may (calls
sharing an `out` write C into it alike); close() once no call is in progress.
"""
import time
from typing import Any

from . import _errors
from ._results import native_result
from ._types import Output


class PreparedGemm:
    """c.gemm(a, b, **options) made once: g() runs it on the operands' contents at the time of
    the call and returns what that gemm returns (C, `out` when given, or a GemmResult with
    details=True); on hgemm.aio, `await g()`.

    Native: on the sync client with the native core, when the GEMM uses its operands' memory as
    it is (float16 or bf16, C-contiguous or a transposed view of such, a torch CPU tensor, a
    shared buffer, a ResidentMatrix) and keeps no C, the checks, the options and the regions
    named are done once here, and each g() is one call into the core (through the ring when A,
    B and `out` are shared buffers and details is False). Any other GEMM (an operand converted or
    copied, keep_c, grpcio, asyncio, a copy through the arena) runs as c.gemm(a, b, **options)
    at each call. `native` says which.
    """

    def __init__(self, client, a, b, options: dict, plan, spec, out):
        self._client, self._a, self._b, self._options = client, a, b, options
        self._plan, self._spec, self._out = plan, spec, out
        self._closed = False
        self._details = options.get("details", False)
        self._as_torch = options.get("as_torch", False)

    @property
    def native(self) -> bool:
        """Whether each call is one call into the native core."""
        return self._plan is not None

    def __call__(self) -> Output:
        plan = self._plan
        if plan is None:
            if self._closed:
                raise ValueError("this PreparedGemm is closed")
            return self._client.gemm(self._a, self._b, **self._options)
        started = time.monotonic()
        try:
            c, info = plan.run()
        except _errors.rpc_errors() as e:
            raise _errors.from_rpc_error(e) from None
        return native_result(self._spec, c, info, self._details, self._as_torch, started,
                             self._out)

    def close(self) -> None:
        """Frees the native arguments; calling it afterwards raises ValueError."""
        plan, self._plan, self._closed = self._plan, None, True
        if plan is not None:
            plan.close()

    def __enter__(self) -> "PreparedGemm":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

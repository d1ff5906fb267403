"""StreamCollector: a GemmStream's answers reassembled, C's chunks into one buffer per GEMM,
then each GEMM's outcome once its done arrives.

Thread safety: none; one reader at a time feeds a collector.
"""
from typing import Dict, Optional

import numpy as np

from . import _errors, _wire
from ._proto import hgemm_pb2 as pb
from ._spec import Spec


class StreamCollector:
    """Reassembles a GemmStream's answers: C's chunks into one buffer per GEMM, then its done."""

    def __init__(self, specs: Dict[int, Spec], progress=None):
        self.specs = specs
        self.buffers: Dict[int, np.ndarray] = {}
        self.done: Dict[int, pb.GemmDone] = {}
        self.protocol_error: Optional[_errors.Error] = None
        self.progress = progress

    def consume(self, message: _wire.StreamResponse) -> Optional[int]:
        """Takes one answer; returns its gemm_id when it was the GEMM's done."""
        i = message.gemm_id
        spec = self.specs.get(i)
        if spec is None or i in self.done:
            self._broken(f"the server answered gemm_id {i}, which is not in flight")
            return None
        if message.data is not None:
            end = message.offset + len(message.data)
            if end > spec.c_bytes:
                self._broken(f"gemm_id {i}: result chunk ends at byte {end}, past C's "
                             f"{spec.c_bytes} bytes")
                return None
            buf = self.buffers.get(i)
            if buf is None:
                buf = self.buffers[i] = np.empty(spec.c_bytes, dtype=np.uint8)
            buf[message.offset:end] = message.data
            if self.progress is not None:
                self.progress.update(len(message.data))
        elif message.done is not None:
            self.done[i] = message.done
            if message.done.status_code != 0:
                self.buffers.pop(i, None)  # chunks already sent are void
            return i
        return None

    def _broken(self, what: str) -> None:
        if self.protocol_error is None:
            self.protocol_error = _errors.Internal(what)

    def outcome(self, i: int):
        """None while unanswered; an Error; or (c_array or None, done)."""
        done = self.done.get(i)
        if done is None:
            return None
        if done.status_code != 0:
            return _errors.from_code(done.status_code, done.status_message, index=i,
                                     rpc_status=done.status if done.HasField("status") else None)
        spec = self.specs[i]
        if spec.keep_c:
            return None, done
        buf = self.buffers.pop(i, None)
        if buf is None:
            buf = np.empty(spec.c_bytes, dtype=np.uint8)
            if spec.c_bytes:
                return _errors.Internal("the server sent done without C's bytes", index=i)
        return spec.c_array(buf), done

"""What a call returns: Timing, Execution, GemmResult, Kernel, and their assembly from the
server's answers (unary or streamed, gemm_many's list).

Thread safety: Timing, Execution and Kernel are frozen; a GemmResult belongs to its caller. The
functions keep no state: thread-safe.
"""
import dataclasses
import time
from typing import List, Optional, Tuple

import numpy as np

from . import _arrays, _errors, _wire
from ._proto import hgemm_pb2 as pb
from ._resident import ResidentMatrix
from ._spec import DTYPE_NAMES, Spec

_ACCUMULATION_NAMES = {pb.ACCUMULATION_UNSPECIFIED: "default", pb.ACCUMULATION_FP16: "fp16",
                       pb.ACCUMULATION_FP32: "fp32"}


@dataclasses.dataclass(frozen=True)
class Timing:
    """Where one GEMM's time went, measured by the server (milliseconds; see proto Timing)."""
    queue_wait_ms: float
    host_to_device_ms: float
    kernel_ms: float
    device_to_host_ms: float
    server_total_ms: float
    tflops: float
    verify_ms: float = 0.0  # the server's Freivalds check of C (gemm(..., verify=True))

    @classmethod
    def from_proto(cls, t: pb.Timing) -> "Timing":
        return cls(t.queue_wait_ms, t.host_to_device_ms, t.kernel_ms, t.device_to_host_ms,
                   t.server_total_ms, t.tflops, t.verify_ms)


@dataclasses.dataclass(frozen=True)
class Execution:
    """Which hardware ran a GEMM: kernel (never "auto"), accumulation ("fp16"/"fp32"), backend
    ("cuda"/"cpu"), device id (-1 on CPU) and name, worker stream; with verify=True, the
    repetitions of the Freivalds check C passed, and the device whose first C failed it when C
    is a rerun's (None: no rerun); the launch that computed C: batch_size GEMMs against one
    resident B run as one, batch_rows rows in all (1 and 0 alone; 0 and 0 from a server from
    before batching)."""
    kernel: str
    accumulation: str
    backend: str
    device_id: int
    device_name: str
    stream_id: int
    verified_repetitions: int = 0
    suspect_device_id: Optional[int] = None
    batch_size: int = 0
    batch_rows: int = 0

    @classmethod
    def from_proto(cls, e: pb.Execution) -> "Execution":
        return cls(e.kernel, _ACCUMULATION_NAMES.get(e.accumulation, str(e.accumulation)),
                   e.backend, e.device_id, e.device_name, e.stream_id, e.verified_repetitions,
                   e.suspect_device_id if e.HasField("suspect_device_id") else None,
                   e.batch_size, e.batch_rows)


@dataclasses.dataclass
class GemmResult:
    """gemm(..., details=True): c (ndarray, torch tensor, or ResidentMatrix with keep_c),
    timing, execution, request_id, and client_ms (wall time of the call in this process)."""
    c: object
    timing: Timing
    execution: Execution
    request_id: str
    client_ms: float


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A kernel variant from ListKernels: the name for kernel=, its accumulations, layouts ("NN",
    "NT", "TN", "TT") and (input type, C type) pairs (("fp16", "fp16"), ("bf16", "fp32"), ...),
    and the pairs for which it takes alpha/beta (scaled_types), whether it takes grouped
    GEMMs (gemm_grouped), and whether its own epilogue applies alpha/beta (fused_scale; else the
    server runs a second pass over an fp32 intermediate)."""
    name: str
    description: str
    accumulations: Tuple[str, ...]
    layouts: Tuple[str, ...] = ()
    types: Tuple[Tuple[str, str], ...] = ()
    scaled_types: Tuple[Tuple[str, str], ...] = ()
    grouped: bool = False
    fused_scale: bool = False


def _type_pairs(pairs) -> Tuple[Tuple[str, str], ...]:
    return tuple((DTYPE_NAMES.get(t.dtype, str(t.dtype)),
                  DTYPE_NAMES.get(t.c_dtype, str(t.c_dtype)))
                 for t in pairs)


def kernels_from_proto(response: pb.ListKernelsResponse) -> List[Kernel]:
    return [Kernel(k.name, k.description,
                   tuple(_ACCUMULATION_NAMES.get(a, str(a)) for a in k.accumulations),
                   tuple(k.layouts), _type_pairs(k.types), _type_pairs(k.scaled_types),
                   k.grouped, k.fused_scale)
            for k in response.kernels]


def c_output(spec: Spec, c, as_torch):
    """C as gemm returns it: to_output's, and a bf16 C as a torch.bfloat16 tensor with as_torch
    (exact: the float32 array holds bf16 values)."""
    out = _arrays.to_output(c, as_torch)
    if spec.c_dtype == "bf16" and as_torch not in (False, None):
        import torch
        out = out.to(torch.bfloat16)
    return out


def unary_result(client, spec: Spec, raw: _wire.GemmResponse, details: bool, as_torch,
                 started: float):
    response = raw.message
    if spec.keep_c:
        c = ResidentMatrix(client, response.c_matrix)
    else:
        buf = raw.c_bytes(spec.c_bytes)
        if buf is None:
            start, end = raw.c_range or (0, 0)
            raise _errors.Internal(f"the server sent {end - start} bytes of C; "
                                   f"{spec.m}x{spec.n} {spec.c_dtype} is {spec.c_bytes}")
        c = c_output(spec, spec.c_array(buf), as_torch)
    if not details:
        return c
    return GemmResult(c, Timing.from_proto(response.timing),
                      Execution.from_proto(response.execution), response.request_id,
                      (time.monotonic() - started) * 1e3)


def group_result(group, raw: _wire.GemmResponse, details: bool, as_torch, started: float):
    """What gemm_grouped returns: each problem's C (as gemm's), in order; with details a
    GemmResult whose c is that list."""
    response = raw.message
    buf = raw.c_bytes(group.c_bytes)
    if buf is None:
        start, end = raw.c_range or (0, 0)
        raise _errors.Internal(f"the server sent {end - start} bytes of C; the group's C is "
                               f"{group.c_bytes} (a server from before grouped GEMMs?)")
    cs, offset = [], 0
    for spec in group.specs:
        cs.append(c_output(spec, spec.c_array(buf[offset:offset + spec.c_bytes]), as_torch))
        offset += spec.c_bytes
    if not details:
        return cs
    return GemmResult(cs, Timing.from_proto(response.timing),
                      Execution.from_proto(response.execution), response.request_id,
                      (time.monotonic() - started) * 1e3)


def region_result(spec: Spec, raw: _wire.GemmResponse, c, details: bool, started: float):
    """What gemm returns when C was written into shared memory: `c`, read from there."""
    if not details:
        return c
    response = raw.message
    return GemmResult(c, Timing.from_proto(response.timing),
                      Execution.from_proto(response.execution), response.request_id,
                      (time.monotonic() - started) * 1e3)


def native_result(spec: Spec, c, info, details: bool, as_torch, started: float, out):
    """What gemm returns from the native core's C (a ResidentMatrix with keep_c) and GemmInfo
    (hgemm/_native.py); C is `out` as it is when the caller gave one."""
    if out is None and not spec.keep_c:
        c = c_output(spec, c, as_torch)
    if not details:
        return c
    timing = Timing(info.queue_wait_ms, info.host_to_device_ms, info.kernel_ms,
                    info.device_to_host_ms, info.server_total_ms, info.tflops, info.verify_ms)
    execution = Execution(info.kernel.decode(), _ACCUMULATION_NAMES.get(info.accumulation,
                                                                        str(info.accumulation)),
                          info.backend.decode(), info.device_id, info.device_name.decode(),
                          info.stream_id, info.verified_repetitions,
                          info.suspect_device_id if info.suspect_device_id >= 0 else None)
    return GemmResult(c, timing, execution, info.request_id.decode(),
                      (time.monotonic() - started) * 1e3)


def with_out(result, out):
    """gemm's result (C or a GemmResult) with C copied into `out` and returned as C (None: the
    result as it is)."""
    if out is None:
        return result
    if isinstance(result, GemmResult):
        np.copyto(out, result.c)
        result.c = out
        return result
    np.copyto(out, result)
    return out


def streamed_result(client, spec: Spec, outcome, details: bool, as_torch, started: float):
    """An Error stays an Error; (c, done) becomes what gemm returns."""
    if isinstance(outcome, _errors.Error):
        return outcome
    c, done = outcome
    c = ResidentMatrix(client, done.c_matrix) if spec.keep_c else c_output(spec, c, as_torch)
    if not details:
        return c
    return GemmResult(c, Timing.from_proto(done.timing), Execution.from_proto(done.execution),
                      done.request_id, (time.monotonic() - started) * 1e3)


def finish_many(results: list, return_exceptions: bool):
    if return_exceptions:
        return results
    for r in results:
        if isinstance(r, _errors.Error):
            r.results = results
            raise r
    return results

"""The methods of hgemm.Client and hgemm.aio.Client, written once as generators of I/O steps.

A method of Calls checks its arguments, builds the requests, and yields each piece of I/O it
needs as a step: Rpc (one gRPC call), Native (one call of the native core: blocking on the sync
client, with a completion callback on asyncio), Sleep (a backoff) or AllOf (several step
generators, whose results it gets as a list). What a step came to is sent back in, or thrown in
where it raised (grpc.RpcError or _errors.CallFailed: the call failed); the method's return
value is the client method's result.
hgemm.Client does the steps with blocking calls and hgemm.aio.Client with awaits: those drivers
are the clients' only I/O. The methods are annotated with what the clients return.

Thread safety: a Calls is shared by every call of its client (ClientConfig and Routes are
thread-safe); each method call is a generator of its own, driven by one thread or task.
"""
import dataclasses
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

from . import _arrays, _cuda_ipc, _errors, _native, _progress, _shm
from ._config import ClientConfig
from ._many_rounds import ManyRound
from ._prepared import PreparedGemm
from ._proto import hgemm_pb2 as pb
from ._resident import MatrixList, ResidentMatrix, handle_replica, replica_of
from ._results import (Kernel, c_output, finish_many, group_result, kernels_from_proto,
                       native_result, region_result, streamed_result, unary_result, with_out)
from ._retry import Deadline, should_retry
from ._routes import Routes, by_replica, explain_unreachable
from ._spec import (ACCUMULATIONS, GroupSpec, Spec, batched_spec, normalize_pairs,
                    stream_requests)
from ._stream_collector import StreamCollector
from ._transfers import DownloadBuffer, upload_messages
from ._types import Array, AsTorch, Operand, Output


@dataclasses.dataclass
class Rpc:
    """One gRPC call, method(request, timeout=timeout, metadata=metadata); it comes to the
    response. streams_request: the request is an iterator of serialized messages. With
    on_response, each message of the response stream goes to it and the call comes to None."""
    method: Callable
    request: object
    timeout: Optional[float]
    metadata: tuple
    streams_request: bool = False
    on_response: Optional[Callable] = None


@dataclasses.dataclass
class Native:
    """One call of the native core: fn(*args), blocking its thread with the GIL released (ctypes);
    it comes to fn's result. start, where given, is the same call without blocking:
    start(*args, on_done) returns a NativeCall (cancel(), close()) and on_done(result, error) runs
    later on a core thread; the asyncio client does that, the sync client fn."""
    fn: Callable
    args: tuple
    start: Optional[Callable] = None


@dataclasses.dataclass
class Sleep:
    seconds: float


@dataclasses.dataclass
class AllOf:
    """Step generators to run to their results (a list, in their order): at once on asyncio,
    one after the other on the sync client."""
    steps: list


# prepare()'s keyword arguments: those of Spec, and those of the call.
_SPEC_ARGS = ("accumulation", "kernel", "keep_c", "c_ttl", "request_id", "c_dtype", "alpha",
              "beta", "c", "dtype", "transpose_a", "transpose_b", "verify", "verify_repetitions")
_CALL_ARGS = ("details", "as_torch", "mode", "timeout", "out")


def _check_out(spec: Spec, out, as_torch) -> None:
    """gemm's out= for this GEMM: ValueError unless None or an array C can be written into."""
    if out is not None and spec.c_dtype == "bf16":
        raise ValueError("out= takes a float16 or float32 C; this GEMM's C is bf16")
    _arrays.check_out(out, spec.m, spec.n, spec.keep_c, as_torch, spec.c_dtype)


def _as_given(spec: Spec, a, b, c) -> bool:
    """Whether the Spec's arrays are the caller's memory (no conversion or copy made), so that
    a prepared call reads what the caller writes there later."""
    return (_arrays.same_memory(spec.a.array, a) and _arrays.same_memory(spec.b.array, b)
            and _arrays.same_memory(spec.c_in, c))


class Calls:
    """A client's state (config, channels) and its methods as step generators."""

    def __init__(self, client, blocking: bool, target: str, **options):
        self.client = client  # what the ResidentMatrix objects made here call back
        self.config = ClientConfig(target, **options)
        self.routes = Routes(self.config, aio=not blocking)
        # The native core (hgemm/_native.py), when it is chosen and the client needs no grpcio
        # channel options; None: every call goes through grpcio. The asyncio client (blocking:
        # False) awaits each native call through its Native step's start.
        self.native = None
        self.blocking = blocking
        if not self.config.has_channel_options and _native.use_native():
            c = self.config
            self.native = _native.NativeClient(target, c.tls_files, c.token, c.client_id,
                                               c.traceparent, c.chunk_bytes, c.policy,
                                               ring=c.ring)
        self.shm = _shm.SharedMemory(target, self.config.shared_memory,
                                     self.config.shared_memory_min_bytes)

    # The retry loop around one call (to `replica`, "" for the target).
    def _call(self, attempt, timeout, idempotent: bool, replica: str = ""):
        """attempt(timeout_s): the steps of one try, repeated while RetryPolicy allows."""
        deadline = Deadline(self.config.call_timeout(timeout))
        policy = self.config.policy
        for tried in range(policy.attempts):
            try:
                return (yield from attempt(deadline.remaining()))
            except _errors.rpc_errors() as e:
                err = _errors.from_rpc_error(e)
            delay = policy.delay(tried, [err])
            if (tried + 1 == policy.attempts or not should_retry(err, idempotent)
                    or not deadline.allows(delay)):
                raise explain_unreachable(err, replica)
            yield Sleep(delay)

    def _rpc(self, method, request, timeout, **how):
        """The one step of a call: comes to its response (None with on_response)."""
        return (yield Rpc(method, request, timeout, self.config.metadata, **how))

    def _native_call(self, fn, *args, start=None):
        """The one step of a native call: comes to fn's result (on asyncio, start's)."""
        return (yield Native(fn, args, start))

    def _on_native(self, fn, args, timeout, idempotent: bool, nbytes: int, desc: str = "hgemm",
                   start=None, start_retries: bool = False):
        """fn(*args, timeout_s) of the native core: on the sync client one blocking call, which
        the core retries itself (client/retry.h); on asyncio start(*args, timeout_s, on_done),
        the same without blocking, one call when the core retries it (start_retries: a *_start
        call of revision 7), else (hgemm_gemm_async) retried here as _call. The C++ client
        routes by handle and explains unreachable replicas itself. A progress bar for the
        nbytes the call moves fills when it returns (the native core reports no chunks)."""
        bar = _progress.bar(self.config.progress, nbytes, desc)
        try:
            if self.blocking or start_retries:
                try:
                    result = yield from self._native_call(fn, *args,
                                                          self.config.call_timeout(timeout),
                                                          start=start)
                except _errors.rpc_errors() as e:
                    raise _errors.from_rpc_error(e) from None
            else:
                result = yield from self._call(
                    lambda t: self._native_call(fn, *args, t, start=start), timeout,
                    idempotent)
            if bar is not None:
                bar.update(nbytes)
            return result
        finally:
            _progress.close(bar)

    def _unary(self, name: str, request, timeout, idempotent: bool, replica: str = ""):
        """GemmService.<name>(request), retried as _call."""
        stub = self.routes.stub(replica)
        return (yield from self._call(lambda t: self._rpc(getattr(stub, name), request, t),
                                      timeout, idempotent, replica))

    def _server_limit(self, spec, mode, timeout):
        if self.config.needs_server_limit(spec, mode):
            try:
                info = yield from self.info(timeout=timeout)
                self.config.max_message_bytes = info.limits.max_message_bytes
            except _errors.Error:
                self.config.max_message_bytes = 4 << 20  # assume the smallest a server takes

    # GEMMs.
    def gemm(self, a: Operand, b: Operand, *, accumulation: Optional[str] = None,
             kernel: str = "auto", keep_c: bool = False, c_ttl: int = 0, request_id: str = "",
             details: bool = False, as_torch: AsTorch = False, mode: Optional[str] = None,
             timeout: Optional[float] = None, out: Optional[np.ndarray] = None,
             c_dtype: Optional[str] = None, alpha: Optional[float] = None, beta: float = 0.0,
             c: Optional[Operand] = None, dtype: Optional[str] = None,
             transpose_a: bool = False, transpose_b: bool = False, verify: bool = False,
             verify_repetitions: int = 0) -> Output:
        """C = A·B. A (m×k) and B (k×n): float16 numpy arrays, torch tensors, or ResidentMatrix.
        A transposed view (B.T of a C-contiguous B, a weight's .t()) is sent as stored with
        transpose_b (or transpose_a) set, not copied; transpose_b=True says the same of B as
        given (stored n×k: C = A·Bᵀ, BLAS's "T"), transpose_a=True of A (stored k×m).
        torch.bfloat16 tensors (both operands) go as bf16; dtype="bf16" takes numpy uint16
        arrays of bf16 bit patterns (numpy has no bfloat16 without ml_dtypes), dtype None
        infers the type from the arrays. c_dtype: None (C of the inputs' type; a bf16 C is
        float32 in numpy, bfloat16 with as_torch) or "fp32" (a float32 C).

        Returns C as an m×n float16 ndarray (a torch tensor with as_torch=True, or on a device
        with as_torch="cuda:0"); with keep_c=True a ResidentMatrix instead; with details=True a
        GemmResult (c, timing, execution, request_id, client_ms). out: a writable, C-contiguous
        m×n ndarray of C's type (float16, or float32 for an fp32 C) to write C into (returned
        as C); the native core and the server (out a shared buffer) write it there directly,
        grpcio's copies into it.
        Over a unix: target (same host): operands and C that live in shared buffers
        (shared_buffer()) are named, not sent; others of at least shared_memory_min_bytes go
        through the client's arena (one copy each way instead of gRPC's).
        accumulation: None (the server's default, fp32), "fp32" or "fp16". kernel: "auto" or a
        name from kernels(). alpha, beta, c: C = alpha·A·B + beta·c (BLAS semantics, fp32 math,
        one rounding); alpha None is 1; c (m×n, C's type: float16, float32, torch bfloat16 or
        floats rounded to bf16, or a ResidentMatrix) is sent only when beta ≠ 0. verify: the
        server checks C by Freivalds' method before answering (docs/verification.md), with
        verify_repetitions random vectors (0: the server's default); a C that fails twice
        raises hgemm.DataLoss, never returns; details=True shows timing.verify_ms and
        execution.verified_repetitions. Raises an hgemm.Error subclass on failure.
        """
        started = time.monotonic()
        spec = Spec(a, b, accumulation=accumulation, kernel=kernel, keep_c=keep_c, c_ttl=c_ttl,
                    request_id=request_id, c_dtype=c_dtype, alpha=alpha, beta=beta, c=c,
                    dtype=dtype, transpose_a=transpose_a, transpose_b=transpose_b,
                    verify=verify, verify_repetitions=verify_repetitions)
        replica = spec.replica()
        _check_out(spec, out, as_torch)
        if self.shm.enabled and not replica:
            result = yield from self._gemm_in_regions(spec, out, details, as_torch, timeout,
                                                      started)
            if result is not None:
                return result
        yield from self._server_limit(spec, mode, timeout)
        if self._on_native_core(spec):
            return (yield from self._native_gemm(spec, mode, out, details, as_torch, timeout,
                                                 started))
        if self.config.streams(spec, mode):
            result = (yield from self._many([spec], timeout, details, as_torch, started))[0]
            if isinstance(result, _errors.Error):
                result.index = None
                raise result
            return with_out(result, out)
        response = yield from self._unary("Gemm", spec.unary_request(), timeout,
                                          idempotent=not keep_c, replica=replica)
        return with_out(unary_result(self.client, spec, response, details, as_torch, started), out)

    def prepare(self, a: Operand, b: Operand, **options: Any) -> PreparedGemm:
        """gemm(a, b, **options) made ready to run many times: a PreparedGemm g, whose g()
        runs it on the operands' contents at the time of the call and returns what gemm
        returns. On the native core, the operands' checks, the options and the shared buffers
        named are done here once, and g() is one call into the core; g.native says whether it
        is (see PreparedGemm). Raises what gemm raises for these arguments before sending.

            g = c.prepare(A, B, out=C)   # A, B, C: e.g. shared buffers, refilled each step
            for _ in range(steps):
                A[:] = next_batch(); g()  # C holds A·B
        """
        spec_args = {name: options[name] for name in _SPEC_ARGS if name in options}
        unknown = set(options) - set(_SPEC_ARGS) - set(_CALL_ARGS)
        if unknown:
            raise TypeError(f"prepare() got unexpected keyword arguments {sorted(unknown)}")
        spec = Spec(a, b, **spec_args)
        out, mode, timeout = options.get("out"), options.get("mode"), options.get("timeout")
        replica = spec.replica()
        _check_out(spec, out, options.get("as_torch", False))
        plan = None
        if (self.blocking and self.native is not None and not spec.keep_c and not replica
                and _as_given(spec, a, b, options.get("c"))):
            refs = {}
            if self.shm.enabled:
                refs = {name: ref for name, ref in (("a", self.shm.find(spec.a.array)),
                                                     ("b", self.shm.find(spec.b.array)),
                                                     ("c", self.shm.find(out)))
                        if ref is not None}
                if self.shm.arena_parts([(name, operand.array) for name, operand
                                         in (("a", spec.a), ("b", spec.b)) if name not in refs],
                                        0 if "c" in refs else spec.c_bytes) is not None:
                    refs = None  # copies through the arena: each call as gemm
            if refs is not None:
                if not refs:
                    yield from self._server_limit(spec, mode, timeout)
                plan = self.native.prepare(
                    spec, refs, out, _native._mode(self._native_path(spec, mode)),
                    use_ring=not options.get("details", False) and not spec.options.verify,
                    timeout=self.config.call_timeout(timeout))
        return PreparedGemm(self.client, a, b, options, plan, spec, out)

    def _native_gemm(self, spec: Spec, mode, out, details, as_torch, timeout, started):
        """gemm through the native core: C into `out` or a new array, or kept on the server."""
        if spec.keep_c:
            matrix, info = yield from self._on_native(self.native.gemm_keep_c,
                                                      (spec, self.config.streams(spec, mode)),
                                                      timeout, idempotent=False,
                                                      nbytes=spec.payload_bytes,
                                                      start=self.native.gemm_keep_c_start)
            return native_result(spec, ResidentMatrix(self.client, matrix), info, details,
                                 as_torch, started, None)
        c, info = yield from self._on_native(self.native.gemm,
                                             (spec, self._native_path(spec, mode), out),
                                             timeout, idempotent=True,
                                             nbytes=spec.payload_bytes + spec.c_bytes,
                                             start=self.native.gemm_start)
        return native_result(spec, c, info, details, as_torch, started, out)

    def _gemm_in_regions(self, spec: Spec, out, details, as_torch, timeout, started):
        """The GEMM as a unary Gemm naming {region, offset} for the parts in shared memory: those
        in shared buffers as they are, those the arena takes copied in (C copied out). None,
        with nothing sent, when no part goes through shared memory."""
        refs = {}
        for name, operand in (("a", spec.a), ("b", spec.b)):
            ref = self.shm.find(operand.array)
            if ref is not None:
                refs[name] = ref
        c_in_out = None if spec.keep_c else self.shm.find(out)
        if c_in_out is not None:
            refs["c"] = c_in_out
        plan = self.shm.arena_parts(
            [(name, operand.array) for name, operand in (("a", spec.a), ("b", spec.b))
             if name not in refs],
            0 if spec.keep_c or c_in_out is not None else spec.c_bytes)
        arena = None if plan is None else (yield from self._take_arena(plan.nbytes, timeout))
        if arena is None and not refs:
            return None
        try:
            if arena is not None:
                for name, array in plan.copies:
                    at = plan.offsets[name]
                    arena.bytes[at:at + array.nbytes] = _arrays.byte_view(array)
                    refs[name] = pb.RegionRef(region=arena.handle, offset=at)
                if plan.c_bytes:
                    refs["c"] = pb.RegionRef(region=arena.handle, offset=plan.offsets["c"])
            # The ring carries no Freivalds check: a verified GEMM takes a unary call.
            ring = arena is None and not details and not spec.options.verify
            if spec.keep_c and ring and self._native_regions():
                # A and B both shared buffers: the kept C through the ring when it can.
                kept = yield from self._on_native(self.native.gemm_keep_c_in_regions,
                                                  (spec, refs), timeout, idempotent=False,
                                                  nbytes=0)
                if kept is not None:
                    matrix, info = kept
                    return native_result(spec, ResidentMatrix(self.client, matrix), info,
                                         details, as_torch, started, None)
            if self._native_regions() and not spec.keep_c:
                # The ring takes GEMMs of shared buffers alone (an arena's copies cost more
                # than the call), and not details=True: a ring's completion carries the
                # timings alone, not the execution (kernel, backend, device) nor the request id.
                c, info = yield from self._on_native(self.native.gemm_in_regions,
                                                     (spec, refs, None if "c" in refs else out,
                                                      ring),
                                                     timeout, idempotent=True, nbytes=0,
                                                     start=self.native.gemm_in_regions_start,
                                                     start_retries=True)
                if "c" not in refs:
                    return native_result(spec, c, info, details, as_torch, started, out)
                response = None
            else:
                response = yield from self._unary("Gemm", spec.unary_request(refs), timeout,
                                                  idempotent=not spec.keep_c)
                if "c" not in refs:
                    return with_out(unary_result(self.client, spec, response, details,
                                                 as_torch, started), out)
            if c_in_out is not None:
                c = out
            else:  # out of the arena, which the next GEMM reuses
                at = plan.offsets["c"]
                c = spec.c_array(arena.bytes[at:at + spec.c_bytes].copy())
                if out is None:
                    c = c_output(spec, c, as_torch)
                else:
                    np.copyto(out, c)
                    c = out
            if response is None:  # the native core's: C as it is
                return native_result(spec, c, info, details, as_torch, started, c)
            return region_result(spec, response, c, details, started)
        finally:
            if arena is not None:
                self.shm.give_back(arena)

    def _take_arena(self, nbytes: int, timeout):
        """An arena of at least nbytes for one GEMM (give it back after), registered now if
        none is free; None when the server refuses it (then the GEMM goes as bytes: for good
        when shared memory is off there, for this GEMM on a full quota)."""
        arena, too_small = self.shm.take_arena(nbytes)
        for region in too_small:
            yield from self._unregister_quietly(region, timeout)
        if arena is not None:
            return arena
        try:
            arena = yield from self._new_region(self.shm.new_arena_bytes(nbytes), "hgemm_arena",
                                                timeout)
        except (_errors.PermissionDenied, _errors.FailedPrecondition,
                _errors.Unimplemented) as e:
            self.shm.arena_refused = e
            return None
        except _errors.ResourceExhausted:
            return None
        self.shm.add_arena(arena)
        return arena

    def _native_regions(self) -> bool:
        """Whether regions and GEMMs naming them go through the native core."""
        return self.native is not None

    def _new_region(self, nbytes: int, label: str, timeout):
        """A registered region of nbytes: made and registered by the native core, else a memfd
        made here and registered by a RegisterRegion call."""
        if self._native_regions():
            return (yield from self._on_native(self.native.region_create, (nbytes, label),
                                               timeout, idempotent=False, nbytes=0,
                                               start=self.native.region_create_start,
                                               start_retries=True))
        region = _shm.Region(nbytes, label)
        try:
            info = yield from self._unary("RegisterRegion", pb.RegisterRegionRequest(
                path=region.path, byte_size=region.nbytes, label=region.label), timeout,
                idempotent=False)
        except BaseException:
            region.close()
            raise
        region.handle = info.region
        return region

    def _unregister_quietly(self, region, timeout):
        """Unregisters and closes a region; a failure leaves it to the server's --region_ttl_s."""
        try:
            if self._native_regions():
                yield from self._on_native(self.native.unregister_region, (region.handle,),
                                           timeout, idempotent=True, nbytes=0,
                                           start=self.native.unregister_region_start,
                                           start_retries=True)
            else:
                yield from self._unary("UnregisterRegion",
                                       pb.UnregisterRegionRequest(region=region.handle), timeout,
                                       idempotent=True)
        except _errors.Error:
            pass
        finally:
            region.close()

    def release_regions(self, timeout: Optional[float] = None):
        """Unregisters every region of this client (close() does), each within `timeout`
        seconds (None: 2), so that closing next to a server that is gone does not hang; what
        is not unregistered is left to the server's --region_ttl_s."""
        for region in self.shm.take_all():
            yield from self._unregister_quietly(region, 2.0 if timeout is None else timeout)

    def shared_buffer(self, shape: Union[int, Sequence[int]], dtype: npt.DTypeLike = np.float16,
                      *, label: str = "", timeout: Optional[float] = None) -> np.ndarray:
        """A zero-filled, writable ndarray of `shape` and `dtype` (float16: operands and C;
        float32: an fp32 C) living in a shared-memory region of its own, registered with the
        server (same host: a unix: target, server started with --allow_shared_memory). A GEMM
        of such arrays, or of C-contiguous slices or transposed views of them, names them
        instead of sending them; out= such an array has the server write C into it. The
        region is unregistered when the client closes (the array stays readable here).
        Raises ValueError without a unix: target, the server's error if it refuses."""
        if not self.shm.enabled:
            raise ValueError(f"shared buffers need the server's Unix socket (a unix: target); "
                             f"this client's is {self.config.target!r}")
        dtype = np.dtype(dtype)
        shape = (int(shape),) if np.isscalar(shape) else tuple(int(d) for d in shape)
        if not shape or min(shape) < 1:
            raise ValueError(f"a shared buffer of shape {shape} would be empty")
        region = yield from self._new_region(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize,
                                             label or "hgemm_buffer", timeout)
        self.shm.add_buffer(region)
        return region.bytes.view(dtype).reshape(shape)

    def cuda_gemm(self, a: Array, b: Array, out: Array, *, alpha: Optional[float] = None,
                  beta: float = 0.0, accumulation: Optional[str] = None, kernel: str = "auto",
                  request_id: str = "", timeout: Optional[float] = None) -> Array:
        """out = alpha·a·b + beta·out on the GPU that holds them, by CUDA IPC (same host: a
        unix: target, a CUDA server started with --allow_shared_memory): a (m×k), b (k×n) and
        out (m×n) are C-contiguous torch CUDA tensors on one device; a and b float16 or both
        bfloat16, out of their type or float32. The server reads a and b from this process's
        device memory and writes C into out in place: no host copy. Each allocation is
        registered once (hgemm.cuda_region) and unregistered when the client closes. Work
        queued on the tensors' device is waited for first. Returns out; raises ValueError or
        TypeError for tensors it cannot take, the server's error (FailedPrecondition: a CPU
        server, or a device not the server's) otherwise."""
        if not self.shm.enabled:
            raise ValueError(f"CUDA IPC needs the server's Unix socket (a unix: target); this "
                             f"client's is {self.config.target!r}")
        for name, t in (("a", a), ("b", b), ("out", out)):
            if not _arrays.is_torch_tensor(t) or not t.is_cuda or t.dim() != 2:
                raise TypeError(f"{name} must be a 2-D torch CUDA tensor")
            if t.device != a.device:
                raise ValueError(f"{name} is on {t.device}, a on {a.device}: one device only")
        import torch
        (m, k), (k_b, n) = a.shape, b.shape
        if k_b != k or tuple(out.shape) != (m, n):
            raise ValueError(f"shapes do not chain: a {tuple(a.shape)}, b {tuple(b.shape)}, "
                             f"out {tuple(out.shape)}")
        types = {torch.float16: pb.DATA_TYPE_FP16, torch.bfloat16: pb.DATA_TYPE_BF16}
        if a.dtype not in types or b.dtype != a.dtype:
            raise TypeError(f"a and b must both be float16 or both bfloat16; got {a.dtype}, "
                            f"{b.dtype}")
        if out.dtype not in (a.dtype, torch.float32):
            raise TypeError(f"out must be {a.dtype} or float32; got {out.dtype}")
        if accumulation not in ACCUMULATIONS:
            raise ValueError(f"accumulation must be 'fp16', 'fp32' or None; got {accumulation!r}")
        torch.cuda.synchronize(a.device)  # the server reads what queued work writes
        refs = {}
        for name, t in (("a", a), ("b", b), ("c", out)):
            region = _cuda_ipc.cuda_region(t)
            key = region.key + (region.handle,)
            registration = self.shm.cuda_registration(key)
            if registration is None:
                info = yield from self._unary("RegisterRegion", pb.RegisterRegionRequest(
                    byte_size=region.nbytes, label="hgemm_cuda",
                    cuda_ipc=pb.CudaIpcMemory(handle=region.handle, device=region.device)),
                    timeout, idempotent=False)
                registration = _shm.CudaIpcRegistration(info.region)
                self.shm.add_cuda(key, registration)
            refs[name] = pb.RegionRef(region=registration.handle, offset=region.offset)
        request = pb.GemmRequest(
            m=m, n=n, k=k, a_region=refs["a"], b_region=refs["b"], c_region=refs["c"],
            dtype=types[a.dtype],
            c_dtype=pb.DATA_TYPE_FP32 if out.dtype == torch.float32 else pb.DATA_TYPE_UNSPECIFIED,
            beta=beta, options=pb.GemmOptions(kernel=kernel, request_id=request_id,
                                              accumulation=ACCUMULATIONS[accumulation]))
        if alpha is not None:
            request.alpha = alpha
        if beta != 0:
            request.c_in_region.CopyFrom(refs["c"])
        # Not retried with beta: a first try that ran would have changed C_in.
        yield from self._unary("Gemm", request, timeout, idempotent=beta == 0)
        return out

    def regions(self, *, timeout: Optional[float] = None) -> pb.ListRegionsResponse:
        """ListRegions: this client's registered regions (.regions, .client_bytes, quotas)."""
        if self._native_regions():
            return (yield from self._on_native(self.native.regions, (), timeout,
                                               idempotent=True, nbytes=0,
                                               start=self.native.regions_start,
                                               start_retries=True))
        return (yield from self._unary("ListRegions", pb.ListRegionsRequest(), timeout,
                                       idempotent=True))

    def gemm_batched(self, a: Operand, b: Operand, *, alpha: Optional[float] = None,
                     beta: float = 0.0, c: Optional[Operand] = None,
                     c_dtype: Optional[str] = None, accumulation: Optional[str] = None,
                     kernel: str = "auto", request_id: str = "", details: bool = False,
                     as_torch: AsTorch = False, mode: Optional[str] = None,
                     timeout: Optional[float] = None) -> Output:
        """Strided-batched GEMM in one call: C[i] = alpha·A[i]·B[i] + beta·c[i] for A
        (batch×m×k) and B (batch×k×n), e.g. 3-D float16 arrays or lists of matrices; c
        (batch×m×n of C's type) only with beta ≠ 0. Returns C as a batch×m×n array (a
        GemmResult with details=True). Options as gemm's (GemmRequest.batch)."""
        started = time.monotonic()
        spec = batched_spec(a, b, accumulation=accumulation, kernel=kernel, request_id=request_id,
                            c_dtype=c_dtype, alpha=alpha, beta=beta, c=c)
        yield from self._server_limit(spec, mode, timeout)
        if self._on_native_core(spec):
            return (yield from self._native_gemm(spec, mode, None, details, as_torch, timeout,
                                                 started))
        if self.config.streams(spec, mode):
            result = (yield from self._many([spec], timeout, details, as_torch, started))[0]
            if isinstance(result, _errors.Error):
                result.index = None
                raise result
            return result
        response = yield from self._unary("Gemm", spec.unary_request(), timeout,
                                          idempotent=True, replica="")
        return unary_result(self.client, spec, response, details, as_torch, started)

    def gemm_grouped(self, pairs: Sequence[Tuple[Array, Array]], *,
                     alpha: Optional[float] = None, beta: float = 0.0,
                     c: Optional[Sequence[Array]] = None, c_dtype: Optional[str] = None,
                     dtype: Optional[str] = None, transpose_a: bool = False,
                     transpose_b: bool = False, accumulation: Optional[str] = None,
                     kernel: str = "auto", request_id: str = "", details: bool = False,
                     as_torch: AsTorch = False, timeout: Optional[float] = None) -> Output:
        """Grouped GEMM in one call (cublasGemmGroupedBatchedEx's model): C[i] = alpha·A[i]·B[i]
        + beta·c[i] for pairs [(A0, B0), (A1, B1), ...] of their own shapes, one dtype, layout,
        C type, scale and kernel for all. Operands as gemm takes them (arrays or tensors, not
        ResidentMatrix; transposed views, transpose_a/b and dtype as gemm's); c: one C_in per
        pair, only with beta ≠ 0. Returns the list of C[i] (as gemm returns C; a GemmResult
        whose c is that list with details=True). One unary Gemm (hgemm_gemm_grouped on the
        native core), so the operands must fit the server's message limit; a server without
        groups (ListKernels: Kernel.grouped) raises InvalidArgument."""
        started = time.monotonic()
        group = GroupSpec(pairs, c=c, accumulation=accumulation, kernel=kernel,
                          request_id=request_id, c_dtype=c_dtype, alpha=alpha, beta=beta,
                          dtype=dtype, transpose_a=transpose_a, transpose_b=transpose_b)
        if self.native is not None:
            cs, info = yield from self._on_native(self.native.gemm_grouped, (group,), timeout,
                                                  idempotent=True,
                                                  nbytes=sum(s.payload_bytes + s.c_bytes
                                                             for s in group.specs),
                                                  start=self.native.gemm_grouped_start,
                                                  start_retries=True)
            cs = [c_output(spec, c, as_torch) for spec, c in zip(group.specs, cs)]
            return native_result(group.specs[0], cs, info, details, as_torch, started, cs)
        response = yield from self._unary("Gemm", group.unary_request(), timeout,
                                          idempotent=True)
        return group_result(group, response, details, as_torch, started)

    def gemm_many(self, pairs: Iterable[Union[Tuple[Operand, Operand],
                                              Tuple[Operand, Operand, Dict[str, Any]]]], *,
                  accumulation: Optional[str] = None, kernel: str = "auto",
                  keep_c: bool = False, c_ttl: int = 0, details: bool = False,
                  as_torch: AsTorch = False, return_exceptions: bool = False,
                  timeout: Optional[float] = None, c_dtype: Optional[str] = None) -> List[Output]:
        """Many GEMMs on one GemmStream, pipelined (the server works on early GEMMs while later
        ones upload); results come back in the order of `pairs`.

        pairs: (A, B) or (A, B, {options}) items, options being any of accumulation, kernel,
        keep_c, c_ttl, request_id, c_dtype for that GEMM (operands as gemm takes them). A
        failing GEMM does not stop the others. Over several replicas, one stream per replica
        the GEMMs' matrices live on. With
        return_exceptions=False the first failing GEMM's Error is raised once all are done (its
        .index is its position, its .results the whole list); with True, failed GEMMs are
        hgemm.Error objects in the returned list. timeout is for the whole batch.
        """
        started = time.monotonic()
        defaults = dict(accumulation=accumulation, kernel=kernel, keep_c=keep_c, c_ttl=c_ttl,
                        request_id="", c_dtype=c_dtype)
        specs = normalize_pairs(pairs, defaults)
        if not specs:
            return []
        results = yield from self._many(specs, timeout, details, as_torch, started)
        return finish_many(results, return_exceptions)

    def _native_path(self, spec: Spec, mode: Optional[str]) -> Optional[bool]:
        """The native core's `streamed` for a GEMM: None (the core picks: parallel parts over
        several connections) for one in auto mode as large as the core's parallel_min_bytes,
        else whether it streams."""
        if ((mode or self.config.mode) == "auto" and not spec.scaled() and spec.batch == 1
                and spec.payload_bytes + spec.c_bytes >= self.native.parallel_min_bytes):
            return None
        return self.config.streams(spec, mode)

    def _on_native_core(self, spec: Spec) -> bool:
        """Whether a GEMM goes through the native core: whenever one is loaded (a kept C too:
        hgemm_gemm_keep_c on the sync client, hgemm_gemm_keep_c_async awaited on asyncio)."""
        return self.native is not None

    def _many(self, specs: List[Spec], timeout, details, as_torch, started):
        groups, outcomes = by_replica(dict(enumerate(specs)))
        deadline = Deadline(self.config.call_timeout(timeout))
        total = sum(s.payload_bytes + s.c_bytes for s in specs)
        bar = _progress.bar(self.config.progress, total, "hgemm")
        batches = []  # the native core's, one per replica (asyncio runs them at once)
        try:
            if all(self._on_native_core(s) for s in specs):
                for by_id in groups.values():
                    batches.append(self.native.batch(by_id))
                rounds = [self._native_rounds(batch, replica, by_id, deadline, bar)
                          for batch, (replica, by_id) in zip(batches, groups.items())]
            else:
                rounds = [self._stream_rounds(replica, by_id, deadline, bar)
                          for replica, by_id in groups.items()]
            done = yield AllOf(rounds)
            for by_id, rounds in zip(groups.values(), done):
                outcomes.update((i, rounds.outcome(i)) for i in by_id)
        finally:
            for batch in batches:
                batch.close()
            _progress.close(bar)
        return [streamed_result(self.client, specs[i], outcomes[i], details, as_torch, started)
                for i in range(len(specs))]

    def _native_rounds(self, batch, replica: str, by_id, deadline, bar):
        """_stream_rounds through the native core: each round one blocking hgemm_gemm_many of
        the pending GEMMs (C into the batch's buffers), settled by the same ManyRound."""
        rounds = ManyRound(by_id, self.config.policy, deadline)
        while rounds.pending:
            sent = rounds.pending
            stream_err = None
            try:
                yield from self._native_call(batch.run, sent, replica, deadline.remaining(),
                                         start=batch.run_start)
            except _errors.rpc_errors() as e:  # the C++ core explains unreachable replicas
                stream_err = _errors.from_rpc_error(e)
            delay = rounds.settle(batch, stream_err)
            if bar is not None:
                bar.update(sum(by_id[i].payload_bytes + by_id[i].c_bytes for i in sent
                               if i not in rounds.pending))
            if delay:
                yield Sleep(delay)
        return rounds

    def _stream_rounds(self, replica: str, by_id, deadline, bar):
        stub = self.routes.stub(replica)
        rounds = ManyRound(by_id, self.config.policy, deadline)
        while rounds.pending:
            collector = StreamCollector({i: by_id[i] for i in rounds.pending}, bar)
            requests = stream_requests(by_id, rounds.pending, self.config.chunk_bytes, bar)
            stream_err = None
            try:
                yield from self._rpc(stub.GemmStream, requests, deadline.remaining(),
                                     streams_request=True, on_response=collector.consume)
            except _errors.rpc_errors() as e:
                stream_err = explain_unreachable(_errors.from_rpc_error(e), replica)
            delay = rounds.settle(collector, stream_err)
            if delay:
                yield Sleep(delay)
        return rounds

    # Resident matrices.
    def upload(self, matrix: Array, *, ttl: int = 0, label: str = "",
               device_id: Optional[int] = None,
               replica: Union[None, str, ResidentMatrix] = None,
               timeout: Optional[float] = None) -> ResidentMatrix:
        """Uploads a matrix (float16 ndarray or tensor, or a torch.bfloat16 tensor: a bf16
        matrix, for GEMMs of bf16) and returns its ResidentMatrix (as stored: a transposed view
        is copied).
        ttl: seconds after its last use at which the server frees it (0: the server's default).
        device_id: the CUDA device to keep it on (None: the one with the most free memory).
        replica: where to put it over several replicas: a ResidentMatrix (onto the replica that
        holds it, so that both can go in one GEMM) or a replica's address; None: balanced."""
        array, dtype, _ = _arrays.as_operand(matrix, "matrix", allow_transposed=False)
        # A shared buffer (same host): the server copies it from the region, no chunks sent.
        region = self.shm.find(array) if self.shm.enabled and replica is None else None
        if self.native is not None and region is None:
            info = yield from self._on_native(self.native.upload,
                                              (array, dtype, device_id, ttl, label,
                                               replica_of(replica)), timeout,
                                              idempotent=False, nbytes=array.nbytes,
                                              desc="hgemm upload", start=self.native.upload_start,
                                              start_retries=True)
            return ResidentMatrix(self.client, info)
        bar = _progress.bar(self.config.progress, array.nbytes, "hgemm upload")

        stub = self.routes.stub(replica_of(replica))

        def attempt(t):
            messages = upload_messages(array, ttl, label, device_id, self.config.chunk_bytes, bar,
                                       dtype=pb.DATA_TYPE_BF16 if dtype == "bf16"
                                       else pb.DATA_TYPE_UNSPECIFIED, region=region)
            return self._rpc(stub.UploadMatrix, messages, t, streams_request=True)
        try:
            info = yield from self._call(attempt, timeout, idempotent=False,
                                         replica=replica_of(replica))
        finally:
            _progress.close(bar)
        return ResidentMatrix(self.client, info)

    def download(self, matrix: ResidentMatrix, *, as_torch: AsTorch = False,
                 timeout: Optional[float] = None) -> Output:
        """A resident matrix's values as a float16 ndarray (float32 for an fp32 or bf16 one; or a
        torch tensor with as_torch)."""
        if self.native is not None:  # into one buffer, by pointer
            buf = DownloadBuffer(matrix.rows, matrix.cols, dtype=matrix.dtype)
            buf.buf = np.empty(buf.nbytes, dtype=np.uint8)
            buf.received = yield from self._on_native(self.native.download,
                                                      (matrix.handle, buf.buf), timeout,
                                                      idempotent=True, nbytes=buf.nbytes,
                                                      desc="hgemm download",
                                                      start=self.native.download_start,
                                                      start_retries=True)
            return _arrays.to_output(buf.array(), as_torch)
        bar = _progress.bar(self.config.progress, matrix.bytes, "hgemm download")

        stub = self.routes.stub(handle_replica(matrix.handle))

        def attempt(t):
            buf = DownloadBuffer(matrix.rows, matrix.cols, bar, matrix.dtype)
            yield from self._rpc(stub.DownloadMatrix,
                                 pb.DownloadMatrixRequest(handle=matrix.handle),
                                 t, on_response=buf.add)
            return buf.array()
        try:
            array = yield from self._call(attempt, timeout, idempotent=True,
                                          replica=handle_replica(matrix.handle))
            return _arrays.to_output(array, as_torch)
        finally:
            _progress.close(bar)

    def release(self, matrix: ResidentMatrix, *, timeout: Optional[float] = None) -> int:
        """Frees a resident matrix; returns the bytes freed. NotFound if it is gone already."""
        if getattr(matrix, "released", False):
            return 0
        if self.native is not None:
            freed = yield from self._on_native(self.native.release, (matrix.handle,), timeout,
                                               idempotent=False, nbytes=0,
                                               start=self.native.release_start,
                                               start_retries=True)
        else:
            response = yield from self._unary("ReleaseMatrix",
                                              pb.ReleaseMatrixRequest(handle=matrix.handle),
                                              timeout, idempotent=False,
                                              replica=handle_replica(matrix.handle))
            freed = response.freed_bytes
        if isinstance(matrix, ResidentMatrix):
            matrix.released = True
        return freed

    def matrices(self, *, replica: Optional[str] = None,
                 timeout: Optional[float] = None) -> MatrixList:
        """This client's resident matrices (a list of ResidentMatrix, with .client_bytes and
        .quota_bytes). Over several replicas, those of `replica` (an address; None: of the one
        the balanced call reaches)."""
        if self.native is not None:
            response = yield from self._on_native(self.native.matrices, (replica or "",),
                                                  timeout, idempotent=True, nbytes=0,
                                                  start=self.native.matrices_start,
                                                  start_retries=True)
        else:
            response = yield from self._unary("ListMatrices", pb.ListMatricesRequest(), timeout,
                                              idempotent=True, replica=replica or "")
        out = MatrixList(ResidentMatrix(self.client, m) for m in response.matrices)
        out.client_bytes, out.quota_bytes = response.client_bytes, response.quota_bytes
        return out

    # The server.
    def info(self, *, replica: Optional[str] = None,
             timeout: Optional[float] = None) -> pb.ServerInfo:
        """GetServerInfo: version, backend, devices, limits, load, replica (a
        hgemm_pb2.ServerInfo), of `replica` if given, else of the replica the call reaches."""
        if self.native is not None:
            return (yield from self._on_native(self.native.server_info, (replica or "",),
                                               timeout, idempotent=True, nbytes=0,
                                               start=self.native.server_info_start,
                                               start_retries=True))
        return (yield from self._unary("GetServerInfo", pb.GetServerInfoRequest(), timeout,
                                       idempotent=True, replica=replica or ""))

    def kernels(self, *, timeout: Optional[float] = None) -> List[Kernel]:
        """ListKernels: the kernel names for kernel=, with their accumulations."""
        if self.native is not None:
            response = yield from self._on_native(self.native.kernels, (), timeout,
                                                  idempotent=True, nbytes=0,
                                                  start=self.native.kernels_start,
                                                  start_retries=True)
        else:
            response = yield from self._unary("ListKernels", pb.ListKernelsRequest(), timeout,
                                              idempotent=True)
        return kernels_from_proto(response)

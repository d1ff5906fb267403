"""The native core: libhgemm_client.so (client/c/hgemm.h, the C ABI over the C++ client) called
through ctypes, and the choice between it and the pure-Python (grpcio) transport.

Why: grpcio copies every message into and out of gRPC's buffers while holding the GIL, so a
threaded client's large GEMMs are copied one after another. Through ctypes (which releases the
GIL for the whole call) the C++ client sends A and B from the arrays' memory and writes C into
an array allocated here, while other threads run.

Which core: $HGEMM_TRANSPORT "native" (the library must load: OSError otherwise), "grpcio", or
"auto" / unset (native when the library loads). The library is $HGEMM_NATIVE_LIB, else
libhgemm_client.so beside this file (pip install copies it there). hgemm.info() says which.
The sync Client's GEMMs (any layout and types: transposed views go as stored, by pointer; alpha,
beta, C inputs, batches, keep_c, groups, operands and C in shared-memory regions the library
makes), gemm_many, uploads, downloads (into one buffer), listings, releases, regions, info and
kernels go through it, and so do both clients' stream()s (hgemm_stream_t). The aio client awaits
every native call through a completion callback (no thread of Python's per call): its GEMMs
through hgemm_gemm_async, the rest through the *_start calls of C ABI revision 7, whose done
runs on the core's own completion threads; NATIVE_FEATURES says what stays on grpcio (CUDA IPC,
channel_options). Nothing here imports grpc: a native client of a process that never imports
grpcio keeps it that way. GEMMs whose A, B and C are all in regions go
through a submission ring (hgemm_ring_t: no gRPC call per GEMM) unless the client's ring=False
or $HGEMM_RING=0.

Thread safety: the library is loaded once under a lock; a NativeClient is thread-safe (one
hgemm_client_t serves many threads).
"""
import ctypes
import logging
import os
import re
import threading
import weakref
from typing import Any, Dict, Optional, Sequence

import numpy as np
from google.protobuf import json_format

from . import _errors, _native_decls as _decls, _shm
from ._proto import hgemm_pb2 as pb
from ._resident import handle_replica

LIBRARY_NAME = "libhgemm_client.so"
# The declarations (functions, structs, callbacks, constants) are generated from
# client/c/hgemm.h into _native_decls.py (client/python/gen_native_decls.py), so they cannot
# drift from the header.
ABI_VERSION = _decls.HGEMM_ABI_VERSION  # of the client/c/hgemm.h this module binds
# The HGEMM_ABI_REVISION of that header: _native_decls declares every function of it, so the
# library must have them all (2: batches, transposes, types; 3: typed uploads, downloads,
# listings, keep_c, alpha/beta/C_in/batch; 4: parallel_min_bytes; 5: shared memory regions;
# 6: submission rings; 7: the *_start calls, awaited by the aio client; 8: rings keep C, bind
# slots after the open, drain; 9: borrowed stream operands; 10: error details; 11: the server's
# Freivalds check).
ABI_REVISION = _decls.HGEMM_ABI_REVISION
MODE_AUTO, MODE_UNARY, MODE_STREAM = (_decls.HGEMM_MODE_AUTO, _decls.HGEMM_MODE_UNARY,
                                      _decls.HGEMM_MODE_STREAM)
# HGEMM_DTYPE_* of a Spec's dtype names.
_DTYPES = {"fp16": _decls.HGEMM_DTYPE_FP16, "bf16": _decls.HGEMM_DTYPE_BF16,
           "fp32": _decls.HGEMM_DTYPE_FP32}
_BATCH_ADD_FAILED = ctypes.c_size_t(-1).value  # SIZE_MAX
_GEMM_ID = re.compile(r"^gemm_id (\d+): ")


def _mode(streamed: Optional[bool]) -> int:
    """The C ABI's mode of a GEMM: None lets the core pick (parallel parts for the largest,
    else by size), else a GemmStream or one Gemm call."""
    return MODE_AUTO if streamed is None else MODE_STREAM if streamed else MODE_UNARY

_lock = threading.Lock()
_library = None  # the loaded ctypes.CDLL, or the OSError that loading it raised


class GemmInfo(_decls.hgemm_gemm_info_t):
    """hgemm_gemm_info_t, and after it what hgemm_gemm_verify() reports of the same GEMM (not
    the C struct's: _read_check fills them right after the call)."""
    _fields_ = [("verify_ms", ctypes.c_double), ("verified_repetitions", ctypes.c_uint32),
                ("suspect_device_id", ctypes.c_int)]


def _gemm_info_copy(info) -> GemmInfo:
    """A GemmInfo of the library's hgemm_gemm_info_t at `info`, given to a done callback (valid
    during it only): the C struct's bytes, not past them, and the check hgemm_gemm_verify()
    reports of it (the library filled it on this thread just before calling done)."""
    copy = GemmInfo()
    ctypes.memmove(ctypes.byref(copy), info, ctypes.sizeof(_decls.hgemm_gemm_info_t))
    return _read_check(_library, copy)


def _read_check(lib, info: GemmInfo) -> GemmInfo:
    """`info` with the check of the GEMM it was just filled for (on this thread)."""
    ms, repetitions, suspect = ctypes.c_double(), ctypes.c_uint32(), ctypes.c_int()
    lib.hgemm_gemm_verify(ctypes.byref(ms), ctypes.byref(repetitions), ctypes.byref(suspect))
    info.verify_ms, info.verified_repetitions = ms.value, repetitions.value
    info.suspect_device_id = suspect.value
    return info


MatrixInfo = _decls.hgemm_matrix_info_t
RegionInfo = _decls.hgemm_region_info_t
GroupProblem = _decls.hgemm_group_problem_t
_DONE_FN = _decls.hgemm_gemm_done_fn
_KEEP_C_DONE_FN = _decls.hgemm_keep_c_done_fn
_RESULT_DONE_FN = _decls.hgemm_done_fn  # revision 7


class _InFlight:
    """The asynchronous calls started and not yet done, by the key passed as user_data: each
    keeps what the library reads and writes (operands, C) alive until its done has run, whatever
    became of the Python call meanwhile (a cancelled task). One ctypes callback, made once and
    never freed, serves them all, so no callback can be freed while the library may call it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._next = 0
        self._calls: Dict[int, tuple] = {}

    def add(self, on_done, keep) -> int:
        with self._lock:
            self._next += 1
            self._calls[self._next] = (on_done, keep)
            return self._next

    def pop(self, key: int):
        with self._lock:
            on_done, _ = self._calls.pop(key)
            return on_done


_in_flight = _InFlight()


@_DONE_FN
def _on_gemm_done(user_data, code, message, info):
    """hgemm_gemm_done_fn, on a library thread: hands the outcome to the call's on_done."""
    on_done = _in_flight.pop(user_data)
    if code != 0:
        on_done(None, NativeRpcError.reported(code, message or b""))
    else:
        on_done(_gemm_info_copy(info), None)


@_KEEP_C_DONE_FN
def _on_keep_c_done(user_data, code, message, info, c_handle, c_info):
    """hgemm_keep_c_done_fn, on a library thread: the call's on_done gets (GemmInfo, the kept
    C's handle, its MatrixInfo), copied (the library's are valid during this call only)."""
    on_done = _in_flight.pop(user_data)
    if code != 0:
        on_done(None, NativeRpcError.reported(code, message or b""))
    else:
        on_done((_gemm_info_copy(info), c_handle.decode(),
                 MatrixInfo.from_buffer_copy(c_info.contents)), None)


@_RESULT_DONE_FN
def _on_result(user_data, result):
    """hgemm_done_fn, on a completion thread of the core: the call's on_done gets read(result)
    (what the call returned, copied or taken: the result lives during this call only), or its
    NativeRpcError; a call that reads_errors gets read(result, the error or None) either way."""
    on_done, read, reads_errors = _in_flight.pop(user_data)
    message = ctypes.c_char_p()
    code = _library.hgemm_result_code(result, ctypes.byref(message))
    err = None if code == 0 else NativeRpcError.reported(code, message.value or b"")
    if err is not None and not reads_errors:
        on_done(None, err)
        return
    try:
        value = read(result, err) if reads_errors else read(result)
    except BaseException as e:  # the awaiting task's to raise
        on_done(None, e)
        return
    on_done(value, None)


def library_path() -> str:
    return os.environ.get("HGEMM_NATIVE_LIB") or os.path.join(os.path.dirname(__file__),
                                                               LIBRARY_NAME)


def transport() -> str:
    """$HGEMM_TRANSPORT: "auto" (unset), "native" or "grpcio"; ValueError for anything else."""
    value = os.environ.get("HGEMM_TRANSPORT") or "auto"
    if value not in ("auto", "native", "grpcio"):
        raise ValueError(f"HGEMM_TRANSPORT must be 'auto', 'native' or 'grpcio'; got {value!r}")
    return value


def load():
    """The library, loaded once per process (RTLD_LOCAL). Raises OSError if it cannot be loaded,
    its ABI version is not ABI_VERSION or its revision is older than ABI_REVISION."""
    global _library
    with _lock:
        if _library is None:
            try:
                _library = _checked_library(ctypes.CDLL(library_path()))
            except OSError as e:
                _library = e
        if isinstance(_library, OSError):
            raise _library
        return _library


def use_native() -> bool:
    """Whether new sync clients use the native core ($HGEMM_TRANSPORT; OSError when it is
    "native" and the library does not load)."""
    wanted = transport()
    if wanted == "grpcio":
        return False
    try:
        load()
        return True
    except OSError:
        if wanted == "native":
            raise
        return False


# What the native core serves of a client that uses it, by feature (hgemm.info()'s
# "features"); "grpcio" where the C ABI has no call for it yet. A client with channel_options
# makes every call through grpcio.
NATIVE_FEATURES = {
    "gemm": "native",                # any layout and types, alpha/beta/c, out=, keep_c
    "gemm_batched": "native",
    "gemm_grouped": "native",
    "gemm_many": "native",
    "upload": "native",              # but from a shared buffer: the server copies it there
    "download": "native",
    "release": "native",
    "matrices": "native",
    "stream": "native",              # Client.stream(): a persistent GemmStream
    "shared_memory": "native",       # shared_buffer(), regions(), GEMMs naming regions
    "ring": "native",                # GEMMs of A and B in regions, C too or kept: a ring
    "info": "native",
    "kernels": "native",
    "aio.gemm": "native",            # keep_c too
    # Also on grpcio: CUDA IPC (cuda_gemm), upload of a shared buffer, keep_c with regions.
    "aio.stream": "native",
    "aio.other": "native",           # the aio client's other calls (but CUDA IPC)
}


def info() -> Dict[str, Any]:
    """hgemm.info(): which core new sync clients use ("native" or "grpcio"), the library's path,
    ABI version and revision (None when not loaded), why the native core is not used (None if
    it is), and "features": which core serves each feature (NATIVE_FEATURES when native)."""
    out = {"core": "grpcio", "library": None, "abi_version": None, "abi_revision": None,
           "reason": None, "features": {feature: "grpcio" for feature in NATIVE_FEATURES}}
    wanted = transport()
    if wanted == "grpcio":
        out["reason"] = "HGEMM_TRANSPORT=grpcio"
        return out
    try:
        lib = load()
    except OSError as e:
        out["reason"] = str(e)
        return out
    out.update(core="native", library=library_path(), abi_version=lib.hgemm_abi_version(),
               abi_revision=lib.hgemm_abi_revision(), features=dict(NATIVE_FEATURES))
    with _ring_fallbacks_lock:
        out["ring_fallbacks"] = dict(_ring_fallbacks)
    return out


# GEMMs of this process that a ring was meant for and that went as Gemm calls because the ring
# ended (UNAVAILABLE: the server restarted, went away or detached it) or none could be opened
# (e.g. RESOURCE_EXHAUSTED past --max_rings_per_client): hgemm.info() says how many and the
# last reason; a ring that ends, and a refusal for good, are logged once (logger "hgemm").
_ring_fallbacks = {"count": 0, "last_reason": None}
_ring_fallbacks_lock = threading.Lock()
_log = logging.getLogger("hgemm")


def _ring_fell_back(reason: str, first: bool) -> None:
    with _ring_fallbacks_lock:
        _ring_fallbacks["count"] += 1
        _ring_fallbacks["last_reason"] = reason
    if first:
        _log.warning("hgemm: no submission ring (%s); GEMMs go as Gemm calls", reason)


def _checked_library(lib):
    """lib with its functions declared, or an OSError saying why this hgemm cannot use it."""
    if not hasattr(lib, "hgemm_abi_version"):
        return OSError(f"{library_path()} is not libhgemm_client (no hgemm_abi_version)")
    lib.hgemm_abi_version.restype, lib.hgemm_abi_version.argtypes = (
        _decls.FUNCTIONS["hgemm_abi_version"])
    version = lib.hgemm_abi_version()
    if version != ABI_VERSION:
        return OSError(f"{library_path()} has ABI version {version}; this hgemm binds version "
                       f"{ABI_VERSION}")
    revision = 1  # a library older than hgemm_abi_revision
    if hasattr(lib, "hgemm_abi_revision"):
        lib.hgemm_abi_revision.restype, lib.hgemm_abi_revision.argtypes = (
            _decls.FUNCTIONS["hgemm_abi_revision"])
        revision = lib.hgemm_abi_revision()
    if revision < ABI_REVISION:
        return OSError(f"{library_path()} has ABI revision {revision}; this hgemm needs "
                       f"{ABI_REVISION} or later (rebuild //client/c:libhgemm_client.so)")
    return _decls.declare(lib)


class NativeRpcError(_errors.CallFailed):
    """A failed native call, read like grpcio's errors (code(), details()), so that the retry
    loop and hgemm.Error's mapping treat both cores alike."""

    @classmethod
    def reported(cls, code: int, message: bytes) -> "NativeRpcError":
        """The failure the library has just reported on this thread, with its details
        (hgemm_error_status: the server's google.rpc.Status)."""
        size = ctypes.c_size_t(0)
        data = _library.hgemm_error_status(ctypes.byref(size))
        return cls(_errors.StatusCode.of(code), message.decode(errors="replace"),
                   ctypes.string_at(data, size.value) if size.value else None)


def _timeout_ms(timeout: Optional[float]) -> int:
    """A call's deadline for the C ABI: 0 for none, else at least 1 ms."""
    return 0 if timeout is None else max(1, int(timeout * 1e3))


def _encode(s: Optional[str]) -> bytes:
    return (s or "").encode()


class NativeClient:
    """One hgemm_client_t, made from a ClientConfig's connection options. Thread-safe."""

    _handle = None  # the hgemm_client_t until close()

    def __init__(self, target: str, tls: dict, token: Optional[str], client_id: Optional[str],
                 traceparent: Optional[str], chunk_bytes: int, policy, ring: bool = True):
        self._lib = lib = load()
        options = lib.hgemm_client_options_create()
        try:
            lib.hgemm_client_options_set_tls(options, int(bool(tls["tls"])))
            for key in ("tls_ca", "tls_cert", "tls_key", "tls_server_name"):
                getattr(lib, "hgemm_client_options_set_" + key)(options, _encode(tls[key]))
            lib.hgemm_client_options_set_token(options, _encode(token))
            lib.hgemm_client_options_set_client_id(options, _encode(client_id))
            lib.hgemm_client_options_set_traceparent(options, _encode(traceparent))
            lib.hgemm_client_options_set_chunk_bytes(options, chunk_bytes)
            # The blocking calls retry in the core, as _retry.RetryPolicy says.
            lib.hgemm_client_options_set_retry_policy(
                options, policy.attempts, int(policy.initial_backoff_s * 1e3),
                int(policy.max_backoff_s * 1e3), policy.multiplier)
            self._handle = self._checked(lib.hgemm_client_create, _encode(target), options)
            self._streams = weakref.WeakSet()  # open NativeStreams, cancelled by close()
            # GEMMs moving this many bytes of A, B and C go as parallel parts (HGEMM_MODE_AUTO).
            self.parallel_min_bytes = lib.hgemm_client_parallel_min_bytes(self._client)
            # GEMMs of regions only go through a submission ring (None: never).
            self._rings = _Rings(self) if ring else None
        except NativeRpcError as e:
            raise ValueError(e.details()) from None
        finally:
            lib.hgemm_client_options_destroy(options)

    def close(self) -> None:
        """Cancels its open streams (their GEMMs not yet answered fail with Cancelled, as a closed
        grpcio channel's) and frees the client, once its asynchronous GEMMs still running are
        over (the library waits for them, the GIL released)."""
        for stream in list(self._streams):
            stream.cancel()
        if self._rings is not None:
            self._rings.close()
        client, self._handle = self._handle, None
        if client:
            self._lib.hgemm_client_destroy(client)

    @property
    def _client(self):
        """The hgemm_client_t. ValueError once closed: the library takes no NULL client."""
        if self._handle is None:
            raise ValueError("this hgemm client is closed")
        return self._handle

    def _start(self, start_fn, args: tuple, read, keep, on_done,
               reads_errors: bool = False) -> "NativeCall":
        """start_fn(*args, done, key, &code, &errptr), a *_start call of revision 7: returns its
        NativeCall, and on_done(read(result), None) or on_done(None, the error) runs later,
        once, on a completion thread of the core. keep (what the call reads and writes) stays
        alive until then. Raises NativeRpcError (on_done never runs) when it cannot start."""
        key = _in_flight.add((on_done, read, reads_errors), keep)
        try:
            call = self._checked(start_fn, *args, _on_result, key)
        except BaseException:
            _in_flight.pop(key)  # refused: done never runs
            raise
        return NativeCall(self._lib, call)

    def _checked(self, fn, *args):
        """fn(*args, &code, &errptr); raises NativeRpcError on failure."""
        result, err = self._status(fn, *args)
        if err is not None:
            raise err
        return result

    def _call_options(self, timeout: Optional[float], replica: str = ""):
        options = self._lib.hgemm_call_options_create()
        self._lib.hgemm_call_options_set_timeout_ms(options, _timeout_ms(timeout))
        self._lib.hgemm_call_options_set_replica(options, replica.encode())
        return options

    def _status(self, fn, *args):
        """(result, None) of fn(*args, &code, &errptr) when it succeeds, else (result,
        NativeRpcError)."""
        code, message = ctypes.c_int(0), ctypes.c_void_p(None)
        result = fn(*args, ctypes.byref(code), ctypes.byref(message))
        if code.value == 0:
            return result, None
        details = ctypes.string_at(message.value) if message else b""
        self._lib.hgemm_free(message)
        return result, NativeRpcError.reported(code.value, details)

    def _gemm_options(self, spec, mode: int = 0, timeout: Optional[float] = None):
        """An hgemm_gemm_options_t of a Spec (the caller destroys it). Only what differs from
        hgemm_gemm_options_create()'s defaults is set: each ctypes call costs about a
        microsecond, and most GEMMs are fp16 C = A·B with "auto"."""
        lib = self._lib
        options = lib.hgemm_gemm_options_create()
        lib.hgemm_gemm_options_set_mode(options, mode)
        lib.hgemm_gemm_options_set_timeout_ms(options, _timeout_ms(timeout))
        o = spec.options
        if o.kernel != "auto":
            lib.hgemm_gemm_options_set_kernel(options, o.kernel.encode())
        if o.accumulation != pb.ACCUMULATION_UNSPECIFIED:
            lib.hgemm_gemm_options_set_accumulation(options, o.accumulation)
        if o.request_id:
            lib.hgemm_gemm_options_set_request_id(options, o.request_id.encode())
        if o.verify:
            lib.hgemm_gemm_options_set_verify(options, 1, o.verify_repetitions)
        if spec.a.handle:
            lib.hgemm_gemm_options_set_a_handle(options, spec.a.handle.encode())
        if spec.b.handle:
            lib.hgemm_gemm_options_set_b_handle(options, spec.b.handle.encode())
        if spec.a.transposed:
            lib.hgemm_gemm_options_set_transpose_a(options, 1)
        if spec.b.transposed:
            lib.hgemm_gemm_options_set_transpose_b(options, 1)
        if spec.dtype != "fp16" or spec.c_dtype != "fp16":
            lib.hgemm_gemm_options_set_dtype(options, _DTYPES[spec.dtype])
            lib.hgemm_gemm_options_set_c_dtype(options, _DTYPES[spec.c_dtype])
        if spec.alpha is not None:
            lib.hgemm_gemm_options_set_alpha(options, spec.alpha)
        if spec.beta != 0:
            lib.hgemm_gemm_options_set_beta(options, spec.beta)
        if spec.c_in is not None:  # read from spec's array, which outlives the call
            lib.hgemm_gemm_options_set_c_in(options, spec.c_in.ctypes.data, spec.c_in.nbytes)
        if spec.c_in_handle:
            lib.hgemm_gemm_options_set_c_in_handle(options, spec.c_in_handle.encode())
        if spec.batch != 1:
            lib.hgemm_gemm_options_set_batch(options, spec.batch)
        return options

    def gemm(self, spec, streamed: Optional[bool], out: Optional[np.ndarray],
             timeout: Optional[float]):
        """(C, GemmInfo) of a Spec sent as it is (operands from the arrays' memory, transposed
        views as stored, or by handle); C is written into `out`, else into a new buffer and
        returned as spec.c_array makes it (float16, float32, bf16 widened to float32).
        REQUIRES: not spec.keep_c (gemm_keep_c); out is None or passed _arrays.check_out (of
        C's type)."""
        options = self._gemm_options(spec, _mode(streamed), timeout)
        try:
            buffer = np.empty(spec.c_bytes, dtype=np.uint8) if out is None else out
            info = GemmInfo()
            self._checked(self._lib.hgemm_gemm, self._client, options, spec.m, spec.n, spec.k,
                          *_operand(spec.a), *_operand(spec.b), buffer.ctypes.data,
                          buffer.nbytes, ctypes.byref(info))
            return (out if out is not None else spec.c_array(buffer)), _read_check(self._lib, info)
        finally:
            self._lib.hgemm_gemm_options_destroy(options)

    def gemm_in_regions(self, spec, refs: dict, out: Optional[np.ndarray], use_ring: bool,
                        timeout: Optional[float]):
        """(C or None, GemmInfo) of a Spec whose parts named in refs ({"a" / "b" / "c":
        RegionRef}) are in shared memory, as one Gemm call: C written into its region when
        refs has "c" (None returned), else as gemm() returns it. With use_ring, a GEMM that a
        ring entry can say (A, B and C all in regions, no C input, batch or request id) goes
        through the client's ring instead, and as a Gemm call where the ring is refused or
        UNAVAILABLE (the ring detached, the server's queue full: the call's retries apply).
        A ring GEMM past `timeout` raises DEADLINE_EXCEEDED; its C region may still be written
        until the late GEMM ends (ring_drain()). REQUIRES: not spec.keep_c."""
        if use_ring and self._rings is not None and _ring_entry_fits(spec, refs):
            done = self._ring_gemm(spec, refs, timeout)
            if done is not None:
                return done
        options, args, buffer = self._regions_gemm(spec, refs, out, timeout)
        try:
            info = GemmInfo()
            self._checked(self._lib.hgemm_gemm, self._client, options, *args, ctypes.byref(info))
            _read_check(self._lib, info)
        finally:
            self._lib.hgemm_gemm_options_destroy(options)
        return _regions_c(spec, out, buffer), info

    def gemm_in_regions_start(self, spec, refs: dict, out: Optional[np.ndarray], use_ring: bool,
                              timeout: Optional[float], on_done) -> "NativeCall":
        """gemm_in_regions() without blocking: through the ring (hgemm_ring_gemm_start; opening
        a ring, once, blocks), then, where the ring is refused or UNAVAILABLE, as a Gemm call
        (hgemm_gemm_start)."""
        ring = None
        if use_ring and self._rings is not None and _ring_entry_fits(spec, refs):
            ring = self._rings.acquire(frozenset(refs[name].region for name in ("a", "b", "c")))
        if ring is None:
            return self._regions_gemm_start(spec, refs, out, timeout, on_done)
        chain = _ChainedCall()

        def ring_done(info, err):
            unavailable = err is not None and err.code() == _errors.StatusCode.UNAVAILABLE
            self._rings.release(ring, retire=unavailable)
            if not unavailable:
                on_done(None if err else (None, info), err)
                return
            try:
                chain.then(lambda: self._regions_gemm_start(spec, refs, out, timeout, on_done))
            except BaseException as e:  # refused before sending
                on_done(None, e)
        lib = self._lib
        options = self._regions_options(spec, refs, timeout)
        try:
            chain.then(lambda: self._start(lib.hgemm_ring_gemm_start,
                                           (ring.ring, options, spec.m, spec.n, spec.k),
                                           lambda r: _gemm_info_of(lib, r), spec, ring_done))
        except BaseException:
            self._rings.release(ring, retire=False)
            raise
        finally:
            lib.hgemm_gemm_options_destroy(options)
        return chain

    def _regions_gemm_start(self, spec, refs, out, timeout, on_done) -> "NativeCall":
        options, args, buffer = self._regions_gemm(spec, refs, out, timeout)
        try:
            return self._start(self._lib.hgemm_gemm_start, (self._client, options) + args,
                               lambda r: (_regions_c(spec, out, buffer),
                                          _gemm_info_of(self._lib, r)), (spec, buffer), on_done)
        finally:
            self._lib.hgemm_gemm_options_destroy(options)

    def gemm_keep_c_in_regions(self, spec, refs: dict, timeout: Optional[float]):
        """(MatrixInfo of the kept C, GemmInfo) of a keep_c Spec whose A and B are in regions
        (refs), through the client's ring; None when it did not run there (no ring, it does not
        fit an entry, or UNAVAILABLE): the caller sends it as a Gemm call."""
        if self._rings is None or not _ring_entry_fits(spec, refs):
            return None
        done = self._ring_gemm(spec, refs, timeout)
        if done is None:
            return None
        handle, info = done
        kept = pb.MatrixInfo(handle=handle, rows=spec.m, cols=spec.n,
                             bytes=(4 if spec.c_dtype == "fp32" else 2) * spec.m * spec.n,
                             label="", replica=handle_replica(handle),
                             dtype=_DTYPES[spec.c_dtype])
        return kept, info

    def _regions_gemm(self, spec, refs: dict, out: Optional[np.ndarray],
                      timeout: Optional[float]):
        """(GEMM options, hgemm_gemm's m, n, k, a, b and c arguments, C's buffer or None) of
        gemm_in_regions' Gemm call; the caller destroys the options."""
        options = self._regions_options(spec, refs, timeout)
        buffer = (None if "c" in refs else
                  np.empty(spec.c_bytes, dtype=np.uint8) if out is None else out)
        return options, (*_operand_args(spec, refs),
                         None if buffer is None else buffer.ctypes.data,
                         0 if buffer is None else buffer.nbytes), buffer

    def _ring_gemm(self, spec, refs: dict, timeout: Optional[float]):
        """(None, GemmInfo) of the GEMM through the ring (C in its region), or (the kept C's
        handle, GemmInfo) with keep_c; None when it did not run there (no ring, or
        UNAVAILABLE); raises the entry's other errors."""
        names = ("a", "b") if spec.keep_c else ("a", "b", "c")
        options = self._regions_options(spec, {name: refs[name] for name in names}, timeout)
        try:
            return self._ring_run(spec, frozenset(refs[name].region for name in names), options)
        finally:
            self._lib.hgemm_gemm_options_destroy(options)

    def _regions_options(self, spec, refs: dict, timeout: Optional[float],
                         mode: int = MODE_UNARY):
        """The GEMM options of a Spec naming the regions of refs (the caller destroys them);
        a GEMM naming regions goes unary."""
        options = self._gemm_options(spec, mode, timeout)
        lib = self._lib
        for name, setter in (("a", lib.hgemm_gemm_options_set_a_region),
                             ("b", lib.hgemm_gemm_options_set_b_region),
                             ("c", lib.hgemm_gemm_options_set_c_region)):
            if name in refs:
                setter(options, refs[name].region.encode(), refs[name].offset)
        return options

    def _ring_run(self, spec, regions: frozenset, options):
        """_ring_gemm with its options made: one entry in the ring that binds `regions`."""
        ring = self._rings.acquire(regions)
        if ring is None:
            return None
        lib = self._lib
        unavailable = False
        try:
            info = GemmInfo()
            if spec.keep_c:
                handle, err = self._status(lib.hgemm_ring_gemm_keep_c, ring.ring, options, spec.m,
                                           spec.n, spec.k, ctypes.byref(info))
                if err is None:
                    try:
                        return ctypes.string_at(handle).decode(), info
                    finally:
                        lib.hgemm_free(handle)
            else:
                _, err = self._status(lib.hgemm_ring_gemm, ring.ring, options, spec.m, spec.n,
                                      spec.k, ctypes.byref(info))
                if err is None:
                    return None, info
            if err.code() != _errors.StatusCode.UNAVAILABLE:
                raise err
            unavailable = True
            _ring_fell_back(err.details(), first=self._rings.ended(ring))
            return None
        finally:
            self._rings.release(ring, retire=unavailable)

    def prepare(self, spec, refs: dict, out: Optional[np.ndarray], mode: int, use_ring: bool,
                timeout: Optional[float]) -> "PreparedNative":
        """A PreparedNative of a Spec whose operands are the caller's memory (refs: the parts
        in shared buffers, as gemm_in_regions takes them); mode: gemm()'s, for a GEMM naming no
        region (one naming regions goes unary). REQUIRES: not spec.keep_c; out as gemm()'s."""
        return PreparedNative(self, spec, refs, out, mode, use_ring, timeout)

    def ring_drain(self) -> None:
        """Waits until every GEMM sent through the client's ring so far has ended, those that
        raised DEADLINE_EXCEEDED included: their C regions are written no more."""
        if self._rings is not None:
            self._rings.drain()

    def gemm_grouped(self, group, timeout: Optional[float]):
        """([C of each problem, as gemm returns it], GemmInfo) of a GroupSpec, in one Gemm call;
        operands from the arrays' memory, each C written into a buffer of its own."""
        specs = group.specs
        # The group's form (types, layout, scales, options) is each spec's; its C_ins are the
        # problems'.
        options = self._gemm_options(specs[0], MODE_UNARY, timeout)
        self._lib.hgemm_gemm_options_set_c_in(options, None, 0)
        problems, buffers = _group_problems(specs)
        info = GemmInfo()
        try:
            self._checked(self._lib.hgemm_gemm_grouped, self._client, options, problems,
                          len(specs), ctypes.byref(info))
            _read_check(self._lib, info)
        finally:
            self._lib.hgemm_gemm_options_destroy(options)
        return [spec.c_array(buffer) for spec, buffer in zip(specs, buffers)], info

    def gemm_grouped_start(self, group, timeout: Optional[float], on_done) -> "NativeCall":
        """gemm_grouped() without blocking (hgemm_gemm_grouped_start)."""
        specs = group.specs
        options = self._gemm_options(specs[0], MODE_UNARY, timeout)
        self._lib.hgemm_gemm_options_set_c_in(options, None, 0)
        problems, buffers = _group_problems(specs)
        try:
            return self._start(self._lib.hgemm_gemm_grouped_start,
                               (self._client, options, problems, len(specs)),
                               lambda r: ([spec.c_array(b) for spec, b in zip(specs, buffers)],
                                          _gemm_info_of(self._lib, r)),
                               (group, problems, buffers), on_done)
        finally:
            self._lib.hgemm_gemm_options_destroy(options)

    def region_create(self, nbytes: int, label: str, timeout: Optional[float]) -> "NativeRegion":
        """A zero-filled region of nbytes made by the core (a sealed memfd) and registered."""
        options = self._call_options(timeout)
        try:
            region = self._checked(self._lib.hgemm_region_create, self._client, options, nbytes,
                                   label.encode())
        finally:
            self._lib.hgemm_call_options_destroy(options)
        return NativeRegion(self._lib, region, label)

    def region_create_start(self, nbytes: int, label: str, timeout: Optional[float],
                            on_done) -> "NativeCall":
        return self._call_start(self._lib.hgemm_region_create_start, (nbytes, label.encode()),
                                timeout, "", lambda r: NativeRegion(
                                    self._lib, self._lib.hgemm_result_take_region(r), label),
                                None, on_done)

    def unregister_region_start(self, handle: str, timeout: Optional[float],
                                on_done) -> "NativeCall":
        return self._call_start(self._lib.hgemm_unregister_region_start, (handle.encode(),),
                                timeout, "", lambda r: None, None, on_done)

    def unregister_region(self, handle: str, timeout: Optional[float]) -> None:
        options = self._call_options(timeout)
        try:
            self._checked(self._lib.hgemm_unregister_region, self._client, options,
                          handle.encode())
        finally:
            self._lib.hgemm_call_options_destroy(options)

    def regions(self, timeout: Optional[float]) -> pb.ListRegionsResponse:
        """ListRegions, as the server's response, but for the rings' own regions (how GEMMs
        travel, as the channels: the listing is the same on both cores; client_bytes still
        counts them, as the quota does)."""
        options = self._call_options(timeout)
        try:
            listed = self._checked(self._lib.hgemm_list_regions, self._client, options)
        finally:
            self._lib.hgemm_call_options_destroy(options)
        return self._region_list(listed)

    def regions_start(self, timeout: Optional[float], on_done) -> "NativeCall":
        """regions() without blocking (hgemm_list_regions_start)."""
        return self._call_start(self._lib.hgemm_list_regions_start, (), timeout, "", lambda r:
                                self._region_list(self._lib.hgemm_result_take_region_list(r)),
                                None, on_done)

    def _region_list(self, listed) -> pb.ListRegionsResponse:
        """The response of an hgemm_region_list_t (freed here)."""
        rings = set() if self._rings is None else self._rings.regions()
        lib = self._lib
        try:
            response = pb.ListRegionsResponse(
                client_bytes=lib.hgemm_region_list_client_bytes(listed),
                quota_bytes=lib.hgemm_region_list_quota_bytes(listed),
                quota_regions=lib.hgemm_region_list_quota_regions(listed))
            for i in range(lib.hgemm_region_list_size(listed)):
                r = RegionInfo()
                lib.hgemm_region_list_info(listed, i, ctypes.byref(r))
                if r.region.decode() in rings:
                    continue
                response.regions.add(
                    region=r.region.decode(), byte_size=r.byte_size, label=r.label.decode(),
                    age_seconds=r.age_seconds, idle_seconds=r.idle_seconds,
                    ttl_seconds=r.ttl_seconds, in_use=r.in_use, dma=bool(r.dma),
                    cuda_ipc=bool(r.cuda_ipc), device_id=r.device_id)
            return response
        finally:
            lib.hgemm_region_list_destroy(listed)

    def gemm_start(self, spec, streamed: Optional[bool], out: Optional[np.ndarray],
                   timeout: Optional[float], on_done) -> "NativeCall":
        """gemm() without waiting: returns at once, and on_done((C, GemmInfo), None) or
        on_done(None, NativeRpcError) runs later, once, on a library thread (on this one when the
        GEMM is refused at once). It must not block. Raises NativeRpcError (and on_done never
        runs) when the library refuses the GEMM before sending it."""
        options = self._gemm_options(spec, _mode(streamed), timeout)
        buffer = np.empty(spec.c_bytes, dtype=np.uint8) if out is None else out
        c = out if out is not None else spec.c_array(buffer)

        def done(info, err):
            if err is not None:
                on_done(None, err)
            else:  # a bf16 C is widened now: c_array copies it
                on_done((spec.c_array(buffer) if spec.c_dtype == "bf16" else c, info), None)
        key = _in_flight.add(done, (spec, buffer))
        try:
            call = self._checked(self._lib.hgemm_gemm_async, self._client, options, spec.m,
                                 spec.n, spec.k, *_operand(spec.a), *_operand(spec.b),
                                 buffer.ctypes.data, buffer.nbytes, _on_gemm_done, key)
        except BaseException:
            _in_flight.pop(key)  # refused: done never runs
            raise
        finally:
            self._lib.hgemm_gemm_options_destroy(options)
        return NativeCall(self._lib, call)

    def gemm_keep_c(self, spec, streamed: Optional[bool], timeout: Optional[float]):
        """(MatrixInfo of the C kept on the server, GemmInfo) of a Spec with keep_c."""
        options = self._gemm_options(spec, _mode(streamed), timeout)
        info, c_info = GemmInfo(), MatrixInfo()
        try:
            handle = self._checked(self._lib.hgemm_gemm_keep_c, self._client, options, spec.m,
                                   spec.n, spec.k, *_operand(spec.a), *_operand(spec.b),
                                   spec.c_ttl, ctypes.byref(info), ctypes.byref(c_info))
            _read_check(self._lib, info)
        finally:
            self._lib.hgemm_gemm_options_destroy(options)
        return self._matrix_info(handle, c_info, "", spec.c_dtype), info

    def gemm_keep_c_start(self, spec, streamed: Optional[bool], timeout: Optional[float],
                          on_done) -> "NativeCall":
        """gemm_keep_c() without waiting (hgemm_gemm_keep_c_async): on_done((MatrixInfo of the
        kept C, GemmInfo), None) or on_done(None, NativeRpcError) runs later, once, as
        gemm_start's. Raises NativeRpcError (on_done never runs) when refused before sending."""
        options = self._gemm_options(spec, _mode(streamed), timeout)

        def done(result, err):
            if err is not None:
                on_done(None, err)
            else:
                info, handle, c_info = result
                on_done((_matrix_info_of(handle, c_info, "", spec.c_dtype), info), None)
        key = _in_flight.add(done, spec)
        try:
            call = self._checked(self._lib.hgemm_gemm_keep_c_async, self._client, options,
                                 spec.m, spec.n, spec.k, *_operand(spec.a), *_operand(spec.b),
                                 spec.c_ttl, _on_keep_c_done, key)
        except BaseException:
            _in_flight.pop(key)  # refused: done never runs
            raise
        finally:
            self._lib.hgemm_gemm_options_destroy(options)
        return NativeCall(self._lib, call)

    def _matrix_info(self, handle, info: MatrixInfo, label: str, dtype: str) -> pb.MatrixInfo:
        """_matrix_info_of a handle the library returned (freed here)."""
        try:
            text = ctypes.string_at(handle).decode()
        finally:
            self._lib.hgemm_free(handle)
        return _matrix_info_of(text, info, label, dtype)


    def open_stream(self, replica: str) -> "NativeStream":
        stream = NativeStream(self, replica)
        self._streams.add(stream)
        return stream

    def batch(self, specs: dict) -> "NativeBatch":
        """A NativeBatch of these GEMMs (none with keep_c), by their ids."""
        return NativeBatch(self, specs)

    def upload(self, array: np.ndarray, dtype: str, device_id: Optional[int], ttl: int,
               label: str, replica: str, timeout: Optional[float]) -> pb.MatrixInfo:
        """Uploads a C-contiguous 2-byte matrix of `dtype` ("fp16" or "bf16"), sent from the
        array's memory; its MatrixInfo."""
        options = self._call_options(timeout, replica)
        info = MatrixInfo()
        try:
            handle = self._checked(self._lib.hgemm_upload_typed, self._client, options,
                                   array.shape[0], array.shape[1], _DTYPES[dtype],
                                   -1 if device_id is None else device_id, array.ctypes.data,
                                   array.nbytes, int(ttl), label.encode(), ctypes.byref(info))
        finally:
            self._lib.hgemm_call_options_destroy(options)
        return self._matrix_info(handle, info, label, dtype)

    def upload_start(self, array: np.ndarray, dtype: str, device_id: Optional[int], ttl: int,
                     label: str, replica: str, timeout: Optional[float],
                     on_done) -> "NativeCall":
        """upload() without blocking: the array stays alive until on_done has run."""
        def read(result):
            info = MatrixInfo()
            self._lib.hgemm_result_matrix_info(result, ctypes.byref(info))
            return self._matrix_info(self._lib.hgemm_result_take_string(result), info, label,
                                     dtype)
        return self._call_start(self._lib.hgemm_upload_start,
                                (array.shape[0], array.shape[1], _DTYPES[dtype],
                                 -1 if device_id is None else device_id, array.ctypes.data,
                                 array.nbytes, int(ttl), label.encode()), timeout, replica, read,
                                array, on_done)

    def download_start(self, handle: str, into: np.ndarray, timeout: Optional[float],
                       on_done) -> "NativeCall":
        """download() without blocking: `into` stays alive until on_done has run."""
        return self._call_start(self._lib.hgemm_download_start,
                                (handle.encode(), 0, 0, into.ctypes.data, into.nbytes), timeout,
                                "", self._lib.hgemm_result_value, into, on_done)

    def download(self, handle: str, into: np.ndarray, timeout: Optional[float]) -> int:
        """The resident matrix's bytes written into `into` (a C-contiguous uint8 array, its
        size); returns the bytes written."""
        options = self._call_options(timeout)
        try:
            return self._checked(self._lib.hgemm_download, self._client, options, handle.encode(),
                                 0, 0, into.ctypes.data, into.nbytes)
        finally:
            self._lib.hgemm_call_options_destroy(options)

    def matrices(self, replica: str, timeout: Optional[float]) -> pb.ListMatricesResponse:
        """ListMatrices of `replica` ("": balanced), as the server's response but for the fields
        the C ABI does not carry (owner, missing_bytes, transient)."""
        options = self._call_options(timeout, replica)
        try:
            listed = self._checked(self._lib.hgemm_list_matrices, self._client, options)
        finally:
            self._lib.hgemm_call_options_destroy(options)
        return self._matrix_list(listed)

    def matrices_start(self, replica: str, timeout: Optional[float], on_done) -> "NativeCall":
        """matrices() without blocking (hgemm_list_matrices_start)."""
        return self._call_start(self._lib.hgemm_list_matrices_start, (), timeout, replica,
                                lambda r: self._matrix_list(
                                    self._lib.hgemm_result_take_matrix_list(r)), None, on_done)

    def _matrix_list(self, listed) -> pb.ListMatricesResponse:
        """The response of an hgemm_matrix_list_t (freed here)."""
        lib = self._lib
        try:
            response = pb.ListMatricesResponse(
                client_bytes=lib.hgemm_matrix_list_client_bytes(listed),
                quota_bytes=lib.hgemm_matrix_list_quota_bytes(listed))
            for i in range(lib.hgemm_matrix_list_size(listed)):
                info = MatrixInfo()
                lib.hgemm_matrix_list_info(listed, i, ctypes.byref(info))
                response.matrices.add(
                    handle=lib.hgemm_matrix_list_handle(listed, i).decode(), rows=info.rows,
                    cols=info.cols, bytes=info.bytes, device_id=info.device_id,
                    ttl_seconds=info.ttl_seconds,
                    label=lib.hgemm_matrix_list_label(listed, i).decode(),
                    replica=lib.hgemm_matrix_list_replica(listed, i).decode(),
                    dtype=lib.hgemm_matrix_list_dtype(listed, i),
                    age_seconds=lib.hgemm_matrix_list_age_seconds(listed, i),
                    idle_seconds=lib.hgemm_matrix_list_idle_seconds(listed, i))
            return response
        finally:
            lib.hgemm_matrix_list_destroy(listed)

    def server_info(self, replica: str, timeout: Optional[float]) -> pb.ServerInfo:
        """GetServerInfo of `replica` ("": balanced)."""
        return self._json_call(self._lib.hgemm_server_info_json, pb.ServerInfo(), replica,
                               timeout)

    def server_info_start(self, replica: str, timeout: Optional[float], on_done) -> "NativeCall":
        return self._call_start(self._lib.hgemm_server_info_json_start, (), timeout, replica,
                                lambda r: self._json_of(self._lib.hgemm_result_take_string(r),
                                                        pb.ServerInfo()), None, on_done)

    def kernels(self, timeout: Optional[float]) -> pb.ListKernelsResponse:
        return self._json_call(self._lib.hgemm_list_kernels_json, pb.ListKernelsResponse(), "",
                               timeout)

    def kernels_start(self, timeout: Optional[float], on_done) -> "NativeCall":
        return self._call_start(self._lib.hgemm_list_kernels_json_start, (), timeout, "",
                                lambda r: self._json_of(self._lib.hgemm_result_take_string(r),
                                                        pb.ListKernelsResponse()), None, on_done)

    def _call_start(self, start_fn, args: tuple, timeout: Optional[float], replica: str, read,
                    keep, on_done) -> "NativeCall":
        """_start of a call taking (client, call options, *args) (the options are copied)."""
        options = self._call_options(timeout, replica)
        try:
            return self._start(start_fn, (self._client, options) + args, read, keep, on_done)
        finally:
            self._lib.hgemm_call_options_destroy(options)

    def _json_call(self, fn, message, replica: str, timeout: Optional[float]):
        """`message` filled from the JSON fn returns (C ABI revision 5; keys of fields newer
        than this module's proto are ignored)."""
        options = self._call_options(timeout, replica)
        try:
            text = self._checked(fn, self._client, options)
        finally:
            self._lib.hgemm_call_options_destroy(options)
        return self._json_of(text, message)

    def _json_of(self, text, message):
        """`message` filled from JSON the library returned (freed here)."""
        try:
            return json_format.Parse(ctypes.string_at(text).decode(), message,
                                     ignore_unknown_fields=True)
        finally:
            self._lib.hgemm_free(text)

    def release(self, handle: str, timeout: Optional[float]) -> int:
        """The bytes the server freed."""
        options = self._call_options(timeout)
        try:
            return self._checked(self._lib.hgemm_release, self._client, options, handle.encode())
        finally:
            self._lib.hgemm_call_options_destroy(options)

    def release_start(self, handle: str, timeout: Optional[float], on_done) -> "NativeCall":
        return self._call_start(self._lib.hgemm_release_start, (handle.encode(),), timeout, "",
                                self._lib.hgemm_result_value, None, on_done)


def _ring_entry_fits(spec, refs: dict) -> bool:
    """Whether a ring entry says all of this GEMM: A and B in regions, C too or kept (with the
    server's default TTL), no C input, one GEMM, and no request id (a completion echoes
    none)."""
    if spec.keep_c:
        c_fits = "c" not in refs and not spec.c_ttl
    else:
        c_fits = "c" in refs
    return (c_fits and "a" in refs and "b" in refs and spec.c_in is None
            and not spec.c_in_handle and spec.batch <= 1 and not spec.options.request_id)


class PreparedNative:
    """One GEMM's native-core arguments made once (its options, with the regions it names, and
    the operands' pointers), run as often as asked: each run() is one hgemm_ring_gemm or
    hgemm_gemm call that reads the operands' memory as it is then. Thread safety: run() from
    many threads at once (the options are only read; runs sharing an `out` write C into it
    alike); close() once no run is in progress."""

    def __init__(self, native: NativeClient, spec, refs: dict, out: Optional[np.ndarray],
                 mode: int, use_ring: bool, timeout: Optional[float]):
        self._native, self._spec, self._out = native, spec, out
        self._options, self._ring_regions = None, None
        # C's (pointer, bytes): None for a new array each run; (None, 0) when C goes into its
        # region.
        self._c = ((None, 0) if "c" in refs else
                   None if out is None else (out.ctypes.data, out.nbytes))
        self._options = native._regions_options(spec, refs, timeout,
                                                MODE_UNARY if refs else mode)
        if use_ring and native._rings is not None and _ring_entry_fits(spec, refs):
            self._ring_regions = frozenset(refs[name].region for name in ("a", "b", "c"))
        self._args = _operand_args(spec, refs)

    def run(self):
        """(C, GemmInfo): C is `out` (C written there, or into its region: `out` is a shared
        buffer) or a new array as gemm() returns it. A GEMM the ring cannot take now
        (UNAVAILABLE) goes as a Gemm call. Raises NativeRpcError."""
        native = self._native
        if self._ring_regions is not None:
            done = native._ring_run(self._spec, self._ring_regions, self._options)
            if done is not None:
                return self._out, done[1]
        info = GemmInfo()
        if self._c is not None:
            native._checked(native._lib.hgemm_gemm, native._client, self._options, *self._args,
                            *self._c, ctypes.byref(info))
            return self._out, _read_check(native._lib, info)
        buffer = np.empty(self._spec.c_bytes, dtype=np.uint8)
        native._checked(native._lib.hgemm_gemm, native._client, self._options, *self._args,
                        buffer.ctypes.data, buffer.nbytes, ctypes.byref(info))
        return self._spec.c_array(buffer), info

    def close(self) -> None:
        options, self._options = self._options, None
        if options:
            self._native._lib.hgemm_gemm_options_destroy(options)

    def __del__(self):
        self.close()


class _Ring:
    """One hgemm_ring_t, binding `bound` (region handles). users and retired: _Rings's, under
    its lock."""

    def __init__(self, native: NativeClient, bound: frozenset):
        handles = [handle.encode() for handle in sorted(bound)]
        self._native, self._lib = native, native._lib
        self.bound, self.users, self.retired, self.ended = bound, 0, False, False
        self.ring = native._checked(native._lib.hgemm_ring_open, native._client, None,
                                    (ctypes.c_char_p * len(handles))(*handles), len(handles),
                                    None, 0, 0)
        self.region = native._lib.hgemm_ring_region(self.ring).decode()

    def bind(self, regions: frozenset) -> None:
        """Binds more regions to the open ring (hgemm_ring_bind); raises NativeRpcError."""
        handles = [handle.encode() for handle in sorted(regions - self.bound)]
        self._native._checked(self._lib.hgemm_ring_bind, self.ring,
                              (ctypes.c_char_p * len(handles))(*handles), len(handles), None, 0)
        self.bound = self.bound | regions

    def drain(self) -> None:
        _, err = self._native._status(self._lib.hgemm_ring_drain, self.ring)
        if err is not None and err.code() != _errors.StatusCode.UNAVAILABLE:
            raise err  # an ended ring has nothing left to wait for

    def close(self) -> None:
        ring, self.ring = self.ring, None
        if ring:
            self._lib.hgemm_ring_close(ring)


class _Rings:
    """A NativeClient's submission ring, shared by all its threads and opened at first use. A
    GEMM naming a region the ring lacks binds it to the open ring (hgemm_ring_bind, up to
    MAX_BOUND); past that, or if the bind fails, it opens another binding both (or the GEMM's
    alone); the old one is closed once its last GEMM is over. A ring that ends (UNAVAILABLE) is
    retired: the next GEMM opens a new one, or goes as a Gemm call if that is refused. A server
    that refuses rings for good (none over TCP, shared memory not allowed, a server without
    AttachRing) is not asked again. Thread-safe."""

    MAX_BOUND = 64
    _REFUSED_FOR_GOOD = (_errors.StatusCode.PERMISSION_DENIED,
                         _errors.StatusCode.FAILED_PRECONDITION,
                         _errors.StatusCode.UNIMPLEMENTED)

    def __init__(self, native: NativeClient):
        self._native = native
        self._lock = threading.Lock()
        self._ring = None  # the _Ring new GEMMs take
        self._open = set()  # every _Ring not closed yet: the current one and retired ones in use
        self.refused = None  # the NativeRpcError that turned rings off

    def acquire(self, regions: frozenset) -> Optional[_Ring]:
        """The ring for a GEMM naming `regions` (give it back with release), or None when no ring
        can be had (the GEMM goes as a Gemm call)."""
        with self._lock:
            if self.refused is not None:
                return None
            ring = self._ring
            if ring is not None and not regions <= ring.bound and \
                    len(ring.bound | regions) <= self.MAX_BOUND:
                try:
                    ring.bind(regions)
                except NativeRpcError:
                    pass  # a new ring binds them below
            if ring is None or not regions <= ring.bound:
                bound = regions if ring is None else ring.bound | regions
                try:
                    fresh = _Ring(self._native,
                                  bound if len(bound) <= self.MAX_BOUND else regions)
                except NativeRpcError as e:
                    if e.code() in self._REFUSED_FOR_GOOD:
                        self.refused = e
                    # else (e.g. RESOURCE_EXHAUSTED: too many rings) this GEMM only
                    _ring_fell_back(e.details(), first=self.refused is e)
                    return None
                self._retire_locked()
                self._ring = ring = fresh
                self._open.add(fresh)
            ring.users += 1
            return ring

    def release(self, ring: _Ring, retire: bool) -> None:
        """A GEMM is over with `ring`; retire: new GEMMs open another."""
        with self._lock:
            ring.users -= 1
            if retire and ring is self._ring:
                self._retire_locked()
            elif ring.retired and ring.users == 0:
                self._close_locked(ring)

    def close(self) -> None:
        with self._lock:
            self._retire_locked()

    def ended(self, ring: _Ring) -> bool:
        """Marks `ring` ended; whether this is the first GEMM to find it so."""
        with self._lock:
            first, ring.ended = not ring.ended, True
            return first

    def drain(self) -> None:
        """ring_drain() of every ring still open."""
        with self._lock:
            rings = list(self._open)
            for ring in rings:
                ring.users += 1  # not closed under the drain
        try:
            for ring in rings:
                ring.drain()
        finally:
            for ring in rings:
                self.release(ring, retire=False)

    def regions(self) -> set:
        """The handles of the rings' own regions (the client's, but not its buffers)."""
        with self._lock:
            return {ring.region for ring in self._open}

    def _retire_locked(self) -> None:
        ring, self._ring = self._ring, None
        if ring is not None:
            ring.retired = True
            if ring.users == 0:
                self._close_locked(ring)

    def _close_locked(self, ring: _Ring) -> None:
        self._open.discard(ring)
        ring.close()


class _RegionMemory:
    """An hgemm_region_t's memory as numpy sees it (__array_interface__): the arrays over it
    keep this alive, and the last one gone frees the region here (hgemm_region_destroy), so
    that no array outlives the mapping."""

    def __init__(self, lib, region):
        self._lib, self._region = lib, region
        self.__array_interface__ = {
            "shape": (lib.hgemm_region_bytes(region),), "typestr": "|u1", "version": 3,
            "data": (lib.hgemm_region_data(region), False)}

    def __del__(self):
        self._lib.hgemm_region_destroy(self._region)


class NativeRegion(_shm.MappedRegion):
    """A region the native core made and registered (hgemm_region_t): its memory stays mapped
    as long as arrays over it live, unregistered or not."""

    def __init__(self, lib, region, label: str):
        memory = _RegionMemory(lib, region)  # owns the region from here
        super().__init__(np.asarray(memory), label, lib.hgemm_region_handle(region).decode())


class NativeCall:
    """The handle of an asynchronous GEMM (hgemm_call_t): cancel() it while it runs, close()
    it when done. Thread safety: one owner (the task awaiting it)."""

    def __init__(self, lib, call):
        self._lib, self._call = lib, call

    def cancel(self) -> None:
        """Its on_done soon gets CANCELLED if it is not over yet."""
        if self._call:
            self._lib.hgemm_call_cancel(self._call)

    def close(self) -> None:
        call, self._call = self._call, None
        if call:
            self._lib.hgemm_call_destroy(call)


class _ChainedCall:
    """NativeCall's methods over a chain of calls, one after the other (a ring GEMM, then the
    Gemm call it falls back to): cancel() cancels the current one and any started after it.
    Thread safety: then() on a completion thread, cancel() and close() on the owner's."""

    def __init__(self):
        self._lock = threading.Lock()
        self._calls = []
        self._cancelled = False
        self._closed = False

    def then(self, start) -> None:
        """start() (a NativeCall) is the chain's current call."""
        call = start()
        with self._lock:
            cancelled, closed = self._cancelled, self._closed
            if not closed:
                self._calls.append(call)
        if cancelled:
            call.cancel()
        if closed:
            call.close()

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            calls = list(self._calls)
        for call in calls:
            call.cancel()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            calls, self._calls = self._calls, []
        for call in calls:
            call.close()


class NativeBatch:
    """gemm_many's GEMMs in an hgemm_batch_t (C ABI revision 2), each with a C buffer of its
    own (or kept on the server: keep_c, revision 3): run() sends some of them on a GemmStream
    per replica (blocking, the GIL released), outcome() reads what came of each, as a
    StreamCollector does. Thread safety: one thread at a time (a gemm_many call owns it), but
    close() may come while run() goes on in the native client's pool (an asyncio gemm_many
    cancelled): the batch is freed once run() is over."""

    def __init__(self, native: NativeClient, specs: dict):
        self._native, self._lib = native, native._lib
        self.specs = specs
        self.protocol_error = None  # StreamCollector's; the C++ core folds it into run()'s error
        self._buffers = {i: np.empty(spec.c_bytes, dtype=np.uint8) for i, spec in specs.items()
                         if not spec.keep_c}
        self._index: Dict[int, int] = {}  # spec id → the GEMM's index in the batch
        self._lock = threading.Lock()  # _running and _closed, against run() on another thread
        self._running = False
        self._closed = False
        self._batch = self._lib.hgemm_batch_create()
        try:
            for i, spec in specs.items():
                options = native._gemm_options(spec)
                try:
                    gemm = (spec.m, spec.n, spec.k, *_operand(spec.a), *_operand(spec.b))
                    if spec.keep_c:
                        self._index[i] = native._checked(
                            self._lib.hgemm_batch_add_keep_c, self._batch, options, *gemm,
                            spec.c_ttl)
                    else:
                        buffer = self._buffers[i]
                        self._index[i] = native._checked(
                            self._lib.hgemm_batch_add, self._batch, options, *gemm,
                            buffer.ctypes.data, buffer.nbytes)
                finally:
                    self._lib.hgemm_gemm_options_destroy(options)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._running:  # run()'s end frees it
                return
            batch, self._batch = self._batch, None
        if batch:
            self._lib.hgemm_batch_destroy(batch)

    def run(self, ids: Sequence[int], replica: str, timeout: Optional[float]) -> None:
        """Sends the GEMMs `ids` (on one stream when they name no two replicas) and waits for
        their answers. Raises the stream's NativeRpcError if it failed, a "gemm_id I: " in its
        message naming the spec id I of the GEMM it ended at (as culprit_of reads it)."""
        indices = (ctypes.c_size_t * len(ids))(*(self._index[i] for i in ids))
        options = self._native._call_options(timeout, replica)
        with self._lock:
            self._running = True
        try:
            _, err = self._native._status(self._lib.hgemm_gemm_many, self._native._client,
                                          self._batch, options, indices, len(ids))
        finally:
            self._lib.hgemm_call_options_destroy(options)
            with self._lock:
                self._running = False
            if self._closed:
                self.close()
        if err is not None:
            raise self._named(err, ids)

    def run_start(self, ids: Sequence[int], replica: str, timeout: Optional[float],
                  on_done) -> "NativeCall":
        """run() without blocking (hgemm_gemm_many_start): on_done(None, None) once every GEMM
        is read with outcome(), or on_done(None, the stream's NativeRpcError) as run() raises
        it. The batch is freed after close() once on_done has run."""
        indices = (ctypes.c_size_t * len(ids))(*(self._index[i] for i in ids))
        options = self._native._call_options(timeout, replica)
        with self._lock:
            self._running = True

        def done(result, err):
            with self._lock:
                self._running = False
            if self._closed:
                self.close()
            on_done(result, None if err is None else self._named(err, ids))
        try:
            return self._native._start(self._lib.hgemm_gemm_many_start,
                                       (self._native._client, self._batch, options, indices,
                                        len(ids)), lambda r: None, indices, done)
        except BaseException:
            with self._lock:
                self._running = False
            raise
        finally:
            self._lib.hgemm_call_options_destroy(options)

    @staticmethod
    def _named(err, ids: Sequence[int]):
        """The stream's error, its "gemm_id I: " (a place in `ids`) naming spec id ids[I] (as
        culprit_of reads it)."""
        m = _GEMM_ID.match(err.details())
        if m and int(m.group(1)) < len(ids):
            return NativeRpcError(err.code(), f"gemm_id {ids[int(m.group(1))]}: "
                                              f"{err.details()[m.end():]}", err.rpc_status)
        return err

    def outcome(self, i: int):
        """StreamCollector.outcome's: None while unanswered; an Error; or (C, a GemmDone)."""
        info = GemmInfo()
        answered, err = self._native._status(self._lib.hgemm_batch_result, self._batch,
                                             self._index[i], ctypes.byref(info))
        _read_check(self._lib, info)
        if not answered:
            return None
        if err is not None:
            return _errors.from_rpc_error(err, index=i)
        spec = self.specs[i]
        if not spec.keep_c:
            return spec.c_array(self._buffers[i]), _LazyGemmDone(info)
        c_info = MatrixInfo()
        handle = self._lib.hgemm_batch_c_handle(self._batch, self._index[i], ctypes.byref(c_info))
        if not handle:
            return _errors.Internal("the server kept no C (keep_c_resident ignored?)", index=i)
        return None, _LazyGemmDone(info, self._native._matrix_info(handle, c_info, "",
                                                                   spec.c_dtype))


class NativeStream:
    """One persistent GemmStream of the native core (hgemm_stream_t): hgemm.Stream's call and
    request queue. submit() hands a GEMM to the stream's writer thread (A and B copied, C's
    buffer made here), next() waits for the next answer (the GIL released), put_nowait(None)
    half-closes (StreamSession's end of the requests), cancel() ends it, close() frees it once
    it is over. Thread safety: submit, put_nowait and cancel from any thread; next from one
    (the session's reader) at a time; close after next has said the stream is over."""

    def __init__(self, native: NativeClient, replica: str):
        self._native, self._lib = native, native._lib
        self._lock = threading.Lock()  # the handle against close()
        self._c: Dict[int, tuple] = {}  # gemm_id → (Spec, C's buffer), until answered
        options = native._call_options(None, replica)  # no deadline: the stream lives on
        try:
            self._stream = native._checked(self._lib.hgemm_stream_open, native._client, options)
        finally:
            self._lib.hgemm_call_options_destroy(options)
        self.end = None  # once next() returned None: the stream's NativeRpcError, if it failed
        self._ending = False  # half-closed or cancelled

    def submit(self, gemm_id: int, spec) -> None:
        """Sends a GEMM tagged gemm_id, A and B from spec's arrays themselves (borrowed: spec is
        kept with its C's buffer until the answer is read or the stream is destroyed; the arrays
        must not change meanwhile, as Stream.submit documents). Raises NativeRpcError if the
        library refuses it; a GEMM submitted as the stream ends is left to the stream's end
        (never answered)."""
        buffer = None if spec.keep_c else np.empty(spec.c_bytes, dtype=np.uint8)
        options = self._native._gemm_options(spec)
        try:
            with self._lock:
                self._c[gemm_id] = (spec, buffer)
                _, err = self._native._status(
                    self._lib.hgemm_stream_submit_borrowed, self._stream, gemm_id, options,
                    spec.m, spec.n, spec.k, *_operand(spec.a), *_operand(spec.b),
                    None if buffer is None else buffer.ctypes.data,
                    0 if buffer is None else buffer.nbytes, int(spec.keep_c), spec.c_ttl)
                if err is not None and err.code() != _errors.StatusCode.FAILED_PRECONDITION:
                    del self._c[gemm_id]
                    raise err
        finally:
            self._lib.hgemm_gemm_options_destroy(options)

    def next(self):
        """(gemm_id, outcome) of the next answer, the outcome an hgemm.Error or (C or None for a
        kept C, a GemmDone); None once the stream is over (self.end says how)."""
        gemm_id, info = ctypes.c_uint64(0), GemmInfo()
        c_handle, c_info = ctypes.c_void_p(None), MatrixInfo()
        answered, err = self._native._status(self._lib.hgemm_stream_next, self._stream,
                                             ctypes.byref(gemm_id), ctypes.byref(info),
                                             ctypes.byref(c_handle), ctypes.byref(c_info))
        _read_check(self._lib, info)
        if not answered:
            self.end = err
            return None
        return self._answer(gemm_id.value, err, info, c_handle.value, c_info)

    def _answer(self, gemm_id: int, err, info: GemmInfo, c_handle, c_info: MatrixInfo):
        """next()'s (gemm_id, outcome) of an answer (c_handle, the library's, freed here)."""
        with self._lock:
            spec, buffer = self._c.pop(gemm_id)
        if err is not None:
            return gemm_id, _errors.from_rpc_error(err)
        c_matrix = (self._native._matrix_info(c_handle, c_info, "", spec.c_dtype)
                    if c_handle else None)
        c = None if spec.keep_c else spec.c_array(buffer)
        return gemm_id, (c, _LazyGemmDone(info, c_matrix))

    def next_start(self, on_done) -> "NativeCall":
        """next() without blocking (hgemm_stream_next_start): on_done(what next() returns,
        None) on a completion thread of the core. Cancelling it cancels the stream."""
        def read(result, err):
            if not self._lib.hgemm_result_value(result):
                self.end = err
                return None
            info, c_info = GemmInfo(), MatrixInfo()
            self._lib.hgemm_result_gemm_info(result, ctypes.byref(info))
            _read_check(self._lib, info)
            self._lib.hgemm_result_matrix_info(result, ctypes.byref(c_info))
            return self._answer(self._lib.hgemm_result_gemm_id(result), err, info,
                                self._lib.hgemm_result_take_string(result), c_info)
        return self._native._start(self._lib.hgemm_stream_next_start,
                                   (self._native._client, self._stream), read, None, on_done,
                                   reads_errors=True)

    def put_nowait(self, item) -> None:
        """StreamSession's end of the requests (item None): half-closes the stream."""
        assert item is None, item
        with self._lock:
            self._ending = True
            if self._stream:
                self._lib.hgemm_stream_close(self._stream)

    def cancel(self) -> None:
        with self._lock:
            self._ending = True
            if self._stream:
                self._lib.hgemm_stream_cancel(self._stream)

    def wants_read(self) -> bool:
        """Whether a next() would end: GEMMs are unanswered, or the stream is closed or
        cancelled (its end comes). A next_start() holds a completion thread of the core until
        then, so the aio reader starts one only when this is True."""
        with self._lock:
            return bool(self._c) or self._ending

    def close(self) -> None:
        with self._lock:
            stream, self._stream = self._stream, None
        if stream:
            self._lib.hgemm_stream_destroy(stream)  # its writer done with borrowed operands
        with self._lock:
            self._c.clear()


class _LazyGemmDone:
    """The pb.GemmDone of a GemmInfo (and a kept C), made when first looked at: most results
    (no details=True) never are, and making one between GEMMs that move megabytes costs
    ~70 µs of cold caches (docs/results/cpu/python_stream_copies.md). Read-only."""
    __slots__ = ("_info", "_c_matrix", "_done")

    def __init__(self, info: GemmInfo, c_matrix: Optional[pb.MatrixInfo] = None):
        self._info, self._c_matrix, self._done = info, c_matrix, None

    def __getattr__(self, name):  # only for what is not a slot: the GemmDone's fields
        if self._done is None:
            self._done = _gemm_done(self._info, self._c_matrix)
        return getattr(self._done, name)


def _gemm_done(info: GemmInfo, c_matrix: Optional[pb.MatrixInfo] = None) -> pb.GemmDone:
    """The GemmDone a GemmInfo (and a kept C) stands for."""
    return pb.GemmDone(
        timing=pb.Timing(queue_wait_ms=info.queue_wait_ms,
                         host_to_device_ms=info.host_to_device_ms, kernel_ms=info.kernel_ms,
                         device_to_host_ms=info.device_to_host_ms,
                         server_total_ms=info.server_total_ms, tflops=info.tflops,
                         verify_ms=info.verify_ms),
        execution=pb.Execution(kernel=info.kernel.decode(), accumulation=info.accumulation,
                               backend=info.backend.decode(), device_id=info.device_id,
                               device_name=info.device_name.decode(), stream_id=info.stream_id,
                               verified_repetitions=info.verified_repetitions,
                               suspect_device_id=(info.suspect_device_id
                                                  if info.suspect_device_id >= 0 else None)),
        request_id=info.request_id.decode(), c_matrix=c_matrix)


def _gemm_info_of(lib, result) -> GemmInfo:
    """The GemmInfo of an hgemm_result_t."""
    info = GemmInfo()
    lib.hgemm_result_gemm_info(result, ctypes.byref(info))
    return _read_check(lib, info)


def _regions_c(spec, out: Optional[np.ndarray], buffer: Optional[np.ndarray]):
    """C of a GEMM naming regions: None when it went into its region, else as gemm returns it."""
    if buffer is None:
        return None
    return out if out is not None else spec.c_array(buffer)


def _group_problems(specs):
    """(hgemm_group_problem_t array, C buffers) of a group's specs."""
    buffers = [np.empty(spec.c_bytes, dtype=np.uint8) for spec in specs]
    problems = (GroupProblem * len(specs))()
    for problem, spec, buffer in zip(problems, specs, buffers):
        c_in = spec.c_in
        problem.m, problem.n, problem.k = spec.m, spec.n, spec.k
        problem.a, problem.a_bytes = _operand(spec.a)
        problem.b, problem.b_bytes = _operand(spec.b)
        if c_in is not None:
            problem.c_in, problem.c_in_bytes = c_in.ctypes.data, c_in.nbytes
        problem.c, problem.c_capacity = buffer.ctypes.data, buffer.nbytes
    return problems, buffers


def _operand_args(spec, refs: dict) -> tuple:
    """hgemm_gemm's m, n, k, a and b arguments of a Spec: (NULL, 0) for an operand in its
    region (refs), else its array's memory."""
    a = (None, 0) if "a" in refs else _operand(spec.a)
    b = (None, 0) if "b" in refs else _operand(spec.b)
    return (spec.m, spec.n, spec.k, *a, *b)


def _operand(operand):
    """(pointer, bytes) of an Operand: its array's memory, or (None, 0) for a handle."""
    if operand.array is None:
        return None, 0
    return operand.array.ctypes.data, operand.array.nbytes


def _matrix_info_of(handle: str, info: MatrixInfo, label: str, dtype: str) -> pb.MatrixInfo:
    """A MatrixInfo of a handle and its hgemm_matrix_info_t (the server's, but for the fields the
    C ABI does not carry: age, idle time, owner)."""
    return pb.MatrixInfo(handle=handle, rows=info.rows, cols=info.cols, bytes=info.bytes,
                         device_id=info.device_id, ttl_seconds=info.ttl_seconds, label=label,
                         replica=handle_replica(handle), dtype=_DTYPES[dtype])

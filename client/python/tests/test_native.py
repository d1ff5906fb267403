"""The choice of core (hgemm.info(), $HGEMM_TRANSPORT, $HGEMM_NATIVE_LIB) and what only the
native core does. The rest of the suite runs against both cores (tools/test_python.sh)."""
import os
import subprocess
import sys
import urllib.request

import numpy as np
import pytest

import hgemm
from conftest import FP32_TOLERANCE, Server, fp16, free_port, rel_error

_INFO = "import hgemm, json; print(json.dumps(hgemm.info()))"


def _info_in_child(**env) -> dict:
    import json
    out = subprocess.run([sys.executable, "-c", _INFO], env={**os.environ, **env},
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_info_reports_the_core_new_clients_use(server):
    info = hgemm.info()
    assert info["core"] in ("native", "grpcio")
    with hgemm.Client(server.address) as c:
        assert (c._calls.native is not None) == (info["core"] == "native")
    if info["core"] == "native":
        assert info["abi_version"] == 1 and os.path.exists(info["library"])
        assert info["reason"] is None
    else:
        assert info["library"] is None and info["reason"]


def test_grpcio_is_the_fallback_when_the_library_is_missing():
    info = _info_in_child(HGEMM_TRANSPORT="auto", HGEMM_NATIVE_LIB="/nonexistent/libhgemm.so")
    assert info["core"] == "grpcio"
    assert "/nonexistent/libhgemm.so" in info["reason"]
    assert _info_in_child(HGEMM_TRANSPORT="grpcio")["core"] == "grpcio"


def test_a_library_that_is_not_hgemms_is_reported():
    import ctypes.util
    info = _info_in_child(HGEMM_TRANSPORT="auto", HGEMM_NATIVE_LIB=ctypes.util.find_library("c"))
    assert info["core"] == "grpcio" and "no hgemm_abi_version" in info["reason"]


def test_forcing_native_without_the_library_raises():
    code = "import hgemm; hgemm.Client('127.0.0.1:1')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "HGEMM_TRANSPORT": "native",
                              "HGEMM_NATIVE_LIB": "/nonexistent/libhgemm.so"})
    assert out.returncode != 0 and "OSError" in out.stderr, out.stderr


def test_channel_options_keep_a_client_on_grpcio(server):
    with hgemm.Client(server.address, channel_options=[("grpc.enable_retries", 0)]) as c:
        assert c._calls.native is None


def test_native_threads_share_one_client(server, rng):
    if hgemm.info()["core"] != "native":
        pytest.skip("the native core is not in use: " + str(hgemm.info()["reason"]))
    import concurrent.futures
    pairs = [(fp16(rng, 96 + i, 64), fp16(rng, 64, 80)) for i in range(16)]
    with hgemm.Client(server.address, timeout=60) as c, \
            concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda p: c.gemm(*p, mode="stream" if p[0].shape[0] % 2 else
                                                   "unary"), pairs))
    for (a, b), out in zip(pairs, results):
        assert out.dtype == np.float16 and not out.flags.writeable
        assert rel_error(out, a, b) < FP32_TOLERANCE


def _native_client(address, **options):
    """A native-core client whose grpcio GEMM methods fail: what passes went through the C ABI."""
    if hgemm.info()["core"] != "native":
        pytest.skip("the native core is not in use: " + str(hgemm.info()["reason"]))
    c = hgemm.Client(address, **options)

    def refuse(*args, **kwargs):
        raise AssertionError("a GEMM went through grpcio")
    c._stub.Gemm = c._stub.GemmStream = refuse
    return c


def _error64(c, a, b) -> float:
    ref = a.astype(np.float64) @ b.astype(np.float64)
    return float(np.linalg.norm(c.astype(np.float64) - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("mode", ["unary", "stream"])
def test_native_core_sends_transposed_views_as_stored_with_either_c(server, rng, mode):
    m, n, k = 37, 29, 53
    with _native_client(server.address, timeout=60) as c:
        for ta in (False, True):
            for tb in (False, True):
                a = fp16(rng, k, m).T if ta else fp16(rng, m, k)
                b = fp16(rng, n, k).T if tb else fp16(rng, k, n)
                out = np.full((m, n), np.nan, dtype=np.float16)
                assert c.gemm(a, b, mode=mode, out=out) is out
                assert _error64(out, a, b) < FP32_TOLERANCE, (ta, tb)
                c32 = c.gemm(a, b, mode=mode, c_dtype="fp32", details=True)
                assert c32.c.dtype == np.float32 and c32.c.shape == (m, n)
                assert c32.execution.backend == "cpu"
                assert _error64(c32.c, a, b) < 1e-5, (ta, tb)


def _as_bf16(rng, rows, cols):
    """(bf16 bit patterns as uint16, the same values as float32): random values in [-1, 1)."""
    bits = (rng.uniform(-1, 1, (rows, cols)).astype(np.float32).view(np.uint32) >> 16)
    bits = bits.astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("c_dtype", [None, "fp32"])
def test_native_core_computes_bf16(server, rng, c_dtype):
    # Without torch or ml_dtypes here, a Spec of fp16 arrays is given bf16 operands in place.
    from hgemm._spec import Spec
    a_bits, a = _as_bf16(rng, 41, 30)
    w_bits, w = _as_bf16(rng, 19, 30)  # B = wᵀ, stored n×k
    spec = Spec(fp16(rng, 41, 30), fp16(rng, 19, 30).T, c_dtype=c_dtype)
    spec.a.array, spec.b.array = a_bits, w_bits
    spec.a.dtype = spec.b.dtype = spec.dtype = "bf16"
    spec.c_dtype = c_dtype or "bf16"
    with _native_client(server.address, timeout=60) as client:
        for streamed in (False, True):
            c, info = client._calls.native.gemm(spec, streamed, None, 60)
            assert c.dtype == np.float32 and c.shape == (41, 19) and info.streamed == streamed
            # A bf16 C carries 8 significant bits.
            assert _error64(c, a, w.T) < (1e-5 if c_dtype else 4e-3)


def test_native_gemm_many_mixes_layouts_types_and_failures(server, rng):
    a, w = fp16(rng, 8, 12), fp16(rng, 6, 12)
    pairs = [(a, w.T), (a, np.ascontiguousarray(w.T), {"c_dtype": "fp32"}),
             (w, a.T, {"kernel": "no-such-kernel"}), (fp16(rng, 12, 5).T, fp16(rng, 12, 7))]
    with _native_client(server.address, timeout=60) as c:
        results = c.gemm_many(pairs, return_exceptions=True, details=True)
    assert _error64(results[0].c, a, w.T) < FP32_TOLERANCE
    assert results[1].c.dtype == np.float32 and _error64(results[1].c, a, w.T) < 1e-5
    assert isinstance(results[2], hgemm.InvalidArgument) and results[2].index == 2
    assert "no-such-kernel" in str(results[2])
    assert _error64(results[3].c, pairs[3][0], pairs[3][1]) < FP32_TOLERANCE
    assert all(r.execution.backend == "cpu" for i, r in enumerate(results) if i != 2)


def test_native_gemm_many_from_threads(server, rng):
    import concurrent.futures
    batches = [[(fp16(rng, 24 + i, 40), fp16(rng, 40, 16 + j)) for j in range(6)]
               for i in range(8)]
    with _native_client(server.address, timeout=60) as c, \
            concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(c.gemm_many, batches))
    for pairs, cs in zip(batches, results):
        for (a, b), out in zip(pairs, cs):
            assert rel_error(out, a, b) < FP32_TOLERANCE


def _native_aio_client(address, **options):
    """As _native_client, an hgemm.aio.Client."""
    if hgemm.info()["core"] != "native":
        pytest.skip("the native core is not in use: " + str(hgemm.info()["reason"]))
    from hgemm import aio
    c = aio.Client(address, **options)

    def refuse(*args, **kwargs):
        raise AssertionError("a GEMM went through grpcio")
    c._stub.Gemm = c._stub.GemmStream = refuse
    return c


def test_aio_gemms_complete_through_the_native_callback(server, rng):
    import asyncio
    import threading
    from hgemm import _native
    # A transposed view for odd i (sent as stored), fp32 C for every other pair.
    cases = [(fp16(rng, 33, 40 + i).T if i % 2 else fp16(rng, 40 + i, 33),
              fp16(rng, 33, 21 + i), ["unary", "stream"][i % 2], [None, "fp32"][i // 2 % 2])
             for i in range(16)]
    threads_before = threading.active_count()

    async def main():
        async with _native_aio_client(server.address, timeout=60) as c:
            return await asyncio.gather(*(c.gemm(a, b, mode=mode, c_dtype=c_dtype)
                                          for a, b, mode, c_dtype in cases))
    results = asyncio.run(main())
    for (a, b, _, c_dtype), c in zip(cases, results):
        assert c.dtype == (np.float32 if c_dtype else np.float16)
        assert _error64(c, a, b) < FP32_TOLERANCE
    assert threading.active_count() <= threads_before + 1  # no thread per call
    assert not _native._in_flight._calls  # every callback ran and let go of its buffers


def test_aio_native_errors_timeouts_and_cancellation(server, rng):
    import asyncio
    import socket
    from hgemm import _native
    silent = socket.socket()  # listens, never accepts: a call to it waits until cancelled
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    address = "127.0.0.1:%d" % silent.getsockname()[1]

    async def main():
        async with _native_aio_client(server.address, timeout=60) as c:
            with pytest.raises(hgemm.InvalidArgument, match="no-such-kernel"):
                await c.gemm(fp16(rng, 4, 4), fp16(rng, 4, 4), kernel="no-such-kernel")
        async with _native_aio_client(address, retries=1) as c:
            with pytest.raises(hgemm.DeadlineExceeded):
                await c.gemm(fp16(rng, 4, 4), fp16(rng, 4, 4), timeout=0.2)
            task = asyncio.ensure_future(c.gemm(fp16(rng, 64, 64), fp16(rng, 64, 64),
                                                mode="stream"))
            await asyncio.sleep(0.2)  # started, waiting on the silent server
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        # close() waited for the cancelled call's callback: nothing is left in flight.
        assert not _native._in_flight._calls
    try:
        asyncio.run(main())
    finally:
        silent.close()


def test_native_core_sends_the_largest_gemms_as_parallel_parts(rng):
    """Auto mode: a GEMM moving at least 16 MiB goes as parallel parts (CreateUpload and
    UploadPart calls on the server's metrics), and C is right."""
    metrics_port = free_port()
    s = Server("--cpu_workers=2", f"--metrics_listen=127.0.0.1:{metrics_port}")
    try:
        a, b = fp16(rng, 3000, 16), fp16(rng, 16, 3000)  # C: 3000·3000·2 bytes
        with _native_client(s.address, timeout=120) as c:
            assert _error64(c.gemm(a, b), a, b) < FP32_TOLERANCE
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                      timeout=30).read().decode()
        parts = [line for line in text.splitlines()
                 if line.startswith("hgemm_requests_total") and 'rpc="UploadPart"' in line
                 and 'code="OK"' in line]
        assert parts and float(parts[0].split()[-1]) >= 2, text
    finally:
        s.stop()

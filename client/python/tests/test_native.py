"""The choice of core (hgemm.info(), $HGEMM_TRANSPORT, $HGEMM_NATIVE_LIB) and what only the
native core does. The rest of the suite runs against both cores (tools/test_python.sh)."""
import concurrent.futures
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


def _native_only_client(address, **options):
    """_native_client whose grpcio resident-matrix methods fail too."""
    c = _native_client(address, **options)

    def refuse(*args, **kwargs):
        raise AssertionError("a call went through grpcio")
    for name in ("UploadMatrix", "DownloadMatrix", "ListMatrices", "ReleaseMatrix"):
        setattr(c._stub, name, refuse)
    return c


def test_info_says_which_core_serves_each_feature():
    info = hgemm.info()
    assert set(info["features"]) >= {"gemm", "gemm_many", "upload", "download", "matrices",
                                     "release", "stream", "shared_memory"}
    if info["core"] == "native":
        assert info["abi_revision"] >= 3
        assert info["features"]["download"] == info["features"]["gemm"] == "native"
    else:
        assert set(info["features"].values()) == {"grpcio"}


def test_native_resident_matrices_upload_list_download_keep_c_release(server, rng):
    m, n, k = 45, 38, 61
    a, b = fp16(rng, m, k), fp16(rng, k, n)
    with _native_only_client(server.address, timeout=60) as c:
        hb = c.upload(b, ttl=120, label="native B")
        assert hb.shape == (k, n) and hb.replica == "" and hb.dtype == "fp16"
        listed = {x.handle: x for x in c.matrices()}
        assert listed[hb.handle].label == "native B" and listed[hb.handle].shape == (k, n)
        assert listed[hb.handle].dtype == "fp16" and listed[hb.handle].ttl_seconds == 120
        assert c.matrices().client_bytes >= b.nbytes
        assert np.array_equal(hb.download(), b)
        for mode in ("unary", "stream"):
            hc = c.gemm(a, hb, keep_c=True, c_ttl=60, mode=mode)
            assert isinstance(hc, hgemm.ResidentMatrix) and hc.shape == (m, n)
            got = hc.download()
            assert got.dtype == np.float16 and _error64(got, a, b) < FP32_TOLERANCE
            # The kept C as the C input of a scaled GEMM (by handle): 0.5·A·B − 1.25·C.
            scaled = c.gemm(a, hb, alpha=0.5, beta=-1.25, c=hc, accumulation="fp32", mode=mode)
            ref = 0.5 * (a.astype(np.float64) @ b.astype(np.float64)) - 1.25 * got
            assert np.linalg.norm(scaled - ref) / np.linalg.norm(ref) < FP32_TOLERANCE
            assert hc.release() == m * n * 2
        kept, plain = c.gemm_many([(a, hb, {"keep_c": True}), (a, b)])
        assert isinstance(kept, hgemm.ResidentMatrix) and kept.shape == (m, n)
        assert _error64(kept.download(), a, b) < FP32_TOLERANCE
        assert _error64(plain, a, b) < FP32_TOLERANCE
        kept.release()
        kept32 = c.gemm(a, b, keep_c=True, c_dtype="fp32", details=True)
        assert kept32.c.dtype == "fp32" and kept32.execution.backend == "cpu"
        c32 = kept32.c.download()
        assert c32.dtype == np.float32 and _error64(c32, a, b) < 1e-5
        kept32.c.release()
        assert hb.release() == b.nbytes
        with pytest.raises(hgemm.NotFound):
            c.download(hb)
        assert hb.handle not in {x.handle for x in c.matrices()}


@pytest.mark.parametrize("mode", ["unary", "stream"])
def test_native_scaled_and_batched_gemms(server, rng, mode):
    m, n, k, batch = 23, 31, 40, 3
    with _native_client(server.address, timeout=60) as c:
        a, b, c_in = fp16(rng, m, k), fp16(rng, k, n), fp16(rng, m, n)
        out = c.gemm(a, b, alpha=2.0, beta=0.5, c=c_in, accumulation="fp32", mode=mode)
        ref = 2.0 * (a.astype(np.float64) @ b.astype(np.float64)) + 0.5 * c_in
        assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < FP32_TOLERANCE
        As = np.stack([fp16(rng, m, k) for _ in range(batch)])
        Bs = np.stack([fp16(rng, k, n) for _ in range(batch)])
        Cs = np.stack([fp16(rng, m, n) for _ in range(batch)])
        got = c.gemm_batched(As, Bs, alpha=-1.0, beta=2.0, c=Cs, accumulation="fp32", mode=mode)
        assert got.shape == (batch, m, n)
        for i in range(batch):
            ref = -(As[i].astype(np.float64) @ Bs[i].astype(np.float64)) + 2.0 * Cs[i]
            assert np.linalg.norm(got[i] - ref) / np.linalg.norm(ref) < FP32_TOLERANCE, i


def test_native_stream_never_touches_grpcio(server, rng):
    import concurrent.futures
    pairs = [(fp16(rng, 10 + i, 20 + i), fp16(rng, 20 + i, 15 + i)) for i in range(12)]
    pairs.append((fp16(rng, 700, 800), fp16(rng, 800, 900)))  # several chunks each way
    with _native_only_client(server.address, timeout=60) as c:
        with c.stream() as s, concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda p: s.gemm(*p, details=True), pairs))
            hb = c.upload(pairs[0][1])
            hc = s.gemm(pairs[0][0], hb, keep_c=True)
            assert _error64(hc.download(), *pairs[0]) < FP32_TOLERANCE
            hc.release()
            hb.release()
            with pytest.raises(hgemm.NotFound):  # fails alone; the stream goes on
                s.gemm(pairs[0][0], hb)
            assert _error64(s.gemm(*pairs[1]), *pairs[1]) < FP32_TOLERANCE
    for (a, b), r in zip(pairs, results):
        assert r.c.shape == (a.shape[0], b.shape[1]) and r.execution.backend == "cpu"
        assert _error64(r.c, a, b) < FP32_TOLERANCE


def test_closing_a_native_client_cancels_its_open_streams(server, rng):
    a = fp16(rng, 1024, 1024)
    c = _native_client(server.address, timeout=60)
    s = c.stream()
    futures = [s.submit(a, a) for _ in range(3)]
    c.close()
    for f in futures:  # answered before the close, or cancelled by it
        if f.exception(timeout=60) is None:
            assert _error64(f.result(), a, a) < FP32_TOLERANCE
        else:
            assert isinstance(f.exception(), hgemm.Cancelled), f.exception()


def test_aio_stream_on_the_native_core(server, rng):
    import asyncio
    if hgemm.info()["core"] != "native":
        pytest.skip("the native core is not in use: " + str(hgemm.info()["reason"]))
    pairs = [(fp16(rng, 10 + i, 12), fp16(rng, 12, 9 + i)) for i in range(8)]

    async def main():
        async with hgemm.aio.Client(server.address, timeout=60) as c:
            def refuse(*args, **kwargs):
                raise AssertionError("a stream went through grpcio")
            c._stub.GemmStream = refuse
            async with c.stream() as s:
                results = await asyncio.gather(*(s.gemm(a, b) for a, b in pairs))
                with pytest.raises(hgemm.InvalidArgument, match="no_such_kernel"):
                    await s.gemm(*pairs[0], kernel="no_such_kernel")
                assert _error64(await s.gemm(*pairs[1]), *pairs[1]) < FP32_TOLERANCE
            for (a, b), r in zip(pairs, results):
                assert _error64(r, a, b) < FP32_TOLERANCE
    asyncio.run(main())


def test_native_shared_memory_info_kernels_and_groups_never_touch_grpcio(shm_server, rng):
    """Shared buffers, the arena, regions(), info(), kernels() and gemm_grouped through the C
    ABI: every grpcio method they would use fails."""
    c = _native_client(shm_server.unix, client_id="native-shm", shared_memory_min_bytes=1,
                       timeout=60)

    def refuse(*args, **kwargs):
        raise AssertionError("a call went through grpcio")
    for name in ("RegisterRegion", "UnregisterRegion", "ListRegions", "GetServerInfo",
                 "ListKernels"):
        setattr(c._stub, name, refuse)
    with c:
        assert c.info().backend == "cpu" and c.info().limits.max_message_bytes > 0
        assert "cpu" in [k.name for k in c.kernels()] or c.kernels()
        a = c.shared_buffer((64, 48))
        a[:] = fp16(rng, 64, 48)
        b = fp16(rng, 48, 40)  # through the arena (min bytes 1)
        out = c.shared_buffer((64, 40))
        out[:] = np.nan
        r = c.gemm(a, b, out=out, details=True)
        assert r.c is out and rel_error(out, a, b) < FP32_TOLERANCE
        assert r.execution.backend == "cpu"
        assert rel_error(c.gemm(a, b), a, b) < FP32_TOLERANCE  # C out of the arena
        listed = c.regions()
        assert sorted(x.label for x in listed.regions) == ["hgemm_arena", "hgemm_buffer",
                                                          "hgemm_buffer"]
        assert listed.client_bytes == sum(x.byte_size for x in listed.regions)
        pairs = [(fp16(rng, m, k), fp16(rng, k, n)) for m, n, k in [(9, 17, 33), (40, 8, 16)]]
        c_ins = [fp16(rng, 9, 17), fp16(rng, 40, 8)]
        cs = c.gemm_grouped(pairs, alpha=0.5, beta=2.0, c=c_ins)
        for (x, y), c_in, got in zip(pairs, c_ins, cs):
            ref = 0.5 * (x.astype(np.float64) @ y.astype(np.float64)) + 2.0 * c_in
            assert got.dtype == np.float16
            assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < FP32_TOLERANCE
    # close() unregistered them through the core; the array stays readable.
    with hgemm.Client(shm_server.unix, client_id="native-shm") as again:
        assert list(again.regions().regions) == []
    assert np.isnan(out).sum() == 0


def test_native_aio_keep_c_is_awaited_through_the_core(server, rng):
    """aio gemm(keep_c=True), unary and streamed, through hgemm_gemm_keep_c_async: grpcio's Gemm
    and GemmStream fail."""
    if hgemm.info()["core"] != "native":
        pytest.skip("the native core is not in use: " + str(hgemm.info()["reason"]))
    import asyncio
    a, b = fp16(rng, 33, 21), fp16(rng, 21, 17)

    async def main():
        async with hgemm.aio.Client(server.address, timeout=60) as c:
            def refuse(*args, **kwargs):
                raise AssertionError("a GEMM went through grpcio")
            c._stub.Gemm = c._stub.GemmStream = refuse
            for mode in ("unary", "stream"):
                hc = await c.gemm(a, b, keep_c=True, mode=mode)
                assert hc.shape == (33, 17) and hc.dtype == "fp16"
                assert rel_error(await hc.download(), a, b) < FP32_TOLERANCE
                assert await hc.release() == hc.bytes
            with pytest.raises(hgemm.NotFound):  # a failure through the completion
                await c.gemm(hc, b[:17], keep_c=True)
    asyncio.run(main())


_EVERY_GRPCIO_METHOD = ("Gemm", "GemmStream", "UploadMatrix", "DownloadMatrix", "ListMatrices",
                        "ReleaseMatrix", "GetServerInfo", "ListKernels", "RegisterRegion",
                        "UnregisterRegion", "ListRegions")


def _python_threads() -> int:
    """Threads Python made (not the library's threads that ran a callback into Python)."""
    import threading
    return sum(not isinstance(t, threading._DummyThread) for t in threading.enumerate())


class _NoExecutor(concurrent.futures.ThreadPoolExecutor):
    """A loop's default executor that fails when used (no call may go to a thread pool) until
    closing is set: close() waits for the core's threads there."""
    used = 0

    def __init__(self):
        super().__init__(1)
        self.closing = False

    def submit(self, *args, **kwargs):
        if self.closing:
            return super().submit(*args, **kwargs)
        _NoExecutor.used += 1
        raise AssertionError("a native aio call went to the loop's executor")


def test_native_aio_other_calls_never_touch_grpcio(shm_server, rng):
    """The aio client's uploads, downloads, listings, releases, info, kernels, shared buffers,
    regions, groups and gemm_many through the native core (C ABI revision 7's *_start calls,
    awaited through their completion callback): every grpcio method fails, no Python thread is
    made and the loop's executor is never used."""
    if hgemm.info()["core"] != "native":
        pytest.skip("the native core is not in use: " + str(hgemm.info()["reason"]))
    import asyncio
    a, b = fp16(rng, 40, 24), fp16(rng, 24, 16)

    async def main():
        executor = _NoExecutor()
        asyncio.get_running_loop().set_default_executor(executor)
        c = hgemm.aio.Client(shm_server.unix, client_id="native-aio-other", timeout=60,
                             shared_memory_min_bytes=1)
        try:
            def refuse(*args, **kwargs):
                raise AssertionError("a call went through grpcio")
            for name in _EVERY_GRPCIO_METHOD:
                setattr(c._stub, name, refuse)
            threads_before = _python_threads()  # grpcio's channel (the stub above) made its own
            info, kernels = await asyncio.gather(c.info(), c.kernels())
            assert info.backend == "cpu" and kernels
            hbs = await asyncio.gather(*(c.upload(b, label=f"b{i}") for i in range(12)))
            listed = await c.matrices()
            assert sorted(m.label for m in listed) == sorted(f"b{i}" for i in range(12))
            downloaded = await asyncio.gather(*(hb.download() for hb in hbs))
            assert all(np.array_equal(d, b) for d in downloaded)
            x = await c.shared_buffer((40, 24))
            x[:] = a
            out = await c.shared_buffer((40, 16))
            out[:] = np.nan
            assert (await c.gemm(x, b, out=out)) is out  # b through the arena
            assert rel_error(out, a, b) < FP32_TOLERANCE
            assert rel_error(await c.gemm(x, hbs[0]), a, b) < FP32_TOLERANCE
            assert sorted(r.label for r in (await c.regions()).regions) == [
                "hgemm_arena", "hgemm_buffer", "hgemm_buffer"]
            cs = await c.gemm_many([(a, hb) for hb in hbs[:4]] + [(a, b)])
            assert all(rel_error(got, a, b) < FP32_TOLERANCE for got in cs)
            y = fp16(rng, 9, 16)
            grouped = await c.gemm_grouped([(a, b), (y, b.T)])
            assert rel_error(grouped[0], a, b) < FP32_TOLERANCE
            assert rel_error(grouped[1], y, b.T) < FP32_TOLERANCE
            freed = await asyncio.gather(*(hb.release() for hb in hbs))
            assert freed == [hb.bytes for hb in hbs]
            assert list(await c.matrices()) == []
            with pytest.raises(hgemm.NotFound):  # failures come back through the completion
                await c.release(hgemm.ResidentMatrix(c, hbs[0].info))
            with pytest.raises(hgemm.NotFound):
                await hbs[1].download()
            assert _python_threads() <= threads_before  # none made (others may end)
        finally:
            executor.closing = True
            await c.close()
    asyncio.run(main())
    assert hgemm.info()["features"]["aio.other"] == "native"


def test_a_native_client_opens_no_grpcio_channel(server, rng):
    """A client on the native core makes no grpcio channel for what the core serves (GEMMs,
    resident matrices, info), sync or asyncio; one is made at first use by a call that needs
    grpcio (here a test's direct stub call)."""
    if hgemm.info()["core"] != "native":
        pytest.skip("the native core is not in use: " + str(hgemm.info()["reason"]))
    import asyncio
    a, b = fp16(rng, 24, 40), fp16(rng, 40, 8)
    with hgemm.Client(server.address, timeout=60) as c:
        assert rel_error(c.gemm(a, b), a, b) < FP32_TOLERANCE
        with c.upload(b) as hb:
            assert rel_error(c.gemm_many([(a, hb)])[0], a, b) < FP32_TOLERANCE
        assert c.info().backend == "cpu"
        assert c._calls.routes.channels() == []
        c._stub.GetServerInfo(hgemm.pb.GetServerInfoRequest(), timeout=30)
        assert len(c._calls.routes.channels()) == 1

    async def main():
        async with hgemm.aio.Client(server.address, timeout=60) as c:
            assert rel_error(await c.gemm(a, b), a, b) < FP32_TOLERANCE
            hb = await c.upload(b)
            assert rel_error(await c.gemm(a, hb), a, b) < FP32_TOLERANCE
            await hb.release()
            await c.info()
            assert c._calls.routes.channels() == []
    asyncio.run(main())


def test_native_aio_cancelled_gemm_many_frees_its_batch_once_the_run_is_over(rng, monkeypatch):
    """A cancelled aio gemm_many whose blocking run is under way in the native client's pool
    (waiting on a server that never answers): the task ends at once, the batch is freed only
    when the run ends (its timeout), and close() waits for that."""
    if hgemm.info()["core"] != "native":
        pytest.skip("the native core is not in use: " + str(hgemm.info()["reason"]))
    import asyncio
    import socket
    from hgemm import _native
    batches = []
    make_batch = _native.NativeClient.batch

    def recorded(self, specs):
        batches.append(make_batch(self, specs))
        return batches[-1]
    monkeypatch.setattr(_native.NativeClient, "batch", recorded)
    silent = socket.socket()  # listens, never accepts
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    address = "127.0.0.1:%d" % silent.getsockname()[1]

    async def main():
        async with hgemm.aio.Client(address, retries=1) as c:
            task = asyncio.ensure_future(c.gemm_many([(fp16(rng, 8, 8), fp16(rng, 8, 8))] * 3,
                                                     timeout=1.5))
            await asyncio.sleep(0.3)  # the run is waiting on the silent server
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert len(batches) == 1 and batches[0]._closed
            assert batches[0]._batch is not None  # still in use by the run
        assert batches[0]._batch is None  # close() waited for the run, which freed it
    try:
        asyncio.run(main())
    finally:
        silent.close()


def test_native_aio_calls_in_flight_make_no_thread_per_call(shm_server, rng):
    """32 aio calls of each kind in flight at once on the native core (GEMMs, kept Cs, GEMMs of
    shared buffers through the ring, uploads, downloads, releases, listings, info, kernels,
    groups, gemm_many, stream GEMMs): no Python thread is made, the loop's executor is never
    used, and the process's threads grow by the core's bounded completion threads and gRPC's
    own, not by one per call."""
    if hgemm.info()["core"] != "native":
        pytest.skip("the native core is not in use: " + str(hgemm.info()["reason"]))
    import asyncio
    n = 32
    a, b = fp16(rng, 24, 40), fp16(rng, 40, 16)

    def os_threads() -> int:
        return len(os.listdir("/proc/self/task"))

    async def main():
        executor = _NoExecutor()
        asyncio.get_running_loop().set_default_executor(executor)
        c = hgemm.aio.Client(shm_server.unix, client_id="aio-in-flight", timeout=120)
        try:
            hbs = await asyncio.gather(*(c.upload(b, label="in-flight") for _ in range(n)))
            x, y, z = (await c.shared_buffer((24, 40)), await c.shared_buffer((40, 16)),
                       await c.shared_buffer((n, 24, 16)))  # each GEMM's C: a slice of z
            x[:], y[:], z[:] = a, b, np.nan
            python_before, os_before = _python_threads(), os_threads()
            async with c.stream() as s:
                calls = ([c.gemm(a, b) for _ in range(n)]
                         + [c.gemm(a, b, keep_c=True) for _ in range(n)]
                         + [c.gemm(x, y, out=z[i]) for i in range(n)]
                         + [c.upload(b) for _ in range(n)]
                         + [hb.download() for hb in hbs]
                         + [c.matrices() for _ in range(n)] + [c.regions() for _ in range(n)]
                         + [c.info() for _ in range(n)] + [c.kernels() for _ in range(n)]
                         + [c.gemm_grouped([(a, b), (a, b)]) for _ in range(n)]
                         + [c.gemm_many([(a, b)] * 2) for _ in range(n)]
                         + [s.gemm(a, b) for _ in range(n)])
                tasks = [asyncio.ensure_future(call) for call in calls]
                await asyncio.sleep(0.05)  # all started, most in flight
                during = os_threads()
                assert _python_threads() <= python_before  # none made (others may end)
                results = await asyncio.gather(*tasks)
            assert during - os_before < n, (os_before, during)
            kinds = [results[i * n:(i + 1) * n] for i in range(len(calls) // n)]
            gemms, kept, ring, uploaded, downloaded = kinds[:5]
            assert all(rel_error(got, a, b) < FP32_TOLERANCE for got in gemms + kinds[11])
            assert all(rel_error(got, a, b) < FP32_TOLERANCE for got in z)
            assert all(np.shares_memory(got, z[i]) for i, got in enumerate(ring))
            assert all(np.array_equal(d, b) for d in downloaded)
            assert all(g[0].shape == (24, 16) for g in kinds[9]) and len(kinds[10][0]) == 2
            released = await asyncio.gather(*(m.release() for m in hbs + uploaded + kept))
            assert all(freed > 0 for freed in released)
            assert _NoExecutor.used == 0
        finally:
            executor.closing = True
            await c.close()
    asyncio.run(main())


def test_native_aio_cancelled_calls_settle_and_close_waits(server, rng):
    """aio calls on the native core cancelled while in flight (their tasks end at once with
    CancelledError); close() then returns once the core has run each completion."""
    if hgemm.info()["core"] != "native":
        pytest.skip("the native core is not in use: " + str(hgemm.info()["reason"]))
    import asyncio
    a, b = fp16(rng, 64, 64), fp16(rng, 64, 64)

    async def main():
        async with hgemm.aio.Client(server.address, timeout=60) as c:
            tasks = [asyncio.ensure_future(call) for _ in range(16)
                     for call in (c.upload(b), c.info(), c.gemm_grouped([(a, b)]))]
            await asyncio.sleep(0)
            for task in tasks:
                task.cancel()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            assert all(isinstance(o, (asyncio.CancelledError, hgemm.ResidentMatrix,
                                      hgemm.pb.ServerInfo, list)) for o in outcomes)
            assert rel_error(await c.gemm(a, b), a, b) < FP32_TOLERANCE  # still serving
    asyncio.run(main())


_NO_GRPC = """
import asyncio, sys
import numpy as np
import hgemm
assert "grpc" not in sys.modules, "import hgemm imported grpc"
target = sys.argv[1]
rng = np.random.default_rng(5)
a = rng.standard_normal((24, 40)).astype(np.float16)
b = rng.standard_normal((40, 16)).astype(np.float16)
ref = a.astype(np.float64) @ b.astype(np.float64)
def check(c):
    c = np.asarray(c, dtype=np.float64)
    err = np.linalg.norm(c - ref) / np.linalg.norm(ref)
    assert err < 1e-2, err
with hgemm.Client(target, timeout=60) as c:
    check(c.gemm(a, b))
    with c.upload(b) as hb:
        check(c.gemm(a, hb))
    x, y, z = c.shared_buffer((24, 40)), c.shared_buffer((40, 16)), c.shared_buffer((24, 16))
    x[:], y[:], z[:] = a, b, np.nan
    c.gemm(x, y, out=z)  # through the ring
    check(z)
    check(c.gemm(a, b, out=np.empty((24, 16), np.float16)))
    with c.stream() as s:
        check(s.gemm(a, b))
async def main():
    async with hgemm.aio.Client(target, timeout=60) as c:
        check(await c.gemm(a, b))
        hb = await c.upload(b)
        check(await c.gemm(a, hb))
        await hb.release()
        x, y, z = (await c.shared_buffer((24, 40)), await c.shared_buffer((40, 16)),
                   await c.shared_buffer((24, 16)))
        x[:], y[:], z[:] = a, b, np.nan
        await c.gemm(x, y, out=z)
        check(z)
        async with c.stream() as s:
            check(await s.gemm(a, b))
        try:
            await c.download(hgemm.ResidentMatrix(c, hb.info))
        except hgemm.NotFound as e:
            assert e.code == hgemm.StatusCode.NOT_FOUND
asyncio.run(main())
assert hgemm.info()["core"] == "native"
assert "grpc" not in sys.modules, sorted(m for m in sys.modules if "grpc" in m)
print("no grpc")
"""


def test_native_core_never_imports_grpc(shm_server):
    """`import hgemm`, then sync and asyncio clients on the native core doing GEMMs, uploads,
    shared buffers, a ring and a stream against a real server: grpc is never imported."""
    if hgemm.info()["core"] != "native":
        pytest.skip("the native core is not in use: " + str(hgemm.info()["reason"]))
    out = subprocess.run([sys.executable, "-c", _NO_GRPC, shm_server.unix],
                         env={**os.environ, "HGEMM_TRANSPORT": "native"}, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "no grpc"

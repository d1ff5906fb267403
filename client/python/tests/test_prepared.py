"""Client.prepare: one GEMM made ready once and run many times, against real servers (CPU
backend). On the native core a prepared call is one call into the core and never goes through
Client.gemm; elsewhere (grpcio, asyncio, an operand converted or copied, keep_c) it is gemm with
the same arguments. Either way each call reads the operands' contents at the time of the call."""
import asyncio
import concurrent.futures
import uuid
import warnings

import numpy as np
import pytest

import hgemm
from conftest import FP32_TOLERANCE, fp16, rel_error


def on_native(client) -> bool:
    return client._calls.native is not None


def gemm_refused(client, monkeypatch):
    """Makes client.gemm fail: a native prepared call must not need it."""
    def refused(*args, **kwargs):
        raise AssertionError("the prepared call went through Client.gemm")
    monkeypatch.setattr(client, "gemm", refused)


def refill(rng, *arrays):
    for x in arrays:
        x[...] = fp16(rng, *x.shape)


@pytest.mark.parametrize("mode", ["unary", "stream"])
def test_each_call_reads_the_operands_as_they_are_then(client, rng, monkeypatch, mode):
    a, b = fp16(rng, 130, 70), fp16(rng, 70, 90)
    out = np.full((130, 90), np.nan, dtype=np.float16)
    g = client.prepare(a, b, out=out, mode=mode)
    assert g.native == on_native(client)
    if g.native:
        gemm_refused(client, monkeypatch)
    for _ in range(3):
        assert g() is out
        assert rel_error(out, a, b) < FP32_TOLERANCE
        refill(rng, a, b)
        out[...] = np.nan
    g.close()
    with pytest.raises(ValueError, match="closed"):
        g()


def test_without_out_each_call_returns_a_new_array_and_details(client, rng):
    a, b = fp16(rng, 33, 17), fp16(rng, 17, 65)
    with client.prepare(a, b, details=True, kernel="auto") as g:
        first, second = g(), g()
        assert first.c is not second.c
        assert first.c.dtype == np.float16 and first.c.shape == (33, 65)
        assert rel_error(second.c, a, b) < FP32_TOLERANCE
        assert first.execution.backend == "cpu" and first.timing.server_total_ms > 0


def test_transposed_views_bf16_fp32_c_and_scaled(client, rng):
    bt = fp16(rng, 40, 60)  # B stored n x k
    a = fp16(rng, 50, 60)
    c_in = fp16(rng, 50, 40).astype(np.float32)
    out = np.full((50, 40), np.nan, dtype=np.float32)
    g = client.prepare(a, bt.T, out=out, c_dtype="fp32", alpha=2.0, beta=-1.0, c=c_in)
    assert g.native == on_native(client)
    for _ in range(2):
        g()
        ref = 2.0 * (a.astype(np.float64) @ bt.T.astype(np.float64)) - c_in
        assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < FP32_TOLERANCE
        refill(rng, a, bt)
        c_in[...] = fp16(rng, 50, 40)
    g.close()


def test_converted_or_copied_operands_fall_back_to_gemm_each_call(client, rng):
    a32 = fp16(rng, 20, 30).astype(np.float32)
    strided = fp16(rng, 30, 50)[:, ::2]  # not contiguous: sent as a copy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hgemm.ConversionWarning)
        g = client.prepare(a32, strided)
        assert not g.native
        for _ in range(2):
            assert rel_error(g(), a32.astype(np.float16), strided) < FP32_TOLERANCE
            a32[...] = fp16(rng, 20, 30)  # a conversion at prepare time would miss this
            strided[...] = fp16(rng, 30, 25)


def test_keep_c_is_a_new_resident_matrix_each_call(client, rng):
    a, b = fp16(rng, 16, 24), fp16(rng, 24, 8)
    g = client.prepare(a, b, keep_c=True)
    assert not g.native
    first, second = g(), g()
    try:
        assert first.handle != second.handle
        assert rel_error(second.download(), a, b) < FP32_TOLERANCE
    finally:
        first.release()
        second.release()


def test_resident_b(client, rng, monkeypatch):
    a, b = fp16(rng, 64, 48), fp16(rng, 48, 32)
    with client.upload(b) as hb:
        g = client.prepare(a, hb)
        assert g.native == on_native(client)
        if g.native:
            gemm_refused(client, monkeypatch)
        refill(rng, a)
        assert rel_error(g(), a, b) < FP32_TOLERANCE
    with pytest.raises(hgemm.NotFound):  # B released: the server says so, as to gemm
        g()


def test_bad_arguments_raise_at_prepare(client, rng):
    a, b = fp16(rng, 8, 9), fp16(rng, 10, 8)
    with pytest.raises(ValueError, match="A's columns must equal B's rows"):
        client.prepare(a, b)
    with pytest.raises(TypeError, match="unexpected keyword"):
        client.prepare(a, a.T, outt=None)
    with pytest.raises(ValueError):
        client.prepare(a, a.T, out=np.empty((8, 7), dtype=np.float16))


def test_many_threads_share_one_prepared_call(client, rng):
    a, b = fp16(rng, 96, 40), fp16(rng, 40, 72)
    with client.prepare(a, b) as g, concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: g(), range(64)))
    assert len({id(c) for c in results}) == 64
    assert max(rel_error(c, a, b) for c in results) < FP32_TOLERANCE


def test_shared_buffers(shm_server, rng, monkeypatch):
    with hgemm.Client(shm_server.unix, client_id=f"prep-{uuid.uuid4().hex[:8]}",
                      timeout=120) as c:
        a, b = c.shared_buffer((100, 60)), c.shared_buffer((60, 50))
        out = c.shared_buffer((100, 50))
        refill(rng, a, b)
        for details in (False, True):  # the ring, then Gemm calls naming the regions
            g = c.prepare(a, b, out=out, details=details)
            assert g.native == on_native(c)
            if g.native:
                gemm_refused(c, monkeypatch)
            for _ in range(2):
                out[...] = np.nan
                r = g()
                assert (r.c if details else r) is out
                assert rel_error(out, a, b) < FP32_TOLERANCE
                refill(rng, a, b)
            g.close()
            monkeypatch.undo()


def test_aio_awaits_gemm(server, rng):
    a, b = fp16(rng, 24, 24), fp16(rng, 24, 24)

    async def run():
        async with hgemm.aio.Client(server.address, timeout=120) as c:
            g = await c.prepare(a, b)
            assert not g.native
            return await g()
    assert rel_error(asyncio.run(run()), a, b) < FP32_TOLERANCE

"""hgemm.aio.Client against the real server: the same methods as coroutines."""
import asyncio

import grpc
import grpc.aio
import numpy as np
import pytest

import hgemm
from conftest import FP32_TOLERANCE, fp16, rel_error


def run(coro):
    return asyncio.run(coro)


def test_aio_gemm_unary_stream_and_concurrent(server, rng):
    a, b = fp16(rng, 70, 90), fp16(rng, 90, 50)

    async def main():
        async with hgemm.aio.Client(server.address, timeout=120) as c:
            info = await c.info()
            assert info.backend == "cpu"
            assert "auto" in [k.name for k in await c.kernels()]
            for mode in ("unary", "stream"):
                r = await c.gemm(a, b, mode=mode, details=True)
                assert rel_error(r.c, a, b) < FP32_TOLERANCE
                assert r.execution.backend == "cpu"
            cs = await asyncio.gather(*(c.gemm(a, b) for _ in range(8)))
            for cc in cs:
                assert rel_error(cc, a, b) < FP32_TOLERANCE
            big_a, big_b = fp16(rng, 600, 700), fp16(rng, 700, 800)
            big_c = await c.gemm(big_a, big_b, mode="stream")
            assert rel_error(big_c, big_a, big_b) < FP32_TOLERANCE
    run(main())


def test_aio_verified_gemm_shows_its_check(server, rng):
    # The native core's aio GEMMs come back through a done callback (hgemm_gemm_async,
    # hgemm_gemm_keep_c_async): their check is read there.
    a, b = fp16(rng, 96, 130), fp16(rng, 130, 70)

    async def main():
        async with hgemm.aio.Client(server.address, timeout=120) as c:
            for mode in ("unary", "stream"):
                r = await c.gemm(a, b, verify=True, verify_repetitions=2, details=True, mode=mode)
                assert rel_error(r.c, a, b) < FP32_TOLERANCE
                assert r.execution.verified_repetitions == 2
                assert r.execution.suspect_device_id is None
                plain = await c.gemm(a, b, details=True, mode=mode)
                assert plain.execution.verified_repetitions == 0
                assert plain.execution.suspect_device_id is None
            kept = await c.gemm(a, b, verify=True, verify_repetitions=2, keep_c=True,
                                details=True)
            assert kept.execution.verified_repetitions == 2
            await kept.c.release()
    run(main())


def test_aio_resident_matrices(server, rng):
    a, b, b2 = fp16(rng, 30, 20), fp16(rng, 20, 10), fp16(rng, 10, 5)

    async def main():
        async with hgemm.aio.Client(server.address, timeout=60) as c:
            async with await c.upload(b) as hb:
                assert hb.handle in [m.handle for m in await c.matrices()]
                assert np.array_equal(await hb.download(), b)
                hc = await c.gemm(a, hb, keep_c=True)
                c_values = await hc.download()
                assert rel_error(c_values, a, b) < FP32_TOLERANCE
                assert rel_error(await c.gemm(hc, b2), c_values, b2) < FP32_TOLERANCE
                assert await hc.release() == hc.bytes
                with pytest.raises(hgemm.NotFound) as e:
                    await c.gemm(hc, b2)
                assert e.value.status == "NOT_FOUND"
            assert hb.released
            with pytest.raises(hgemm.NotFound):
                await c.gemm(a, hb)
    run(main())


def test_aio_gemm_many_with_failures(server, rng):
    a, b = fp16(rng, 10, 20), fp16(rng, 20, 30)

    async def main():
        async with hgemm.aio.Client(server.address, timeout=60) as c:
            gone = await c.upload(b)
            await gone.release()
            pairs = [(a, b), (a, gone), (a, b, {"kernel": "no_such_kernel"}), (a, b)]
            results = await c.gemm_many(pairs, return_exceptions=True)
            assert isinstance(results[1], hgemm.NotFound) and results[1].index == 1
            assert isinstance(results[2], hgemm.InvalidArgument) and results[2].index == 2
            for i in (0, 3):
                assert rel_error(results[i], a, b) < FP32_TOLERANCE
            with pytest.raises(hgemm.NotFound) as e:
                await c.gemm_many(pairs)
            assert e.value.index == 1
    run(main())


def test_aio_errors(server, rng):
    a = fp16(rng, 4, 4)

    async def main():
        async with hgemm.aio.Client(server.address, timeout=60) as c:
            for mode in ("unary", "stream"):
                with pytest.raises(hgemm.InvalidArgument) as e:
                    await c.gemm(a, a, kernel="no_such_kernel", mode=mode)
                assert e.value.status == "INVALID_ARGUMENT"
            big = fp16(rng, 1024, 1024)
            with pytest.raises(hgemm.DeadlineExceeded):
                await c.gemm(big, big, timeout=0.001)
            with pytest.raises(ValueError):
                await c.gemm(a, fp16(rng, 5, 4))
    run(main())


def test_aio_internal_after_the_deadline_is_deadline_exceeded(server, rng):
    """grpcio's aio client reports some streams whose deadline expires while requests are still
    being sent as INTERNAL "Internal error from Core": once the timeout has passed, the client
    raises DeadlineExceeded; an INTERNAL before it stays Internal."""
    b = fp16(rng, 8, 8)

    def upload_failing(after_deadline):
        def upload(request, timeout=None, metadata=None):
            async def call():
                if after_deadline:
                    await asyncio.sleep(timeout + 0.01)
                raise grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, grpc.aio.Metadata(),
                                           grpc.aio.Metadata(), details="Internal error from Core")
            return call()
        return upload

    async def main():
        # grpcio's behaviour: a client with channel_options stays on grpcio on either core.
        async with hgemm.aio.Client(server.address, timeout=60,
                                    channel_options=[("grpc.enable_retries", 0)]) as c:
            c._stub.UploadMatrix = upload_failing(after_deadline=True)
            with pytest.raises(hgemm.DeadlineExceeded) as e:
                await c.upload(b, timeout=0.05)
            assert "Internal error from Core" in e.value.message
            c._stub.UploadMatrix = upload_failing(after_deadline=False)
            with pytest.raises(hgemm.Internal):
                await c.upload(b, timeout=30)
    run(main())


def test_aio_upload_whose_deadline_expires_mid_stream(server, rng):
    """Against the real server: an upload still sending when its timeout passes ends
    DeadlineExceeded (whatever grpcio's core reported), and the server keeps serving."""
    big = fp16(rng, 4096, 4096)  # 32 MiB: many chunks

    async def main():
        async with hgemm.aio.Client(server.address, timeout=60) as c:
            for _ in range(3):
                with pytest.raises(hgemm.DeadlineExceeded):
                    await c.upload(big, timeout=0.01)
            assert (await c.info()).backend == "cpu"
    run(main())

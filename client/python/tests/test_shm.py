"""Shared memory over the server's Unix socket: shared buffers, the arena, fallbacks, release on
close; real server processes (CPU backend, which reads and writes the mapped regions)."""
import asyncio
import concurrent.futures
import uuid

import numpy as np
import pytest

import hgemm
from conftest import FP32_TOLERANCE, fp16, rel_error


class GemmSizes:
    """The serialized size of every unary Gemm request the client sends: through grpcio's stub,
    or, on the native core, of the request the core builds of a GEMM naming regions (the same
    GemmRequest, made by hgemm_gemm)."""

    def __init__(self, client, monkeypatch):
        self.sizes = []
        gemm = client._stub.Gemm

        def sized(request, *args, **kwargs):
            self.sizes.append(len(request))
            return gemm(request, *args, **kwargs)
        monkeypatch.setattr(client._stub, "Gemm", sized)
        native = client._calls.native
        if native is not None:
            in_regions = native.gemm_in_regions

            def sized_in_regions(spec, refs, *args):
                self.sizes.append(len(spec.unary_request(refs)))
                return in_regions(spec, refs, *args)
            monkeypatch.setattr(native, "gemm_in_regions", sized_in_regions)


def unix_client(server, **options):
    """A client of `server`'s Unix socket with a client id of its own (regions are per client)."""
    return hgemm.Client(server.unix, client_id=f"shm-{uuid.uuid4().hex[:8]}", timeout=120,
                        **options)


def poisoned(buffer):
    buffer[...] = np.nan
    return buffer


def labels(client):
    return sorted(r.label for r in client.regions().regions)


def test_shared_buffers_are_named_and_c_written_in_place(shm_server, rng, monkeypatch):
    with unix_client(shm_server) as c:
        sizes = GemmSizes(c, monkeypatch)
        a, b = c.shared_buffer((300, 200)), c.shared_buffer((200, 170))
        out = poisoned(c.shared_buffer((300, 170)))
        a[:], b[:] = fp16(rng, 300, 200), fp16(rng, 200, 170)
        r = c.gemm(a, b, out=out, details=True)
        assert r.c is out and rel_error(out, a, b) < FP32_TOLERANCE
        assert r.execution.backend == "cpu" and r.timing.server_total_ms > 0
        assert sizes.sizes and max(sizes.sizes) < 256  # names, not 220 KB of operands
        assert labels(c) == ["hgemm_buffer"] * 3  # no arena


def test_slices_and_transposed_views_of_shared_buffers(shm_server, rng, monkeypatch):
    with unix_client(shm_server) as c:
        sizes = GemmSizes(c, monkeypatch)
        a = c.shared_buffer((64 + 100, 90))
        bt = c.shared_buffer((70, 90))  # B stored n x k: gemm(A, bt.T) is transpose_b
        a[:], bt[:] = fp16(rng, *a.shape), fp16(rng, *bt.shape)
        rows = a[64:]  # C-contiguous, at an offset in its region
        out = poisoned(c.shared_buffer((100, 70)))
        c.gemm(rows, bt.T, out=out)
        assert rel_error(out, rows, bt.T) < FP32_TOLERANCE
        assert max(sizes.sizes) < 256


def test_fp32_c_into_a_float32_shared_buffer(shm_server, rng):
    with unix_client(shm_server) as c:
        a, b = c.shared_buffer((40, 50)), c.shared_buffer((50, 60))
        a[:], b[:] = fp16(rng, 40, 50), fp16(rng, 50, 60)
        out = poisoned(c.shared_buffer((40, 60), np.float32))
        assert c.gemm(a, b, out=out, c_dtype="fp32") is out
        assert rel_error(out, a, b) < 1e-5  # no fp16 rounding of C
        with pytest.raises(TypeError, match="float32"):
            c.gemm(a, b, out=c.shared_buffer((40, 60)), c_dtype="fp32")


def test_large_ordinary_arrays_go_through_one_reused_arena(shm_server, rng, monkeypatch):
    with unix_client(shm_server, shared_memory_min_bytes=64 << 10) as c:
        sizes = GemmSizes(c, monkeypatch)
        for m, n, k in [(256, 200, 300), (300, 256, 256), (129, 513, 257)]:
            a, b = fp16(rng, m, k), fp16(rng, k, n)
            out = poisoned(np.empty((m, n), np.float16))
            assert c.gemm(a, b, out=out) is out and rel_error(out, a, b) < FP32_TOLERANCE
            got = c.gemm(a, b)
            assert not got.flags.writeable and rel_error(got, a, b) < FP32_TOLERANCE
        assert max(sizes.sizes) < 256
        assert labels(c) == ["hgemm_arena"]
        # A GEMM larger than the arena replaces it with a larger one.
        a, b = fp16(rng, 2048, 2048), fp16(rng, 2048, 1024)
        assert rel_error(c.gemm(a, b), a, b) < FP32_TOLERANCE
        arenas = c.regions().regions
        assert [r.label for r in arenas] == ["hgemm_arena"] and arenas[0].byte_size >= 16 << 20


def test_small_operands_go_as_bytes(shm_server, rng, monkeypatch):
    with unix_client(shm_server) as c:  # default threshold: 1 MiB
        sizes = GemmSizes(c, monkeypatch)
        a, b = fp16(rng, 100, 120), fp16(rng, 120, 80)
        assert rel_error(c.gemm(a, b, mode="unary"), a, b) < FP32_TOLERANCE
        assert sizes.sizes == [] or sizes.sizes[0] > a.nbytes + b.nbytes  # native core or bytes
        assert labels(c) == []


def test_one_shared_operand_and_one_inline(shm_server, rng, monkeypatch):
    with unix_client(shm_server) as c:
        sizes = GemmSizes(c, monkeypatch)
        a = c.shared_buffer((128, 64))
        a[:] = fp16(rng, 128, 64)
        b = fp16(rng, 64, 32)
        got = c.gemm(a, b)
        assert rel_error(got, a, b) < FP32_TOLERANCE
        assert b.nbytes < sizes.sizes[0] < b.nbytes + 256  # B only


def test_close_unregisters_every_region(shm_server, rng):
    client_id = f"shm-{uuid.uuid4().hex[:8]}"
    with hgemm.Client(shm_server.unix, client_id=client_id, shared_memory_min_bytes=1) as c:
        a = c.shared_buffer((16, 16))
        a[:] = fp16(rng, 16, 16)
        b = fp16(rng, 16, 16)
        c.gemm(a, b)
        assert labels(c) == ["hgemm_arena", "hgemm_buffer"]
    with hgemm.Client(shm_server.unix, client_id=client_id) as c:
        assert labels(c) == []
    assert rel_error(a @ b, a, b) < 1e-2  # the array outlives the client's regions


def test_threads_get_arenas_of_their_own(shm_server, rng):
    pairs = [(fp16(rng, 200, 300), fp16(rng, 300, 100)) for _ in range(12)]
    with unix_client(shm_server, shared_memory_min_bytes=1) as c:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda p: c.gemm(*p), pairs))
        for (a, b), got in zip(pairs, results):
            assert rel_error(got, a, b) < FP32_TOLERANCE
        assert 1 <= len(c.regions().regions) <= 4


def test_server_without_shared_memory(no_shm_server, rng):
    with unix_client(no_shm_server, shared_memory_min_bytes=1) as c:
        with pytest.raises(hgemm.FailedPrecondition, match="allow_shared_memory"):
            c.shared_buffer((8, 8))
        a, b = fp16(rng, 64, 64), fp16(rng, 64, 32)
        assert rel_error(c.gemm(a, b), a, b) < FP32_TOLERANCE  # as bytes
        assert isinstance(c._calls.shm.arena_refused, hgemm.FailedPrecondition)
        assert rel_error(c.gemm(a, b), a, b) < FP32_TOLERANCE


def test_shared_memory_needs_a_unix_target(server):
    with hgemm.Client(server.address) as c:
        with pytest.raises(ValueError, match="unix:"):
            c.shared_buffer((4, 4))
    with pytest.raises(ValueError, match="unix:"):
        hgemm.Client(server.address, shared_memory=True)


def test_shared_memory_off_sends_bytes(shm_server, rng, monkeypatch):
    with unix_client(shm_server, shared_memory=False, shared_memory_min_bytes=1) as c:
        a, b = fp16(rng, 64, 64), fp16(rng, 64, 32)
        assert rel_error(c.gemm(a, b), a, b) < FP32_TOLERANCE
        assert labels(c) == []


def test_aio_client(shm_server, rng):
    async def main():
        async with hgemm.aio.Client(shm_server.unix, client_id=f"shm-{uuid.uuid4().hex[:8]}",
                                    shared_memory_min_bytes=1) as c:
            a = await c.shared_buffer((96, 80))
            a[:] = fp16(rng, 96, 80)
            bs = [fp16(rng, 80, 40) for _ in range(6)]
            cs = await asyncio.gather(*(c.gemm(a, b) for b in bs))
            for b, got in zip(bs, cs):
                assert rel_error(got, a, b) < FP32_TOLERANCE
            return len((await c.regions()).regions)
    assert 2 <= asyncio.run(main()) <= 7  # the buffer, and an arena per GEMM in flight


def test_upload_of_a_shared_buffer_sends_no_chunks(shm_server, rng, monkeypatch):
    with unix_client(shm_server) as c:
        sent = []
        upload = c._stub.UploadMatrix

        def counted(messages, *args, **kwargs):
            messages = list(messages)
            sent.extend(len(m) for m in messages)
            return upload(iter(messages), *args, **kwargs)
        monkeypatch.setattr(c._stub, "UploadMatrix", counted)
        b = c.shared_buffer((300, 200))
        values = fp16(rng, 300, 200)
        b[:] = values
        with c.upload(b) as hb:
            assert len(sent) == 1 and sent[0] < 256  # the header alone
            b[:] = 0  # copied at the upload: the resident matrix keeps the values it had
            np.testing.assert_array_equal(c.download(hb), values)
            a = fp16(rng, 50, 300)
            assert rel_error(c.gemm(a, hb), a, values) < FP32_TOLERANCE

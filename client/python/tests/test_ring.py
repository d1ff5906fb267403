"""GEMMs of shared buffers through a submission ring (native core, C ABI revision 6) against a
real server over its Unix socket (CPU backend): results against numpy, many threads on one
ring, errors mapped as the Gemm call's, a ring reopened for new regions, turned off by option
or $HGEMM_RING. On the grpcio core the same calls go as Gemm calls and must give the same
results and errors."""
import asyncio
import concurrent.futures
import uuid

import numpy as np
import pytest

import hgemm
from hgemm import _native
from hgemm._proto import hgemm_pb2 as pb
from conftest import FP32_TOLERANCE, fp16, rel_error


def unix_client(server, **options):
    return hgemm.Client(server.unix, client_id=f"ring-{uuid.uuid4().hex[:8]}", timeout=120,
                        **options)


def ring_gemms(client, monkeypatch):
    """The outcomes of the client's GEMMs through its ring ("ring", "fallback" or the error's
    code name each); None on the grpcio core (no ring there)."""
    native = client._calls.native
    if native is None:
        return None
    outcomes = []
    if isinstance(client, hgemm.aio.Client):  # awaited through hgemm_ring_gemm_start
        release = native._rings.release

        def released(ring, retire):  # once per GEMM the ring took; retire: UNAVAILABLE
            outcomes.append("fallback" if retire else "ring")
            release(ring, retire)
        monkeypatch.setattr(native._rings, "release", released)
        return outcomes
    ring_gemm = native._ring_gemm

    def recorded(*args):
        try:
            done = ring_gemm(*args)
        except _native.NativeRpcError as e:
            outcomes.append(e.code().name)
            raise
        outcomes.append("fallback" if done is None else "ring")
        return done
    monkeypatch.setattr(native, "_ring_gemm", recorded)
    return outcomes


def buffers(client, rng, m, n, k):
    a, b = client.shared_buffer((m, k)), client.shared_buffer((k, n))
    a[:], b[:] = fp16(rng, m, k), fp16(rng, k, n)
    return a, b


def poisoned(client, m, n):
    out = client.shared_buffer((m, n))
    out[...] = np.nan
    return out


def unregister(client, array):
    """Unregisters the region of the shared buffer `array` on the server (it stays mapped here)."""
    handle = client._calls.shm.find(array).region
    if client._calls.native is not None:
        client._calls.native.unregister_region(handle, 30)
    else:
        client._stub.UnregisterRegion(pb.UnregisterRegionRequest(region=handle),
                                      metadata=client._config.metadata)


def test_info_lists_the_ring():
    assert "ring" in hgemm.info()["features"]


def test_gemms_of_shared_buffers_go_through_the_ring(shm_server, rng, monkeypatch):
    with unix_client(shm_server) as c:
        outcomes = ring_gemms(c, monkeypatch)
        a, b = buffers(c, rng, 64, 48, 80)
        for _ in range(3):
            out = poisoned(c, 64, 48)
            assert c.gemm(a, b, out=out) is out
            assert rel_error(out, a, b) < FP32_TOLERANCE
        # A transposed view of a shared buffer, and an fp32 C.
        bt = c.shared_buffer((48, 80))
        bt[:] = fp16(rng, 48, 80)
        out = poisoned(c, 64, 48)
        c.gemm(a, bt.T, out=out)
        assert rel_error(out, a, bt.T) < FP32_TOLERANCE
        out32 = c.shared_buffer((64, 48), dtype=np.float32)
        out32[...] = np.nan
        c.gemm(a, b, out=out32, c_dtype="fp32")
        assert rel_error(out32, a, b) < FP32_TOLERANCE
        if outcomes is not None:
            assert outcomes == ["ring"] * 5
        # The ring's own region is not the client's buffer: regions() lists the buffers alone.
        assert sorted(r.label for r in c.regions().regions) == ["hgemm_buffer"] * 8


def test_many_threads_share_one_ring(shm_server, rng, monkeypatch):
    with unix_client(shm_server) as c:
        outcomes = ring_gemms(c, monkeypatch)
        a, b = buffers(c, rng, 40, 32, 56)
        outs = [poisoned(c, 40, 32) for _ in range(4)]

        def work(out):
            worst = 0.0
            for _ in range(15):
                out[...] = np.nan
                c.gemm(a, b, out=out)
                worst = max(worst, rel_error(out, a, b))
            return worst
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            assert max(pool.map(work, outs)) < FP32_TOLERANCE
        if outcomes is not None:
            assert outcomes == ["ring"] * 60


def test_a_new_region_opens_another_ring_and_close_leaves_no_region(shm_server, rng,
                                                                    monkeypatch):
    client_id = f"ring-{uuid.uuid4().hex[:8]}"
    with hgemm.Client(shm_server.unix, client_id=client_id, timeout=120) as c:
        outcomes = ring_gemms(c, monkeypatch)
        a, b = buffers(c, rng, 30, 20, 40)
        out = poisoned(c, 30, 20)
        c.gemm(a, b, out=out)
        first = None if outcomes is None else c._calls.native._rings._ring
        a2 = c.shared_buffer((30, 40))
        a2[:] = fp16(rng, 30, 40)
        out[...] = np.nan
        c.gemm(a2, b, out=out)
        assert rel_error(out, a2, b) < FP32_TOLERANCE
        out[...] = np.nan
        c.gemm(a, b, out=out)  # the new ring binds the first regions too
        assert rel_error(out, a, b) < FP32_TOLERANCE
        if outcomes is not None:
            assert outcomes == ["ring"] * 3
            assert first.ring is None and c._calls.native._rings._ring is not first
    with hgemm.Client(shm_server.unix, client_id=client_id, timeout=120) as after:
        assert list(after.regions().regions) == []  # buffers and rings alike


@pytest.mark.parametrize("ring", [True, False])
def test_errors_are_mapped_as_the_gemm_calls_and_the_ring_keeps_working(shm_server, rng,
                                                                        monkeypatch, ring):
    with unix_client(shm_server, ring=ring) as c:
        outcomes = ring_gemms(c, monkeypatch)
        a, b = buffers(c, rng, 24, 16, 32)
        out = poisoned(c, 24, 16)
        with pytest.raises(hgemm.InvalidArgument, match="kernel"):
            c.gemm(a, b, out=out, kernel="no_such_kernel")
        gone = c.shared_buffer((24, 32))
        gone[:] = fp16(rng, 24, 32)
        c.gemm(gone, b, out=out)
        unregister(c, gone)
        with pytest.raises(hgemm.NotFound):
            c.gemm(gone, b, out=out)
        out[...] = np.nan
        c.gemm(a, b, out=out)
        assert rel_error(out, a, b) < FP32_TOLERANCE
        if outcomes is not None:
            assert outcomes == (["INVALID_ARGUMENT", "ring", "NOT_FOUND", "ring"] if ring
                                else [])


def test_hgemm_ring_0_turns_the_ring_off(shm_server, rng, monkeypatch):
    monkeypatch.setenv("HGEMM_RING", "0")
    with unix_client(shm_server) as c:
        outcomes = ring_gemms(c, monkeypatch)
        a, b = buffers(c, rng, 20, 12, 28)
        out = poisoned(c, 20, 12)
        c.gemm(a, b, out=out)
        assert rel_error(out, a, b) < FP32_TOLERANCE
        assert outcomes in (None, [])


def test_details_and_c_inputs_go_as_gemm_calls(shm_server, rng, monkeypatch):
    with unix_client(shm_server) as c:
        outcomes = ring_gemms(c, monkeypatch)
        a, b = buffers(c, rng, 20, 12, 28)
        out = poisoned(c, 20, 12)
        r = c.gemm(a, b, out=out, details=True)
        assert r.execution.backend == "cpu" and rel_error(out, a, b) < FP32_TOLERANCE
        base = fp16(rng, 20, 12)
        out[...] = np.nan
        c.gemm(a, b, out=out, beta=1.0, c=base)
        ref = np.asarray(a, np.float64) @ np.asarray(b, np.float64) + base
        assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < FP32_TOLERANCE
        assert outcomes in (None, [])



def test_aio_client_gemms_of_shared_buffers_go_through_the_ring(shm_server, rng, monkeypatch):
    async def main():
        async with hgemm.aio.Client(shm_server.unix, client_id=f"ring-{uuid.uuid4().hex[:8]}",
                                    timeout=120) as c:
            outcomes = ring_gemms(c, monkeypatch)
            a, b = await c.shared_buffer((48, 64)), await c.shared_buffer((64, 40))
            a[:], b[:] = fp16(rng, 48, 64), fp16(rng, 64, 40)
            outs = [await c.shared_buffer((48, 40)) for _ in range(4)]
            for out in outs:
                out[...] = np.nan
            await asyncio.gather(*(c.gemm(a, b, out=out) for out in outs))
            for out in outs:
                assert rel_error(out, a, b) < FP32_TOLERANCE
            if outcomes is not None:
                assert outcomes == ["ring"] * 4
    asyncio.run(main())


def test_a_server_that_refuses_rings_is_not_asked_again(server, monkeypatch):
    """Over TCP, to a server without --allow_shared_memory, the ring's region is refused
    (FAILED_PRECONDITION): the client's rings are off from then on, without asking again
    (GEMMs go as Gemm calls)."""
    with hgemm.Client(server.address, timeout=120) as c:
        native = c._calls.native
        if native is None:
            pytest.skip("the native core is not in use")
        rings = _native._Rings(native)
        assert rings.acquire(frozenset(["r-none"])) is None
        assert rings.refused.code().name == "FAILED_PRECONDITION"
        monkeypatch.setattr(_native, "_Ring", None)  # any new ring would fail here
        assert rings.acquire(frozenset(["r-none"])) is None
        rings.close()

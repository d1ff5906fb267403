"""GEMMs of shared buffers through a submission ring (native core, C ABI revisions 6 and 8)
against a real server over its Unix socket (CPU backend): results against numpy, many threads
on one ring, errors mapped as the Gemm call's, new regions bound to the open ring, kept C,
timeouts, fallback to Gemm calls (too many rings, a killed server), turned off by option or
$HGEMM_RING. On the grpcio core the same calls go as Gemm calls and must give the same
results and errors."""
import asyncio
import concurrent.futures
import logging
import threading
import time
import uuid

import numpy as np
import pytest

import hgemm
from hgemm import _native
from hgemm._proto import hgemm_pb2 as pb
from conftest import FP32_TOLERANCE, UnixServer, fp16, rel_error


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


def test_a_new_region_is_bound_to_the_open_ring_and_close_leaves_no_region(shm_server, rng,
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
        c.gemm(a, b, out=out)
        assert rel_error(out, a, b) < FP32_TOLERANCE
        if outcomes is not None:
            assert outcomes == ["ring"] * 3
            # a2's region was bound to the ring already open (hgemm_ring_bind), not a new one.
            assert first.ring is not None and c._calls.native._rings._ring is first
            assert c._calls.shm.find(a2).region in first.bound
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



def test_a_verified_gemm_of_shared_buffers_is_checked_and_never_takes_the_ring(shm_server, rng,
                                                                              monkeypatch):
    # The ring's entries carry no Freivalds check: a verified GEMM taking it would come back
    # unchecked.
    with unix_client(shm_server) as c:
        outcomes = ring_gemms(c, monkeypatch)
        a, b = buffers(c, rng, 24, 16, 40)
        for keep_c in (False, True):
            out = None if keep_c else poisoned(c, 24, 16)
            r = c.gemm(a, b, out=out, verify=True, verify_repetitions=2, keep_c=keep_c)
            if keep_c:
                assert rel_error(r.download(), a, b) < FP32_TOLERANCE
                r.release()
            else:
                assert rel_error(out, a, b) < FP32_TOLERANCE
        detailed = c.gemm(a, b, verify=True, verify_repetitions=2, details=True)
        assert detailed.execution.verified_repetitions == 2
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


def test_kept_c_goes_through_the_ring(shm_server, rng, monkeypatch):
    """keep_c=True with A and B in shared buffers: one ring entry, C stays on the server."""
    with unix_client(shm_server) as c:
        outcomes = ring_gemms(c, monkeypatch)
        a, b = buffers(c, rng, 36, 28, 44)
        kept = c.gemm(a, b, keep_c=True)
        assert isinstance(kept, hgemm.ResidentMatrix)
        assert (kept.rows, kept.cols) == (36, 28)
        assert rel_error(kept.download(), a, b) < FP32_TOLERANCE
        # The kept C as the next GEMM's A (a resident operand: a Gemm call).
        b2 = c.shared_buffer((28, 20))
        b2[:] = fp16(rng, 28, 20)
        c2 = c.gemm(kept, b2)
        ref = (np.asarray(a, np.float64) @ np.asarray(b, np.float64)).astype(np.float16)
        assert rel_error(c2, ref, b2) < FP32_TOLERANCE
        kept.release()
        if outcomes is not None:
            assert outcomes == ["ring"]


def test_a_ring_gemm_past_its_timeout_is_deadline_exceeded(shm_server, rng):
    """timeout= is the ring entry's deadline: DEADLINE_EXCEEDED on time. After ring_drain() C
    holds its old bytes (the server skipped the late entry) or the whole product."""
    with unix_client(shm_server) as c:
        a, b = buffers(c, rng, 768, 768, 768)  # far longer than 1 ms on the CPU backend
        out = poisoned(c, 768, 768)
        with pytest.raises(hgemm.DeadlineExceeded):
            c.gemm(a, b, out=out, timeout=0.001)
        if c._calls.native is None:
            return  # a Gemm call: nothing to drain
        c._calls.native.ring_drain()
        if not np.isnan(out).all():
            assert rel_error(out, a, b) < FP32_TOLERANCE
        out[...] = np.nan
        c.gemm(a, b, out=out)
        assert rel_error(out, a, b) < FP32_TOLERANCE


def test_too_many_rings_fall_back_to_gemm_calls_and_info_says_so(rng, monkeypatch):
    server = UnixServer("--cpu_workers=2", "--allow_shared_memory", "--max_rings_per_client=1")
    try:
        client_id = f"ring-{uuid.uuid4().hex[:8]}"
        with hgemm.Client(server.unix, client_id=client_id, timeout=120) as first, \
                hgemm.Client(server.unix, client_id=client_id, timeout=120) as second:
            before = hgemm.info().get("ring_fallbacks", {}).get("count", 0)
            outcomes = ring_gemms(second, monkeypatch)
            for c in (first, second):
                a, b = buffers(c, rng, 24, 20, 28)
                out = poisoned(c, 24, 20)
                c.gemm(a, b, out=out)
                assert rel_error(out, a, b) < FP32_TOLERANCE
            if outcomes is not None:
                assert outcomes == ["fallback"]
                fallbacks = hgemm.info()["ring_fallbacks"]
                assert fallbacks["count"] == before + 1
                assert "max_rings_per_client" in fallbacks["last_reason"]
    finally:
        server.stop()


def test_a_killed_server_ends_every_ring_gemm_correct_or_unavailable(rng, caplog):
    """Threads run ring GEMMs while the server process is killed: each GEMM either matches
    numpy or raises Unavailable (the ring's GEMM in flight gets UNAVAILABLE, the Gemm call it
    falls back to finds no server): none hangs; the fallback is counted and logged."""
    server = UnixServer("--cpu_workers=2", "--allow_shared_memory")
    try:
        with hgemm.Client(server.unix, client_id=f"ring-{uuid.uuid4().hex[:8]}", timeout=30,
                          retries=1) as c:
            before = hgemm.info().get("ring_fallbacks", {}).get("count", 0)
            a, b = buffers(c, rng, 64, 64, 64)
            outs = [poisoned(c, 64, 64) for _ in range(4)]
            done = [0] * len(outs)
            ended = [None] * len(outs)
            wrong = []

            def work(i):
                out = outs[i]
                while True:
                    out[...] = np.nan
                    try:
                        c.gemm(a, b, out=out)
                    except hgemm.Error as e:
                        ended[i] = e
                        return
                    if rel_error(out, a, b) >= FP32_TOLERANCE:
                        wrong.append(i)
                    done[i] += 1
            threads = [threading.Thread(target=work, args=(i,)) for i in range(len(outs))]
            with caplog.at_level(logging.WARNING, logger="hgemm"):
                for t in threads:
                    t.start()
                deadline = time.monotonic() + 60
                while sum(done) < 100 and time.monotonic() < deadline:
                    time.sleep(0.001)
                server.process.kill()
                for t in threads:
                    t.join(timeout=120)
                    assert not t.is_alive(), "a GEMM hung after the server was killed"
            assert sum(done) >= 100 and not wrong
            assert all(isinstance(e, hgemm.Unavailable) for e in ended), ended
            if c._calls.native is not None:
                assert hgemm.info()["ring_fallbacks"]["count"] > before
                assert any("no submission ring" in r.getMessage() for r in caplog.records)
    finally:
        server.stop()

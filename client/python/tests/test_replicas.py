"""Resident matrices over three replicas: real hgemm_server processes, each with
--advertise_address, behind one multi-address target. Calls naming a matrix go to the replica
that holds it, the rest are balanced; mixed replicas in one GEMM are refused before sending; a
killed replica fails only the calls naming its matrices."""
import asyncio
import threading

import numpy as np
import pytest

import hgemm
import hgemm.aio
from conftest import FP32_TOLERANCE, Server, fp16, free_port, rel_error


@pytest.fixture
def replicas():
    ports = [free_port() for _ in range(3)]
    servers = [Server("--cpu_workers=1", f"--advertise_address=127.0.0.1:{p}",
                      listen=f"127.0.0.1:{p}") for p in ports]
    yield servers
    for s in servers:
        s.stop()


def target_of(servers) -> str:
    return "ipv4:" + ",".join(s.address for s in servers)


def answering(client, calls: int) -> set:
    return {client.info().replica for _ in range(calls)}


def test_balanced_calls_reach_every_replica(replicas):
    everyone = {s.address for s in replicas}
    with hgemm.Client(target_of(replicas), timeout=60) as c:
        # round_robin balances over the replicas it has connected to, at first maybe fewer.
        for _ in range(1000):
            if answering(c, 3) == everyone:
                break
        assert answering(c, 3) == everyone
        for s in replicas:
            assert c.info(replica=s.address).replica == s.address


def test_cycles_from_threads_route_to_the_owner(replicas, rng):
    owners, errors, lock = [], [], threading.Lock()
    everyone = {s.address for s in replicas}
    with hgemm.Client(target_of(replicas), timeout=60, retries=1) as c:
        for _ in range(1000):  # connected to all: the balanced uploads take turns
            if answering(c, 3) == everyone:
                break

        def cycles(seed):
            local = np.random.default_rng(seed)
            try:
                for _ in range(30):
                    m, k, n, p = (int(x) for x in local.integers(4, 40, size=4))
                    a, b, b2 = fp16(local, m, k), fp16(local, k, n), fp16(local, n, p)
                    ha = c.upload(a)
                    hb = c.upload(b, replica=ha)
                    assert hb.replica == ha.replica != ""
                    hc = c.gemm(ha, hb, keep_c=True)
                    assert hc.replica == ha.replica
                    d = c.gemm(hc, b2)
                    c_values = hc.download()
                    assert rel_error(c_values, a, b) < FP32_TOLERANCE
                    assert rel_error(d, c_values, b2) < FP32_TOLERANCE
                    for h in (ha, hb, hc):
                        h.release()
                    with lock:
                        owners.append(ha.replica)
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(e)
        threads = [threading.Thread(target=cycles, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[0]
        assert len(owners) == 90
        assert set(owners) == everyone
        for s in replicas:
            assert len(c.matrices(replica=s.address)) == 0


def test_matrices_of_two_replicas_in_one_gemm_are_refused(replicas, rng):
    a, b = fp16(rng, 8, 8), fp16(rng, 8, 8)
    with hgemm.Client(target_of(replicas), timeout=60) as c:
        ha = c.upload(a, replica=replicas[0].address)
        hb = c.upload(b, replica=replicas[1].address)
        hb_with_a = c.upload(b, replica=ha)
        with pytest.raises(hgemm.FailedPrecondition) as e:
            c.gemm(ha, hb)
        for part in (ha.handle, hb.handle, replicas[0].address, replicas[1].address):
            assert part in e.value.message
        results = c.gemm_many([(ha, hb), (ha, hb_with_a)], return_exceptions=True)
        assert isinstance(results[0], hgemm.FailedPrecondition)
        assert rel_error(results[1], a, b) < FP32_TOLERANCE
        assert sum(c.info(replica=s.address).load.admitted_total for s in replicas) == 1


def test_a_gone_replica_fails_only_calls_naming_its_matrices(replicas, rng):
    a, b = fp16(rng, 16, 16), fp16(rng, 16, 16)
    with hgemm.Client(target_of(replicas), timeout=60) as c:
        held = [c.upload(a, replica=s.address) for s in replicas]
        assert rel_error(c.gemm(held[1], b), a, b) < FP32_TOLERANCE
        replicas[1].process.kill()
        replicas[1].process.wait()
        gone = replicas[1].address
        for call in (lambda: c.gemm(held[1], b), held[1].download, held[1].release,
                     lambda: c.gemm_many([(held[1], b)])):
            with pytest.raises(hgemm.Unavailable) as e:
                call()
            assert f"replica {gone} cannot be reached" in e.value.message
            assert "upload them again" in e.value.message
        for i in (0, 2):
            assert rel_error(c.gemm(held[i], b), a, b) < FP32_TOLERANCE
            held[i].release()
        answered = set()
        for _ in range(20):  # three balanced calls a round: both replicas answer some
            assert rel_error(c.gemm(a, b), a, b) < FP32_TOLERANCE
            answered |= answering(c, 2)
        assert answered == {replicas[0].address, replicas[2].address}


def test_aio_client_routes_too(replicas, rng):
    a, b, b2 = fp16(rng, 12, 10), fp16(rng, 10, 8), fp16(rng, 8, 6)

    async def cycle():
        async with hgemm.aio.Client(target_of(replicas), timeout=60) as c:
            ha = await c.upload(a)
            hb = await c.upload(b, replica=ha)
            hc = await c.gemm(ha, hb, keep_c=True)
            assert hc.replica == hb.replica == ha.replica
            d = await c.gemm(hc, b2)
            c_values = await hc.download()
            for h in (ha, hb, hc):
                await h.release()
            return c_values, d
    c_values, d = asyncio.run(cycle())
    assert rel_error(c_values, a, b) < FP32_TOLERANCE
    assert rel_error(d, c_values, b2) < FP32_TOLERANCE

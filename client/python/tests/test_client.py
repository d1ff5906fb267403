"""hgemm.Client against a real hgemm_server (CPU backend) on 127.0.0.1."""
import numpy as np
import pytest

import hgemm
from conftest import FP16_TOLERANCE, FP32_TOLERANCE, fp16, rel_error


class Spy:
    """Counts the unary and streamed GEMM calls a client makes (through either core)."""

    def __init__(self, client, monkeypatch):
        self.unary = self.stream = 0
        native = client._calls.native
        if native is not None:
            native_gemm = native.gemm

            def counted_native(spec, streamed, out, timeout):
                self.unary += not streamed
                self.stream += streamed
                return native_gemm(spec, streamed, out, timeout)
            monkeypatch.setattr(native, "gemm", counted_native)
        stub = client._stub
        gemm, gemm_stream = stub.Gemm, stub.GemmStream

        def counted_gemm(*args, **kwargs):
            self.unary += 1
            return gemm(*args, **kwargs)

        def counted_stream(*args, **kwargs):
            self.stream += 1
            return gemm_stream(*args, **kwargs)
        monkeypatch.setattr(stub, "Gemm", counted_gemm)
        monkeypatch.setattr(stub, "GemmStream", counted_stream)


def test_info_and_kernels(client):
    info = client.info()
    assert info.backend == "cpu"
    assert info.version
    assert info.limits.max_message_bytes >= 4 << 20
    assert info.limits.stream_chunk_bytes > 0
    kernels = client.kernels()
    names = [k.name for k in kernels]
    assert "auto" in names
    assert len(names) == len(set(names))
    for k in kernels:
        assert set(k.accumulations) <= {"fp16", "fp32"}, k


@pytest.mark.parametrize("mode", ["unary", "stream"])
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (3, 5, 7), (255, 257, 100), (17, 1, 333),
                                   (1, 300, 2), (128, 64, 64)])
def test_gemm_odd_shapes(client, rng, mode, m, n, k):
    a, b = fp16(rng, m, k), fp16(rng, k, n)
    c = client.gemm(a, b, mode=mode)
    assert isinstance(c, np.ndarray) and c.dtype == np.float16 and c.shape == (m, n)
    assert c.flags.c_contiguous and rel_error(c, a, b) < FP32_TOLERANCE
    # Read-only, unary (a view of the message) and streamed alike; a copy is writable.
    assert not c.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        c += 1
    writable = c.copy()
    writable += 1


@pytest.mark.parametrize("side", [0.9, 1.1])
def test_auto_switch_around_unary_limit(server, rng, monkeypatch, side):
    """mode auto: unary at or below unary_limit_bytes, streamed above, both correct."""
    limit = 1 << 20
    with hgemm.Client(server.address, unary_limit_bytes=limit, timeout=120) as c:
        spy = Spy(c, monkeypatch)
        s = int((side * limit / 4) ** 0.5)  # A + B = 2·s² + 2·s² bytes
        a, b = fp16(rng, s, s), fp16(rng, s, s)
        result = c.gemm(a, b)
        assert rel_error(result, a, b) < FP32_TOLERANCE
        assert (spy.unary, spy.stream) == ((1, 0) if side < 1 else (0, 1))


def test_auto_streams_past_the_servers_message_limit(small_server, rng, monkeypatch):
    """A 4 MiB server: auto mode asks its limit and streams a 6 MiB GEMM; forced unary fails."""
    a, b = fp16(rng, 1024, 1024), fp16(rng, 1024, 1024)
    with hgemm.Client(small_server.address, timeout=120) as c:
        spy = Spy(c, monkeypatch)
        assert rel_error(c.gemm(a, b), a, b) < FP32_TOLERANCE
        assert (spy.unary, spy.stream) == (0, 1)
        with pytest.raises(hgemm.ResourceExhausted) as e:
            c.gemm(a, b, mode="unary")
        assert e.value.status == "RESOURCE_EXHAUSTED"


def test_unary_result_over_grpcs_default_4mib(client, rng, monkeypatch):
    """C of 4.5 MiB on a unary call: the client's receive limit is lifted."""
    a, b = fp16(rng, 1536, 16), fp16(rng, 16, 1536)
    spy = Spy(client, monkeypatch)
    c = client.gemm(a, b, mode="unary")
    assert spy.unary == 1
    assert rel_error(c, a, b) < FP32_TOLERANCE


def test_streamed_result_in_many_chunks_and_odd_chunk_size(server, rng):
    """C of 2.3 MiB comes in several server chunks; operands go in 999-byte chunks (chunk
    boundaries inside an fp16 value)."""
    a, b = fp16(rng, 1000, 50), fp16(rng, 50, 1200)
    with hgemm.Client(server.address, chunk_bytes=999, timeout=120) as c:
        assert rel_error(c.gemm(a, b, mode="stream"), a, b) < FP32_TOLERANCE


@pytest.mark.parametrize("mode", ["unary", "stream"])
def test_fp32_accumulation(client, rng, mode):
    a, b = fp16(rng, 200, 300), fp16(rng, 300, 100)
    r = client.gemm(a, b, accumulation="fp32", details=True, mode=mode, request_id="r-fp32")
    assert rel_error(r.c, a, b) < FP32_TOLERANCE
    assert r.execution.accumulation == "fp32"
    assert r.execution.backend == "cpu"
    assert r.execution.kernel != "auto"
    assert r.request_id == "r-fp32"
    assert r.timing.kernel_ms >= 0 and r.timing.server_total_ms >= r.timing.kernel_ms


@pytest.mark.parametrize("mode", ["unary", "stream"])
def test_verified_gemm_shows_its_check(client, rng, mode):
    a, b = fp16(rng, 96, 130), fp16(rng, 130, 70)
    r = client.gemm(a, b, verify=True, verify_repetitions=2, details=True, mode=mode)
    assert rel_error(r.c, a, b) < FP32_TOLERANCE
    assert r.execution.verified_repetitions == 2
    assert r.execution.suspect_device_id is None
    assert r.timing.verify_ms >= 0
    plain = client.gemm(a, b, details=True, mode=mode)
    assert plain.execution.verified_repetitions == 0
    with pytest.raises(ValueError, match="verify_repetitions"):
        client.gemm(a, b, verify=True, verify_repetitions=9)


@pytest.mark.parametrize("mode", ["unary", "stream"])
def test_fp16_accumulation_result_or_refusal_matches_kernels(client, rng, mode):
    """fp16 accumulation: the server either computes it (within fp16 tolerance, with a kernel
    and accumulation ListKernels lists) or refuses with INVALID_ARGUMENT, and then no concrete
    kernel may claim fp16."""
    a, b = fp16(rng, 100, 300), fp16(rng, 300, 80)
    kernels = {k.name: k for k in client.kernels()}
    try:
        r = client.gemm(a, b, accumulation="fp16", details=True, mode=mode)
    except hgemm.InvalidArgument as e:
        assert e.status == "INVALID_ARGUMENT"
        assert "fp16" in e.message.lower() or "accumulation" in e.message.lower(), e.message
        assert not [k for k in kernels.values() if k.name != "auto" and "fp16" in k.accumulations]
        return
    assert rel_error(r.c, a, b) < FP16_TOLERANCE
    assert r.execution.kernel in kernels, (r.execution.kernel, list(kernels))
    assert r.execution.accumulation in kernels[r.execution.kernel].accumulations


def test_named_kernel_without_fp16_refuses_fp16(client, rng):
    a, b = fp16(rng, 8, 8), fp16(rng, 8, 8)
    fp32_only = [k for k in client.kernels() if k.name != "auto" and "fp16" not in k.accumulations]
    if not fp32_only:
        pytest.skip("every kernel of this server has fp16 accumulation")
    for k in fp32_only:
        with pytest.raises(hgemm.InvalidArgument, match="accumulation"):
            client.gemm(a, b, kernel=k.name, accumulation="fp16")
        c = client.gemm(a, b, kernel=k.name, accumulation="fp32")
        assert rel_error(c, a, b) < FP32_TOLERANCE


@pytest.mark.parametrize("mode", ["unary", "stream"])
def test_resident_matrices(client, rng, mode):
    a, b, b2 = fp16(rng, 60, 40), fp16(rng, 40, 30), fp16(rng, 30, 20)
    hb = client.upload(b, label="weights")
    assert (hb.rows, hb.cols, hb.shape, hb.bytes) == (40, 30, (40, 30), 2 * 40 * 30)
    assert hb.handle in [m.handle for m in client.matrices()]
    assert np.array_equal(hb.download(), b)
    assert rel_error(client.gemm(a, hb, mode=mode), a, b) < FP32_TOLERANCE
    ha = client.upload(a)
    assert rel_error(client.gemm(ha, hb, mode=mode), a, b) < FP32_TOLERANCE
    # keep_c: C stays on the server; chain it as the next A.
    hc = client.gemm(a, hb, keep_c=True, mode=mode)
    assert isinstance(hc, hgemm.ResidentMatrix) and hc.shape == (60, 30)
    c = hc.download()
    assert c.dtype == np.float16 and rel_error(c, a, b) < FP32_TOLERANCE
    assert not c.flags.writeable
    assert np.array_equal(client.download(hc), c)
    c2 = client.gemm(hc, b2, mode=mode)
    assert rel_error(c2, c, b2) < FP32_TOLERANCE
    listed = client.matrices()
    assert {hb.handle, ha.handle, hc.handle} <= {m.handle for m in listed}
    assert listed.client_bytes >= hb.bytes + ha.bytes + hc.bytes
    assert listed.quota_bytes > 0
    for h in (hb, ha, hc):
        assert h.release() == h.bytes
        assert h.released and h.release() == 0  # this object knows it released it
    assert not {hb.handle, ha.handle, hc.handle} & {m.handle for m in client.matrices()}
    # Use after release: NOT_FOUND from the server, on every path.
    with pytest.raises(hgemm.NotFound) as e:
        client.gemm(a, hb, mode=mode)
    assert e.value.status == "NOT_FOUND" and hb.handle in e.value.message
    with pytest.raises(hgemm.NotFound):
        hc.download()
    with pytest.raises(hgemm.NotFound):
        client.gemm(hc, b2, mode=mode)


def test_resident_matrix_context_manager(client, rng):
    b = fp16(rng, 16, 16)
    with client.upload(b) as hb:
        assert hb.handle in [m.handle for m in client.matrices()]
    assert hb.released
    assert hb.handle not in [m.handle for m in client.matrices()]
    # Releasing a handle this object did not release itself: the server says NOT_FOUND.
    stale = hgemm.ResidentMatrix(client, hb.info)
    with pytest.raises(hgemm.NotFound):
        stale.release()


def test_gemm_many_in_order(client, rng):
    pairs = [(fp16(rng, m, 10 + m), fp16(rng, 10 + m, 3 + m)) for m in (1, 7, 30, 64)]
    big = (fp16(rng, 700, 800), fp16(rng, 800, 900))  # several chunks each way
    pairs.insert(2, big)
    results = client.gemm_many(pairs)
    assert len(results) == len(pairs)
    for (a, b), c in zip(pairs, results):
        assert rel_error(c, a, b) < FP32_TOLERANCE


def test_gemm_many_with_handles_keep_c_and_details(client, rng):
    a, b = fp16(rng, 20, 30), fp16(rng, 30, 40)
    with client.upload(b) as hb:
        results = client.gemm_many(
            [(a, hb), (a, b, {"keep_c": True}), (a, hb, {"request_id": "x"})], details=True)
        assert rel_error(results[0].c, a, b) < FP32_TOLERANCE
        kept = results[1].c
        assert isinstance(kept, hgemm.ResidentMatrix)
        with kept:
            assert rel_error(kept.download(), a, b) < FP32_TOLERANCE
        assert results[2].request_id == "x"
        assert results[2].execution.backend == "cpu"


def test_gemm_many_failing_gemm_in_the_middle(client, rng):
    """A GEMM naming a released handle fails on its own (NOT_FOUND); the rest succeed."""
    a, b = fp16(rng, 10, 20), fp16(rng, 20, 30)
    gone = client.upload(b)
    gone.release()
    pairs = [(a, b), (a, b), (a, gone), (a, b), (fp16(rng, 500, 500), fp16(rng, 500, 600))]
    results = client.gemm_many(pairs, return_exceptions=True)
    assert isinstance(results[2], hgemm.NotFound)
    assert results[2].index == 2 and results[2].status == "NOT_FOUND"
    for i in (0, 1, 3, 4):
        assert rel_error(results[i], *pairs[i]) < FP32_TOLERANCE, i
    # Without return_exceptions: the failing GEMM's error is raised, the others attached.
    with pytest.raises(hgemm.NotFound) as e:
        client.gemm_many(pairs)
    assert e.value.index == 2
    assert isinstance(e.value.results[2], hgemm.NotFound)
    assert rel_error(e.value.results[4], *pairs[4]) < FP32_TOLERANCE


def test_gemm_many_invalid_header_in_the_middle(client, rng):
    """An invalid header ends the server's stream; the client fails that GEMM alone and sends
    the GEMMs after it again on a new stream."""
    a, b = fp16(rng, 12, 13), fp16(rng, 13, 14)
    pairs = [(a, b), (a, b, {"kernel": "no_such_kernel"}), (a, b), (a, b)]
    results = client.gemm_many(pairs, return_exceptions=True)
    assert isinstance(results[1], hgemm.InvalidArgument), results[1]
    assert "no_such_kernel" in results[1].message and results[1].index == 1
    for i in (0, 2, 3):
        assert rel_error(results[i], a, b) < FP32_TOLERANCE


def test_gemm_many_empty(client):
    assert client.gemm_many([]) == []


@pytest.mark.parametrize("mode", ["unary", "stream"])
def test_server_errors_carry_status_names(client, rng, mode):
    a, b = fp16(rng, 4, 4), fp16(rng, 4, 4)
    with pytest.raises(hgemm.InvalidArgument) as e:
        client.gemm(a, b, kernel="no_such_kernel", mode=mode)
    assert e.value.status == "INVALID_ARGUMENT"
    assert "no_such_kernel" in e.value.message
    assert str(e.value).startswith("INVALID_ARGUMENT: ")
    assert isinstance(e.value, hgemm.Error)


def test_traceparent_is_logged_with_a_refused_call(server, rng):
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    a, b = fp16(rng, 4, 4), fp16(rng, 4, 4)
    with hgemm.Client(server.address, traceparent=trace) as c:
        with pytest.raises(hgemm.InvalidArgument):
            c.gemm(a, b, kernel="no_such_kernel", request_id="py-trace-1", mode="unary")
    lines = [l for l in server.log_text().splitlines() if "request_id=py-trace-1" in l]
    assert len(lines) == 1, server.log_text()
    assert f"traceparent={trace}" in lines[0] and "Gemm INVALID_ARGUMENT" in lines[0]


def test_resource_exhausted_over_elements_limit(small_server, rng):
    a, b = fp16(rng, 1025, 1024), fp16(rng, 1024, 2)  # A: 1025·1024 > 2^20 elements
    with hgemm.Client(small_server.address, timeout=60) as c:
        for mode in ("unary", "stream"):
            with pytest.raises(hgemm.ResourceExhausted) as e:
                c.gemm(a, b, mode=mode)
            assert e.value.status == "RESOURCE_EXHAUSTED"
        with pytest.raises(hgemm.ResourceExhausted):
            c.upload(a)


def test_deadline_exceeded(client, rng):
    a, b = fp16(rng, 1024, 1024), fp16(rng, 1024, 1024)
    for mode in ("unary", "stream"):
        with pytest.raises(hgemm.DeadlineExceeded) as e:
            client.gemm(a, b, mode=mode, timeout=0.001)
        assert e.value.status == "DEADLINE_EXCEEDED"


def test_unreachable_server_is_unavailable_after_retries():
    import socket
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with hgemm.Client(f"127.0.0.1:{port}", retries=2, timeout=10) as c:
        with pytest.raises(hgemm.Unavailable) as e:
            c.info()
        assert e.value.status == "UNAVAILABLE"


def test_local_argument_errors(client, rng):
    a = fp16(rng, 4, 5)
    with pytest.raises(ValueError, match="columns must equal B's rows"):
        client.gemm(a, fp16(rng, 4, 5))
    with pytest.raises(ValueError, match="2-D"):
        client.gemm(np.zeros(5, np.float16), a)
    with pytest.raises(TypeError, match="float16"):
        client.gemm(np.zeros((5, 4), np.int32), a)
    with pytest.raises(ValueError, match="mode"):
        client.gemm(a, a.T, mode="fast")
    with pytest.raises(ValueError, match="accumulation"):
        client.gemm(a, a.T, accumulation="bf16")


def test_float32_is_converted_with_a_warning(client, rng):
    a = rng.uniform(-1, 1, (30, 40)).astype(np.float32)
    b = rng.uniform(-1, 1, (40, 20))  # float64
    with pytest.warns(hgemm.ConversionWarning, match="converted to float16"):
        c = client.gemm(a, b)
    assert c.dtype == np.float16
    assert rel_error(c, a.astype(np.float16), b.astype(np.float16)) < FP32_TOLERANCE
    with pytest.warns(hgemm.ConversionWarning), pytest.raises(ValueError, match="fp16's range"):
        client.gemm(a * 1e6, b)


@pytest.mark.parametrize("mode", ["unary", "stream"])
def test_out_receives_c(client, rng, mode):
    a, b = fp16(rng, 37, 50), fp16(rng, 50, 23)
    out = np.full((37, 23), np.nan, dtype=np.float16)
    assert client.gemm(a, b, out=out, mode=mode) is out
    assert out.flags.writeable and rel_error(out, a, b) < FP32_TOLERANCE
    out[:] = np.nan
    r = client.gemm(a, b, out=out, mode=mode, details=True)
    assert r.c is out and rel_error(out, a, b) < FP32_TOLERANCE


def test_out_is_checked_before_sending(client, rng):
    a, b = fp16(rng, 4, 5), fp16(rng, 5, 6)
    with pytest.raises(ValueError, match="4x6"):
        client.gemm(a, b, out=np.empty((4, 5), np.float16))
    with pytest.raises(ValueError, match="4x6"):
        client.gemm(a, b, out=np.empty((6, 4), np.float16).T)
    with pytest.raises(TypeError, match="float16"):
        client.gemm(a, b, out=np.empty((4, 6), np.float32))
    with pytest.raises(ValueError, match="keep_c"):
        client.gemm(a, b, out=np.empty((4, 6), np.float16), keep_c=True)


def test_non_contiguous_and_big_endian_inputs(client, rng):
    base = fp16(rng, 60, 80)
    a = base[::2, 1::2]            # strided view, 30x40
    b = fp16(rng, 20, 40).T        # Fortran order, 40x20
    assert not a.flags.c_contiguous and not b.flags.c_contiguous
    c = client.gemm(a, b)
    assert rel_error(c, a, b) < FP32_TOLERANCE
    big_endian = b.astype(">f2")
    assert rel_error(client.gemm(a, big_endian), a, b) < FP32_TOLERANCE
    assert base[::2, 1::2].base is base  # inputs untouched


def test_progress_bar_when_asked(server, rng, capfd):
    pytest.importorskip("tqdm")
    a, b = fp16(rng, 64, 64), fp16(rng, 64, 64)
    with hgemm.Client(server.address, progress=True, timeout=60) as c:
        assert rel_error(c.gemm(a, b, mode="stream"), a, b) < FP32_TOLERANCE
    assert "hgemm" in capfd.readouterr().err
    with hgemm.Client(server.address, timeout=60) as c:  # default: only past 256 MiB
        c.gemm(a, b, mode="stream")
    assert "hgemm" not in capfd.readouterr().err


def test_client_id_owns_matrices(server, rng):
    b = fp16(rng, 8, 8)
    with hgemm.Client(server.address, client_id="alice") as alice, \
            hgemm.Client(server.address, client_id="bob") as bob:
        with alice.upload(b) as hb:
            assert hb.handle in [m.handle for m in alice.matrices()]
            assert hb.handle not in [m.handle for m in bob.matrices()]


def test_calls_after_close_raise_value_error(server, rng):
    c = hgemm.Client(server.address, timeout=30)
    a = fp16(rng, 4, 4)
    g = c.prepare(a, a)
    c.info()
    c.close()
    for call in (lambda: c.gemm(a, a), g, c.info, lambda: c.upload(a)):
        with pytest.raises(ValueError, match="closed"):  # not a crash of the process
            call()

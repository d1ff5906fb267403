"""Client.stream(): one GemmStream for many GEMMs. Its bookkeeping without a server (answers,
retries, how a broken stream settles), then sync and asyncio sessions against the real server."""
import asyncio
import concurrent.futures
import threading

import numpy as np
import pytest

import hgemm
from conftest import FP32_TOLERANCE, fp16, rel_error
from hgemm import _retry, _routes, _session_book, _spec, _wire
from hgemm._proto import hgemm_pb2 as pb

QUEUE_FULL = "queue is full (256 GEMMs); retry with backoff"


def answer(gemm_id, chunk=None, done=None) -> _wire.StreamResponse:
    message = pb.GemmStreamResponse(gemm_id=gemm_id)
    if chunk is not None:
        message.chunk.CopyFrom(chunk)
    if done is not None:
        message.done.CopyFrom(done)
    return _wire.StreamResponse(message.SerializeToString())


def book_with(*specs, attempts=3):
    book = _session_book.SessionBook(_retry.RetryPolicy(attempts=attempts, initial_backoff_s=0.01))
    pendings = [_session_book.Pending(s, object(), False, False, 0.0) for s in specs]
    return book, pendings, [book.add(p) for p in pendings]


def small_spec(keep_c=False):
    return _spec.Spec(np.ones((2, 3), np.float16), np.ones((3, 2), np.float16), keep_c=keep_c)


def test_book_assembles_c_and_forgets_finished_gemms():
    book, (p,), (i,) = book_with(small_spec())
    c = np.arange(4, dtype=np.float16).tobytes()
    assert book.consume(answer(i, chunk=pb.ResultChunk(offset=0, data=c[:6]))) == ([], [])
    assert book.consume(answer(i, chunk=pb.ResultChunk(offset=6, data=c[6:]))) == ([], [])
    finished, retry = book.consume(answer(i, done=pb.GemmDone(request_id="r")))
    assert retry == [] and len(finished) == 1 and finished[0][0] is p
    array, done = finished[0][1]
    assert array.tobytes() == c and done.request_id == "r"
    assert book.pending == {} and book.collector.specs == {} and book.collector.done == {}
    book.consume(answer(i, done=pb.GemmDone()))  # answered twice: the stream is broken
    assert "not in flight" in book.protocol_error.message


def test_book_retries_unavailable_then_gives_up():
    book, (p,), (i,) = book_with(small_spec(), attempts=3)
    full = pb.GemmDone(status_code=14, status_message=QUEUE_FULL)
    finished, retry = book.consume(answer(i, done=full))
    assert finished == [] and retry[0][0] is p and retry[0][1] > 0 and p.attempt == 1
    j = book.add(p)
    assert j != i  # a fresh gemm_id for the second try
    finished, retry = book.consume(answer(j, done=full))
    assert finished == [] and p.attempt == 2
    finished, retry = book.consume(answer(book.add(p), done=full))
    assert retry == [] and isinstance(finished[0][1], hgemm.Unavailable)
    assert finished[0][1].index is None


def test_book_other_errors_finish_the_gemm_alone():
    book, (p, q), (i, j) = book_with(small_spec(), small_spec())
    finished, _ = book.consume(answer(i, done=pb.GemmDone(status_code=5, status_message="gone")))
    assert isinstance(finished[0][1], hgemm.NotFound) and finished[0][1].message == "gone"
    assert list(book.pending) == [j]


def test_book_stream_error_naming_a_gemm():
    """The named GEMM fails alone; those written after it were never admitted and go again."""
    book, ps, ids = book_with(small_spec(), small_spec(), small_spec(keep_c=True))
    err = hgemm.InvalidArgument(f"gemm_id {ids[1]}: header.options.kernel: unknown kernel 'x'")
    book.consume(answer(ids[0], done=pb.GemmDone()))
    finished, retry = book.ended(err)
    assert [(p, type(o)) for p, o in finished] == [(ps[1], hgemm.InvalidArgument)]
    assert retry == [(ps[2], 0.0)]
    assert book.pending == {} and book.add(ps[2]) == ids[2] + 1


def test_book_stream_lost_retries_only_what_is_safe():
    book, (plain, kept), _ = book_with(small_spec(), small_spec(keep_c=True))
    finished, retry = book.ended(hgemm.Unavailable("Connection reset by peer"))
    assert [p for p, _ in retry] == [plain]  # may have made a resident C: not repeated
    assert [(p, type(o)) for p, o in finished] == [(kept, hgemm.Unavailable)]


def test_book_stream_ending_with_gemms_unanswered():
    book, (p,), _ = book_with(small_spec())
    finished, retry = book.ended(None)
    assert retry == [] and isinstance(finished[0][1], hgemm.Internal)


def test_session_replica():
    def spec_on(handle):
        hb = hgemm.ResidentMatrix(None, pb.MatrixInfo(handle=handle, rows=3, cols=2))
        return _spec.Spec(np.ones((2, 3), np.float16), hb)
    assert _routes.session_replica(None, small_spec()) == ""
    assert _routes.session_replica(None, spec_on("m-1@r1:1")) == "r1:1"
    assert _routes.session_replica("r1:1", spec_on("m-2@r1:1")) == "r1:1"
    assert _routes.session_replica("r1:1", small_spec()) == "r1:1"
    with pytest.raises(hgemm.FailedPrecondition, match="replica r2:1"):
        _routes.session_replica("r1:1", spec_on("m-3@r2:1"))
    with pytest.raises(hgemm.FailedPrecondition, match="client's target"):
        _routes.session_replica("", spec_on("m-3@r2:1"))


# Against the real server.

class StreamCount:
    """Counts the GemmStreams a client opens (through grpcio or the native core)."""

    def __init__(self, client, monkeypatch):
        self.opened = 0
        native = client._calls.native
        owner, name = (client._stub, "GemmStream") if native is None else (native, "open_stream")
        open_stream = getattr(owner, name)

        def counted(*args, **kwargs):
            self.opened += 1
            return open_stream(*args, **kwargs)
        monkeypatch.setattr(owner, name, counted)


def test_many_gemms_on_one_stream(client, rng, monkeypatch):
    count = StreamCount(client, monkeypatch)
    pairs = [(fp16(rng, m, 10 + m), fp16(rng, 10 + m, 3 + m)) for m in (1, 7, 30, 64)]
    pairs.insert(2, (fp16(rng, 700, 800), fp16(rng, 800, 900)))  # several chunks each way
    with client.stream() as s:
        futures = [s.submit(a, b) for a, b in pairs]
        assert rel_error(s.gemm(*pairs[0]), *pairs[0]) < FP32_TOLERANCE
        for (a, b), f in zip(pairs, futures):
            c = f.result()
            assert c.shape == (a.shape[0], b.shape[1]) and not c.flags.writeable
            assert rel_error(c, a, b) < FP32_TOLERANCE
    assert count.opened == 1


def test_stream_handles_keep_c_details_and_accumulation(client, rng):
    a, b = fp16(rng, 20, 30), fp16(rng, 30, 40)
    with client.upload(b) as hb, client.stream() as s:
        r = s.gemm(a, hb, details=True, request_id="on-stream", accumulation="fp32")
        assert rel_error(r.c, a, b) < FP32_TOLERANCE
        assert r.request_id == "on-stream" and r.execution.backend == "cpu"
        hc = s.gemm(a, hb, keep_c=True)
        assert isinstance(hc, hgemm.ResidentMatrix) and hc.shape == (20, 40)
        assert rel_error(hc.download(), a, b) < FP32_TOLERANCE
        hc.release()


def test_stream_failing_gemms_fail_alone(client, rng, monkeypatch):
    a, b = fp16(rng, 12, 13), fp16(rng, 13, 14)
    hb = client.upload(b)
    hb.release()
    with client.stream() as s:
        futures = [s.submit(a, b), s.submit(a, hb), s.submit(a, b),
                   s.submit(a, b, kernel="no_such_kernel"), s.submit(a, b), s.submit(a, b)]
        for i in (0, 2, 4, 5):
            assert rel_error(futures[i].result(), a, b) < FP32_TOLERANCE
        with pytest.raises(hgemm.NotFound) as e:
            futures[1].result()
        assert hb.handle in e.value.message and e.value.index is None
        with pytest.raises(hgemm.InvalidArgument, match="no_such_kernel"):
            futures[3].result()
        # The stream goes on (a new one where the server ended it).
        assert rel_error(s.gemm(a, b), a, b) < FP32_TOLERANCE


def test_stream_from_several_threads(client, rng):
    shapes = [(5 + i, 6 + i, 7 + i) for i in range(8)]
    pairs = [(fp16(rng, m, k), fp16(rng, k, n)) for m, n, k in shapes]
    with client.stream() as s, concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda p: s.gemm(*p), pairs * 3))
    for (a, b), c in zip(pairs * 3, results):
        assert rel_error(c, a, b) < FP32_TOLERANCE


def test_stream_close_waits_and_refuses_later_gemms(client, rng):
    a, b = fp16(rng, 300, 300), fp16(rng, 300, 300)
    s = client.stream()
    futures = [s.submit(a, b) for _ in range(3)]
    s.close()
    assert all(f.done() for f in futures)
    assert rel_error(futures[2].result(), a, b) < FP32_TOLERANCE
    with pytest.raises(RuntimeError, match="closed"):
        s.submit(a, b)


def test_stream_cancel_fails_what_is_unanswered(client, rng):
    a, b = fp16(rng, 1024, 1024), fp16(rng, 1024, 1024)
    s = client.stream()
    futures = [s.submit(a, b) for _ in range(4)]
    s.cancel()
    assert all(f.done() for f in futures)
    for f in futures:
        if f.exception() is None:
            assert rel_error(f.result(), a, b) < FP32_TOLERANCE
        else:
            assert isinstance(f.exception(), hgemm.Cancelled), f.exception()
    with pytest.raises(RuntimeError, match="closed"):
        s.submit(a, b)


def test_stream_exiting_with_an_exception_cancels(client, rng):
    a, b = fp16(rng, 1024, 1024), fp16(rng, 1024, 1024)
    with pytest.raises(KeyError):
        with client.stream() as s:
            futures = [s.submit(a, b) for _ in range(3)]
            raise KeyError("user code failed")
    assert all(f.done() for f in futures)


def test_stream_timeout_leaves_the_stream_usable(client, rng):
    big_a, big_b = fp16(rng, 1024, 1024), fp16(rng, 1024, 1024)
    a, b = fp16(rng, 9, 8), fp16(rng, 8, 7)
    with client.stream() as s:
        with pytest.raises(hgemm.DeadlineExceeded, match="stays on the stream"):
            s.gemm(big_a, big_b, timeout=0.001)
        assert rel_error(s.gemm(a, b), a, b) < FP32_TOLERANCE


def test_stream_refuses_matrices_of_another_replica(client, rng):
    a = fp16(rng, 4, 3)
    elsewhere = hgemm.ResidentMatrix(client, pb.MatrixInfo(handle="m-1@10.9.9.9:1", rows=3, cols=2))
    with client.stream() as s:
        assert s.gemm(a, fp16(rng, 3, 2)).shape == (4, 2)  # binds the stream to the target
        with pytest.raises(hgemm.FailedPrecondition, match="10.9.9.9:1"):
            s.submit(a, elsewhere)


def test_aio_stream(server, rng):
    a, b = fp16(rng, 70, 90), fp16(rng, 90, 50)
    big_a, big_b = fp16(rng, 600, 700), fp16(rng, 700, 800)

    async def main():
        async with hgemm.aio.Client(server.address, timeout=120) as c:
            hb = await c.upload(b)
            await hb.release()
            async with c.stream() as s:
                cs = await asyncio.gather(*(s.gemm(a, b) for _ in range(6)),
                                          s.gemm(big_a, big_b))
                for cc in cs[:6]:
                    assert rel_error(cc, a, b) < FP32_TOLERANCE
                assert rel_error(cs[6], big_a, big_b) < FP32_TOLERANCE
                futures = [s.submit(a, b), s.submit(a, hb), s.submit(a, b, kernel="no_such_kernel"),
                           s.submit(a, b, details=True)]
                results = await asyncio.gather(*futures, return_exceptions=True)
                assert rel_error(results[0], a, b) < FP32_TOLERANCE
                assert isinstance(results[1], hgemm.NotFound)
                assert isinstance(results[2], hgemm.InvalidArgument)
                assert rel_error(results[3].c, a, b) < FP32_TOLERANCE
                with pytest.raises(hgemm.DeadlineExceeded):
                    await s.gemm(fp16(rng, 1024, 1024), fp16(rng, 1024, 1024), timeout=0.001)
                assert rel_error(await s.gemm(a, b), a, b) < FP32_TOLERANCE
                pending = s.submit(a, b)
            assert pending.done() and rel_error(pending.result(), a, b) < FP32_TOLERANCE
            with pytest.raises(RuntimeError, match="closed"):
                s.submit(a, b)
            s2 = c.stream()
            waiting = [s2.submit(big_a, big_b) for _ in range(3)]
            await s2.cancel()
            for f in waiting:
                assert f.done()
                if f.exception() is not None:
                    assert isinstance(f.exception(), hgemm.Cancelled), f.exception()
    asyncio.run(main())


def test_stream_threads_end_with_the_stream(client, rng):
    before = {t.name for t in threading.enumerate()}
    a, b = fp16(rng, 5, 5), fp16(rng, 5, 5)
    with client.stream() as s:
        s.gemm(a, b)
        assert "hgemm-stream-reader" in {t.name for t in threading.enumerate()}
    assert "hgemm-stream-reader" not in {t.name for t in threading.enumerate()} - before

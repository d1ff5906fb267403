"""hgemm._wire's hand-written messages against the generated protobuf code."""
import numpy as np
import pytest

from hgemm import _core, _wire
from hgemm._proto import hgemm_pb2 as pb


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 2**32 - 1, 2**63])
def test_varint(n):
    encoded = _wire.varint(n)
    assert _wire._read_varint(encoded, 0) == (n, len(encoded))
    assert pb.MatrixChunk.FromString(b"\x18" + encoded).offset == n


def test_gemm_request_parses_as_the_generated_message():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 5)).astype(np.float16)
    b = rng.standard_normal((5, 2)).astype(np.float16)
    spec = _core.Spec(a, b, accumulation="fp16", kernel="k1", keep_c=True, c_ttl=7, request_id="r")
    r = pb.GemmRequest.FromString(spec.unary_request())
    assert (r.m, r.n, r.k) == (3, 2, 5)
    assert r.a == a.tobytes() and r.b == b.tobytes()
    assert r.options == pb.GemmOptions(kernel="k1", accumulation=pb.ACCUMULATION_FP16, request_id="r")
    assert r.keep_c_resident and r.c_ttl_seconds == 7
    hb = _core.ResidentMatrix(None, pb.MatrixInfo(handle="m-b", rows=5, cols=2))
    r = pb.GemmRequest.FromString(_core.Spec(a, hb).unary_request())
    assert r.WhichOneof("b_source") == "b_handle" and r.b_handle == "m-b"
    assert r.a == a.tobytes()


@pytest.mark.parametrize("gemm_id,operand,offset,size", [
    (0, pb.OPERAND_A, 0, 1), (7, pb.OPERAND_B, 1 << 20, 1 << 20), (2**40, pb.OPERAND_A, 3, 999)])
def test_stream_chunk_is_byte_identical(gemm_id, operand, offset, size):
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    expected = pb.GemmStreamRequest(chunk=pb.MatrixChunk(
        gemm_id=gemm_id, operand=operand, offset=offset, data=data)).SerializeToString()
    assert _wire.stream_chunk(gemm_id, operand, offset, memoryview(data)) == expected


def test_upload_chunk_is_byte_identical():
    data = b"\x01\x02" * 1000
    assert _wire.upload_chunk(memoryview(data)) == pb.UploadMatrixRequest(chunk=data).SerializeToString()


def test_gemm_response_reads_c_in_place_and_the_rest_by_protobuf():
    c = np.arange(12, dtype=np.float16).reshape(3, 4)
    message = pb.GemmResponse(m=3, n=4, c=c.tobytes(), request_id="x",
                              timing=pb.Timing(kernel_ms=1.5),
                              execution=pb.Execution(kernel="k", backend="cpu"))
    r = _wire.GemmResponse(message.SerializeToString())
    assert r.message.request_id == "x" and r.message.timing.kernel_ms == 1.5
    assert r.message.execution.kernel == "k" and r.message.c == b""
    out = r.c_array(3, 4)
    assert np.array_equal(out, c) and out.flags.writeable
    assert r.c_array(4, 4) is None  # wrong size: the caller reports it
    empty = _wire.GemmResponse(pb.GemmResponse(m=1, n=1).SerializeToString())
    assert empty.c_array(1, 1) is None


def test_stream_response_chunk_and_done():
    data = bytes(range(200))
    chunk = _wire.StreamResponse(pb.GemmStreamResponse(
        gemm_id=5, chunk=pb.ResultChunk(offset=1 << 20, data=data)).SerializeToString())
    assert (chunk.gemm_id, chunk.offset, chunk.done) == (5, 1 << 20, None)
    assert chunk.data.tobytes() == data
    done = _wire.StreamResponse(pb.GemmStreamResponse(
        gemm_id=0, done=pb.GemmDone(status_code=5, status_message="gone")).SerializeToString())
    assert done.gemm_id == 0 and done.data is None
    assert done.done.status_code == 5 and done.done.status_message == "gone"


def test_download_chunk():
    raw = pb.ResultChunk(offset=0, data=b"abcd", total_bytes=4).SerializeToString()
    c = _wire.DownloadChunk(raw)
    assert (c.offset, c.data.tobytes(), c.total_bytes) == (0, b"abcd", 4)


def test_truncated_message_is_an_error():
    raw = pb.GemmResponse(m=1, n=1, c=b"\x00\x3c").SerializeToString()
    with pytest.raises((ValueError, IndexError)):
        _wire.GemmResponse(raw[:-1])

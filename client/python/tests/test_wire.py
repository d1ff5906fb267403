"""hgemm._wire's hand-written messages against the generated protobuf code, on random messages:
what the encoder writes parses with the generated message to the same fields, and what the
decoder reads agrees with the generated parser, also for fields in unusual order, repeated
fields and unknown fields (which a decoder must tolerate)."""
import random

import numpy as np
import pytest

from hgemm import _resident, _spec, _wire
from hgemm._proto import hgemm_pb2 as pb

SEEDS = range(40)


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 2**32 - 1, 2**63])
def test_varint(n):
    encoded = _wire.varint(n)
    assert _wire._read_varint(encoded, 0) == (n, len(encoded))
    assert pb.MatrixChunk.FromString(b"\x18" + encoded).offset == n


# Random pieces of messages.

def random_bytes(r: random.Random, most: int = 300) -> bytes:
    return r.randbytes(r.choice([0, 1, r.randrange(1, most)]))


def random_text(r: random.Random) -> str:
    return r.choice(["", "k", "wmma_128x128_s3_dsmem_swz", "é✓" * r.randrange(1, 5)])


def random_uint(r: random.Random, bits: int) -> int:
    return r.choice([0, 1, 127, 128, r.randrange(2**bits), 2**bits - 1])


def random_fp16(r: random.Random, rows: int, cols: int) -> np.ndarray:
    rng = np.random.default_rng(r.randrange(2**32))
    return rng.standard_normal((rows, cols)).astype(np.float16)


def random_timing(r: random.Random) -> pb.Timing:
    return pb.Timing(**{f: r.choice([0.0, r.random() * 1e3]) for f in (
        "queue_wait_ms", "host_to_device_ms", "kernel_ms", "device_to_host_ms",
        "server_total_ms", "tflops")})


def random_matrix_info(r: random.Random) -> pb.MatrixInfo:
    return pb.MatrixInfo(handle=random_text(r), rows=random_uint(r, 32), cols=random_uint(r, 32),
                         bytes=random_uint(r, 64), device_id=r.choice([-1, 0, 3]),
                         ttl_seconds=r.random(), label=random_text(r), replica=random_text(r))


def random_unknown_field(r: random.Random) -> bytes:
    """A field whose number no message here uses, of any wire type."""
    wire_type = r.choice([0, 1, 2, 5])
    key = _wire.varint(r.randrange(50, 2**29) << 3 | wire_type)
    if wire_type == 0:
        return key + _wire.varint(random_uint(r, 64))
    if wire_type == 2:
        value = random_bytes(r)
        return key + _wire.varint(len(value)) + value
    return key + r.randbytes(8 if wire_type == 1 else 4)


def shuffled_fields(r: random.Random, raw: bytes, extra=()) -> bytes:
    """raw's top-level fields in a random order, with the `extra` fields and unknown ones mixed
    in. For messages whose fields all differ, or whose repeats are meant to be reordered."""
    pieces = [raw[first:end] for _, _, first, end in _wire.fields(raw)] + list(extra)
    pieces += [random_unknown_field(r) for _ in range(r.randrange(4))]
    r.shuffle(pieces)
    return b"".join(pieces)


# The encoder.

def random_operand(r: random.Random, rows: int, cols: int, name: str):
    if r.random() < 0.3:
        handle = f"m-{name}{r.randrange(10**6)}" + r.choice(["", "@replica-1:50051"])
        return _resident.ResidentMatrix(None, pb.MatrixInfo(handle=handle, rows=rows, cols=cols))
    return random_fp16(r, rows, cols)


@pytest.mark.parametrize("seed", SEEDS)
def test_gemm_request_parses_as_the_generated_message(seed):
    r = random.Random(seed)
    m, n, k = r.randrange(1, 40), r.randrange(1, 40), r.randrange(1, 40)
    a, b = random_operand(r, m, k, "a"), random_operand(r, k, n, "b")
    options = dict(accumulation=r.choice([None, "fp16", "fp32"]), kernel=random_text(r),
                   keep_c=r.random() < 0.5, c_ttl=random_uint(r, 32), request_id=random_text(r))
    spec = _spec.Spec(a, b, **options)
    expected = pb.GemmRequest(m=m, n=n, k=k, options=spec.options,
                              keep_c_resident=options["keep_c"], c_ttl_seconds=options["c_ttl"])
    for operand, field in ((a, "a"), (b, "b")):
        if isinstance(operand, _resident.ResidentMatrix):
            setattr(expected, field + "_handle", operand.handle)
        else:
            setattr(expected, field, operand.tobytes())
    parsed = pb.GemmRequest.FromString(spec.unary_request())
    assert parsed == expected
    assert parsed.WhichOneof("a_source") == expected.WhichOneof("a_source")
    assert parsed.WhichOneof("b_source") == expected.WhichOneof("b_source")


@pytest.mark.parametrize("sizes", [(0, 3, 0), (_wire.CONCAT_NOGIL_BYTES, 1, 0),
                                   (5, _wire.CONCAT_NOGIL_BYTES + 7, 2, 0, 1 << 20)])
def test_concat_is_bytes_join(sizes):
    """Also past CONCAT_NOGIL_BYTES, where it fills a new bytes object without the GIL."""
    r = np.random.default_rng(sum(sizes))
    parts = []
    for i, size in enumerate(sizes):
        data = r.integers(0, 256, size, dtype=np.uint8)
        if i % 3 == 1:
            data.flags.writeable = False  # e.g. a result passed on as an operand
        parts.append([data.tobytes(), data, memoryview(data)][i % 3])
    joined = _wire.concat(parts)
    assert type(joined) is bytes
    assert joined == b"".join(bytes(memoryview(p)) for p in parts)


def test_large_gemm_request_parses_as_the_generated_message():
    a = random_fp16(random.Random(3), 300, 500)  # past CONCAT_NOGIL_BYTES
    b = random_fp16(random.Random(4), 500, 2)
    parsed = pb.GemmRequest.FromString(_spec.Spec(a, b, request_id="big").unary_request())
    assert (parsed.m, parsed.n, parsed.k, parsed.options.request_id) == (300, 2, 500, "big")
    assert parsed.a == a.tobytes() and parsed.b == b.tobytes()


@pytest.mark.parametrize("seed", SEEDS)
def test_stream_chunk_and_upload_chunk_are_byte_identical(seed):
    r = random.Random(seed)
    gemm_id, offset = random_uint(r, 64), random_uint(r, 64)
    operand = r.choice([pb.OPERAND_UNSPECIFIED, pb.OPERAND_A, pb.OPERAND_B])
    data = random_bytes(r, 5000) or b"\x01"
    expected = pb.GemmStreamRequest(chunk=pb.MatrixChunk(
        gemm_id=gemm_id, operand=operand, offset=offset, data=data)).SerializeToString()
    assert _wire.stream_chunk(gemm_id, operand, offset, memoryview(data)) == expected
    assert (_wire.upload_chunk(memoryview(data))
            == pb.UploadMatrixRequest(chunk=data).SerializeToString())


def test_stream_messages_cover_each_operand_in_order():
    a, b = random_fp16(random.Random(1), 5, 7), random_fp16(random.Random(2), 7, 3)
    messages = [pb.GemmStreamRequest.FromString(m) for m in _spec.Spec(a, b).stream_messages(4, 9)]
    assert messages[0].header == pb.GemmHeader(gemm_id=4, m=5, n=3, k=7,
                                               options=pb.GemmOptions(kernel="auto"))
    for operand, array in ((pb.OPERAND_A, a), (pb.OPERAND_B, b)):
        chunks = [m.chunk for m in messages[1:] if m.chunk.operand == operand]
        assert [c.offset for c in chunks] == list(range(0, array.nbytes, 9))
        assert b"".join(c.data for c in chunks) == array.tobytes()
        assert all(c.gemm_id == 4 for c in chunks)


# The decoders.

def random_gemm_response(r: random.Random):
    m, n = r.randrange(1, 30), r.randrange(1, 30)
    message = pb.GemmResponse(m=m, n=n, request_id=random_text(r))
    if r.random() < 0.8:
        message.c = random_fp16(r, m, n).tobytes()
    if r.random() < 0.8:
        message.timing.CopyFrom(random_timing(r))
        message.execution.CopyFrom(pb.Execution(kernel=random_text(r), backend="cuda",
                                                device_id=r.choice([-1, 0, 7])))
    if r.random() < 0.3:
        message.c_matrix.CopyFrom(random_matrix_info(r))
    return message


@pytest.mark.parametrize("seed", SEEDS)
def test_gemm_response_decoder_agrees_with_protobuf(seed):
    r = random.Random(seed)
    message = random_gemm_response(r)
    wire = shuffled_fields(r, message.SerializeToString())
    if r.random() < 0.3:  # an earlier C, which a later one replaces (the last one wins)
        wire = b"\x1a\x04\x00\x3c\x00\x40" + wire
    reference = pb.GemmResponse.FromString(wire)
    decoded = _wire.GemmResponse(wire)
    without_c = pb.GemmResponse()
    without_c.CopyFrom(reference)
    without_c.ClearField("c")
    assert decoded.message == without_c
    c = decoded.c_bytes(2 * reference.m * reference.n)
    if len(reference.c) == 2 * reference.m * reference.n:
        assert c.tobytes() == reference.c
        assert not c.flags.writeable and c.shape == (2 * reference.m * reference.n,)
        assert c.base is not None  # a view of the message, not a copy
    else:
        assert c is None  # a wrong size: the caller reports it


def random_stream_response(r: random.Random) -> pb.GemmStreamResponse:
    message = pb.GemmStreamResponse(gemm_id=random_uint(r, 64))
    if r.random() < 0.5:
        message.chunk.CopyFrom(pb.ResultChunk(offset=random_uint(r, 64), data=random_bytes(r),
                                              total_bytes=random_uint(r, 64)))
    else:
        message.done.CopyFrom(pb.GemmDone(
            status_code=r.choice([0, 5, 14]), status_message=random_text(r),
            timing=random_timing(r), request_id=random_text(r)))
    return message


def embedded(field: int, message) -> bytes:
    body = message.SerializeToString()
    return _wire.varint(field << 3 | 2) + _wire.varint(len(body)) + body


@pytest.mark.parametrize("seed", SEEDS)
def test_stream_response_decoder_agrees_with_protobuf(seed):
    r = random.Random(seed)
    pieces = [_wire.varint(1 << 3) + _wire.varint(random_uint(r, 64))]  # gemm_id
    for _ in range(r.randrange(1, 4)):  # chunks and dones, in any order: the last case wins, merged
        one = random_stream_response(r)
        which = one.WhichOneof("message")
        pieces.append(embedded(2 if which == "chunk" else 3, getattr(one, which)))
    pieces += [random_unknown_field(r) for _ in range(r.randrange(3))]
    r.shuffle(pieces)
    wire = b"".join(pieces)
    reference = pb.GemmStreamResponse.FromString(wire)
    decoded = _wire.StreamResponse(wire)
    assert decoded.gemm_id == reference.gemm_id
    if reference.WhichOneof("message") == "chunk":
        assert decoded.done is None
        assert (decoded.offset, decoded.data.tobytes()) == (reference.chunk.offset,
                                                            reference.chunk.data)
    else:
        assert decoded.data is None and decoded.done == reference.done


@pytest.mark.parametrize("seed", SEEDS)
def test_download_chunk_decoder_agrees_with_protobuf(seed):
    r = random.Random(seed)
    message = pb.ResultChunk(offset=random_uint(r, 64), data=random_bytes(r),
                             total_bytes=random_uint(r, 64))
    repeat = [pb.ResultChunk(data=random_bytes(r)).SerializeToString()] if r.random() < 0.3 else []
    wire = shuffled_fields(r, message.SerializeToString(), repeat)
    reference = pb.ResultChunk.FromString(wire)
    decoded = _wire.DownloadChunk(wire)
    assert (decoded.offset, decoded.data.tobytes(), decoded.total_bytes) == (
        reference.offset, reference.data, reference.total_bytes)


def test_truncated_message_is_an_error():
    raw = pb.GemmResponse(m=1, n=1, c=b"\x00\x3c").SerializeToString()
    with pytest.raises((ValueError, IndexError)):
        _wire.GemmResponse(raw[:-1])

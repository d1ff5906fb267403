"""The protobuf wire format of the bulk messages, written and read by hand so that matrix bytes
are copied as few times as gRPC allows.

With the generated messages, a unary 2048³ GEMM copies A and B four times on the way out (numpy
→ bytes → message → serialized → gRPC) and C four times on the way in, all while holding the
GIL, which caps a threaded client. Here a request is one b"".join of the small fields (serialized
by protobuf) and memoryviews of the arrays: one copy, plus gRPC's own. A response is scanned for
the C field's byte range, which numpy reads in place: one copy (into a writable array), plus
gRPC's own. Every other field is still parsed by protobuf. tests/test_wire.py checks the bytes
against the generated code.

Field numbers are those of proto/hgemm.proto (GemmRequest.a = 4, b = 5; GemmResponse.c = 3;
GemmStreamRequest.chunk = 2; MatrixChunk 1-4; GemmStreamResponse 1-3; ResultChunk 1-3;
UploadMatrixRequest.chunk = 2).
"""
from typing import Iterator, Optional, Tuple

import numpy as np

from ._proto import hgemm_pb2 as pb

_LEN = 2  # wire type of bytes, strings and messages


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def _read_varint(buf, pos: int) -> Tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def fields(buf, start: int = 0, end: Optional[int] = None) -> Iterator[Tuple[int, object, int, int]]:
    """The top-level fields of a message: (number, value, first byte, end byte); value is an int
    for varints and a (start, end) byte range for length-delimited fields."""
    end = len(buf) if end is None else end
    pos = start
    while pos < end:
        first = pos
        key, pos = _read_varint(buf, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = _read_varint(buf, pos)
        elif wire_type == _LEN:
            length, pos = _read_varint(buf, pos)
            value = (pos, pos + length)
            pos += length
        elif wire_type == 1:
            value, pos = None, pos + 8
        elif wire_type == 5:
            value, pos = None, pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire_type} at byte {first}")
        if pos > end:
            raise ValueError("message truncated")
        yield number, value, first, pos


def _bytes_field(field: int, data) -> list:
    return [_key(field, _LEN), varint(len(data)), data]


# Requests (client → server).

def gemm_request(small: pb.GemmRequest, a: Optional[memoryview], b: Optional[memoryview]) -> bytes:
    """GemmRequest: `small` holds every field but a and b, given as byte views."""
    parts = [small.SerializeToString()]
    if a is not None:
        parts += _bytes_field(4, a)
    if b is not None:
        parts += _bytes_field(5, b)
    return b"".join(parts)


def stream_chunk(gemm_id: int, operand: int, offset: int, data: memoryview) -> bytes:
    """GemmStreamRequest{chunk: MatrixChunk{gemm_id, operand, offset, data}}."""
    head = b"".join([
        _key(1, 0) + varint(gemm_id) if gemm_id else b"",
        _key(2, 0) + varint(operand) if operand else b"",
        _key(3, 0) + varint(offset) if offset else b"",
        _key(4, _LEN), varint(len(data))])
    return b"".join([_key(2, _LEN), varint(len(head) + len(data)), head, data])


def upload_chunk(data: memoryview) -> bytes:
    """UploadMatrixRequest{chunk: data}."""
    return b"".join(_bytes_field(2, data))


# Responses (server → client).

class GemmResponse:
    """A GemmResponse: `message` has every field but c; c_array() reads C from the raw bytes."""
    __slots__ = ("message", "raw", "c_range")

    def __init__(self, raw: bytes):
        self.raw = raw
        self.c_range = None
        cuts = []
        for number, value, first, end in fields(raw):
            if number == 3 and isinstance(value, tuple):
                self.c_range = value
                cuts.append((first, end))
        if cuts:
            rest, pos = [], 0
            for first, end in cuts:
                rest.append(raw[pos:first])
                pos = end
            rest.append(raw[pos:])
            raw = b"".join(rest)
        self.message = pb.GemmResponse.FromString(raw)

    def c_array(self, m: int, n: int) -> Optional[np.ndarray]:
        """C as a writable m×n float16 array (one copy), or None if its size is not 2·m·n."""
        start, end = self.c_range or (0, 0)
        if end - start != 2 * m * n:
            return None
        view = np.frombuffer(self.raw, dtype="<f2", count=m * n, offset=start)
        return view.reshape(m, n).copy()


class StreamResponse:
    """A GemmStreamResponse: gemm_id, then either a chunk (offset and a uint8 view of its data
    in the raw bytes) or done (a GemmDone)."""
    __slots__ = ("gemm_id", "offset", "data", "done")

    def __init__(self, raw: bytes):
        self.gemm_id, self.offset, self.data, self.done = 0, 0, None, None
        for number, value, _, _ in fields(raw):
            if number == 1 and isinstance(value, int):
                self.gemm_id = value
            elif number == 2 and isinstance(value, tuple):
                self.offset, self.data, _ = _result_chunk(raw, *value)
                self.done = None
            elif number == 3 and isinstance(value, tuple):
                self.done = pb.GemmDone.FromString(raw[value[0]:value[1]])
                self.data = None


class DownloadChunk:
    """A ResultChunk of DownloadMatrix: offset, data (a uint8 view), total_bytes."""
    __slots__ = ("offset", "data", "total_bytes")

    def __init__(self, raw: bytes):
        self.offset, self.data, self.total_bytes = _result_chunk(raw, 0, len(raw))


def _result_chunk(raw: bytes, start: int, end: int):
    offset, data, total = 0, np.empty(0, np.uint8), 0
    for number, value, _, _ in fields(raw, start, end):
        if number == 1 and isinstance(value, int):
            offset = value
        elif number == 2 and isinstance(value, tuple):
            data = np.frombuffer(raw, dtype=np.uint8, count=value[1] - value[0], offset=value[0])
        elif number == 3 and isinstance(value, int):
            total = value
    return offset, data, total


# The methods with hand-written messages; the rest use the generated stub.
_SERVICE = "/hgemm.v1.GemmService/"


class Stub:
    """GemmService's methods on a channel (grpc or grpc.aio). Gemm, GemmStream, UploadMatrix and
    DownloadMatrix take and return the forms above; the others are the generated ones."""

    def __init__(self, channel, generated_stub):
        self.Gemm = channel.unary_unary(_SERVICE + "Gemm", request_serializer=None,
                                        response_deserializer=GemmResponse)
        self.GemmStream = channel.stream_stream(_SERVICE + "GemmStream", request_serializer=None,
                                                response_deserializer=StreamResponse)
        self.UploadMatrix = channel.stream_unary(_SERVICE + "UploadMatrix", request_serializer=None,
                                                 response_deserializer=pb.MatrixInfo.FromString)
        self.DownloadMatrix = channel.unary_stream(
            _SERVICE + "DownloadMatrix", request_serializer=pb.DownloadMatrixRequest.SerializeToString,
            response_deserializer=DownloadChunk)
        self.ListKernels = generated_stub.ListKernels
        self.GetServerInfo = generated_stub.GetServerInfo
        self.ReleaseMatrix = generated_stub.ReleaseMatrix
        self.ListMatrices = generated_stub.ListMatrices

"""The protobuf wire format of the bulk messages, written and read by hand so that matrix bytes
are copied as few times as gRPC allows.

With the generated messages, a unary 2048³ GEMM copies A and B four times on the way out (numpy
→ bytes → message → serialized → gRPC) and C four times on the way in, all while holding the
GIL, which caps a threaded client. Here a request is the small fields (serialized by protobuf)
and the arrays' bytes concatenated into one bytes object: one copy, plus gRPC's own, and made
with the GIL released when it is large (concat()). A response is scanned for the C field's byte
range, which numpy reads in place: no copy beyond gRPC's own (C is a read-only view of the
message). Every other field is still parsed by protobuf. tests/test_wire.py checks the bytes
against the generated code, on random messages.

Field numbers are those of proto/hgemm.proto (GemmRequest.a = 4, b = 5; GemmResponse.c = 3;
GemmStreamRequest.chunk = 2; MatrixChunk 1-4; GemmStreamResponse 1-3; ResultChunk 1-3;
UploadMatrixRequest.chunk = 2).
"""
import ctypes
from typing import Iterator, Optional, Sequence, Tuple

import numpy as np

from ._proto import hgemm_pb2 as pb

_LEN = 2  # wire type of bytes, strings and messages

# concat() of at least this many bytes copies with the GIL released (where CPython's own
# b"".join releases it, for parts that are all bytes).
CONCAT_NOGIL_BYTES = 1 << 20
try:  # CPython's C API: a bytes object of a given size, to be filled before anyone sees it
    _new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
    _new_bytes.restype, _new_bytes.argtypes = ctypes.py_object, (ctypes.c_void_p, ctypes.c_ssize_t)
    _bytes_data = ctypes.pythonapi.PyBytes_AsString
    _bytes_data.restype, _bytes_data.argtypes = ctypes.c_void_p, (ctypes.py_object,)
except AttributeError:  # not CPython
    _new_bytes = None


def concat(parts: Sequence) -> bytes:
    """b"".join(parts), for bytes and contiguous byte buffers (numpy arrays, memoryviews).

    b"".join holds the GIL while it copies buffers other than bytes, so the operands of threads'
    concurrent calls would be copied one after another. Past CONCAT_NOGIL_BYTES the bytes object
    is made empty and filled by ctypes.memmove, which releases the GIL, as C extensions fill a new
    bytes object. REQUIRES: the parts do not change meanwhile.
    """
    views = [p if isinstance(p, bytes) else np.frombuffer(p, dtype=np.uint8) for p in parts]
    total = sum(len(v) for v in views)
    if total < CONCAT_NOGIL_BYTES or _new_bytes is None:
        return b"".join(views)
    out = _new_bytes(None, total)
    at = _bytes_data(out)
    for v in views:
        if isinstance(v, bytes):
            ctypes.memmove(at, v, len(v))
        else:
            ctypes.memmove(at, v.__array_interface__["data"][0], len(v))
        at += len(v)
    return out


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


def fields(buf, start: int = 0,
           end: Optional[int] = None) -> Iterator[Tuple[int, object, int, int]]:
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

def gemm_request(small: pb.GemmRequest, a, b) -> bytes:
    """GemmRequest: `small` holds every field but a and b, given as byte buffers (or None)."""
    parts = [small.SerializeToString()]
    if a is not None:
        parts += _bytes_field(4, a)
    if b is not None:
        parts += _bytes_field(5, b)
    return concat(parts)


def stream_chunk(gemm_id: int, operand: int, offset: int, data) -> bytes:
    """GemmStreamRequest{chunk: MatrixChunk{gemm_id, operand, offset, data}}."""
    head = b"".join([
        _key(1, 0) + varint(gemm_id) if gemm_id else b"",
        _key(2, 0) + varint(operand) if operand else b"",
        _key(3, 0) + varint(offset) if offset else b"",
        _key(4, _LEN), varint(len(data))])
    return concat([_key(2, _LEN), varint(len(head) + len(data)), head, data])


def upload_chunk(data) -> bytes:
    """UploadMatrixRequest{chunk: data}."""
    return concat(_bytes_field(2, data))


# Responses (server → client).

class GemmResponse:
    """A GemmResponse: `message` has every field but c; c_bytes() reads C from the raw bytes."""
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

    def c_bytes(self, nbytes: int) -> Optional[np.ndarray]:
        """C's bytes as a read-only uint8 array over the raw bytes (no copy), or None if there
        are not exactly `nbytes` of them."""
        start, end = self.c_range or (0, 0)
        if end - start != nbytes:
            return None
        return np.frombuffer(self.raw, dtype=np.uint8, count=nbytes, offset=start)


class StreamResponse:
    """A GemmStreamResponse: gemm_id, then either a chunk (offset and a uint8 view of its data
    in the raw bytes) or done (a GemmDone). As protobuf parses it: the last of the oneof's fields
    wins, and repeats of the same one merge."""
    __slots__ = ("gemm_id", "offset", "data", "done")

    def __init__(self, raw: bytes):
        self.gemm_id, self.offset, self.data, self.done = 0, 0, None, None
        done_parts = None
        for number, value, _, _ in fields(raw):
            if number == 1 and isinstance(value, int):
                self.gemm_id = value
            elif number == 2 and isinstance(value, tuple):
                if self.data is None:  # a chunk after done (or first): a new chunk
                    self.offset, self.data, done_parts = 0, _EMPTY, None
                self.offset, self.data, _ = _result_chunk(raw, *value, self.offset, self.data, 0)
            elif number == 3 and isinstance(value, tuple):
                if done_parts is None:
                    done_parts, self.data = [], None
                done_parts.append(raw[value[0]:value[1]])
        if done_parts is not None:
            self.done = pb.GemmDone.FromString(b"".join(done_parts))  # concatenation merges


class DownloadChunk:
    """A ResultChunk of DownloadMatrix: offset, data (a uint8 view), total_bytes."""
    __slots__ = ("offset", "data", "total_bytes")

    def __init__(self, raw: bytes):
        self.offset, self.data, self.total_bytes = _result_chunk(raw, 0, len(raw), 0, _EMPTY, 0)


_EMPTY = np.empty(0, np.uint8)
_EMPTY.flags.writeable = False


def _result_chunk(raw: bytes, start: int, end: int, offset: int, data, total: int):
    """The ResultChunk in raw[start:end] merged into (offset, data, total): its fields that are
    present replace them."""
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
            _SERVICE + "DownloadMatrix",
            request_serializer=pb.DownloadMatrixRequest.SerializeToString,
            response_deserializer=DownloadChunk)
        self.ListKernels = generated_stub.ListKernels
        self.GetServerInfo = generated_stub.GetServerInfo
        self.ReleaseMatrix = generated_stub.ReleaseMatrix
        self.ListMatrices = generated_stub.ListMatrices
        self.RegisterRegion = generated_stub.RegisterRegion
        self.UnregisterRegion = generated_stub.UnregisterRegion
        self.ListRegions = generated_stub.ListRegions

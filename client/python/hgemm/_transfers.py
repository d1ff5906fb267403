"""Resident matrices' bulk transfers: UploadMatrix's messages, and DownloadMatrix's chunks
reassembled.

Thread safety: each upload_messages generator has one consumer; a DownloadBuffer belongs to one
download try.
"""
import numpy as np

from . import _arrays, _errors, _wire
from ._proto import hgemm_pb2 as pb


def upload_messages(array: np.ndarray, ttl: int, label: str, device_id, chunk_bytes: int,
                    progress=None, dtype=pb.DATA_TYPE_UNSPECIFIED, region=None):
    """UploadMatrix's messages: the header, then the array's bytes in chunks; with `region`
    (a RegionRef: the array lives in shared memory) the header alone, naming it."""
    header = pb.MatrixHeader(rows=array.shape[0], cols=array.shape[1], ttl_seconds=int(ttl),
                             label=label, dtype=dtype, region=region)
    if device_id is not None:
        header.device_id = int(device_id)
    yield pb.UploadMatrixRequest(header=header).SerializeToString()
    if region is not None:
        if progress is not None:
            progress.update(array.nbytes)
        return
    view = _arrays.byte_view(array)
    for offset in range(0, len(view), chunk_bytes):
        data = view[offset:offset + chunk_bytes]
        yield _wire.upload_chunk(data)
        if progress is not None:
            progress.update(len(data))


class DownloadBuffer:
    """DownloadMatrix's chunks into one buffer, allocated once from the first chunk's total."""

    def __init__(self, rows: int, cols: int, progress=None, dtype: str = "fp16"):
        self.rows, self.cols, self.dtype = rows, cols, dtype
        self.nbytes = (4 if dtype == "fp32" else 2) * rows * cols
        self.buf = None
        self.received = 0
        self.progress = progress

    def add(self, chunk: _wire.DownloadChunk) -> None:
        if chunk.offset != self.received:
            raise _errors.Internal(
                f"download chunk at offset {chunk.offset}, expected {self.received}")
        if self.buf is None:
            self.buf = np.empty(chunk.total_bytes or self.nbytes, dtype=np.uint8)
        end = chunk.offset + len(chunk.data)
        if end > len(self.buf):
            raise _errors.Internal(f"download chunk ends at byte {end}, past {len(self.buf)}")
        self.buf[chunk.offset:end] = chunk.data
        self.received = end
        if self.progress is not None:
            self.progress.update(len(chunk.data))

    def array(self) -> np.ndarray:
        if self.buf is None or self.received != len(self.buf) or len(self.buf) != self.nbytes:
            raise _errors.Internal(f"download ended after {self.received} bytes of "
                                   f"{self.nbytes}")
        return _arrays.c_array(self.buf, self.rows, self.cols, self.dtype)

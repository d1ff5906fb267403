"""hgemm: the Python client of hgemm-serve (fp16 GEMM as a gRPC service).

    import hgemm
    with hgemm.Client("127.0.0.1:50051") as c:
        C = c.gemm(A, B)        # float16 numpy arrays or torch tensors in, float16 numpy out
        with c.stream() as s:   # one GemmStream for many GEMMs
            C = s.gemm(A, B)
        g = c.prepare(A, B, out=C)  # the same GEMM many times: g() per step

hgemm.aio.Client has the same methods for asyncio. The reference is client/python/README.md.
On the native core nothing here imports grpc (grpcio is loaded only by the fallback's calls).
"""
from . import aio
from ._arrays import ConversionWarning
from ._client import Client
from ._cuda_ipc import CudaRegion, cuda_region
from ._resident import MatrixList, ResidentMatrix
from ._results import Execution, GemmResult, Kernel, Timing
from ._retry import RetryPolicy
from ._stream import Stream
from ._native import info
from ._prepared import PreparedGemm
from ._errors import (Aborted, AlreadyExists, Cancelled, DataLoss, DeadlineExceeded, Error,
                      FailedPrecondition, FieldViolation, Internal, InvalidArgument, NotFound,
                      OutOfRange, PermissionDenied, QuotaViolation, ResourceExhausted,
                      StatusCode, Unauthenticated, Unavailable, Unimplemented, Unknown)
from ._proto import hgemm_pb2 as pb

__version__ = "0.1.0"

__all__ = [
    "Client", "Stream", "aio", "ResidentMatrix", "GemmResult", "Timing", "Execution", "Kernel",
    "MatrixList", "RetryPolicy", "ConversionWarning", "pb", "Error", "Cancelled", "Unknown",
    "InvalidArgument", "DeadlineExceeded", "NotFound", "AlreadyExists", "PermissionDenied",
    "ResourceExhausted", "FailedPrecondition", "Aborted", "OutOfRange", "Unimplemented",
    "Internal", "Unavailable", "DataLoss", "Unauthenticated", "StatusCode", "FieldViolation",
    "QuotaViolation", "info",
    "cuda_region", "CudaRegion", "PreparedGemm",
]

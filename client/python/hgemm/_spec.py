"""One GEMM checked and ready to send: Operand, Spec, and the requests they become (a unary
GemmRequest, or a GemmStream's header and chunks); gemm_many's items as Specs.

Thread safety: a Spec is not changed after it is made, so threads may read it at once; each
generator of messages it makes has one consumer.
"""
from typing import Dict, List, Optional, Sequence

import numpy as np

from . import _arrays, _errors, _wire
from ._proto import hgemm_pb2 as pb
from ._resident import ResidentMatrix, handle_replica

ACCUMULATIONS = {None: pb.ACCUMULATION_UNSPECIFIED, "default": pb.ACCUMULATION_UNSPECIFIED,
                  "fp16": pb.ACCUMULATION_FP16, "fp32": pb.ACCUMULATION_FP32}
DTYPES = {"fp16": pb.DATA_TYPE_FP16, "bf16": pb.DATA_TYPE_BF16, "fp32": pb.DATA_TYPE_FP32}
DTYPE_NAMES = {pb.DATA_TYPE_UNSPECIFIED: "fp16", **{v: k for k, v in DTYPES.items()}}


class Operand:
    """One prepared operand: an array to send (as stored: transposed when x is a transposed view
    of a C-contiguous matrix), or a handle already on the server. rows × cols is op(X)'s shape;
    dtype "fp16" or "bf16"."""
    __slots__ = ("rows", "cols", "array", "handle", "dtype", "transposed")

    def __init__(self, x, name: str, dtype=None, transpose: bool = False):
        """transpose: x is stored transposed (op(X) = xᵀ: BLAS's "T"), as passing x's
        transposed view would say. dtype: as _arrays.as_operand's."""
        if isinstance(x, ResidentMatrix) or (hasattr(x, "handle") and hasattr(x, "rows")
                                             and not _arrays.is_torch_tensor(x)):
            self.rows, self.cols, self.array, self.handle = int(x.rows), int(x.cols), None, x.handle
            self.dtype = getattr(x, "dtype", "fp16")
            self.transposed = bool(transpose)
            if self.transposed:
                self.rows, self.cols = self.cols, self.rows
        else:
            if transpose:
                if np.ndim(x) != 2:
                    raise ValueError(f"{name} must be a 2-D matrix; it has shape "
                                     f"{tuple(np.shape(x))}")
                x = x.t() if _arrays.is_torch_tensor(x) else np.asarray(x).T
            self.array, self.dtype, self.transposed = _arrays.as_operand(x, name, dtype=dtype)
            stored_rows, stored_cols = self.array.shape
            self.rows, self.cols = ((stored_cols, stored_rows) if self.transposed
                                    else (stored_rows, stored_cols))
            self.handle = ""

    @property
    def nbytes(self) -> int:
        return 0 if self.array is None else self.array.nbytes

    def bytes_view(self) -> np.ndarray:
        return _arrays.byte_view(self.array)


class Spec:
    """One GEMM, validated and ready to send (unary or streamed)."""

    def __init__(self, a, b, *, accumulation=None, kernel="auto", keep_c=False, c_ttl=0,
                 request_id="", c_dtype=None, alpha=None, beta=0.0, c=None, batch=1,
                 index=None, dtype=None, transpose_a=False, transpose_b=False, verify=False,
                 verify_repetitions=0):
        where = "" if index is None else f"pair {index}: "
        self.a = Operand(a, where + "A", dtype, transpose_a)
        self.b = Operand(b, where + "B", dtype, transpose_b)
        if self.a.dtype != self.b.dtype:
            raise ValueError(f"{where}A is {self.a.dtype} and B is {self.b.dtype}: mixing dtypes; "
                             f"convert one (A and B go as one type)")
        self.dtype = self.a.dtype
        if c_dtype not in (None, self.dtype, "fp32"):
            raise ValueError(f"{where}c_dtype must be None (the inputs' type, {self.dtype}), "
                             f"{self.dtype!r} or 'fp32'; got {c_dtype!r}")
        self.c_dtype = c_dtype or self.dtype
        if self.a.cols != self.b.rows:
            raise ValueError(f"{where}A is {self.a.rows}x{self.a.cols} and B is "
                             f"{self.b.rows}x{self.b.cols}: A's columns must equal B's rows")
        self.m, self.k, self.n = self.a.rows, self.a.cols, self.b.cols
        if accumulation not in ACCUMULATIONS:
            raise ValueError(f"accumulation must be 'fp16', 'fp32' or None (the server's default, "
                             f"fp32); got {accumulation!r}")
        if not 0 <= int(verify_repetitions) <= 8:
            raise ValueError(f"{where}verify_repetitions must be in [0, 8]; got "
                             f"{verify_repetitions!r}")
        self.options = pb.GemmOptions(kernel=kernel or "auto",
                                      accumulation=ACCUMULATIONS[accumulation],
                                      request_id=request_id, verify=bool(verify),
                                      verify_repetitions=int(verify_repetitions))
        self.keep_c = bool(keep_c)
        self.c_ttl = int(c_ttl)
        # Strided-batched (batched_spec): the arrays hold `batch` matrices each, packed.
        self.batch = int(batch)
        # C = alpha·op(A)·op(B) + beta·C_in; alpha None is the wire's default (1), and C_in is
        # sent only when beta ≠ 0 (the server reads it only then).
        self.alpha = None if alpha is None else float(alpha)
        self.beta = float(beta)
        self.c_in, self.c_in_handle = None, ""
        if self.beta != 0:
            if c is None:
                raise ValueError(f"{where}beta={beta} needs c (C_in, m x n of C's type)")
            if hasattr(c, "handle") and not _arrays.is_torch_tensor(c):
                self.c_in_handle = c.handle
            else:
                self.c_in = _arrays.as_c_input(c, self.m, self.n, self.c_dtype, self.batch)

    @property
    def payload_bytes(self) -> int:
        return self.a.nbytes + self.b.nbytes + (0 if self.c_in is None else len(self.c_in))

    def replica(self) -> str:
        """The replica this GEMM must run on: that of its handles ("": none, balanced).
        FailedPrecondition, naming both, when A and B live on two replicas."""
        a, b = handle_replica(self.a.handle), handle_replica(self.b.handle)
        if a and b and a != b:
            raise _errors.FailedPrecondition(
                f"A ({self.a.handle}) lives on replica {a} and B ({self.b.handle}) on replica "
                f"{b}: one GEMM runs on one replica; upload B where A lives "
                f"(upload(..., replica=A))")
        return a or b

    def scaled(self) -> bool:
        """alpha or beta set: C is more than op(A)·op(B)."""
        return self.alpha is not None or self.beta != 0

    @property
    def c_bytes(self) -> int:
        if self.keep_c:
            return 0
        return (4 if self.c_dtype == "fp32" else 2) * self.m * self.n * self.batch

    def c_array(self, buffer: np.ndarray) -> np.ndarray:
        """C (m×n of c_dtype; batch×m×n for a batch) over `buffer`, c_bytes uint8s (see
        _arrays.c_array)."""
        c = _arrays.c_array(buffer, self.m * self.batch, self.n, self.c_dtype)
        return c.reshape(self.batch, self.m, self.n) if self.batch > 1 else c

    def _form(self) -> dict:
        """The layout, type and scale fields of GemmRequest and GemmHeader, left unset (the wire
        of an fp16 GEMM, as before them) where they are the defaults."""
        form = dict(transpose_a=self.a.transposed, transpose_b=self.b.transposed,
                    dtype=DTYPES[self.dtype] if self.dtype != "fp16" else pb.DATA_TYPE_UNSPECIFIED,
                    c_dtype=pb.DATA_TYPE_FP32 if self.c_dtype == "fp32"
                    else pb.DATA_TYPE_UNSPECIFIED, beta=self.beta)
        if self.alpha is not None:
            form["alpha"] = self.alpha
        if self.batch > 1:
            form["batch"] = self.batch
        return form

    def unary_request(self, regions: Optional[Dict[str, pb.RegionRef]] = None) -> bytes:
        """The serialized GemmRequest (A and B copied once, straight from the arrays). regions:
        {"a" / "b" / "c": RegionRef} for the parts in shared memory (A and B are then not sent,
        C not returned)."""
        regions = regions or {}
        small = pb.GemmRequest(m=self.m, n=self.n, k=self.k, options=self.options,
                               keep_c_resident=self.keep_c, c_ttl_seconds=self.c_ttl,
                               **self._form())
        if self.a.handle:
            small.a_handle = self.a.handle
        if self.b.handle:
            small.b_handle = self.b.handle
        if self.c_in_handle:
            small.c_in_handle = self.c_in_handle
        elif self.c_in is not None:
            small.c_in = self.c_in.tobytes()
        for name, field in (("a", small.a_region), ("b", small.b_region), ("c", small.c_region)):
            if name in regions:
                field.CopyFrom(regions[name])
        return _wire.gemm_request(
            small, None if self.a.handle or "a" in regions else self.a.bytes_view(),
            None if self.b.handle or "b" in regions else self.b.bytes_view())

    def stream_messages(self, gemm_id: int, chunk_bytes: int, progress=None):
        """The header, then A's chunks, then B's, then C_in's (none for an operand given by
        handle, nor for C_in without beta), as serialized GemmStreamRequests."""
        yield pb.GemmStreamRequest(header=pb.GemmHeader(
            gemm_id=gemm_id, m=self.m, n=self.n, k=self.k, options=self.options,
            a_handle=self.a.handle, b_handle=self.b.handle, keep_c_resident=self.keep_c,
            c_ttl_seconds=self.c_ttl, c_in_handle=self.c_in_handle,
            **self._form())).SerializeToString()
        for view, which in ((None if self.a.array is None else self.a.bytes_view(), pb.OPERAND_A),
                            (None if self.b.array is None else self.b.bytes_view(), pb.OPERAND_B),
                            (self.c_in, pb.OPERAND_C)):
            if view is None:
                continue
            for offset in range(0, len(view), chunk_bytes):
                data = view[offset:offset + chunk_bytes]
                yield _wire.stream_chunk(gemm_id, which, offset, data)
                if progress is not None:
                    progress.update(len(data))


def batched_spec(a, b, **options) -> Spec:
    """gemm_batched's GEMM: a (batch×m×k) and b (batch×k×n) as the server takes them, each
    batch's matrices packed one after the other (every matrix as gemm takes an operand, but not
    as a transposed view: each is copied into the packed array)."""
    if np.ndim(a) != 3 or np.ndim(b) != 3 or len(a) != len(b) or len(a) == 0:
        raise ValueError(f"gemm_batched takes A (batch x m x k) and B (batch x k x n) of one "
                         f"batch >= 1; got shapes {tuple(np.shape(a))} and {tuple(np.shape(b))}")
    packed = []
    for x, name in ((a, "A"), (b, "B")):
        items = [_arrays.as_operand(x[i], f"{name}[{i}]", allow_transposed=False)
                 for i in range(len(x))]
        if len({(item[0].shape, item[1]) for item in items}) != 1:
            raise ValueError(f"{name}'s matrices differ in shape or dtype")
        packed.append(np.concatenate([item[0] for item in items]))
    spec = Spec(a[0], b[0], batch=len(a), **options)
    for operand, array in zip((spec.a, spec.b), packed):
        operand.array, operand.transposed = array, False  # packed as op(X), not as stored
    return spec


class GroupSpec:
    """gemm_grouped's GEMM: problems of their own shapes in one unary Gemm (GemmRequest.group),
    their operands packed in order, one form for all (dtype, layout, C type, scales, options).
    Operands as gemm takes them, but not by handle; where the problems' layouts differ (some
    transposed views, some not), the transposed ones are copied into op(X) form."""

    def __init__(self, pairs, *, c=None, **options):
        pairs = list(pairs)
        if not pairs:
            raise ValueError("gemm_grouped takes at least one (A, B) pair")
        beta = float(options.get("beta", 0.0))
        if beta != 0 and (c is None or len(c) != len(pairs)):
            raise ValueError(f"beta={beta} needs c: one C_in per pair ({len(pairs)}), m x n of "
                             f"C's type each")
        self.specs = []
        for i, item in enumerate(pairs):
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise ValueError(f"pair {i}: expected (A, B); got {type(item).__name__}")
            self.specs.append(Spec(item[0], item[1], index=i,
                                   c=None if beta == 0 else c[i], **options))
        if len({s.dtype for s in self.specs}) > 1:
            raise ValueError("the pairs mix dtypes (fp16 and bf16): a group has one type")
        for name in ("a", "b"):
            operands = [getattr(s, name) for s in self.specs]
            if any(op.handle for op in operands):
                raise ValueError(f"{name.upper()}: a grouped GEMM takes arrays, not resident "
                                 f"matrices")
            if len({op.transposed for op in operands}) > 1:
                for op in operands:
                    if op.transposed:
                        op.array, op.transposed = np.ascontiguousarray(op.array.T), False

    @property
    def c_bytes(self) -> int:
        return sum(s.c_bytes for s in self.specs)

    def unary_request(self) -> bytes:
        """The serialized GemmRequest: the group's problems, A's, B's (and C_in's) packed."""
        first = self.specs[0]
        small = pb.GemmRequest(options=first.options, **first._form())
        for s in self.specs:
            small.group.add(m=s.m, n=s.n, k=s.k)
        if first.beta != 0:
            small.c_in = b"".join(s.c_in.tobytes() for s in self.specs)
        return _wire.gemm_request(small, np.concatenate([s.a.bytes_view() for s in self.specs]),
                                  np.concatenate([s.b.bytes_view() for s in self.specs]))


def stream_requests(specs: Dict[int, Spec], order: Sequence[int], chunk_bytes: int, progress):
    """Every GEMM of `order`, one after the other (a GEMM is complete before the next starts, so
    a stream that breaks at GEMM X has admitted every GEMM before X and none after it)."""
    for i in order:
        yield from specs[i].stream_messages(i, chunk_bytes, progress)


def normalize_pairs(pairs, defaults: dict) -> List[Spec]:
    """gemm_many's items: (A, B) or (A, B, {per-GEMM options}) → Specs."""
    specs = []
    for i, item in enumerate(pairs):
        if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
            raise ValueError(f"pair {i}: expected (A, B) or (A, B, options); "
                             f"got {type(item).__name__}")
        options = dict(defaults)
        if len(item) == 3:
            unknown = set(item[2]) - set(defaults)
            if unknown:
                raise ValueError(f"pair {i}: unknown options {sorted(unknown)}")
            options.update(item[2])
        specs.append(Spec(item[0], item[1], index=i, **options))
    return specs

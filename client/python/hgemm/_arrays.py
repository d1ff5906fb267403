"""Operands in (numpy arrays, torch tensors) and results out (numpy, or torch when asked).

The wire format is fp16 (or bf16), little-endian, row-major, dense (proto/hgemm.proto). Policy:
  * float16 arrays go as they are; a transposed view of a C-contiguous array (B.T, an
    nn.Linear weight's .t()) goes as stored, flagged transposed (as_operand); other
    non-C-contiguous or big-endian ones are copied first.
  * torch.bfloat16 tensors (and numpy arrays of ml_dtypes' bfloat16) go as bf16 (as_operand),
    and so do uint16 arrays of bf16 bit patterns with dtype="bf16".
    A bf16 C comes back as float32 (exact) in numpy, as torch.bfloat16 with as_torch.
  * float32 / float64 arrays are converted to float16 with a ConversionWarning (the server
    computes in fp16 anyway); values outside fp16's range (|x| > 65504) raise ValueError
    instead of silently becoming inf.
  * Anything else (integers, bool, complex) raises TypeError.
  * torch tensors, CPU or CUDA, are detached and copied to host memory.
Results are read-only ndarrays: views of the received bytes where they arrive in one message,
so that C is not copied once more (np.array(C) or C.copy() for a writable one); torch results
are ordinary tensors.
"""
import warnings
from typing import Optional

import numpy as np

FP16 = np.dtype("<f2")
FP16_MAX = 65504.0
_MAX_DIM = 2**32 - 1


class ConversionWarning(UserWarning):
    """An operand was converted to float16 (e.g. from float32) before being sent."""


def is_torch_tensor(x) -> bool:
    # No torch import unless the caller already has a tensor.
    return (type(x).__module__.split(".")[0] == "torch" and hasattr(x, "dtype")
            and hasattr(x, "detach"))


def _torch_to_numpy(t, name: str) -> np.ndarray:
    import torch
    if t.dtype not in (torch.float16, torch.float32, torch.float64):
        raise TypeError(f"{name} is a {t.dtype} tensor; hgemm-serve takes torch.float16 "
                        f"(float32 and float64 are converted with a warning)")
    return t.detach().cpu().numpy()  # .cpu() is a no-op for a CPU tensor


_FLOAT16 = np.dtype(np.float16)


def _is_bf16(x) -> bool:
    if isinstance(x, np.ndarray):
        # float16, the usual operand, first: numpy computes dtype.name in Python, at ~10x the
        # cost of a dtype comparison, and this runs for every operand of every call.
        return x.dtype != _FLOAT16 and x.dtype.name == "bfloat16"
    if is_torch_tensor(x):
        import torch
        return x.dtype == torch.bfloat16
    return False


def _transposed_view(x) -> bool:
    """Whether x (2-D) is the transpose of a C-contiguous matrix, and not C-contiguous itself."""
    if is_torch_tensor(x):
        return x.dim() == 2 and not x.is_contiguous() and x.t().is_contiguous()
    return (isinstance(x, np.ndarray) and x.ndim == 2 and not x.flags.c_contiguous
            and x.T.flags.c_contiguous)


def as_operand(x, name: str, allow_transposed: bool = True, dtype=None):
    """(array, dtype, transposed): x as stored, 2-D and C-contiguous, of dtype "fp16" (a float16
    array, as as_fp16_matrix) or "bf16" (uint16 bit patterns); transposed when x is a transposed
    view that goes as stored (the caller sends op(X) = storedᵀ), never when not allowed.
    dtype: None (from x: bf16 for torch.bfloat16 or ml_dtypes' bfloat16, else fp16), "fp16",
    or "bf16" (x's uint16 elements are bf16 bit patterns, for numpy without ml_dtypes)."""
    if dtype not in (None, "fp16", "bf16"):
        raise ValueError(f"dtype must be None (from the arrays), 'fp16' or 'bf16'; got {dtype!r}")
    transposed = allow_transposed and _transposed_view(x)
    stored = (x.t() if is_torch_tensor(x) else x.T) if transposed else x
    if dtype == "bf16" and not _is_bf16(stored):
        if not isinstance(stored, np.ndarray) or stored.dtype != np.uint16:
            what = f"torch {x.dtype}" if is_torch_tensor(x) else str(np.asarray(x).dtype)
            raise TypeError(f"{name} has dtype {what}; dtype='bf16' takes uint16 arrays of bf16 "
                            f"bit patterns (or torch.bfloat16 tensors)")
        bits = np.ascontiguousarray(stored, dtype="<u2")
        _check_matrix_shape(bits.shape, name)
        return bits, "bf16", transposed
    if dtype == "fp16" and _is_bf16(stored):
        raise TypeError(f"{name} is bfloat16; dtype='fp16' takes float16 (or leave dtype None)")
    if not _is_bf16(stored):
        matrix = as_fp16_matrix(stored, name + ".T" if transposed else name)
        return matrix, "fp16", transposed
    if is_torch_tensor(stored):
        import torch
        bits = stored.detach().cpu().contiguous().view(torch.int16).numpy().view("<u2")
    else:
        bits = np.ascontiguousarray(stored).view("<u2")
    _check_matrix_shape(bits.shape, name)
    return bits, "bf16", transposed


def same_memory(array: Optional[np.ndarray], x) -> bool:
    """Whether `array` (what is sent of x, or None: nothing) starts where x's own memory does,
    i.e. it is x as stored and no copy or conversion of it."""
    if array is None:
        return True
    address = array.__array_interface__["data"][0]
    if isinstance(x, np.ndarray):
        return x.__array_interface__["data"][0] == address
    if is_torch_tensor(x):
        return x.device.type == "cpu" and x.data_ptr() == address
    return False


def _check_matrix_shape(shape, name: str) -> None:
    if len(shape) != 2:
        raise ValueError(f"{name} must be a 2-D matrix; it has shape {tuple(shape)}")
    if shape[0] == 0 or shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(shape)}); both dimensions must be ≥ 1")
    if shape[0] > _MAX_DIM or shape[1] > _MAX_DIM:
        raise ValueError(f"{name} has shape {tuple(shape)}; dimensions are at most 2**32 - 1")


def as_fp16_matrix(x, name: str) -> np.ndarray:
    """A 2-D, C-contiguous, little-endian float16 ndarray holding x (a copy only when needed)."""
    if is_torch_tensor(x):
        arr = _torch_to_numpy(x, name)
    elif isinstance(x, np.ndarray):
        arr = x
    else:
        arr = np.asarray(x)
    _check_matrix_shape(arr.shape, name)
    if arr.dtype.kind == "f" and arr.dtype.itemsize == 2:
        return np.ascontiguousarray(arr, dtype=FP16)  # copies only if strided or big-endian
    if arr.dtype.kind == "f":
        warnings.warn(f"{name} is {arr.dtype}: converted to float16 (hgemm-serve computes in fp16; "
                      f"pass float16 to skip this copy and this warning)", ConversionWarning,
                      stacklevel=4)
        with np.errstate(over="ignore", invalid="ignore"):
            out = np.ascontiguousarray(arr, dtype=FP16)
        if np.isinf(out).any() and (np.abs(arr[np.isinf(out)]) != np.inf).any():
            raise ValueError(f"{name} has values outside fp16's range (±{FP16_MAX:g}); "
                             f"scale it before sending")
        return out
    what = f"torch {x.dtype}" if is_torch_tensor(x) else str(arr.dtype)
    raise TypeError(f"{name} has dtype {what}; hgemm-serve takes float16 "
                    f"(float32 and float64 are converted with a warning)")


def as_c_input(x, m: int, n: int, c_dtype: str, batch: int = 1) -> np.ndarray:
    """C_in (m×n, or batch×m×n) as the bytes the server reads: C's type, C-contiguous,
    little-endian, as a uint8 array. fp16: float16 (other floats converted); fp32: float32;
    bf16: torch bfloat16 as it is, other floats rounded to bf16 (to nearest even, as torch)."""
    want = (batch, m, n) if batch > 1 else (m, n)
    if np.shape(x) != want:
        raise ValueError(f"c has shape {tuple(np.shape(x))}; C_in is m x n = {m} x {n}"
                         + (f" for each of the batch of {batch}" if batch > 1 else ""))
    if c_dtype == "fp16":
        arr = np.ascontiguousarray(_torch_to_numpy(x, "c") if is_torch_tensor(x) else x,
                                   dtype=FP16)
    elif c_dtype == "bf16" and _is_bf16(x):
        import torch
        arr = x.detach().cpu().contiguous().view(torch.int16).numpy().view("<u2")
    else:
        arr = np.ascontiguousarray(_torch_to_numpy(x, "c") if is_torch_tensor(x) else x,
                                   dtype="<f4")
        if c_dtype == "bf16":
            bits = arr.view("<u4")
            arr = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
    return byte_view(arr)


def check_out(out, m: int, n: int, keep_c: bool, as_torch, c_dtype: str = "fp16") -> None:
    """gemm's out=: None, or a writable, C-contiguous m×n ndarray of C's type (float16, or
    float32 for c_dtype "fp32"): ValueError or TypeError otherwise, and with keep_c or
    as_torch, which return no array."""
    if out is None:
        return
    if keep_c or as_torch:
        raise ValueError("out= takes C as a numpy array: not with keep_c or as_torch")
    want = np.dtype("<f4") if c_dtype == "fp32" else FP16
    if not isinstance(out, np.ndarray) or out.dtype != want:
        raise TypeError(f"out must be a {want.name} numpy array; got {type(out).__name__}"
                        f"{'' if not isinstance(out, np.ndarray) else ' of ' + str(out.dtype)}")
    if out.shape != (m, n) or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"out must be a writable, C-contiguous {m}x{n} array; got shape "
                         f"{out.shape}, contiguous={out.flags.c_contiguous}, "
                         f"writeable={out.flags.writeable}")


def byte_view(array: np.ndarray) -> np.ndarray:
    """A C-contiguous array's bytes as a 1-D uint8 array over the same memory."""
    return array.reshape(-1).view(np.uint8)


def c_array(buffer: np.ndarray, m: int, n: int, dtype: str = "fp16") -> np.ndarray:
    """C as an m×n ndarray over `buffer` (a uint8 ndarray of m·n elements of `dtype`): float16
    or float32 views (no copy); bf16 widened to a float32 copy (exact)."""
    if dtype == "fp32":
        return buffer.view("<f4").reshape(m, n)
    if dtype == "bf16":
        return (buffer.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(m, n)
    return buffer.view(FP16).reshape(m, n)


def to_output(c: np.ndarray, as_torch):
    """c as a read-only numpy array (as_torch False), a CPU torch tensor (True), or a tensor on a
    torch device ("cuda:0"). `c` may be a view of a received message (read-only already); torch
    has no read-only tensors, so a CPU tensor of such a view gets its own copy."""
    if as_torch is False or as_torch is None:
        c.flags.writeable = False
        return c
    try:
        import torch
    except ImportError as e:
        raise ImportError("as_torch needs torch, which is not installed") from e
    device = torch.device("cpu") if as_torch is True else torch.device(as_torch)
    if device.type == "cpu":
        return torch.from_numpy(c if c.flags.writeable else c.copy())
    with warnings.catch_warnings():  # only read, by the copy to the device
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(c).to(device)

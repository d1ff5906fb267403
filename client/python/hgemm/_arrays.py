"""Operands in (numpy arrays, torch tensors) and results out (numpy, or torch when asked).

The wire format is fp16, little-endian, row-major, dense (proto/hgemm.proto). Policy:
  * float16 arrays go as they are; non-C-contiguous or big-endian ones are copied first.
  * float32 / float64 arrays are converted to float16 with a ConversionWarning (the server
    computes in fp16 anyway); values outside fp16's range (|x| > 65504) raise ValueError
    instead of silently becoming inf.
  * Anything else (integers, bool, complex, torch.bfloat16) raises TypeError: hgemm is fp16 only.
  * torch tensors, CPU or CUDA, are detached and copied to host memory.
Results are read-only ndarrays: views of the received bytes where they arrive in one message,
so that C is not copied once more (np.array(C) or C.copy() for a writable one); torch results
are ordinary tensors.
"""
import warnings

import numpy as np

FP16 = np.dtype("<f2")
FP16_MAX = 65504.0
_MAX_DIM = 2**32 - 1


class ConversionWarning(UserWarning):
    """An operand was converted to float16 (e.g. from float32) before being sent."""


def is_torch_tensor(x) -> bool:
    # No torch import unless the caller already has a tensor.
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "dtype") and hasattr(x, "detach")


def _torch_to_numpy(t, name: str) -> np.ndarray:
    import torch
    if t.dtype == torch.bfloat16:
        raise TypeError(
            f"{name} is a torch.bfloat16 tensor; hgemm-serve computes in fp16 only: convert it "
            f"with {name}.half() (values past fp16's range of ±65504 become inf)")
    if t.dtype not in (torch.float16, torch.float32, torch.float64):
        raise TypeError(f"{name} is a {t.dtype} tensor; hgemm-serve takes torch.float16 "
                        f"(float32 and float64 are converted with a warning)")
    return t.detach().cpu().numpy()  # .cpu() is a no-op for a CPU tensor


def as_fp16_matrix(x, name: str) -> np.ndarray:
    """A 2-D, C-contiguous, little-endian float16 ndarray holding x (a copy only when needed)."""
    if is_torch_tensor(x):
        arr = _torch_to_numpy(x, name)
    elif isinstance(x, np.ndarray):
        arr = x
    else:
        arr = np.asarray(x)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D matrix; it has shape {tuple(arr.shape)}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(arr.shape)}); both dimensions must be ≥ 1")
    if arr.shape[0] > _MAX_DIM or arr.shape[1] > _MAX_DIM:
        raise ValueError(f"{name} has shape {tuple(arr.shape)}; dimensions are at most 2**32 - 1")
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


def check_out(out, m: int, n: int, keep_c: bool, as_torch) -> None:
    """gemm's out=: None, or a writable, C-contiguous m×n float16 ndarray (ValueError or
    TypeError otherwise, and with keep_c or as_torch, which return no array)."""
    if out is None:
        return
    if keep_c or as_torch:
        raise ValueError("out= takes C as a numpy array: not with keep_c or as_torch")
    if not isinstance(out, np.ndarray) or out.dtype != FP16:
        raise TypeError(f"out must be a float16 numpy array; got {type(out).__name__}"
                        f"{'' if not isinstance(out, np.ndarray) else ' of ' + str(out.dtype)}")
    if out.shape != (m, n) or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"out must be a writable, C-contiguous {m}x{n} array; got shape "
                         f"{out.shape}, contiguous={out.flags.c_contiguous}, "
                         f"writeable={out.flags.writeable}")


def byte_view(array: np.ndarray) -> np.ndarray:
    """A C-contiguous array's bytes as a 1-D uint8 array over the same memory."""
    return array.reshape(-1).view(np.uint8)


def c_array(buffer: np.ndarray, m: int, n: int) -> np.ndarray:
    """C as an m×n float16 ndarray over `buffer` (a uint8 ndarray of 2·m·n bytes; no copy)."""
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

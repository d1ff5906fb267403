"""CUDA IPC regions (proto/hgemm.proto, "CUDA IPC regions"): a torch CUDA tensor's device memory
shared with a server on the same host, which reads A and B from it and writes C into it in
place, on that GPU: no host copy on either side.

torch is imported only for a tensor the caller already has. The handle and the allocation come
from the CUDA driver through ctypes (libcuda.so.1, present wherever a GPU is):
cuMemGetAddressRange gives the allocation that holds the tensor (torch's caching allocator
hands out pieces of larger cudaMalloc segments), cuIpcGetMemHandle its handle, and
cuDeviceGetPCIBusId the device's PCI bus id, which the server matches against its own devices
(the same physical GPU whatever CUDA_VISIBLE_DEVICES each side has).

Thread safety: cuda_region is thread-safe; a CudaRegion is an immutable description.
"""
import ctypes
from typing import TYPE_CHECKING, Optional

from ._arrays import is_torch_tensor

if TYPE_CHECKING:
    import torch  # optional at run time: only a type checker reads the name

_HANDLE_BYTES = 64
_driver: Optional[ctypes.CDLL] = None


def _cuda_driver() -> ctypes.CDLL:
    global _driver
    if _driver is None:
        try:
            _driver = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise RuntimeError(f"CUDA IPC needs the CUDA driver (libcuda.so.1): {e}") from None
    return _driver


def _check(result: int, what: str) -> None:
    if result != 0:
        raise RuntimeError(f"{what} failed with CUDA driver error {result}")


class CudaRegion:
    """The device memory of a torch CUDA tensor as a server registers it: the allocation that
    holds the tensor (`handle`: its 64-byte cudaIpcMemHandle_t, `base` and `nbytes`), its
    device (`device`: the PCI bus id), and the tensor's byte `offset` in it. Keeps the tensor
    (and so the memory) alive."""

    def __init__(self, tensor, handle: bytes, device: str, base: int, nbytes: int):
        self.tensor, self.handle, self.device = tensor, handle, device
        self.base, self.nbytes = base, nbytes
        self.offset = tensor.data_ptr() - base

    @property
    def key(self):
        """The allocation, as a client's books know it: (device, base)."""
        return (self.device, self.base)


def cuda_region(tensor: "torch.Tensor") -> CudaRegion:
    """The CUDA IPC description of a C-contiguous torch CUDA tensor (float16, bfloat16 or
    float32): what Client.cuda_gemm registers once per allocation. Raises TypeError for
    anything else, RuntimeError when the driver refuses (e.g. memory from cudaMallocAsync
    pools, which CUDA IPC cannot share)."""
    if not is_torch_tensor(tensor) or not tensor.is_cuda:
        raise TypeError(f"cuda_region takes a torch CUDA tensor, not {type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise TypeError("cuda_region takes a C-contiguous tensor (.contiguous() makes one)")
    import torch
    driver = _cuda_driver()
    with torch.cuda.device(tensor.device):
        torch.cuda.synchronize()  # the device's primary context current on this thread
        base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
        _check(driver.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                              ctypes.c_uint64(tensor.data_ptr())),
               "cuMemGetAddressRange")
        handle = ctypes.create_string_buffer(_HANDLE_BYTES)
        _check(driver.cuIpcGetMemHandle(handle, base), "cuIpcGetMemHandle")
        device = ctypes.c_int(0)
        _check(driver.cuCtxGetDevice(ctypes.byref(device)), "cuCtxGetDevice")
        bus_id = ctypes.create_string_buffer(32)
        _check(driver.cuDeviceGetPCIBusId(bus_id, len(bus_id), device), "cuDeviceGetPCIBusId")
    return CudaRegion(tensor, handle.raw, bus_id.value.decode(), base.value, size.value)

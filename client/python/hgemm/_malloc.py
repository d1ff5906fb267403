"""glibc malloc settings under which a message's large buffers are reused instead of faulted in.

Every large message is copied into fresh buffers: the request by the client (one join) and again
by gRPC Python (into a slice), the response by gRPC Python (out of its slices into bytes). glibc
serves a buffer over its mmap threshold (128 KiB at first, adapting up to 32 MiB) with a new
mapping and gives freed memory at the top of a heap back to the kernel past its trim threshold,
so each call's buffers arrive as fresh pages (the adaptive threshold stops at the largest size
freed so far, and a request of exactly that size is still mapped), and the page faults cost more
than the copies themselves: with B resident, hundreds of faults per 128x8192x8192 GEMM
(docs/results/cpu/python_client_profile.md). The settings are process-wide and cost memory
that is kept, not returned: up to TRIM_THRESHOLD_BYTES of freed memory per malloc arena.

tune() applies them once per process (the first Client does), unless the environment chose:
HGEMM_MALLOC_TUNING=0, or glibc's own MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ /
GLIBC_TUNABLES=glibc.malloc.*. Other C libraries are left alone. Thread-safe.
"""
import ctypes
import os
import threading

# The largest threshold glibc accepts (half its 64 MiB per-thread heap); unary messages up to the
# client's default unary_limit_bytes (32 MiB) stay below it.
MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 256 << 20
_M_TRIM_THRESHOLD = -1  # glibc's <malloc.h>
_M_MMAP_THRESHOLD = -3

_lock = threading.Lock()
_applied = None


def tune() -> bool:
    """Applies the settings (once); True if they are in effect from this call or an earlier one."""
    global _applied
    with _lock:
        if _applied is None:
            _applied = _apply()
        return _applied


def _environment_chose() -> bool:
    env = os.environ
    return (env.get("HGEMM_MALLOC_TUNING", "1") == "0" or "MALLOC_MMAP_THRESHOLD_" in env
            or "MALLOC_TRIM_THRESHOLD_" in env or "glibc.malloc." in env.get("GLIBC_TUNABLES", ""))


def _apply() -> bool:
    if _environment_chose():
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only: mallopt's parameters differ elsewhere
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
            and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1)

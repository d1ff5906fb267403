"""Shared memory with a server on the same host (proto/hgemm.proto, "Shared memory"): Region (one
sealed memfd of this process, mapped here and registered with the server) and SharedMemory (a
client's regions: its shared buffers and its arenas, and where an array lives among them).

Why a memfd named by /proc/<pid>/fd/<fd> (as the C++ SharedRegion): the server opens the very
file, nothing is left behind in /dev/shm when a process dies, and F_SEAL_SHRINK makes a later
ftruncate fail here instead of turning the server's next read into SIGBUS.

Two ways operands and C go through regions, both over a unary Gemm that names {region, offset}:
  * shared buffers (Client.shared_buffer): numpy arrays living in a region of their own; a GEMM
    of arrays (or C-contiguous slices of them) that live there names them: no copy at all.
  * the arena: an operand or C of at least shared_memory_min_bytes that lives elsewhere is
    copied into a region the client keeps for that (registered once, reused by later GEMMs;
    one per GEMM in flight, grown by replacing it with a larger one when a GEMM needs more).

Thread safety: SharedMemory is thread-safe (a lock around its books); a Region's bytes are its
user's to synchronize.
"""
import fcntl
import mmap
import os
import threading
from typing import Dict, List, Optional, Tuple

import numpy as np

from ._proto import hgemm_pb2 as pb

_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
ALIGN = 64  # where each part of an arena starts: a cache line, and any element's alignment
SERVER_ALIGN = 16  # what the server requires of every region offset (it uses them in place)
ARENA_MIN_BYTES = 16 << 20


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class MappedRegion:
    """Memory shared with the server: `bytes` (a uint8 array over all `nbytes` of it), `handle`
    the server's name for it once registered ("" before). The memory lives as long as arrays
    over it do, even after close(). Made here (Region, registered by a RegisterRegion call) or
    by the native core (_native.NativeRegion, registered as it is made)."""

    def __init__(self, memory: np.ndarray, label: str, handle: str = ""):
        self.bytes, self.nbytes, self.label, self.handle = memory, memory.nbytes, label, handle
        self.address = memory.ctypes.data

    def offset_of(self, start: int, nbytes: int) -> Optional[int]:
        """The offset in this region of `nbytes` at address `start`, None if they are not all
        inside it or start where the server cannot use them in place (it requires
        SERVER_ALIGN)."""
        if (self.address <= start and start + nbytes <= self.address + self.nbytes
                and (start - self.address) % SERVER_ALIGN == 0):
            return start - self.address
        return None

    def close(self) -> None:
        """Lets go of what the region holds here but its memory."""


class Region(MappedRegion):
    """A sealed memfd of `nbytes` (≥ 1), mapped read-write; close() closes the file
    descriptor."""

    def __init__(self, nbytes: int, label: str):
        fd = os.memfd_create(label, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            # Allocated, not only sized: the server refuses holes (its touch of them would
            # allocate memory on the server's account).
            os.posix_fallocate(fd, 0, nbytes)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            super().__init__(np.frombuffer(mmap.mmap(fd, nbytes), dtype=np.uint8), label)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd

    @property
    def path(self) -> str:
        """The name the server opens it by."""
        return f"/proc/{os.getpid()}/fd/{self.fd}"

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class CudaIpcRegistration:
    """A client's device memory registered by CUDA IPC (`handle`: the server's name for it);
    nothing to close here (the memory is the tensor's)."""

    def __init__(self, handle: str):
        self.handle = handle

    def close(self) -> None:
        pass


class ArenaPlan:
    """Which parts of one GEMM go through an arena: the operands to copy in (name, array) and
    the bytes of C, laid out at aligned offsets."""

    def __init__(self, copies: List[Tuple[str, np.ndarray]], c_bytes: int):
        self.offsets, at = {}, 0
        for name, array in copies:
            self.offsets[name] = at
            at += _aligned(array.nbytes)
        if c_bytes:
            self.offsets["c"] = at
            at += _aligned(c_bytes)
        self.copies, self.c_bytes, self.nbytes = copies, c_bytes, at


class SharedMemory:
    """A client's regions. `enabled`: GEMMs may use them (a unix: target, not turned off);
    `arena_refused`: why the server refused the first arena (None: not refused), after which
    GEMMs of ordinary arrays go as bytes."""

    def __init__(self, target: str, enabled: Optional[bool], min_bytes: int):
        unix = target.startswith("unix:")
        if enabled and not unix:
            raise ValueError(f"shared_memory=True needs a unix: target (the server's Unix "
                             f"socket); got {target!r}")
        self.enabled = unix if enabled is None else bool(enabled)
        self.min_bytes = min_bytes
        self.arena_refused = None
        self._lock = threading.Lock()
        self._buffers: List[MappedRegion] = []  # registered, each one shared buffer's
        self._arenas: List[MappedRegion] = []   # registered, every arena
        self._free: List[MappedRegion] = []     # the arenas no GEMM has now
        # registered CUDA IPC allocations, by (device, base address, IPC handle): a new
        # allocation at an old address has a new handle
        self._cuda: Dict[tuple, CudaIpcRegistration] = {}

    def add_buffer(self, region: MappedRegion) -> None:
        with self._lock:
            self._buffers.append(region)

    def find(self, array: Optional[np.ndarray]) -> Optional[pb.RegionRef]:
        """Where `array` lives among the shared buffers (None: elsewhere, or not C-contiguous)."""
        if array is None or not array.flags.c_contiguous:
            return None
        start, nbytes = array.__array_interface__["data"][0], array.nbytes
        with self._lock:
            for region in self._buffers:
                offset = region.offset_of(start, nbytes)
                if offset is not None:
                    return pb.RegionRef(region=region.handle, offset=offset)
        return None

    def arena_parts(self, operands, c_bytes: int) -> Optional[ArenaPlan]:
        """The plan for a GEMM whose operands (name, array or None) and C (c_bytes, 0: none)
        do not live in shared buffers: those of at least min_bytes go through an arena. None
        when nothing does, or the server refused arenas."""
        if self.arena_refused is not None:
            return None
        copies = [(name, array) for name, array in operands
                  if array is not None and array.nbytes >= self.min_bytes]
        c_bytes = c_bytes if c_bytes >= self.min_bytes else 0
        return ArenaPlan(copies, c_bytes) if copies or c_bytes else None

    def take_arena(self, nbytes: int) -> Tuple[Optional[MappedRegion], List[MappedRegion]]:
        """(a free arena of at least nbytes, or None: make one; the free arenas too small to
        keep, now out of the books, to unregister)."""
        with self._lock:
            fits = [r for r in self._free if r.nbytes >= nbytes]
            if fits:
                arena = min(fits, key=lambda r: r.nbytes)
                self._free.remove(arena)
                return arena, []
            dropped = self._free
            self._free = []
            for region in dropped:
                self._arenas.remove(region)
            return None, dropped

    @staticmethod
    def new_arena_bytes(nbytes: int) -> int:
        """The size of a new arena for a GEMM of nbytes: a power of two, so that a few sizes
        serve every GEMM."""
        size = ARENA_MIN_BYTES
        while size < nbytes:
            size *= 2
        return size

    def add_arena(self, region: MappedRegion) -> None:
        with self._lock:
            self._arenas.append(region)

    def give_back(self, arena: MappedRegion) -> None:
        with self._lock:
            self._free.append(arena)

    def cuda_registration(self, key: tuple) -> Optional[CudaIpcRegistration]:
        with self._lock:
            return self._cuda.get(key)

    def add_cuda(self, key: tuple, registration: CudaIpcRegistration) -> None:
        with self._lock:
            self._cuda[key] = registration

    def take_all(self) -> list:
        """Every region, now out of the books (close: to unregister)."""
        with self._lock:
            regions = self._buffers + self._arenas + list(self._cuda.values())
            self._buffers, self._arenas, self._free, self._cuda = [], [], [], {}
            return regions

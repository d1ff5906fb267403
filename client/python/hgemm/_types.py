"""The type aliases of the public API's signatures, for callers' type checkers (the package
ships py.typed, PEP 561)."""
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from ._resident import ResidentMatrix

if TYPE_CHECKING:
    import torch  # optional at run time: only a type checker reads the name

# A matrix the client sends: a numpy array or a torch tensor.
Array = Union[np.ndarray, "torch.Tensor"]
# A GEMM's A, B or C input: an array, or a matrix that lives on the server.
Operand = Union[Array, ResidentMatrix]
# as_torch: False (C as an ndarray), True (a CPU tensor) or a torch device ("cuda:0").
AsTorch = Union[bool, str]
# What a GEMM or a download returns depends on its arguments: C as an ndarray, a torch tensor
# with as_torch, a ResidentMatrix with keep_c, a GemmResult with details. Any, so that a
# caller's type checker takes the one asked for without a cast.
Output = Any

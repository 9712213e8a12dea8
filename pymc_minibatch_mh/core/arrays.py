"""Array copies for compiled code, without Numba's shape-checked slice assignment.

``dst[...] = src`` in a Numba function checks the shapes and, to say what went wrong,
compiles a formatted error message: 2–3 s of compilation the first time in a process
(Numba's cache empty), for a check that arrays sized by their caller never fail.
:func:`copy_into` is the one copy the compiled kernels use instead.
"""

from __future__ import annotations

import numba
import numpy as np
from numpy.typing import NDArray

__all__ = ["copy_into"]


@numba.njit(cache=True, nogil=True)
def copy_into(dst: NDArray[np.float64], src: NDArray[np.float64]) -> None:  # pragma: no cover
    """``dst[...] = src`` for arrays of one size, element by element (compiled).

    Contiguous arrays of any number of dimensions; the caller sizes ``dst`` to hold
    ``src`` (a view such as ``buf[n : n + k]`` is fine).
    """
    flat_dst = dst.reshape(-1) if dst.ndim > 1 else dst
    flat_src = src.reshape(-1) if src.ndim > 1 else src
    for i in range(flat_src.shape[0]):
        flat_dst[i] = flat_src[i]

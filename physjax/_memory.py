"""Keep freed host memory for reuse (glibc), so large CPU computations do not page-fault.

XLA:CPU allocates the output and scratch buffers of every call with ``malloc`` from its
worker threads. glibc serves a request above its mmap threshold (at most 32 MiB, and always
above 64 MiB on a worker thread's arena) with a fresh ``mmap`` and returns it on ``free``,
so each call of a large solve touches every page of its buffers anew: the kernel faults
and zeroes them. On the 2-core benchmark machine this made a 2048² spectral Poisson solve
1.5–2× slower than its arithmetic (see docs/benchmarks.md). [`tune_cpu_allocator`][]
switches glibc to one arena, no mmap for large blocks and no trimming of the heap top, so
freed buffers are reused without faults; the costs are that memory freed by the process is
kept, not returned to the system, and that all threads share one malloc arena (compilation,
which allocates from several threads, was ~10% slower in a test run).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8

_state = {"tuned": False}


def tune_cpu_allocator(trim_threshold: int = 1 << 30) -> bool:
    """Make glibc ``malloc`` keep and reuse large freed blocks (Linux only).

    Call it early, before the first JAX computation (worker threads choose their malloc
    arena on their first allocation). The ``physjax`` command and the benchmarks call it;
    set ``PHYSJAX_NO_ALLOCATOR_TUNING=1`` to leave the allocator alone. Setting the glibc
    environment variables ``MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0
    MALLOC_TRIM_THRESHOLD_=1073741824`` before starting Python has the same effect.

    **Arguments:**

    - `trim_threshold`: bytes of free memory at the top of the heap kept before glibc
      returns some to the system (default 1 GiB).

    **Returns:** ``True`` when the settings were applied, ``False`` elsewhere (not Linux
    with glibc, or disabled by the environment variable).
    """
    if os.environ.get("PHYSJAX_NO_ALLOCATOR_TUNING"):
        return False
    if _state["tuned"]:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = (
        mallopt(_M_ARENA_MAX, 1) == 1
        and mallopt(_M_MMAP_MAX, 0) == 1
        and mallopt(_M_TRIM_THRESHOLD, int(min(trim_threshold, 2**31 - 1))) == 1
    )
    _state["tuned"] = ok
    return ok

"""The host's allocator while steps are timed: glibc's malloc kept from handing memory back between steps.

With glibc's defaults a process that trains on the CPU gives the kernel back the
pages of every large tensor it frees (blocks over the mmap threshold are unmapped,
the heap's free top is trimmed), and takes them again on the next step, page by
page: the 4-layer LM of :mod:`bench.rank_models` (one core) faulted 4,000-12,000 pages
per step, and its step ran 17 % slower and spread wider (p90/p10 1.34 against 1.06)
than with the memory kept; the U-Net's 20 % slower (BENCHMARKS.md, "The host's
allocator"). What those faults cost depends on the kernel's state at that moment,
not on the placement: noise in every comparison of placements on CPU devices.

:func:`steady_malloc` sets, once per process, what :data:`STEADY_MALLOC_ENV`
sets for a process started with it (:data:`STEADY_MALLOC`): every block comes from the
heap (not a mapping of its own), and the heap's free top stays, whatever their size.
A bound would leave the largest tensors faulting: with blocks up to 1 GiB from the heap and
2 GiB of free top kept (this module's first settings), the dense gradient of a 1.95 GiB
embedding on the host was still mapped anew every step, 513,000 faults and 0.96 s a step on
one core, against 0.09 s unbounded (BENCHMARKS.md, "Tensors over a gigabyte on the host").
Placer's measurements (:class:`envs.real.timing.Protocol`, on by default) run so; a user's
own job gets the same with the environment variables (README, "Plans across processes").
:func:`trim_malloc` gives the kept memory back (before a measurement reads the
process's resident set). Elsewhere than glibc (macOS, musl) both do nothing and
return False.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

#: glibc's ``mallopt`` parameters (``malloc.h``).
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
#: No bound: ``mallopt`` takes an ``int`` and glibc reads a threshold as a ``size_t``, so -1 is the largest size.
UNBOUNDED = -1
#: What :func:`steady_malloc` sets: every block from the heap, however large (glibc's own threshold moves between
#: 128 KiB and 32 MiB, and a tensor over it is mapped and unmapped at every step), the heap's free top never
#: trimmed, and the heap grown 64 MiB at a time.
STEADY_MALLOC = {M_MMAP_THRESHOLD: UNBOUNDED, M_TRIM_THRESHOLD: UNBOUNDED, M_TOP_PAD: 64 << 20}


def as_size(value: int) -> int:
    """A ``mallopt`` value as glibc reads a size (``size_t``, 64 bits).

    >>> as_size(UNBOUNDED) == 2**64 - 1, as_size(64 << 20)
    (True, 67108864)
    """
    return value % (1 << 64)


#: The same settings as glibc's environment variables, for a process started with them (``torchrun``'s ranks).
STEADY_MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(as_size(STEADY_MALLOC[M_MMAP_THRESHOLD])),
    "MALLOC_TRIM_THRESHOLD_": str(as_size(STEADY_MALLOC[M_TRIM_THRESHOLD])),
    "MALLOC_TOP_PAD_": str(as_size(STEADY_MALLOC[M_TOP_PAD])),
}


@functools.cache
def _glibc() -> Any:
    """This process's C library when it is glibc (it has ``mallopt`` and ``malloc_trim``), else None."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    if not all(hasattr(libc, f) for f in ("gnu_get_libc_version", "mallopt", "malloc_trim")):
        return None
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    return libc


@functools.cache
def steady_malloc() -> bool:
    """Keep freed memory in this process (module doc); whether glibc took every setting. Once per process: what
    it sets lasts as long as the process."""
    libc = _glibc()
    if libc is None:
        return False
    taken = [libc.mallopt(param, value) == 1 for param, value in STEADY_MALLOC.items()]  # each, whatever the others
    return all(taken)


def trim_malloc() -> bool:
    """Give the kernel back the free memory malloc keeps; whether this is glibc."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


__all__ = ["STEADY_MALLOC", "STEADY_MALLOC_ENV", "UNBOUNDED", "as_size", "steady_malloc", "trim_malloc"]

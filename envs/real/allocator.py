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

With every block from the heap, one more setting keeps the heap from growing: glibc's
per-thread cache of small freed blocks off (:data:`NO_TCACHE`). torch asks for each
tensor's memory aligned (``posix_memalign``), and glibc serves a large aligned block by
cutting a little more from the heap and freeing the two small ends. While those ends sit
in the thread's cache they count as in use, so the freed large block beside them cannot
merge with them, is a few bytes short of the next request of the same size, and the heap
grows by the block again: a 1.25 GiB tensor made and freed each step left a heap of 1.4 to
10.4 GB (1 to 8 copies; 6 runs of 12 above 4 copies), and a run still faulting all of its
pages at the 9th step now and then (BENCHMARKS.md, "The heap that grew by its largest
tensor"). With the cache off, the ends go where glibc merges them at the next large
request: 1 or 2 copies in 12 runs of 12. glibc reads that setting only when a process
starts (``GLIBC_TUNABLES``; ``mallopt`` has no such parameter), so :func:`steady_malloc`
cannot set it in a running process: the processes placer starts to measure in (a job's
ranks, :func:`children_start_steady`; the Ray actors that measure, :func:`steady_runtime_env`) start with it, the
``placer`` command starts itself again with it before it measures in its own process
(:func:`start_again_with_thread_cache_off`), and :data:`STEADY_MALLOC_ENV` has it for a user's own job.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
from typing import Any, Iterator, Sequence

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


#: glibc's tunable that turns the per-thread cache of small freed blocks off (module doc): read as a process starts.
NO_TCACHE = "glibc.malloc.tcache_count=0"

#: The same settings as glibc's environment variables, for a process started with them (``torchrun``'s ranks), and
#: the thread cache off (:data:`NO_TCACHE`).
STEADY_MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(as_size(STEADY_MALLOC[M_MMAP_THRESHOLD])),
    "MALLOC_TRIM_THRESHOLD_": str(as_size(STEADY_MALLOC[M_TRIM_THRESHOLD])),
    "MALLOC_TOP_PAD_": str(as_size(STEADY_MALLOC[M_TOP_PAD])),
    "GLIBC_TUNABLES": NO_TCACHE,
}


def with_tunable(tunables: str | None, tunable: str) -> str:
    """``GLIBC_TUNABLES``' value ``tunables`` with ``tunable`` (``name=value``) set, the others kept.

    >>> with_tunable(None, NO_TCACHE)
    'glibc.malloc.tcache_count=0'
    >>> with_tunable("glibc.malloc.hugetlb=1:glibc.malloc.tcache_count=7", NO_TCACHE)
    'glibc.malloc.hugetlb=1:glibc.malloc.tcache_count=0'
    """
    name = tunable.split("=", 1)[0]
    kept = [t for t in (tunables or "").split(":") if t and t.split("=", 1)[0] != name]
    return ":".join([*kept, tunable])


@contextlib.contextmanager
def children_start_with(tunable: str) -> Iterator[None]:
    """Processes started inside (a launcher's, Ray's) read ``GLIBC_TUNABLES`` with ``tunable`` set; this process's
    environment as it was afterwards. A process forked from one started so keeps the setting."""
    before = os.environ.get("GLIBC_TUNABLES")
    os.environ["GLIBC_TUNABLES"] = with_tunable(before, tunable)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("GLIBC_TUNABLES", None)
        else:
            os.environ["GLIBC_TUNABLES"] = before


def children_start_steady() -> contextlib.AbstractContextManager[None]:
    """:func:`children_start_with` glibc's thread cache off (:data:`NO_TCACHE`)."""
    return children_start_with(NO_TCACHE)


def steady_runtime_env() -> dict[str, Any]:
    """A Ray actor's ``runtime_env`` whose process starts with glibc's thread cache off (Ray merges it with the
    job's)."""
    return {"env_vars": {"GLIBC_TUNABLES": with_tunable(os.environ.get("GLIBC_TUNABLES"), NO_TCACHE)}}


def start_again_with_thread_cache_off(argv: Sequence[str]) -> None:
    """Replace this process by ``argv`` (an interpreter and its arguments) started with glibc's thread cache off
    (:data:`NO_TCACHE`; the rest of the environment as it is), when the cache is on here. Returns, and replaces
    nothing, when the cache is off already, elsewhere than glibc, or when this process was started with the setting
    and glibc did not take it (one try, never a loop). What this process printed is flushed first."""
    if _glibc() is None or thread_cache_off() or NO_TCACHE in os.environ.get("GLIBC_TUNABLES", "").split(":"):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], list(argv), {**os.environ, **steady_runtime_env()["env_vars"]})  # as the measured actors start


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (``malloc.h``)."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
    ]


def heap_bytes() -> int:
    """The bytes of this process's main heap (``mallinfo2().arena``: what it took from the kernel with ``sbrk``,
    in use or free); 0 elsewhere than glibc 2.33 or newer."""
    libc = _glibc()
    return int(libc.mallinfo2().arena) if libc is not None and hasattr(libc, "mallinfo2") else 0


@functools.cache
def thread_cache_off() -> bool:
    """Whether glibc's thread cache is off in this process, as glibc itself shows it. A small block freed into that
    cache gets the cache's key in its second word (glibc >= 2.29, its check of double frees); one freed into a
    fast bin (the cache off, or full) only its first word. A block taken and given back at once finds room in the
    cache whenever it came from there, so the cache is on if any of three such blocks got the key (one taken from
    a bin may first have filled the cache from it). Other threads do not sway the probe: the cache is this
    thread's. Probed once per process (glibc reads the setting only as a process starts, and a forked one keeps
    it). False elsewhere than glibc; on a glibc older than 2.29, True either way."""
    libc = _glibc()
    if libc is None:
        return False
    for _ in range(3):
        block = libc.malloc(40)
        second_word = ctypes.c_uint64.from_address(block + 8)
        second_word.value = 0
        libc.free(block)
        if second_word.value != 0:
            return False
    return True


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
    libc.malloc.argtypes, libc.malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
    libc.free.argtypes, libc.free.restype = [ctypes.c_void_p], None
    if hasattr(libc, "mallinfo2"):  # glibc >= 2.33
        libc.mallinfo2.argtypes, libc.mallinfo2.restype = [], _MallInfo2
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


__all__ = [
    "NO_TCACHE",
    "STEADY_MALLOC",
    "STEADY_MALLOC_ENV",
    "UNBOUNDED",
    "as_size",
    "children_start_steady",
    "children_start_with",
    "heap_bytes",
    "start_again_with_thread_cache_off",
    "steady_malloc",
    "steady_runtime_env",
    "thread_cache_off",
    "trim_malloc",
    "with_tunable",
]

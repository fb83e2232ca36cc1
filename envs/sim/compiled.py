"""What the compiled simulator kernels share: numba's ``njit`` (a plain-Python stand-in without numba) and a heap.

The heap is a 4-ary min-heap of ``(key, id)`` stored interleaved in one float64
array ``h`` (``h[2j]`` the key, ``h[2j+1]`` the id; ids below ``2**53`` are exact),
so a sift touches one cache line per level and has half the levels of a binary
heap. Ties on the key go to the lower id.
"""

from __future__ import annotations

import hashlib
import os

#: The files whose functions numba compiles (``njit`` here, in the kernels, and ``cost.update_time_s``).
KERNEL_SOURCES = ("compiled.py", "cost.py")
HERE = os.path.dirname(os.path.abspath(__file__))


def sources_digest(directory: str = HERE) -> str:
    """A digest of the compiled sources in ``directory`` (``kernel*.py`` and :data:`KERNEL_SOURCES`)."""
    digest = hashlib.sha256()
    for name in sorted(os.listdir(directory)):
        if name.endswith(".py") and (name.startswith("kernel") or name in KERNEL_SOURCES):
            with open(os.path.join(directory, name), "rb") as f:
                digest.update(name.encode() + b"\0" + f.read() + b"\0")
    return digest.hexdigest()[:16]


def cache_dir() -> str:
    """Where numba caches the kernels: a directory of their sources' digest, under ``NUMBA_CACHE_DIR`` when set,
    else this package's ``__pycache__`` (``~/.cache/placer`` where that cannot be written).

    numba keys a cached function by its own file's time stamp only, so a kernel that calls one from another file
    would load the callee's old code once that file changed (seen: a change to ``kernel_autograd.py`` did not
    reach ``kernel_eager.py``'s cached schedule). A directory per digest of every compiled source makes any change
    compile them all afresh.
    """
    base = os.environ.get("NUMBA_CACHE_DIR", "")
    if not base:
        base = os.path.join(HERE, "__pycache__")
        writable = os.access(base, os.W_OK) if os.path.isdir(base) else os.access(HERE, os.W_OK)
        if not writable:
            base = os.path.join(os.path.expanduser("~"), ".cache", "placer")
    return os.path.join(base, f"numba-{sources_digest()}")


try:
    from numba import config as _numba_config
    from numba import njit as _numba_njit

    HAVE_NUMBA = True
    CACHE_DIR = cache_dir()

    def njit(*args, **kwargs):
        """numba's ``njit``, caching (``cache=True``) under :func:`cache_dir` rather than beside the source."""
        if args and callable(args[0]):
            return njit(**kwargs)(args[0])

        def decorate(fn):
            saved = _numba_config.CACHE_DIR
            _numba_config.CACHE_DIR = CACHE_DIR  # read once, when the decorated function's cache is made
            try:
                return _numba_njit(*args, **kwargs)(fn)
            finally:
                _numba_config.CACHE_DIR = saved

        return decorate

except ImportError:  # pragma: no cover - exercised only without numba
    HAVE_NUMBA = False
    CACHE_DIR = ""

    def njit(*args, **kwargs):
        if args and callable(args[0]):
            return args[0]
        return lambda fn: fn


@njit(cache=True)
def heap_push(h, size, key, tid):
    j = size
    fid = float(tid)
    while j > 0:
        parent = (j - 1) >> 2
        pk = h[2 * parent]
        pi = h[2 * parent + 1]
        if key < pk or (key == pk and fid < pi):
            h[2 * j] = pk
            h[2 * j + 1] = pi
            j = parent
        else:
            break
    h[2 * j] = key
    h[2 * j + 1] = fid
    return size + 1


@njit(cache=True)
def heap_pop(h, size):
    """Remove the root; returns the new size (read the root ``h[0], h[1]`` before)."""
    size -= 1
    key = h[2 * size]
    fid = h[2 * size + 1]
    j = 0
    while True:
        c = 4 * j + 1
        if c >= size:
            break
        best = c
        bk = h[2 * c]
        bi = h[2 * c + 1]
        last = c + 4 if c + 4 <= size else size
        for child in range(c + 1, last):
            xk = h[2 * child]
            if xk < bk or (xk == bk and h[2 * child + 1] < bi):
                best = child
                bk = xk
                bi = h[2 * child + 1]
        if bk < key or (bk == key and bi < fid):
            h[2 * j] = bk
            h[2 * j + 1] = bi
            j = best
        else:
            break
    if size > 0:
        h[2 * j] = key
        h[2 * j + 1] = fid
    return size


@njit(cache=True)
def heap_offer(h, size, ck, ct, key, tid):
    """Make task ``tid`` ready: it becomes the held candidate if it beats the current one.

    The candidate ``(ck, ct)`` (``ct < 0``: none) is kept outside the heap, so a
    task that is also the next one to run skips a push and a pop (chains).
    """
    if ct < 0:
        return size, key, tid
    if key < ck or (key == ck and tid < ct):
        return heap_push(h, size, ck, ct), key, tid
    return heap_push(h, size, key, tid), ck, ct

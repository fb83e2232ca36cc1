"""What the compiled simulator kernels share: numba's ``njit`` (a plain-Python stand-in without numba) and a heap.

The heap is a 4-ary min-heap of ``(key, id)`` stored interleaved in one float64
array ``h`` (``h[2j]`` the key, ``h[2j+1]`` the id; ids below ``2**53`` are exact),
so a sift touches one cache line per level and has half the levels of a binary
heap. Ties on the key go to the lower id.
"""

from __future__ import annotations

try:
    from numba import njit

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only without numba
    HAVE_NUMBA = False

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

"""Short scheduler slices for a process's helper threads, so a woken communication thread need not wait for the tick.

A rank of a job across processes computes on one thread while gloo's threads move its messages. Where the rank
shares its core (one core a rank, as on CPU ranks), a message's hand-off needs a helper thread to run *now*: a
receive posted after its send wakes the sender's gloo thread, which must write the data while the sender computes.
Linux's scheduler (EEVDF, 6.6 on) lets the running thread finish its slice first (1.4 ms on this 2-core machine)
and notices the slice's end only at the next tick (4 ms at 250 Hz), so the woken thread waits up to a tick. On this
machine's two pinned gloo ranks, 15-20 % of late hand-offs waited over 2 ms (3-4 ms each: a tick), the mean wait
0.7-1.2 ms; with the helpers' slices at 100 us, 2.5 % did and the mean was 0.2-0.5 ms
(``docs/ranks/cpu2/looped/late_probe.py`` pinned; BENCHMARKS.md, "A woken thread waits for the tick").

Since Linux 6.12 a thread may ask for a shorter slice (``sched_setattr``'s ``sched_runtime`` under SCHED_OTHER),
and a woken thread whose slice is shorter than the running one's preempts it at once. :func:`shorten_helper_slices`
asks that for every thread of this process but the caller (the one that computes); it changes nothing else (the
policy and niceness are kept) and reads the slice back to report which threads have it: none on older kernels,
other platforms, or where the call is refused.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import struct
import sys
import threading

#: The system call numbers of ``sched_setattr`` and ``sched_getattr`` by machine (Linux).
SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}
#: ``SCHED_FLAG_KEEP_POLICY``: keep the thread's policy; its niceness is passed as read.
KEEP_POLICY = 0x08
#: ``struct sched_attr`` as the kernel first defined it (48 bytes): size, policy, flags, nice, priority, runtime,
#: deadline, period.
ATTR = struct.Struct("IIQiIQQQ")
#: The slice :func:`shorten_helper_slices` gives by default, in microseconds (the kernel's least is 100).
HELPER_SLICE_US = 100


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library of this process, with ``errno`` kept."""
    return ctypes.CDLL(None, use_errno=True)


def _syscalls() -> tuple[int, int] | None:
    return SYSCALLS.get(platform.machine()) if sys.platform.startswith("linux") else None


def supported() -> bool:
    """This system lets a thread ask for its own slice: Linux 6.12 or later, on a machine of :data:`SYSCALLS`.

    >>> isinstance(supported(), bool)
    True
    """
    if _syscalls() is None:
        return False
    release = platform.release().split(".")[:2]
    try:
        major, minor = (int("".join(c for c in part if c.isdigit())) for part in release)
    except ValueError:
        return False
    return (major, minor) >= (6, 12)


def thread_slice_ns(tid: int) -> int | None:
    """The slice thread ``tid`` of this process asked for (``sched_getattr``'s ``sched_runtime``; 0: the kernel's
    default), or None where it cannot be read."""
    calls = _syscalls()
    if calls is None:
        return None
    libc = _libc()
    buf = ctypes.create_string_buffer(ATTR.size)
    if libc.syscall(calls[1], tid, buf, ATTR.size, 0) != 0:
        return None
    return int(ATTR.unpack(buf.raw)[5])


def shorten_helper_slices(slice_us: int = HELPER_SLICE_US) -> list[int]:
    """Ask a slice of ``slice_us`` microseconds for every thread of this process but the calling one; the ids of
    the threads that have it now (read back), in the order ``/proc/self/task`` lists them ([] where nothing could
    be set)."""
    calls = _syscalls()
    if calls is None or not os.path.isdir("/proc/self/task"):
        return []
    libc = _libc()
    me = threading.get_native_id()
    done = []
    for name in os.listdir("/proc/self/task"):
        tid = int(name)
        if tid == me:
            continue
        try:
            nice = os.getpriority(os.PRIO_PROCESS, tid)
        except OSError:  # the thread has ended
            continue
        attr = ctypes.create_string_buffer(ATTR.pack(ATTR.size, 0, KEEP_POLICY, nice, 0, slice_us * 1000, 0, 0))
        if libc.syscall(calls[0], tid, attr, 0) == 0 and thread_slice_ns(tid) == slice_us * 1000:
            done.append(tid)
    return done

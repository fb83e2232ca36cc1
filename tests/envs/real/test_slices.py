"""envs.real.slices: a short scheduler slice for every thread but the caller's, read back; nothing else changed."""

from __future__ import annotations

import os
import threading

import pytest

from envs.real import slices


@pytest.fixture
def helper():
    """A thread of this process that waits (its native id), ended after the test."""
    done, started = threading.Event(), threading.Event()
    box = {}

    def run():
        box["tid"] = threading.get_native_id()
        started.set()
        done.wait(30)

    t = threading.Thread(target=run)
    t.start()
    started.wait(10)
    yield box["tid"]
    done.set()
    t.join()


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="needs Linux")
def test_every_thread_but_the_caller_gets_the_short_slice_and_keeps_its_niceness(helper):
    me = threading.get_native_id()
    os.setpriority(os.PRIO_PROCESS, helper, 5)  # a niceness of its own, which the call must not reset
    before = slices.thread_slice_ns(me)
    if not slices.supported():
        pytest.skip("this kernel has no custom slices (Linux 6.12 on)")
    done = slices.shorten_helper_slices(150)
    assert helper in done and me not in done
    assert slices.thread_slice_ns(helper) == 150_000 and slices.thread_slice_ns(me) == before
    assert os.getpriority(os.PRIO_PROCESS, helper) == 5


def test_elsewhere_nothing_is_set(helper, monkeypatch):
    monkeypatch.setattr(slices.platform, "machine", lambda: "riscv64")
    assert not slices.supported()
    assert slices.shorten_helper_slices() == [] and slices.thread_slice_ns(helper) is None

"""Fixtures shared by every test package."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def zoo_cache(tmp_path_factory):
    """One capture per zoo model per test session, shared by every test file.

    Points ``PLACER_CACHE_DIR`` at a session directory, so tests never read a
    developer's ``~/.cache/placer`` and the real zoo is captured once per run.
    """
    path = tmp_path_factory.getbasetemp() / "placer-cache"
    path.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PLACER_CACHE_DIR", str(path))
        yield path

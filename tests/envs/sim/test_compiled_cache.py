"""numba's cache of the kernels: one directory per digest of every compiled source, so no stale callee is loaded."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from envs.sim import compiled


def test_the_digest_changes_with_any_compiled_source_and_no_other(tmp_path):
    for f in ("kernel_eager.py", "kernel_autograd.py", "cost.py", "simulator.py"):
        shutil.copy(f"{compiled.HERE}/{f}", tmp_path / f)
    before = compiled.sources_digest(str(tmp_path))
    (tmp_path / "simulator.py").write_text("# not compiled\n")
    assert compiled.sources_digest(str(tmp_path)) == before
    (tmp_path / "kernel_autograd.py").write_text((tmp_path / "kernel_autograd.py").read_text() + "\n# changed\n")
    assert compiled.sources_digest(str(tmp_path)) != before


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
@pytest.mark.skipif(not compiled.HAVE_NUMBA, reason="needs numba")
def test_kernels_cache_under_the_digest_s_directory_and_numba_s_setting_is_left_alone(tmp_path):
    from numba import config

    from envs.sim import kernel_autograd

    assert compiled.CACHE_DIR.endswith(f"numba-{compiled.sources_digest()}")
    assert kernel_autograd.eager_backward._cache._cache_path.startswith(compiled.CACHE_DIR)
    assert config.CACHE_DIR != compiled.CACHE_DIR  # set only while a kernel is decorated
    code = "from envs.sim import compiled; print(compiled.CACHE_DIR)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)},
        check=True,
    ).stdout.strip()
    assert out == f"{tmp_path}/numba-{compiled.sources_digest()}"

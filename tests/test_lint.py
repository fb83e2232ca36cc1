"""The tree passes the linter and the formatter (ruff, configured in pyproject.toml), as .ci/run checks."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None, reason="ruff is not installed (pip install -e '.[test]')"
)


def ruff(*args: str) -> subprocess.CompletedProcess:
    # --no-cache: the test writes nothing into the checkout
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("args", [("check",), ("format", "--check")], ids=["check", "format"])
def test_ruff_passes(args):
    proc = ruff(*args)
    version = subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True, text=True).stdout
    assert proc.returncode == 0, f"ruff {' '.join(args)} . ({version.strip()}):\n{proc.stdout}{proc.stderr}"

"""CI refuses to run with a test extra missing, instead of skipping the tests that need it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TEST_EXTRAS, missing_test_extras

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # (the first import of each extra: seconds)
def test_every_test_extra_imports_here():
    assert missing_test_extras() == []


def test_a_missing_extra_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import now raises ImportError
    missing = missing_test_extras(("transformers", "numpy"))
    assert len(missing) == 1 and missing[0].startswith("transformers (ModuleNotFoundError")


@pytest.mark.slow
def test_ci_run_stops_when_an_extra_is_missing(tmp_path):
    (tmp_path / "transformers.py").write_text("raise ImportError('broken on purpose')\n")
    for name in set(TEST_EXTRAS) - {"transformers", "hypothesis"}:  # (hypothesis is a pytest plugin: the real one)
        (tmp_path / f"{name}.py").write_text("")  # an empty stand-in: the run is not worth the extra's import time
    env = {"CI": "true", "PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "tests/test_wheel.py", "--co"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "transformers (ImportError: broken on purpose)" in proc.stdout + proc.stderr

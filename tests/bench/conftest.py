"""Shared by the tests of the scripts under scripts/: a script loaded as a module, to call its main() in-process."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as a fresh module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def script_module():
    """:func:`load_script`, for tests that run a script's ``main`` with arguments."""
    return load_script

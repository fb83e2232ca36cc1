"""A folder named ``placer`` beside the user's script or model shadows an editable install: one line says so.

An editable install (``pip install -e .``) is found by a finder after the path entries, so a bare folder
``placer/`` (no ``__init__.py``) first on ``sys.path`` is imported as a namespace package instead, and
``from placer import Placement`` fails with "cannot import name 'Placement' from 'placer' (unknown location)".
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from graphs import PlacerError
from graphs.sources import load_callable
from placer.cli import main

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def shadowed(tmp_path, monkeypatch):
    """``placer`` imported as the bare folder tmp_path/placer, as Python does when that folder shadows it."""
    folder = tmp_path / "placer"
    folder.mkdir()
    namespace = types.ModuleType("placer")
    namespace.__path__ = [str(folder)]  # a namespace package: no __file__
    monkeypatch.setitem(sys.modules, "placer", namespace)
    return folder


def test_the_cli_names_the_folder_that_shadows_placer(shadowed, capsys):
    assert main(["graphs"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"the folder {shadowed} " in err and "shadows" in err, err


def test_a_model_module_that_imports_a_shadowed_placer_gets_one_line_naming_the_folder(shadowed, monkeypatch):
    name = f"uses_placer_{shadowed.parent.name}".replace("-", "_")
    (shadowed.parent / f"{name}.py").write_text("from placer import Placement\n\ndef build():\n    pass\n")
    monkeypatch.chdir(shadowed.parent)
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(PlacerError, match=f"the folder {shadowed} \\(no __init__.py\\) shadows the installed placer"):
        load_callable(f"{name}:build")
    sys.modules.pop(name, None)


# What setuptools' editable install adds to sys.meta_path (after the path finder), here for this checkout.
EDITABLE = textwrap.dedent(
    """
    import importlib.machinery, runpy, sys
    REPO, TOPS = sys.argv.pop(1), ("placer", "graphs", "envs", "policies")

    class Editable:
        @staticmethod
        def find_spec(name, path=None, target=None):
            top, _, rest = name.partition(".")
            if top in TOPS:
                where = [REPO] if not rest else [REPO + "/" + name.rpartition(".")[0].replace(".", "/")]
                return importlib.machinery.PathFinder.find_spec(name, where)

    sys.meta_path.insert(sys.meta_path.index(importlib.machinery.PathFinder) + 1, Editable)
    runpy.run_module("placer", run_name="__main__", alter_sys=True)
    """
)


@pytest.mark.slow
def test_python_m_placer_beside_a_placer_folder_says_so_in_one_line(tmp_path):
    (tmp_path / "placer").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the checkout comes from the finder only
    argv = [sys.executable, "-c", EDITABLE, str(REPO), "graphs"]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip() == (
        f"placer: error: the folder {tmp_path / 'placer'} (no __init__.py) shadows the installed placer package: "
        "rename or move it, or run from another directory"
    )


def test_a_namespace_package_that_is_not_installed_shadows_nothing(tmp_path, monkeypatch):
    from graphs.sources import shadowing_folders, shadowing_message

    namespace = types.ModuleType("users_own_namespace")
    namespace.__path__ = [str(tmp_path)]
    monkeypatch.setitem(sys.modules, "users_own_namespace", namespace)
    assert shadowing_folders("users_own_namespace") == [str(tmp_path)]
    assert shadowing_message("users_own_namespace") is None  # only an installed package can be shadowed
    assert shadowing_message("graphs") is None  # the real one, imported from its files

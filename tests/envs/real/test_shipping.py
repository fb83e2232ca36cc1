"""What the measured env ships to its Ray workers for a ``module:callable`` SOURCE (no Ray needed)."""

from __future__ import annotations

import os
import sys
import uuid

import pytest

import envs
from envs.real.shipping import EXCLUDES, SHIP_LIMIT_BYTES, ship_plan, shipped_root
from graphs import PlacerError


@pytest.fixture
def name():
    return f"placer_ship_{uuid.uuid4().hex[:8]}"  # a name no other test imports


def test_a_single_file_module_is_shipped_from_the_working_directory(tmp_path, name):
    (tmp_path / f"{name}.py").write_text("def build(): pass\n")
    plan = ship_plan(f"{name}:build", search_dir=str(tmp_path))
    assert plan.module == name and plan.path == str(tmp_path / f"{name}.py")
    assert plan.size_bytes == len("def build(): pass\n")
    assert plan.runtime_env() == {"py_modules": [plan.path], "excludes": list(EXCLUDES)}


def test_a_dotted_source_ships_its_whole_top_level_package(tmp_path, name, monkeypatch):
    pkg = tmp_path / "elsewhere" / name
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "__init__.py").write_text("def build(): pass\n")
    (pkg / "layers.py").write_text("X = 1\n")
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "big.pyc").write_bytes(b"0" * 10_000)  # left out, and not counted
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))  # found on the driver's PYTHONPATH, not in its cwd
    plan = ship_plan(f"{name}.models:build", search_dir=str(tmp_path))
    assert plan.module == name and plan.path == str(pkg)
    assert plan.size_bytes == len("def build(): pass\n") + len("X = 1\n")
    assert "package" in plan.describe() and name in plan.describe()


def test_zoo_names_callables_and_installed_modules_are_not_shipped(tmp_path):
    assert ship_plan("nmt-2") is None
    assert ship_plan(lambda: None) is None
    assert ship_plan("json:loads", search_dir=str(tmp_path)) is None  # the standard library
    assert ship_plan("numpy.random:rand", search_dir=str(tmp_path)) is None  # site-packages
    assert ship_plan("graphs.zoo:build", search_dir=str(tmp_path)) is None  # placer's own: installed with it


def test_a_module_over_the_limit_is_one_line_naming_source(tmp_path, name):
    (tmp_path / f"{name}.py").write_text("W = '" + "x" * 2000 + "'\n")
    with pytest.raises(PlacerError) as e:
        ship_plan(f"{name}:build", search_dir=str(tmp_path), limit_bytes=1000)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{name}:build: ") and "more than 0.0 MiB" in msg
    assert SHIP_LIMIT_BYTES == 100 * 2**20


def test_a_missing_module_is_one_line(tmp_path, name):
    with pytest.raises(PlacerError, match=f"cannot find module '{name}'"):
        ship_plan(f"{name}:build", search_dir=str(tmp_path))


def test_a_worker_finds_the_shipped_copy_first_on_pythonpath(tmp_path, name, monkeypatch):
    shipped, stale = tmp_path / "_ray_pkg_1", tmp_path / "stale"
    for d in (shipped, stale):
        d.mkdir()
        (d / f"{name}.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "empty"), str(shipped), str(stale)]))
    assert shipped_root(name) == str(shipped)
    assert shipped_root("not_" + name) is None


def test_loading_from_a_directory_puts_it_before_one_already_on_sys_path(tmp_path, name, monkeypatch):
    """A worker's sys.path starts with the driver's directories (Ray adds them); the shipped copy must win."""
    from graphs.sources import load_callable

    shipped, stale = tmp_path / "shipped", tmp_path / "stale"
    for d, value in ((shipped, "shipped"), (stale, "stale")):
        d.mkdir()
        (d / f"{name}.py").write_text(f"def build():\n    return '{value}', ()\n")
    monkeypatch.setattr(sys, "path", [str(stale), *sys.path, str(shipped)])
    try:
        assert load_callable(f"{name}:build", search_dir=str(shipped))[0] == "shipped"
    finally:
        sys.modules.pop(name, None)


def test_a_build_failing_in_a_worker_names_what_was_shipped(tmp_path):
    from envs.real.measured import MeasuredEnv
    from envs.real.shipping import Shipment
    from graphs import OpGraph

    g = OpGraph.from_edges(["a", "b"], [("a", "b", 8)], name="ab")
    env = MeasuredEnv("mymodels:build", envs.resolve_cluster("k80x2"), graph=g, device_map="*=cpu")
    assert env._ship_hint() == ""  # nothing shipped: nothing to say
    env.shipment = Shipment("mymodels", str(tmp_path / "mymodels.py"), 2048)
    hint = env._ship_hint()
    assert f"module mymodels ({tmp_path / 'mymodels.py'}, 0.0 MiB)" in hint and "installed on every node" in hint

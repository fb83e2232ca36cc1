"""The wheel holds the product only: graphs, envs, policies, placer — no benchmark, script or test."""

from __future__ import annotations

import ast
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.test_layering import absolute_imports

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = {"graphs", "envs", "policies", "placer"}
#: benchmark and report harnesses that once shipped inside the product packages (now bench/)
MOVED_OUT = {"placer/report.py", "placer/scale.py", "placer/search.py", "placer/plots.py", "graphs/bench.py"}


def _tracked_tree(dest: Path) -> Path:
    """The checkout's files (tracked, or new and not ignored), copied to ``dest`` (so the build leaves the checkout
    untouched)."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    names = [n for n in files.decode().split("\0") if n and (ROOT / n).is_file()]
    archive = dest / "src.tar"
    with tarfile.open(archive, "w") as tar:
        for name in names:
            tar.add(ROOT / name, arcname=name)
    src = dest / "src"
    with tarfile.open(archive) as tar:
        tar.extractall(src, filter="data")
    return src


@pytest.mark.slow
def test_wheel_contains_the_product_only(tmp_path):
    pytest.importorskip("setuptools")
    if subprocess.run(["git", "rev-parse"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    src = _tracked_tree(tmp_path)
    assert (src / "bench").is_dir() and (src / "scripts").is_dir() and (src / "tests").is_dir()
    out = tmp_path / "wheels"
    # no build isolation: the build backend (setuptools) comes from this environment, not the network
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (wheel,) = out.glob("placer-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == PRODUCT, tops
    assert "placer/cli/__init__.py" in names and "envs/sim/simulator.py" in names and "graphs/ir.py" in names
    assert not MOVED_OUT & set(names)
    assert not [n for n in names if "/tests/" in n or n.startswith(("bench/", "scripts/", "tests/"))]


def test_the_product_never_imports_bench_or_scripts():
    # what the wheel leaves out must not be needed by what it ships
    bad = []
    for package in sorted(PRODUCT):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = absolute_imports(node)
                bad += [
                    f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in ("bench", "scripts", "tests")
                ]
    assert not bad, bad

"""envs has no import loop: its modules' imports of each other (lazy ones too) form a DAG."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ENVS = Path(__file__).resolve().parents[2] / "envs"
#: Every module of envs by its name under envs (``cluster``, ``sim.kernel``, ``real.profiler.fit``...).
MODULES = sorted(
    ".".join(p.relative_to(ENVS).with_suffix("").parts) for p in ENVS.rglob("*.py") if p.stem != "__init__"
)
PACKAGES = sorted(".".join(p.parent.relative_to(ENVS).parts) for p in ENVS.rglob("__init__.py") if p.parent != ENVS)


def _path(module: str) -> Path:
    return ENVS.joinpath(*module.split(".")).with_suffix(".py")


def _envs_imports(path: Path) -> set[str]:
    """envs modules ``path`` imports anywhere (functions included), except under ``if TYPE_CHECKING``.

    A package (``envs.sim``) stands for its ``__init__``'s imports; ``from envs.sim import simulator`` is the module.
    """
    found: set[str] = set()

    def add(name: str) -> None:
        if name in MODULES:
            found.add(name)
        elif name in PACKAGES:
            found.update(_envs_imports(ENVS.joinpath(*name.split(".")) / "__init__.py"))

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("envs."):
                    add(a.name.removeprefix("envs."))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "envs" or node.module.startswith("envs."):
                base = node.module.removeprefix("envs").removeprefix(".")
                for a in node.names:
                    sub = f"{base}.{a.name}" if base else a.name
                    if sub in MODULES or sub in PACKAGES:
                        add(sub)
                    elif base:
                        add(base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    found.discard(".".join(path.relative_to(ENVS).with_suffix("").parts))
    return found


def test_envs_modules_import_each_other_without_a_cycle():
    graph = {m: _envs_imports(_path(m)) for m in MODULES}
    done: set[str] = set()

    def walk(m: str, stack: list[str]) -> None:
        if m in stack:
            pytest.fail("import loop: " + " -> ".join(stack[stack.index(m) :] + [m]))
        if m in done:
            return
        for dep in sorted(graph[m]):
            walk(dep, stack + [m])
        done.add(m)

    for m in MODULES:
        walk(m, [])


def test_cluster_is_at_the_bottom_and_the_kernel_does_not_know_the_simulator():
    # the cluster imports only its parts and the preset table, which import nothing else of envs but the parts
    assert _envs_imports(ENVS / "cluster.py") == {"devices", "machines"}
    assert _envs_imports(ENVS / "machines.py") == {"devices"}
    assert _envs_imports(ENVS / "devices.py") == set()
    for kernel in (ENVS / "sim").glob("kernel*.py"):
        assert not {"sim.simulator", "sim.schedule"} & _envs_imports(kernel), kernel.name


def test_the_api_kept_on_cluster_is_there():
    import envs
    from envs.real.profiler import cluster_with_profile

    c = envs.Cluster.preset("k80x2")
    # a profile calibrates a copy through the profiler's function (Cluster.with_profile, once patched onto the
    # class by the profiler, is gone: the cluster module stays a leaf)
    assert "k80x2" in envs.Cluster.presets() and callable(cluster_with_profile)
    assert envs.resolve_cluster("k80x2").to_dict() == c.to_dict()


#: Run in one fresh interpreter: the third-party libraries envs uses are loaded once, then each envs module is
#: imported in a forked child that has imported nothing of placer's, so a module that only imports after another
#: of ours (an import-order dependency, a cycle entered from its side) fails there; its traceback is printed.
ISOLATED_IMPORTS = """
import importlib, json, os, sys, traceback
for lib in ("numpy", "scipy.optimize", "numba", "torch", "torch.export", "sympy", "networkx", "ray"):
    try:
        importlib.import_module(lib)
    except ImportError:
        pass
assert not [m for m in sys.modules if m.split(".")[0] in ("graphs", "envs", "policies", "placer")]
failed = []
for module in json.loads(sys.argv[1]):
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(module)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1]:
        failed.append(module)
print(json.dumps(failed))
"""


def imports_alone(modules: list[str], path: str = "") -> list[str]:
    """The modules of ``modules`` that fail to import as the first of placer's in a fresh interpreter (``path``: a
    directory put first on its ``PYTHONPATH``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (path, os.environ.get("PYTHONPATH", "")) if p)}
    out = subprocess.run(
        [sys.executable, "-c", ISOLATED_IMPORTS, json.dumps(modules)],
        capture_output=True,
        text=True,
        cwd=ENVS.parent,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    failed = json.loads(out.stdout.strip().splitlines()[-1])
    assert not failed or out.stderr  # each failure printed its traceback
    return failed


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_each_envs_module_imports_alone_in_a_fresh_interpreter(tmp_path):
    # two modules that import each other at the top: each fails as the first imported, so the check can fail
    pkg = tmp_path / "cyclic_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclic_pkg.b import B\nA = 1\n")
    (pkg / "b.py").write_text("from cyclic_pkg.a import A\nB = 2\n")
    cyclic = ["cyclic_pkg.a", "cyclic_pkg.b"]
    assert imports_alone([f"envs.{m}" for m in MODULES] + cyclic, path=str(tmp_path)) == cyclic

"""envs has no import loop: its modules' imports of each other (lazy ones too) form a DAG."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ENVS = Path(__file__).resolve().parents[2] / "envs"
MODULES = sorted(p.stem for p in ENVS.glob("*.py") if p.stem != "__init__")


def _envs_imports(path: Path) -> set[str]:
    """envs submodules ``path`` imports anywhere (functions included), except under ``if TYPE_CHECKING``."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("envs."))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "envs":
                found.update(a.name for a in node.names if a.name in MODULES)
            elif node.module.startswith("envs."):
                found.add(node.module.split(".")[1])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    found.discard(path.stem)
    return found


def test_envs_modules_import_each_other_without_a_cycle():
    graph = {m: _envs_imports(ENVS / f"{m}.py") for m in MODULES}
    done: set[str] = set()

    def walk(m: str, stack: list[str]) -> None:
        if m in stack:
            pytest.fail("import loop: " + " -> ".join(stack[stack.index(m):] + [m]))
        if m in done:
            return
        for dep in sorted(graph[m]):
            walk(dep, stack + [m])
        done.add(m)

    for m in MODULES:
        walk(m, [])


def test_cluster_is_a_leaf_and_the_kernel_does_not_know_the_simulator():
    assert _envs_imports(ENVS / "cluster.py") == set()
    assert "simulator" not in _envs_imports(ENVS / "kernel.py")


def test_the_api_kept_on_cluster_is_there():
    import envs

    c = envs.Cluster.preset("k80x2")
    assert "k80x2" in envs.Cluster.presets() and callable(c.with_profile)
    assert envs.resolve_cluster("k80x2").to_dict() == c.to_dict()


@pytest.mark.slow
@pytest.mark.parametrize("module", MODULES)
def test_each_envs_module_imports_alone_in_a_fresh_interpreter(module):
    out = subprocess.run([sys.executable, "-c", f"import envs.{module}"], capture_output=True, text=True,
                         cwd=ENVS.parent, timeout=300)
    assert out.returncode == 0, out.stderr

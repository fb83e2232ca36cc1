"""The packages depend on each other in one direction, and no modules import each other in a loop.

* Direction: ``graphs`` <- ``envs`` <- ``policies`` <- ``placer``. ``graphs`` imports
  none of the others, ``envs`` only ``graphs``, ``policies`` only ``graphs`` and
  ``envs``; every import counts, function-level and type-checking ones included.
* Cycles: the modules' top-level imports (those that run when a module is
  imported) form a DAG. ``from pkg import name`` is an edge to the module
  ``pkg.name`` when there is one, else to ``pkg`` (its ``__init__``).
* ``ray`` is imported by the measured env (``envs.real.measured``) and the modules of
  one Ray package (``envs.real.ray``), nowhere else.

Each check reads the source (the AST), so it costs no imports; the checks are
run on a tree with one violation each planted too, to show that they can fail.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Each package, and the packages it may import (itself included).
ALLOWED = {
    "graphs": {"graphs"},
    "envs": {"graphs", "envs"},
    "policies": {"graphs", "envs", "policies"},
    "placer": {"graphs", "envs", "policies", "placer"},
}
PRODUCT = tuple(ALLOWED)


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources(root: Path = ROOT) -> dict[str, str]:
    """Module name -> its source, for every module of the product packages under ``root``."""
    return {module_name(root, p): p.read_text() for package in PRODUCT for p in sorted((root / package).rglob("*.py"))}


@functools.lru_cache(maxsize=None)
def parsed(source: str) -> ast.Module:
    """``ast.parse(source)``, once per source text: every test here walks the same tree's modules (the walks only
    read the trees)."""
    return ast.parse(source)


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _targets(node: ast.Import | ast.ImportFrom, modules: set[str], here: str) -> list[str]:
    """The product modules an import statement names (``from pkg import mod`` names ``pkg.mod``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:  # relative: resolve against this module's package
        base = here.rsplit(".", node.level)[0] if here.count(".") >= node.level else ""
        module = f"{base}.{node.module}" if node.module else base
    else:
        module = node.module or ""
    subs = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in modules]
    return subs if len(subs) == len(node.names) else [*subs, module]


@functools.lru_cache(maxsize=None)
def import_nodes(source: str, top_level_only: bool) -> tuple[ast.Import | ast.ImportFrom, ...]:
    """The import statements of one module's source: all of them, or only those that run at its import (once per
    source text, as :func:`parsed`)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if top_level_only and (in_function or _is_type_checking(node)):
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(parsed(source), False)
    return tuple(found)


def imports(source: str, name: str, modules: set[str], *, top_level_only: bool) -> set[str]:
    """Product modules imported by one module: everywhere, or only by what runs at its import."""
    found = {
        t
        for node in import_nodes(source, top_level_only)
        for t in _targets(node, modules, name)
        if t.split(".")[0] in PRODUCT
    }
    found.discard(name)
    return found


def direction_violations(srcs: dict[str, str]) -> list[str]:
    modules = set(srcs)
    bad = []
    for name, source in srcs.items():
        package = name.split(".")[0]
        for target in sorted(imports(source, name, modules, top_level_only=False)):
            if target.split(".")[0] not in ALLOWED[package]:
                bad.append(f"{name} imports {target}")
    return bad


def cycles(srcs: dict[str, str]) -> list[list[str]]:
    """Every import loop over top-level imports found by a depth-first walk (each reported once)."""
    modules = set(srcs)
    graph = {
        name: sorted(imports(source, name, modules, top_level_only=True) & modules) for name, source in srcs.items()
    }
    found, done = [], set()

    def walk(m: str, stack: list[str]) -> None:
        if m in stack:
            found.append(stack[stack.index(m) :] + [m])
            return
        if m in done:
            return
        for dep in graph[m]:
            walk(dep, stack + [m])
        done.add(m)

    for m in sorted(graph):
        walk(m, [])
    return found


def absolute_imports(node: ast.AST) -> list[str]:
    """The modules an ``import`` or absolute ``from ... import`` node names (none for any other node)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and not node.level:
        return [node.module or ""]
    return []


def ray_importers(srcs: dict[str, str]) -> list[str]:
    out = []
    for name, source in srcs.items():
        for node in import_nodes(source, False):
            names = absolute_imports(node)
            if any(n.split(".")[0] == "ray" for n in names):
                out.append(name)
                break
    return out


def private_imports(srcs: dict[str, str]) -> list[str]:
    """``module imports pkg.name`` for every private name (``_x``, not dunder) taken from another project module."""
    out = []
    project = (*PRODUCT, "bench")
    for name, source in srcs.items():
        for node in import_nodes(source, False):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            if node.module.split(".")[0] not in project or node.module == name:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    out.append(f"{name} imports {node.module}.{alias.name}")
    return out


def tree_sources(root: Path = ROOT) -> dict[str, str]:
    """:func:`sources` with ``bench``, ``scripts`` and ``tests`` too: every module of the checkout."""
    more = ("bench", "scripts", "tests")
    return {
        **sources(root),
        **{module_name(root, p): p.read_text() for f in more for p in sorted((root / f).rglob("*.py"))},
    }


# ------------------------------------------------------------------ the tree as it is
@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_packages_import_in_one_direction():
    assert direction_violations(sources()) == []


def test_no_import_cycles_between_modules():
    loops = cycles(sources())
    assert not loops, "import loops: " + "; ".join(" -> ".join(c) for c in loops)


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_no_private_name_is_imported_from_another_module():
    assert private_imports(tree_sources()) == []


#: Where ``ray`` may be imported: the measured env, and the package of Ray's side beside it.
RAY_MODULE, RAY_PACKAGE = "envs.real.measured", "envs.real.ray"


def stray_ray_importers(srcs: dict[str, str]) -> list[str]:
    return [
        m for m in ray_importers(srcs) if m != RAY_MODULE and m != RAY_PACKAGE and not m.startswith(RAY_PACKAGE + ".")
    ]


def test_ray_is_imported_by_the_measured_env_and_the_ray_package_only():
    assert RAY_MODULE in ray_importers(sources())
    assert stray_ray_importers(sources()) == []


# ------------------------------------------------------------------ the checks can fail
@pytest.mark.parametrize(
    "module, planted",
    [
        ("graphs.ir", "from envs.cluster import Cluster"),
        ("envs.sim.cost", "def f():\n    from policies import POLICIES\n"),
        ("policies.base", "from placer.methods import registry"),
        ("graphs.dag", "if True:\n    import placer\n"),
    ],
)
def test_an_upward_import_is_a_violation(module, planted):
    srcs = sources()
    srcs[module] += "\n" + planted + "\n"
    assert direction_violations(srcs), planted


def test_a_planted_cycle_is_found():
    srcs = sources()
    srcs["graphs.dag"] += "\nfrom graphs.ir import OpGraph\n"  # ir imports dag at the top: ir -> dag -> ir
    loops = cycles(srcs)
    assert any(set(c) >= {"graphs.ir", "graphs.dag"} for c in loops), loops


def test_a_planted_private_import_is_found():
    srcs = tree_sources()
    srcs["placer.device_map"] += "\nfrom placer.methods.heuristics.hf_accelerate import _lookup\n"
    assert private_imports(srcs) == ["placer.device_map imports placer.methods.heuristics.hf_accelerate._lookup"]


def test_a_ray_importer_elsewhere_is_found():
    srcs = sources()
    srcs["envs.sim.simulator"] += "\nimport ray\n"
    srcs["envs.real.rayish"] = "from ray import util\n"
    assert stray_ray_importers(srcs) == ["envs.sim.simulator", "envs.real.rayish"]

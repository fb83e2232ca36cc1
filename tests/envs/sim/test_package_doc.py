"""envs.sim's package docstring names the file and function of every simulator rule, and stays true.

It names each rule's Python reference and numba kernel as a pair (``a.py:f`` | ``kernel_a.py:g``); this test
resolves every name it gives, and fails if a module of the package goes unnamed, so the map cannot rot.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import envs.sim

ROOT = Path(__file__).resolve().parents[3]
SIM = ROOT / "envs" / "sim"
#: ``file.py`` or ``file.py:qualified.name`` in double backticks; a file with a slash is a path from the repository.
REF = r"``([\w/]+\.py)(?::([\w.]+))?``"
DOC = envs.sim.__doc__ or ""


def references(text: str) -> list[tuple[str, str | None]]:
    return [(f, name or None) for f, name in re.findall(REF, text)]


def pairs(text: str) -> list[tuple[tuple[str, str | None], tuple[str, str | None]]]:
    """Every ``reference`` | ``kernel`` pair (whitespace, line breaks included, between them)."""
    found = re.findall(REF + r"\s*\|\s*" + REF, text)
    return [((a, an or None), (b, bn or None)) for a, an, b, bn in found]


def path_of(file: str) -> Path:
    return ROOT / file if "/" in file else SIM / file


def resolve(file: str, name: str | None):
    """The module of ``file`` (a path under the repository, or a module of envs.sim), or its attribute ``name``."""
    module = importlib.import_module(".".join(path_of(file).relative_to(ROOT).with_suffix("").parts))
    obj = module
    for part in (name or "").split(".") if name else []:
        obj = getattr(obj, part)
    return obj


def check(text: str) -> list[str]:
    """What is wrong with a package docstring ``text``: files or names that do not exist, modules not named, pairs
    whose kernel is not a kernel module."""
    problems = []
    for file, name in references(text):
        if not path_of(file).is_file():
            problems.append(f"{file}: no such file")
            continue
        try:
            resolve(file, name)
        except AttributeError:
            problems.append(f"{file}:{name}: no such name")
    named = {path_of(f).resolve() for f, _ in references(text)}
    for module in sorted(SIM.glob("*.py")):
        if module.name != "__init__.py" and module.resolve() not in named:
            problems.append(f"{module.name}: a module of envs.sim the docstring does not name")
    for (ref, ref_name), (kernel, kernel_name) in pairs(text):
        if Path(ref).name.startswith("kernel") or not Path(kernel).name.startswith("kernel"):
            problems.append(f"{ref} | {kernel}: a pair is the Python reference, then the kernel")
        if ref_name is None or kernel_name is None:
            problems.append(f"{ref} | {kernel}: a pair names the function of each")
    return problems


def test_every_name_the_package_docstring_gives_exists_and_every_module_is_named():
    assert check(DOC) == []


def test_the_docstring_pairs_each_rule_of_the_kernel_with_its_reference():
    found = pairs(DOC)
    kernels = {Path(k).name for _, (k, _) in found}
    # every kernel module is some rule's kernel side, and each rule named in the task has its pair
    assert kernels == {p.name for p in SIM.glob("kernel*.py")}
    rules = {(Path(r).name, Path(k).name) for (r, _), (k, _) in found}
    for pair in [
        ("eager.py", "kernel_eager.py"),
        ("autograd.py", "kernel_autograd.py"),
        ("dataflow.py", "kernel_dataflow.py"),
        ("memory.py", "kernel_memory.py"),
        ("cost.py", "kernel.py"),
    ]:
        assert pair in rules
    # a kernel function (not a method of the kernel's data) is compiled, where numba is there
    from envs.sim.compiled import HAVE_NUMBA

    for _, (kernel, name) in found:
        if HAVE_NUMBA and "." not in name:
            assert hasattr(resolve(kernel, name), "py_func"), f"{kernel}:{name} is not a numba function"


@pytest.mark.parametrize(
    "broken, problem",
    [
        (DOC.replace("kernel_eager.py:eager_forward", "kernel_eager.py:eager_fwd"), "no such name"),
        (DOC.replace("``dataflow.py:dataflow_reference``", "``dataflow_old.py:dataflow_reference``"), "no such file"),
        (DOC.replace("``trace.py:chrome_trace``", "the trace"), "trace.py: a module of envs.sim"),
        (
            DOC.replace(
                "``memory.py:peak_bytes`` | ``kernel_memory.py:peak_live_bytes``",
                "``kernel_memory.py:peak_live_bytes`` | ``memory.py:peak_bytes``",
            ),
            "a pair is the Python reference, then the kernel",
        ),
    ],
)
def test_the_check_catches_a_docstring_that_rotted(broken, problem):
    assert broken != DOC
    assert any(problem in p for p in check(broken))

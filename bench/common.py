"""What every benchmark shares: comma-separated options, the machine line, the GPU scripts' mode defaults and a
parser whose usage errors are one line. Light on purpose (of the project, only ``graphs.PlacerError``):
:mod:`bench.sim_model_delta` imports it beside an older tree's ``envs``.

>>> parse_list("a, b", what="graphs")
['a', 'b']
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from typing import Any, Callable, Sequence

from graphs import PlacerError

Progress = Callable[[str], None]


def parse_list(arg: str, *, what: str, known: Sequence[str] | None = None) -> list[str]:
    """Split a comma-separated argument; empty items or (when ``known``) unknown names raise PlacerError."""
    items = [a.strip() for a in arg.split(",")]
    if not arg.strip() or any(not a for a in items):
        raise PlacerError(f"--{what} {arg!r}: give a comma-separated list")
    if known is not None:
        bad = [a for a in items if a not in known]
        if bad:
            raise PlacerError(f"--{what}: unknown {', '.join(bad)} (known: {', '.join(known)})")
    return items


def machine_line() -> str:
    """One line naming the machine the numbers were produced on."""
    return f"{platform.platform()}, Python {platform.python_version()}, {os.cpu_count()} CPU cores"


def repo_env(**extra: str) -> dict[str, str]:
    """This process's environment with the checkout first on ``PYTHONPATH`` (and ``extra`` set): what a benchmark
    gives a fresh ``python -m bench.X`` process of its own, so it imports ``bench`` wherever it starts."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, **extra, "PYTHONPATH": path}


def print_report(as_json: bool, doc: dict[str, Any], table: Callable[[], str]) -> None:
    """A benchmark's output on stdout: ``doc`` as JSON after the machine line and the arguments (``as_json``), else
    the markdown ``table()`` and the machine line."""
    if as_json:
        print(json.dumps({"machine": machine_line(), "argv": sys.argv[1:], **doc}, indent=1, default=float))
    else:
        print(table())
        print(f"\nMachine: {machine_line()}.")


def mode_defaults(args: argparse.Namespace, defaults: dict[str, dict[str, Any]]) -> argparse.Namespace:
    """``args`` with each option left unset (None) set from ``defaults["tiny"]`` under ``--tiny``, else from
    ``defaults["gpu"]``: the GPU scripts' options whose default depends on the mode.

    >>> mode_defaults(argparse.Namespace(tiny=True, steps=None, seed=1), {"tiny": {"steps": 1, "seed": 0}, "gpu": {}})
    Namespace(tiny=True, steps=1, seed=1)
    """
    for key, value in defaults["tiny" if args.tiny else "gpu"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def entry_name(prog: str) -> str:
    """The short name a benchmark's messages start with: ``validate_gpu`` for ``python -m bench.validate_gpu``.

    >>> entry_name("python -m bench.validate_gpu"), entry_name("gpu_offload.py")
    ('validate_gpu', 'gpu_offload')
    """
    return prog.split()[-1].removesuffix(".py").rpartition(".")[2]


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (``<name>: <message>``, exit status 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{entry_name(self.prog)}: {message}", file=sys.stderr)
        raise SystemExit(2)

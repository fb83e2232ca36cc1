"""What the command lines of the Gymnasium benchmarks share: a parser from the module's doc, the problem's options.

:mod:`bench.gym_agents`, :mod:`bench.rllib_ppo`, :mod:`bench.env_throughput` and
:mod:`bench.leaderboard` are run as ``python -m bench.<module>``; each parser's
description is its module doc's first paragraph and its epilog the rest, and
each prints its JSON report with the command line that made it.

>>> command_line("bench.gym_agents", ["random", "--graph", "my model.json"])
"python -m bench.gym_agents random --graph 'my model.json'"
"""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any, Sequence

from bench.common import OneLineParser


def doc_parser(module: str, doc: str) -> argparse.ArgumentParser:
    """A one-line-error parser for ``python -m <module>``: the doc's first paragraph, then the rest as the epilog."""
    first, _, rest = doc.partition("\n\n")
    return OneLineParser(
        prog=f"python -m {module}",
        description=first,
        epilog=rest,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_problem(p: argparse.ArgumentParser) -> None:
    """``--graph`` and ``--cluster``, as the environments take them (default: the paper's nmt-2 on k80x4)."""
    p.add_argument("--graph", default="nmt-2", help="dataset item, zoo name, graph file or module:callable (nmt-2)")
    p.add_argument("--cluster", default="k80x4", help="cluster preset or JSON file (default k80x4)")


def command_line(module: str, argv: Sequence[str]) -> str:
    """The command that ran: ``python -m <module> <argv>``, quoted for a shell."""
    return shlex.join(["python", "-m", module, *argv])


def print_report(report: dict[str, Any], module: str, argv: Sequence[str]) -> None:
    """Print a JSON report with the command that made it."""
    print(json.dumps({**report, "command": command_line(module, argv)}, indent=1))

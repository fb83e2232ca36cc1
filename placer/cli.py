"""The ``placer`` command line: one subcommand per user task.

Each ``placer/cli_*.py`` module adds its subcommands through ``add_commands(sub)``
and keeps heavy imports (torch, ray) inside the command functions, so
``placer --help`` stays fast. Bad input (a :class:`graphs.PlacerError`) exits 2
with one line on stderr; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from typing import Any

from graphs.errors import PlacerError

# Order here is the order in `placer --help`.
_COMMAND_MODULES = ("placer.cli_graphs", "placer.cli_sim", "placer.cli_compare", "placer.cli_train", "placer.cli_pretrain", "placer.cli_run")

EPILOG = """\
typical session:
  placer graphs                                  # the model zoo
  placer export nmt-2 -o nmt2.json               # capture a model's training step
  placer compare nmt2.json --cluster k80x4       # heuristic baselines, one table
  placer train nmt2.json --cluster k80x4 --time-budget 300
  placer simulate nmt2.json runs/latest/best_placement.json --cluster k80x4

SOURCE (where a command takes one) is a graph file (.json), a zoo name,
a module:callable returning (model, example_inputs), or an exported .pt2 file.
"""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, like every other error.

    argparse prints the whole usage block before the message; a bad option is
    bad input like any other, so it gets the one line (and exit status 2) that
    names the option, plus where to read more.
    """

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def json_safe(doc: Any) -> Any:
    """``doc`` with every non-finite float (inf, nan) as None and numpy values as plain Python ones.

    JSON has no Infinity or NaN; a document with them is not JSON to a strict
    parser. A value that is not finite is one that does not exist (an OOM step
    has no step time), and the document's ``status`` says why.

    >>> json_safe({"t": float("inf"), "xs": [1.0, float("nan")], "ok": True})
    {'t': None, 'xs': [1.0, None], 'ok': True}
    """
    if isinstance(doc, dict):
        return {k: json_safe(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [json_safe(v) for v in doc]
    if isinstance(doc, (bool, int, str)) or doc is None:
        return doc
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if hasattr(doc, "tolist"):  # numpy scalars and arrays
        return json_safe(doc.tolist())
    return doc


def to_json(doc: Any, indent: int | None = 1) -> str:
    """The one JSON encoder of the CLI's outputs: strict JSON (see :func:`json_safe`)."""
    return json.dumps(json_safe(doc), indent=indent, allow_nan=False)


def print_json(doc: Any, indent: int | None = 1) -> None:
    """Print ``doc`` as strict JSON on stdout: every ``--json`` output goes through here."""
    print(to_json(doc, indent=indent))


def add_profile_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--profile PROFILE.json`` to a command's parser (place, simulate, compare, train)."""
    parser.add_argument("--profile", metavar="PROFILE.json", default=None, help="calibrate the simulator with a `placer profile` file (per-op times, link speeds)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="placer",
        description="Reinforcement-learning device placement for PyTorch training steps.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod_name in _COMMAND_MODULES:
        importlib.import_module(mod_name).add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
    except PlacerError as e:
        print(f"placer: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("placer: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

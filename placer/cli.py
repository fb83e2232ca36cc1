"""The ``placer`` command line: one subcommand per user task.

Each ``placer/cli_*.py`` module adds its subcommands through ``add_commands(sub)``
and keeps heavy imports (torch, ray) inside the command functions, so
``placer --help`` stays fast. Bad input (a :class:`graphs.PlacerError`) exits 2
with one line on stderr; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from graphs.errors import PlacerError

# Order here is the order in `placer --help`.
_COMMAND_MODULES = ("placer.cli_graphs", "placer.cli_sim", "placer.cli_compare", "placer.cli_train", "placer.cli_run")

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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="placer",
        description="Reinforcement-learning device placement for PyTorch training steps.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod_name in _COMMAND_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            if e.name == mod_name:
                continue  # that command group is not built yet
            raise
        mod.add_commands(sub)
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

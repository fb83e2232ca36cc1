"""The ``placer`` command line: one subcommand per user task, one module per command.

Each module of this package (``placer/cli/<command>.py``) adds its command with
``add_command(sub)`` and runs it with ``run(args)``. Commands import light
modules at the top and heavy ones (torch, ray: the real runtime, the training
loop, the policies) inside ``run``, on purpose, so ``placer --help`` stays fast.
:mod:`~placer.cli.output` prints (strict JSON, tables, units),
:mod:`~placer.cli.args` parses what several commands share and
:mod:`~placer.cli.parser` is every command's parser (usage errors in one line,
with a suggestion for a mistyped name). Bad input (a :class:`graphs.PlacerError`)
exits 2 with one line on stderr; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys

from graphs.errors import PlacerError
from graphs.sources import shadowing_message
from placer.cli.output import json_safe, print_json, to_json
from placer.cli.parser import Parser

__all__ = ["main", "build_parser", "COMMANDS", "json_safe", "to_json", "print_json"]

# The commands, one module each; their order here is the order in `placer --help`.
COMMANDS = (
    "graphs",
    "export",
    "inspect",
    "clusters",
    "place",
    "simulate",
    "export_map",
    "compare",
    "train",
    "pretrain",
    "run",
    "profile",
)

DESCRIPTION = """\
Find a faster placement of a PyTorch training step's ops on devices. `placer train`
learns one: by default a move search whose moves a learned critic ranks (--algo moves);
--algo reinforce|ppo trains the paper's seq2seq policy instead. Every heuristic and
the lower bound are scored beside it on the same simulator (`placer compare`), or on
real devices through Ray (`placer train` with --env measured).
"""

EPILOG = """\
typical session:
  placer graphs                                  # the model zoo
  placer export nmt-2 -o nmt2.json               # capture a model's training step
  placer compare nmt2.json --cluster k80x4       # every heuristic, one table
  placer train nmt2.json --cluster k80x4 --time-budget 300 --logdir runs/nmt2
  placer simulate nmt2.json runs/nmt2/best_placement.json --cluster k80x4

SOURCE (where a command takes one) is a graph file (.json), a zoo name,
a module:callable returning (model, example_inputs), or an exported .pt2 file.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="placer",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").add_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    shadowed = shadowing_message("placer")  # `python -m placer` beside a folder named placer
    if shadowed:
        print(f"placer: error: {shadowed}", file=sys.stderr)
        return 2
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


def console_main() -> int:
    """The ``placer`` command (and ``python -m placer``): :func:`main`, then the process's objects frozen so that the
    interpreter's last garbage collection does not walk torch's and Ray's millions of them (1-3 s on 2 CPU cores
    after the command had finished), and a command that measures in this process may start it again with the
    host's allocator as placer measures (:func:`placer.cli.args.measure_here`). Before all that, a command whose
    process drew its hash seed starts itself again with ``PYTHONHASHSEED=0`` (:mod:`graphs.hash_seed`): a model
    whose forward iterates a set of names then exports the same graph in every placer process (a plan made by
    ``placer place`` is the one ``placer run`` and a job's ranks capture). :func:`placer.console.main`, the entry
    point, has done that before these imports; here it is for an install whose ``placer`` script still names this
    function. Not in :func:`main`, which in-process callers (tests) call."""
    from placer.cli.args import CONSOLE
    from placer.console import start_again_with_fixed_hash_seed

    start_again_with_fixed_hash_seed()
    CONSOLE["command"] = True
    status = main()
    gc.freeze()
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(console_main())

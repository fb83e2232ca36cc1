"""The ``placer`` command's entry point (``placer = placer.console:main`` and ``python -m placer``).

Before it imports anything of placer's, it makes sure that this process hashes strings as every placer process does
(:mod:`graphs.hash_seed`): where ``PYTHONHASHSEED`` is unset, it starts the same command again with it set to 0.
Here that costs an interpreter's start (about 30 ms); after :mod:`placer.cli`'s imports (numpy, the graph formats)
it cost 0.4 s a command.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

#: What :func:`start_again_with_fixed_hash_seed` sets (graphs.hash_seed.HASH_SEED; this module imports nothing of
#: placer's, so it is written here too).
HASH_SEED = "0"


def start_again_with_fixed_hash_seed(argv: Sequence[str] | None = None) -> None:
    """Replace this process by ``argv`` (an interpreter and its arguments; default this process's own command line)
    started with ``PYTHONHASHSEED=0`` (the rest of the environment as it is) when this process's seed was drawn
    (``graphs.hash_seed.hash_seed_fixed``: the variable unset, or not a number). Returns, replacing nothing, when the
    seed is fixed already: the process it starts has it, so this is one ``exec``, never a loop. What this process
    printed is flushed first."""
    if os.environ.get("PYTHONHASHSEED", "").isdigit():
        return
    argv = [sys.executable, *sys.orig_argv[1:]] if argv is None else list(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, {**os.environ, "PYTHONHASHSEED": HASH_SEED})


def start_again_if_run_as_module() -> None:
    """For a package's ``__init__`` (``bench``'s): where this process is ``python -m <package>.<module>`` and Python
    is still locating that module (``sys.argv[0]`` is ``"-m"`` until the module runs, and only the packages above it
    are imported then), :func:`start_again_with_fixed_hash_seed` with the same command line. Where a program or
    pytest imports the package, nothing."""
    if sys.argv[:1] == ["-m"]:
        start_again_with_fixed_hash_seed()


def main() -> int:
    """The ``placer`` command: this process with a fixed hash seed, then :func:`placer.cli.console_main`."""
    start_again_with_fixed_hash_seed()
    from placer.cli import console_main

    return console_main()


__all__ = ["HASH_SEED", "main", "start_again_if_run_as_module", "start_again_with_fixed_hash_seed"]

"""Deprecated alias of placer.option_checks (kept until the parallel branches merge).

Its name clashed with ``bench/fidelity/checks.py``; it holds the checks of command-line
options (files to read and write, numbers): import :mod:`placer.option_checks`.
"""

from placer.option_checks import (  # noqa: F401
    MAX_SEED,
    NAME_MAX,
    check_float,
    check_input_file,
    check_int,
    check_output_dir,
    check_output_file,
    check_seed,
    parse_group_counts,
)

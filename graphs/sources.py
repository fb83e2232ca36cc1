"""``module:callable`` model sources: the one loader, for the CLI driver and the Ray workers alike.

A SOURCE such as ``mypkg.models:build`` names a function returning
``(model, example_inputs)``. The module is imported the way ``python -m`` would:
with the directory the command runs in (``search_dir``, default the current
one) first on ``sys.path``. The measured env ships the module to its Ray workers
(``envs.real.shipping``), which load it with the shipped copy's directory first.

>>> looks_like_callable("mypkg.models:build"), looks_like_callable("nmt-2")
(True, False)
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from graphs.errors import PlacerError


def looks_like_callable(source: str) -> bool:
    """True when ``source`` reads as ``module:callable`` (and is not an existing path)."""
    mod, sep, attr = source.partition(":")
    return bool(sep and mod and attr and not os.path.exists(source) and "/" not in mod)


def search_path(search_dir: str | None = None) -> str:
    """Put ``search_dir`` (default: the current directory) first on ``sys.path``; returns it, absolute."""
    directory = os.path.abspath(search_dir or os.getcwd())
    if sys.path[:1] != [directory]:  # like `python -m`: the user's own modules in that directory, before any other
        if directory in sys.path:
            sys.path.remove(directory)
        sys.path.insert(0, directory)
    return directory


def load_callable(source: str, *, search_dir: str | None = None) -> tuple[Any, tuple]:
    """Import ``module:callable`` and call it; it must return ``(model, example_inputs)``.

    Errors (a module that cannot be imported, a missing or non-callable attribute,
    a call that raises, a wrong return) are one-line :class:`PlacerError`\\ s naming SOURCE.
    """
    mod_name, sep, attr = source.partition(":")
    if not (sep and mod_name and attr):
        raise PlacerError(f"{source}: not of the form module:callable")
    search_path(search_dir)
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:  # ImportError, or any error raised while importing the user's module
        raise PlacerError(f"{source}: cannot import module {mod_name!r} ({type(e).__name__}: {e})") from None
    fn = mod
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise PlacerError(f"{source}: module {mod_name!r} has no attribute {attr!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise PlacerError(f"{source}: {attr!r} is not callable")
    try:
        out = fn()
    except Exception as e:
        raise PlacerError(f"{source}: calling {attr}() failed ({type(e).__name__}: {e})") from None
    return model_and_inputs(out, source, f"{attr}()")


def model_and_inputs(out: Any, source: str, what: str = "the source") -> tuple[Any, tuple]:
    """``(model, example_inputs)`` with the inputs as a tuple, from what a builder returned."""
    if not (isinstance(out, tuple) and len(out) == 2):
        raise PlacerError(f"{source}: {what} must return (model, example_inputs), got {type(out).__name__}")
    model, inputs = out
    if not isinstance(inputs, tuple):
        inputs = tuple(inputs) if isinstance(inputs, list) else (inputs,)
    return model, inputs

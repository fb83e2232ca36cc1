"""SOURCE arguments: a graph file, a zoo name, a ``module:callable`` or an exported ``.pt2``, resolved to a graph.

A SOURCE such as ``mypkg.models:build`` names a function returning
``(model, example_inputs)``. The module is imported the way ``python -m`` would:
with the directory the command runs in (``search_dir``, default the current
one) first on ``sys.path``. :func:`load_callable` is the one loader, for the CLI
driver and the Ray workers alike: the measured env ships the module to its
workers (``envs.real.shipping``), which load it with the shipped copy's
directory first.

>>> looks_like_callable("mypkg.models:build"), looks_like_callable("nmt-2")
(True, False)
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib.metadata import packages_distributions
from typing import Any

from graphs import zoo
from graphs.errors import PlacerError
from graphs.io import load
from graphs.ir import OpGraph


# ---------------------------------------------------------------- module:callable
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


def shadowing_folders(package: str) -> list[str]:
    """The folders that stand in for ``package`` when Python imported a bare folder (no ``__init__.py``) of that name.

    A folder named like an installed package, in a directory that comes first on ``sys.path``
    (a script's own, or the current one for ``python -m``), is imported as a namespace package
    ahead of a package installed in editable mode: ``from placer import Placement`` then fails
    with "cannot import name ... (unknown location)". Empty when ``package`` is not imported or
    is a real package.
    """
    module = sys.modules.get(package)
    if module is None or getattr(module, "__file__", None) is not None:
        return []
    return [str(p) for p in getattr(module, "__path__", [])]


def shadowing_message(package: str) -> str | None:
    """One line naming the folder that shadows ``package`` and what to do, or None when nothing does.

    Only an installed package is shadowed: a namespace package of the user's own that lacks a name is not.
    """
    folders = shadowing_folders(package)
    if not folders or package not in packages_distributions():  # (read only then: it takes 0.1 s)
        return None
    return (
        f"the folder {folders[0]} (no __init__.py) shadows the installed {package} package: rename or move it, "
        f"or run from another directory"
    )


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
        shadowed = shadowing_message(getattr(e, "name", None) or "") if isinstance(e, ImportError) else None
        why = shadowed or f"{type(e).__name__}: {e}"
        raise PlacerError(f"{source}: cannot import module {mod_name!r} ({why})") from None
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


# ---------------------------------------------------------------- any SOURCE
def resolve_model(source: str) -> tuple[Any, tuple]:
    """A runnable ``(model, example_inputs)`` from a zoo name or ``module:callable``."""
    if source in zoo.names():
        return zoo.build(source)
    if looks_like_callable(source):
        return load_callable(source)
    raise PlacerError(
        f"{source}: not a runnable model source (need a zoo name: {', '.join(zoo.names())}; or module:callable)"
    )


def will_capture(source: str) -> bool:
    """Whether resolving ``source`` runs ``torch.export`` (a ``module:callable``, or a zoo model not cached yet)."""
    if os.path.exists(source):
        return False
    if source in zoo.names():
        return not zoo.cache_path(source).exists()
    return looks_like_callable(source)


def resolve_graph(source: str, **capture_options: Any) -> OpGraph:
    """An :class:`OpGraph` from any SOURCE."""
    return resolve_graph_model_inputs(source, **capture_options)[0]


def resolve_graph_model_inputs(source: str, **capture_options: Any) -> tuple[OpGraph, Any, tuple | None]:
    """The :class:`OpGraph` of any SOURCE and, for a ``module:callable``, its model and the example inputs it was
    captured on (else None, None).

    The model is for the methods that need one (accelerate's device maps) and for checks that run it (a plan of
    microbatches of a step that mixes its batch); a graph captured from a callable records it in
    ``meta["source"]``, so a saved graph file can say where its model comes from (``meta`` is outside the hash).
    """
    if os.path.exists(source):
        return load(source), None, None
    if source in zoo.names():
        return zoo.graph(source, **capture_options), None, None
    if looks_like_callable(source):
        from graphs.torch_capture import capture  # torch: loaded only to capture

        model, inputs = load_callable(source)
        graph = capture(model, inputs, **capture_options)
        graph.meta["source"] = source
        return graph, model, inputs
    if source.endswith((".json", ".gz", ".pt2")):
        raise PlacerError(f"{source}: no such file")
    raise PlacerError(f"{source}: not a graph file, zoo name ({', '.join(zoo.names())}) or module:callable")


# ---------------------------------------------------------------- what the model returns
#: What a model's training step is scored with when its forward does not return a scalar loss.
STAND_IN_LOSS = "the sum of the means of its floating-point outputs"


def describe_outputs(outputs: list[dict[str, Any]]) -> str:
    """What a forward returns, in words, from ``[{"shape": [...], "dtype": ...}, ...]``.

    >>> describe_outputs([{"shape": [4, 16, 1000], "dtype": "float32"}])
    'a float32 tensor of shape [4, 16, 1000]'
    >>> describe_outputs([{"shape": [], "dtype": "float32"}, {"shape": [2, 3], "dtype": "float16"}])
    '2 tensors (float32 [], float16 [2, 3])'
    >>> describe_outputs([])
    'no tensor'
    """
    if not outputs:
        return "no tensor"
    if len(outputs) == 1:
        return f"a {outputs[0]['dtype']} tensor of shape {list(outputs[0]['shape'])}"
    parts = ", ".join(f"{o['dtype']} {list(o['shape'])}" for o in outputs)
    return f"{len(outputs)} tensors ({parts})"


def is_scalar_loss(outputs: list[dict[str, Any]]) -> bool:
    """Whether a forward returning ``outputs`` returns its training loss: one floating-point scalar.

    >>> is_scalar_loss([{"shape": [], "dtype": "float32"}]), is_scalar_loss([{"shape": [2], "dtype": "float32"}])
    (True, False)
    """
    return (
        len(outputs) == 1
        and list(outputs[0]["shape"]) == []
        and str(outputs[0]["dtype"]).startswith(("float", "bfloat", "half", "double"))
    )


def stand_in_loss(graph: OpGraph) -> str | None:
    """None when ``graph``'s model returns a scalar loss (or the graph does not record what it returns), else why not.

    The simulator times the same forward and backward whatever the loss, so a
    model returning logits can be placed and compared; it cannot be trained
    as it is (``placer run``, ``placer train --env measured`` refuse it).
    """
    outputs = graph.meta.get("outputs")
    if not isinstance(outputs, list) or is_scalar_loss(outputs):
        return None
    return f"the model returns {describe_outputs(outputs)}, not a scalar loss"

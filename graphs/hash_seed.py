"""One order of a model's ops in every process: Python's hash seed, fixed for placer's processes.

A model whose forward iterates a ``set`` of strings (or a dict built from one) runs
its ops in an order that Python's hash seed decides, and Python draws that seed anew
for every process unless ``PYTHONHASHSEED`` names one. ModernBERT's encoder computes
its rotary tables ``for layer_type in set(config.layer_types)``; so do several other
Hugging Face models (DOTS, Gemma 4, T5Gemma 2, Step-3). Exported in two processes, such
a model gives two graphs: the same ops, named in another order (``cos`` in one is
``cos_1`` in the other), with two content hashes. A placement made by ``placer place``
was then refused by ``placer run`` in about half of the runs ("made for graph ..., not
for this graph"), and the ranks of a job could each export another graph than the
plan's.

So the ``placer`` command starts itself again with ``PYTHONHASHSEED=0`` when the
variable is unset (:func:`placer.console.start_again_with_fixed_hash_seed`, one ``exec``,
before it imports anything of placer's); what it starts (a job's ranks, the fork server, a local Ray) inherits
the variable, and the Ray actors that measure are given it (:func:`hash_seed_env`), as
actors on another machine do not inherit the driver's environment. A seed the user set
is kept. A program of the user's own that captures or applies a plan is the user's to
start so; where a plan is refused for another graph in a process whose seed is drawn,
the error says so (:func:`hash_seed_hint`).
"""

from __future__ import annotations

import os

#: The seed placer's processes start with where the user named none.
HASH_SEED = "0"
VARIABLE = "PYTHONHASHSEED"


def hash_seed_fixed(environ: dict[str, str] | None = None) -> bool:
    """Whether a process started with ``environ`` (default: this one's) hashes strings the same in every run.

    >>> hash_seed_fixed({}), hash_seed_fixed({"PYTHONHASHSEED": "random"}), hash_seed_fixed({"PYTHONHASHSEED": "7"})
    (False, False, True)
    """
    value = (os.environ if environ is None else environ).get(VARIABLE, "")
    return value.isdigit()


def hash_seed_env() -> dict[str, str]:
    """``{"PYTHONHASHSEED": ...}`` for a process placer starts elsewhere (a Ray actor's ``env_vars``): this
    process's seed where it has one, else :data:`HASH_SEED`."""
    return {VARIABLE: os.environ[VARIABLE] if hash_seed_fixed() else HASH_SEED}


def hash_seed_hint(environ: dict[str, str] | None = None) -> str:
    """What to add to "made for another graph" in a process whose hash seed was drawn ("" where it is fixed).

    >>> hash_seed_hint({"PYTHONHASHSEED": "0"})
    ''
    >>> "PYTHONHASHSEED=0" in hash_seed_hint({})
    True
    """
    if hash_seed_fixed(environ):
        return ""
    return (
        "; if the model's forward iterates a set of names, its ops run in another order under each of Python's hash "
        "seeds: start this process with PYTHONHASHSEED=0, as placer's commands start"
    )


__all__ = [
    "HASH_SEED",
    "VARIABLE",
    "hash_seed_env",
    "hash_seed_fixed",
    "hash_seed_hint",
]

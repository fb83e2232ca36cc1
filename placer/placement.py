"""Deprecated alias of :mod:`graphs.plan` (kept for one release): ``from placer import Placement`` instead.

The placement is core data; it lives at the bottom of the import graph, in
:mod:`graphs.plan`, so every package can use it.
"""

from graphs.plan import FORMAT, Placement  # noqa: F401

__all__ = ["Placement", "FORMAT"]

"""Errors that mean "the user's input is wrong" (exit status 2 on the CLI).

Every package raises these (or subclasses) for bad input; the CLI prints the
message on one line and exits 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class PlacerError(Exception):
    """Bad input: a malformed file, an unknown name, a wrong shape.

    The message must name the file or object and the problem, on one line.
    """


class GraphFormatError(PlacerError):
    """A graph file (or in-memory graph) that breaks the placer-graph/1 contract."""


class CaptureError(PlacerError):
    """A model that torch.export cannot capture, with the cause in one line."""

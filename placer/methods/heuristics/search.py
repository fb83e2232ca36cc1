"""Deprecated alias of placer.methods.heuristics.ranking (kept until the parallel branches merge)."""

from placer.methods.heuristics.ranking import placement_keys, scored_keys  # noqa: F401

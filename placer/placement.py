"""Placement: op name -> logical device, tied to one graph and one device list.

Saved as versioned JSON (``"format": "placer-placement/1"``), never pickled.

>>> from graphs import OpGraph
>>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)])
>>> p = Placement.from_indices(g, ["cpu:0", "gpu:0"], [1, 1])
>>> p.assignment
{'a': 'gpu:0', 'b': 'gpu:0'}
>>> p.indices(g, ["cpu:0", "gpu:0"]).tolist()
[1, 1]
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from envs.assign import as_indices
from graphs import OpGraph, PlacerError
from graphs import schema
from graphs.io import read_json, write_text_atomic

FORMAT = "placer-placement/1"


@dataclass
class Placement:
    """A device for every op of a graph.

    Attributes:
        assignment: op name -> logical device name (``"gpu:0"``).
        graph_hash: content hash of the graph it was made for.
        devices: the cluster's device list it was made for.
        cluster: the cluster's name, for the record.
        method: what produced it (``"single"``, ``"rl:seq2seq"``...).
        meta: anything else (step time found, seed...).
    """

    assignment: dict[str, str]
    graph_hash: str
    devices: list[str]
    cluster: str = ""
    method: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_indices(
        cls, graph: OpGraph, devices: Sequence[str], indices: Sequence[int] | np.ndarray, *, cluster: str = "", method: str = "", meta: dict | None = None
    ) -> "Placement":
        idx = np.asarray(indices).tolist()
        if len(idx) != graph.num_ops:
            raise PlacerError(f"placement: {len(idx)} devices for {graph.num_ops} ops")
        devs = list(devices)
        return cls(
            assignment={name: devs[d] for name, d in zip(graph.names, idx)},
            graph_hash=graph.content_hash,
            devices=devs,
            cluster=cluster,
            method=method,
            meta=dict(meta or {}),
        )

    def indices(self, graph: OpGraph, devices: Sequence[str] | None = None, *, source: str = "placement") -> np.ndarray:
        """Device index of each op of ``graph`` (checks the hash, missing ops, unknown devices)."""
        return as_indices(self, graph, list(devices) if devices is not None else self.devices, source=source)

    def device_counts(self) -> dict[str, int]:
        return dict(Counter(self.assignment.values()))

    # ------------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "graph_hash": self.graph_hash,
            "cluster": self.cluster,
            "devices": self.devices,
            "method": self.method,
            "meta": self.meta,
            "assignment": self.assignment,
        }

    def save(self, path: str | os.PathLike) -> None:
        write_text_atomic(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Placement":
        path = os.fspath(path)
        return cls.from_dict(read_json(path), source=path)

    @classmethod
    def from_dict(cls, doc: Any, *, source: str = "placement") -> "Placement":
        """Build from a parsed placer-placement/1 document; field types are checked by :mod:`graphs.schema`."""
        if not isinstance(doc, dict):
            raise PlacerError(f"{source}: expected a JSON object")
        if doc.get("format") != FORMAT:
            raise PlacerError(f"{source}: format is {doc.get('format')!r}, expected {FORMAT!r}")
        a = doc.get("assignment")
        if not isinstance(a, dict) or not set(map(type, a.values())) <= {str}:
            raise PlacerError(f"{source}: 'assignment' must map op names to device names")
        devices = schema.strings(doc.get("devices"), source, "devices")
        unknown = sorted(set(a.values()) - set(devices))
        if unknown:
            raise PlacerError(f"{source}: assignment uses device {unknown[0]!r}, not in its device list {devices}")
        return cls(
            assignment=a,
            graph_hash=schema.string(doc.get("graph_hash", ""), source, "graph_hash"),
            devices=devices,
            cluster=schema.string(doc.get("cluster", ""), source, "cluster"),
            method=schema.string(doc.get("method", ""), source, "method"),
            meta=_check_meta(doc.get("meta", {}), source),
        )


def _check_meta(meta: Any, source: str) -> dict[str, Any]:
    """``meta``: an object; the keys placer reads back (train's resume) have their types."""
    meta = dict(schema.obj(meta, source, "meta"))
    if "step_time_s" in meta:  # inf for a placement that failed: written as Infinity
        schema.number(meta["step_time_s"], source, "meta.step_time_s", minimum=0.0, finite=False)
    if "found_by" in meta:
        schema.string(meta["found_by"], source, "meta.found_by")
    if "iteration" in meta:
        schema.integer(meta["iteration"], source, "meta.iteration", minimum=-1)
    return meta

"""Turn any placement-like value into device indices aligned with a graph's ops.

``envs`` cannot import ``placer.Placement`` (imports flow graphs <- envs <- placer),
so scorers accept:

* a numpy array / sequence of ints: device index per op, in graph order;
* a mapping op name -> logical device name;
* any object with an ``assignment`` mapping (``placer.Placement``), and optionally
  ``graph_hash``, which must match the graph.

>>> from graphs import OpGraph
>>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)])
>>> as_indices({"a": "gpu:0", "b": "cpu:0"}, g, ["cpu:0", "gpu:0"]).tolist()
[1, 0]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from graphs import OpGraph, PlacerError


def as_indices(placement: Any, graph: OpGraph, device_names: Sequence[str], *, source: str = "placement") -> np.ndarray:
    """Device index (into ``device_names``) of every op of ``graph``, as int32."""
    n = graph.num_ops
    if isinstance(placement, np.ndarray) or (isinstance(placement, Sequence) and not isinstance(placement, str)):
        arr = np.asarray(placement)
        if arr.shape != (n,):
            raise PlacerError(f"{source}: has {arr.shape} entries, graph {graph.name or ''} has {n} ops")
        if n and (arr.min() < 0 or arr.max() >= len(device_names)):
            raise PlacerError(f"{source}: device index out of range [0, {len(device_names)})")
        return arr.astype(np.int32, copy=False)
    graph_hash = getattr(placement, "graph_hash", None)
    if graph_hash and graph_hash != graph.content_hash:
        raise PlacerError(
            f"{source}: made for graph {graph_hash}, not for this graph ({graph.name or 'graph'} {graph.content_hash})"
        )
    mapping = getattr(placement, "assignment", placement)
    if not isinstance(mapping, Mapping):
        raise PlacerError(f"{source}: expected an array of device indices, a name->device mapping or a Placement")
    dev_index = {d: i for i, d in enumerate(device_names)}
    out = np.empty(n, dtype=np.int32)
    missing = []
    for i, name in enumerate(graph.names):
        dev = mapping.get(name)
        if dev is None:
            missing.append(name)
            continue
        j = dev_index.get(dev)
        if j is None:
            raise PlacerError(f"{source}: op {name!r} is placed on unknown device {dev!r} (cluster has {', '.join(device_names)})")
        out[i] = j
    if missing:
        raise PlacerError(f"{source}: {len(missing)} ops have no device, e.g. {missing[0]!r}")
    if len(mapping) > n:
        extra = next(k for k in mapping if k not in graph.index)
        raise PlacerError(f"{source}: names op {extra!r}, which is not in the graph")
    return out

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


def check_order(order: Any, graph: OpGraph | int, *, source: str = "order") -> np.ndarray:
    """An issue order checked against ``graph``: the op indices, as int32, in issue order.

    The one validation of issue orders (placements, ``placer.apply``, the simulator).
    ``order`` must be a 1-D sequence of integers (not bools or floats) naming every op
    of ``graph`` exactly once, with each op after all of its inputs (a topological
    order of ``graph``'s edges). ``graph`` may also be a number of ops: then every
    check but the edges is made (a placement read from a file, before its graph is
    known). Raises :class:`PlacerError` with one line starting with ``source``.

    >>> g = OpGraph.from_edges(["a", "b", "c"], [("a", "c", 4)])
    >>> check_order([1, 0, 2], g).tolist()
    [1, 0, 2]
    >>> check_order([2, 0, 1], g)
    Traceback (most recent call last):
    ...
    graphs.errors.PlacerError: order: op 'c' (2) is issued before its input 'a' (0)
    """
    n = graph if isinstance(graph, int) else graph.num_ops
    if isinstance(order, np.ndarray):
        arr = order
    elif isinstance(order, Sequence) and not isinstance(order, (str, bytes)):
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in order):
            bad = next(v for v in order if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)))
            raise PlacerError(f"{source}: must be a list of op indices, found {bad!r}")
        arr = np.asarray(order, dtype=np.int64) if len(order) else np.zeros(0, dtype=np.int64)
    else:
        raise PlacerError(f"{source}: must be a list of op indices, not {type(order).__name__}")
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise PlacerError(f"{source}: must be a 1-D array of op indices, got shape {arr.shape} of {arr.dtype}")
    if arr.shape[0] != n:
        raise PlacerError(f"{source}: has {arr.shape[0]} entries for {n} ops")
    if n and (arr.min() < 0 or arr.max() >= n):
        bad = int(arr[(arr < 0) | (arr >= n)][0])
        raise PlacerError(f"{source}: op index {bad} out of range [0, {n})")
    pos = np.full(n, -1, dtype=np.int64)
    pos[arr] = np.arange(n)
    if (pos < 0).any():
        missing = int(np.flatnonzero(pos < 0)[0])
        dup = int(arr[np.flatnonzero(np.bincount(arr, minlength=n)[arr] > 1)[0]])
        raise PlacerError(f"{source}: not a permutation of the ops: op {dup} appears twice, op {missing} never")
    if not isinstance(graph, int) and graph.num_edges:
        late = np.flatnonzero(pos[graph.edge_src] > pos[graph.edge_dst])
        if late.size:
            s, d = int(graph.edge_src[late[0]]), int(graph.edge_dst[late[0]])
            raise PlacerError(f"{source}: op {graph.names[d]!r} ({d}) is issued before its input {graph.names[s]!r} ({s})")
    return arr.astype(np.int32, copy=False)


def single_device_rows(num_devices: int, num_ops: int) -> np.ndarray:
    """``[num_devices, num_ops]`` int32: row ``d`` places every op on device ``d``.

    >>> single_device_rows(2, 3).tolist()
    [[0, 0, 0], [1, 1, 1]]
    """
    return np.repeat(np.arange(num_devices, dtype=np.int32)[:, None], num_ops, axis=1)

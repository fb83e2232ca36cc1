"""Co-location and coarsening: from thousands of ops to a few hundred placeable groups.

:func:`colocate` finds ops that must share a device; :func:`coarsen` merges them
and then cuts a topological order into at most ``max_groups`` contiguous runs, so
the group graph is a DAG by construction. A :class:`Grouping` maps group
placements back to op placements (:meth:`Grouping.expand`, a numpy fancy-index)
and op placements to group placements (:meth:`Grouping.contract`).

Cut bytes, the measure every placement is judged by here: for each op ``u`` and
each device ``d`` other than ``u``'s that runs a consumer of ``u``, the bytes of
``u``'s tensor, counted once per (``u``, ``d``) pair however many consumers sit on
``d`` (the largest edge if ``u``'s edges to ``d`` differ). :func:`graphs.group_graph.cut_bytes` and
:meth:`Grouping.cut_bytes` compute it; a group placement and its expansion agree. Groupings by
the model's module tree are :mod:`graphs.module_tree`'s.

Example, on a 4-op DAG where ``v`` is a view of ``x``:

>>> from graphs.ir import OpGraph
>>> g = OpGraph.from_edges(
...     ["x", "v", "mm", "out"],
...     [("x", "v", 64), ("v", "mm", 64), ("x", "out", 64), ("mm", "out", 16)],
...     op_types=["aten.relu.default", "aten.view.default", "aten.mm.default", "aten.add.Tensor"],
...     flops=[1.0, 0.0, 8.0, 1.0])
>>> colocate(g).tolist()
[0, 0, 1, 2]
>>> grouping = coarsen(g, max_groups=2)
>>> grouping.op_group.tolist(), grouping.graph.names
([0, 0, 1, 1], ['g0', 'g1'])
>>> grouping.graph.op_types, grouping.graph.flops.tolist(), grouping.graph.edge_bytes.tolist()
(['aten.relu.default', 'aten.mm.default'], [1.0, 9.0], [128])
>>> grouping.expand([[0, 1], [1, 1]]).tolist()
[[0, 0, 1, 1], [1, 1, 1, 1]]
>>> from graphs.group_graph import cut_bytes
>>> int(grouping.cut_bytes([0, 1])) == int(cut_bytes(g, grouping.expand([0, 1])))
True
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from graphs import schema
from graphs.dag import kahn
from graphs.errors import GraphFormatError, PlacerError
from graphs.group_graph import CutTable, build_group_graph, cut_bytes_batched
from graphs.hash_seed import hash_seed_hint
from graphs.io import from_dict as graph_from_dict
from graphs.ir import OpGraph
from graphs.ops import base_op_name, inplace_mask, metadata_mask, param_paths, view_mask

FORMAT = "placer-grouping/1"

#: HDP's code: at most 256 groups, and 20 per device.
MAX_GROUPS, GROUPS_PER_DEVICE = 256, 20


def default_num_groups(num_devices: int) -> int:
    """The default number of placeable groups on ``num_devices`` devices: ``min(256, 20 * num_devices)``.

    The one definition used by ``placer train`` (``--max-groups``), the hierarchical
    policy's grouper and the scaling benchmark.

    >>> default_num_groups(3), default_num_groups(20)
    (60, 256)
    """
    return min(MAX_GROUPS, GROUPS_PER_DEVICE * int(num_devices))


#: Deprecated name of :func:`graphs.ops.base_op_name` (the one definition), kept for one release.
op_base_name = base_op_name


def colocate(graph: OpGraph) -> np.ndarray:
    """Co-location group id of each op (int32), groups numbered by their first op.

    Ops that must share a device are joined (union-find, as connected components):

    * a view op (:func:`graphs.ops.view_mask`) with its producer: the predecessor sending it
      the largest tensor (in ATen a view has one tensor input; other predecessors,
      such as ``sym_size`` scalars, send a few bytes);
    * an in-place op (:func:`graphs.ops.inplace_mask`) with the op whose output it mutates:
      every predecessor sending a tensor as large as the largest one it receives
      (the mutated ``self`` cannot be told apart from an equally large second
      operand, so both are kept with it);
    * a view of a parameter (``w.T`` in ``x @ w.T``), or a check of its metadata,
      with the ops through which its data is read (:func:`graphs.ops.param_paths`):
      the parameter can then have a home apart from them (:mod:`envs.sim.homes`).
      A view several ops read (the query's and the keys' parts of
      ``nn.MultiheadAttention``'s packed weight) is joined with each of them;
      several ops reading one parameter itself (a tied head) are not joined.

    Ops named in ``graph.meta["alias_ops"]`` / ``["inplace_ops"]`` (written by
    capture from torch's op schemas) count as views / in-place ops as well.

    An op and the parameters it owns are one node already. Ops that share a
    parameter are not joined: applying a placement copies a parameter to every
    device that reads it. Joining can make the groups' quotient graph cyclic;
    :func:`coarsen` merges such cycles.

    >>> from graphs.ir import OpGraph
    >>> g = OpGraph.from_edges(["a", "b", "c"], [("a", "b", 8), ("a", "c", 8), ("b", "c", 4)],
    ...                        op_types=["aten.mm.default", "aten.relu.default", "aten.add_.Tensor"])
    >>> colocate(g).tolist()
    [0, 1, 0]
    """
    n = graph.num_ops
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    view, inplace = view_mask(graph), inplace_mask(graph)  # by type, and as capture recorded them
    src, dst, nbytes = graph.edge_src.astype(np.int64), graph.edge_dst.astype(np.int64), graph.edge_bytes
    joins = []
    into_view = np.flatnonzero(view[dst])
    if len(into_view):
        # Per view op, the incoming edge with the most bytes (ties: earliest producer).
        e = into_view[np.lexsort((src[into_view], -nbytes[into_view], dst[into_view]))]
        first = np.r_[True, dst[e][1:] != dst[e][:-1]]
        joins.append(e[first])
    into_inplace = np.flatnonzero(inplace[dst])
    if len(into_inplace):
        largest = np.zeros(n, dtype=np.int64)
        np.maximum.at(largest, dst[into_inplace], nbytes[into_inplace])
        joins.append(into_inplace[nbytes[into_inplace] == largest[dst[into_inplace]]])
    e = np.concatenate(joins) if joins else np.zeros(0, dtype=np.int64)
    chained: list[tuple[int, int]] = []
    check = metadata_mask(graph)
    reads = graph.params if graph.params is not None else ()
    indirect = view | check
    if (indirect & (graph.param_bytes > 0)).any() or any(reads[i] for i in np.flatnonzero(indirect)):  # its paths
        paths = param_paths(graph)
        indptr, succ, _ = graph.out_csr
        for i, ps in paths.items():  # a parameter's view (with each op reading it) or check (with its path)
            if view[i]:
                after = set(succ[indptr[i] : indptr[i + 1]].tolist())
                chained += [(i, path[0]) for path in ps if path[0] in after]
            elif check[i]:
                chained.append((i, ps[0][0]))
        chained += [(a, b) for ps in paths.values() for path in ps for a, b in zip(path, path[1:])]  # and its readers
    a = np.concatenate([src[e], np.array([i for i, _ in chained], dtype=np.int64)])
    b = np.concatenate([dst[e], np.array([u for _, u in chained], dtype=np.int64)])
    adj = coo_matrix((np.ones(len(a), dtype=np.int8), (a, b)), shape=(n, n)).tocsr()
    _, labels = connected_components(adj, directed=False)
    return renumber_by_first_op(labels)


_colocate = colocate  # coarsen's keyword argument shadows the function's name


def coarsen(graph: OpGraph, max_groups: int = 256, *, colocate: bool = True) -> "Grouping":
    """Group ``graph``'s ops into at most ``max_groups`` groups whose graph is a DAG.

    1. Units: the co-location groups (:func:`colocate`; single ops when
       ``colocate=False``). If joining made the units' quotient graph cyclic, each
       strongly connected component of it becomes one unit (recorded in
       ``grouping.graph.meta["merged_cycles"]``).
    2. A depth-first topological order of the units (a successor follows its
       last predecessor when it can, so chains stay adjacent), each unit's ops
       kept together in their original order.
    3. If there are more units than ``max_groups``, the order is cut into
       ``max_groups`` contiguous runs of about equal compute (weight: 90% share of
       FLOPs, 10% share of op count; a unit heavier than a run's share counts as
       exactly one share, so it becomes a run of its own). Each cut goes, within +-30% of a run's
       weight from its ideal spot, where the fewest bytes are live (produced
       before the cut, consumed after it). Contiguous runs of a topological
       order cannot form a cycle.

    Group ids follow the order, so every group edge goes from a lower id to a
    higher one. See :class:`Grouping` for what the group graph holds.
    """
    if int(max_groups) < 1:
        raise PlacerError(f"coarsen: max_groups must be >= 1, got {max_groups}")
    n = graph.num_ops
    unit = _colocate(graph) if colocate else np.arange(n, dtype=np.int32)
    unit, merged_cycles = merge_cycles(graph, unit)
    num_units = int(unit.max()) + 1 if n else 0
    us, ud = unit[graph.edge_src].astype(np.int64), unit[graph.edge_dst].astype(np.int64)
    cross = us != ud
    unit_order, _ = kahn(num_units, us[cross], ud[cross])
    unit_pos = np.empty(num_units, dtype=np.int64)
    unit_pos[np.asarray(unit_order, dtype=np.int64)] = np.arange(num_units)
    order = np.lexsort((np.arange(n), unit_pos[unit]))  # position -> op
    if num_units <= max_groups:
        op_group = unit_pos[unit]
    else:
        cuts = _choose_cuts(graph, order, unit, int(max_groups))
        seg = np.searchsorted(cuts, np.arange(n), side="right")
        op_group = np.empty(n, dtype=np.int64)
        op_group[order] = seg
    meta = {"max_groups": int(max_groups), "colocate": bool(colocate), "merged_cycles": merged_cycles}
    return Grouping.from_assignment(graph, op_group, meta=meta)


class Grouping:
    """A partition of an op graph into groups, and the group-level DAG.

    The group graph (:attr:`graph`, an :class:`OpGraph`) has one op per group,
    named ``g0``, ``g1``... in topological order, with:

    * ``op_types``: the members' type with the most FLOPs (ties: most members);
    * ``flops``, ``param_bytes``, ``buffer_bytes``, profile times: sums over the
      members (a profile time is NaN if any member's is unknown);
    * ``out_bytes``: bytes of the tensors leaving the group, each counted once: a
      member's tensor consumed outside the group (its largest outgoing cross
      edge) or a member with no consumer at all (a graph output);
      ``out_shapes``/``out_dtypes`` list those members' outputs;
    * ``module_paths``: the members' common dotted prefix; ``params``: the union;
    * edges ``A -> B`` with bytes summed over the distinct member tensors of
      ``A`` that ``B`` consumes (a tensor read by two ops of ``B`` counts once);
    * ``meta``: ``member_ops`` and ``member_out_bytes`` (activation bytes) per
      group, the source graph's hash and name, and coarsening options.

    Summing group-edge bytes over groups on other devices counts a tensor once
    per consumer group; :meth:`cut_bytes` counts it once per device, exactly as
    :func:`graphs.group_graph.cut_bytes` does on the expanded op placement.
    """

    def __init__(
        self, op_group: np.ndarray, graph: OpGraph, source_hash: str, *, cut_table: CutTable | None = None
    ) -> None:
        self.op_group = np.asarray(op_group, dtype=np.int32)
        self.graph = graph
        self.source_hash = source_hash
        self._cut_table = cut_table
        members = np.argsort(self.op_group, kind="stable")
        counts = (
            np.bincount(self.op_group, minlength=graph.num_ops)
            if len(self.op_group)
            else np.zeros(graph.num_ops, np.int64)
        )
        self._members = members.astype(np.int64)
        self._indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._first = self._members[self._indptr[:-1]] if graph.num_ops else np.zeros(0, np.int64)

    @classmethod
    def from_assignment(cls, graph: OpGraph, op_group: Any, *, meta: dict | None = None) -> "Grouping":
        """Build from a group id per op (ids 0..G-1, all used).

        Ids are renumbered in topological order of the group graph if they are
        not in it already. Raises :class:`PlacerError` if the groups form a cycle.
        """
        op_group = np.asarray(op_group)
        if op_group.shape != (graph.num_ops,) or op_group.dtype.kind not in "iu":
            raise PlacerError(f"grouping: expected {graph.num_ops} integer group ids, got shape {op_group.shape}")
        num_groups = int(op_group.max()) + 1 if len(op_group) else 0
        if len(op_group) and (op_group.min() < 0 or len(np.unique(op_group)) != num_groups):
            raise PlacerError(f"grouping: group ids must be 0..{num_groups - 1} with every id used")
        op_group = _topological_ids(graph, op_group.astype(np.int64), num_groups)
        group_graph, table = build_group_graph(graph, op_group, num_groups, meta=meta or {})
        return cls(op_group, group_graph, graph.content_hash, cut_table=table)

    # ---------------------------------------------------------------- shape
    @property
    def num_groups(self) -> int:
        return self.graph.num_ops

    @property
    def num_ops(self) -> int:
        return len(self.op_group)

    def __repr__(self) -> str:
        return f"Grouping(ops={self.num_ops}, groups={self.num_groups}, source={self.source_hash})"

    def members(self, g: int) -> np.ndarray:
        """Op indices of group ``g``, ascending."""
        if not 0 <= int(g) < self.num_groups:
            raise PlacerError(f"grouping: no group {g} (there are {self.num_groups})")
        return self._members[self._indptr[g] : self._indptr[g + 1]]

    # ---------------------------------------------------- expand / contract
    def expand(self, group_devices: Any) -> np.ndarray:
        """Device per op from device per group; ``[..., G] -> [..., num_ops]`` (batched)."""
        a = np.asarray(group_devices)
        if a.ndim == 0 or a.shape[-1] != self.num_groups:
            raise PlacerError(
                f"grouping: expected {self.num_groups} group devices in the last axis, got shape {a.shape}"
            )
        return a[..., self.op_group]

    def contract(self, op_devices: Any) -> np.ndarray:
        """Device per group from device per op; ``[..., num_ops] -> [..., G]``.

        Raises :class:`PlacerError` naming a group whose ops are on different devices.
        """
        a = np.asarray(op_devices)
        if a.ndim == 0 or a.shape[-1] != self.num_ops:
            raise PlacerError(f"grouping: expected {self.num_ops} op devices in the last axis, got shape {a.shape}")
        rep = a[..., self._first]
        split = a != rep[..., self.op_group]
        if split.any():
            op = int(np.argwhere(split)[0][-1])
            g = int(self.op_group[op])
            raise PlacerError(
                f"grouping: group g{g} is split across devices (op {op} differs from op {int(self._first[g])})"
            )
        return rep

    def vote(self, op_devices: Any, num_devices: int) -> np.ndarray:
        """Device per group by majority vote of its ops (ties: the lowest device); ``[..., num_ops] -> [..., G]``.

        Unlike :meth:`contract`, a placement that splits a group is accepted (a
        heuristic's placement imitated by a policy over these groups).

        >>> from graphs.synthetic import chain_dag
        >>> grouping = Grouping.from_assignment(chain_dag(4), np.array([0, 0, 0, 1]))
        >>> grouping.vote([[1, 1, 0, 2], [0, 1, 1, 1]], 3).tolist()
        [[1, 2], [1, 1]]
        """
        a = np.asarray(op_devices, dtype=np.int64)
        if a.ndim == 0 or a.shape[-1] != self.num_ops:
            raise PlacerError(f"grouping: expected {self.num_ops} op devices in the last axis, got shape {a.shape}")
        return vote(self.op_group, a, self.num_groups, num_devices)

    def refined(self, graph: OpGraph, op_devices: np.ndarray) -> "Grouping":
        """Each group split into runs (in op order) of constant device under ``op_devices``: see
        :func:`refine_grouping`."""
        return refine_grouping(graph, self, op_devices)

    # ------------------------------------------------------------ cut bytes
    def cut_bytes(self, group_devices: Any) -> np.ndarray:
        """Cut bytes of a group placement (``[G]`` -> scalar, ``[K, G]`` -> ``[K]``), int64.

        Equal to :func:`graphs.group_graph.cut_bytes` of the op graph on ``self.expand(group_devices)``.
        """
        if self._cut_table is None:
            raise PlacerError(
                "grouping: cut_bytes needs the op graph; load the grouping with Grouping.from_dict(doc, graph)"
            )
        a = np.asarray(group_devices)
        if a.ndim == 0 or a.shape[-1] != self.num_groups:
            raise PlacerError(
                f"grouping: expected {self.num_groups} group devices in the last axis, got shape {a.shape}"
            )
        return cut_bytes_batched(self._cut_table, a)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready document (``"format": "placer-grouping/1"``)."""
        doc = self.graph.to_dict()
        doc["hash"] = self.graph.content_hash
        return {"format": FORMAT, "source_hash": self.source_hash, "op_group": self.op_group.tolist(), "graph": doc}

    @classmethod
    def from_dict(cls, doc: Any, graph: OpGraph | None = None, *, source: str = "grouping") -> "Grouping":
        """Inverse of :meth:`to_dict`.

        With the op ``graph`` (checked against the recorded hash) the group graph
        is rebuilt and must match the stored one; without it the stored group
        graph is used and :meth:`cut_bytes` is unavailable.
        """
        schema.document(doc, source, FORMAT, error=GraphFormatError)
        op_group = doc.get("op_group")
        if not isinstance(op_group, list) or not all(type(x) is int for x in op_group):
            raise GraphFormatError(f"{source}: op_group must be a list of integers")
        stored = graph_from_dict(doc.get("graph"), source=f"{source} (group graph)")
        if graph is None:
            if op_group and (min(op_group) < 0 or max(op_group) >= stored.num_ops):
                raise GraphFormatError(f"{source}: op_group names groups outside 0..{stored.num_ops - 1}")
            return cls(np.asarray(op_group, dtype=np.int32), stored, str(doc.get("source_hash", "")))
        if doc.get("source_hash") != graph.content_hash:
            raise GraphFormatError(
                f"{source}: made for graph {doc.get('source_hash')}, not {graph.content_hash} ({graph.name or 'graph'})"
                f"{hash_seed_hint()}"
            )
        rebuilt = cls.from_assignment(
            graph,
            np.asarray(op_group, dtype=np.int64),
            meta={k: v for k, v in stored.meta.items() if k not in _DERIVED_META},
        )
        if rebuilt.graph.content_hash != stored.content_hash or not np.array_equal(rebuilt.op_group, op_group):
            raise GraphFormatError(f"{source}: the stored group graph does not match the op graph's grouping")
        return rebuilt


_DERIVED_META = ("member_ops", "member_out_bytes", "source_hash", "source_name")


def vote(
    op_group: np.ndarray, op_devices: Any, num_groups: int, num_devices: int, weight: np.ndarray | None = None
) -> np.ndarray:
    """Device per group by majority vote of its ops (ties: the lowest device): the one definition of the vote.

    ``op_group`` is a group id per op ``[N]``, or one grouping per row ``[K, N]``;
    ``op_devices`` ``[..., N]`` (one placement per row) gives ``[..., num_groups]``.
    ``weight`` (per op; default 1) weighs each op's vote, e.g. by its compute time.

    >>> vote(np.array([0, 0, 0, 1]), [[1, 1, 0, 2], [0, 1, 1, 1]], 2, 3).tolist()
    [[1, 2], [1, 1]]
    >>> vote(np.array([0, 0, 0]), [2, 1, 1], 1, 3, weight=np.array([5.0, 1.0, 1.0])).tolist()
    [2]
    """
    a = np.asarray(op_devices, dtype=np.int64)
    rows = a.reshape(-1, a.shape[-1])
    groups = np.broadcast_to(np.asarray(op_group), rows.shape)
    w = 1.0 if weight is None else np.broadcast_to(np.asarray(weight, dtype=np.float64), rows.shape)
    votes = np.zeros((len(rows), int(num_groups), int(num_devices)))
    np.add.at(votes, (np.arange(len(rows))[:, None], groups, rows), w)
    return votes.argmax(axis=2).reshape(a.shape[:-1] + (int(num_groups),))


def refine_grouping(graph: OpGraph, grouping: "Grouping", op_devices: np.ndarray) -> "Grouping":
    """Split each group into runs (in op order) of constant device under ``op_devices``.

    The result stays acyclic: groups are numbered topologically and every op edge
    ``u -> v`` has ``u < v``, so ordering the new items by (group, run) is a
    topological order of the refined group graph. A placement that was split
    across a group is then expressed exactly (a warm start's incumbent).

    >>> from graphs.synthetic import random_dag
    >>> g = random_dag(40, seed=0)
    >>> coarse = coarsen(g, 4)
    >>> dev = (np.arange(40) >= 20).astype(np.int32)
    >>> fine = refine_grouping(g, coarse, dev)
    >>> bool((fine.expand(fine.contract(dev)) == dev).all())
    True
    """
    op_group = np.asarray(grouping.op_group, dtype=np.int64)
    dev = np.asarray(op_devices, dtype=np.int64)
    order = np.lexsort((np.arange(len(op_group)), op_group))
    g_sorted, d_sorted = op_group[order], dev[order]
    start = np.ones(len(order), dtype=bool)
    start[1:] = (g_sorted[1:] != g_sorted[:-1]) | (d_sorted[1:] != d_sorted[:-1])
    refined = np.empty(len(order), dtype=np.int64)
    refined[order] = np.cumsum(start) - 1
    return Grouping.from_assignment(graph, refined, meta={**grouping.graph.meta, "refined_by_placement": True})


# ---------------------------------------------------------------------- helpers
def renumber_by_first_op(labels: np.ndarray) -> np.ndarray:
    """Relabel so that group ids increase with each group's first op."""
    _, first = np.unique(labels, return_index=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[labels].astype(np.int32)


def merge_cycles(graph: OpGraph, unit: np.ndarray) -> tuple[np.ndarray, int]:
    """Merge each strongly connected component of the units' quotient graph into one unit."""
    n_units = int(unit.max()) + 1 if len(unit) else 0
    us, ud = unit[graph.edge_src], unit[graph.edge_dst]
    cross = us != ud
    if n_units == 0 or not cross.any():
        return unit, 0
    adj = coo_matrix(
        (np.ones(int(cross.sum()), dtype=np.int8), (us[cross], ud[cross])), shape=(n_units, n_units)
    ).tocsr()
    n_scc, scc = connected_components(adj, directed=True, connection="strong")
    if n_scc == n_units:
        return unit, 0
    merged = int(np.sum(np.bincount(scc) > 1))
    return renumber_by_first_op(scc[unit]), merged


def _topological_ids(graph: OpGraph, op_group: np.ndarray, num_groups: int) -> np.ndarray:
    """Renumber groups in a topological order of their quotient graph; PlacerError on a cycle."""
    gs, gd = op_group[graph.edge_src], op_group[graph.edge_dst]
    cross = gs != gd
    if not bool(np.any(gs[cross] > gd[cross])):
        return op_group
    order, _ = kahn(num_groups, gs[cross], gd[cross])
    if len(order) != num_groups:
        raise PlacerError(
            f"grouping: the groups form a cycle, so the group graph would not be a DAG ({graph.name or 'graph'})"
        )
    new_id = np.empty(num_groups, dtype=np.int64)
    new_id[np.asarray(order, dtype=np.int64)] = np.arange(num_groups)
    return new_id[op_group]


def _water_fill(unit_weight: np.ndarray, max_groups: int) -> np.ndarray:
    """Per-unit scale so no unit outweighs a group's share.

    A unit heavier than a group's budget ``c`` is a group on its own anyway; its
    weight is capped at ``c``, with ``c`` = (weight of the other units) / (groups
    left for them). Without the cap one huge op (a vocabulary projection) would
    swallow most cut targets and leave far fewer than ``max_groups`` groups.
    """
    w = np.sort(unit_weight)[::-1]
    k = min(max_groups, len(w))
    rest = w.sum() - np.concatenate([[0.0], np.cumsum(w[: k - 1])])
    budget = rest / (max_groups - np.arange(k))
    m = int(np.argmax(w[:k] <= budget)) if np.any(w[:k] <= budget) else k - 1
    cap = budget[m]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(unit_weight > cap, cap / unit_weight, 1.0)


def _choose_cuts(
    graph: OpGraph, order: np.ndarray, unit: np.ndarray, max_groups: int, slack: float = 0.3
) -> np.ndarray:
    """Positions (in ``order``) that start groups 1..K-1: balanced weight, few live bytes."""
    n = graph.num_ops
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    total_flops = float(graph.flops.sum())
    weight = np.full(n, 1.0 / n) if total_flops <= 0 else 0.9 * graph.flops / total_flops + 0.1 / n
    weight = weight * _water_fill(np.bincount(unit, weights=weight), max_groups)[unit]
    cum = np.concatenate([[0.0], np.cumsum(weight[order])])
    # Live bytes before position i: tensors made before i and read at or after i.
    src, dst = graph.edge_src.astype(np.int64), graph.edge_dst.astype(np.int64)
    size = np.zeros(n, dtype=np.int64)
    last = np.full(n, -1, dtype=np.int64)
    np.maximum.at(size, src, graph.edge_bytes)
    np.maximum.at(last, src, pos[dst])
    has = last >= 0
    diff = np.zeros(n + 1, dtype=np.int64)
    np.add.at(diff, pos[has] + 1, size[has])
    np.add.at(diff, last[has] + 1, -size[has])
    live = np.cumsum(diff)
    ordered_unit = unit[order]
    cand = np.flatnonzero(ordered_unit[1:] != ordered_unit[:-1]) + 1  # cuts only between units
    cand_w, cand_live = cum[cand], live[cand]
    step = cum[-1] / max_groups
    cuts: list[int] = []
    j_prev = -1
    for k in range(1, max_groups):
        target = k * step
        lo = max(int(np.searchsorted(cand_w, target - slack * step, side="left")), j_prev + 1)
        hi = int(np.searchsorted(cand_w, target + slack * step, side="right"))
        if lo >= len(cand):
            break
        if hi <= lo:  # nothing in the window: the nearest candidate after the last cut
            right = min(int(np.searchsorted(cand_w, target)), len(cand) - 1)
            near = [j for j in (right - 1, right) if j > j_prev]
            j = min(near, key=lambda j: abs(cand_w[j] - target)) if near else j_prev + 1
        else:
            dist = np.abs(cand_w[lo:hi] - target)
            j = lo + int(np.lexsort((dist, cand_live[lo:hi]))[0])
        cuts.append(int(cand[j]))
        j_prev = j
    return np.asarray(cuts, dtype=np.int64)

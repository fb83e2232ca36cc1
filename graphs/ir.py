"""The graph IR: one captured training step as an array-backed DAG of ops.

An :class:`OpGraph` holds ops in topological order (every edge goes from a lower
index to a higher one) with per-op columns as numpy arrays or plain lists, and
edges as three parallel arrays. CSR views of the out- and in-adjacency are built
lazily and cached, so walking a 100,000-op graph costs a few array reads.

Example:
    >>> g = OpGraph.from_edges(["a", "b", "c"], [("a", "b", 8), ("b", "c", 8)],
    ...                        flops=[1.0, 2.0, 3.0])
    >>> g.num_ops, g.num_edges, g.successors(0).tolist()
    (3, 2, [1])
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain
from typing import Any, Iterable, Sequence

import numpy as np

from graphs.dag import csr, cycle_text, find_cycle, kahn
from graphs.errors import GraphFormatError

FORMAT = "placer-graph/1"

# Per-op numeric columns: name -> dtype. All have length num_ops.
_INT_COLS = ("out_bytes", "param_bytes", "buffer_bytes")
_FLOAT_COLS = ("flops",)
#: Per-op columns a profile may give per device kind (seconds; see ``OpGraph.profile``): the whole batch's times, the
#: host's issue times (a GPU profiled in context), and the times on one of ``micro_m`` microbatches (``placer profile
#: --microbatches``; ``micro_m`` is that M, per op).
PROFILE_COLUMNS = ("fwd_s", "bwd_s", "issue_fwd_s", "issue_bwd_s", "micro_fwd_s", "micro_bwd_s", "micro_m")
#: The optional ones: only some devices, or only some profiles, have them.
OPTIONAL_PROFILE_COLUMNS = ("issue_fwd_s", "issue_bwd_s", "micro_fwd_s", "micro_bwd_s", "micro_m")


@dataclass(eq=False)
class OpGraph:
    """One training step of a model, as a DAG of ops in topological order.

    Attributes:
        names: torch.export node name of each op (unique).
        op_types: op type, e.g. ``"aten.mm.default"``.
        out_shapes: per op, the shape of each output tensor.
        out_dtypes: per op, the dtype name of each output tensor.
        out_bytes: bytes of all outputs of each op (int64).
        param_bytes: bytes of trainable parameters each op owns (int64). A
            parameter used by several ops is owned by its first consumer.
        buffer_bytes: bytes of non-trainable buffers each op owns (int64), frozen parameters
            (``requires_grad=False``, named in ``meta["frozen_params"]``) among them.
        flops: forward FLOPs of each op (float64).
        module_paths: dotted module path from ``nn_module_stack`` ("" at top level).
        params: per op, the FQNs of every parameter/buffer it reads (owned or not).
        edge_src, edge_dst: op indices of each edge (int32), ``src < dst``.
        edge_bytes: bytes of the tensor carried by each edge (int64).
        profile: device kind -> {"fwd_s": array, "bwd_s": array}, optionally also
            "issue_fwd_s"/"issue_bwd_s" (host seconds issuing each op on an
            asynchronous device, :func:`envs.sim.cost.issue_times`); NaN = unknown.
        name: a label for the graph (model name).
        meta: free-form metadata (batch size, capture options, ...).
    """

    names: list[str]
    op_types: list[str]
    out_shapes: list[list[list[int]]]
    out_dtypes: list[list[str]]
    out_bytes: np.ndarray
    param_bytes: np.ndarray
    buffer_bytes: np.ndarray
    flops: np.ndarray
    module_paths: list[str]
    params: list[list[str]]
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_bytes: np.ndarray
    profile: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    name: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.out_bytes = np.asarray(self.out_bytes, dtype=np.int64)
        self.param_bytes = np.asarray(self.param_bytes, dtype=np.int64)
        self.buffer_bytes = np.asarray(self.buffer_bytes, dtype=np.int64)
        self.flops = np.asarray(self.flops, dtype=np.float64)
        self.edge_src = np.asarray(self.edge_src, dtype=np.int32).reshape(-1)
        self.edge_dst = np.asarray(self.edge_dst, dtype=np.int32).reshape(-1)
        self.edge_bytes = np.asarray(self.edge_bytes, dtype=np.int64).reshape(-1)
        self.profile = {
            kind: {k: np.asarray(v, dtype=np.float64) for k, v in cols.items()} for kind, cols in self.profile.items()
        }
        self.validate()

    # ------------------------------------------------------------------ build
    @classmethod
    def from_edges(
        cls,
        names: Sequence[str],
        edges: Iterable[tuple[str, str, int]],
        *,
        op_types: Sequence[str] | None = None,
        flops: Sequence[float] | None = None,
        out_bytes: Sequence[int] | None = None,
        param_bytes: Sequence[int] | None = None,
        buffer_bytes: Sequence[int] | None = None,
        module_paths: Sequence[str] | None = None,
        name: str = "",
    ) -> "OpGraph":
        """Build a small graph from op names and ``(src, dst, bytes)`` edges.

        Ops are reordered topologically if needed. Unset columns default to
        zeros / ``"op"``; ``out_bytes`` defaults to the largest outgoing edge.

        >>> g = OpGraph.from_edges(["x", "y"], [("x", "y", 4)])
        >>> int(g.out_bytes[0])
        4
        """
        names = list(names)
        n = len(names)
        index = {nm: i for i, nm in enumerate(names)}
        if len(index) != n:
            raise GraphFormatError("graph: op names are not unique")
        src, dst, nbytes = [], [], []
        for s, d, b in edges:
            if s not in index or d not in index:
                missing = s if s not in index else d
                raise GraphFormatError(f"graph: edge {s}->{d} names unknown op {missing!r}")
            src.append(index[s])
            dst.append(index[d])
            nbytes.append(int(b))
        src_a = np.asarray(src, dtype=np.int64)
        nbytes_a = np.asarray(nbytes, dtype=np.int64)
        if out_bytes is None:
            ob = np.zeros(n, dtype=np.int64)
            if len(src_a):
                np.maximum.at(ob, src_a, nbytes_a)
        else:
            ob = np.asarray(out_bytes, dtype=np.int64)
        z = np.zeros(n, dtype=np.int64)
        fields = dict(
            names=names,
            op_types=list(op_types) if op_types is not None else ["op"] * n,
            out_shapes=[[[int(b) // 4]] for b in ob],
            out_dtypes=[["float32"] for _ in range(n)],
            out_bytes=ob,
            param_bytes=np.asarray(param_bytes, dtype=np.int64) if param_bytes is not None else z,
            buffer_bytes=np.asarray(buffer_bytes, dtype=np.int64) if buffer_bytes is not None else z.copy(),
            flops=np.asarray(flops, dtype=np.float64) if flops is not None else np.zeros(n),
            module_paths=list(module_paths) if module_paths is not None else [""] * n,
            params=[[] for _ in range(n)],
            edge_src=np.asarray(src, dtype=np.int64),
            edge_dst=np.asarray(dst, dtype=np.int64),
            edge_bytes=nbytes_a,
            name=name,
        )
        return cls._from_columns_sorted(fields)

    @classmethod
    def _from_columns_sorted(cls, fields: dict[str, Any]) -> "OpGraph":
        """Construct, reordering ops topologically if some edge goes backwards."""
        src = np.asarray(fields["edge_src"], dtype=np.int64)
        dst = np.asarray(fields["edge_dst"], dtype=np.int64)
        n = len(fields["names"])
        if len(src) and bool(np.any(src >= dst)):
            order = _topological_order(n, src, dst, fields["names"])
            fields = permute(fields, order)
        return cls(**fields)

    # ------------------------------------------------------------- validation
    def validate(self) -> None:
        """Check the contract; raise :class:`GraphFormatError` naming the problem."""
        n = len(self.names)
        label = self.name or "graph"
        for col in ("op_types", "out_shapes", "out_dtypes", "module_paths", "params"):
            if len(getattr(self, col)) != n:
                raise GraphFormatError(f"{label}: column {col!r} has {len(getattr(self, col))} entries, expected {n}")
        for col in _INT_COLS + _FLOAT_COLS:
            arr = getattr(self, col)
            if arr.shape != (n,):
                raise GraphFormatError(f"{label}: column {col!r} has shape {arr.shape}, expected ({n},)")
            if n and (not np.all(np.isfinite(arr)) or arr.min() < 0):
                bad = int(np.argmax(~np.isfinite(arr) | (arr < 0)))
                raise GraphFormatError(f"{label}: op {self.names[bad]!r} has negative or non-finite {col} ({arr[bad]})")
        if len(set(self.names)) != n:
            seen: set[str] = set()
            dup = next(x for x in self.names if x in seen or seen.add(x))  # type: ignore[func-returns-value]
            raise GraphFormatError(f"{label}: duplicate op name {dup!r}")
        _check_outputs(self.names, self.out_shapes, self.out_dtypes, label)
        m = len(self.edge_src)
        if self.edge_dst.shape != (m,) or self.edge_bytes.shape != (m,):
            raise GraphFormatError(
                f"{label}: edge arrays have different lengths "
                f"(src {m}, dst {len(self.edge_dst)}, bytes {len(self.edge_bytes)})"
            )
        if m:
            lo = min(int(self.edge_src.min()), int(self.edge_dst.min()))
            hi = max(int(self.edge_src.max()), int(self.edge_dst.max()))
            if lo < 0 or hi >= n:
                bad = int(
                    np.argmax((self.edge_src < 0) | (self.edge_src >= n) | (self.edge_dst < 0) | (self.edge_dst >= n))
                )
                raise GraphFormatError(
                    f"{label}: edge {bad} ({int(self.edge_src[bad])}->{int(self.edge_dst[bad])}) is dangling: "
                    f"op indices must be in [0, {n})"
                )
            if self.edge_bytes.min() < 0:
                bad = int(np.argmax(self.edge_bytes < 0))
                raise GraphFormatError(
                    f"{label}: edge {self.names[self.edge_src[bad]]}->{self.names[self.edge_dst[bad]]} has "
                    "negative bytes"
                )
            back = self.edge_src >= self.edge_dst
            if back.any():
                cycle = find_cycle(n, self.edge_src, self.edge_dst)
                if cycle:
                    raise GraphFormatError(f"{label}: the edges contain a cycle ({cycle_text(cycle, self.names)})")
                bad = int(np.argmax(back))
                raise GraphFormatError(
                    f"{label}: ops are not in topological order "
                    f"(edge {self.names[self.edge_src[bad]]}->{self.names[self.edge_dst[bad]]} goes backwards)"
                )
        for kind, cols in self.profile.items():
            for k, arr in cols.items():
                if k not in PROFILE_COLUMNS:
                    raise GraphFormatError(
                        f"{label}: profile[{kind!r}] has unknown column {k!r} (expected {', '.join(PROFILE_COLUMNS)})"
                    )
                if arr.shape != (n,):
                    raise GraphFormatError(f"{label}: profile[{kind!r}][{k!r}] has shape {arr.shape}, expected ({n},)")
                if np.any(arr[~np.isnan(arr)] < 0):
                    raise GraphFormatError(f"{label}: profile[{kind!r}][{k!r}] has negative times")

    # -------------------------------------------------------------- structure
    @property
    def num_ops(self) -> int:
        return len(self.names)

    @property
    def num_edges(self) -> int:
        return len(self.edge_src)

    def __len__(self) -> int:
        return self.num_ops

    def __repr__(self) -> str:
        return f"OpGraph(name={self.name!r}, ops={self.num_ops}, edges={self.num_edges}, hash={self.content_hash[:12]})"

    @cached_property
    def index(self) -> dict[str, int]:
        """Op name -> op index."""
        return {nm: i for i, nm in enumerate(self.names)}

    @cached_property
    def out_csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(indptr, dst, edge_id): successors of op i are dst[indptr[i]:indptr[i+1]]."""
        return csr(self.num_ops, self.edge_src, self.edge_dst)

    @cached_property
    def in_csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(indptr, src, edge_id): predecessors of op i are src[indptr[i]:indptr[i+1]]."""
        return csr(self.num_ops, self.edge_dst, self.edge_src)

    def successors(self, i: int) -> np.ndarray:
        indptr, nbr, _ = self.out_csr
        return nbr[indptr[i] : indptr[i + 1]]

    def predecessors(self, i: int) -> np.ndarray:
        indptr, nbr, _ = self.in_csr
        return nbr[indptr[i] : indptr[i + 1]]

    @property
    def total_flops(self) -> float:
        return float(self.flops.sum())

    @property
    def total_param_bytes(self) -> int:
        return int(self.param_bytes.sum())

    # ------------------------------------------------------------------ hash
    def to_dict(self) -> dict[str, Any]:
        """The JSON document (placer-graph/1), without the hash."""

        def col(a: np.ndarray) -> list:
            return a.tolist()

        prof = {
            kind: {k: [None if np.isnan(x) else float(x) for x in arr.tolist()] for k, arr in cols.items()}
            for kind, cols in sorted(self.profile.items())
        }
        return {
            "format": FORMAT,
            "name": self.name,
            "meta": self.meta,
            "ops": {
                "name": list(self.names),
                "type": list(self.op_types),
                "shapes": self.out_shapes,
                "dtypes": self.out_dtypes,
                "out_bytes": col(self.out_bytes),
                "param_bytes": col(self.param_bytes),
                "buffer_bytes": col(self.buffer_bytes),
                "flops": col(self.flops),
                "module": list(self.module_paths),
                "params": self.params,
            },
            "edges": {"src": col(self.edge_src), "dst": col(self.edge_dst), "bytes": col(self.edge_bytes)},
            "profile": prof,
        }

    @cached_property
    def content_hash(self) -> str:
        """sha256 of the canonical JSON document (hex, 16 chars).

        The hash covers the ops and edges only: ``profile`` and ``meta`` are left
        out, so a placement made for a graph stays valid after the graph is
        profiled (timings added) or relabelled.
        """
        return _hash_doc(self.to_dict())

    def invalidate(self) -> None:
        """Drop cached derived data after mutating columns in place."""
        for attr in ("content_hash", "index", "out_csr", "in_csr"):
            self.__dict__.pop(attr, None)

    # ------------------------------------------------------------- networkx
    def to_networkx(self):
        """A ``networkx.DiGraph`` with op attributes on nodes and ``bytes`` on edges.

        >>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)])
        >>> g2 = OpGraph.from_networkx(g.to_networkx())
        >>> g2.content_hash == g.content_hash
        True
        """
        import networkx as nx  # networkx: only for the conversion

        G = nx.DiGraph(name=self.name, meta=self.meta)
        for i, nm in enumerate(self.names):
            attrs = dict(
                op_type=self.op_types[i],
                shapes=self.out_shapes[i],
                dtypes=self.out_dtypes[i],
                out_bytes=int(self.out_bytes[i]),
                param_bytes=int(self.param_bytes[i]),
                buffer_bytes=int(self.buffer_bytes[i]),
                flops=float(self.flops[i]),
                module_path=self.module_paths[i],
                params=list(self.params[i]),
                index=i,
            )
            for kind, cols in self.profile.items():
                for k, arr in cols.items():
                    attrs[f"profile:{kind}:{k}"] = float(arr[i])
            G.add_node(nm, **attrs)
        for e, (s, d, b) in enumerate(zip(self.edge_src.tolist(), self.edge_dst.tolist(), self.edge_bytes.tolist())):
            G.add_edge(self.names[s], self.names[d], bytes=int(b), index=e)
        return G

    @classmethod
    def from_networkx(cls, G) -> "OpGraph":
        """Inverse of :meth:`to_networkx`; missing attributes default to zero."""
        import networkx as nx  # networkx: only for the conversion

        if not nx.is_directed_acyclic_graph(G):
            cycle = nx.find_cycle(G)
            raise GraphFormatError(f"graph: networkx graph has a cycle through {cycle[0][0]!r}")
        nodes = list(G.nodes)
        if all("index" in G.nodes[v] for v in nodes):
            nodes.sort(key=lambda v: G.nodes[v]["index"])
        else:
            nodes = list(nx.topological_sort(G))
        idx = {v: i for i, v in enumerate(nodes)}
        nd = [G.nodes[v] for v in nodes]
        profile: dict[str, dict[str, np.ndarray]] = {}
        for i, a in enumerate(nd):
            for key, val in a.items():
                if key.startswith("profile:"):
                    _, kind, k = key.split(":", 2)
                    profile.setdefault(kind, {}).setdefault(k, np.full(len(nodes), np.nan))[i] = val
        # Edge order is part of the hashed document: keep the order to_networkx
        # recorded, else sort by (src, dst) so the result does not depend on how
        # the DiGraph was filled.
        edata = list(G.edges(data=True))
        if all("index" in a for _, _, a in edata):
            edata.sort(key=lambda e: e[2]["index"])
        else:
            edata.sort(key=lambda e: (idx[e[0]], idx[e[1]]))
        edges = [(s, d, a.get("bytes", 0)) for s, d, a in edata]
        fields = dict(
            names=[str(v) for v in nodes],
            op_types=[a.get("op_type", "op") for a in nd],
            out_shapes=[a.get("shapes", [[]]) for a in nd],
            out_dtypes=[a.get("dtypes", ["float32"]) for a in nd],
            out_bytes=[a.get("out_bytes", 0) for a in nd],
            param_bytes=[a.get("param_bytes", 0) for a in nd],
            buffer_bytes=[a.get("buffer_bytes", 0) for a in nd],
            flops=[a.get("flops", 0.0) for a in nd],
            module_paths=[a.get("module_path", "") for a in nd],
            params=[list(a.get("params", [])) for a in nd],
            edge_src=np.asarray([idx[s] for s, _, _ in edges], dtype=np.int64),
            edge_dst=np.asarray([idx[d] for _, d, _ in edges], dtype=np.int64),
            edge_bytes=np.asarray([b for _, _, b in edges], dtype=np.int64),
            profile=profile,
            name=G.graph.get("name", ""),
            meta=dict(G.graph.get("meta", {})),
        )
        return cls._from_columns_sorted(fields)


# ---------------------------------------------------------------------- helpers
_UNHASHED_KEYS = ("hash", "profile", "meta", "name")


def _hash_doc(doc: dict[str, Any]) -> str:
    doc = {k: v for k, v in doc.items() if k not in _UNHASHED_KEYS}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _topological_order(n: int, src: np.ndarray, dst: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """Depth-first Kahn order; raises GraphFormatError naming the ops on a cycle."""
    order, _ = kahn(n, np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64))
    if len(order) != n:
        cycle = find_cycle(n, src, dst)
        raise GraphFormatError(f"graph: the edges contain a cycle ({cycle_text(cycle, names)})")
    return np.asarray(order, dtype=np.int64)


def _check_outputs(names: Sequence[str], shapes: Sequence, dtypes: Sequence, label: str) -> None:
    """Each op's shapes: a list of lists of sizes >= 0; dtypes: one string per shape.

    A vectorised pass first (100,000 ops in ~30 ms); the per-op loop only runs to
    name the offending op once something is known to be wrong.
    """
    try:
        if list(map(len, shapes)) == list(map(len, dtypes)) and set(map(type, chain.from_iterable(dtypes))) <= {str}:
            dims = np.asarray(list(chain.from_iterable(chain.from_iterable(shapes))))
            if dims.dtype.kind in "iu" and (dims.size == 0 or dims.min() >= 0) or dims.size == 0:
                return
    except TypeError:
        pass
    for i, (shp, dts) in enumerate(zip(shapes, dtypes)):
        if (
            not isinstance(shp, list)
            or not isinstance(dts, list)
            or len(shp) != len(dts)
            or not all(isinstance(d, str) for d in dts)
        ):
            raise GraphFormatError(
                f"{label}: op {names[i]!r} needs a list of output shapes and a dtype string per shape "
                f"(got shapes {shp!r}, dtypes {dts!r})"
            )
        for dims in shp:
            if not isinstance(dims, list) or not all(type(d) is int and d >= 0 for d in dims):
                raise GraphFormatError(
                    f"{label}: op {names[i]!r} has an output shape {dims!r} that is not a list of sizes >= 0"
                )


def permute(fields: dict[str, Any], order: np.ndarray) -> dict[str, Any]:
    """Reorder per-op columns by ``order`` (new position -> old index) and remap edges."""
    out = dict(fields)
    old_to_new = np.empty_like(order)
    old_to_new[order] = np.arange(len(order))
    for key in ("names", "op_types", "out_shapes", "out_dtypes", "module_paths", "params"):
        col = fields[key]
        out[key] = [col[i] for i in order]
    for key in _INT_COLS + _FLOAT_COLS:
        out[key] = np.asarray(fields[key])[order]
    if fields.get("profile"):
        out["profile"] = {
            k: {c: np.asarray(a)[order] for c, a in cols.items()} for k, cols in fields["profile"].items()
        }
    out["edge_src"] = old_to_new[np.asarray(fields["edge_src"], dtype=np.int64)]
    out["edge_dst"] = old_to_new[np.asarray(fields["edge_dst"], dtype=np.int64)]
    return out

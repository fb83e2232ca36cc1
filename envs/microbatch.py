"""Microbatched (pipelined) steps: the op graph of M microbatches, and its issue order.

A plan with ``microbatches = M`` runs one training step as M microbatches of
the batch (split along its batch dimension) through the same placement, the
gradients accumulating into the shared parameters, then one optimizer step.
The simulator scores it by scheduling an expanded graph with the ordinary
schedulers of :mod:`envs.sim.schedule` / :mod:`envs.sim.kernel`:

* M copies of every op, copy ``m`` of op ``i`` at index ``m * n + i`` (named
  ``"{name}@mb{m}"``); copy ``m`` has the edges of the original graph among the
  copies ``m`` and no edge to another copy (microbatches are independent until
  their gradients meet in the parameters);
* activations, edges and FLOPs scaled by ``1/M`` (byte counts rounded up): every
  op is taken to work along the batch. Ops that do not (a rotary table, a causal
  mask) are overcharged nothing and undercharged their full cost ``(M-1)/M`` times:
  a documented simplification;
* parameters, buffers, their gradients and the optimizer state belong to copy 0
  only: static memory and the optimizer update are counted once. The accumulation
  of the M gradients adds into the same buffer (no memory; its adds are not charged).
  Each copy still reads the weights it uses: :func:`microbatch_op_times` charges
  the full parameter bytes to every copy's memory traffic, so a memory-bound op
  (a matrix-vector product at a small microbatch) does not get faster with M;
* the issue order (:func:`expand_order`): the host issues microbatch 0's ops in
  the plan's order, then microbatch 1's, and so on; the in-order GPU streams then
  run microbatch ``m+1``'s first stage while microbatch ``m`` is on the next one.
  When backward runs is the plan's *in-flight window* ``W`` (``1 <= W <= M``,
  :func:`issue_segments`):

  - ``W = M``, fill-drain (GPipe, the default): every forward, then one
    ``backward()`` over all of them, which autograd (reverse issue order per
    device) drains from the last microbatch back;
  - ``W < M``, one-forward-one-backward (1F1B): a microbatch's issue order is cut
    into stages (:func:`stage_starts`: a new stage where the next GPU differs
    from the previous one), and the host issues stage ``c`` of microbatch ``m``
    only after the ``backward()`` of microbatch ``m - w_c``, with the warm-up
    ``w_c = min(W, K - c)`` for K stages. Every stage's stream then runs ``w_c``
    forwards, then alternates one backward and one forward, as 1F1B does (each
    round's stages issued oldest microbatch first): stage
    ``c`` holds at most ``w_c`` microbatches' activations, the first stage the
    most (``min(W, K)``), the last one. ``W >= K`` is the textbook 1F1B. The
    host thread issues stages of different microbatches between ``backward()``
    calls; the backward of the microbatches still in flight after the last
    forward is one call.

  Every microbatch's activations are alive from its forward to its backward, so
  the memory sweep counts the activations of every microbatch in flight.

>>> from graphs import OpGraph
>>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 8)], flops=[4.0, 2.0], param_bytes=[16, 0])
>>> x = microbatch_graph(g, 2)
>>> x.names, x.edge_src.tolist(), x.edge_dst.tolist(), x.edge_bytes.tolist()
(['a@mb0', 'b@mb0', 'a@mb1', 'b@mb1'], [0, 2], [1, 3], [4, 4])
>>> x.flops.tolist(), x.param_bytes.tolist()
([2.0, 1.0, 2.0, 1.0], [16, 0, 0, 0])
>>> expand_order([1, 0], 2, 3).tolist()
[1, 0, 3, 2, 5, 4]
>>> issue_segments(2, 3, 1).tolist()  # one stage: F0 B0 F1 B1 F2 B2 (kind 0: forward, 1: backward; positions)
[[0, 0, 2], [1, 0, 2], [0, 2, 4], [1, 2, 4], [0, 4, 6], [1, 4, 6]]
>>> issue_segments(2, 3, 2, [0, 1]).tolist()  # two stages of one op: F0.0 F0.1 F1.0 | B0 F1.1 F2.0 | B1 F2.1 | B2
[[0, 0, 1], [0, 1, 2], [0, 2, 3], [1, 0, 2], [0, 3, 4], [0, 4, 5], [1, 2, 4], [0, 5, 6], [1, 4, 6]]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphs.errors import PlacerError
from graphs.ir import OpGraph
from graphs.plan import MAX_MICROBATCHES, check_inflight, check_microbatches
from graphs.schema import check_int


def plan_shapes(microbatches: list[int], windows: list[int | None]) -> list[tuple[int, int]]:
    """Every ``(M, W)`` to try: each M with each window (None: all M, fill-drain; larger than M: M), once each."""
    return list(dict.fromkeys((M, M if w is None else min(w, M)) for M in microbatches for w in windows))


def parse_windows(text: str, option: str = "--inflight") -> list[int | None]:
    """``"2,4,all"`` -> ``[2, 4, None]`` (None: all in flight); anything else a one-line PlacerError naming
    ``option``."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items or not all(t.isdigit() or t == "all" for t in items):
        raise PlacerError(f"{option} {text!r}: give whole numbers or 'all' separated by commas, e.g. 2,4,all")
    return [None if t == "all" else check_int(int(t), option, least=1, most=MAX_MICROBATCHES) for t in items]


def _ceil_div(a: np.ndarray, m: int) -> np.ndarray:
    return -(-np.asarray(a, dtype=np.int64) // m)


def microbatch_graph(graph: OpGraph, microbatches: int) -> OpGraph:
    """The graph of one step of ``microbatches`` microbatches (see the module doc); the graph itself for 1."""
    M = check_microbatches(microbatches)
    if M == 1:
        return graph
    n = graph.num_ops
    zeros = np.zeros(n * (M - 1), dtype=np.int64)
    shift = (np.arange(M, dtype=np.int64) * n)[:, None]
    return OpGraph(
        names=[f"{name}@mb{m}" for m in range(M) for name in graph.names],
        op_types=list(graph.op_types) * M,
        out_shapes=[list(s) for s in graph.out_shapes] * M,
        out_dtypes=[list(d) for d in graph.out_dtypes] * M,
        out_bytes=np.tile(_ceil_div(graph.out_bytes, M), M),
        param_bytes=np.concatenate([graph.param_bytes, zeros]),
        buffer_bytes=np.concatenate([graph.buffer_bytes, zeros]),
        flops=np.tile(graph.flops / M, M),
        module_paths=list(graph.module_paths) * M,
        params=[list(p) for p in graph.params] * M,
        edge_src=(graph.edge_src[None, :].astype(np.int64) + shift).reshape(-1),
        edge_dst=(graph.edge_dst[None, :].astype(np.int64) + shift).reshape(-1),
        edge_bytes=np.tile(_ceil_div(graph.edge_bytes, M), M),
        name=f"{graph.name}@{M}mb" if graph.name else f"graph@{M}mb",
        meta={**graph.meta, "microbatches": M},
    )


def expand_order(order: Any, num_ops: int, microbatches: int) -> np.ndarray:
    """The fill-drain issue order of the expanded graph: ``order`` for microbatch 0, then 1, ...

    ``order`` (op indices of the original graph, already checked) may be None
    (node order) or 2-D (one order per row); the result has ``num_ops * M`` columns.
    """
    M = int(microbatches)
    base = np.arange(num_ops, dtype=np.int64) if order is None else np.asarray(order, dtype=np.int64)
    shift = np.arange(M, dtype=np.int64) * num_ops
    if base.ndim == 2:
        return (base[:, None, :] + shift[None, :, None]).reshape(base.shape[0], -1)
    return (base[None, :] + shift[:, None]).reshape(-1)


#: Segment kinds of :func:`issue_segments`.
FORWARD, BACKWARD = 0, 1


def stage_starts(op_devices: Any, order: Any, host: Any, free: Any) -> np.ndarray:
    """Where a microbatch's stages begin: positions in its issue ``order`` (0 first).

    ``op_devices``: device index per op; ``host``: True per host device; ``free``: True
    per op that takes no time (:func:`graphs.ops.free_mask`). A new stage begins at
    every op that runs on a GPU other than the previous GPU op's; host ops and ops
    that take no time belong to the stage they are issued in. A pipeline of S
    GPUs has S stages; a placement that goes back and forth between GPUs has more.
    """
    issued = np.asarray(order, dtype=np.int64)
    device_index = np.asarray(op_devices, dtype=np.int64)[issued]  # of each op, in issue order
    on_gpu = np.flatnonzero(~np.asarray(host, dtype=bool)[device_index] & ~np.asarray(free, dtype=bool)[issued])
    gpus = device_index[on_gpu]
    change = on_gpu[1:][gpus[1:] != gpus[:-1]]
    return np.concatenate([[0], change]).astype(np.int64)


def issue_segments(num_ops: int, microbatches: int, inflight: int | None = None, starts: Any = None) -> np.ndarray:
    """The host thread's program for a step: ``[S, 3]`` rows ``(kind, lo, hi)`` over issue positions.

    Positions ``m * num_ops .. (m+1) * num_ops`` of the expanded issue order
    (:func:`expand_order`) are microbatch ``m``'s ops. Kind :data:`FORWARD`
    issues their forwards in order; :data:`BACKWARD` is one ``backward()`` call
    over them. ``inflight`` W (default M; see the module doc): ``W = M`` is
    fill-drain (one forward segment, one backward); ``W < M`` one-forward-one-
    backward over the stages beginning at ``starts`` (positions within a
    microbatch, :func:`stage_starts`; default one stage).
    """
    M = check_microbatches(microbatches)
    W = check_inflight(inflight, M)
    n = int(num_ops)
    if W == M:
        return np.array([[FORWARD, 0, M * n], [BACKWARD, 0, M * n]], dtype=np.int64)
    bounds = [int(s) for s in (np.asarray(starts).tolist() if starts is not None else [0])] + [n]
    K = len(bounds) - 1
    warm = [min(W, K - c) for c in range(K)]
    items: list[tuple[int, int, int]] = []

    def forward(m: int, c: int) -> None:
        items.append((FORWARD, m * n + bounds[c], m * n + bounds[c + 1]))

    for m in range(warm[0]):  # warm-up: stage c takes microbatches 0 .. w_c - 1 (w_c never grows with c)
        for c in range(K):
            if m < warm[c]:
                forward(m, c)
    for j in range(M):
        items.append((BACKWARD, j * n, (j + 1) * n))
        # then the stages now due, oldest microbatch first: a stage's input copy is queued on the previous
        # stage's stream, so it must not wait behind a younger microbatch's work there
        for m, c in sorted((j + warm[c], c) for c in range(K) if j + warm[c] < M):
            forward(m, c)
    # the backwards after the last forward are one call (what loss.backward() runs)
    last = max(i for i, it in enumerate(items) if it[0] == FORWARD)
    tail = items[last + 1 :]
    items = items[: last + 1] + [(BACKWARD, tail[0][1], tail[-1][2])]
    return np.array(items, dtype=np.int64)

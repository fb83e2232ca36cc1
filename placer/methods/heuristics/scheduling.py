"""What a list scheduler (HEFT, Baechi's m-ETF and m-SCT) charges for a parameter read on another device."""

from __future__ import annotations

import numpy as np

from graphs import OpGraph, PlacerError
from graphs.ops import param_reads


class ParamCopies:
    """What a list scheduler charges for reading a shared parameter on another device.

    :func:`placer.apply` keeps a parameter read by several ops on its owner's
    device and gives every other device that reads it one copy, whose gradient
    is sent back (:func:`graphs.ops.param_reads`). A TensorFlow graph, which the
    list schedulers were written for, has the same reads as edges from a variable
    op, and its runtime also sends a tensor once per device. So a reader on a
    device that has no copy yet starts later by the copy's forward and backward
    transfer time over the owner's link (as a cut edge is charged, both
    directions); once one reader is placed there, later ones read that copy free.
    ``enabled=False``, or a graph without shared parameters, charges nothing.

    >>> from graphs import OpGraph
    >>> g = OpGraph.from_edges(["a", "b", "c"], [("a", "b", 4), ("b", "c", 4)], param_bytes=[100, 0, 0])
    >>> g.params = [["w"], [], ["w"]]
    >>> pc = ParamCopies(g, 2)
    >>> spb, lat = np.array([[0.0, 0.01], [0.01, 0.0]]), np.zeros((2, 2))
    >>> dev = np.array([0, 1, -1])
    >>> pc.delay(2, dev, spb, lat).tolist()  # c reads a's weights: free on device 0, a copy of 100 bytes to 1
    [0.0, 1.0]
    >>> pc.placed(2, 1); pc.delay(2, dev, spb, lat).tolist()
    [0.0, 0.0]
    """

    def __init__(self, graph: OpGraph, num_devices: int, enabled: bool = True) -> None:
        if not isinstance(enabled, (bool, np.bool_)):
            raise PlacerError(f"--option param_copies={enabled!r}: expected true or false")
        self.num_devices = num_devices
        self.reads: dict[int, list[tuple[int, float]]] = {}
        self.have: dict[int, np.ndarray] = {}  # owner -> candidate devices that already hold a copy
        self.readers: dict[int, list[int]] = {}  # owner -> the ops that read its parameters
        if enabled:
            owner, reader, nbytes = param_reads(graph)
            for o, r, b in zip(owner.tolist(), reader.tolist(), nbytes.tolist()):
                self.reads.setdefault(r, []).append((o, float(b)))
                self.readers.setdefault(o, []).append(r)
        self.kept = np.zeros((graph.num_ops, num_devices))  # delay() of each op, where self.fresh says it holds
        self.fresh = np.zeros(graph.num_ops, dtype=bool)

    def delay(self, op: int, dev: np.ndarray, spb: np.ndarray, lat: np.ndarray) -> np.ndarray | float:
        """Seconds added to ``op``'s start on each candidate device (0.0 when it reads nothing shared).

        ``dev``: the candidate index of every op placed so far (-1 if not yet);
        ``spb``/``lat``: :func:`link_arrays` (both directions already). A parameter
        whose owner is not placed yet charges nothing.
        """
        reads = self.reads.get(op)
        if not reads:
            return 0.0
        extra = np.zeros(self.num_devices)
        for o, nbytes in reads:
            home = int(dev[o])
            if home >= 0:  # the cost is 0 on the owner's own device (no link to itself)
                cost = nbytes * spb[home] + lat[home]
                have = self.have.get(o)
                extra += cost if have is None else np.where(have, 0.0, cost)
        return extra

    def delays(self, ops: np.ndarray, dev: np.ndarray, spb: np.ndarray, lat: np.ndarray) -> np.ndarray:
        """``[len(ops), num_devices]``: :meth:`delay` of each op, each computed once and kept until :meth:`placed`
        changes what it depends on (where its owners are, which devices hold their copies).

        A list scheduler asks for every ready op's delays at every step; most do not change between steps.

        >>> from graphs import OpGraph
        >>> g = OpGraph.from_edges(["a", "b", "c"], [("a", "b", 4), ("b", "c", 4)], param_bytes=[100, 0, 0])
        >>> g.params = [["w"], [], ["w"]]
        >>> pc = ParamCopies(g, 2)
        >>> spb, lat = np.array([[0.0, 0.01], [0.01, 0.0]]), np.zeros((2, 2))
        >>> dev = np.array([-1, -1, -1])
        >>> pc.delays(np.array([1, 2]), dev, spb, lat).tolist()  # a not placed yet: nothing charged
        [[0.0, 0.0], [0.0, 0.0]]
        >>> dev[0] = 0; pc.placed(0, 0); pc.delays(np.array([2]), dev, spb, lat).tolist()
        [[0.0, 1.0]]
        """
        stale = ops[~self.fresh[ops]]
        for op in stale.tolist():
            self.kept[op] = self.delay(op, dev, spb, lat)
        self.fresh[stale] = True
        return self.kept[ops]

    def placed(self, op: int, d: int) -> None:
        """``op`` went to candidate ``d``: the parameters it reads are on ``d`` from now on. The delays kept for
        the readers of its own parameters and of those it reads are computed again when next asked."""
        for o, _ in self.reads.get(op, ()):
            self.have.setdefault(o, np.zeros(self.num_devices, dtype=bool))[d] = True
            self.fresh[self.readers[o]] = False
        self.fresh[self.readers.get(op, [])] = False

"""Parameter homes under the eager executor: parameters that live on the host and are read on a GPU (the reference).

A plan may give an op's parameters a *home* apart from its device
(:attr:`graphs.plan.Placement.param_homes`, per op :meth:`~graphs.plan.Placement.home_indices`).
An op ``i`` on a GPU ``d`` whose parameters (``B = param_bytes[i]``) live on a host
device ``c`` is *offloaded*; :mod:`envs.real.homes` runs it, and the simulator
charges what that runtime does:

* **state**: the weights, their gradients and Adam's two moments (``4 B``) live on
  ``c``, not ``d``: static bytes and the optimizer step's time count on ``c``
  (:func:`param_devices`). Buffers stay with the op.
* **forward**: right before the host issues op ``i`` (after its input copies), it
  issues the copy of its parameters ``c -> d`` on ``d``'s side stream, from pinned
  memory (no host time): ``start = max(h, L[c, d], guard)``, ``end = start +
  latency + B / bandwidth``, where ``guard`` is the end of the forward of the
  reader of the copy made two before on ``d`` (the side stream waits for it: the
  runtime frees that copy there, so at most two are live). Op ``i``'s kernel
  starts no earlier than ``end``. The copy is live on ``d`` from its start until
  op ``i``'s forward ends.
* **backward**: when ``d``'s autograd worker picks ``bwd i`` (at ``now``), the
  copy is made again first (the runtime's pre-hook): ``start = max(now, L[c, d],
  guard)``, ``guard`` the end of the backward of the reader of the copy made two
  before on ``d`` in the backward; ``bwd i``'s kernel starts no earlier than its
  end. Live from its start until ``bwd i`` ends. An op of a checkpointed block has
  this copy made in its block's recompute instead (:mod:`envs.sim.checkpointing`).
  The forward's last two readers on ``d`` (the copies live in its window when the
  forward ends: a language model's head, read again right after the loss) keep
  their forward's copy for the backward instead: no copy is made (zero-length at
  ``now``, its kernel waits for nothing), the side stream waits for ``guard`` all
  the same (the copy joins the backward's window), and the forward's copy is live
  until ``bwd i`` ends.
* **gradient**: ``bwd i`` makes it on ``d`` (``B`` bytes from its start); once its
  kernel ends it is copied home on a side stream, on no thread: ``start = max(bwd
  end, L[d, c])``. Live on ``d`` until that copy ends; ``backward()`` returns no
  earlier than the last one (the runtime waits for them at the end of the call).

An op without a backward (:func:`graphs.ops.grad_mask`) has no second copy and no
gradient. Homes are decided per owner op (its first reader,
:func:`graphs.ops.param_owners`).

Frozen parameters (``requires_grad=False``: a frozen backbone, LoRA's base weights) live apart the same way where an
op owns only frozen ones (:func:`graphs.ops.frozen_home_bytes`; ``B`` is then what it holds,
:func:`graphs.ops.home_bytes`): their home holds ``B`` bytes (no gradient, no optimizer state); they are copied in
for the forward, and again for the backward where their reader has one (its input's gradient reads them), but no
gradient goes home (its copy zero-length at the kernel's end) and no step is taken.

The copies above are made for each op that reads the parameters' data
(:func:`copy_pairs`, :func:`graphs.ops.param_paths`): the owner itself; for a view of
them (``x @ w.T``) or a check of their metadata (``w.to(dtype)`` exports one), the op
at the end of the views, with the bytes of the last view where they are fewer (the part
it reads: ``nn.MultiheadAttention``'s query part of its packed projection, a third); and
every other op reading them (a tied head, a layer applied twice), with the share of the
bytes it reads. Each such op's copies carry its own
parameters' bytes too where they live apart (:func:`copy_rows`); the state stays the
owner's. Every op on those paths must be on the owner's device (:func:`chain_pairs`;
co-location keeps views with their readers). A path whose views branch, and several
readers of an owner that holds buffers, leave no home apart (:func:`homeable`).
:mod:`envs.sim.kernel_homes` computes the same times compiled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from graphs.errors import PlacerError
from graphs.ir import OpGraph
from graphs.ops import home_bytes, param_paths, param_reads, strided_mask, view_mask

if TYPE_CHECKING:
    from envs.cluster import Cluster
    from envs.sim.simulator import SimEnv
    from envs.sim.tasks import Schedule


class HomeTimes(NamedTuple):
    """The home copies of one simulated step, one entry per op they are made for (op order: an offloaded op, or the
    reader of parameters read through views), and the offloaded ops."""

    op: np.ndarray  # the ops the copies are made for
    home: np.ndarray  # the device the parameters copied live on
    nbytes: np.ndarray  # the bytes copied
    fetch_start_s: np.ndarray  # the copy home -> device before the forward
    fetch_end_s: np.ndarray
    refetch_start_s: np.ndarray  # the copy again before the backward (= its start and end without a backward)
    refetch_end_s: np.ndarray
    grad_start_s: np.ndarray  # the gradient's copy home
    grad_end_s: np.ndarray
    owner: np.ndarray  # the offloaded ops: those whose parameters, gradients and optimizer state live apart
    owner_home: np.ndarray  # where
    grad_nbytes: np.ndarray  # the bytes of the gradient sent home (0 for frozen parameters' copies)
    kept: np.ndarray  # bool: the forward's copy kept for the backward (no copy again; its refetch times zero-length)


class HostSteps(NamedTuple):
    """The optimizer steps of the offloaded ops' parameters taken during the backward (a plan's ``host_step``
    ``"backward"``, :func:`host_steps`), one per offloaded op, in the order they run (an op's share of its batch's
    call: the first of each home in a batch carries the call's fixed cost)."""

    owner: np.ndarray  # the offloaded op whose parameters are stepped
    home: np.ndarray  # where they live (the step runs there)
    start_s: np.ndarray
    end_s: np.ndarray
    batch: np.ndarray  # the worker's batch it was stepped in (0, 1, ...): one optimizer call per batch and home


def no_host_steps() -> HostSteps:
    """The :class:`HostSteps` of a step that takes none during the backward."""
    z, i = np.zeros(0), np.zeros(0, dtype=np.int64)
    return HostSteps(i, i.copy(), z, z.copy(), i.copy())


def host_steps(
    times: "HomeTimes", pairs: tuple[np.ndarray, np.ndarray], param_bytes: np.ndarray, cluster: "Cluster"
) -> HostSteps:
    """The steps of the offloaded ops' parameters during the backward, as :func:`placer.apply.step_in_backward`
    runs them (:mod:`envs.real.homes`): an offloaded op's parameters are complete once every gradient copied home
    for them has arrived (``pairs``: ``(owner, reader)`` of :func:`copy_pairs`; a reader's gradient arrives at the
    end of its copy home, ``times.grad_end_s``). One host worker steps them in batches: when it is free (at first,
    when the first is complete) it takes every op complete by then (in the order they became complete; ties: op
    order) and steps them in one optimizer call per home: the call's fixed cost (the home's ``step_call_s``,
    :class:`envs.cluster.Device`) charged to the first op of each home, then each op's
    passes over its bytes (:func:`envs.sim.cost.update_time_s` without the launch), one after the other; then it
    takes the next batch: ``start = max(complete, the previous batch's end)``. ``backward()`` returns once the last
    has ended; the optimizer's ``step()`` then steps every other parameter.

    >>> import envs
    >>> from graphs import OpGraph
    >>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)], flops=[1e9, 1e9], param_bytes=[8, 8])
    >>> t = no_home_times()._replace(op=np.array([0, 1]), grad_end_s=np.array([3.0, 1.0]), owner=np.array([0, 1]),
    ...                              owner_home=np.array([0, 0]))
    >>> c = envs.Cluster.preset("k80x2")
    >>> s = host_steps(t, (np.array([0, 1]), np.array([0, 1])), g.param_bytes, c)
    >>> s.owner.tolist(), bool(s.start_s[0] == 1.0), bool(s.start_s[1] == 3.0)
    ([1, 0], True, True)
    """
    from envs.sim.cost import update_time_s

    if not len(times.owner):
        return no_host_steps()
    arrive = dict(zip(times.op.tolist(), times.grad_end_s.tolist()))
    # frozen parameters (no trainable bytes) take no gradient and no step
    home = {o: h for o, h in zip(times.owner.tolist(), times.owner_home.tolist()) if param_bytes[o] > 0}
    complete: dict[int, float] = {}
    for o, r in zip(pairs[0].tolist(), pairs[1].tolist()):
        if o in home and r in arrive:
            complete[o] = max(complete.get(o, 0.0), arrive[r])
    owners = sorted(complete, key=lambda o: (complete[o], o))
    call, bw = cluster.step_call_s, cluster.update_bw_bytes_per_s
    passes = {o: float(update_time_s(float(param_bytes[o]), 0.0, bw[home[o]])) for o in owners}
    start, end, batch, t, i, k = [], [], [], 0.0, 0, 0
    while i < len(owners):
        t = taken = max(t, complete[owners[i]])  # the worker takes every op complete by then
        called: set[int] = set()  # the homes whose call this batch has begun
        while i < len(owners) and complete[owners[i]] <= taken:
            o, h = owners[i], home[owners[i]]
            fixed = 0.0 if h in called else float(call[h])
            called.add(h)
            start.append(t)
            t += fixed + passes[o]
            end.append(t)
            batch.append(k)
            i += 1
        k += 1
    return HostSteps(
        np.array(owners, dtype=np.int64),
        np.array([home[o] for o in owners], dtype=np.int64),
        np.array(start, dtype=np.float64),
        np.array(end, dtype=np.float64),
        np.array(batch, dtype=np.int64),
    )


def no_home_times() -> HomeTimes:
    """The :class:`HomeTimes` of a step without offloaded ops."""
    z = np.zeros(0)
    i = np.zeros(0, dtype=np.int64)
    return HomeTimes(
        i,
        i.copy(),
        i.copy(),
        z,
        z.copy(),
        z.copy(),
        z.copy(),
        z.copy(),
        z.copy(),
        i.copy(),
        i.copy(),
        i.copy(),
        np.zeros(0, dtype=bool),
    )


def homeable(graph: OpGraph, paths: dict | None = None) -> np.ndarray:
    """Per op (int8): 1 where its parameters may live apart from it, 0 where it owns none, -1 where they cannot: a
    path to an op reading them ends in an in-place op, or several ops read an owner that holds buffers too
    (``paths``: :func:`graphs.ops.param_paths`, computed when not given). An op owning only frozen parameters
    (:func:`graphs.ops.frozen_home_bytes`) owns some: they may live apart, copied to it with no gradient home."""
    can = np.full(graph.num_ops, -1, dtype=np.int8)
    can[list(param_paths(graph) if paths is None else paths)] = 1
    return np.where(home_bytes(graph) > 0, can, 0).astype(np.int8)


def copy_pairs(graph: OpGraph, paths: dict | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(owner, reader, bytes)``: the copies an owner's parameters make when they live apart, one per op that reads
    their data (:func:`graphs.ops.param_paths`): the owner's whole parameters for its own path, the share another
    reader reads for its (:func:`graphs.ops.param_reads`); for a reader reading them through views, no more than
    the bytes of the last view (the part it reads: ``nn.MultiheadAttention``'s packed projection split into the
    query's part and the keys' and values' copies a third of it for the query's linear; the runtime copies just
    that part, :func:`envs.real.homes.part_read`), unless that part has gaps in the parameter's memory
    (``meta["strided_views"]``: a KAN's ``grid[:, :-2]``), which the runtime copies whole. A reader with two paths
    to an owner gets one copy of it all."""
    share = {}
    held = home_bytes(graph)
    src, dst, nbytes = param_reads(graph)
    for u, v, b in zip(src.tolist(), dst.tolist(), nbytes.tolist()):
        share[(u, v)] = b
    view, strided = view_mask(graph), strided_mask(graph)
    rows: dict[tuple[int, int], int] = {}
    for i, owned in (param_paths(graph) if paths is None else paths).items():
        by_reader: dict[int, list[list[int]]] = {}
        for path in owned:
            by_reader.setdefault(path[-1], []).append(path)
        for reader, each in by_reader.items():
            b = max(share.get((i, path[0]), int(held[i])) for path in each)  # two paths: one copy
            if len(each) == 1:  # read through views: the part the last of them reads, where that is less
                last = [u for u in (i, *each[0][:-1]) if view[u]]
                if last and graph.out_bytes[last[-1]] > 0 and not strided[last[-1]]:  # a part with gaps: all
                    b = min(b, int(graph.out_bytes[last[-1]]))
            rows[(i, reader)] = b
    keys = sorted(rows)
    return (
        np.array([i for i, _ in keys], dtype=np.int64),
        np.array([r for _, r in keys], dtype=np.int64),
        np.array([rows[k] for k in keys], dtype=np.float64),
    )


def chain_pairs(graph: OpGraph, paths: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(owner, op)``: every op on a path to an op reading an owner's parameters, and that op, with that owner
    (``paths``: :func:`graphs.ops.param_paths`, computed when not given): their parameters live apart only with all
    of them on the owner's device."""
    paths = param_paths(graph) if paths is None else paths
    pairs = sorted({(i, u) for i, owned in paths.items() for path in owned for u in path if u != i})
    return np.array([i for i, _ in pairs], dtype=np.int64), np.array([u for _, u in pairs], dtype=np.int64)


def parted(op_devices: np.ndarray, pairs: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Boolean per op of placements ``op_devices`` (``[n]`` or ``[K, n]``): an owner with an op reading its
    parameters, or one they are read through (``pairs``: :func:`chain_pairs`), on another device, where they cannot
    live apart."""
    op_devices = np.asarray(op_devices)
    out = np.zeros(op_devices.shape, dtype=bool)
    owner, op = pairs
    if len(owner):
        np.logical_or.at(out.T, owner, (op_devices[..., owner] != op_devices[..., op]).T)
    return out


def home_readers(graph: OpGraph) -> np.ndarray:
    """Per op, the op its parameters' copy is made for where it is the only one: the op itself, or for parameters read
    through views (or past a check of their metadata) the op reading them (:func:`graphs.ops.param_paths`)."""
    out = np.arange(graph.num_ops)
    for i, paths in param_paths(graph).items():
        if len(paths) == 1:
            out[i] = paths[0][-1]
    return out


def offloaded(
    homes: np.ndarray,
    op_devices: np.ndarray,
    host: np.ndarray,
    can_home: np.ndarray,
    pairs: tuple[np.ndarray, np.ndarray] | None = None,
    copies: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    names: Any = None,
) -> np.ndarray:
    """Boolean per op (``[K, n]`` for a batch) of placements ``op_devices`` with per-op ``homes`` (-1: its own
    device): its parameters live on a host device apart from its GPU. An op without parameters has nothing to home
    (its home is ignored).

    Raises :class:`PlacerError` for a home that is neither the op's device nor a host device, a host op with a
    home apart, an op whose parameters cannot live apart (``can_home``: :func:`homeable`), parameters apart with an
    op that reads them (or that they are read through) on another device (``pairs``: :func:`chain_pairs`), and a
    reader whose own parameters live on another home (``copies``: :func:`copy_pairs`). ``names``: the ops' names,
    for the messages (default their indices).
    """

    def op(i: int) -> str:
        return f"op {names[i]}" if names is not None else f"op {i}"

    homes = np.asarray(homes, dtype=np.int64)
    apart = (homes >= 0) & (homes != op_devices) & (can_home != 0)
    host = np.asarray(host, dtype=bool)
    bad = apart & ~(host[np.maximum(homes, 0)] & ~host[op_devices])
    if bad.any():
        raise PlacerError("homes: a parameter's home must be its op's device or, for an op on a GPU, a host device")
    cannot = apart & (can_home < 0)
    if cannot.any():
        i = int(np.nonzero(cannot)[-1][0])
        raise PlacerError(
            f"homes: {op(i)}'s parameters cannot live apart from it (read through views by an in-place op, or by "
            "several ops with its buffers)"
        )
    if pairs is not None and len(pairs[0]):
        split = apart & parted(np.broadcast_to(op_devices, apart.shape), pairs)
        if split.any():
            at = np.nonzero(split)
            i, devices = int(at[-1][0]), np.broadcast_to(op_devices, apart.shape)[tuple(a[0] for a in at[:-1])]
            chain = pairs[1][pairs[0] == i]
            away = int(chain[devices[chain] != devices[i]][0])
            raise PlacerError(
                f"homes: {op(i)}'s parameters are read on another device (by {op(away)}, or through it): they can "
                "live apart only with every op that reads them, and the views they are read through, on their op's "
                "device"
            )
    if copies is not None and len(copies[0]):
        owner, reader, _ = copies
        other = owner != reader
        if other.any():
            h = np.broadcast_to(np.where(apart, homes, -1), apart.shape)
            o, r = owner[other], reader[other]
            clash = (h[..., o] >= 0) & (h[..., r] >= 0) & (h[..., o] != h[..., r])
            if clash.any():
                k = int(np.nonzero(clash)[-1][0])
                raise PlacerError(
                    f"homes: {op(int(o[k]))}'s parameters and those of {op(int(r[k]))}, which reads them, live on "
                    "two homes: give them one"
                )
    return apart


def homes_of(env: "SimEnv", placement: Any) -> np.ndarray | None:
    """Per op, the device index of its parameters' home in ``placement`` (-1: its own device), or None when it
    names none (``param_homes``, :meth:`graphs.plan.Placement.home_indices`)."""
    if not getattr(placement, "param_homes", None):
        return None
    return placement.home_indices(env.graph, env.cluster.device_names)


def home_rows(env: "SimEnv", op_devices: np.ndarray, homes: Any, source: str | None = None) -> np.ndarray | None:
    """The home device of each offloaded op of each placement of ``op_devices`` (``[K, n]``) on ``env``, -1 for the
    others, checked (:func:`offloaded`; ``source``: the plan's file, named first in an error); None where nothing
    is offloaded."""
    if homes is None:
        return None
    homes = np.asarray(homes, dtype=np.int64)
    if homes.shape[-1] != env.num_ops or homes.ndim not in (1, 2):
        raise PlacerError(f"homes: expected [{env.num_ops}] or [K, {env.num_ops}] device indices, got {homes.shape}")
    if env.homeable is None:
        paths = param_paths(env.graph)
        env.homeable = homeable(env.graph, paths)
        env.home_chains = chain_pairs(env.graph, paths)
        env.home_copies = copy_pairs(env.graph, paths)
    host = env.cluster.host
    try:
        apart = offloaded(homes, op_devices, host, env.homeable, env.home_chains, env.home_copies, env.graph.names)
    except PlacerError as e:
        raise PlacerError(f"{source}: {e}" if source else str(e)) from None
    if not apart.any():
        return None
    if env.microbatches > 1 or env.executor != "eager":
        raise PlacerError("homes: parameters apart from their ops are simulated with one microbatch, eager")
    return np.where(apart, homes, -1)


def copy_rows(env: "SimEnv", rows: np.ndarray | None) -> Any:
    """Rows of :func:`home_rows` (``[K, n]``) with the copies they make: ``rows`` itself where every copy is made
    for its offloaded op alone (of its :func:`graphs.ops.home_bytes`, with a gradient of its ``param_bytes`` sent
    home), else ``(rows, hmc, hbc, hgc)``: per op, the home of the copies made for it (-1: none), their bytes, and
    the bytes of their gradient (frozen parameters' copies send none). Parameters are copied for every op that reads
    their data (:func:`copy_pairs`: through views, past a check of their metadata, a tied head, a layer applied
    twice), as the runtime does (:mod:`envs.real.homes`), with that op's own parameters where they live apart
    too."""
    if rows is None:
        return None
    owner, reader, nbytes = env.home_copies
    other = np.flatnonzero(owner != reader)
    if not len(other) or not (rows[:, owner[other]] >= 0).any():
        return rows
    hmc = np.full(rows.shape, -1, dtype=np.int64)
    hbc = np.zeros(rows.shape)
    hgc = np.zeros(rows.shape)
    k, pair = np.nonzero(rows[:, owner] >= 0)  # each placement's copies
    hmc[k, reader[pair]] = rows[k, owner[pair]]
    np.add.at(hbc, (k, reader[pair]), nbytes[pair])
    np.add.at(hgc, (k, reader[pair]), np.where(env.sim_graph.param_bytes[owner[pair]] > 0, nbytes[pair], 0))
    return rows, hmc, hbc, hgc


def row_of(rows: Any, k: int) -> Any:
    """Row ``k`` of rows of :func:`copy_rows` (row 0 where they have one for every placement): None, an array or
    ``(hm, hmc, hbc, hgc)``."""
    if rows is None:
        return None
    if isinstance(rows, tuple):
        return tuple(row_of(r, k) for r in rows)
    return rows[k if len(rows) > 1 else 0]


def param_devices(op_devices: np.ndarray, hm: np.ndarray | None) -> np.ndarray:
    """The device each op's parameters and optimizer state live on: its home where it is offloaded (``hm``: a row
    of :func:`home_rows`), else its own."""
    return op_devices if hm is None else np.where(hm >= 0, hm, op_devices)


class HomeCopies:
    """The home copies of one eager step while it is simulated: their times, and each stream's window of two."""

    def __init__(
        self,
        homes: Any,
        held: np.ndarray,
        param_bytes: np.ndarray,
        cluster: "Cluster",
        grad: list[bool],
        keep_last: bool = True,
    ) -> None:
        """``homes``: a row of :func:`copy_rows`: each offloaded op's home (-1 for the others), or that with the copies
        made for each op, their bytes and their gradients' bytes, ``(hm, hmc, hbc, hgc)``; ``held``: each op's
        :func:`graphs.ops.home_bytes`, what an op's copies carry where it has them alone (a gradient of its
        ``param_bytes``); ``keep_last``: whether the forward's last two readers keep their copies for the backward (a
        plan's ``home_copies`` "keep-last"; False: "again", every copy made again)."""
        hm, hmc, hbc, hgc = homes if isinstance(homes, tuple) else (homes, homes, held, param_bytes)
        self.keep_last = keep_last
        self.owners = np.flatnonzero(hm >= 0)
        self.owner_home = hm[self.owners].astype(np.int64)
        self.ops = [int(i) for i in np.flatnonzero(hmc >= 0)]
        self.home = {i: int(hmc[i]) for i in self.ops}
        self.nbytes = {i: int(hbc[i]) for i in self.ops}
        self.grad_nbytes = {i: int(hgc[i]) for i in self.ops}
        self.grad = grad
        self.latency_s, self.bandwidth = cluster.latency_s, cluster.bandwidth_bytes_per_s
        self.fetch: dict[int, tuple[float, float]] = {}
        self.refetch: dict[int, tuple[float, float]] = {}
        self.to_home: dict[int, tuple[float, float]] = {}
        self.readers: dict[tuple[int, int], list[int]] = {}  # (pass, device) -> readers of its copies, in order
        self.kept: set[int] = set()  # the ops whose forward's copy their backward reads (refetch_in)

    def _copy(self, a: int, b: int, i: int, at: float, link: dict, nbytes: int | None = None) -> tuple[float, float]:
        s = max(at, link.get((a, b), 0.0))
        nbytes = self.nbytes[i] if nbytes is None else nbytes
        e = s + float(self.latency_s[a, b] + nbytes / self.bandwidth[a, b])
        link[(a, b)] = e
        return s, e

    def _guard(self, pass_: int, d: int, i: int, end_of) -> float:
        """The end of the reader of the copy two before on ``d`` in this pass (0 without); ``i`` joins the window."""
        readers = self.readers.setdefault((pass_, d), [])
        guard = end_of(readers[-2]) if len(readers) >= 2 else 0.0
        readers.append(i)
        return guard

    def fetch_in(self, i: int, d: int, h: float, link: dict, fwd_end: dict) -> float:
        """Op ``i``'s copy to its device ``d`` before its forward, issued at host time ``h``; returns when it is
        there (0 for an op not offloaded)."""
        if i not in self.home:
            return 0.0
        guard = self._guard(0, d, i, lambda u: fwd_end[u])
        self.fetch[i] = self._copy(self.home[i], d, i, max(h, guard), link)
        return self.fetch[i][1]

    def recompute_in(self, i: int, d: int, at: float, link: dict) -> float:
        """Op ``i``'s copy for its checkpointed block's recompute, issued at ``at`` outside the window (its backward
        makes none); returns its end (0 for an op not offloaded)."""
        if i not in self.home:
            return 0.0
        self.refetch[i] = self._copy(self.home[i], d, i, at, link)
        return self.refetch[i][1]

    def refetch_in(self, i: int, d: int, now: float, link: dict, bwd_end) -> float:
        """Op ``i``'s copy again before its backward, when ``d``'s worker picks it at ``now``; returns its end. The
        forward's last two readers on ``d`` keep their copies for it: none is made (0), but the copy joins the
        backward's window (its side stream waits for the reader two before, as for a copy)."""
        if i not in self.home:
            return 0.0
        guard = self._guard(1, d, i, bwd_end)
        if self.keep_last and i in self.readers.get((0, d), [])[-2:]:
            key = (self.home[i], d)
            link[key] = max(link.get(key, 0.0), guard)
            self.kept.add(i)
            self.refetch[i] = (now, now)
            return 0.0
        self.refetch[i] = self._copy(self.home[i], d, i, max(now, guard), link)
        return self.refetch[i][1]

    def send_home(self, i: int, d: int, kernel_end: float, link: dict) -> None:
        """Op ``i``'s gradient copied home once its backward kernel ends (no thread waits); frozen parameters' copies
        send none (zero-length at the kernel's end)."""
        if i not in self.home:
            return
        if self.grad_nbytes[i] > 0:
            self.to_home[i] = self._copy(d, self.home[i], i, kernel_end, link, self.grad_nbytes[i])
        else:
            self.to_home[i] = (kernel_end, kernel_end)

    def last_end_s(self) -> float:
        """When the last gradient copy home ends (what ``backward()`` waits for)."""
        return max((e for _, e in self.to_home.values()), default=0.0)

    def times(self, fwd_end: np.ndarray) -> HomeTimes:
        """The :class:`HomeTimes` of the step (an op without a backward: its second copy and gradient at its
        forward's end, zero-length)."""
        ops = self.ops
        at = lambda table, i, k: (  # noqa: E731
            table[i][k] if i in table and (table is self.fetch or self.grad[i]) else float(fwd_end[i])
        )
        f = lambda table, k: np.array([at(table, i, k) for i in ops], dtype=np.float64)  # noqa: E731
        return HomeTimes(
            np.array(ops, dtype=np.int64),
            np.array([self.home[i] for i in ops], dtype=np.int64),
            np.array([self.nbytes[i] for i in ops], dtype=np.int64),
            f(self.fetch, 0),
            f(self.fetch, 1),
            f(self.refetch, 0),
            f(self.refetch, 1),
            f(self.to_home, 0),
            f(self.to_home, 1),
            self.owners,
            self.owner_home,
            np.array([self.grad_nbytes[i] for i in ops], dtype=np.int64),
            np.array([i in self.kept for i in ops], dtype=bool),
        )


def home_memory_events(times: HomeTimes, op_devices: np.ndarray, fwd_end, bwd_start, bwd_end, grad):
    """``((device, time, bytes) allocations, (device, time, bytes) frees)`` of the home copies on the ops' devices:
    the copy for the forward, the copy for the backward and the gradient (:mod:`envs.sim.memory` adds them)."""
    i = times.op
    d = np.asarray(op_devices, dtype=np.int64)[i]
    has = np.asarray(grad, dtype=bool)[i]  # no backward: no second copy, no gradient
    b, g = times.nbytes * (has & ~times.kept), times.grad_nbytes * has  # frozen parameters: a second copy, no gradient
    devs = np.concatenate([d, d, d])
    alloc = (devs, np.concatenate([times.fetch_start_s, times.refetch_start_s, bwd_start[i]]))
    # the forward's copy lives to its forward's end, or, kept for the backward, to the backward's
    free = (devs, np.concatenate([np.where(times.kept, bwd_end[i], fwd_end[i]), bwd_end[i], times.grad_end_s]))
    nbytes = np.concatenate([times.nbytes, b, g])
    return (*alloc, nbytes), (*free, nbytes)


class WithHomes:
    """A :class:`~envs.sim.simulator.SimEnv` scoring batches with parameter homes: ``[num_ops]`` device indices for
    every row, or ``[K, num_ops]``, -1 for an op's own device (made by ``SimEnv.with_homes``).

    Its ``step_times`` and ``overflow`` are the env's with those homes; everything else is the env's own.
    """

    def __init__(self, env: "SimEnv", homes: Any) -> None:
        self.env, self.homes = env, homes

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]:
        step_time_s, failed, _ = self.env.batch(op_devices, order, homes=self.homes)
        return step_time_s, failed

    def overflow(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.env.batch(op_devices, order, overflow=True, homes=self.homes)


def schedule_param_devices(schedule: "Schedule") -> np.ndarray:
    """The device each op's parameters live on in a simulated ``schedule``: its home where it is offloaded."""
    out = schedule.op_devices.astype(np.int64)
    out[schedule.homes.owner] = schedule.homes.owner_home
    return out

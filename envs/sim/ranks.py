"""The simulator of ranks: a step of a plan run across processes, one worker per rank.

It models the runtime of :mod:`envs.real.distributed`: the plan is cut into stages
(:func:`envs.real.distributed.cut.cut_stages`, each maximal run of ops on one device
in the issue order, and at the plan's ``stage_cuts``), each used device is a rank (in the cluster's device order), and
each rank runs its schedule's actions (:func:`envs.sim.rank_actions.schedule_actions`)
one after the other:

* a forward ``(s, "F", m)`` starts when its rank is free and stage ``s - 1``'s
  activations of microbatch ``m`` have arrived; a backward ``(s, "B", m)`` when
  its rank is free and stage ``s + 1``'s gradients have arrived (its forward ran
  before it on the same rank);
* a stage's forward (backward) takes the sum of its ops' forward (backward) times
  on its device for one microbatch (:func:`envs.sim.cost.op_times`). A schedule that
  splits the backward (``interleaved_zb``, ``zbv``, ``dualpipev``) runs its input part ``(s, "I", m)``, which
  waits and sends as a backward does, and later its weight part ``(s, "W", m)``, which
  waits for nothing and sends nothing; of each op's backward the weight part is
  :func:`weight_fractions`, and both parts take the device's ``split_backward_factor``
  longer (what splitting costs, which ``placer profile --ranks`` measures). The first
  stage, which sends no gradient, runs its whole backward in its weight part, unsplit, as
  torch's runtime does; its sends leave
  when it ends, and its rank is busy the device's ``action_overhead_s`` more (torch's
  runtime between actions, which ``placer profile --ranks`` fits; 0 in the presets). A
  forward run with the next backward as one action (``(s, "FO", m)``, ``dualpipev``'s
  ``OVERLAP_F_B``) runs and waits as a forward does, but its sends leave after that
  backward, before the backward's own;
* every value a later stage reads is sent from each stage to the next, passing
  through the stages between (as the runtime's stage programs do), one tensor per
  value, its largest edge; a send costs ``latency + bytes / bandwidth`` of the link
  per tensor and occupies the link from the sender's rank to the receiver's, one
  send after the other in the order the sender makes them; a gradient goes back the
  same way (values that are not floating point carry none);
* on a rank whose device is a CPU (gloo between processes on CPU cores) the rank's own
  core moves the bytes: a send takes the sender's core for its time after the action,
  and a receive the receiver's core (hidden in its wait when it waits for the bytes,
  after its previous action when it was busy). A GPU's copies run beside its compute;
* a message arrives the receiving device's ``handoff_s`` later still (0 in the presets; ``placer profile
  --ranks`` fits it), taking no core longer: gloo moves the data on threads that share the ranks' cores,
  and a thread woken beside a computing one gets its core at a scheduler tick;
* after its last action each rank takes its optimizer step (:func:`envs.sim.cost.update_times_s`)
  and, for a trainable parameter read on several ranks (tied weights), an all-reduce of its
  gradient among them (two sends of its bytes); the step ends with the last rank.

Memory per rank: the parameters, gradients and Adam state of its ops
(:func:`envs.sim.cost.static_bytes`), those of its copies of parameters read on several ranks, a copy of each buffer
or frozen parameter its ops read that another rank's op owns (:func:`held_copy_bytes`), and the activations of its
stages' microbatches
whose forward has run and whose backward (its weight part, where split) has not, at
their peak over its actions.

>>> from graphs import OpGraph
>>> from envs.cluster import Cluster
>>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 4000)], flops=[4e9, 4e9])
>>> sim = RankSim(g, Cluster.preset("k80x2"), microbatches=2)
>>> res = sim.evaluate([[1, 2]])[0]
>>> res.status, res.extra["schedule"], res.extra["stages"]
('ok', 'gpipe', 2)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from envs.cluster import Cluster
from envs.real.distributed.cut import Stage, StageCutter, StagedSplit
from envs.real.distributed.schedules import Action, fitting_schedule, layout
from envs.result import Result
from envs.sim.bound import SLACK, LowerBound
from envs.sim.cost import (
    OPTIMIZER_STATE_MULTIPLIER,
    UPDATE_TRAFFIC_MULTIPLIER,
    activation_bytes,
    op_times,
    static_bytes,
    update_times_s,
)
from envs.sim.rank_actions import schedule_actions
from envs.sim.work_bound import work_bound_s
from envs.timeline import Event
from graphs import OpGraph, PlacerError
from graphs.dag import critical_path
from graphs.ops import trainable_names
from graphs.plan import Placement, as_indices, check_inflight, check_microbatches, check_schedule_name

#: The pipeline shapes (M microbatches, W in flight) a plan across processes is tried at where its shape is chosen
#: (``placer train --ranks --choose-shape``, ``bench.rank_splits``): one microbatch; GPipe over 2, 4 and 8; 1F1B over
#: 4 with 2 in flight and over 8 with 4.
PIPELINE_SHAPES = ((1, 1), (2, 2), (4, 4), (4, 2), (8, 8), (8, 4))


class Run(NamedTuple):
    """A stage as the simulator reads it (:meth:`~envs.real.distributed.cut.StageCutter.runs`): its logical device,
    and its ops in issue order as an int64 array (a :class:`~envs.real.distributed.cut.Stage` holds a tuple)."""

    device: str
    ops: np.ndarray


@dataclass(frozen=True)
class StageCosts:
    """What one microbatch costs per stage, and what crosses each boundary (stage ``s`` to ``s + 1``).

    Attributes:
        ranks: each stage's rank.
        device_indices: each stage's device (index into the cluster's devices).
        fwd_s, bwd_s: ``[S]`` seconds of a stage's forward and backward of one microbatch.
        activation_bytes: ``[S]`` bytes a stage keeps for backward per microbatch.
        send_bytes, send_tensors: ``[S - 1]`` bytes and tensors sent forward per microbatch.
        grad_bytes, grad_tensors: ``[S - 1]`` bytes and tensors of gradients sent back.
        op_stages: ``[num_ops]`` each op's stage.
        wgrad_s: ``[S]`` seconds of a stage's backward that are its weight part (:func:`weight_fractions`); None:
            none (a schedule that splits the backward then runs it all in its input part).
    """

    ranks: list[int]
    device_indices: list[int]
    fwd_s: np.ndarray
    bwd_s: np.ndarray
    activation_bytes: np.ndarray
    send_bytes: np.ndarray
    send_tensors: np.ndarray
    grad_bytes: np.ndarray
    grad_tensors: np.ndarray
    op_stages: np.ndarray
    wgrad_s: np.ndarray | None = None


def is_float(dtypes: Sequence[str]) -> bool:
    """Whether an op's output carries a gradient: a floating-point dtype (no dtype recorded: assume so)."""
    return not dtypes or any("float" in str(d) or "bfloat" in str(d) for d in dtypes)


def float_outputs(graph: OpGraph) -> np.ndarray:
    """Per op, whether its output carries a gradient back (:func:`is_float`)."""
    dtypes = graph.out_dtypes or [()] * graph.num_ops
    return np.array([is_float(d) for d in dtypes], dtype=bool)


def weight_fractions(graph: OpGraph, floats: np.ndarray | None = None) -> np.ndarray:
    """Per op, the part of its backward that computes its parameters' gradients (the *weight part* a zero-bubble
    schedule puts off): 0 for an op without parameters; 1 for one with parameters whose inputs carry no gradient
    from another op (an embedding's lookup of token ids: its backward is its weight's gradient alone); else 1/2,
    a product's backward being two products of one size, the input's gradient and the weight's.

    >>> from graphs import OpGraph
    >>> g = OpGraph.from_edges(["embed", "mm", "relu"], [("embed", "mm", 4), ("mm", "relu", 4)], param_bytes=[8, 8, 0])
    >>> weight_fractions(g).tolist()
    [1.0, 0.5, 0.0]
    """
    floats = float_outputs(graph) if floats is None else floats
    src, dst = graph.edge_src.astype(np.int64), graph.edge_dst.astype(np.int64)
    fed = np.zeros(graph.num_ops, dtype=bool)
    fed[dst[floats[src]]] = True
    has_params = np.asarray(graph.param_bytes) > 0
    return np.where(has_params, np.where(fed, 0.5, 1.0), 0.0)


def boundary_traffic(
    graph: OpGraph, op_stages: np.ndarray, num_stages: int, microbatches: int, floats: np.ndarray | None = None
) -> tuple:
    """``(send_bytes, send_tensors, grad_bytes, grad_tensors)``, each ``[S - 1]``, per microbatch (module doc)."""
    floats = float_outputs(graph) if floats is None else floats
    src, dst = graph.edge_src.astype(np.int64), graph.edge_dst.astype(np.int64)
    cross = np.flatnonzero(op_stages[dst] > op_stages[src])
    # per op with a reader in a later stage: the last such reader's stage and its largest edge (sorted by op, then
    # each op's run reduced: what np.maximum.at did, at a tenth of its cost on the plans a search scores)
    by_op = cross[np.argsort(src[cross], kind="stable")]
    firsts = np.flatnonzero(np.r_[True, src[by_op][1:] != src[by_op][:-1]]) if len(by_op) else by_op
    ops = src[by_op][firsts]
    last = np.maximum.reduceat(op_stages[dst[by_op]], firsts) if len(by_op) else ops
    largest = np.maximum.reduceat(graph.edge_bytes[by_op].astype(np.int64), firsts) if len(by_op) else ops
    per_microbatch = -(-largest // int(microbatches))

    def spans(values: np.ndarray) -> np.ndarray:
        # each value crosses every boundary from its stage to its last reader's: a difference array (whole byte
        # counts in float64: the sums are exact in any order)
        diff = np.bincount(op_stages[ops], weights=values, minlength=num_stages + 1)
        diff -= np.bincount(last, weights=values, minlength=num_stages + 1)
        return np.cumsum(diff)[: max(num_stages - 1, 0)]

    ones, grads = np.ones(len(ops)), floats[ops].astype(np.float64)
    return spans(per_microbatch.astype(np.float64)), spans(ones), spans(per_microbatch * grads), spans(grads)


def op_costs(graph: OpGraph, cluster: Cluster, microbatches: int) -> tuple:
    """``(fwd_s, bwd_s, activation bytes, float outputs, weight fractions)`` per op for one microbatch: what
    :func:`stage_costs` sums (computed once per scorer, not per plan)."""
    fwd, bwd = op_times(graph, cluster, microbatches)
    floats = float_outputs(graph)
    return fwd, bwd, activation_bytes(graph) / float(microbatches), floats, weight_fractions(graph, floats)


def stage_ranks(cluster: Cluster, stages: list[Stage]) -> tuple[list[int], list[int]]:
    """``(each stage's rank, each stage's device index)``: the devices the stages use are the ranks, numbered in the
    cluster's order."""
    device_indices = [cluster.index(s.device) for s in stages]
    rank_of = {d: r for r, d in enumerate(sorted(set(device_indices)))}
    return [rank_of[d] for d in device_indices], device_indices


def stage_layout(graph: OpGraph, stages: Sequence[Stage | Run], microbatches: int, floats: np.ndarray) -> tuple:
    """``(each stage's ops, each op's stage, boundary_traffic)`` of ``stages``: what :func:`stage_costs` reads of a
    plan that no cluster changes (:class:`RankSim` keeps it per plan, for the rate fit's many clusters)."""
    ops = [
        s.ops if isinstance(s.ops, np.ndarray) else np.fromiter(s.ops, dtype=np.int64, count=len(s.ops)) for s in stages
    ]
    op_stages = np.empty(graph.num_ops, dtype=np.int64)
    for s, idx in enumerate(ops):
        op_stages[idx] = s
    return ops, op_stages, boundary_traffic(graph, op_stages, len(stages), microbatches, floats)


def stage_costs(
    graph: OpGraph,
    cluster: Cluster,
    stages: list[Stage],
    microbatches: int,
    per_op: tuple | None = None,
    layout_of: tuple | None = None,
) -> StageCosts:
    """The :class:`StageCosts` of ``stages`` of ``graph`` on ``cluster`` with M microbatches (``per_op``:
    :func:`op_costs`, and ``layout_of``: :func:`stage_layout`, when already computed)."""
    fwd, bwd, kept, floats, wfrac = per_op if per_op is not None else op_costs(graph, cluster, microbatches)
    ranks, device_indices = stage_ranks(cluster, stages)
    ops, op_stages, traffic = stage_layout(graph, stages, microbatches, floats) if layout_of is None else layout_of
    return StageCosts(
        ranks=ranks,
        device_indices=device_indices,
        fwd_s=np.array([fwd[idx, d].sum() for idx, d in zip(ops, device_indices)]),
        bwd_s=np.array([bwd[idx, d].sum() for idx, d in zip(ops, device_indices)]),
        activation_bytes=np.array([kept[idx].sum() for idx in ops]),
        send_bytes=traffic[0],
        send_tensors=traffic[1],
        grad_bytes=traffic[2],
        grad_tensors=traffic[3],
        op_stages=op_stages,
        wgrad_s=np.array([(bwd[idx, d] * wfrac[idx]).sum() for idx, d in zip(ops, device_indices)]),
    )


class _Links:
    """Directed links between ranks, each busy with one send at a time, in the order sends are made."""

    def __init__(self, cluster: Cluster) -> None:
        # nested lists of Python floats: read once per send, where numpy's scalar indexing costs more than the send
        self.latency_s = np.asarray(cluster.latency_s, dtype=np.float64).tolist()
        self.bandwidth = np.asarray(cluster.bandwidth_bytes_per_s, dtype=np.float64).tolist()
        self.free_at: dict[tuple[int, int], float] = {}
        self.busy_s: dict[tuple[int, int], float] = {}

    def send(self, src: int, dst: int, ready_s: float, nbytes: float, tensors: float) -> tuple[float, float]:
        """The time a send made at ``ready_s`` from device ``src`` to ``dst`` has arrived, and how long it took."""
        if src == dst or tensors == 0:
            return ready_s, 0.0
        duration = tensors * self.latency_s[src][dst] + nbytes / self.bandwidth[src][dst]
        link = (src, dst)
        start = max(ready_s, self.free_at.get(link, 0.0))
        self.free_at[link] = start + duration
        self.busy_s[link] = self.busy_s.get(link, 0.0) + duration
        return start + duration, duration


def run_actions(
    costs: StageCosts, actions: Mapping[int, Sequence[Action]], cluster: Cluster, record: list | None = None
) -> dict[str, Any]:
    """Time every rank's ``actions`` (module doc): ``{"end_s": [R], "busy_s": [R], "links": {...}}``.

    Each rank runs its list in order, so an action's start depends only on its rank's
    previous action and on the sends it waits for; the ranks advance in turn until
    every list is done. Raises :class:`PlacerError` if the lists wait on each other.
    ``record``: a list each action is appended to, as an :class:`envs.timeline.Event`.
    """
    # Python floats and lists throughout: this runs for every plan a search scores, and numpy's scalar
    # arithmetic and indexing cost more than the arithmetic itself (the same IEEE operations, in the same order)
    R = len(actions)
    links = _Links(cluster)
    dev = list(costs.device_indices)
    overhead = [float(d.action_overhead_s) for d in cluster.devices]
    handoff = [float(d.handoff_s) for d in cluster.devices]
    fwd_s, bwd_s = np.asarray(costs.fwd_s, np.float64).tolist(), np.asarray(costs.bwd_s, np.float64).tolist()
    # a split backward: the first stage runs all of it, unsplit, in its weight part (it sends no gradient); the others
    # their weight parts (StageCosts.wgrad_s), each part longer by its device's split_backward_factor
    wgrad_s = [0.0] * len(bwd_s) if costs.wgrad_s is None else np.asarray(costs.wgrad_s, np.float64).tolist()
    factor = [float(cluster.devices[d].split_backward_factor) for d in dev]
    compute = {
        "F": fwd_s,
        "FO": fwd_s,
        "B": bwd_s,
        "I": [f * (b - w) for f, b, w in zip(factor, bwd_s, wgrad_s)],
        "W": [f * w for f, w in zip(factor, wgrad_s)],
    }
    if bwd_s:
        compute["I"][0], compute["W"][0] = 0.0, bwd_s[0]
    send_bytes, send_tensors = np.asarray(costs.send_bytes).tolist(), np.asarray(costs.send_tensors).tolist()
    grad_bytes, grad_tensors = np.asarray(costs.grad_bytes).tolist(), np.asarray(costs.grad_tensors).tolist()
    arrived: dict[tuple[str, int, int], float] = {}  # ("F" into stage s, or "B" into stage s, microbatch m)
    send_s: dict[tuple[str, int, int], float] = {}  # how long each of those sends took on its link
    own_copies = [d.kind == "cpu" for d in cluster.devices]  # the rank's own core moves its bytes (gloo on a CPU)
    free_s = [0.0] * R
    busy_s = [0.0] * R
    nxt = [0] * R
    deferred: list[tuple[int, int, int] | None] = [None] * R  # an overlapped forward's sends, left with the next action
    lists = [list(actions.get(r, ())) for r in range(R)]
    left = sum(len(acts) for acts in lists)
    S = len(fwd_s)
    while left:
        progress = False
        for r in range(R):
            acts, k = lists[r], nxt[r]
            while k < len(acts):
                s, kind, m = acts[k]
                # what the action waits for: stage s - 1's activations (a forward), stage s + 1's gradients (a
                # backward or its input part); a weight part, only its own input part, earlier on this rank
                need = None
                if kind in ("F", "FO"):
                    if s > 0:
                        need = ("F", s, m)
                elif kind in ("B", "I") and s < S - 1:
                    need = ("B", s, m)
                if need is not None and need not in arrived:
                    break
                d = dev[s]
                # a backward's own forward ran earlier on this rank: every schedule's list has it before
                # a rank whose core receives its bytes itself: the receive takes that core's time as well
                if need is None:
                    ready = free_s[r]
                else:
                    receive_s = send_s[need] if own_copies[d] else 0.0
                    ready = max(free_s[r] + receive_s, arrived[need])
                compute_s = compute[kind][s]
                end = ready + compute_s  # the sends leave here; the runtime's own work between actions follows
                free_s[r], busy_s[r] = end + overhead[d], busy_s[r] + compute_s + overhead[d]
                if record is not None:
                    record.append(Event(r, s, "F" if kind == "FO" else kind, m, float(ready), float(end)))
                # an overlapped forward ("FO") sends nothing yet: its sends leave after the backward it runs with
                outgoing: list[tuple[str, int, int]] = []
                if kind == "FO":
                    deferred[r] = (s, m, d)
                else:
                    if deferred[r] is not None:
                        outgoing.append(("F", deferred[r][0], deferred[r][1]))
                        deferred[r] = None
                    outgoing.append((kind, s, m))
                at = end
                for what, s2, m2 in outgoing:
                    sent, d2, to, tensors = None, dev[s2], dev[s2], 0.0
                    if what == "F" and s2 < S - 1:
                        sent, to, tensors = ("F", s2 + 1, m2), dev[s2 + 1], send_tensors[s2]
                        arrived[sent], send_s[sent] = links.send(d2, to, at, send_bytes[s2], tensors)
                    if what in ("B", "I") and s2 > 0:
                        sent, to, tensors = ("B", s2 - 1, m2), dev[s2 - 1], grad_tensors[s2 - 1]
                        arrived[sent], send_s[sent] = links.send(d2, to, at, grad_bytes[s2 - 1], tensors)
                    if sent is not None and to != d2 and tensors > 0:  # the receiver's hand-off (module doc)
                        arrived[sent] += handoff[to]
                    if sent is not None and own_copies[d2]:  # and a rank whose core sends them, its sends
                        free_s[r] += send_s[sent]
                        busy_s[r] += send_s[sent]
                        at += send_s[sent]
                k += 1
                left -= 1
                progress = True
            nxt[r] = k
        if not progress:
            stuck = {r: lists[r][nxt[r]] for r in range(R) if nxt[r] < len(lists[r])}
            raise PlacerError(f"ranks: the schedule's actions wait on each other (next per rank: {stuck})")
    return {"end_s": np.array(free_s), "busy_s": np.array(busy_s), "links": links.busy_s}


def peak_activation_bytes(costs: StageCosts, actions: Mapping[int, Sequence[Action]]) -> dict[int, float]:
    """Per rank, the most activation bytes its stages hold at once over its actions (a split backward frees them at
    its weight part, which still reads them)."""
    out = {}
    for r, acts in actions.items():
        live = peak = 0.0
        for s, kind, _ in acts:
            if kind in ("F", "FO"):
                live += costs.activation_bytes[s]
            elif kind in ("B", "W"):
                live -= costs.activation_bytes[s]
            peak = max(peak, live)
        out[r] = peak
    return out


def parameter_readers(graph: OpGraph) -> list[tuple[str, np.ndarray, float, int, bool]]:
    """The tensors that more than one op reads (only those can be read on several ranks): ``(name, the ops that read
    it, its bytes, the op that owns it or -1, whether it trains)``; an op's bytes are split evenly over the tensors
    it reads (the graph records bytes per op). A trainable parameter's copies on several ranks have their gradients
    summed (:func:`shared_parameter_bytes`); a buffer's or a frozen parameter's (``meta["frozen_params"]``) are
    copies held, with nothing to sum (:func:`envs.real.distributed.runtime.shared_parameters` leaves them out). Read
    once per graph by :class:`RankSim`."""
    ops_of: dict[str, list[int]] = {}
    size: dict[str, float] = {}
    owner: dict[str, int] = {}
    trainable = trainable_names(graph)
    for op, names in enumerate(graph.params or []):
        for name in names:
            ops_of.setdefault(name, []).append(op)
            held = graph.param_bytes[op] if name in trainable else graph.buffer_bytes[op]
            if held > 0 and name not in owner:
                size[name], owner[name] = float(held) / len(names), op
    return [
        (name, np.array(ops, dtype=np.int64), size.get(name, 0.0), owner.get(name, -1), name in trainable)
        for name, ops in ops_of.items()
        if len(ops) > 1
    ]


def shared_parameter_bytes(
    graph: OpGraph, op_ranks: np.ndarray, readers: list | None = None
) -> dict[str, tuple[set[int], float, int]]:
    """Trainable parameters read on several ranks: ``name -> (their ranks, bytes, the rank of the op that owns it)``
    (``readers``: :func:`parameter_readers`, when already read; ``trains`` False: tensors held, not summed,
    :func:`held_copy_bytes`)."""
    out = {}
    for name, ops, nbytes, owner_op, trains in parameter_readers(graph) if readers is None else readers:
        if not trains:
            continue
        ranks = set(op_ranks[ops].tolist())
        if len(ranks) > 1:
            out[name] = (ranks, nbytes, int(op_ranks[owner_op]) if owner_op >= 0 else min(ranks))
    return out


def held_copy_bytes(graph: OpGraph, op_ranks: np.ndarray, R: int, readers: list | None = None) -> np.ndarray:
    """Per rank, the bytes of the buffers and frozen parameters it holds a copy of because an op of its reads them
    while another rank's op owns them (a rotary table every layer reads, a frozen tied embedding and head): each rank
    cuts its stages from the whole model and keeps the tensors they read; nothing is summed between them
    (``R`` ranks; ``readers``: :func:`parameter_readers`, when already read)."""
    out = np.zeros(R)
    for _, ops, nbytes, owner_op, trains in parameter_readers(graph) if readers is None else readers:
        if trains or owner_op < 0:
            continue
        for r in set(op_ranks[ops].tolist()) - {int(op_ranks[owner_op])}:
            out[r] += nbytes
    return out


def allreduce_s(cluster: Cluster, device_indices: Sequence[int], nbytes: float) -> float:
    """A ring all-reduce of ``nbytes`` among ``device_indices``: ``2 (k - 1)`` steps of ``nbytes / k`` over the
    slowest link among them."""
    k = len(device_indices)
    pairs = [(a, b) for a in device_indices for b in device_indices if a != b]
    latency_s = max(float(cluster.latency_s[a][b]) for a, b in pairs)
    bandwidth = min(float(cluster.bandwidth_bytes_per_s[a][b]) for a, b in pairs)
    return 2 * (k - 1) * (latency_s + nbytes / k / bandwidth)


def finish_step(
    graph: OpGraph,
    cluster: Cluster,
    costs: StageCosts,
    end_s: np.ndarray,
    readers: list | None = None,
) -> tuple:
    """``(end of step per rank, parameter bytes per rank, each op's rank, optimizer seconds per rank)``: the shared
    parameters' all-reduces (a barrier among their ranks), then each rank's optimizer step (over its copies of
    shared parameters too); ``readers``: :func:`parameter_readers`, when already read."""
    op_ranks = np.asarray(costs.ranks, dtype=np.int64)[costs.op_stages]
    R = len(end_s)
    rank_device = {r: d for r, d in zip(costs.ranks, costs.device_indices)}
    param_bytes = np.bincount(op_ranks, weights=graph.param_bytes.astype(np.float64), minlength=R)
    end_s = end_s.copy()
    for ranks, nbytes, owner in shared_parameter_bytes(graph, op_ranks, readers).values():
        holders = sorted(ranks)
        at = max(end_s[r] for r in holders) + allreduce_s(cluster, [rank_device[r] for r in holders], nbytes)
        for r in holders:
            end_s[r] = at
            param_bytes[r] += nbytes if r != owner else 0.0  # a copy on every rank that reads it
    per_device = np.zeros(cluster.num_devices)
    for r in range(R):
        per_device[rank_device[r]] = param_bytes[r]
    update_s = update_times_s(per_device, cluster)
    optimizer_s = np.array([update_s[rank_device[r]] for r in range(R)])
    return end_s + optimizer_s, param_bytes, op_ranks, optimizer_s


class PlanMemo:
    """The stages of the plans a :class:`RankSim` scored and what crosses them (:func:`stage_layout`), by plan: none of
    it depends on the cluster, so the rate fit (:mod:`placer.learn.rates`), which scores its measured plans again on
    hundreds of rescaled clusters, cuts each once. Holds at most about 4 M op entries (the oldest plan goes first)."""

    def __init__(self, num_ops: int) -> None:
        self.capacity = max(64, min(4096, (1 << 22) // max(num_ops, 1)))
        self.plans: dict[tuple, tuple] = {}

    @staticmethod
    def key(op_devices: Any, order: Any, starts: Any, microbatches: int) -> tuple:
        order_key = None if order is None else np.asarray(order, dtype=np.int64).tobytes()
        starts_key = tuple(int(s) for s in np.asarray(starts, dtype=np.int64).ravel())
        return np.asarray(op_devices, dtype=np.int64).tobytes(), order_key, starts_key, int(microbatches)

    def get(self, key: tuple) -> tuple | None:
        return self.plans.get(key)

    def put(self, key: tuple, value: tuple) -> None:
        if len(self.plans) >= self.capacity:
            del self.plans[next(iter(self.plans))]
        self.plans[key] = value


def simulate_ranks(
    graph: OpGraph,
    cluster: Cluster,
    op_devices: Sequence[int] | np.ndarray,
    order: Sequence[int] | np.ndarray | None = None,
    *,
    microbatches: int = 1,
    inflight: int | None = None,
    schedule: str | None = None,
    per_op: tuple | None = None,
    cutter: StageCutter | None = None,
    readers: list | None = None,
    timeline: list | None = None,
    one_stage_per_rank: bool = False,
    stage_starts: Sequence[int] | np.ndarray = (),
    memo: "PlanMemo | None" = None,
) -> Result:
    """One step of a plan across processes (module doc); ``schedule`` None: the one that fits the plan; ``per_op``:
    :func:`op_costs` of this M, ``cutter`` a :class:`~envs.real.distributed.cut.StageCutter` of the graph and
    ``readers`` its :func:`parameter_readers`, when already made (:class:`RankSim` makes them once);
    ``timeline``: a list each rank's actions and optimizer step are appended to (:class:`envs.timeline.Event`);
    ``stage_starts``: ops (indices) that begin a stage on the same device (a placement's ``stage_cuts``);
    ``memo``: a :class:`PlanMemo` of the plans scored before (their stages and what crosses them).

    A schedule that does not fit the plan is a Result with status ``error`` saying why;
    a rank over its device's memory, ``oom``; with ``one_stage_per_rank``, a plan with more stages than ranks
    (looped, or any other layout), ``error`` too (:class:`RankSim`'s doc says why).
    """
    M = check_microbatches(microbatches)
    W = check_inflight(inflight, M)
    cutter = StageCutter(graph, cluster.device_names) if cutter is None else cutter
    key = None if memo is None else memo.key(op_devices, order, stage_starts, M)
    known = None if key is None else memo.get(key)
    stages = [Run(*run) for run in cutter.runs(op_devices, order, stage_starts)] if known is None else known[0]
    if one_stage_per_rank:  # before any costing: a search may propose many plans this refuses
        ranks, _ = stage_ranks(cluster, stages)
        R = len(set(ranks))
        if layout(ranks, R) != "one_per_rank":
            why = f"{len(stages)} stages on {R} ranks: one stage per rank only, in rank order (others: --looped)"
            return Result(float("inf"), "error", why, source="sim-ranks", extra={"stages": len(stages), "ranks": R})
    per_op = op_costs(graph, cluster, M) if per_op is None else per_op
    if known is None:
        known = (stages, stage_layout(graph, stages, M, per_op[3]))
        if key is not None:
            memo.put(key, known)
    costs = stage_costs(graph, cluster, stages, M, per_op, known[1])
    R = len(set(costs.ranks))
    name = schedule or fitting_schedule(costs.ranks, R, microbatches=M, inflight=W)
    try:
        actions = schedule_actions(name, costs.ranks, R, microbatches=M, inflight=W)
    except PlacerError as e:
        extra = {"schedule": name, "microbatches": M, "inflight": W}
        return Result(float("inf"), "error", str(e), source="sim-ranks", extra=extra)
    timing = run_actions(costs, actions, cluster, timeline)
    end_s, param_bytes, op_ranks, optimizer_s = finish_step(graph, cluster, costs, timing["end_s"], readers)
    if timeline is not None:
        timeline.extend(Event(r, -1, "O", -1, float(end_s[r] - optimizer_s[r]), float(end_s[r])) for r in range(R))
    rank_device = dict(zip(costs.ranks, costs.device_indices))
    names = cluster.device_names
    held = np.bincount(op_ranks, weights=static_bytes(graph).astype(np.float64), minlength=R)
    copies = param_bytes - np.bincount(op_ranks, weights=graph.param_bytes.astype(np.float64), minlength=R)
    held += copies * (2 + OPTIMIZER_STATE_MULTIPLIER)  # as static_bytes: the copy, its gradient, Adam's state
    held += held_copy_bytes(graph, op_ranks, R, readers)  # buffers and frozen weights other ranks own
    peaks = peak_activation_bytes(costs, actions)
    peak_bytes = {names[rank_device[r]]: int(held[r] + peaks[r]) for r in range(R)}
    busy = {names[rank_device[r]]: float(timing["busy_s"][r]) for r in range(R)}
    busy.update({f"{names[a]}->{names[b]}": float(t) for (a, b), t in timing["links"].items()})
    extra = {
        "schedule": name,
        "stages": len(stages),
        "ranks": R,
        "rank_end_s": [float(t) for t in end_s],
        "microbatches": M,
        "inflight": W,
    }
    over = [d for d, b in peak_bytes.items() if b > cluster.memory_bytes[cluster.index(d)]]
    if over:
        message = f"{over[0]}: peak {peak_bytes[over[0]] / 2**30:.2f} GiB over its memory"
        return Result(float("inf"), "oom", message, peak_bytes, busy, source="sim-ranks", extra=extra)
    return Result(float(end_s.max()), "ok", "", peak_bytes, busy, source="sim-ranks", extra=extra)


def one_stage_bound_s(per_op_s: np.ndarray, microbatches: int, ranks: int) -> float:
    """A step no plan of one stage per rank (GPipe or 1F1B, at most ``ranks`` ranks) runs faster than, its stages
    contiguous runs of ops in node order; ``per_op_s``: each op's forward + backward seconds for one microbatch at
    its fastest device.

    The rank of stage ``r`` cannot start before stages ``0..r-1`` ran microbatch 0's forward; it then runs M
    forwards and backwards of its own ops, one at a time; after its last backward, stages ``r-1..0`` still run
    that microbatch's backward. With ``P`` the prefix sums of ``per_op_s`` and stage ``r`` the ops ``[a, b)``, that
    is at least ``M P[b] - (M - 1) P[a]``, for every rank (the first, ``M P[b]``; the last, the whole path and more).
    The least over every cut into at most ``ranks`` stages of its largest rank is found by bisection on the step,
    each step checked by taking each stage as long as it may (``P`` never falls, so the longest first stage leaves
    the most room); the value returned is one no cut achieves.

    >>> # four ops of 1 s each (forward and backward, per microbatch), 4 microbatches, 2 ranks: cut 2 | 2, rank 0
    >>> # runs 4 x 2 = 8 s; rank 1 waits 2 s for microbatch 0, runs 8 s, and rank 0 then runs 2 s of its last
    >>> # backward: 4 x 4 - 3 x 2 = 10 s (cut 3 | 1: rank 0 alone 12 s; 1 | 3: rank 1 4 x 4 - 3 x 1 = 13 s)
    >>> round(one_stage_bound_s(np.ones(4), 4, 2), 6)
    10.0
    """
    P = np.concatenate([[0.0], np.cumsum(np.asarray(per_op_s, dtype=np.float64))])
    M, n = float(microbatches), len(P) - 1
    if n == 0:
        return 0.0

    def fits(step_s: float) -> bool:
        at, stages = 0, 0
        while at < n:
            reach = int(np.searchsorted(P, (step_s + (M - 1.0) * P[at]) / M, side="right")) - 1
            if reach <= at or stages == ranks:
                return False
            at, stages = reach, stages + 1
        return True

    lo, hi = 0.0, M * float(P[n])  # no step below lo fits; all on one rank takes hi
    for _ in range(60):
        mid = (lo + hi) / 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return lo


def ranks_lower_bound(
    graph: OpGraph,
    cluster: Cluster,
    microbatches: int = 1,
    per_op: tuple | None = None,
    one_stage_per_rank: bool = False,
) -> LowerBound:
    """A step no plan of ``graph`` across ``cluster``'s ranks runs faster than, at M ``microbatches``, whatever its
    stages, ranks and schedule (a :class:`~envs.sim.bound.LowerBound`), the better of:

    * **work across ranks**: a rank runs one action at a time, so its busy time (every microbatch's forward and
      backward of its ops, then its optimizer step) is at most the step, and for any weights ``λ`` on the devices
      ``step >= Σ_i min_d λ_d w_id`` (:func:`envs.sim.work_bound.work_bound_s`), ``w_id`` = M x (op ``i``'s forward
      + its backward on ``d``, the backward at ``min(1, split_backward_factor)`` of it) + its parameters' optimizer
      traffic on ``d``. Uniform ``λ`` gives "all the work spread evenly over the ranks";
    * **critical path** of one microbatch (:func:`graphs.dag.critical_path`): forward to the loss and the backward
      back, each op at its fastest device, sends free, the backward at its input part only (the weight part of a
      split backward waits for nothing).

    Sends, waits, the runtime's overhead per action, the hand-off and the launch of each rank's optimizer step are
    left out (each only adds), and so is the pipeline's fill: a zero-bubble schedule can hide most of it. For plans
    of ``one_stage_per_rank`` only (in node order), the fill too, where it is higher (:func:`one_stage_bound_s`,
    "pipeline fill, one stage per rank").

    >>> from graphs import OpGraph
    >>> from envs.devices import Device, Link
    >>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 8)], flops=[1e9, 1e9])
    >>> devs = [Device(f"cpu:{r}", "cpu", 1e12, 1e9, 1e15, 0.0) for r in range(2)]
    >>> c = Cluster("toy", devs, {("cpu:0", "cpu:1"): Link(1e15, 0.0), ("cpu:1", "cpu:0"): Link(1e15, 0.0)})
    >>> # each op 1 s forward and 2 s backward: the whole batch's path is 6 s; 4 microbatches of a quarter each are
    >>> # 6 s of work over 2 ranks, and one microbatch's path 1.5 s
    >>> [(round(float(b), 6), b.name) for b in (ranks_lower_bound(g, c, 1), ranks_lower_bound(g, c, 4))]
    [(6.0, 'critical path'), (3.0, 'work across ranks')]
    """
    M = check_microbatches(microbatches)
    fwd, bwd, _, _, wfrac = per_op if per_op is not None else op_costs(graph, cluster, M)
    split = np.minimum(1.0, np.array([float(d.split_backward_factor) for d in cluster.devices]))[None, :]
    update = UPDATE_TRAFFIC_MULTIPLIER * graph.param_bytes.astype(np.float64)[:, None] / cluster.update_bw_bytes_per_s
    per_microbatch = fwd + split * bwd
    parts = {
        "work across ranks": work_bound_s(M * per_microbatch + update),
        "critical path": critical_path(graph, fwd.min(axis=1), (split * bwd * (1.0 - wfrac[:, None])).min(axis=1))[0],
    }
    if one_stage_per_rank:
        parts["pipeline fill, one stage per rank"] = one_stage_bound_s(
            per_microbatch.min(axis=1), M, cluster.num_devices
        )
    name = max(parts, key=lambda k: parts[k])
    value = parts[name] * (1.0 - SLACK)
    return LowerBound(value, name, parts, value, name)


class RankSim:
    """The scorer of plans across processes (:mod:`envs.scorer`'s protocol), on :func:`simulate_ranks`.

    Args:
        graph: the model's graph (the whole batch's).
        cluster: one device per rank it may use.
        microbatches, inflight: M and W of every plan it scores as vectors (a
            :class:`graphs.Placement` brings its own).
        schedule: the schedule of those plans (None: the one that fits each); kept as ``schedule_name``.
        one_stage_per_rank: score only plans of one stage per rank (a contiguous split, run by GPipe or 1F1B);
            any other is an ``error`` Result. What ``placer train --ranks`` searches unless told ``--looped``:
            measured on two CPU ranks, this simulator put looped plans 16 % and 63 % fast (their hand-offs between
            stages cost more than it charges), where it puts one stage per rank within a few percent
            (BENCHMARKS.md, "A learned looped plan, 63 % slower than simulated").
    """

    def __init__(
        self,
        graph: OpGraph,
        cluster: Cluster,
        *,
        microbatches: int = 1,
        inflight: int | None = None,
        schedule: str | None = None,
        one_stage_per_rank: bool = False,
        _shared: tuple | None = None,
    ) -> None:
        self.graph, self.cluster = graph, cluster
        self.microbatches = check_microbatches(microbatches)
        self.inflight = check_inflight(inflight, self.microbatches)
        self.schedule_name = check_schedule_name(schedule)
        self.one_stage_per_rank = bool(one_stage_per_rank)
        self._per_op: dict[int, tuple] = {}
        # what depends on the graph and the device names only, shared with every scorer _like makes of this one
        # (the rate fit of placer.learn.rates makes hundreds, one per rescaled cluster)
        self._cutter, self._readers, self._memo = (
            (StageCutter(graph, cluster.device_names), parameter_readers(graph), PlanMemo(graph.num_ops))
            if _shared is None
            else _shared
        )
        self._one_process: Any = None
        self.simulated = 0
        """placements scored through :meth:`step_times` and :meth:`overflow` (what a search on it spent)."""

    def per_op(self, microbatches: int) -> tuple:
        """:func:`op_costs` for M microbatches, computed once."""
        if microbatches not in self._per_op:
            self._per_op[microbatches] = op_costs(self.graph, self.cluster, microbatches)
        return self._per_op[microbatches]

    def lower_bound(self, microbatches: int | None = None) -> LowerBound:
        """:func:`ranks_lower_bound` at M ``microbatches`` (None: this scorer's M); for a scorer of one stage per
        rank, with the fill of such pipelines: the plans it scores are that kind, in node order."""
        M = self.microbatches if microbatches is None else check_microbatches(microbatches)
        return ranks_lower_bound(self.graph, self.cluster, M, self.per_op(M), self.one_stage_per_rank)

    def evaluate(self, placements: Sequence[Any]) -> list[Result]:
        """One :class:`envs.Result` per placement (a vector, a name -> device mapping or a Placement)."""
        return [
            self.simulate(p)
            if isinstance(p, Placement)
            else self.simulate(as_indices(p, self.graph, self.cluster.device_names))
            for p in placements
        ]

    def with_microbatches(self, microbatches: int, inflight: int | None = None) -> "RankSim":
        """This scorer for plans of M microbatches, W in flight (the same graph, cluster and schedule)."""
        M, W = check_microbatches(microbatches), check_inflight(inflight, microbatches)
        if (M, W) == (self.microbatches, self.inflight):
            return self
        return self._like(self.cluster, M, W)

    def with_cluster(self, cluster: Cluster) -> "RankSim":
        """This scorer on another ``cluster`` of the same devices (the same graph, M, W, schedule and stage rule)."""
        return self._like(cluster, self.microbatches, self.inflight)

    def _like(self, cluster: Cluster, M: int, W: int | None) -> "RankSim":
        """A scorer of this graph, schedule and stage rule on ``cluster`` at M and W."""
        return RankSim(
            self.graph,
            cluster,
            microbatches=M,
            inflight=W,
            schedule=self.schedule_name,
            one_stage_per_rank=self.one_stage_per_rank,
            _shared=(self._cutter, self._readers, self._memo),
        )

    def simulate(self, op_devices: Any, order: Any = None, timeline: list | None = None, starts: Any = ()) -> Result:
        """:func:`simulate_ranks` of one placement: a vector under this scorer's M, W and schedule, in ``order``
        (None: node order), with stages also beginning at ops ``starts`` (or a
        :class:`~envs.real.distributed.cut.StagedSplit`, which brings them); or a :class:`graphs.Placement` under its
        own M, W, schedule and stage cuts, in ``order`` (None: its own issue order). ``timeline``: a list the
        step's events are appended to (:meth:`timeline`)."""
        M, W, schedule = self.microbatches, self.inflight, self.schedule_name
        if isinstance(op_devices, StagedSplit):
            starts, op_devices = op_devices.starts, op_devices.op_devices
        if isinstance(op_devices, Placement):
            plan = op_devices
            M, W, schedule = plan.microbatches, plan.inflight, plan.schedule
            starts = plan.stage_starts(self.graph)
            order = plan.issue_order(self.graph) if order is None else order
            op_devices = as_indices(plan, self.graph, self.cluster.device_names, source=plan.source or "placement")
        return simulate_ranks(
            self.graph,
            self.cluster,
            op_devices,
            order,
            microbatches=M,
            inflight=W,
            schedule=schedule,
            per_op=self.per_op(M),
            cutter=self._cutter,
            readers=self._readers,
            timeline=timeline,
            one_stage_per_rank=self.one_stage_per_rank,
            stage_starts=() if starts is None else starts,
            memo=self._memo,
        )

    def timeline(self, op_devices: Any, order: Any = None) -> tuple[Result, list[Event]]:
        """One placement's simulated step (as :meth:`simulate`) and its timeline: every rank's actions and optimizer
        step, seconds from the step's start (:mod:`envs.timeline`; what ``placer run --trace`` lays beside the
        measured one)."""
        events: list[Event] = []
        result = self.simulate(op_devices, order, timeline=events)
        return result, sorted(events, key=lambda e: (e.rank, e.start_s))

    def one_process(self) -> Any:
        """The one-process simulator of this graph and cluster (:class:`envs.SimEnv`, one microbatch), made once."""
        if self._one_process is None:
            from envs.sim import SimEnv  # the one-process simulator and its kernels: only where a search asks

            self._one_process = SimEnv(self.graph, self.cluster)
        return self._one_process

    def schedule(self, op_devices: Any, order: Any = None) -> Any:
        """The one-process schedule of a placement (:meth:`envs.SimEnv.schedule`), which a move search reads for its
        candidates' features (the ops' start times, the critical path). Across processes there is no one schedule
        to read; the ranks' step times themselves come from :meth:`step_times`."""
        return self.one_process().schedule(op_devices, order)

    def schedule_order(self, op_devices: Any) -> np.ndarray:
        """:meth:`envs.SimEnv.schedule_order` of the one-process simulator (see :meth:`schedule`)."""
        return self.one_process().schedule_order(op_devices)

    def in_order(self, order: str | None) -> "RankSim":
        """This scorer scoring in ``order`` where the caller gives none (:meth:`envs.SimEnv.in_order`): itself for
        None (node order); across processes there is no planned order, so ``"planned"`` is a :class:`PlacerError`."""
        if order is not None:
            raise PlacerError(f"ranks: no {order!r} issue order across processes; score in node order")
        return self

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """``([K] step seconds, [K] failed)`` of ``[K, num_ops]`` placement vectors; ``order``: None (node
        order), one order for all, or ``[K, num_ops]``. A plan across processes has no planned order: ``"planned"``
        is a :class:`PlacerError`."""
        step_time_s, failed, _ = self.overflow(op_devices, order)
        return step_time_s, failed

    def staged_step_times(
        self, op_devices: np.ndarray, starts: Sequence[Sequence[int]], order: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`step_times` of rows whose stages also begin at ops ``starts[k]`` on the same device (a V's second
        stage on its last rank, :class:`~envs.real.distributed.cut.StagedSplit`), one sequence of ops per row."""
        step_time_s, failed, _ = self._scored(op_devices, order, starts)
        return step_time_s, failed

    def overflow(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(step_time_s, failed, over)``: :meth:`step_times`, and per row the largest peak / memory over the ranks'
        devices that run out of it (0 for a row that fits), as :meth:`envs.SimEnv.overflow` gives it: a search then
        moves a plan out of memory toward fitting."""
        return self._scored(op_devices, order, None)

    def _scored(self, op_devices: np.ndarray, order: Any, starts: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`overflow` of rows, each with its stage ``starts`` (None: none)."""
        if isinstance(order, str):
            raise PlacerError(f"ranks: no {order!r} issue order across processes; pass the order, or None")
        op_devices = np.atleast_2d(np.asarray(op_devices))
        orders = [None] * len(op_devices) if order is None else np.asarray(order)
        if order is not None and orders.ndim == 1:
            orders = [orders] * len(op_devices)
        starts = [()] * len(op_devices) if starts is None else starts
        if len(starts) != len(op_devices):
            raise PlacerError(f"ranks: stage starts for {len(starts)} plans, not {len(op_devices)}")
        results = [self.simulate(row, o, starts=st) for row, o, st in zip(op_devices, orders, starts)]
        self.simulated += len(results)
        step_time_s = np.array([r.step_time_s for r in results], dtype=np.float64)
        capacity = self.cluster.memory_bytes
        over = np.array(
            [
                max((b / capacity[self.cluster.index(d)] for d, b in r.peak_bytes.items()), default=0.0)
                if r.status == "oom"
                else 0.0
                for r in results
            ],
            dtype=np.float64,
        )
        return step_time_s, np.array([not r.ok for r in results], dtype=bool), over


__all__ = [
    "PIPELINE_SHAPES",
    "PlanMemo",
    "RankSim",
    "Run",
    "StageCosts",
    "allreduce_s",
    "boundary_traffic",
    "float_outputs",
    "op_costs",
    "held_copy_bytes",
    "parameter_readers",
    "one_stage_bound_s",
    "peak_activation_bytes",
    "ranks_lower_bound",
    "run_actions",
    "simulate_ranks",
    "stage_costs",
    "stage_layout",
    "stage_ranks",
    "weight_fractions",
]

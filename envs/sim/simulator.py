"""Simulate one training step of a placed graph on a cluster: step time, memory, busy time.

:func:`simulate` scores one placement; :class:`SimEnv` keeps the per-graph
precomputation and scores many (``evaluate`` for Results, ``step_times`` for a
``[K, num_ops]`` batch of device indices in the inner loop of search and RL).
The schedule semantics (the ``eager`` PyTorch executor, the default, and the
``dataflow`` TensorFlow one) are in :mod:`envs.sim.schedule`, the memory model in
:mod:`envs.sim.memory`, the costs in :mod:`envs.sim.cost`. They run on
:func:`envs.sim.sim_graph.schedule_graph`: the graph (its microbatch copies) with
every parameter that several ops read as edges from its owner, so reading it on
another device costs the copy and its gradient, as in the module
:func:`placer.apply` builds. Issue orders are picked by :mod:`envs.sim.order_planner`.

>>> from graphs import OpGraph
>>> from envs.cluster import Cluster
>>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 4 << 20)], flops=[1e9, 1e9])
>>> r = simulate(g, [1, 2], Cluster.preset("k80x2"), executor="dataflow")
>>> r.status, round(r.step_time_s * 1e3, 3)  # 2 × (fwd 0.258 + copy 0.429 + bwd 0.516) ms
('ok', 2.407)
>>> r = simulate(g, [1, 2], Cluster.preset("k80x2"))  # eager: + the host dispatch of a (8 us) before its kernel
>>> r.extra["executor"], round(r.step_time_s * 1e3, 3)
('eager', 2.415)
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from envs.cluster import Cluster
from envs.microbatch import expand_order, issue_segments, stage_starts
from envs.result import Result
from envs.sim import cost
from envs.sim.bound import lower_bound_from_times
from envs.sim.checkpointing import checkpoint_of, checkpoint_rows
from envs.sim.homes import (
    HomeCopies,
    WithHomes,
    copy_rows,
    home_rows,
    homes_of,
    host_steps,
    param_devices,
    row_of,
    schedule_param_devices,
)
from envs.sim.order_planner import InOrder, OrderPlanner
from envs.sim.order_trust import ORDER_MARGIN_META
from envs.sim.schedule import EXECUTORS, Schedule, schedule_reference
from envs.sim.sim_graph import schedule_graph
from envs.sim.step_result import step_result
from graphs.errors import PlacerError
from graphs.ir import OpGraph
from graphs.ops import (
    backward_readers,
    free_mask,
    grad_mask,
    home_bytes,
    kept_mask,
    repeated_input_mask,
    staying_buffer_bytes,
    weight_reads,
)
from graphs.plan import (
    as_indices,
    check_host_step,
    check_inflight,
    check_microbatches,
    check_order,
    keeps_last_copies,
)

#: Bumped whenever a change to the model changes simulated step times (keys of caches of simulated results).
MODEL_VERSION = 4  # 2: parameters read on another device are copied there (schedule_graph); 3: eager backward
# gradient copies between a GPU and the host block their issuing thread and drain the stream; per-op issue times;
# 4: the eager backward simulated in time order over autograd's threads (ready queues by sequence number), the
# host's staging copies before host -> GPU copies, contention between host ops and GPU workers (envs.sim.eager)

#: The ``--executor`` help shared by ``placer simulate``, ``compare`` and ``train``.
EXECUTOR_ARG_HELP = (
    "executor model scoring a step: eager (default: the PyTorch module placer.apply builds, one host "
    "thread issuing ops in order to in-order GPU streams) or dataflow (TensorFlow's executor, the paper's setting)"
)


class _GraphParts:
    """What a :class:`SimEnv` computes from its graph, M and W alone (not the cluster)."""

    def __init__(self, graph: OpGraph, M: int, W: int) -> None:
        # the host thread's program over issue positions (eager): forwards and backward() calls; with
        # W < M it depends on the placement's stages (SimEnv.program())
        self.segments = issue_segments(graph.num_ops, M, W)
        self.free = free_mask(graph)
        # the graph the schedulers run: the graph itself, or its M microbatch copies, with the copies of
        # shared parameters as edges (schedule_graph)
        self.sim_graph = schedule_graph(graph, M)
        self.grad = grad_mask(graph)  # ops without a backward: integer ops, tables built from buffers
        self.static_bytes = cost.static_bytes(self.sim_graph)
        # what lives on an op's home where it has one apart: its trainable parameters, or the frozen ones it owns
        # (graphs.ops.home_bytes; homes are simulated with one microbatch)
        self.home_bytes = home_bytes(graph) if M == 1 else self.sim_graph.param_bytes.astype(np.int64)
        self.staying_buffers = staying_buffer_bytes(self.sim_graph, self.home_bytes)  # the rest moves with a home
        self.act_bytes = cost.activation_bytes(self.sim_graph)
        # which outputs autograd keeps for backward (the others are freed once their consumers have run forward), and
        # who frees each in the backward; an op without a backward saves nothing
        weights, repeated = weight_reads(graph), repeated_input_mask(graph)
        self.readers = backward_readers(
            self.sim_graph,
            np.tile(self.grad, M),
            None if weights is None else np.tile(weights, M),
            None if repeated is None else np.tile(repeated, M),
        )
        self.kept = kept_mask(self.readers)  # graphs.ops.saved_mask


class SimEnv:
    """The simulator as a scorer: ``evaluate(placements) -> list[Result]``.

    Args:
        graph: the op graph.
        cluster: the cluster to place on.
        backend: ``"kernel"`` (compiled, default) or ``"reference"`` (pure Python).
        executor: ``"eager"`` (default: the PyTorch module :func:`placer.apply`
            builds, run in an issue order) or ``"dataflow"`` (TensorFlow's
            executor, the paper's setting; ignores the issue order). See
            :mod:`envs.sim.schedule`.

        microbatches: ``M``, the number of microbatches a step runs (default 1):
            placements are still of ``graph``'s ops, and the step is scheduled as
            the expanded graph of :mod:`envs.microbatch` (``self.sim_graph``), M
            copies with the placement repeated.
        inflight: ``W``, the most microbatches in flight (``1..M``; default M,
            fill-drain; fewer: one-forward-one-backward, :func:`envs.microbatch.issue_segments`).
            The eager executor only: dataflow has no host program.

    Wherever a placement is taken, its issue order is the ``order`` argument,
    else the placement's ``order`` attribute (``placer.Placement.order``), else
    node order. A placement whose ``microbatches`` or ``inflight`` attribute
    differs from this env's is scored by this env's twin for them
    (:meth:`with_microbatches`). A placement's parameter homes
    (``placer.Placement.param_homes``) are charged as :mod:`envs.sim.homes` says; a batch is
    scored with homes through :meth:`with_homes`.
    """

    source = "sim"

    def __init__(
        self,
        graph: OpGraph,
        cluster: Cluster,
        *,
        backend: str = "kernel",
        executor: str = "eager",
        microbatches: int = 1,
        inflight: int | None = None,
        order_margin: float | None = None,
        _shared: dict | None = None,
    ) -> None:
        if backend not in ("kernel", "reference"):
            raise ValueError(f"backend must be 'kernel' or 'reference', not {backend!r}")
        if executor not in EXECUTORS:
            raise PlacerError(f"--executor {executor!r}: unknown (known: {', '.join(EXECUTORS)})")
        self.graph = graph
        self.cluster = cluster
        # the gain a planned issue order must beat to replace node order (envs.sim.order_trust; a profile's record)
        self.order_margin = float(graph.meta.get(ORDER_MARGIN_META, 0.0) if order_margin is None else order_margin)
        self.backend = backend
        self.executor = executor
        self.num_ops = graph.num_ops
        self.num_devices = cluster.num_devices
        self.microbatches = M = check_microbatches(microbatches)
        self.inflight = check_inflight(inflight, M)
        # what depends on the graph, M and W only, built once for every env _like makes of this one (the rate
        # fit of placer.learn.rates builds thousands, one per rescaled cluster)
        self._shared = {} if _shared is None else _shared
        parts = self._shared.get((M, self.inflight))
        if parts is None:
            parts = self._shared[(M, self.inflight)] = _GraphParts(graph, M, self.inflight)
        self.segments, self._free, self.sim_graph = parts.segments, parts.free, parts.sim_graph
        self.home_bytes, self._staying_buffers = parts.home_bytes, parts.staying_buffers
        self._host = cluster.host
        fwd, bwd = cost.op_times(graph, cluster, microbatches=M)
        # ops without a backward (integer ops, tables built from buffers: graphs.ops.grad_mask) have none to time
        grad = parts.grad
        bwd = np.where(grad[:, None], bwd, 0.0)
        self.grad = grad if M == 1 else np.tile(grad, M)
        # host seconds issuing each op (eager: the host thread forward, each device's autograd worker backward)
        issue_f, issue_b = cost.issue_times(graph, cluster, fwd)
        issue_b = np.where(grad[:, None], issue_b, 0.0)
        if executor == "dataflow":  # no issuing thread: an op takes at least its issue time on its device
            fwd, bwd = np.maximum(fwd, issue_f), np.maximum(bwd, issue_b)
        self.fwd_s, self.bwd_s = (fwd, bwd) if M == 1 else (np.tile(fwd, (M, 1)), np.tile(bwd, (M, 1)))
        self.issue_f, self.issue_b = (
            (issue_f, issue_b) if M == 1 else (np.tile(issue_f, (M, 1)), np.tile(issue_b, (M, 1)))
        )
        # what the host pays beside its ops (eager): staging copies to a GPU, contention with the autograd workers
        self.host_costs = cost.host_costs(cluster)
        self.static_bytes, self.act_bytes = parts.static_bytes, parts.act_bytes
        self.readers, self.kept = parts.readers, parts.kept
        self.consumers = self.sim_graph.out_csr[:2]
        self._kernel_data: Any = None
        self.planner = OrderPlanner(self)  # picks issue orders (order_candidates, schedule_order, plan_order)
        self._twins: dict[Any, SimEnv] = {}  # this env under another executor model or M (see _twin)
        self._simulated = [0]  # placements simulated (shared with the twins): see `simulated`
        self._lower_bound: dict[tuple[float, str], float] = {}
        self.homeable: np.ndarray | None = None  # which ops may have a home apart (envs.sim.homes.homeable), lazily
        self.home_chains: Any = None  # the ops reading each owner's parameters (homes.chain_pairs), lazily too
        self.home_copies: Any = None  # and the copies a home apart makes for them (homes.copy_pairs)
        # when the offloaded parameters of a batch's rows are stepped (graphs.plan.HOST_STEPS; a placement's own
        # host_step decides for it): "after" the backward, or during it ("backward")
        self.host_step = "after"

    # --------------------------------------------------------------- helpers
    def indices(self, placement: Any) -> np.ndarray:
        """Device index per op for anything :func:`graphs.plan.as_indices` accepts."""
        return as_indices(placement, self.graph, self.cluster.device_names)

    def check_order(self, order: Any, rows: int | None = None) -> np.ndarray | None:
        """``order`` as int64 ``[n]`` (or ``[rows, n]`` when ``rows`` is given and it is 2-D), validated.

        Raises :class:`PlacerError` unless every row is a permutation of the op
        indices and a topological order of the graph.
        """
        if order is None:
            return None
        n = self.num_ops
        arr = np.asarray(order) if isinstance(order, np.ndarray) or rows is not None else order
        if rows is not None and isinstance(arr, np.ndarray) and arr.ndim == 2:
            if arr.shape[0] not in (1, rows):
                raise PlacerError(
                    f"order: expected a [{n}] or [{rows}, {n}] array of op indices, got shape {arr.shape}"
                )
            return (
                np.stack([check_order(row, self.graph).astype(np.int64) for row in arr])
                if len(arr)
                else arr.astype(np.int64)
            )
        return check_order(arr, self.graph).astype(np.int64)

    def expand(self, op_devices: np.ndarray) -> np.ndarray:
        """Device per op of ``sim_graph`` from device per op of ``graph`` (the placement, M times)."""
        return op_devices if self.microbatches == 1 else np.tile(op_devices, self.microbatches)

    def sim_order(self, order: np.ndarray | None) -> np.ndarray | None:
        """The issue order of ``sim_graph`` from a checked order of ``graph`` (fill-drain; None stays None)."""
        if order is None or self.microbatches == 1:
            return order
        return expand_order(order, self.num_ops, self.microbatches)

    def program(self, op_devices: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
        """The host program (:func:`envs.microbatch.issue_segments`) of a placement of ``graph``'s ops in ``order``.

        Fill-drain (W = M) is the same for every placement; one-forward-one-backward
        follows the placement's stages (:func:`envs.microbatch.stage_starts`).
        """
        if self.inflight == self.microbatches:
            return self.segments
        o = np.arange(self.num_ops) if order is None else order
        return issue_segments(
            self.num_ops, self.microbatches, self.inflight, stage_starts(op_devices, o, self._host, self._free)
        )

    def with_microbatches(self, microbatches: int, inflight: int | None = None) -> "SimEnv":
        """This env for plans of ``microbatches`` microbatches, ``inflight`` of them in flight (default all).

        Same graph, cluster, backend and executor; each twin is built once.
        """
        M = check_microbatches(microbatches)
        W = check_inflight(inflight, M)
        if (M, W) == (self.microbatches, self.inflight):
            return self
        return self._twin(self.executor, M, W)

    def with_cluster(self, cluster: Cluster) -> "SimEnv":
        """This env on another ``cluster`` of the same devices (same graph, backend, executor, M, W and order margin):
        the simulator refitted to measurements (:mod:`placer.learn.rates`) runs on a rescaled copy of its cluster."""
        return self._like(cluster, self.executor, self.microbatches, self.inflight)

    def _like(self, cluster: Cluster, executor: str, M: int, W: int) -> "SimEnv":
        """An env of this graph, backend and order margin on ``cluster``, ``executor``, M and W."""
        return SimEnv(
            self.graph,
            cluster,
            backend=self.backend,
            executor=executor,
            microbatches=M,
            inflight=W,
            order_margin=self.order_margin,
            _shared=self._shared,
        )

    def _twin(self, executor: str, M: int, W: int) -> "SimEnv":
        key = (executor, M, W)
        if key not in self._twins:
            self._twins[key] = self._like(self.cluster, executor, M, W)
            self._twins[key]._simulated = self._simulated
        self._twins[key].host_step = self.host_step  # what this env scores plans with homes by, as it is now
        return self._twins[key]

    def in_order(self, order: str | None) -> "SimEnv | InOrder":
        """This env with ``step_times`` scoring in ``order`` ("planned": each row's planned issue order) where
        the caller gives none; itself for None (node order). What a search in a planned run searches with."""
        return self if order is None else InOrder(self, order)

    @property
    def simulated(self) -> int:
        """Placements this env and its twins have simulated: a row of :meth:`step_times` or a :meth:`schedule` each.

        What a method that searches with the simulator spent (``placer.compare`` reports it per
        comparison; ``placer train`` counts it in its equal-budget line).
        """
        return self._simulated[0]

    def count_simulated(self, placements: int) -> None:
        """Add ``placements`` that a method simulated on another scorer for this env's caller (``stage_search`` on
        the simulator of ranks) to :attr:`simulated`, so that what it spent is counted where every search's is."""
        self._simulated[0] += int(placements)

    def with_executor(self, executor: str) -> "SimEnv":
        """This env under another executor model (same graph, cluster, backend and M; each twin is built once)."""
        if executor == self.executor:
            return self
        return self._twin(executor, self.microbatches, self.inflight)

    def for_placement(self, placement: Any) -> "SimEnv":
        """The env that scores ``placement``: this one, or its twin for the placement's ``microbatches`` and
        ``inflight``."""
        M = getattr(placement, "microbatches", None)
        if M is None:
            return self
        return self.with_microbatches(M, getattr(placement, "inflight", None))

    def update_s(self, param_devices: np.ndarray, stepped: np.ndarray | None = None) -> np.ndarray:
        """Optimizer seconds per device with each op's parameters on ``param_devices`` (per op of ``sim_graph``:
        its device, or its parameters' home, :func:`envs.sim.homes.param_devices`; parameters of copy 0), but for
        the ops ``stepped`` during the backward (:func:`envs.sim.homes.host_steps`)."""
        weights = self.sim_graph.param_bytes.astype(np.float64)
        if stepped is not None:
            weights[stepped] = 0.0
        params = np.bincount(param_devices, weights=weights, minlength=self.num_devices)
        return cost.update_times_s(params, self.cluster)

    def static_per_device(self, op_devices: np.ndarray, param_devices: np.ndarray | None = None) -> np.ndarray:
        """Static bytes per device for ``op_devices``, device per op of ``sim_graph``; the parameters' share on
        ``param_devices`` (default the ops' own)."""
        out = np.zeros(self.num_devices, dtype=np.int64)
        buffers = self._staying_buffers
        np.add.at(out, op_devices, buffers)
        np.add.at(out, op_devices if param_devices is None else param_devices, self.static_bytes - buffers)
        return out

    def with_homes(self, homes: Any) -> WithHomes:
        """This env scoring batches with parameter ``homes``: ``[num_ops]`` (every row) or ``[K, num_ops]`` device
        indices, -1 for an op's own device (:class:`envs.sim.homes.WithHomes`)."""
        return WithHomes(self, homes)

    def _kernel(self):
        if self._kernel_data is None:
            from envs.sim.kernel import KernelData  # numba compiles on first use: import envs stays light

            self._kernel_data = KernelData(
                self.sim_graph,
                self.cluster,
                self.fwd_s,
                self.bwd_s,
                self.static_bytes,
                self.act_bytes,
                self.executor,
                self.segments,
                self.grad,
                (self.issue_f, self.issue_b),
                self.host_costs,
                self.kept,
                self.microbatches,
                self.readers,
                self.home_bytes,
            )
        return self._kernel_data

    # -------------------------------------------------------------- schedule
    def schedule(self, placement: Any, order: Any = None, *, count: bool = True) -> Schedule:
        """The full simulated schedule of one placement (issue ``order``: see the class doc).

        With M microbatches its per-op arrays are those of ``sim_graph`` (op ``m * n + i``
        is op ``i`` of microbatch ``m``). ``count``: add it to :attr:`simulated` (off for
        the order planner's own dataflow schedule).
        """
        env = self.for_placement(placement)
        if env is not self:
            return env.schedule(placement, order, count=count)
        if count:
            self._simulated[0] += 1
        op_devices = self.indices(placement)
        graph_order = self.check_order(getattr(placement, "order", None) if order is None else order)
        program = self.program(op_devices, graph_order)
        source = getattr(placement, "source", None)
        hm = row_of(copy_rows(self, home_rows(self, op_devices[None, :], homes_of(self, placement), source)), 0)
        blocks = checkpoint_rows(self, op_devices[None, :], checkpoint_of(self, placement), graph_order)
        ck = None if blocks is None else blocks[0]
        sim_devices, order = self.expand(op_devices), self.sim_order(graph_order)
        step = getattr(placement, "host_step", "after")
        keep = keeps_last_copies(placement)
        if self.backend == "reference":
            return self._reference_schedule(sim_devices, order, program, hm, ck, step, keep)
        sched = self._kernel().schedule(
            sim_devices, order if self.executor == "eager" else None, program, hm, ck, keep_last=keep
        )
        return self._step_in_backward(sched, step)

    def forward_starts(self, op_devices: np.ndarray) -> np.ndarray:
        """When each op of ``sim_graph`` starts its forward in this env's schedule of ``op_devices`` (device indices of
        ``graph``'s ops), not counted as simulated: :meth:`schedule`'s ``fwd_start_s``, which the compiled dataflow
        executor gives without the rest of the schedule (the order planner's one read of every placement)."""
        if self.backend == "reference" or self.executor != "dataflow":
            return self.schedule(op_devices, count=False).fwd_start_s
        return self._kernel().dataflow_starts(self.expand(op_devices))

    def _step_in_backward(self, sched: Schedule, host_step: str) -> Schedule:
        """``sched`` with its offloaded parameters stepped during the backward where ``host_step`` is "backward"
        (:func:`envs.sim.homes.host_steps`): ``backward()`` returns after the last of those steps, and the optimizer
        step after it updates the other parameters only."""
        if check_host_step(host_step, "simulator") != "backward" or not len(sched.homes.owner):
            return sched
        steps = host_steps(sched.homes, self.home_copies[:2], self.sim_graph.param_bytes, self.cluster)
        sched.update_s = self.update_s(schedule_param_devices(sched), stepped=steps.owner)
        steps_end = float(steps.end_s.max(initial=0.0))
        sched.host_step_wait_s = max(steps_end - float(sched.backward_end_s), 0.0)  # placer run's "waited"
        sched.backward_end_s = max(float(sched.backward_end_s), steps_end)
        sched.host_steps = steps
        return sched

    def _reference_schedule(
        self,
        sim_devices: np.ndarray,
        order: np.ndarray | None,
        program: np.ndarray,
        hm: Any = None,
        ck: np.ndarray | None = None,
        host_step: str = "after",
        keep_last: bool = True,
    ) -> Schedule:
        """The pure-Python schedule of a placement of ``sim_graph``'s ops, in issue ``order`` and host ``program``
        (``hm``: a row of :func:`envs.sim.homes.copy_rows`; ``ck``: a row of
        :func:`envs.sim.checkpointing.checkpoint_rows`; ``host_step``: when the offloaded parameters are stepped;
        ``keep_last``: the plan's ``home_copies`` is "keep-last")."""
        c = self.cluster
        g = self.sim_graph
        homes = None if hm is None else HomeCopies(hm, self.home_bytes, g.param_bytes, c, self.grad.tolist(), keep_last)
        hm = hm[0] if isinstance(hm, tuple) else hm  # each op's parameters' home
        sched = schedule_reference(
            self.sim_graph,
            sim_devices,
            self.fwd_s,
            self.bwd_s,
            c.latency_s,
            c.bandwidth_bytes_per_s,
            self.update_s(param_devices(sim_devices, hm)),
            executor=self.executor,
            order=order,
            host=self._host,
            launch_s=c.launch_overhead_s,
            segments=program,
            grad=self.grad,
            issue=(self.issue_f, self.issue_b),
            host_costs=self.host_costs,
            homes=homes,
            blocks=ck,
        )
        return self._step_in_backward(sched, host_step)

    def simulate(self, placement: Any, *, trace: bool = False, order: Any = None) -> Result:
        """Score one placement; see :func:`simulate`."""
        env = self.for_placement(placement)
        return env.result(env.schedule(placement, order), trace=trace)

    def result(self, sched: Schedule, *, trace: bool = False) -> Result:
        """The Result of a schedule of this env (:func:`envs.sim.step_result.step_result`)."""
        return step_result(self, sched, trace=trace)

    # ---------------------------------------------------------------- scorer
    def evaluate(self, placements: Sequence[Any]) -> list[Result]:
        """Score each placement (the scorer protocol shared with MeasuredEnv)."""
        return [self.simulate(p) for p in placements]

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """``(step_time_s, failed)`` of a ``[K, num_ops]`` batch: the scorer protocol (:mod:`envs.scorer`).

        The step time ignores memory; ``failed`` is out of memory. ``order`` as for :meth:`overflow`.
        """
        times, oom, _ = self.batch(op_devices, order, overflow=False)
        return times, oom

    def overflow(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(step_time_s, failed, over)``: :meth:`step_times`, and how far each placement is over capacity.

        ``over``: per row, the largest peak / capacity over the devices that run out of memory (0 for a row
        that fits). ``order``: None (node order), one issue order shared by the batch, a ``[K, num_ops]``
        array of them (used by the eager executor), or ``"planned"``: each row in its own
        :meth:`envs.sim.order_planner.OrderPlanner.schedule_order` (the cheap planner; on nmt-2 about 0.6 ms per
        row of random placements, a third of their step's 1.8 ms).
        """
        return self.batch(op_devices, order, overflow=True)

    def batch(
        self,
        op_devices: np.ndarray,
        order: Any = None,
        *,
        overflow: bool = False,
        homes: Any = None,
        checkpoint: Any = None,
        checkpoint_where_possible: bool = False,
        host_step: str | None = None,
    ):
        """``(step_time_s, failed, over)`` of a batch (:meth:`overflow`), ``over`` only computed with ``overflow``;
        ``homes``: parameter homes, as for :meth:`with_homes`; ``checkpoint``: each op's checkpointed block, -1 for
        none (``[num_ops]`` for every row or ``[K, num_ops]``, :func:`graphs.plan.checkpoint_blocks`);
        ``checkpoint_where_possible``: a row that cannot checkpoint a block runs it without
        (:func:`envs.sim.checkpointing.possible_blocks`), not an error; ``host_step``: when the offloaded parameters
        are stepped (:data:`graphs.plan.HOST_STEPS`; default this env's :attr:`host_step`). The other scorer methods
        are this one's."""
        op_devices = self._check_batch(op_devices)
        order = self._batch_order(op_devices, order)
        rows = copy_rows(self, home_rows(self, op_devices, homes))
        blocks = checkpoint_rows(self, op_devices, checkpoint, order, where_possible=checkpoint_where_possible)
        self._simulated[0] += len(op_devices)
        programs = None
        if self.inflight < self.microbatches and self.executor == "eager":  # each placement's own stages
            programs = [
                self.program(row, order[k] if order is not None and order.ndim == 2 else order)
                for k, row in enumerate(op_devices)
            ]
        if self.microbatches > 1:  # the same placements and orders, on the expanded graph
            op_devices = np.tile(op_devices, (1, self.microbatches))
            order = self.sim_order(order)
        step = check_host_step(self.host_step if host_step is None else host_step, "simulator")
        if self.backend == "reference":
            return self._reference_batch(op_devices, order, programs, rows, blocks, step)
        over = np.zeros(len(op_devices)) if overflow else None
        pairs = self.home_copies[:2] if step == "backward" and rows is not None else None
        step_time_s, oom = self._kernel().run_batch(
            op_devices.astype(np.int32, copy=False),
            order if self.executor == "eager" else None,
            programs,
            over,
            rows,
            blocks,
            pairs,
        )
        return step_time_s, oom, over

    def _check_batch(self, op_devices: Any) -> np.ndarray:
        """``op_devices`` as a ``[K, num_ops]`` array of device indices; a :class:`PlacerError` otherwise."""
        op_devices = np.asarray(op_devices)
        if op_devices.ndim == 1:
            op_devices = op_devices[None, :]
        if op_devices.ndim != 2 or op_devices.shape[1] != self.num_ops:
            raise PlacerError(
                f"step_times: expected a [K, {self.num_ops}] array of device indices, got shape {op_devices.shape}"
            )
        if op_devices.size and (op_devices.min() < 0 or op_devices.max() >= self.num_devices):
            raise PlacerError(f"step_times: device index out of range [0, {self.num_devices})")
        return op_devices

    def _batch_order(self, op_devices: np.ndarray, order: Any) -> np.ndarray | None:
        """The checked issue order of a batch: None, one ``[n]`` order for every row, or ``[K, n]``."""
        if isinstance(order, str):
            if order != "planned":
                raise PlacerError(f"step_times: order {order!r}: give op indices or 'planned'")
            order = self.planner.schedule_orders(op_devices) if len(op_devices) else None  # valid by construction
        else:
            order = self.check_order(order, rows=len(op_devices))
        if order is not None and order.ndim == 2 and len(order) == 1:
            order = order[0]
        return order

    def _reference_batch(
        self,
        op_devices: np.ndarray,
        order: np.ndarray | None,
        programs: list[np.ndarray] | None,
        rows: Any = None,
        blocks: np.ndarray | None = None,
        host_step: str = "after",
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`batch` of placements of ``sim_graph``'s ops, one pure-Python schedule and Result each."""
        step_time_s = np.empty(len(op_devices))
        oom = np.zeros(len(op_devices), dtype=bool)
        over = np.zeros(len(op_devices))
        caps = dict(zip(self.cluster.device_names, self.cluster.memory_bytes.tolist()))
        for k, row in enumerate(op_devices):
            row_order = order[k] if order is not None and order.ndim == 2 else order
            program = self.segments if programs is None else programs[k]
            hm = row_of(rows, k)
            ck = None if blocks is None else blocks[k if len(blocks) > 1 else 0]
            r = self.result(self._reference_schedule(row, row_order, program, hm, ck, host_step))
            step_time_s[k] = r.extra["sim_step_time_s"]
            oom[k] = r.status == "oom"
            if oom[k]:
                over[k] = max(r.peak_bytes[device] / caps[device] for device in r.extra["oom_devices"])
        return step_time_s, oom, over

    # ------------------------------------------------------------ issue order
    # The order planner (envs.sim.order_planner) picks issue orders; these delegate to it for callers that hold an env.
    def order_candidates(self, placement: Any) -> dict[str, np.ndarray]:
        """:meth:`envs.sim.order_planner.OrderPlanner.candidates` on this env."""
        return self.planner.candidates(placement)

    def schedule_order(self, placement: Any) -> np.ndarray:
        """:meth:`envs.sim.order_planner.OrderPlanner.schedule_order` on this env."""
        return self.planner.schedule_order(placement)

    def plan_order(self, placement: Any) -> tuple[np.ndarray, str, float]:
        """:meth:`envs.sim.order_planner.OrderPlanner.plan` on this env: ``(order, name, step_time_s)``."""
        return self.planner.plan(placement)

    def lower_bound(self, blocks_s: float = 0.0, host_step: str = "after") -> float:
        """:func:`envs.sim.bound.lower_bound` for this graph, cluster and executor (cached; a
        :class:`envs.sim.bound.LowerBound`).

        ``blocks_s`` > 0: with the block bound, its programs given that many seconds (:mod:`envs.sim.blocks`).
        ``host_step``: the plans' (:attr:`graphs.plan.Placement.host_step`): "backward" bounds plans whose homed
        parameters are stepped during the backward too.
        """
        key = (blocks_s, check_host_step(host_step, "simulator"))
        if key not in self._lower_bound:
            self._lower_bound[key] = lower_bound_from_times(
                self.sim_graph,
                self.cluster,
                self.fwd_s,
                self.bwd_s,
                self.executor,
                self.issue_f,
                microbatches=self.microbatches,
                blocks_s=blocks_s,
                host_step=host_step,
            )
        return self._lower_bound[key]


def simulate(
    graph: OpGraph, placement: Any, cluster: Cluster, *, trace: bool = False, executor: str = "eager", order: Any = None
) -> Result:
    """Simulate one training step of ``graph`` placed by ``placement`` on ``cluster``.

    Args:
        graph: the op graph.
        placement: device index per op, a name->device mapping, or a ``placer.Placement``.
        cluster: the cluster.
        trace: also put a Chrome/Perfetto trace of the schedule in ``result.extra["trace"]``.
        executor: ``"eager"`` (PyTorch, default) or ``"dataflow"`` (TensorFlow); see :mod:`envs.sim.schedule`.
        order: the issue order (op indices, a topological order); default the
            placement's ``order`` attribute, else node order.

    Returns:
        A Result: ``status`` ``"ok"`` with ``step_time_s``, or ``"oom"`` with
        ``step_time_s = inf``, the device and peak in ``message``, and the time
        ignoring memory in ``extra["sim_step_time_s"]``. ``peak_bytes`` and
        ``busy_s`` (devices and links ``"a->b"``) are filled either way.
    """
    return SimEnv(graph, cluster, executor=executor).simulate(placement, trace=trace, order=order)


def plan_order(graph: OpGraph, placement: Any, cluster: Cluster) -> tuple[np.ndarray, str, float]:
    """``(order, name, step_time_s)``: the issue order to run ``placement`` with
    (:meth:`envs.sim.order_planner.OrderPlanner.plan`), and its eager step time."""
    return OrderPlanner(SimEnv(graph, cluster)).plan(placement)

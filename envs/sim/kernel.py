"""The compiled simulator's entry points: a batch of placements scored, and one placement's full schedule.

Both executor models, with the same tasks, task ids and tie-breaks as
:func:`envs.sim.schedule.schedule_reference`: ``dataflow``
(:func:`envs.sim.kernel_dataflow.dataflow_schedule`) and ``eager``
(:func:`envs.sim.kernel_eager.eager_schedule`, its backward calls in
:mod:`envs.sim.kernel_autograd`). :class:`KernelData` holds a graph and
cluster's arrays in the kernels' layout. For each placement of a batch the step
is the schedule's backward end plus the slowest device's optimizer step
(:data:`envs.sim.kernel_homes.update_time_s`), and :func:`envs.sim.kernel_memory.over_capacity` decides
OOM exactly.

Compiled with numba when it is installed (one core, no parallelism); otherwise
the same functions run as plain Python (correct, ~100× slower).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from envs.cluster import Cluster
from envs.sim import cost
from envs.sim.compiled import HAVE_NUMBA, njit  # noqa: F401  (HAVE_NUMBA: re-exported)
from envs.sim.homes import HomeTimes
from envs.sim.kernel_checkpointing import prepare
from envs.sim.kernel_dataflow import dataflow_schedule
from envs.sim.kernel_eager import eager_schedule
from envs.sim.kernel_homes import host_step_chain, update_time_s
from envs.sim.kernel_memory import over_capacity
from envs.sim.tasks import ACT, GRAD, Schedule
from graphs.ir import OpGraph
from graphs.ops import backward_readers, kept_mask, staying_buffer_bytes


@njit(cache=True)
def _reset(p, n, D, out_ptr, out_dst, tcount, tbytes, free):
    """Zero the workspaces a schedule of ``p`` used (copy counts and bytes, resources' free times)."""
    for u in range(n):
        for k in range(out_ptr[u], out_ptr[u + 1]):
            slot = u * D + p[out_dst[k]]
            tcount[slot] = 0
            tbytes[slot] = 0
    for r in range(free.shape[0]):
        free[r] = 0.0


@njit(cache=True)
def _batch(
    op_devices,
    n,
    D,
    out_ptr,
    out_dst,
    out_eb,
    in_ptr,
    in_src,
    fwd_t,
    bwd_t,
    lat,
    bw,
    static_b,
    act_b,
    param_b,
    moved_b,
    cap,
    launch,
    update_bw,
    step_time_s,
    oom,
    eager,
    orders,
    host,
    issue_f,
    issue_b,
    segs,
    nseg,
    grad,
    hc,
    want_over,
    over,
    keep,
    home_rows,
    ck_rows,
    step_pairs,
):
    """Step time and OOM flag of every row of ``op_devices`` (a ``[K, n]`` batch).

    ``eager``: use :func:`envs.sim.kernel_eager.eager_schedule` with issue order ``orders[k]`` (or ``orders[0]``
    for every row when ``orders`` has one row) and host program
    ``segs[k, :nseg[k]]`` (or row 0's for every row); else :func:`envs.sim.kernel_dataflow.dataflow_schedule`.
    ``want_over``: fill ``over[k]``, for an OOM row, with the largest peak over
    capacity among the devices that overflow; otherwise the check stops at the
    first overflowing device. ``home_rows``: ``(hm, hmc, hbc, hgc)``, each per row (or row 0 for every row): the
    home device of each offloaded op's parameters, -1 for the others; the home of the copies made for each op, -1
    for none, their bytes and their gradients' bytes (:mod:`envs.sim.kernel_homes`). ``ck_rows``: per row (or row 0 for
    every row), each op's checkpointed block, -1 for none (:mod:`envs.sim.kernel_checkpointing`). ``step_pairs``:
    ``(owner, reader, call)``: the pairs of :func:`envs.sim.homes.copy_pairs` whose offloaded owners are stepped
    during the backward (a plan's ``host_step`` "backward", :func:`envs.sim.kernel_homes.host_step_chain`; empty:
    none are), and per home device the fixed cost of one call of the worker that steps them.
    """
    nD = n * D
    pend_f = np.zeros(n, dtype=np.int64)
    ready_f = np.zeros(n)
    pend_b = np.zeros(n, dtype=np.int64)
    ready_b = np.zeros(n)
    tcount = np.zeros(nD, dtype=np.int64)
    tbytes = np.zeros(nD, dtype=np.int64)
    gpend = np.zeros(nD, dtype=np.int64)
    gready = np.zeros(nD)
    free = np.zeros(D + D * D)
    ntask = 2 * n + 2 * nD
    seq = np.zeros(ntask, dtype=np.int64)
    pend = np.zeros(ntask, dtype=np.int64)
    ready = np.zeros(ntask)
    fut = np.empty(2 * ntask)
    avl = np.empty(2 * ntask)
    h = np.empty(2 * ntask)
    start = np.zeros(ntask)
    end = np.zeros(ntask)
    pb = np.zeros(D)
    sb = np.zeros(D, dtype=np.int64)
    ub = np.zeros(D, dtype=np.int64)
    bytes_of, consumers, copies, ws = (
        (param_b, static_b, act_b, moved_b),
        (out_ptr, out_dst),
        (tcount, tbytes, gpend),
        (sb, ub),
    )
    ring = np.full(4 * D, -1, dtype=np.int64)
    ht = np.zeros((7, n))
    rc = np.zeros((3, n))
    pair_o, pair_r, step_call = step_pairs
    done = np.full(n, -1.0)
    for k in range(op_devices.shape[0]):
        p = op_devices[k]
        hm_rows, hmc_rows, hbc_rows, hgc_rows = home_rows
        hm = hm_rows[k] if hm_rows.shape[0] > 1 else hm_rows[0]
        hmc = hmc_rows[k] if hmc_rows.shape[0] > 1 else hmc_rows[0]
        hbc = hbc_rows[k] if hbc_rows.shape[0] > 1 else hbc_rows[0]
        hgc = hgc_rows[k] if hgc_rows.shape[0] > 1 else hgc_rows[0]
        ck = ck_rows[k] if ck_rows.shape[0] > 1 else ck_rows[0]
        prepare(p, n, ck, rc, fwd_t, issue_f, host)
        for i in range(n):
            ht[6, i] = 0.0  # the searches' plans keep the forward's last copies (kernel_homes.refetch)
        homes = (hmc, hbc, ring, ht, ck, rc, hm, param_b, hgc)
        if eager:
            order = orders[k] if orders.shape[0] > 1 else orders[0]
            q = k if segs.shape[0] > 1 else 0
            t_end = eager_schedule(
                p,
                order,
                segs[q, : nseg[q]],
                n,
                D,
                out_ptr,
                out_dst,
                out_eb,
                in_ptr,
                in_src,
                fwd_t,
                bwd_t,
                lat,
                bw,
                host,
                issue_f,
                issue_b,
                grad,
                hc,
                tcount,
                tbytes,
                gpend,
                gready,
                seq,
                pend,
                ready,
                fut,
                avl,
                free,
                start,
                end,
                homes,
            )
        else:
            t_end = dataflow_schedule(
                p,
                n,
                D,
                out_ptr,
                out_dst,
                out_eb,
                in_ptr,
                in_src,
                fwd_t,
                bwd_t,
                lat,
                bw,
                pend_f,
                ready_f,
                pend_b,
                ready_b,
                tcount,
                tbytes,
                gpend,
                gready,
                free,
                h,
                start,
                end,
            )
        # the optimizer step after the backward, kept in this loop: as a call of its own the eager batch ran ~9%
        # slower (LLVM then inlined the schedule into this loop)
        if eager and pair_o.shape[0] > 0:  # parameters stepped during the backward (backward() returns after them)
            t_end = host_step_chain(n, hm, hmc, ht, pair_o, pair_r, param_b, step_call, update_bw, done, t_end)
        for d in range(D):
            pb[d] = 0.0
        for i in range(n):
            if done[i] < 0:  # the others, stepped after the backward
                pb[hm[i] if hm[i] >= 0 else p[i]] += param_b[i]  # on its parameters' home
        update_s = 0.0
        for d in range(D):
            if pb[d] > 0:
                device_update_s = update_time_s(pb[d], launch[d], update_bw[d])
                if device_update_s > update_s:
                    update_s = device_update_s
        step_time_s[k] = t_end + update_s
        oom[k], over[k] = over_capacity(
            p, n, D, bytes_of, cap, grad, keep, consumers, copies, start, end, want_over, ws, homes
        )
        _reset(p, n, D, out_ptr, out_dst, tcount, tbytes, free)


def read_only(values) -> np.ndarray:
    """``values`` as a new C-contiguous float64 array that cannot be written."""
    out = np.array(values, dtype=np.float64, order="C")
    out.setflags(write=False)
    return out


class KernelData:
    """Per-(graph, cluster) arrays in the layout the kernel wants.

    Built from plain data: the graph and cluster, the ``[num_ops, num_devices]``
    op times and the per-op byte counts of :mod:`envs.sim.cost`, the executor
    model (``"eager"`` or ``"dataflow"``) and, for eager, the host program
    ``segments`` over issue positions (:func:`envs.microbatch.issue_segments`).
    """

    def __init__(
        self,
        g: OpGraph,
        c: Cluster,
        fwd_s: np.ndarray,
        bwd_s: np.ndarray,
        static_bytes: np.ndarray,
        act_bytes: np.ndarray,
        executor: str,
        segments: np.ndarray | None = None,
        grad: np.ndarray | None = None,
        issue: tuple[np.ndarray, np.ndarray] | None = None,
        host_costs: cost.HostCosts | None = None,
        kept: np.ndarray | None = None,
        microbatches: int = 1,
        readers: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
        home_bytes: np.ndarray | None = None,
    ) -> None:
        self.n, self.D = g.num_ops, c.num_devices
        self.n0 = self.n // microbatches  # the ops of one microbatch copy (envs.sim.sim_graph.schedule_graph)
        # which ops have a backward (graphs.ops.grad_mask); default all
        self.grad = np.ones(self.n, dtype=np.bool_) if grad is None else np.ascontiguousarray(grad, dtype=np.bool_)
        # which kept outputs live to their own backward, and the readers that free the others (backward_readers)
        own, rptr, ridx = backward_readers(g) if readers is None else readers
        # which outputs autograd keeps for backward (graphs.ops.saved_mask); the others are freed after their consumers
        self.kept = np.ascontiguousarray(kept_mask((own, rptr, ridx)) if kept is None else kept, dtype=np.bool_)
        self.readers = (
            np.ascontiguousarray(own, dtype=np.bool_),
            np.ascontiguousarray(rptr, dtype=np.int64),
            np.ascontiguousarray(ridx, dtype=np.int64),
        )
        # the host thread's program (eager): one forward then one backward, unless given
        self.segs = np.ascontiguousarray(
            [[0, 0, self.n], [1, 0, self.n]] if segments is None else segments, dtype=np.int64
        ).reshape(-1, 3)
        self.cluster = c
        out_ptr, out_dst, out_eid = g.out_csr
        in_ptr, in_src, _ = g.in_csr
        self.out_ptr = out_ptr.astype(np.int64)
        self.out_dst = out_dst.astype(np.int64)
        self.out_eb = g.edge_bytes[out_eid].astype(np.int64)
        self.in_ptr = in_ptr.astype(np.int64)
        self.in_src = in_src.astype(np.int64)
        self.fwd_t = np.ascontiguousarray(fwd_s)
        self.bwd_t = np.ascontiguousarray(bwd_s)
        # copies, always read-only: a preset's arrays are read-only and a loaded cluster's writable, and numba
        # compiles each kernel once per kind (in every fresh checkout and test worker)
        self.lat = read_only(c.latency_s)
        self.bw = read_only(c.bandwidth_bytes_per_s)
        # what every executor's kernel reads of the graph and the cluster, in their arguments' order
        self.dag = (
            self.out_ptr,
            self.out_dst,
            self.out_eb,
            self.in_ptr,
            self.in_src,
            self.fwd_t,
            self.bwd_t,
            self.lat,
            self.bw,
        )
        self.static_b = np.asarray(static_bytes).astype(np.int64)
        self.act_b = np.asarray(act_bytes).astype(np.int64)
        self.param_b = g.param_bytes.astype(np.float64)
        # what an op's home holds where it has one apart, trainable or frozen (graphs.ops.home_bytes; the SimEnv's)
        held = g.param_bytes.astype(np.int64) if home_bytes is None else np.asarray(home_bytes, dtype=np.int64)
        self.home_b = held.astype(np.float64)
        # the static bytes that live on an op's parameters' home (envs.sim.homes.param_devices): all but the buffers
        # that stay with it (a frozen weight it owns alone moves)
        self.moved_b = self.static_b - staying_buffer_bytes(g, held)
        self.cap = c.memory_bytes.astype(np.float64)
        self.launch = c.launch_overhead_s.astype(np.float64)
        self.update_bw = c.update_bw_bytes_per_s.astype(np.float64)  # the optimizer step's bandwidth
        self.host = c.host.copy()  # writable: the kernels' cached signatures take one
        # host seconds issuing each op's forward / backward on each device (envs.sim.cost.issue_times)
        if issue is None:
            issue = cost.issue_times(g, c, self.fwd_t)
        self.issue_f = np.ascontiguousarray(issue[0], dtype=np.float64)
        self.issue_b = np.ascontiguousarray(issue[1], dtype=np.float64)
        # the host's staging copies and contention (envs.sim.cost.host_costs), as one [4, D] array
        self.hc = np.ascontiguousarray(
            np.stack(cost.host_costs(c) if host_costs is None else host_costs), dtype=np.float64
        )
        self.eager = executor == "eager"
        self.node_order = np.arange(self.n, dtype=np.int64)[None, :]
        self.no_homes = np.full((1, self.n), -1, dtype=np.int64)
        self.no_blocks = self.no_homes
        # the fixed cost of one call of the worker stepping in the backward, per home (envs.sim.kernel_homes)
        self.step_call = np.ascontiguousarray(c.step_call_s, dtype=np.float64)
        self.no_pairs = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), self.step_call)

    def update_s(self, param_devices: np.ndarray) -> np.ndarray:
        """Optimizer-step seconds per device with each op's parameters on ``param_devices``
        (:func:`envs.sim.cost.update_times_s`)."""
        return cost.update_times_s(np.bincount(param_devices, weights=self.param_b, minlength=self.D), self.cluster)

    def _homes(self, homes: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(hm, hmc, hbc, hgc)`` rows (``[1 or K, n]``) of ``homes``: the home device of each offloaded op's
        parameters (-1 elsewhere), or those with the copies of :func:`envs.sim.homes.copy_rows` (``(hm, hmc, hbc,
        hgc)``: the copies' homes, bytes and gradients' bytes)."""
        if homes is None:
            return self.no_homes, self.no_homes, self.home_b[None, :], self.param_b[None, :]
        if isinstance(homes, tuple):
            hm, hmc, hbc, hgc = homes
        else:
            hm, hmc, hbc, hgc = homes, homes, self.home_b[None, :], self.param_b[None, :]
        return (
            np.ascontiguousarray(np.atleast_2d(hm), dtype=np.int64),
            np.ascontiguousarray(np.atleast_2d(hmc), dtype=np.int64),
            np.ascontiguousarray(np.atleast_2d(hbc), dtype=np.float64),
            np.ascontiguousarray(np.atleast_2d(hgc), dtype=np.float64),
        )

    def _blocks(self, blocks: np.ndarray | None) -> np.ndarray:
        """Rows of each op's checkpointed block (-1 elsewhere), ``[1 or K, n]`` int64."""
        if blocks is None:
            return self.no_blocks
        return np.ascontiguousarray(np.atleast_2d(blocks), dtype=np.int64)

    def _orders(self, order: np.ndarray | None) -> np.ndarray:
        if order is None:
            return self.node_order
        return np.ascontiguousarray(np.atleast_2d(order), dtype=np.int64)

    def _programs(self, programs: list[np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
        """Host programs as a padded ``[R, S, 3]`` array and their lengths (default: this data's own, shared)."""
        if programs is None:
            return self.segs[None], np.array([len(self.segs)], dtype=np.int64)
        S = max(len(s) for s in programs)
        out = np.zeros((len(programs), S, 3), dtype=np.int64)
        for k, s in enumerate(programs):
            out[k, : len(s)] = s
        return out, np.array([len(s) for s in programs], dtype=np.int64)

    def run_batch(
        self,
        op_devices: np.ndarray,
        order: np.ndarray | None = None,
        programs: list[np.ndarray] | None = None,
        over: np.ndarray | None = None,
        homes: np.ndarray | None = None,
        blocks: np.ndarray | None = None,
        step_pairs: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``order``: None (node order), one issue order for every row, or one per row.

        ``programs``: one host program per row (eager; default this data's own for every row).
        ``over``: an array to fill with each OOM row's worst peak / capacity (0 for the others).
        ``homes``: the home device of each offloaded op's parameters, -1 for the others, one row for every row
        or one per row (default none). ``blocks``: each op's checkpointed block, -1 for none, the same way.
        ``step_pairs``: the ``(owner, reader)`` pairs whose offloaded owners are stepped during the backward
        (:func:`envs.sim.homes.copy_pairs`; default none).
        """
        op_devices = np.ascontiguousarray(op_devices, dtype=np.int64)
        K = op_devices.shape[0]
        step_time_s = np.empty(K)
        oom = np.zeros(K, dtype=np.bool_)
        segs, nseg = self._programs(programs)
        _batch(
            op_devices,
            self.n,
            self.D,
            *self.dag,
            self.static_b,
            self.act_b,
            self.param_b,
            self.moved_b,
            self.cap,
            self.launch,
            self.update_bw,
            step_time_s,
            oom,
            self.eager,
            self._orders(order),
            self.host,
            self.issue_f,
            self.issue_b,
            segs,
            nseg,
            self.grad,
            self.hc,
            over is not None,
            over if over is not None else np.zeros(K),
            (self.kept, self.n0, *self.readers),
            self._homes(homes),
            self._blocks(blocks),
            self.no_pairs
            if step_pairs is None
            else (*(np.ascontiguousarray(a, dtype=np.int64) for a in step_pairs), self.step_call),
        )
        return step_time_s, oom

    def schedule(
        self,
        op_devices: np.ndarray,
        order: np.ndarray | None = None,
        program: np.ndarray | None = None,
        homes: np.ndarray | None = None,
        blocks: np.ndarray | None = None,
        *,
        keep_last: bool = True,
    ) -> Schedule:
        """The full schedule of one placement (``order``: its issue order; ``program``: its host program; ``homes``:
        the home device of each offloaded op's parameters, -1 for the others; ``blocks``: each op's checkpointed
        block, -1 for none; ``keep_last``: the forward's last two home copies per device kept for the backward, a
        plan's ``home_copies`` "keep-last", else every copy made again)."""
        n, D = self.n, self.D
        nD = n * D
        p = np.ascontiguousarray(op_devices, dtype=np.int64)
        hm, hmc, hbc, hgc = (rows[0] for rows in self._homes(homes))
        ck = self._blocks(blocks)[0]
        rc = np.zeros((3, n))
        any_block = prepare(p, n, ck, rc, self.fwd_t, self.issue_f, self.host)
        ht = np.zeros((7, n))
        if not keep_last:
            ht[6] = -1.0  # no copy kept (kernel_homes.refetch)
        ntask = 2 * n + 2 * nD
        start = np.zeros(ntask)
        end = np.zeros(ntask)
        tcount = np.zeros(nD, dtype=np.int64)
        tbytes = np.zeros(nD, dtype=np.int64)
        if self.eager:
            t_end = eager_schedule(
                p,
                self._orders(order)[0],
                self.segs if program is None else np.ascontiguousarray(program, dtype=np.int64),
                n,
                D,
                *self.dag,
                self.host,
                self.issue_f,
                self.issue_b,
                self.grad,
                self.hc,
                tcount,
                tbytes,
                np.zeros(nD, dtype=np.int64),
                np.zeros(nD),
                np.zeros(ntask, dtype=np.int64),
                np.zeros(ntask, dtype=np.int64),
                np.zeros(ntask),
                np.empty(2 * ntask),
                np.empty(2 * ntask),
                np.zeros(D + D * D),
                start,
                end,
                (hmc, hbc, np.full(4 * D, -1, dtype=np.int64), ht, ck, rc, hm, self.param_b, hgc),
            )
        else:
            t_end = self._dataflow(p, start, end, tcount, tbytes)
        slots = np.flatnonzero(tcount > 0)
        u, d = slots // D, slots % D
        both = lambda a, b: np.concatenate([a, b])  # noqa: E731
        bwd_ids = 2 * n - 1 - np.arange(n)
        return Schedule(
            op_devices=p.astype(np.int32),
            fwd_start_s=start[:n].copy(),
            fwd_end_s=end[:n].copy(),
            bwd_start_s=start[bwd_ids],
            bwd_end_s=end[bwd_ids],
            xfer_kind=both(np.full(len(slots), ACT, dtype=np.int8), np.full(len(slots), GRAD, dtype=np.int8)),
            xfer_op=both(u, u),
            xfer_src=both(p[u], d),
            xfer_dst=both(d, p[u]),
            xfer_bytes=both(tbytes[slots], np.where(self.grad[u], tbytes[slots], 0)),
            xfer_start_s=both(start[2 * n + slots], start[2 * n + nD + slots]),
            xfer_end_s=both(end[2 * n + slots], end[2 * n + nD + slots]),
            backward_end_s=float(t_end),
            update_s=self.update_s(np.where(hm >= 0, hm, p)),
            homes=home_times(hmc, hbc, ht, hm, hgc),
            blocks=ck.copy() if any_block else np.zeros(0, dtype=np.int64),
            recompute_start_s=np.where(ck >= 0, rc[2], np.nan) if any_block else np.zeros(0),
        )

    def _dataflow(
        self, p: np.ndarray, start: np.ndarray, end: np.ndarray, tcount: np.ndarray, tbytes: np.ndarray
    ) -> float:
        """The dataflow schedule of ``p`` into ``start`` and ``end`` (by task id) and ``tcount``/``tbytes`` (zeroed,
        ``n * D``); returns the backward end."""
        n, D = self.n, self.D
        nD = n * D
        return dataflow_schedule(
            p,
            n,
            D,
            *self.dag,
            np.zeros(n, dtype=np.int64),
            np.zeros(n),
            np.zeros(n, dtype=np.int64),
            np.zeros(n),
            tcount,
            tbytes,
            np.zeros(nD, dtype=np.int64),
            np.zeros(nD),
            np.zeros(D + D * D),
            np.empty(2 * len(start)),
            start,
            end,
        )

    def dataflow_starts(self, op_devices: np.ndarray) -> np.ndarray:
        """The start of every op's forward in the dataflow schedule of ``op_devices``: :meth:`schedule`'s
        ``fwd_start_s`` under the dataflow executor, without the rest of the schedule (the order planner reads only
        these, once for every placement a search scores in planned order)."""
        n, D = self.n, self.D
        ntask = 2 * n + 2 * n * D
        start, end = np.zeros(ntask), np.zeros(ntask)
        p = np.ascontiguousarray(op_devices, dtype=np.int64)
        self._dataflow(p, start, end, np.zeros(n * D, dtype=np.int64), np.zeros(n * D, dtype=np.int64))
        return start[:n]


def home_times(hmc: np.ndarray, hbc: np.ndarray, ht: np.ndarray, hm: np.ndarray, hgc: np.ndarray) -> HomeTimes:
    """The :class:`envs.sim.homes.HomeTimes` of a kernel schedule: the copies made for the ops ``hmc >= 0`` (``hbc``
    bytes each, their gradients ``hgc``), and the offloaded ops (``hm >= 0``)."""
    ops = np.flatnonzero(hmc >= 0)
    owners = np.flatnonzero(hm >= 0)
    return HomeTimes(
        ops,
        hmc[ops],
        hbc[ops].astype(np.int64),
        *(ht[r, ops].copy() for r in range(6)),
        owners,
        hm[owners],
        hgc[ops].astype(np.int64),
        ht[6, ops] > 0.0,
    )

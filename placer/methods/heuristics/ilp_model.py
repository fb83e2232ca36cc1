"""The CP-SAT model of the ``ilp`` heuristic (:mod:`placer.methods.heuristics.ilp` describes it) and its solve.

:class:`_Model` builds the model part by part over an :class:`Items` problem;
:func:`solve` completes a hint, runs the solver and reads the plan back.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from envs.sim import cost
from graphs import PlacerError
from placer.methods.heuristics.ilp_items import Items
from placer.methods.registry import HeuristicUnavailable, install_hint


def _reach(K: int, edges: list[tuple[int, int, int]]) -> list[int]:
    """Bitset of the items reachable from each item (items are topologically numbered)."""
    succ: list[list[int]] = [[] for _ in range(K)]
    for u, v, _ in edges:
        succ[u].append(v)
    reach = [0] * K
    for u in range(K - 1, -1, -1):
        r = 0
        for v in succ[u]:
            r |= (1 << v) | reach[v]
        reach[u] = r
    return reach


@dataclass
class Solution:
    item_device: np.ndarray
    item_order: np.ndarray  # items in issue order
    status: str
    objective_s: float | None
    bound_s: float | None
    solve_s: float


class _Model:
    """The CP-SAT model of the module docstring for one item problem, built part by part (in this order).

    Every part adds its variables and constraints to ``self.m`` in a fixed order, so a
    model, and so the solver's run for a seed, is the same every time.
    """

    def __init__(self, cp_model: Any, items: Items, cluster: Any) -> None:
        self.items, self.cluster = items, cluster
        self.K, self.D = items.fwd.shape
        self.host = cluster.host
        self.gpus = [d for d in range(self.D) if not self.host[d]]
        self.hosts = [d for d in range(self.D) if self.host[d]]
        self.lat = np.asarray(cluster.latency_s, dtype=np.float64)
        self.bw = np.asarray(cluster.bandwidth_bytes_per_s, dtype=np.float64)
        self.edges = items.edges
        self.E = len(self.edges)
        self.N = self.K + self.E  # forward events: ops 0..K-1, copies K..K+E-1 (copy k for edge k)
        self.consumers: list[list[tuple[int, int]]] = [[] for _ in range(self.K)]  # u -> [(v, bytes)]
        for u, v, nb in self.edges:
            self.consumers[u].append((v, nb))
        self._time_unit()
        self.m = cp_model.CpModel()
        TRUE = self.m.NewBoolVar("true")
        self.m.Add(TRUE == 1)
        self.same_cache: dict[tuple[int, int], Any] = {}

    # ---------------------------------------------------------------- helpers
    def copy_s(self, a: int, b: int, nbytes: float) -> float:
        return float(self.lat[a, b] + nbytes / self.bw[a, b])

    def _time_unit(self) -> None:
        """Integer time: a unit fine enough that rounding cannot reorder plans that differ by more than a few ns."""
        items, K, D = self.items, self.K, self.D
        longest = (items.fwd + items.bwd + items.launch).max(axis=1).sum() if K else 0.0
        comm = (
            sum(2 * max(self.copy_s(a, b, nb) for a in range(D) for b in range(D) if a != b) for _, _, nb in self.edges)
            if D > 1
            else 0.0
        )
        upd = float(cost.update_times_s(np.array([items.params.sum()] * D), self.cluster).max()) if K else 0.0
        horizon_s = 2.0 * (longest + comm + upd) + 1e-6
        self.unit = max(horizon_s / 1e9, 1e-13)
        self.H = int(horizon_s / self.unit) + 1

    def q(self, seconds: float) -> int:
        return int(round(seconds / self.unit))

    def newt(self, name: str) -> Any:
        return self.m.NewIntVar(0, self.H, name)

    def on_if(self, ct: Any, lits: list[Any]) -> None:
        """Enforce ``ct`` under the conjunction ``lits`` (Python bools filtered; False drops it)."""
        real = []
        for lit in lits:
            if lit is False:
                return
            if lit is not True:
                real.append(lit)
        if real:
            ct().OnlyEnforceIf(real)
        else:
            ct()

    def same(self, v: int, w: int) -> Any:
        """A literal: items ``v`` and ``w`` are on one device."""
        m, x = self.m, self.x
        if v == w:
            return True
        key = (min(v, w), max(v, w))
        if key not in self.same_cache:
            s = m.NewBoolVar(f"same{key}")
            zs = []
            for d in range(self.D):
                z = m.NewBoolVar("")
                m.AddImplication(z, x[v][d])
                m.AddImplication(z, x[w][d])
                m.AddBoolOr([x[v][d].Not(), x[w][d].Not(), z])
                zs.append(z)
            m.Add(s == sum(zs))
            self.same_cache[key] = s
        return self.same_cache[key]

    @staticmethod
    def neg(lit: Any) -> Any:
        return (not lit) if isinstance(lit, bool) else lit.Not()

    def conj(self, lits: list[Any], name: str = "") -> Any:
        """A literal equal to the conjunction of ``lits``."""
        lits = [lit for lit in lits if lit is not True]
        if any(lit is False for lit in lits):
            return False
        if not lits:
            return True
        if len(lits) == 1:
            return lits[0]
        z = self.m.NewBoolVar(name)
        for lit in lits:
            self.m.AddImplication(z, lit)
        self.m.AddBoolOr([lit.Not() for lit in lits] + [z])
        return z

    def any_of(self, lits: list[Any], name: str) -> Any:
        lits = [lit for lit in lits if lit is not False]
        if not lits:
            return False
        z = self.m.NewBoolVar(name)
        self.m.Add(z == sum(lits))  # the link literals of one copy exclude each other
        return z

    def ev_before(self, e1: int, e2: int) -> Any:
        v1, v2 = self.ev_item[e1], self.ev_item[e2]
        if v1 == v2:
            return self.slot[e1] < self.slot[e2]
        return self.before[v1, v2]

    # ---------------------------------------------------------------- the parts
    def devices(self) -> None:
        """``x[i][d]``: item i on device d, one each; the static bytes and kept activations fit every device."""
        m, items, K, D = self.m, self.items, self.K, self.D
        x = self.x = [[m.NewBoolVar(f"x{i}_{d}") for d in range(D)] for i in range(K)]
        for i in range(K):
            m.AddExactlyOne(x[i])
            if items.fixed is not None and items.fixed[i] >= 0:
                m.Add(x[i][int(items.fixed[i])] == 1)
        cap = np.asarray(self.cluster.memory_bytes, dtype=np.float64)
        for d in range(D):
            if items.mem.sum() > cap[d]:
                m.Add(sum(int(items.mem[i]) * x[i][d] for i in range(K) if items.mem[i] > 0) <= int(cap[d]))

    def issue_order(self) -> None:
        """``pos[i]``: the issue position, a topological permutation; ``before[i, j]``, literal or known."""
        m, K = self.m, self.K
        reach = _reach(K, self.edges)
        pos = self.pos = [m.NewIntVar(0, max(K - 1, 0), f"pos{i}") for i in range(K)]
        if K > 1:
            m.AddAllDifferent(pos)
        before = self.before = {}
        rank = self.items.rank
        for i in range(K):
            if rank is not None:  # a fixed order: "before" is known for every pair, and most constraints drop out
                m.Add(pos[i] == int(rank[i]))
            for j in range(i + 1, K):
                if rank is not None:
                    before[i, j], before[j, i] = bool(rank[i] < rank[j]), bool(rank[j] < rank[i])
                    continue
                if reach[i] >> j & 1:
                    before[i, j], before[j, i] = True, False
                    continue
                b = m.NewBoolVar(f"o{i}_{j}")
                m.Add(pos[i] < pos[j]).OnlyEnforceIf(b)
                m.Add(pos[i] > pos[j]).OnlyEnforceIf(b.Not())
                before[i, j], before[j, i] = b, b.Not()
        for u, v, _ in self.edges:
            m.Add(pos[u] < pos[v])

    def forward_ops(self) -> None:
        """The items' forward events: start, end, and the host clock before and after each."""
        m, items, x, K, D, q, newt = self.m, self.items, self.x, self.K, self.D, self.q, self.newt
        self.ev_item = list(range(K)) + [v for _, v, _ in self.edges]
        self.slot = [10**9] * K
        count = [0] * K
        for u, v, _ in self.edges:
            self.slot.append(count[v])
            count[v] += 1
        N = self.N
        S = self.S = [newt(f"s{e}") for e in range(N)]
        En = self.En = [newt(f"e{e}") for e in range(N)]
        hpre = self.hpre = [newt(f"hpre{e}") for e in range(N)]
        hpost = self.hpost = [newt(f"hpost{e}") for e in range(N)]
        for i in range(K):
            m.Add(En[i] == S[i] + sum(q(items.fwd[i, d]) * x[i][d] for d in range(D)))
            m.Add(S[i] >= hpre[i])
            m.Add(hpost[i] >= hpre[i])
            for d in self.gpus:
                if items.launch[i, d] > 0:
                    m.Add(hpost[i] >= hpre[i] + q(items.launch[i, d])).OnlyEnforceIf(x[i][d])
                m.Add(S[i] >= hpost[i]).OnlyEnforceIf(x[i][d])
            for d in self.hosts:
                m.Add(hpost[i] >= En[i]).OnlyEnforceIf(x[i][d])

    def forward_copies(self) -> None:
        """One copy per (producer, consumer device), made at the first consumer issued there: ``active``, ``link``."""
        m, x, K, D, q, same, conj = self.m, self.x, self.K, self.D, self.q, self.same, self.conj
        S, En, hpre, hpost, before, copy_s, on_if = (
            self.S,
            self.En,
            self.hpre,
            self.hpost,
            self.before,
            self.copy_s,
            self.on_if,
        )
        active, link = self.active, self.link = [], []
        for k, (u, v, nb) in enumerate(self.edges):
            e = K + k
            diff = same(u, v).Not()
            blockers = []
            for w, _ in self.consumers[u]:
                if w != v:
                    blk = conj([same(v, w), before[w, v]], f"blk{k}_{w}")
                    if blk is not False:
                        blockers.append(blk)
            act = m.NewBoolVar(f"act{k}")
            m.AddImplication(act, diff)
            for blk in blockers:
                m.AddImplication(act, self.neg(blk)) if blk is not True else m.Add(act == 0)
            m.AddBoolOr([diff.Not()] + [b for b in blockers if b is not True] + [act])
            active.append(act)
            lk = {}
            for a in range(D):
                for b in range(D):
                    if a != b:
                        lk[a, b] = conj([act, x[u][a], x[v][b]], f"lk{k}_{a}_{b}")
                        dur = q(copy_s(a, b, nb))
                        m.Add(En[e] >= S[e] + dur).OnlyEnforceIf(lk[a, b])
                        for w, nbw in self.consumers[u]:
                            if w != v and nbw > nb:
                                on_if(lambda: m.Add(En[e] >= S[e] + q(copy_s(a, b, nbw))), [lk[a, b], same(v, w)])
            link.append(lk)
            m.Add(S[e] >= hpre[e])
            m.Add(hpost[e] >= hpre[e])
            for h in self.hosts:
                m.Add(hpost[e] >= En[e]).OnlyEnforceIf([act, x[v][h]])
            for w, _ in self.consumers[u]:
                on_if(lambda: m.Add(S[w] >= En[e]), [act, same(v, w)])

    def forward_streams(self) -> None:
        """The host issues events in order; every GPU stream and every link serves its events in issue order."""
        m, x, K, E, on_if = self.m, self.x, self.K, self.E, self.on_if
        S, En, hpre, hpost, active, link = self.S, self.En, self.hpre, self.hpost, self.active, self.link
        on = self.on = [{c: x[i][c] for c in self.gpus} for i in range(K)]  # which events use GPU c's stream
        for k, (u, v, _) in enumerate(self.edges):
            per = {}
            for c in self.gpus:
                z = m.NewBoolVar(f"on{k}_{c}")
                m.AddImplication(z, active[k])
                m.AddBoolOr([x[u][c], x[v][c], z.Not()])
                m.AddBoolOr([active[k].Not(), x[u][c].Not(), z])
                m.AddBoolOr([active[k].Not(), x[v][c].Not(), z])
                per[c] = z
            on.append(per)
        for e1 in range(self.N):
            for e2 in range(self.N):
                if e1 == e2:
                    continue
                bf = self.ev_before(e1, e2)
                if bf is False:
                    continue
                on_if(lambda: m.Add(hpre[e2] >= hpost[e1]), [bf])
                for c in self.gpus:
                    on_if(lambda: m.Add(S[e2] >= En[e1]), [bf, on[e1][c], on[e2][c]])
        for k1 in range(E):  # links, forward: in issue order
            for k2 in range(E):
                if k1 == k2:
                    continue
                bf = self.ev_before(K + k1, K + k2)
                if bf is False:
                    continue
                for ab, l1 in link[k1].items():
                    on_if(lambda: m.Add(S[K + k2] >= En[K + k1]), [bf, l1, link[k2][ab]])

    def backward_tasks(self) -> None:
        """Backward tasks after the forward is issued, each GPU and the host queue in reverse issue order."""
        m, items, x, K, D, q, newt, on_if, before = (
            self.m,
            self.items,
            self.x,
            self.K,
            self.D,
            self.q,
            self.newt,
            self.on_if,
            self.before,
        )
        HF = newt("hf")
        for e in range(self.N):
            m.Add(HF >= self.hpost[e])
        BS = self.BS = [newt(f"bs{i}") for i in range(K)]
        BE = self.BE = [newt(f"be{i}") for i in range(K)]
        FD = self.FD = {c: newt(f"fd{c}") for c in self.gpus}
        for e in range(self.N):
            for c in self.gpus:
                m.Add(FD[c] >= self.En[e]).OnlyEnforceIf(self.on[e][c])
        ishost = self.ishost = []
        for i in range(K):
            if len(self.hosts) == 1:
                ishost.append(x[i][self.hosts[0]])
            elif self.hosts:
                z = m.NewBoolVar("")
                m.Add(z == sum(x[i][h] for h in self.hosts))
                ishost.append(z)
            else:
                ishost.append(False)
            m.Add(BE[i] == BS[i] + sum(q(items.bwd[i, d]) * x[i][d] for d in range(D)))
            m.Add(BS[i] >= HF)
            for c in self.gpus:
                m.Add(BS[i] >= FD[c]).OnlyEnforceIf(x[i][c])
        for i in range(K):
            for j in range(K):
                if i == j or before[i, j] is False:
                    continue
                for c in self.gpus:
                    on_if(lambda: m.Add(BS[i] >= BE[j]), [before[i, j], x[i][c], x[j][c]])
                on_if(lambda: m.Add(BS[i] >= BE[j]), [before[i, j], ishost[i], ishost[j]])

    def gradient_copies(self) -> None:
        """A gradient copy waits for its consumers' backward and its link, a producer's backward for its copies."""
        m, K, E, q, newt, on_if, same, before = (
            self.m,
            self.K,
            self.E,
            self.q,
            self.newt,
            self.on_if,
            self.same,
            self.before,
        )
        link, active, BS, BE, En, copy_s = self.link, self.active, self.BS, self.BE, self.En, self.copy_s
        GS = self.GS = [newt(f"gs{k}") for k in range(E)]
        GE = self.GE = [newt(f"ge{k}") for k in range(E)]
        for k, (u, v, nb) in enumerate(self.edges):
            for w, _ in self.consumers[u]:
                on_if(lambda: m.Add(GS[k] >= BE[w]), [active[k], same(v, w)])
            for (a, b), lit in link[k].items():
                m.Add(GE[k] >= GS[k] + q(copy_s(b, a, nb))).OnlyEnforceIf(lit)
                for w, nbw in self.consumers[u]:
                    if w != v and nbw > nb:
                        on_if(lambda: m.Add(GE[k] >= GS[k] + q(copy_s(b, a, nbw))), [lit, same(v, w)])
                # the link b -> a carries the forward copies first
                for k2 in range(E):
                    if (b, a) in link[k2]:
                        on_if(lambda: m.Add(GS[k] >= En[K + k2]), [lit, link[k2][b, a]])
            m.Add(BS[u] >= GE[k]).OnlyEnforceIf(active[k])
        for k1, (u1, _, _) in enumerate(self.edges):
            for k2, (u2, _, _) in enumerate(self.edges):
                if u1 == u2 or before[u1, u2] is False:
                    continue
                for ab, l1 in link[k1].items():
                    on_if(lambda: m.Add(GS[k1] >= GE[k2]), [before[u1, u2], l1, link[k2][ab]])

    def blocking_copies(self) -> None:
        """A gradient copy between a GPU c and the host waits for c's stream and (host -> GPU) the host queue, and holds
        them.

        It waits for c's forward work and the backward tasks and blocking copies the
        reverse pass ran before it; afterwards c's stream (and, host -> GPU, the host
        queue) continues from its end.
        """
        m, K, E, host, on_if, any_of, before = self.m, self.K, self.E, self.host, self.on_if, self.any_of, self.before
        link, x, GS, GE, BS, BE, FD, ishost = (
            self.link,
            self.x,
            self.GS,
            self.GE,
            self.BS,
            self.BE,
            self.FD,
            self.ishost,
        )
        blk = [
            {
                c: any_of(
                    [lk for (a, b), lk in link[k].items() if (a == c and host[b]) or (b == c and host[a])],
                    f"blk{k}_{c}",
                )
                for c in self.gpus
            }
            for k in range(E)
        ]
        h2d = [any_of([lk for (a, b), lk in link[k].items() if not host[a] and host[b]], f"h2d{k}") for k in range(E)]
        for k, (u, _, _) in enumerate(self.edges):
            for c in self.gpus:
                lit = blk[k][c]
                if lit is False:
                    continue
                m.Add(GS[k] >= FD[c]).OnlyEnforceIf(lit)
                for w in range(K):
                    if w == u:
                        continue
                    on_if(lambda: m.Add(GS[k] >= BE[w]), [lit, before[u, w], x[w][c]])
                    on_if(lambda: m.Add(BS[w] >= GE[k]), [lit, before[w, u], x[w][c]])
                for k2, (u2, _, _) in enumerate(self.edges):
                    if u2 != u and blk[k2][c] is not False:
                        on_if(lambda: m.Add(GS[k] >= GE[k2]), [lit, blk[k2][c], before[u, u2]])
            if h2d[k] is False:
                continue
            for w in range(K):
                if w != u:
                    on_if(lambda: m.Add(GS[k] >= BE[w]), [h2d[k], before[u, w], ishost[w]])
                    on_if(lambda: m.Add(BS[w] >= GE[k]), [h2d[k], before[w, u], ishost[w]])
            for k2, (u2, _, _) in enumerate(self.edges):
                if u2 != u and h2d[k2] is not False:
                    on_if(lambda: m.Add(GS[k] >= GE[k2]), [h2d[k], h2d[k2], before[u, u2]])

    def no_overlaps(self) -> None:
        """Redundant ``NoOverlap`` constraints per GPU (forward and backward tasks) and per link (copies)."""
        m, items, x, K, D, q = self.m, self.items, self.x, self.K, self.D, self.q
        for c in self.gpus:
            ivs = []
            for i in range(K):
                ivs.append(m.NewOptionalFixedSizeIntervalVar(self.S[i], q(items.fwd[i, c]), x[i][c], ""))
                ivs.append(m.NewOptionalFixedSizeIntervalVar(self.BS[i], q(items.bwd[i, c]), x[i][c], ""))
            m.AddNoOverlap(ivs)
        for a in range(D):
            for b in range(D):
                if a == b or not self.edges:
                    continue
                ivs = []
                for k, (_, _, nb) in enumerate(self.edges):
                    ivs.append(
                        m.NewOptionalFixedSizeIntervalVar(
                            self.S[K + k], q(self.copy_s(a, b, nb)), self.link[k][a, b], ""
                        )
                    )
                    ivs.append(
                        m.NewOptionalFixedSizeIntervalVar(self.GS[k], q(self.copy_s(a, b, nb)), self.link[k][b, a], "")
                    )
                m.AddNoOverlap(ivs)

    def objective(self) -> None:
        """Minimise the backward end plus the largest optimizer update."""
        m, items, x, K, D, q, newt = self.m, self.items, self.x, self.K, self.D, self.q, self.newt
        M = newt("makespan")
        for i in range(K):
            m.Add(M >= self.En[i])
            m.Add(M >= self.BE[i])
        for k in range(self.E):
            m.Add(M >= self.En[K + k]).OnlyEnforceIf(self.active[k])
            m.Add(M >= self.GE[k]).OnlyEnforceIf(self.active[k])
        U = newt("update")
        mem_bw = np.asarray(self.cluster.update_bw_bytes_per_s, dtype=np.float64)
        launch_s = np.asarray(self.cluster.launch_overhead_s, dtype=np.float64)
        with_params = [i for i in range(K) if items.params[i] > 0]
        for d in range(D):
            load = sum(q(cost.UPDATE_TRAFFIC_MULTIPLIER * items.params[i] / mem_bw[d]) * x[i][d] for i in with_params)
            for i in with_params:
                m.Add(U >= q(launch_s[d]) + load).OnlyEnforceIf(x[i][d])
        m.Minimize(M + U)

    def build(self) -> "_Model":
        for part in (
            self.devices,
            self.issue_order,
            self.forward_ops,
            self.forward_copies,
            self.forward_streams,
            self.backward_tasks,
            self.gradient_copies,
            self.blocking_copies,
            self.no_overlaps,
            self.objective,
        ):
            part()
        return self


def solve(
    items: Items,
    cluster,
    *,
    time_limit_s: float = 60.0,
    num_workers: int = 1,
    seed: int = 0,
    hint_device: np.ndarray | None = None,
    hint_order: np.ndarray | None = None,
) -> Solution:
    """Build and solve the CP-SAT model of :mod:`placer.methods.heuristics.ilp`'s docstring."""
    try:
        from ortools.sat.python import cp_model  # an optional extra: loaded only when ilp runs
    except ImportError:
        raise HeuristicUnavailable(f"ilp: needs OR-Tools ({install_hint('ilp')})", "not installed") from None

    model = _Model(cp_model, items, cluster).build()
    m, x, pos, D, K = model.m, model.x, model.pos, model.D, model.K
    t0 = time.perf_counter()
    hinted = None
    if hint_device is not None and hint_order is not None:
        hinted = _complete_hint(cp_model, m, x, pos, hint_device, hint_order, max(0.25 * float(time_limit_s), 1.0))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(float(time_limit_s) - (time.perf_counter() - t0), 1.0)
    solver.parameters.num_workers = max(int(num_workers), 1)
    solver.parameters.random_seed = int(seed)
    solver.parameters.symmetry_level = 0  # symmetry detection and probing cost seconds on these models and find little
    solver.parameters.cp_model_probing_level = 0
    if os.environ.get("PLACER_ILP_LOG"):
        solver.parameters.log_search_progress = True
    status = solver.Solve(m)
    solve_s = time.perf_counter() - t0
    name = solver.StatusName(status).lower()
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        value = solver.Value
        objective, bound = solver.ObjectiveValue() * model.unit, solver.BestObjectiveBound() * model.unit
    elif hinted is not None and status == cp_model.UNKNOWN:  # out of time before a first solution: the hint is one
        values = hinted[0]
        value = lambda v: values[v.Index()]  # noqa: E731
        name, objective, bound = "hint", hinted[1] * model.unit, None
    else:
        raise PlacerError(f"ilp: the solver found no plan in {time_limit_s:g} s (status {name})")
    item_device = np.array([next(d for d in range(D) if value(x[i][d])) for i in range(K)], dtype=np.int64)
    order = np.argsort([value(p) for p in pos], kind="stable")
    return Solution(item_device, order, name, objective, bound, solve_s)


def _complete_hint(cp_model, m, x, pos, hint_device, hint_order, limit_s: float) -> tuple[list[int], float] | None:
    """Hint every variable: solve the model with the hinted devices and order fixed (times only), hint that.

    A hint of the decisions alone leaves the solver to rebuild thousands of
    times; with them fixed the rest is a longest-path problem solved at once.
    """
    K = len(x)
    rank = np.empty(K, dtype=np.int64)
    rank[np.asarray(hint_order)] = np.arange(K)
    fixed = m.Clone()
    for i in range(K):
        fixed.Add(fixed.GetIntVarFromProtoIndex(pos[i].Index()) == int(rank[i]))
        for d in range(len(x[i])):
            fixed.Add(fixed.GetIntVarFromProtoIndex(x[i][d].Index()) == int(hint_device[i] == d))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = limit_s
    solver.parameters.num_workers = 1
    solver.parameters.symmetry_level = 0
    solver.parameters.cp_model_probing_level = 0
    status = solver.Solve(fixed)
    if os.environ.get("PLACER_ILP_LOG"):
        print("hint completion:", solver.StatusName(status), solver.WallTime())
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        values = list(solver.ResponseProto().solution)
        for k in range(len(m.Proto().variables)):
            m.AddHint(m.GetIntVarFromProtoIndex(k), int(values[k]))
        return values, solver.ObjectiveValue()
    for i in range(K):  # the decisions at least
        m.AddHint(pos[i], int(rank[i]))
        for d in range(len(x[i])):
            m.AddHint(x[i][d], int(hint_device[i] == d))
    return None

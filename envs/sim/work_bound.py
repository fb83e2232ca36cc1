"""The work bounds: devices run one op at a time, so the step is at least the work spread over them.

For any weights ``λ`` on the simplex, ``backward_end >= max_d busy_d >= Σ_d λ_d
busy_d >= Σ_i min_d λ_d w_id`` with ``w_id`` the forward + backward time of op
``i`` on ``d``. Uniform ``λ`` gives "total work over the number of devices"; the
best ``λ`` matters when devices differ (a slow host CPU is worth little).
:func:`work_bound_s` finds it exactly for two kinds of device and by
exponentiated-gradient ascent for more; :func:`lp_work_bound_s` solves it (and
the same with a per-op, per-device term added: the eager host's issue) as a
linear program. Part of :mod:`envs.sim.bound`.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse
from scipy.optimize import linprog


def _two_group_bound(a: np.ndarray, b: np.ndarray) -> float:
    """``max over μ in [0, 1] of Σ_i min(μ a_i, (1 - μ) b_i)``, exactly (concave, piecewise linear)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        brk = np.where(a + b > 0, b / (a + b), 0.0)  # where μ a_i = (1 - μ) b_i
    order = np.argsort(brk)
    mu, a, b = brk[order], a[order], b[order]
    # at μ = mu[k]: ops k' < k have switched to (1 - μ) b, the others still give μ a
    a_after = np.concatenate([np.cumsum(a[::-1])[::-1], [0.0]])
    b_before = np.concatenate([[0.0], np.cumsum(b)])
    values = mu * a_after[:-1] + (1.0 - mu) * b_before[:-1]
    return float(values.max()) if len(values) else 0.0


def work_bound_s(work: np.ndarray, iterations: int = 200) -> float:
    """``max over λ in the simplex of Σ_i min_d λ_d work[i, d]`` (a valid bound, usually the maximum).

    Devices with identical columns (the GPUs of a preset) share one weight, which
    loses nothing (the function is concave and symmetric in them). Two distinct
    columns are solved exactly; more go through exponentiated-gradient ascent,
    keeping the best value seen (every λ gives a valid bound).
    """
    n, D = work.shape
    if n == 0:
        return 0.0
    reps: list[int] = []  # one column per group of identical columns
    counts: list[int] = []
    for d in range(D):
        for g, r in enumerate(reps):
            if np.array_equal(work[:, d], work[:, r]):
                counts[g] += 1
                break
        else:
            reps.append(d)
            counts.append(1)
    mult = np.asarray(counts, dtype=np.float64)
    scaled = work[:, reps] / mult[None, :]  # weight μ_g of a group spread evenly over its m_g devices
    G = scaled.shape[1]
    best = float(np.min(work, axis=1).sum() / D)  # uniform λ
    if G == 1:
        return max(best, float(scaled[:, 0].sum()))
    if G == 2:
        return max(best, _two_group_bound(scaled[:, 0], scaled[:, 1]))
    mu = mult / D
    scale = max(float(np.sum(work.min(axis=1))), 1e-300)
    step, stale = 1.0, 0
    rows = np.arange(n)
    for _ in range(iterations):
        weighted = scaled * mu
        arg = np.argmin(weighted, axis=1)
        value = float(weighted[rows, arg].sum())
        if value > best * (1 + 1e-9):
            best, stale = value, 0
        else:
            stale += 1
            if stale >= 25:
                break
        grad = np.bincount(arg, weights=scaled[rows, arg], minlength=G) / scale
        mu = mu * np.exp(step * (grad - grad.max()))
        mu /= mu.sum()
        step *= 0.98
    return best


def lp_work_bound_s(work: np.ndarray, add: np.ndarray | None = None) -> float:
    """``max over λ in the simplex of Σ_i min_d (add[i, d] + λ_d work[i, d])``, by linear programming.

    Variables ``t_i`` (one per op) and ``λ_d``: maximise ``Σ t_i`` subject to
    ``t_i <= add_id + λ_d work_id`` and ``Σ λ = 1``. The value returned is the
    objective recomputed from the solver's ``λ`` (clipped and normalised), so it
    is a valid bound whatever the solver's tolerance; 0 if the solver fails.
    """
    n, D = work.shape
    if n == 0:
        return 0.0
    add = np.zeros_like(work) if add is None else add
    full_work, full_add = work, add
    # identical devices share one weight (spread evenly: no loss, the problem is symmetric in them),
    # identical ops one row (weighted by their count)
    _, col_first, col_inv = np.unique(np.concatenate([work, add]).T, axis=0, return_index=True, return_inverse=True)
    col_inv = col_inv.reshape(-1)
    mult = np.bincount(col_inv).astype(np.float64)
    work, add = work[:, col_first] / mult[None, :], add[:, col_first]
    rows_u, count = np.unique(np.concatenate([work, add], axis=1), axis=0, return_counts=True)
    G = work.shape[1]
    work, add = rows_u[:, :G], rows_u[:, G:]
    n, D = work.shape
    scale = max(float(np.abs(work).max()), float(np.abs(add).max()), 1e-300)
    w, a = work / scale, add / scale
    rows = np.arange(n * D)
    i = np.repeat(np.arange(n), D)
    d = np.tile(np.arange(D), n)
    # t_i - w_id λ_d <= a_id
    A = sparse.csr_matrix(
        (np.concatenate([np.ones(n * D), -w.reshape(-1)]), (np.concatenate([rows, rows]), np.concatenate([i, n + d]))),
        shape=(n * D, n + D),
    )
    c = np.concatenate([-count.astype(np.float64), np.zeros(D)])
    A_eq = sparse.csr_matrix(np.concatenate([np.zeros(n), np.ones(D)])[None, :])
    bounds = [(None, None)] * n + [(0.0, 1.0)] * D
    try:
        res = linprog(c, A_ub=A, b_ub=a.reshape(-1), A_eq=A_eq, b_eq=[1.0], bounds=bounds, method="highs")
    except ValueError:
        return 0.0
    if res.status != 0 or res.x is None:
        return 0.0
    mu = np.clip(res.x[n:], 0.0, None)
    if mu.sum() <= 0:
        return 0.0
    lam = (mu / mu.sum() / mult)[col_inv]  # back to one weight per device, on the simplex
    return float(np.min(full_add + lam[None, :] * full_work, axis=1).sum())

"""Chrome/Perfetto trace JSON of a simulated step (open in ui.perfetto.dev or chrome://tracing).

One track (``tid``) per device and per used link, named by ``thread_name``
metadata; one complete (``"X"``) event per forward op (``"fwd <op name>"``),
backward op (``"bwd <op name>"``), transfer (``"act <op name>-><device>"``,
``"grad <op name>-><device>"``) and optimizer step. A checkpointed op's second
forward in its block's recompute is ``"recompute <op name>"`` on its device. The
copies of parameters homed apart from their ops (:mod:`envs.sim.homes`) have
tracks of their own, ``"<home>-><device> homes"`` and back: ``"param <op name>"``
before the forward, ``"param again <op name>"`` before the backward, and
``"param grad <op name>"``, the gradient sent home. Times are microseconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from envs.sim.schedule import ACT, Schedule

if TYPE_CHECKING:
    from envs.sim.simulator import SimEnv

PID = 1


def chrome_trace(env: "SimEnv", sched: Schedule) -> dict[str, Any]:
    """The trace document (a dict ready for ``json.dump``)."""
    g, c = env.sim_graph, env.cluster  # with microbatches, op "name@mbM" is op name of microbatch M
    names = c.device_names
    D = c.num_devices
    us = 1e6
    events: list[dict[str, Any]] = [
        {
            "name": "process_name",
            "ph": "M",
            "pid": PID,
            "args": {"name": f"placer sim: {g.name or 'graph'} on {c.name}"},
        }
    ]
    tids: dict[str, int] = {}

    def track(label: str) -> int:
        if label not in tids:
            tids[label] = len(tids)
            events.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": tids[label], "args": {"name": label}})
            events.append(
                {
                    "name": "thread_sort_index",
                    "ph": "M",
                    "pid": PID,
                    "tid": tids[label],
                    "args": {"sort_index": tids[label]},
                }
            )
        return tids[label]

    for d in range(D):
        track(names[d])
    p = sched.op_devices

    def args_of(i: int) -> dict[str, Any]:
        return {"op_type": g.op_types[i], "op_index": i}

    for i in range(g.num_ops):
        tid = tids[names[p[i]]]
        args = args_of(i)
        events.append(
            {
                "name": f"fwd {g.names[i]}",
                "cat": "forward",
                "ph": "X",
                "pid": PID,
                "tid": tid,
                "ts": sched.fwd_start_s[i] * us,
                "dur": (sched.fwd_end_s[i] - sched.fwd_start_s[i]) * us,
                "args": args,
            }
        )
        events.append(
            {
                "name": f"bwd {g.names[i]}",
                "cat": "backward",
                "ph": "X",
                "pid": PID,
                "tid": tid,
                "ts": sched.bwd_start_s[i] * us,
                "dur": (sched.bwd_end_s[i] - sched.bwd_start_s[i]) * us,
                "args": args,
            }
        )
    if len(sched.blocks):  # checkpointed ops run their forward again in the backward (envs.sim.checkpointing)
        for i in np.flatnonzero(~np.isnan(sched.recompute_start_s)).tolist():
            events.append(
                {
                    "name": f"recompute {g.names[i]}",
                    "cat": "recompute",
                    "ph": "X",
                    "pid": PID,
                    "tid": tids[names[p[i]]],
                    "ts": sched.recompute_start_s[i] * us,
                    "dur": env.fwd_s[i, p[i]] * us,
                    "args": {**args_of(i), "block": int(sched.blocks[i])},
                }
            )
    h = sched.homes  # parameters copied in from their homes and their gradients sent back (envs.sim.homes)
    copies = (
        ("param", h.fetch_start_s, h.fetch_end_s, h.nbytes, False),
        ("param again", h.refetch_start_s, h.refetch_end_s, h.nbytes, False),
        ("param grad", h.grad_start_s, h.grad_end_s, h.grad_nbytes, True),
    )
    for label, start, end, nbytes, home_bound in copies:
        for k in np.flatnonzero(end > start).tolist():  # a copy not made (no backward reads it) takes no time
            u, home, on = int(h.op[k]), int(h.home[k]), int(p[h.op[k]])
            src, dst = (on, home) if home_bound else (home, on)
            events.append(
                {
                    "name": f"{label} {g.names[u]}",
                    "cat": "home copy",
                    "ph": "X",
                    "pid": PID,
                    "tid": track(f"{names[src]}->{names[dst]} homes"),
                    "ts": start[k] * us,
                    "dur": (end[k] - start[k]) * us,
                    "args": {"bytes": int(nbytes[k]), "op": g.names[u]},
                }
            )
    order = np.lexsort((sched.xfer_start_s, sched.xfer_dst, sched.xfer_src))
    for k in order.tolist():
        src, dst, u = int(sched.xfer_src[k]), int(sched.xfer_dst[k]), int(sched.xfer_op[k])
        kind = "act" if sched.xfer_kind[k] == ACT else "grad"
        events.append(
            {
                "name": f"{kind} {g.names[u]}->{names[dst]}",
                "cat": "transfer",
                "ph": "X",
                "pid": PID,
                "tid": track(f"{names[src]}->{names[dst]}"),
                "ts": sched.xfer_start_s[k] * us,
                "dur": (sched.xfer_end_s[k] - sched.xfer_start_s[k]) * us,
                "args": {"bytes": int(sched.xfer_bytes[k]), "op": g.names[u]},
            }
        )
    for d in range(D):
        if sched.update_s[d] > 0:
            events.append(
                {
                    "name": "optimizer step",
                    "cat": "update",
                    "ph": "X",
                    "pid": PID,
                    "tid": tids[names[d]],
                    "ts": sched.backward_end_s * us,
                    "dur": sched.update_s[d] * us,
                    "args": {},
                }
            )
    steps = sched.host_steps  # parameters stepped during the backward, one after the other (envs.sim.homes)
    for o, d, start, end in zip(steps.owner.tolist(), steps.home.tolist(), steps.start_s, steps.end_s):
        events.append(
            {
                "name": f"optimizer step {g.names[o]}",
                "cat": "update",
                "ph": "X",
                "pid": PID,
                "tid": track(f"{names[d]} optimizer (in backward)"),
                "ts": start * us,
                "dur": (end - start) * us,
                "args": {"op": g.names[o]},
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "graph": env.graph.name,
            "graph_hash": env.graph.content_hash,
            "microbatches": env.microbatches,
            "cluster": c.name,
            "step_time_s": sched.step_time_s,
        },
    }

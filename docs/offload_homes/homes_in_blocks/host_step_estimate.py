"""Would the host's optimizer step pay to run during the backward? An estimate from the simulator (issue 50: the
FSDP2 ratio at tight caps).

For each plan of `python -m bench.offload_homes` at a cell (placer's, and FSDP2's offload with every layer
checkpointed; read from that run's JSON), it prints:

* ``step_s``: the simulated step as placer runs it today (the host's Adam over the homed parameters after
  ``backward()`` returns, with every other device's step);
* ``backward_end_s`` and ``host_step_s``: when the backward ends (gradients home), and the host's step over the homed
  parameters (``envs.sim.cost.update_time_s`` per homed op, one launch each);
* ``overlapped_s``: the step if one host thread stepped each homed op's parameters as soon as its gradient is home,
  in the order they arrive (``optimizer in backward``, as ZeRO-Offload overlaps its CPU Adam), then the rest:
  ``max(backward end, that thread's end) + the other devices' step``. Contention between that thread and host ops
  of the backward is not charged, so this is the most it could gain.

From the repository root, after the bench run:
``PYTHONPATH=. python docs/offload_homes/homes_in_blocks/host_step_estimate.py llama-3b:8,llama-long:16``
"""

from __future__ import annotations

import json
import sys

import numpy as np

import envs
import graphs
from bench import offload
from bench.offload_homes import GIB, capped
from envs.sim.cost import update_time_s, update_times_s
from graphs.plan import Placement

FILES = {"llama-long": "docs/offload_homes/long/llama-long.json"}


def estimate(env, g, cluster, p: Placement) -> dict:
    s = env.schedule(p)
    h = s.homes
    host = cluster.device_names.index("cpu:0")
    launch, membw = float(cluster.launch_overhead_s[host]), float(cluster.mem_bw_bytes_per_s[host])
    lane = 0.0
    for k in np.argsort(h.grad_end_s, kind="stable"):
        lane = max(lane, float(h.grad_end_s[k])) + float(update_time_s(float(g.param_bytes[h.op[k]]), launch, membw))
    homed = np.zeros(g.num_ops, dtype=bool)
    homed[h.op] = True
    rest = np.bincount(s.op_devices[~homed], weights=g.param_bytes[~homed], minlength=cluster.num_devices)
    rest_s = float(update_times_s(rest, cluster).max())
    host_s = float(update_time_s(float(g.param_bytes[homed].sum()), launch, membw))
    return {
        "step_s": round(s.step_time_s, 4),
        "backward_end_s": round(float(s.backward_end_s), 4),
        "host_step_s": round(host_s, 4),
        "overlapped_s": round(max(float(s.backward_end_s), lane) + rest_s, 4),
    }


def main() -> None:
    for cell in sys.argv[1].split(","):
        name, cap = cell.split(":")
        scenario = offload.SCENARIOS[name]
        model, inputs = offload.build(scenario, meta=True)
        g = graphs.capture(model, inputs, name=scenario.name)
        cluster = offload.scenario_cluster(capped(scenario, int(float(cap) * GIB)))
        env = envs.SimEnv(g, cluster)
        doc = json.load(open(FILES.get(name, f"docs/offload_homes/{name}.json")))
        plans = next(c for c in doc["caps"] if c["cap_gib"] == float(cap))["plans"]
        for plan in plans:
            if plan["kind"] in ("placer", "fsdp2-ac"):
                row = {
                    "cell": cell,
                    "plan": plan["kind"],
                    **estimate(env, g, cluster, Placement.from_dict(plan["placement"])),
                }
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

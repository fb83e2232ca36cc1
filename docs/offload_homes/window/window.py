"""What a deeper side-stream window would give the homed plans: the reference simulator with its window widened.

The runtime (envs/real/homes.py) and both simulators hold each device's home copies in a window of two readers: the
copy for a reader waits for the reader two before it to end. This script widens the reference simulator's window to
3, 4 and 6 readers (``HomeCopies._guard`` replaced here, nothing else) and simulates the plans of
``docs/offload_homes/kept`` again: placer's homed plan and FSDP2's offload as planned, at the caps where they differ.
Each copy in flight is live on the device from its start, so the memory sweep charges the deeper window's peak.

    PYTHONPATH=. python docs/offload_homes/window/window.py > docs/offload_homes/window/window.txt
"""

from __future__ import annotations

import json
import os

import envs
import graphs
from bench import offload
from bench.offload_homes import FSDP2, GIB, HOMED, capped
from envs.sim import homes

HERE = os.path.dirname(os.path.abspath(__file__))
KEPT = os.path.join(HERE, "..", "kept")
CASES = (("llama-3b-ft", 8.0), ("llama-256k", 8.0), ("llama-256k", 16.0), ("llama-3b", 16.0))
WINDOWS = (2, 3, 4, 6)


def widened(readers_back: int):
    """``HomeCopies._guard`` with a window of ``readers_back`` readers (2 is the runtime's)."""

    def _guard(self, pass_: int, d: int, i: int, end_of) -> float:
        readers = self.readers.setdefault((pass_, d), [])
        guard = end_of(readers[-readers_back]) if len(readers) >= readers_back else 0.0
        readers.append(i)
        return guard

    return _guard


def main() -> None:
    original = homes.HomeCopies._guard
    print("| model | cap | plan | window | step (s) | vs window 2 | peak gpu:0 (GiB) |")
    print("|---|---:|---|---:|---:|---:|---:|")
    try:
        for name, cap in CASES:
            scenario = offload.SCENARIOS[name]
            model, inputs = offload.build(scenario, meta=True)
            graph = graphs.capture(model, inputs, name=scenario.name)
            cluster = offload.scenario_cluster(capped(scenario, int(cap * GIB)))
            with open(os.path.join(KEPT, f"{name}.json")) as f:
                plans = next(c for c in json.load(f)["caps"] if c["cap_gib"] == cap)["plans"]
            for label, short in ((HOMED, "placer"), (FSDP2, "FSDP2 offload")):
                placement = offload.plan_from_doc(next(p for p in plans if p["label"] == label)).placement
                base = None
                for n in WINDOWS:
                    homes.HomeCopies._guard = widened(n)
                    r = envs.SimEnv(graph, cluster, backend="reference").simulate(placement)
                    base = r.step_time_s if base is None else base
                    peak = r.peak_bytes.get("gpu:0", 0) / GIB
                    print(f"| {name} | {cap:g} GiB | {short} | {n} | {r.step_time_s:.4f} | {r.step_time_s / base:.3f} "
                          f"| {peak:.2f} |", flush=True)  # fmt: skip
    finally:
        homes.HomeCopies._guard = original


if __name__ == "__main__":
    main()

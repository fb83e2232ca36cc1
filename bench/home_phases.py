"""Where a plan's GPU memory goes, phase by phase: the forward, the backward and the optimizer step (issue 50).

For a scenario of :mod:`bench.offload` at one GPU cap, the plans named by ``--plans``
(``fsdp2``: FSDP2's offload as a plan, every parameter homed on the host; ``homes``:
placer's move search with home moves; ``ops``: the same search without them) are
each run through :func:`placer.apply` with ``torch.optim.Adam``, ``--steps`` training
steps, and after each phase the device is synchronised and its memory read:
allocated at the phase's end and its peak (``torch.cuda.max_memory_allocated``,
reset at the phase's start), with the phase's seconds. Beside them, the simulator's
peak and step of the same plan. With ``--builds N`` each plan is placed and stepped N times
afresh, and a second table gives each phase's spread across the builds ((max - min) / median
of the builds' median seconds): which phase makes two builds of one placement differ (issue 49;
on an H200 the op-only plan's builds ranged 440-515 ms while steps within a build agreed
within 4-7 %). On a machine without CUDA the seconds are real and
the memory columns are 0. A markdown table on stdout (``--json``: every step).

    python -m bench.home_phases --scenario llama-256k --cap 24 --plans fsdp2,homes
    python -m bench.home_phases --scenario tiny --cap 0.02 --device-map '*=cpu'   # the CPU stand-in
    python -m bench.home_phases --scenario llama-256k --cap 24 --plans ops --builds 4   # where builds differ

On an H200 (docs/offload_homes/h200/phases-fsdp2-as-plan.txt) FSDP2's offload as a
plan peaked at 5.63 GiB in the forward and 6.62 GiB in the backward, 0.06 GiB in the
host's Adam step (2.3 s of a 2.7 s step), against the simulator's 7.57 GiB.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from typing import Any

from bench import offload, offload_homes
from bench.common import OneLineParser, parse_list, print_report
from graphs import PlacerError

GIB = 1 << 30
PLANS = ("fsdp2", "homes", "ops")
PHASES = ("fwd", "bwd", "opt")


def make_plans(names: list[str], graph: Any, cluster: Any, evals: int) -> list[tuple[str, Any]]:
    """``(name, placement)`` for each of ``names`` (:data:`PLANS`)."""
    out = []
    for name in names:
        if name == "fsdp2":
            out.append((name, offload_homes.fsdp2_offload_plan(graph, cluster)))
        else:
            plan = offload_homes.searched_plan(graph, cluster, homes=name == "homes", evals=evals)
            out.append((name, plan.placement))
    return out


def phase_steps(scenario: Any, placement: Any, device_map: str, steps: int) -> list[dict[str, float]]:
    """``steps`` training steps of ``placement``, each phase's seconds, and on CUDA its GiB at the end and peak."""
    import torch

    import placer
    from envs.real.timing import default_loss, placed_adam

    cuda = torch.cuda.is_available()

    def mark() -> tuple[float, float]:
        if not cuda:
            return 0.0, 0.0
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated() / GIB, torch.cuda.max_memory_allocated() / GIB

    def reset() -> None:
        if cuda:
            torch.cuda.reset_peak_memory_stats()

    model, inputs = offload.build(scenario)
    placed = placer.apply(model, placement, inputs, device_map=device_map)
    del model
    optimizer = placed_adam(placed, placement, lr=1e-3)  # as the measurements build it (host_step included)
    rows = []
    try:
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            row: dict[str, float] = {"start_gib": mark()[0]}
            loss = None
            for phase in PHASES:
                reset()
                t0 = time.perf_counter()
                if phase == "fwd":
                    loss = default_loss(placed(*inputs))
                elif phase == "bwd":
                    loss.backward()
                else:
                    optimizer.step()
                end, peak = mark()
                row.update({f"{phase}_s": time.perf_counter() - t0, f"{phase}_end_gib": end, f"{phase}_peak_gib": peak})
            rows.append({**row, "loss": float(loss.detach())})
    finally:
        del placed, optimizer
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return rows


def build_spread(builds: list[list[dict[str, float]]]) -> dict[str, float]:
    """Per phase, (max - min) / median over builds of each build's median seconds.

    >>> s = build_spread([[{"fwd_s": 1.0, "bwd_s": 2.0, "opt_s": 1.0}], [{"fwd_s": 1.2, "bwd_s": 2.0, "opt_s": 1.0}]])
    >>> round(s["fwd_s"], 4), s["bwd_s"]
    (0.1818, 0.0)
    """
    out = {}
    for phase in PHASES:
        medians = [statistics.median(step[f"{phase}_s"] for step in steps) for steps in builds]
        out[f"{phase}_s"] = (max(medians) - min(medians)) / statistics.median(medians)
    return out


def markdown_table(runs: list[dict[str, Any]]) -> str:
    """One row per plan: its last step's phases beside the simulator's peak and step; with several builds, each
    phase's spread across them below."""
    head = ["plan", "sim peak GiB", "sim step s", "homed GiB"]
    head += [f"{p} {c}" for p in PHASES for c in ("s", "peak GiB", "end GiB")]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in runs:
        cells = [r["plan"], f"{r['sim_peak_gpu_gib']:.2f}", f"{r['sim_step_s']:.3f}", f"{r['homed_gib']:.2f}"]
        if r.get("error"):
            cells += [r["error"]] + [""] * (len(head) - 5)
        else:
            last = r["steps"][-1]
            cells += [f"{last[f'{p}_{c}']:.3f}" for p in PHASES for c in ("s", "peak_gib", "end_gib")]
        lines.append("| " + " | ".join(cells) + " |")
    spread = [r for r in runs if r.get("build_spread")]
    if spread:
        lines += ["", "| plan | builds | " + " | ".join(f"{p} spread across builds" for p in PHASES) + " |"]
        lines.append("|---|---:|" + "---:|" * len(PHASES))
        for r in spread:
            cells = [r["plan"], str(len(r["builds"]))] + [f"{r['build_spread'][f'{p}_s']:.1%}" for p in PHASES]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(args: Any) -> list[dict[str, Any]]:
    import envs
    import graphs
    from envs.real.local import cap_cuda_memory, cuda_caps
    from envs.real.worker import one_line

    scenario = offload_homes.capped(offload.check_scenario(args.scenario), int(args.cap * GIB))
    cluster = offload.scenario_cluster(scenario)
    cap_cuda_memory(cuda_caps(cluster, args.device_map))
    model, inputs = offload.build(scenario)
    graph = graphs.capture(model, inputs, name=scenario.name)
    del model
    runs = []
    for name, p in make_plans(parse_list(args.plans, what="plans", known=PLANS), graph, cluster, args.evals):
        sim = envs.SimEnv(graph, cluster).simulate(p)
        homes = p.home_indices(graph, cluster.device_names)
        r: dict[str, Any] = {
            "plan": name,
            "sim_peak_gpu_gib": sim.peak_bytes.get("gpu:0", 0) / GIB,
            "sim_step_s": sim.step_time_s,
            "homed_gib": float(graph.param_bytes[homes >= 0].sum()) / GIB,
        }
        try:
            builds = [phase_steps(scenario, p, args.device_map, args.steps) for _ in range(args.builds)]
            r["steps"], r["builds"] = builds[-1], builds
            if len(builds) > 1:
                r["build_spread"] = build_spread(builds)
        except Exception as e:  # noqa: BLE001  (a plan that fails, out of memory most often, is its row)
            r["error"] = f"{type(e).__name__}: {one_line(e)}"
        print(f"  {name}: {r.get('error') or 'ok'}", file=sys.stderr, flush=True)
        runs.append(r)
    return runs


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m bench.home_phases", description=__doc__.split("\n")[0])
    p.add_argument("--scenario", default="llama-256k", help="known: " + ", ".join(offload.SCENARIOS))
    p.add_argument("--cap", type=float, default=24.0, help="the GPU cap in GiB (default 24)")
    p.add_argument("--device-map", default="cpu:0=cpu,gpu:0=cuda:0", help="'*=cpu': the CPU stand-in")
    p.add_argument("--plans", default="fsdp2,homes", help="comma list of " + ", ".join(PLANS))
    p.add_argument("--evals", type=int, default=2000, help="placements each search simulates (default 2000)")
    p.add_argument("--steps", type=int, default=3, help="training steps per plan (default 3)")
    p.add_argument("--builds", type=int, default=1, help="times each plan is placed and stepped afresh (default 1)")
    p.add_argument("--json", action="store_true", help="every step of every plan as JSON")
    args = p.parse_args(argv)
    try:
        offload.check_scenario(args.scenario)
        if not args.cap > 0 or args.evals < 1 or args.steps < 1 or args.builds < 1:
            raise PlacerError("--cap must be > 0, --evals, --steps and --builds >= 1")
        parse_list(args.plans, what="plans", known=PLANS)
        runs = run(args)
    except PlacerError as e:
        print(f"python -m bench.home_phases: {e}", file=sys.stderr)
        return 2
    print_report(args.json, {"runs": runs}, lambda: markdown_table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Does a measurement repeat? One placement built and measured again and again in one process, under settings.

    python -m bench.repeatability --scenario tiny --builds 8 --threads 1,2
    python -m bench.repeatability --source nmt-2 --cluster k80x2 --device-map '*=cpu' --builds 6 --json
    python -m bench.repeatability --scenario llama-256k --placement plan.json --builds 6   # a plan that fits the cap

Each build places the module anew (:class:`envs.real.local.LocalEnv` with ``again``: a fresh placed module, a fresh
optimizer, ``--warmup`` then ``--steps`` timed steps, the median of them its step time). The settings (torch's
threads) are interleaved build by build (ABAB...), so a drift of the machine hits each alike. Per setting:

* **pair diff**: the median over consecutive pairs of builds of |a - b| / mean(a, b) (the issue's "two builds of
  one placement");
* **halves**: the median of the second half of the builds over that of the first (drift: the allocator, the
  clocks, the machine's other load);
* **first / rest**: the first build over the median of the others (what the order of builds costs);
* **in-build spread**: the median over builds of (max - min) / median of a build's timed steps.

The machine's load (``os.getloadavg``) before and after is printed: on a shared host the other processes' load is
what a CPU measurement mostly measures. A markdown table on stdout (``--json``: every build's step times).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

import envs
from bench.common import OneLineParser, machine_line, parse_list
from graphs import PlacerError


def pair_diff(medians: list[float]) -> float:
    """The median over consecutive pairs of |a - b| / mean(a, b).

    >>> round(pair_diff([1.0, 1.1, 1.0]), 4)
    0.0952
    """
    a, b = np.asarray(medians[:-1]), np.asarray(medians[1:])
    return float(np.median(np.abs(a - b) / ((a + b) / 2))) if len(a) else float("nan")


def summary(builds: list[dict[str, Any]]) -> dict[str, float]:
    """The figures of one setting's builds (the module doc)."""
    medians = [b["step_time_s"] for b in builds]
    half = len(medians) // 2
    spread = [(max(b["step_times_s"]) - min(b["step_times_s"])) / b["step_time_s"] for b in builds]
    return {
        "median_s": float(np.median(medians)),
        "pair_diff": pair_diff(medians),
        "halves": float(np.median(medians[half:]) / np.median(medians[:half])) if half else float("nan"),
        "first_over_rest": float(medians[0] / np.median(medians[1:])) if len(medians) > 1 else float("nan"),
        "in_build_spread": float(np.median(spread)),
    }


def measure(args: argparse.Namespace, say) -> dict[str, Any]:
    """Every build of the placement under every setting, interleaved; the builds and each setting's summary."""
    import torch

    from envs.real.local import LocalEnv  # torch: only for real steps

    if args.scenario:
        from bench.offload import builder, check_scenario, scenario_cluster

        scenario = check_scenario(args.scenario)
        source, cluster = builder(scenario), scenario_cluster(scenario)
    else:
        source, cluster = args.source, envs.resolve_cluster(args.cluster)
    threads = [torch.get_num_threads() if t == "default" else int(t) for t in parse_list(args.threads, what="threads")]
    if any(t < 1 for t in threads):
        raise PlacerError("--threads: each must be a positive integer or 'default'")
    env = LocalEnv(source, cluster, device_map=args.device_map, warmup_steps=args.warmup, timed_steps=args.steps)
    if args.placement:  # a plan file (data): its ops on the cluster's devices, checked against this graph
        from graphs.plan import Placement

        device = args.placement
        placement = Placement.load(args.placement)
        op_devices = placement.indices(env.graph, cluster.device_names, source=args.placement)[None, :].astype(np.int32)
    else:
        device = args.device or cluster.device_names[0]
        op_devices = np.full((1, env.graph.num_ops), cluster.index(device), dtype=np.int32)
    builds: dict[str, list[dict[str, Any]]] = {str(t): [] for t in threads}
    load = [os.getloadavg()[0]]
    try:
        for k in range(args.builds):
            for t in threads:
                torch.set_num_threads(t)
                result = env.evaluate([op_devices[0]], again=True)[0]
                if not result.ok:
                    raise PlacerError(f"the placement on {device} did not run: {result.status} {result.message}")
                times = list(result.extra.get("step_times_s", [result.step_time_s]))
                builds[str(t)].append({"build": k, "step_time_s": result.step_time_s, "step_times_s": times})
                say(f"  build {k}, {t} thread(s): {result.step_time_s * 1e3:.2f} ms")
    finally:
        env.close()
    load.append(os.getloadavg()[0])
    return {
        "device": device,
        "ops": env.graph.num_ops,
        "load_before_after": load,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "builds": builds,
        "summary": {t: summary(b) for t, b in builds.items()},
    }


def markdown_table(doc: dict[str, Any]) -> str:
    head = ["threads", "builds", "median ms", "pair diff", "halves", "first / rest", "in-build spread"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for t, s in doc["summary"].items():
        row = [t, str(len(doc["builds"][t])), f"{s['median_s'] * 1e3:.2f}", f"{s['pair_diff']:.1%}"]
        row += [f"{s['halves']:.3f}", f"{s['first_over_rest']:.3f}", f"{s['in_build_spread']:.1%}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = OneLineParser(prog="python -m bench.repeatability", description=__doc__.splitlines()[0])
    ap.add_argument("--source", default="", help="a zoo name or module:callable")
    ap.add_argument("--scenario", default="", help="the offload scenario instead (tiny; llama-256k on a GPU)")
    ap.add_argument("--cluster", default="k80x2", help="the cluster of --source")
    ap.add_argument("--device-map", default=None, help="logical -> torch devices (e.g. '*=cpu')")
    ap.add_argument("--device", default="", help="the logical device every op is placed on (default: the first)")
    ap.add_argument("--placement", default="", help="a placement file to measure instead (e.g. one that fits a cap)")
    ap.add_argument("--builds", type=int, default=6, help="builds per setting (default 6)")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up steps per build (default 2)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per build (default 5)")
    ap.add_argument("--threads", default="default", help="comma list of torch thread counts ('default': as is)")
    ap.add_argument("--json", action="store_true", help="print every build's step times as JSON")
    args = ap.parse_args(argv)
    if not (args.source or args.scenario):
        ap.error("give --source or --scenario")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    try:
        if args.builds < 2 or args.steps < 1 or args.warmup < 0:
            raise PlacerError("--builds must be at least 2, --steps at least 1 and --warmup at least 0")
        doc = measure(args, say)
    except PlacerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    doc["wall_s"] = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"machine": machine_line(), "argv": sys.argv[1:], **doc}, indent=1))
    else:
        print(markdown_table(doc))
        print(f"\nLoad average before/after: {doc['load_before_after']}. Machine: {machine_line()}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

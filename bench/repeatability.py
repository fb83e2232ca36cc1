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

Across processes (``--ranks N --placement plan.json``): each build is one job of N gloo processes on this machine's
cores (torch's launcher, what ``placer run --nproc-per-node N`` runs), and the settings are ``--pin off,on``: each
rank left to the OS scheduler, or pinned to a core of its own; and ``--malloc steady,default``: glibc's malloc
keeping what a step frees, its thread cache off (placer's default, :mod:`envs.real.allocator`), or glibc's own
defaults, or ``cached``: steady with glibc's thread cache on (as placer measured before 2026-12-02), or ``huge``:
steady, and asking the kernel for transparent huge pages (:data:`HUGE_PAGES`); and
``--receives early,jit``: every receive of a step posted as it begins (placer's default on CPU ranks under GPipe
and 1F1B, :func:`envs.real.distributed.runtime.post_receives_early`) or where torch's schedule posts it, just
before the action that needs it; and ``--slice default,short``: gloo's threads at the scheduler's slice or at
:data:`envs.real.slices.HELPER_SLICE_US` (a woken one preempts the rank's compute); and
``--start spawn,forkserver``: each build's processes started as fresh
interpreters (the bench's default: a build shares nothing with the one before it) or forked from a fork server that
imported torch once (placer's default, :mod:`envs.real.distributed.launch`). Every combination is one setting
(``pin off, malloc steady``; with ``--receives``,
``pin off, malloc steady, receives early``). The machine's own floor is measured first: a bare loop of
matmuls on one thread (:func:`noise_floor`), so a spread can be told apart from the host's; and a short one just
before every build, so that a drift of the host's speed between builds shows (``pair_diff_floored``: the pair
difference of each build's median over the floor before it)::

    python -m bench.repeatability --ranks 2 --source bench.rank_models:lm --placement plan.json --builds 8 --pin off,on
    python -m bench.repeatability --ranks 2 --source bench.rank_models:lm --placement plan.json --malloc steady,default
    python -m bench.repeatability --ranks 2 --source bench.rank_models:lm --placement plan.json --receives early,jit
    python -m bench.repeatability --ranks 2 --source bench.rank_models:lm --placement plan.json --start spawn,forkserver
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import replace
from typing import Any

import numpy as np

import envs
from bench.common import OneLineParser, machine_line, parse_list
from envs.real.allocator import children_start_with
from envs.real.slices import HELPER_SLICE_US
from graphs import PlacerError


def pair_diff(medians: list[float]) -> float:
    """The median over consecutive pairs of |a - b| / mean(a, b).

    >>> round(pair_diff([1.0, 1.1, 1.0]), 4)
    0.0952
    """
    a, b = np.asarray(medians[:-1]), np.asarray(medians[1:])
    return float(np.median(np.abs(a - b) / ((a + b) / 2))) if len(a) else float("nan")


def summary(builds: list[dict[str, Any]]) -> dict[str, float]:
    """The figures of one setting's builds (the module doc); where every build has the host's floor measured just
    before it (``floor_s``), also ``pair_diff_floored``: the pair difference of each build's median over its floor.

    >>> builds = [{"step_time_s": t, "step_times_s": [t], "floor_s": f} for t, f in ((1.0, 0.03), (1.2, 0.036))]
    >>> round(summary(builds)["pair_diff"], 4), summary(builds)["pair_diff_floored"]
    (0.1818, 0.0)
    """
    medians = [b["step_time_s"] for b in builds]
    half = len(medians) // 2
    spread = [(max(b["step_times_s"]) - min(b["step_times_s"])) / b["step_time_s"] for b in builds]
    out = {
        "median_s": float(np.median(medians)),
        "pair_diff": pair_diff(medians),
        "halves": float(np.median(medians[half:]) / np.median(medians[:half])) if half else float("nan"),
        "first_over_rest": float(medians[0] / np.median(medians[1:])) if len(medians) > 1 else float("nan"),
        "in_build_spread": float(np.median(spread)),
    }
    if builds and all("floor_s" in b for b in builds):
        out["pair_diff_floored"] = round(pair_diff([m / b["floor_s"] for m, b in zip(medians, builds)]), 12)
    if builds and all("job_s" in b for b in builds):
        out["job_s"] = float(np.median([b["job_s"] for b in builds]))  # --ranks: a build's whole job, median
    return out


#: Runs of :func:`noise_floor` before each ``--ranks`` build (about half a second): the host's speed at that moment.
BUILD_FLOOR_RUNS = 15


def noise_floor(runs: int = 60) -> dict[str, float]:
    """The host's own noise: twenty 512x512 matmuls on one thread, ``runs`` times (after 5 untimed): the median,
    p10 and p90 seconds, and :func:`pair_diff` of consecutive runs. Nothing of placer runs in it."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(512, 512)

        def once() -> float:
            t0 = time.perf_counter()
            for _ in range(20):
                a @ a
            return time.perf_counter() - t0

        for _ in range(5):
            once()
        times = [once() for _ in range(runs)]
    finally:
        torch.set_num_threads(threads)
    p10, p90 = np.percentile(times, [10, 90])
    return {
        "median_s": float(np.median(times)),
        "p10_s": float(p10),
        "p90_s": float(p90),
        "pair_diff": pair_diff(times),
    }


#: ``--malloc huge``: glibc's malloc asks for transparent huge pages (``madvise``) for what it maps (glibc 2.35+).
HUGE_PAGES = "glibc.malloc.hugetlb=1"


#: ``--malloc``'s settings: glibc's malloc keeping what a step frees (``steady``), the processes started with its
#: thread cache off, and whether they must be spawned (a forked process never reads ``GLIBC_TUNABLES`` again, and a
#: fork server started by an earlier launch has the cache off).
MALLOCS = {
    "steady": {"steady": True, "thread_cache_off": True, "spawn": False},
    "default": {"steady": False, "thread_cache_off": False, "spawn": True},
    "cached": {"steady": True, "thread_cache_off": False, "spawn": True},
    "huge": {"steady": True, "thread_cache_off": True, "spawn": True},
}


def transparent_huge_pages() -> bool:
    """Whether the kernel gives transparent huge pages to a process that asks (``madvise`` or ``always``)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def huge_pages(on: bool) -> contextlib.AbstractContextManager[None]:
    """``GLIBC_TUNABLES`` with :data:`HUGE_PAGES` added while processes are started (when ``on``), then as it was."""
    return children_start_with(HUGE_PAGES) if on else contextlib.nullcontext()


def measure_ranks(args: argparse.Namespace, say) -> dict[str, Any]:
    """``--ranks N``: every build of the plan one job of N processes, the pin settings interleaved (module doc)."""
    from envs.real.distributed.launch import launch
    from envs.real.distributed.worker import RankJob, one_core_each, run_rank
    from graphs import sources
    from graphs.plan import Placement
    from placer import distributed

    pins = parse_list(args.pin, what="pin", known=["off", "on"])
    mallocs = parse_list(args.malloc, what="malloc", known=list(MALLOCS))
    if "huge" in mallocs and not transparent_huge_pages():
        raise PlacerError("--malloc huge: transparent huge pages are off here (/sys/kernel/mm/transparent_hugepage)")
    receives = parse_list(args.receives, what="receives", known=["early", "jit"]) if args.receives else [None]
    starts = parse_list(args.start, what="start", known=["spawn", "forkserver"]) if args.start else [None]
    slices = parse_list(args.slice, what="slice", known=["default", "short"]) if args.slice else [None]
    tunable = next((m for m in mallocs if MALLOCS[m]["spawn"]), None)
    if tunable and "forkserver" in starts:
        raise PlacerError(
            f"--malloc {tunable}: needs spawned processes (glibc reads GLIBC_TUNABLES as one starts), not --start "
            "forkserver"
        )
    if "on" in pins and not hasattr(os, "sched_setaffinity"):
        raise PlacerError("--pin on: needs os.sched_setaffinity (Linux)")
    placement = Placement.load(args.placement)
    model, inputs = sources.resolve_model(args.source)
    plan, _ = distributed.compile_for_model(model, inputs, placement, backend="gloo", nproc_per_node=args.ranks)
    job = RankJob(source=args.source, plan=plan.to_dict(), source_dir=os.getcwd(), warmup=args.warmup, steps=args.steps)
    own_cores = one_core_each(args.ranks) if "on" in pins else None  # rank r on core r
    say("  the host's floor: twenty 512x512 matmuls on one thread, 60 times")
    floor = noise_floor()
    settings = [(p, m, r, s, c) for p in pins for m in mallocs for r in receives for s in starts for c in slices]
    builds: dict[str, list[dict[str, Any]]] = {setting_name(*s): [] for s in settings}
    load = [os.getloadavg()[0]]
    for k in range(args.builds):
        for pin, malloc, recv, start, cut in settings if k % 2 == 0 else settings[::-1]:  # ABBA: drift hits each alike
            floor_s = noise_floor(runs=BUILD_FLOOR_RUNS)["median_s"]  # the host's speed now, just before the build
            early = None if recv is None else recv == "early"
            cpus = own_cores if pin == "on" else None
            helper_slice_us = HELPER_SLICE_US if cut == "short" else None
            setting = replace(
                job,
                steady_malloc=MALLOCS[malloc]["steady"],
                early_receives=early,
                cpus=cpus,
                helper_slice_us=helper_slice_us,
            )
            method = start or "spawn"  # by default a build shares nothing with the one before it
            t0 = time.perf_counter()
            with huge_pages(malloc == "huge"):
                report = launch(
                    run_rank,
                    (setting,),
                    nproc_per_node=args.ranks,
                    start_method=method,
                    thread_cache_off=MALLOCS[malloc]["thread_cache_off"],
                )[0]
            job_s = time.perf_counter() - t0  # the whole job: its processes' start, build, steps and exit
            step_s, times = report["step_time_s"], list(report["step_times_s"])
            name = setting_name(pin, malloc, recv, start, cut)
            build = {"build": k, "step_time_s": step_s, "step_times_s": times, "floor_s": floor_s, "job_s": job_s}
            build["short_slices"] = [r["short_slices"] for r in report["ranks"]]  # threads per rank
            build["thread_cache_off"] = [r["thread_cache_off"] for r in report["ranks"]]  # as glibc shows it
            builds[name].append(build)
            say(
                f"  build {k}, {name}: {step_s * 1e3:.2f} ms (the floor before it {floor_s * 1e3:.2f} ms; the job "
                f"{job_s:.1f} s)"
            )
    load.append(os.getloadavg()[0])
    return {
        "device": f"{args.ranks} gloo ranks",
        "ops": len(placement.assignment),
        "load_before_after": load,
        "floor": floor,
        "builds": builds,
        "summary": {name: summary(b) for name, b in builds.items()},
    }


def setting_name(
    pin: str, malloc: str, receives: str | None = None, start: str | None = None, cut: str | None = None
) -> str:
    """A setting of ``--ranks`` builds (``cut``: ``--slice``'s).

    >>> setting_name("off", "steady"), setting_name("on", "steady", "jit"), setting_name("on", "steady", None, "spawn")
    ('pin off, malloc steady', 'pin on, malloc steady, receives jit', 'pin on, malloc steady, start spawn')
    >>> setting_name("on", "steady", cut="short")
    'pin on, malloc steady, slice short'
    """
    return (
        f"pin {pin}, malloc {malloc}"
        + (f", receives {receives}" if receives else "")
        + (f", start {start}" if start else "")
        + (f", slice {cut}" if cut else "")
    )


def measure(args: argparse.Namespace, say) -> dict[str, Any]:
    """Every build of the placement under every setting, interleaved; the builds and each setting's summary."""
    import torch

    from envs.real.homes import homes_apart
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
        if homes_apart(placement, env.graph):
            raise PlacerError(f"{args.placement}: parameter homes: measured in one process by placer run, not here")
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
    head = [
        "setting" if "floor" in doc else "threads",
        "builds",
        "median ms",
        "pair diff",
        "halves",
        "first / rest",
        "in-build spread",
    ]
    floored = any("pair_diff_floored" in s for s in doc["summary"].values())
    head += ["pair diff over the floor"] if floored else []
    jobs = any("job_s" in s for s in doc["summary"].values())
    head += ["job s (median)"] if jobs else []
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for t, s in doc["summary"].items():
        row = [t, str(len(doc["builds"][t])), f"{s['median_s'] * 1e3:.2f}", f"{s['pair_diff']:.1%}"]
        row += [f"{s['halves']:.3f}", f"{s['first_over_rest']:.3f}", f"{s['in_build_spread']:.1%}"]
        row += [f"{s['pair_diff_floored']:.1%}" if "pair_diff_floored" in s else "-"] if floored else []
        row += [f"{s['job_s']:.2f}" if "job_s" in s else "-"] if jobs else []
        lines.append("| " + " | ".join(row) + " |")
    if "floor" in doc:
        f = doc["floor"]
        lines.append(
            f"\nThe host's floor (a matmul loop on one thread): median {f['median_s'] * 1e3:.2f} ms, p10 "
            f"{f['p10_s'] * 1e3:.2f}, p90 {f['p90_s'] * 1e3:.2f} (p90/p10 {f['p90_s'] / f['p10_s']:.2f}x), pair diff "
            f"{f['pair_diff']:.1%}"
        )
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
    ap.add_argument("--ranks", type=int, default=0, help="N: each build one job of N gloo processes (--placement)")
    ap.add_argument("--pin", default="off", help="--ranks: comma list of off,on (each rank pinned to its own core)")
    ap.add_argument(
        "--malloc",
        default="steady",
        help="--ranks: comma list of steady,default,cached,huge (glibc's malloc keeping what a step frees, its "
        "thread cache off, as placer measures; or glibc's defaults; or steady with the thread cache on; or steady "
        "and asking for transparent huge pages, GLIBC_TUNABLES=glibc.malloc.hugetlb=1)",
    )
    ap.add_argument(
        "--receives",
        default=None,
        help="--ranks: comma list of early,jit (every receive of a step posted as it begins, placer's default on "
        "CPU ranks under GPipe and 1F1B; or where torch's schedule posts it); default: placer's, not named in the "
        "settings",
    )
    ap.add_argument(
        "--start",
        default=None,
        help="--ranks: comma list of spawn,forkserver (each build's processes fresh interpreters, or forked from a "
        "fork server that imported torch once, as placer starts them); default: spawned, not named in the settings",
    )
    ap.add_argument(
        "--slice",
        default=None,
        help="--ranks: comma list of default,short (gloo's threads at the scheduler's slice, or asking for "
        f"{HELPER_SLICE_US} us so that a woken one preempts the rank's compute, envs.real.slices); default: the "
        "job's default, not named in the settings",
    )
    ap.add_argument("--json", action="store_true", help="print every build's step times as JSON")
    args = ap.parse_args(argv)
    if not (args.source or args.scenario):
        ap.error("give --source or --scenario")
    if args.ranks and not (args.source and args.placement):
        ap.error("--ranks: give --source and --placement (the plan across processes to measure)")
    if args.ranks < 0 or args.ranks == 1:
        ap.error("--ranks: at least 2 processes")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    try:
        if args.builds < 2 or args.steps < 1 or args.warmup < 0:
            raise PlacerError("--builds must be at least 2, --steps at least 1 and --warmup at least 0")
        doc = measure_ranks(args, say) if args.ranks else measure(args, say)
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

"""How cost grows with graph size: save/load, coarsening, one training iteration, memory.

    python -m bench.scale                        # 1,000 / 10,000 / 100,000 ops
    python -m bench.scale --sizes 1000,10000 --json

For a synthetic graph (:func:`graphs.synthetic.random_dag`) of N ops,
:func:`measure` times: save + load of the JSON file, coarsening to the policy's
groups, building the policy and the simulator, and one training iteration split
into its parts — sample K placements (policy decode + expand to ops), simulate
the batch, and the REINFORCE update. Times are wall-clock seconds; each part of
the iteration is the fastest of ``iterations - 1`` repeats (the first iteration
is not counted). Every stage first runs once on a 50-op graph, so lazy imports
and compiled kernels are not charged to the first size.

Memory is the process's peak resident set size (``resource.getrusage``
``ru_maxrss``) — it sees torch's and numba's allocations, which tracemalloc does
not — measured in a fresh Python process per size by :func:`run` (``python -m
bench.scale --one N --measure OPTIONS_JSON``, which prints :func:`measure`'s row as JSON),
with the RSS after that warm-up reported separately so the growth is visible.
The growth exponent b fits cost ~ ops**b between the two largest sizes (1: linear).
The iteration's reward is the training loop's own (:func:`placer.learn.algos.reward`).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread unless told otherwise: read as numpy and torch load

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch

import envs
from bench.common import OneLineParser, Progress, machine_line, parse_list, repo_env
from graphs import PlacerError, io
from graphs.grouping import coarsen, default_num_groups
from graphs.synthetic import random_dag
from placer.learn.algos import ALGOS
from placer.learn.algos import reward as batch_reward
from placer.learn.config import TrainConfig
from policies import POLICIES


def rss_bytes() -> int:
    """Peak resident set size of this process so far (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def measure(
    num_ops: int,
    *,
    samples: int = 8,
    cluster: str = "k80x4",
    policies: Sequence[str] = ("seq2seq", "hierarchical"),
    iterations: int = 3,
    seed: int = 0,
) -> dict[str, Any]:
    """Time every stage for one synthetic graph of ``num_ops`` ops (in this process)."""
    if num_ops < 2 or samples < 1 or iterations < 1:
        raise PlacerError(
            f"scale: need num_ops >= 2, samples >= 1, iterations >= 1 (got {num_ops}, {samples}, {iterations})"
        )
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        raise PlacerError(f"--policies: unknown {', '.join(bad)} (known: {', '.join(POLICIES)})")
    c = envs.resolve_cluster(cluster)
    _warm_up(c, policies)  # lazy imports, numba kernels, torch._dynamo: paid once, not a stage
    rss_imports = rss_bytes()
    max_groups = default_num_groups(c.num_devices)
    row: dict[str, Any] = {"ops": num_ops, "samples": samples, "cluster": c.name, "max_groups": max_groups}
    row["generate_s"], graph = _timed(lambda: random_dag(num_ops, seed=seed))
    row["edges"] = graph.num_edges
    with tempfile.TemporaryDirectory(prefix="placer-scale-") as tmp:
        path = os.path.join(tmp, "graph.json")
        row["save_s"], _ = _timed(lambda: io.save(graph, path))
        row["file_bytes"] = os.path.getsize(path)
        row["load_s"], graph = _timed(lambda: io.load(path))
    row["coarsen_s"], grouping = _timed(lambda: coarsen(graph, max_groups))
    row["groups"] = grouping.num_groups
    row["sim_init_s"], env = _timed(lambda: _sim_env(envs, graph, c))
    config = TrainConfig(samples=samples)
    single_s, _ = env.step_times(np.repeat(np.arange(c.num_devices, dtype=np.int32)[:, None], graph.num_ops, axis=1))
    t_ref = max(float(np.min(single_s)), 1e-12)  # the reward scale, as in training: best single device
    row["policies"] = {}
    for name in policies:
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        init_s, policy = _timed(
            lambda: POLICIES[name](
                graph, c.num_devices, max_groups=max_groups, hidden=config.hidden, layers=config.layers
            )
        )
        opt = torch.optim.Adam(policy.parameters(), lr=config.lr)
        parts: dict[str, float] = {}
        for it in range(iterations):
            sample_s, sample = _timed(lambda: policy.sample(samples, generator=gen))
            simulate_s, (step_time_s, failed) = _timed(lambda: env.step_times(sample.op_devices))
            reward = batch_reward(step_time_s, failed, t_ref, config.fail_factor)
            adv = torch.as_tensor((reward - reward.mean()) / (reward.std() + 1e-8), dtype=torch.float32)
            update_s, _ = _timed(lambda: ALGOS["reinforce"].update(policy, opt, sample, adv, config))
            if it == 0 and iterations > 1:
                continue  # the first iteration pays one-time initialisation
            for key, v in (("sample_s", sample_s), ("simulate_s", simulate_s), ("update_s", update_s)):
                parts[key] = min(parts.get(key, math.inf), v)
        row["policies"][name] = {
            "policy_init_s": init_s,
            "items": int(getattr(policy, "num_items", 0)),
            **parts,
            "iteration_s": sum(parts.values()),
        }
    first = row["policies"][policies[0]] if policies else {}
    for key in ("policy_init_s", "sample_s", "simulate_s", "update_s", "iteration_s"):
        row[key] = first.get(key, math.nan)
    row["rss_warm_bytes"] = rss_imports
    row["rss_peak_bytes"] = rss_bytes()
    return row


def _warm_up(cluster: Any, policies: Sequence[str]) -> None:
    """Run every stage once on a 50-op graph."""
    graph = random_dag(50, seed=1)
    with tempfile.TemporaryDirectory(prefix="placer-scale-") as tmp:
        io.save(graph, os.path.join(tmp, "g.json"))
        io.load(os.path.join(tmp, "g.json"))
    env = _sim_env(envs, graph, cluster)
    config = TrainConfig(samples=2)
    for name in policies:
        policy = POLICIES[name](graph, cluster.num_devices, max_groups=8, hidden=config.hidden)
        opt = torch.optim.Adam(policy.parameters(), lr=config.lr)
        sample = policy.sample(2)
        env.step_times(sample.op_devices)
        ALGOS["reinforce"].update(policy, opt, sample, torch.tensor([1.0, -1.0]), config)


def _sim_env(envs: Any, graph: Any, cluster: Any) -> Any:
    """A SimEnv with its kernel data built (one placement scored)."""
    env = envs.SimEnv(graph, cluster)
    env.step_times(np.zeros((1, graph.num_ops), dtype=np.int32))
    return env


def run(
    sizes: Sequence[int], *, isolate: bool = True, progress: Progress | None = None, **options: Any
) -> list[dict[str, Any]]:
    """:func:`measure` for each size, each in a fresh Python process when ``isolate`` (so RSS is per size)."""
    say = progress or (lambda line: None)
    rows = []
    for n in sizes:
        say(f"{n:,} ops")
        if not isolate:
            rows.append(measure(n, **options))
            continue
        opts = {k: list(v) if isinstance(v, tuple) else v for k, v in options.items()}
        env = repo_env(OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        proc = subprocess.run(
            [sys.executable, "-m", "bench.scale", "--one", str(int(n)), "--measure", json.dumps(opts)],
            capture_output=True,
            text=True,
            env=env,
        )
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise PlacerError(f"scale: the {n:,}-op measurement failed ({tail})")
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return rows


def growth(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    """Exponent b of ``cost ~ ops**b`` between the two largest sizes (1: linear; None: < 2 sizes).

    The two largest, because at small sizes fixed overheads hide the growth.

    >>> growth([{"ops": 1, "t": 5.0}, {"ops": 10, "t": 1.0}, {"ops": 100, "t": 100.0}], "t")
    2.0
    """
    pts = sorted((r["ops"], _get(r, key)) for r in rows)
    pts = [(n, v) for n, v in pts if v is not None and v > 0 and math.isfinite(v)]
    if len({n for n, _ in pts}) < 2:
        return None
    (n0, v0), (n1, v1) = pts[-2], pts[-1]
    return round(math.log(v1 / v0) / math.log(n1 / n0), 6)


def _get(row: dict[str, Any], key: str) -> float | None:
    if key.startswith("rss_growth"):
        return float(row["rss_peak_bytes"] - row["rss_warm_bytes"])
    if "/" in key:
        policy, k = key.split("/", 1)
        return row["policies"].get(policy, {}).get(k)
    return row.get(key)


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """Stages as rows, sizes as columns, and the fitted growth exponent; then memory."""
    policies = list(rows[0]["policies"]) if rows else []
    stages = [
        ("save (JSON)", "save_s"),
        ("load (JSON)", "load_s"),
        ("coarsen", "coarsen_s"),
        ("simulator init", "sim_init_s"),
    ]
    for p in policies:
        stages += [
            (f"{p}: policy init", f"{p}/policy_init_s"),
            (f"{p}: sample K", f"{p}/sample_s"),
            (f"{p}: simulate K", f"{p}/simulate_s"),
            (f"{p}: update", f"{p}/update_s"),
            (f"{p}: one iteration", f"{p}/iteration_s"),
        ]
    head = "| stage | " + " | ".join(f"{r['ops']:,} ops" for r in rows) + " | growth exponent (two largest) |"
    lines = [head, "|---|" + "---:|" * (len(rows) + 1)]
    for label, key in stages:
        vals = [_get(r, key) for r in rows]
        b = growth(rows, key)
        flag = " **superlinear**" if b is not None and b > 1.15 else ""
        lines.append(
            f"| {label} | "
            + " | ".join(f"{v:.3f} s" if v is not None else "—" for v in vals)
            + (f" | {b:.2f}{flag} |" if b is not None else " | — |")
        )
    mib = float(1 << 20)
    lines.append("| peak RSS | " + " | ".join(f"{r['rss_peak_bytes'] / mib:.0f} MiB" for r in rows) + " | — |")
    b = growth(rows, "rss_growth")
    lines.append(
        "| RSS above warm-up | "
        + " | ".join(f"{(r['rss_peak_bytes'] - r['rss_warm_bytes']) / mib:.0f} MiB" for r in rows)
        + (f" | {b:.2f} |" if b is not None else " | — |")
    )
    return "\n".join(lines)


def _sizes(arg: str) -> list[int]:
    sizes = []
    for s in parse_list(arg, what="sizes"):
        if not s.isdigit() or int(s) < 2:
            raise PlacerError(f"--sizes: {s!r} is not an op count >= 2")
        sizes.append(int(s))
    return sizes


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m bench.scale", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="comma-separated op counts")
    parser.add_argument("--samples", type=int, default=8, help="K placements per iteration (default 8)")
    parser.add_argument("--cluster", default="k80x4", help="cluster preset or JSON file (default k80x4)")
    parser.add_argument("--policies", default="seq2seq,hierarchical", help="policies to time (default both)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of markdown")
    # run()'s child process: one measure() row as JSON for --one N ops, its keyword arguments in --measure
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--measure", default="{}", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.one is not None:
        print(json.dumps(measure(args.one, **json.loads(args.measure))))
        return 0
    try:
        rows = run(
            _sizes(args.sizes),
            samples=args.samples,
            cluster=args.cluster,
            policies=parse_list(args.policies, what="policies"),
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except PlacerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        doc = {"machine": machine_line(), "memory_measure": "ru_maxrss of a fresh process per size", "rows": rows}
        print(json.dumps(doc, indent=2))
    else:
        print(markdown_table(rows))
        print(
            f"\nK = {args.samples} samples on {args.cluster}; times in wall-clock seconds (fastest of 2 "
            "iterations after a first one); "
            f"memory: peak RSS (ru_maxrss) of a fresh process per size. Machine: {machine_line()}."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

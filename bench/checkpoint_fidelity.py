"""Activation checkpointing measured against the simulator: what the second forward costs, real and simulated.

The model (``--source``, default :func:`llama`: a Llama decoder of four layers built
from its config) is profiled on this machine (``placer profile --devices cpu``: each
op's forward and backward seconds), then three plans with every op on ``cpu:0`` run
real training steps, each in a process of its own (``placer run``), the plans
interleaved over ``--repeats`` rounds so a drift of the machine falls on all alike:

* ``plain``: no checkpointing;
* ``half``: every other layer checkpointed;
* ``all``: every layer checkpointed (:func:`placer.learn.checkpoint_choice.candidate_blocks`).

Per plan: the median of the rounds' median steps, the spread (slowest round over the
fastest), and the simulated step on the profile (:mod:`envs.sim.checkpointing`: on
the host, the calling thread runs each block's forward again before its first
backward). The figures to read are the ratios to ``plain``, real against simulated,
and the simulator's error on each plan::

    python -m bench.checkpoint_fidelity --repeats 5 --steps 10 --json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np

from bench.common import OneLineParser, print_report, repo_env
from graphs import PlacerError

PLANS = ("plain", "half", "all")


def llama() -> tuple[Any, tuple]:
    """A Llama decoder of 4 layers (hidden 128, MLP 512, 4 heads) with its LM loss, batch 8 x 128 tokens."""
    import torch

    from graphs.models import corpus

    torch.manual_seed(0)
    return corpus.build_causal(
        "llama",
        8,
        128,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_dropout=0.0,
    )


def plans(graph: Any, cluster: Any) -> dict[str, Any]:
    """The three plans of the module doc, every op on ``cpu:0``."""
    from graphs.plan import Placement
    from placer.learn.checkpoint_choice import candidate_blocks

    layers = candidate_blocks(graph)
    if len(layers) < 2:
        raise PlacerError(f"{graph.name or 'the model'}: no repeated list of layers to checkpoint")
    out = {}
    for name, blocks in (("plain", []), ("half", layers[::2]), ("all", layers)):
        p = Placement.from_indices(graph, cluster.device_names, np.zeros(graph.num_ops, dtype=int))
        p.checkpoint = list(blocks)
        out[name] = p
    return out


def _placer(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "placer", *args], capture_output=True, text=True, env=repo_env(OMP_NUM_THREADS="1")
    )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PlacerError(f"placer {args[0]}: {tail}")
    return done.stdout


def run(source: str, repeats: int, steps: int, say) -> dict[str, Any]:
    """Profile, plan, measure and simulate (the module doc); the document ``--json`` prints."""
    import envs
    import graphs
    from envs.real.profiler.fit import with_profile
    from graphs import sources

    model, inputs = sources.resolve_model(source)
    graph = graphs.capture(model, inputs)
    cluster = envs.Cluster.preset("h200x1")  # cpu:0 is this machine's host once profiled; gpu:0 unused
    with tempfile.TemporaryDirectory() as tmp:
        profile = os.path.join(tmp, "profile.json")
        say("profiling every op on this machine's CPU")
        _placer("profile", source, "--devices", "cpu", "-o", profile)
        profiled, calibrated = with_profile(graph, cluster, profile, device_map="*=cpu")
        env = envs.SimEnv(profiled, calibrated)
        made = plans(graph, cluster)
        paths = {}
        for name, p in made.items():
            paths[name] = os.path.join(tmp, f"{name}.json")
            p.save(paths[name])
        rounds: dict[str, list[float]] = {name: [] for name in PLANS}
        for k in range(repeats):
            for name in PLANS if k % 2 == 0 else PLANS[::-1]:
                argv = ["run", source, "--placement", paths[name], "--cluster", "h200x1", "--device-map", "*=cpu"]
                doc = json.loads(_placer(*argv, "--steps", str(steps), "--warmup", "2", "--json"))
                rounds[name].append(float(doc["step_time_s"]))
                say(f"  round {k}, {name}: {rounds[name][-1] * 1e3:.2f} ms")
        simulated = {name: float(env.simulate(p).step_time_s) for name, p in made.items()}
    real = {name: float(np.median(v)) for name, v in rounds.items()}
    rows = {
        name: {
            "blocks": len(made[name].checkpoint),
            "real_s": real[name],
            "spread": max(rounds[name]) / min(rounds[name]),
            "sim_s": simulated[name],
            "real_over_plain": real[name] / real["plain"],
            "sim_over_plain": simulated[name] / simulated["plain"],
            "sim_error": simulated[name] / real[name] - 1.0,
        }
        for name in PLANS
    }
    return {"source": source, "ops": graph.num_ops, "repeats": repeats, "steps": steps, "rounds": rounds, "rows": rows}


def table(doc: dict[str, Any]) -> str:
    lines = [
        f"{doc['source']} ({doc['ops']} ops), every op on cpu:0, medians of {doc['repeats']} rounds of "
        f"{doc['steps']} steps:",
        "",
        "| plan | layers checkpointed | real (ms) | spread | simulated (ms) | real / plain | simulated / plain "
        "| simulator's error |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in doc["rows"].items():
        lines.append(
            f"| {name} | {r['blocks']} | {r['real_s'] * 1e3:.2f} | {r['spread']:.2f} | {r['sim_s'] * 1e3:.2f} | "
            f"{r['real_over_plain']:.3f} | {r['sim_over_plain']:.3f} | {r['sim_error'] * 100:+.1f} % |"
        )
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m bench.checkpoint_fidelity", description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="bench.checkpoint_fidelity:llama", help="module:callable (the model)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds over the three plans (default 5)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run (default 10)")
    parser.add_argument("--json", action="store_true", help="every round and the rows as JSON")
    args = parser.parse_args(argv)
    for flag, value in (("--repeats", args.repeats), ("--steps", args.steps)):
        if value < 1:
            parser.error(f"{flag} {value}: must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    try:
        doc = run(args.source, args.repeats, args.steps, say)
    except PlacerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_report(args.json, doc, lambda: table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

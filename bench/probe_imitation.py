"""How well the gnn policy can imitate one heuristic placement: agreement and greedy step time per step.

    OMP_NUM_THREADS=1 python -m bench.probe_imitation [GRAPH] [--cluster k80x4] [--steps 300] [--every 50]
        [--lr 3e-3] [--decoder independent|schedule] [--dagger P] [--switch-share S] [--json]

GRAPH: a zoo graph, or a pretraining corpus item (``recurrent-1500-s51``: ``placer pretrain``'s synthetic
names, sizes 300/1500/5000, seed 0).

Trains a fresh gnn policy (hidden 64, 3 rounds) on one (graph, cluster) pair by imitation of its best
fast heuristic (``placer.learn.pretrain.imitation_label``, labels canonicalised as ``placer pretrain`` does),
the loss ``placer pretrain`` uses, and prints every ``--every`` steps: the imitation loss, the share of
ops whose greedy device equals the label's, the greedy placement's simulated step time (node order),
and the ops per device, and the agreement on the label's switches (ops not put where most of their input
bytes are; ``GNNPolicy.switch_mask``). It answers one question about the architecture: if the policy cannot
reproduce a placement of a graph it is trained on, zero-shot on unseen graphs cannot do better.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread unless told otherwise: read as numpy and torch load

import argparse
import json
import sys
import time

import numpy as np
import torch

import envs
from bench.common import OneLineParser
from graphs import PlacerError, plan, zoo
from placer.learn.pretrain import canonical_label
from placer.learn.pretrain import imitation_label as best_heuristic
from placer.learn.pretrain_corpus import build_corpus
from policies.gnn import GNNNet, GNNPolicy


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = OneLineParser(prog="python -m bench.probe_imitation", description=__doc__.splitlines()[0])
    ap.add_argument(
        "graph",
        nargs="?",
        default="inception-v3",
        help="zoo graph or pretraining corpus item such as recurrent-1500-s51 (default inception-v3)",
    )
    ap.add_argument("--cluster", default="k80x4")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--decoder",
        default="independent",
        choices=("independent", "schedule"),
        help="the gnn policy's decoder (default independent)",
    )
    ap.add_argument(
        "--dagger",
        type=float,
        default=0.0,
        help="schedule decoder: share of steps that imitate along the policy's own samples (default 0)",
    )
    ap.add_argument(
        "--switch-share",
        type=float,
        default=0.0,
        help="schedule decoder: share of the loss on the label's switches (placer pretrain --switch-share; default 0)",
    )
    ap.add_argument("--json", action="store_true")
    return ap.parse_args(argv)


def _report(
    args: argparse.Namespace, g, c, method: str, label_s: float, label, single_s: float, switch, rows: list[dict]
) -> int:
    head = {
        "graph": g.name,
        "ops": g.num_ops,
        "cluster": c.name,
        "decoder": args.decoder,
        "label": method,
        "label_step_time_s": label_s,
        "label_ops_per_device": np.bincount(label, minlength=c.num_devices).tolist(),
        "best_single_s": single_s,
        "switches": int(switch.sum()),
        "switch_share": args.switch_share,
    }
    if args.json:
        print(json.dumps({**head, "rows": rows}, indent=1))
        return 0
    print(
        f"{g.name} ({g.num_ops} ops) on {c.name}, {args.decoder} decoder: label {method} {label_s * 1e3:.1f} ms "
        f"{head['label_ops_per_device']}, best single device {single_s * 1e3:.1f} ms; {head['switches']} switches, "
        f"switch share {args.switch_share:g}"
    )
    print("| step | loss | agreement | on switches | greedy ms | ops per device |")
    print("|---:|---:|---:|---:|---:|---|")
    for r in rows:
        ms = "fails" if r["greedy_step_time_s"] is None else f"{r['greedy_step_time_s'] * 1e3:.1f}"
        print(
            f"| {r['step']} | {r['loss']:.3f} | {r['agreement']:.3f} | {r['switch_agreement']:.3f} | {ms} | "
            f"{r['ops_per_device']} |"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.steps < 0 or args.every < 1 or not args.lr > 0 or not 0 <= args.switch_share < 1:
        print(
            "probe_imitation: --steps must be >= 0, --every >= 1, --lr > 0 and --switch-share in [0, 1)",
            file=sys.stderr,
        )
        return 2
    try:
        if args.graph in zoo.names():
            g = zoo.graph(args.graph)
        else:
            found = [it for it in build_corpus("synthetic,library") if it.name == args.graph]
            if not found:
                raise PlacerError(f"{args.graph!r} is neither a zoo graph nor a corpus item (e.g. recurrent-1500-s51)")
            g = found[0].load()
        c = envs.resolve_cluster(args.cluster)
    except PlacerError as e:
        print(f"probe_imitation: {e}", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    coin = np.random.default_rng(args.seed)
    method, label_s, label = best_heuristic(g, c)
    env = envs.SimEnv(g, c)
    label = canonical_label(g, c, label, env)
    single_s = float(np.min(env.step_times(plan.single_device_rows(c.num_devices, g.num_ops))[0]))
    policy = GNNPolicy(g, c.num_devices, cluster=c, net=GNNNet(hidden=64, rounds=3, decoder=args.decoder))
    opt = torch.optim.Adam(policy.parameters(), lr=args.lr)
    switch = policy.switch_mask(label)[0] if policy.sequential else np.zeros(g.num_ops, dtype=bool)
    rows = []
    t0 = time.perf_counter()
    for step in range(args.steps + 1):
        own = args.decoder == "schedule" and coin.random() < args.dagger
        loss = policy.imitation_loss(
            label, along=policy.sample(4, generator=gen).op_devices if own else None, switch_share=args.switch_share
        )
        if step % args.every == 0 or step == args.steps:
            greedy = policy.greedy()
            step_time_s, failed = env.step_times(greedy[None])
            rows.append(
                {
                    "step": step,
                    "loss": float(loss.detach()),
                    "agreement": float((greedy == label).mean()),
                    "switch_agreement": float((greedy[switch] == label[switch]).mean()) if switch.any() else 1.0,
                    "greedy_step_time_s": None if failed[0] else float(step_time_s[0]),
                    "ops_per_device": np.bincount(greedy, minlength=c.num_devices).tolist(),
                    "seconds": time.perf_counter() - t0,
                }
            )
        if step < args.steps:
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            opt.step()
    return _report(args, g, c, method, label_s, label, single_s, switch, rows)


if __name__ == "__main__":
    sys.exit(main())

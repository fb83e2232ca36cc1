"""Pipeline splits at LLM scale, simulated: a Llama-3-8B-shaped decoder on 8 H100s, 1F1B, Interleaved 1F1B,
Interleaved zero bubble, ZB-V and DualPipeV.

The model is a plain-torch decoder of Llama-3-8B's shape (32 layers, hidden 4096, MLP
14336, 32 query and 8 key/value heads, a 128256-token vocabulary, untied head),
captured on the meta device (no weights are made), one step of ``--batch`` sequences of
``--seq`` tokens. Each split (:data:`METHODS`) is scored by the simulator of ranks
(:class:`envs.sim.ranks.RankSim`) on ``--cluster`` (default ``h100x8``, its 8 GPUs the
ranks) under 1F1B (one stage per rank, ``M`` microbatches, 8 in flight), torch's
Interleaved 1F1B (two stages per rank), torch's Interleaved zero bubble (two stages per
rank, each backward split into its input and weight parts, the weight parts filling the
waits: ``interleaved_zb``), torch's ZB-V (the same split backward, two stages per rank
in a V, so that the first rank also runs the last stage: ``zbv``) and torch's DualPipeV
(the same V, its steady state one stage's forward run with the other's backward:
``dualpipev``). Beside them, per schedule, what no split can
beat by much (:func:`balanced_estimate`): ``equal_layers``' compute spread evenly over
the ranks, with the schedule's bubble::

    python -m bench.rank_llm --json
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench.common import OneLineParser
from envs.cluster import resolve_cluster
from envs.real.distributed.schedules import SPLIT_BACKWARD
from envs.sim.ranks import RankSim
from envs.timeline import rank_phases
from graphs import PlacerError
from placer.methods import registry

METHODS = ("equal_layers", "flops_balanced", "parameters_balanced", "stage_search")
#: schedule -> (stages per rank, the schedule's name).
SCHEDULES = {
    "1f1b": (1, "1f1b"),
    "interleaved_1f1b": (2, "interleaved_1f1b"),
    "interleaved_zb": (2, "interleaved_zb"),
    "zbv": (2, "zbv"),
    "dualpipev": (2, "dualpipev"),
}


class Block(nn.Module):
    """A Llama decoder layer: RMSNorm, grouped-query attention, RMSNorm, SwiGLU MLP."""

    def __init__(self, hidden: int, mlp: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.attn_norm, self.mlp_norm = nn.RMSNorm(hidden), nn.RMSNorm(hidden)
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.k = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.gate = nn.Linear(hidden, mlp, bias=False)
        self.up = nn.Linear(hidden, mlp, bias=False)
        self.down = nn.Linear(mlp, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        x = x + self.o(a)
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    """Embedding, ``layers`` :class:`Block`\\ s, RMSNorm, the vocabulary head, next-token cross-entropy."""

    def __init__(self, vocab=128256, hidden=4096, mlp=14336, layers=32, heads=32, kv_heads=8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList([Block(hidden, mlp, heads, kv_heads) for _ in range(layers)])
        self.norm = nn.RMSNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return F.cross_entropy(self.head(self.norm(h)).flatten(0, 1), targets.flatten())


def llama_graph(batch: int, seq: int, **shape: int) -> Any:
    """The OpGraph of one step of :class:`Llama` on ``batch x seq`` tokens, captured on the meta device."""
    from graphs.torch_capture import capture

    with torch.device("meta"):
        model = Llama(**shape)
        tokens = torch.zeros(batch, seq, dtype=torch.long)
    return capture(model, (tokens, tokens), name="llama-8b")


def score(graph: Any, cluster: Any, schedule: str, microbatches: int) -> list[dict[str, Any]]:
    """Every method's split under ``schedule`` with ``microbatches``: simulated step, status, seconds to find."""
    per_rank, name = SCHEDULES[schedule]
    R = len(cluster.gpu_indices()) or cluster.num_devices
    inflight = R if name == "1f1b" else None
    sim = RankSim(graph, cluster, microbatches=microbatches, inflight=inflight, schedule=name)
    rows = []
    for method in METHODS:
        fn = registry.get(method)
        options: dict[str, Any] = {"stages_per_rank": per_rank, "schedule": name}
        if registry.accepts(fn, "env"):
            options.update(env=SimpleNamespace(microbatches=microbatches, inflight=inflight))
        start = time.perf_counter()
        op_devices = fn(graph, cluster, **options)
        found_s = time.perf_counter() - start
        res = sim.simulate(op_devices)
        rows.append(
            {
                "method": method,
                "schedule": name,
                "microbatches": microbatches,
                "step_time_s": res.step_time_s if res.ok else None,
                "status": res.status,
                "message": res.message,
                "stages": res.extra.get("stages"),
                "found_s": found_s,
            }
        )
    return rows


def balanced_estimate(graph: Any, cluster: Any, schedule: str, microbatches: int, op_devices: Any) -> dict[str, Any]:
    """How fast any split could be under ``schedule``: ``op_devices``' plan (``equal_layers``') compute, forward and
    backward summed over its ranks (:meth:`envs.sim.ranks.RankSim.timeline`), spread evenly over the R ranks and
    stretched by the schedule's bubble, ``(M + R - 1) / M`` for 1F1B, ``1 + (R - 1) / (v M)`` for v stages per rank
    (Interleaved), none for zero bubble (its ideal: the weight parts fill every wait); sends and the optimizer step
    are left out. ``imbalance``: the plan's busiest rank's compute over the mean, the most any re-split gains when
    M is large enough that the bubble vanishes."""
    per_rank, name = SCHEDULES[schedule]
    R = len(cluster.gpu_indices()) or cluster.num_devices
    inflight = R if name == "1f1b" else None
    sim = RankSim(graph, cluster, microbatches=microbatches, inflight=inflight, schedule=name)
    result, events = sim.timeline(op_devices)
    if not result.ok:
        raise PlacerError(f"balanced estimate under {name}: the plan does not run ({result.message})")
    compute = [p["forward_s"] + p["backward_s"] for p in rank_phases(events).values()]
    mean = sum(compute) / R
    if name in SPLIT_BACKWARD:
        bubble = 1.0
    elif per_rank == 1:
        bubble = (microbatches + R - 1) / microbatches
    else:
        bubble = 1 + (R - 1) / (per_rank * microbatches)
    return {"schedule": name, "estimate_s": mean * bubble, "bubble": bubble, "imbalance": max(compute) / mean}


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m bench.rank_llm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", default="h100x8")
    parser.add_argument("--batch", type=int, default=16, help="sequences per step (default 16)")
    parser.add_argument("--seq", type=int, default=2048, help="tokens per sequence (default 2048)")
    parser.add_argument("--microbatches", type=int, default=16, help="M (default 16)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        cluster = resolve_cluster(args.cluster)
        if min(args.batch, args.seq, args.microbatches) < 1 or args.batch % args.microbatches:
            raise PlacerError("--batch, --seq, --microbatches: at least 1, and the batch a multiple of M")
        graph = llama_graph(args.batch, args.seq)
        rows = [row for s in SCHEDULES for row in score(graph, cluster, s, args.microbatches)]
        bounds = []
        for s, (per_rank, _) in SCHEDULES.items():
            equal = registry.get("equal_layers")(graph, cluster, stages_per_rank=per_rank, schedule=s)
            bounds.append(balanced_estimate(graph, cluster, s, args.microbatches, equal))
    except PlacerError as e:
        print(f"python -m bench.rank_llm: {e}", file=sys.stderr)
        return 2
    doc = {"cluster": cluster.name, "ops": graph.num_ops, "batch": args.batch, "seq": args.seq, "rows": rows}
    doc["balanced"] = bounds
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    base = {r["schedule"]: r["step_time_s"] for r in rows if r["method"] == "equal_layers"}
    for r in rows:
        t, b = r["step_time_s"], base[r["schedule"]]
        gain = f"{b / t:.2f}x equal_layers" if t and b else r["status"]
        step = f"{t:.3f} s" if t else r["status"]
        print(f"{r['schedule']:<18} {r['method']:<20} {step:>10}  {gain}  ({r['found_s']:.1f} s to find)")
    for b in bounds:
        ceiling = base[b["schedule"]] / b["estimate_s"] if base[b["schedule"]] else float("nan")
        print(
            f"{b['schedule']:<18} {'balanced estimate':<20} {b['estimate_s']:>8.3f} s  {ceiling:.2f}x equal_layers  "
            f"(bubble x{b['bubble']:.3f}; equal_layers' busiest rank {b['imbalance']:.3f}x the mean)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

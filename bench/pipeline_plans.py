"""Pipelined plans on LLM-shaped Hugging Face models: placer vs accelerate vs equal blocks, simulated.

Builds each model on the meta device from a transformers config (no weights, no
network), captures one training step (``model(input_ids, labels=...).loss``),
places it with each method once (methods that search with the simulator once per
M and in-flight window W), and scores every plan at every M in ``--microbatches``
and every W in ``--inflight`` with the simulator (``envs.SimEnv(microbatches=M,
inflight=W)``: W = all is fill-drain, activations of every microbatch in flight;
W < M one-forward-one-backward, at most W in flight). Prints one markdown table
per (model, cluster), or ``--json``.

Usage:
    python -m bench.pipeline_plans [--models llama8b,llama1b,mixtral] [--clusters h100x8,a100-40gx4]
        [--microbatches 1,2,4,8] [--inflight all|W[,W...]] [--methods accelerate,gpipe,expert,m_topo,m_sct,annealing]
        [--anneal-s 60] [--host-input-free] [--json]

``accelerate`` needs ``pip install accelerate``. Clusters are presets
(``a100-40gx4`` among them) or placer-cluster/1 files.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread unless told otherwise: read as numpy and torch load

import argparse
import json
import sys
import time
from typing import Any

import numpy as np
import torch

import envs
from bench.common import OneLineParser
from envs.microbatch import parse_windows, plan_shapes
from graphs import PlacerError, capture
from graphs.ops import input_free_mask
from placer.methods import registry
from placer.methods.registry import HeuristicUnavailable, accepts

GIB = float(1 << 30)

# name -> (transformers config class, kwargs); sequence 2048, global batch 8 unless --seq/--batch
MODELS = {
    # Llama-3-8B: 32 layers, d 4096, FFN 14336, 32 heads / 8 KV heads, vocab 128256
    "llama8b": (
        "LlamaConfig",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            max_position_embeddings=8192,
            rope_theta=500000.0,
        ),
    ),
    # Llama-3.2-1B: 16 layers, d 2048, FFN 8192, 32 / 8 heads, vocab 128256, tied embeddings
    "llama1b": (
        "LlamaConfig",
        dict(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            max_position_embeddings=8192,
            rope_theta=500000.0,
            tie_word_embeddings=True,
        ),
    ),
    # a toy Llama for smoke tests: 2 layers, d 64
    "llama-tiny": (
        "LlamaConfig",
        dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=256,
            max_position_embeddings=256,
        ),
    ),
    # a small Mixtral: 8 layers, d 1024, 8 experts of FFN 3584, top-2, vocab 32000
    "mixtral": (
        "MixtralConfig",
        dict(
            hidden_size=1024,
            intermediate_size=3584,
            num_hidden_layers=8,
            num_attention_heads=16,
            num_key_value_heads=8,
            num_local_experts=8,
            num_experts_per_tok=2,
            vocab_size=32000,
            max_position_embeddings=4096,
        ),
    ),
}


def build(name: str, seq: int, batch: int):
    """(model on meta in bf16, (input_ids, labels)) for ``name``."""
    import transformers  # an extra: only the models need it

    cls_name, kw = MODELS[name]
    cfg = getattr(transformers, cls_name)(**kw)
    cfg._attn_implementation = "sdpa"  # fused attention (no [seq, seq] score tensors kept), as training uses today
    cfg.use_cache = False

    class LossOnly(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = getattr(transformers, cls_name.replace("Config", "ForCausalLM"))(cfg)
            self._no_split_modules = list(
                getattr(self.model, "_no_split_modules", None) or []
            )  # accelerate keeps a block whole

        def forward(self, input_ids, labels):
            return self.model(input_ids=input_ids, labels=labels, use_cache=False).loss

    with torch.device("meta"):
        model = LossOnly().to(torch.bfloat16)
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    return model, (ids, ids.clone())


_CAPTURED: dict = {}


def captured(model_name: str, seq: int, batch: int) -> tuple[Any, Any, float]:
    """``(model, graph, capture seconds)``: one capture per model, shared by the clusters."""
    key = (model_name, seq, batch)
    if key not in _CAPTURED:
        t0 = time.perf_counter()
        model, inputs = build(model_name, seq, batch)
        _CAPTURED[key] = (model, capture(model, inputs), time.perf_counter() - t0)
    return _CAPTURED[key]


def method_rows(
    method: str, model: Any, graph: Any, cluster: Any, base: Any, shapes: list, anneal_s: float, free: Any
) -> list[dict]:
    """One method's plan scored at every (M, W) of ``shapes`` (placed again per shape when it searches with the
    simulator), and each plan with the input-free ops on the host beside it when ``free`` is given."""
    fn = registry.get(method)
    host = cluster.kinds.index("cpu") if "cpu" in cluster.kinds else None
    rows, placed = [], None
    for M, W in shapes:
        env = base.with_microbatches(M, W)
        kwargs: dict[str, Any] = {"seed": 0}
        if accepts(fn, "model"):
            kwargs["model"] = model
        if accepts(fn, "env"):
            kwargs["env"] = env
        if method == "annealing":  # placer's search, started from the list schedulers' and the equal-block plans
            kwargs.update(init=("m_topo", "gpipe"), time_budget_s=anneal_s)
        row = {"method": method, "microbatches": M, "inflight": W}
        t = time.perf_counter()
        try:
            if placed is None or accepts(fn, "env"):
                placed = np.asarray(fn(graph, cluster, **kwargs))
        except HeuristicUnavailable as e:
            return [*rows, {**row, "status": e.status, "message": str(e)}]
        except Exception as e:  # noqa: BLE001 - one failing method must not sink the table
            message = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            return [*rows, {**row, "status": "error", "message": message}]
        place_s = time.perf_counter() - t
        rows.append(_scored(row, env, placed, place_s))
        if free is not None and host is not None and free.any():
            # the same plan with the ops no model input reaches (masks, rotary tables, positions) on the
            # host: their copies to the stages are then host -> GPU, which wait for the destination's
            # queue only, instead of peer copies, which are two-way stream barriers
            moved = placed.copy()
            moved[free] = host
            row = {"method": f"{method}+host-input-free", "microbatches": M, "inflight": W}
            rows.append(_scored({**row, "moved_ops": int(free.sum())}, env, moved, place_s))
    return rows


def run_one(
    model_name: str,
    cluster_name: str,
    ms: list[int],
    methods: list[str],
    seq: int,
    batch: int,
    anneal_s: float = 60.0,
    host_input_free: bool = False,
    ws: list[int | None] | None = None,
) -> dict:
    """Every method's plan of one model on one cluster, scored at every M and W, and the bound at each M."""
    model, graph, capture_s = captured(model_name, seq, batch)
    cluster = envs.resolve_cluster(cluster_name)
    base = envs.SimEnv(graph, cluster)
    free = input_free_mask(graph) if host_input_free else None
    shapes = plan_shapes(ms, ws or [None])
    rows = [r for m in methods for r in method_rows(m, model, graph, cluster, base, shapes, anneal_s, free)]
    bounds = {M: base.with_microbatches(M).lower_bound() for M in ms}
    return {
        "model": model_name,
        "cluster": cluster_name,
        "ops": graph.num_ops,
        "param_gib": graph.total_param_bytes / GIB,
        "capture_s": capture_s,
        "seq": seq,
        "batch": batch,
        "rows": rows,
        "lower_bound_s": bounds,
    }


def _scored(row: dict, env, placed, place_s: float) -> dict:
    r = env.simulate(placed)
    row.update(
        status=r.status,
        step_time_s=r.step_time_s if r.status == "ok" else None,
        sim_step_time_s=r.extra["sim_step_time_s"],
        place_s=place_s,
        peak_gib={d: round(b / GIB, 2) for d, b in r.peak_bytes.items() if d.startswith("gpu")},
        gpus_used=int(len(set(placed.tolist()) - {0})),
        message=r.message,
    )
    return row


def table(res: dict) -> str:
    out = [
        f"### {res['model']} on {res['cluster']} ({res['ops']} ops, {res['param_gib']:.1f} GiB bf16 parameters, "
        f"batch {res['batch']} x seq {res['seq']})",
        "",
        "| method | M | W | status | step (ms) | peak GiB per GPU |",
        "|---|---:|---:|---|---:|---|",
    ]
    for r in res["rows"]:
        step = (
            f"{r['step_time_s'] * 1e3:.0f}"
            if r.get("step_time_s")
            else (f"({r['sim_step_time_s'] * 1e3:.0f})" if r.get("sim_step_time_s") else "—")
        )
        peaks = "/".join(f"{v:.1f}" for v in r.get("peak_gib", {}).values()) or "—"
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('message', '')[:60]}"
        out.append(
            f"| {r['method']} | {r['microbatches']} | {r.get('inflight', r['microbatches'])} | {status} | "
            f"{step} | {peaks} |"
        )
    out.append(
        "| lower bound | " + ", ".join(f"M={M}: {b * 1e3:.0f}" for M, b in res["lower_bound_s"].items()) + " | | | | |"
    )
    return "\n".join(out)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = OneLineParser(prog="python -m bench.pipeline_plans", description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama8b")
    ap.add_argument("--clusters", default="h100x8")
    ap.add_argument("--microbatches", default="1,2,4,8")
    ap.add_argument(
        "--inflight",
        default="all",
        help="in-flight windows W to score at each M: 'all' (fill-drain) and/or numbers (one-forward-one-backward)",
    )
    ap.add_argument("--methods", default="accelerate,gpipe,expert,m_topo,m_sct,annealing")
    ap.add_argument("--anneal-s", type=float, default=60.0, help="annealing's time budget per M (seconds)")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument(
        "--host-input-free",
        action="store_true",
        help="also score each plan with the ops no model input reaches (masks, rotary tables) on the host",
    )
    ap.add_argument("--json", action="store_true")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    for m in args.models.split(","):
        if m not in MODELS:
            print(f"pipeline_plans: --models {m!r}: unknown (known: {', '.join(MODELS)})", file=sys.stderr)
            return 2
    ms = [int(x) for x in args.microbatches.split(",")]
    try:
        ws = parse_windows(args.inflight)
    except PlacerError as e:
        print(f"pipeline_plans: {e}", file=sys.stderr)
        return 2
    results = []
    for model_name in args.models.split(","):
        for cl in args.clusters.split(","):
            res = run_one(
                model_name,
                cl,
                ms,
                args.methods.split(","),
                args.seq,
                args.batch,
                args.anneal_s,
                args.host_input_free,
                ws,
            )
            results.append(res)
            if not args.json:
                print(table(res), flush=True)
                print()
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

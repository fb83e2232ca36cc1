"""A new user's own models (issue 35), and what the module groupings and the search heuristics make of them.

Three models from outside the zoo, as a user writes them (each a ``module:callable`` returning
``(model, example_inputs)``, the model's forward returning its loss):

* ``encoder_small``: a 2-layer ``nn.TransformerEncoder`` with an embedding and a head;
* ``gpt2_wrapped``: a Hugging Face GPT-2 built from its config (4 layers of GPT-2 small's width) in the
  README's wrapper, whose forward returns ``.loss`` (needs transformers, a test extra);
* ``encoder_2048``: a d=2048, 8-layer encoder on the meta device, too big for one 12 GB K80.

:func:`report` places each with the search heuristics and says, per method, whether the placement fits
and its simulated step time (node order, eager) and largest peak, and how many groups each module depth gives;
markdown rows, or with ``--json`` one JSON object per (model, cluster)::

    python -m bench.first_hour [--models encoder_small,gpt2_wrapped,encoder_2048] [--clusters k80x4] [--seed 0]
        [--json]

>>> [name for name, _ in MODELS]
['encoder_small', 'gpt2_wrapped', 'encoder_2048']
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread unless told otherwise: read as numpy and torch load

import json
import sys
from typing import Any, Callable

import torch
from torch import nn

from bench.common import OneLineParser
from graphs import PlacerError

os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: The search heuristics (every one that simulates the placements it tries) and a rule-based one beside them.
METHODS = ("random_search", "random_modules", "module_search", "annealing", "gpipe")


class Encoder(nn.Module):
    """Embedding, ``nn.TransformerEncoder``, head; forward returns the cross-entropy loss."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.encoder(self.embed(ids)))
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


class LossOf(nn.Module):
    """The README's Hugging Face pattern: ``forward(input_ids, labels)`` returns ``model(...).loss``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, labels=labels).loss


def _ids(vocab: int, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    return ids, ids.clone()


def encoder_small() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return Encoder(vocab=1000, d=64, layers=2, heads=4), _ids(1000, 4, 16)


def gpt2_wrapped() -> tuple[nn.Module, tuple]:
    import transformers  # a test extra: only for this model

    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=4, n_positions=256, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    with torch.device("meta"):
        model = LossOf(transformers.GPT2LMHeadModel(config))
    return model, _ids(config.vocab_size, 4, 256)


def encoder_2048() -> tuple[nn.Module, tuple]:
    with torch.device("meta"):
        model = Encoder(vocab=32000, d=2048, layers=8, heads=16)
    return model, _ids(32000, 16, 1024)


MODELS: list[tuple[str, Callable[[], tuple[nn.Module, tuple]]]] = [
    ("encoder_small", encoder_small),
    ("gpt2_wrapped", gpt2_wrapped),
    ("encoder_2048", encoder_2048),
]


def report(name: str, cluster_name: str, seed: int = 0) -> dict[str, Any]:
    """The module levels of model ``name`` and each of :data:`METHODS`' placement of it on the cluster."""
    import envs
    from envs.sim.sim_graph import schedule_graph
    from graphs import capture
    from graphs.module_tree import module_levels
    from placer.compare import compare

    graph = capture(*dict(MODELS)[name](), name=name)
    levels = [(lv.graph.meta["module_depth"], lv.num_groups) for lv in module_levels(schedule_graph(graph))]
    cluster = envs.resolve_cluster(cluster_name)
    rows = compare(graph, cluster, methods=list(METHODS), seed=seed).rows
    return {
        "model": name,
        "cluster": cluster_name,
        "ops": graph.num_ops,
        "module_levels": levels,
        "methods": {
            r.method: {
                "status": r.status,
                "step_time_s": r.step_time_s,
                "peak_bytes": max(r.peak_bytes.values(), default=0) if r.peak_bytes else None,
                "message": r.message,
            }
            for r in rows
            if r.kind == "heuristic"
        },
    }


def markdown(row: dict[str, Any]) -> str:
    """One (model, cluster) of :func:`report`: its module levels, then a row per method."""
    levels = ", ".join(f"depth {d}: {k}" for d, k in row["module_levels"]) or "none"
    lines = [
        f"**{row['model']}** ({row['ops']} ops) on {row['cluster']}; module levels: {levels}",
        "",
        "| method | status | step time (ms) | largest peak (GB) |",
        "|---|---|---:|---:|",
    ]
    for method, r in row["methods"].items():
        step = f"{r['step_time_s'] * 1e3:.3f}" if r["step_time_s"] is not None else "—"
        peak = f"{r['peak_bytes'] / 1e9:.2f}" if r["peak_bytes"] is not None else "—"
        lines.append(f"| {method} | {r['status']} | {step} | {peak} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m bench.first_hour", description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(name for name, _ in MODELS), help="comma list of the models above")
    ap.add_argument("--clusters", default="k80x4", help="comma list of cluster presets or files (default k80x4)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the randomised heuristics (default 0)")
    ap.add_argument("--json", action="store_true", help="one JSON object per (model, cluster)")
    args = ap.parse_args(argv)
    known = dict(MODELS)
    try:
        for name in args.models.split(","):
            if name not in known:
                raise PlacerError(f"--models: {name!r} is not one of {', '.join(known)}")
            for cluster in args.clusters.split(","):
                row = report(name, cluster, seed=args.seed)
                print(json.dumps(row) if args.json else markdown(row), flush=True)
    except PlacerError as e:
        print(f"first_hour: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"first_hour: needs {e.name} (pip install {e.name})", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

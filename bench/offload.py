"""A model whose training state does not fit the GPU: the scenario, its rivals' plans, and their table (issue 34).

The scenario is a Llama-style decoder LM built from a config (nothing downloaded)
with a large vocabulary, so that two modules at its ends, the token embedding and
the LM head, hold most of its weights: an unbalanced model. Its full training
state (fp32 weights, gradients, Adam's two moments, activations) exceeds the GPU
memory cap, which is set for real (:class:`envs.real.local.LocalEnv` limits the
CUDA device to the cluster's GPU memory, ``torch.cuda.set_per_process_memory_fraction``)
and written in the scenario's cluster file (``cpu:0`` + ``gpu:0``).

The rivals, each a plan scored by the simulator and then measured on the capped GPU:

* all on the GPU and all on the host (node order);
* accelerate's ``infer_auto_device_map`` at ``max_memory`` = the cap, and at
  fractions of it (what a user lowers it to so that gradients, Adam and
  activations fit beside the weights), applied as a placement;
* every other heuristic, the searches allowed onto the host (:data:`HEURISTIC_OPTIONS`);
* placer's plan from the simulator (:func:`train_on_simulator`) and after fine-tuning
  on measured rewards (:mod:`bench.measured_rl`); FSDP2's offload is :mod:`bench.fsdp2`.

>>> s = SCENARIOS["tiny"]
>>> c = scenario_cluster(s)
>>> c.device_names, int(c.memory_bytes[1]) == s.gpu_cap_bytes
(['cpu:0', 'gpu:0'], True)
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, NamedTuple

import numpy as np

import envs
from envs.cluster import Cluster, Device
from envs.machines import GIB, PCIE5
from graphs import OpGraph, PlacerError
from graphs.plan import Placement
from placer.methods import registry
from placer.methods.registry import HeuristicUnavailable

MIB = 1 << 20


@dataclass(frozen=True)
class Scenario:
    """A Llama-style decoder LM, its batch, and the GPU it must be trained on."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    heads: int
    kv_heads: int
    batch: int
    seq: int
    gpu_cap_bytes: int
    """the GPU memory cap: the cluster file's gpu:0 memory, and the CUDA device's limit for real."""
    host_bytes: int
    description: str
    tied: bool = False
    """the head tied to the embedding (one tensor, read by both: ``tie_word_embeddings``), as Llama-3.2-1B ships."""
    trainable_layers: int = -1
    """fine-tuning: the embedding and every decoder layer but the last ``trainable_layers`` frozen
    (``requires_grad=False``; the final norm and the head train); -1: everything trains."""


#: ``llama-256k``: Llama-3.2-1B's layer shapes (hidden 2048, MLP 8192, 32 heads, 8 KV heads), 8 layers, Gemma's
#: 256k vocabulary, untied: 1.54 B parameters, of which the embedding and the head hold 1.05 B. Its fp32 training
#: state is 22.9 GiB at the end of the backward (the weights, Adam's two moments and every gradient; 22.9 GiB
#: simulated all on the GPU): 95 % of a 24 GiB cap, past the 0.9 headroom placer's searches keep, while its weights
#: alone (5.7 GiB) fit, so accelerate's map at max_memory = the cap puts it all there (on an H100 that ran out of
#: memory with Adam's default foreach step, whose temporaries the fused step does not make; with the fused step it
#: is yet to be measured). One step is 2 x 512 tokens: 2.1 TFLOP forward, ~6.3 TFLOP with backward, ~0.15 s of
#: fp32 matmul on an H100 (~45 of its 67 TFLOP/s without TF32) if all of it ran there. ``tiny``: the same shape of
#: problem for a CPU.
SCENARIOS: dict[str, Scenario] = {
    "llama-256k": Scenario(
        "llama-256k",
        256000,
        2048,
        8192,
        8,
        32,
        8,
        2,
        512,
        24 * GIB,
        100 * GIB,
        "Llama-style decoder, 8 layers of Llama-3.2-1B's shape, 256k vocabulary untied, batch 2 x 512",
    ),
    # ``llama-3b``: the same layers, 32 of them: 3.0 B parameters (the embedding and the head 1.05 B of them), 45 GiB
    # of fp32 training state; its weights alone (11 GiB) fit a 16 GiB cap, not an 8 GiB one.
    "llama-3b": Scenario(
        "llama-3b",
        256000,
        2048,
        8192,
        32,
        32,
        8,
        2,
        512,
        24 * GIB,
        100 * GIB,
        "Llama-style decoder, 32 layers of Llama-3.2-1B's shape, 256k vocabulary untied, batch 2 x 512",
    ),
    # ``llama-long``: where the activations, not the training state, fill the GPU. Llama-3.2-1B's layer shapes, 16 of
    # them, a 32k vocabulary (Llama-2's): 1.1 B parameters, 16.4 GiB of fp32 training state, and at batch 4 x 2048
    # tokens about 23 GiB of activations kept for the backward (40.8 GiB simulated all on the GPU). Added to show
    # activation checkpointing where users reach for it (BENCHMARKS.md, "Checkpoint moves").
    "llama-long": Scenario(
        "llama-long",
        32000,
        2048,
        8192,
        16,
        32,
        8,
        4,
        2048,
        24 * GIB,
        100 * GIB,
        "Llama-style decoder, 16 layers of Llama-3.2-1B's shape, 32k vocabulary untied, batch 4 x 2048",
    ),
    # ``llama-1b``: Llama-3.2-1B as it ships: 16 layers, its 128k vocabulary, the head tied to the embedding (one
    # 1 GiB tensor read by the first op and the last): 1.24 B parameters, 18.4 GiB of fp32 training state. Homing the
    # tied tensor needs a copy for each of its two readers, both on the GPU.
    "llama-1b": Scenario(
        "llama-1b",
        128256,
        2048,
        8192,
        16,
        32,
        8,
        2,
        512,
        24 * GIB,
        100 * GIB,
        "Llama-3.2-1B's shape as shipped: 16 layers, 128k vocabulary tied to the head, batch 2 x 512",
        tied=True,
    ),
    "tiny": Scenario(
        "tiny",
        8192,
        64,
        128,
        2,
        4,
        2,
        2,
        32,
        16 * MIB,  # all on the GPU: 17.5 MiB simulated, over; the weights 4.3 MiB
        8 * GIB,
        "the same shape on a CPU: 8k vocabulary untied, width 64, 2 layers, batch 2 x 32",
    ),
}

# ``llama-3b-ft``: llama-3b fine-tuned as people fine-tune what does not fit: the embedding and the first 28 of its
# 32 layers frozen, the last 4, the final norm and the head trained. 3.0 B parameters, 0.77 B of them trainable:
# 11.2 GiB of weights, 8.3 GiB of them frozen (no gradient, no Adam state). ``tiny-ft``: the same on a CPU.
SCENARIOS["llama-3b-ft"] = replace(
    SCENARIOS["llama-3b"],
    name="llama-3b-ft",
    description="llama-3b fine-tuned: its embedding and first 28 of 32 layers frozen, batch 2 x 512",
    trainable_layers=4,
)
SCENARIOS["tiny-ft"] = replace(
    SCENARIOS["tiny"],
    name="tiny-ft",
    description="tiny fine-tuned on a CPU: its embedding and first layer frozen",
    trainable_layers=1,
)


def check_scenario(name: str) -> Scenario:
    if name not in SCENARIOS:
        raise PlacerError(f"--scenario {name!r}: unknown (known: {', '.join(SCENARIOS)})")
    return SCENARIOS[name]


def build(scenario: Scenario, *, meta: bool = False) -> tuple[Any, tuple]:
    """``(model, (input_ids, labels))``: a seeded LlamaForCausalLM behind a loss wrapper (on the meta device if
    asked)."""
    import torch
    import transformers

    from graphs.models.corpus import LossOf

    transformers.logging.set_verbosity_error()
    s = scenario
    config = transformers.LlamaConfig(
        vocab_size=s.vocab_size,
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        max_position_embeddings=s.seq,
        tie_word_embeddings=s.tied,
    )
    torch.manual_seed(0)
    with torch.device("meta") if meta else torch.device("cpu"):
        model = LossOf(transformers.LlamaForCausalLM(config)).eval()  # Llama has no dropout: eval() changes nothing
    if s.trainable_layers >= 0:  # fine-tuning: the embedding and the first layers frozen
        llama = model.model.model
        llama.embed_tokens.requires_grad_(False)
        for layer in llama.layers[: s.num_layers - s.trainable_layers]:
            layer.requires_grad_(False)
    ids = torch.randint(0, s.vocab_size, (s.batch, s.seq), generator=torch.Generator().manual_seed(1))
    return model, (ids, ids.clone())


def tiny() -> tuple[Any, tuple]:
    """The tiny scenario's model and batch as a ``module:callable`` source (``placer place bench.offload:tiny``)."""
    return build(SCENARIOS["tiny"])


def builder(scenario: Scenario) -> Callable[[], tuple[Any, tuple]]:
    """The scenario's model as a ``module:callable``-like builder (what :class:`envs.real.local.LocalEnv` builds)."""
    fn = functools.partial(build, scenario)
    fn.__name__ = f"offload_{scenario.name}"  # type: ignore[attr-defined]
    return fn


def scenario_cluster(scenario: Scenario) -> Cluster:
    """``cpu:0`` (16 host cores) + ``gpu:0`` (an H100 capped at the scenario's memory), linked by PCIe 5.

    The GPU's rates are the ``h100x8`` preset's; the host's are that preset's
    56-core host scaled to the 16 cores of the lent machines (2e12 -> 0.6e12 FLOP/s,
    and ~1e11 B/s): estimates, not calibrated (``placer profile`` would calibrate them).
    """
    devices = [
        Device("cpu:0", "cpu", float(scenario.host_bytes), 0.6e12, 1e11, 5e-6),
        Device("gpu:0", "gpu", float(scenario.gpu_cap_bytes), 60e12, 2.85e12, 6e-6),
    ]
    links = {("cpu:0", "gpu:0"): PCIE5, ("gpu:0", "cpu:0"): PCIE5}
    return Cluster(
        name=f"offload-{scenario.name}",
        devices=devices,
        links=links,
        description=f"16 host cores + one H100 capped at {scenario.gpu_cap_bytes / GIB:g} GiB; {scenario.description}",
    )


# ------------------------------------------------------------------ plans
#: Options that let the searches use the host: by default they place on GPUs only, and on one GPU that is one plan.
HEURISTIC_OPTIONS: dict[str, dict[str, Any]] = {
    "single": {"cpu": True},
    "random_search": {"devices": "all"},
    "random_modules": {"devices": "all"},
    "module_search": {"devices": "all"},
    "annealing": {"devices": "all"},
}
#: accelerate's max_memory as fractions of the cap: the cap itself, then what a user lowers it to for training.
ACCELERATE_FRACTIONS = (1.0, 0.5, 0.25, 0.2, 0.125)
#: Heuristics not run here: the CP-SAT ilp (a minute of solver per run), and accelerate's maps (their own rows).
SKIPPED = ("ilp", "accelerate", "accelerate_low_0", "accelerate_sequential")


class Plan(NamedTuple):
    """One rival's plan and what the simulator says of it (``placement`` None: the method could not place)."""

    label: str
    kind: str  # "single", "accelerate", "heuristic", "placer"
    placement: Placement | None
    sim: dict[str, Any]


def simulated(graph: OpGraph, cluster: Cluster, placement: Placement | None, message: str = "") -> dict[str, Any]:
    """The simulator's status, step time and peak bytes per device of a placement in its own issue order."""
    if placement is None:
        return {"status": "no plan", "message": message}
    r = envs.SimEnv(graph, cluster).simulate(placement)
    return {
        "status": r.status,
        "step_time_s": r.step_time_s if r.ok else r.extra.get("sim_step_time_s"),
        "peak_bytes": {k: int(v) for k, v in r.peak_bytes.items()},
        "message": r.message,
    }


def node_order_if_same(placement: Placement, graph: OpGraph) -> Placement:
    """The placement without its order when that order is node order, so both are measured once (one key)."""
    order = placement.issue_order(graph)
    if order is not None and np.array_equal(order, np.arange(graph.num_ops)):
        return Placement.from_indices(
            graph,
            placement.devices,
            placement.indices(graph),
            cluster=placement.cluster,
            method=placement.method,
            meta=placement.meta,
        )
    return placement


def single_plans(graph: OpGraph, cluster: Cluster) -> list[Plan]:
    out = []
    for d, name in enumerate(cluster.device_names):
        p = Placement.from_indices(
            graph, cluster.device_names, np.full(graph.num_ops, d), cluster=cluster.name, method="single"
        )
        out.append(Plan(f"all on {name}", "single", p, simulated(graph, cluster, p)))
    return out


def accelerate_plans(
    graph: OpGraph, cluster: Cluster, model: Any, fractions: tuple[float, ...] = ACCELERATE_FRACTIONS
) -> list[Plan]:
    """accelerate's map (``device_map="auto"``) at ``max_memory`` = each fraction of the cap, as placements."""
    out = []
    for f in fractions:
        label = "accelerate, max_memory = the cap" if f == 1 else f"accelerate, max_memory = {f:g} x the cap"
        p, message = _placed("accelerate", graph, cluster, model=model, max_memory=f)
        out.append(Plan(label, "accelerate", p, simulated(graph, cluster, p, message)))
    return out


def heuristic_plans(graph: OpGraph, cluster: Cluster, *, seed: int = 0, skip: tuple[str, ...] = SKIPPED) -> list[Plan]:
    """Every other heuristic's plan with its planned issue order (as ``placer place`` writes it), searches on the host
    too."""
    out = []
    for name in registry.names():
        if name in skip:
            continue
        opts = HEURISTIC_OPTIONS.get(name, {})
        p, message = _placed(name, graph, cluster, seed=seed, **opts)
        label = name + "".join(f", {k}={v}" for k, v in opts.items())
        out.append(Plan(label, "heuristic", p, simulated(graph, cluster, p, message)))
    return out


def _placed(name: str, graph: OpGraph, cluster: Cluster, **options: Any) -> tuple[Placement | None, str]:
    try:
        return node_order_if_same(registry.place(name, graph, cluster, **options), graph), ""
    except HeuristicUnavailable as e:
        return None, f"{e.status}: {e}"
    except PlacerError as e:
        return None, str(e)


def train_on_simulator(
    graph: OpGraph,
    cluster: Cluster,
    cluster_path: str,
    logdir: str,
    *,
    time_budget_s: float,
    samples: int,
    seed: int = 0,
) -> Plan:
    """placer's plan from the simulator: ``placer.train`` on the scenario's cluster file, ``--env sim``."""
    from placer.learn.config import TrainConfig
    from placer.learn.loop import train

    config = TrainConfig(
        source=graph.name,
        cluster=cluster_path,
        env="sim",
        time_budget_s=time_budget_s,
        samples=samples,
        seed=seed,
        logdir=logdir,
        progress=False,
    )
    t0 = time.perf_counter()
    result = train(config, graph=graph, cluster=cluster)
    p = result.best_placement
    if p is not None:
        p.meta["train_s"] = time.perf_counter() - t0
        p = node_order_if_same(p, graph)
    return Plan("placer, trained on the simulator", "placer", p, simulated(graph, cluster, p, "no placement ran"))


def plan_doc(plan: Plan) -> dict[str, Any]:
    return {
        "label": plan.label,
        "kind": plan.kind,
        "sim": plan.sim,
        "placement": plan.placement.to_dict() if plan.placement is not None else None,
    }


def plan_from_doc(doc: dict[str, Any]) -> Plan:
    p = Placement.from_dict(doc["placement"], source=f"plan {doc['label']}") if doc.get("placement") else None
    return Plan(doc["label"], doc["kind"], p, doc["sim"])


def host_ops(plan: Plan, graph: OpGraph) -> int | None:
    return None if plan.placement is None else int(np.sum(plan.placement.indices(graph) == 0))


def sim_fits(plan: Plan) -> bool:
    return plan.placement is not None and plan.sim.get("status") == "ok"


def leading(plan: Plan) -> bool:
    """Whether a plan is among those measured first: placer's, all on the GPU, accelerate's."""
    return plan.kind in ("placer", "accelerate") or plan.label == "all on gpu:0"


def measure_order(plans: list[Plan]) -> list[Plan]:
    """The order plans are measured in under a deadline: the :func:`leading` ones (placer's, all on the GPU,
    accelerate's in the order given), all on the host (the reward scale of the measured fine-tuning), then the other
    heuristics, fitting ones first, by simulated step time; plans without a placement last (nothing to measure)."""
    rank = {"placer": 0, "single": 1, "accelerate": 2}

    def key(p: Plan) -> tuple:
        t = p.sim.get("step_time_s") or float("inf")
        if leading(p):
            return (p.placement is None, 0, rank[p.kind], 0.0)
        return (p.placement is None, 1, p.label != "all on cpu:0", not sim_fits(p), t)

    return sorted(plans, key=key)


__all__ = [
    "ACCELERATE_FRACTIONS",
    "HEURISTIC_OPTIONS",
    "Plan",
    "SCENARIOS",
    "Scenario",
    "accelerate_plans",
    "build",
    "builder",
    "check_scenario",
    "heuristic_plans",
    "leading",
    "measure_order",
    "plan_doc",
    "plan_from_doc",
    "scenario_cluster",
    "simulated",
    "single_plans",
    "train_on_simulator",
]

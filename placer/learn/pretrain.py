"""Pretrain one graph-network policy (:mod:`policies.gnn`) over a corpus of graphs and clusters.

The corpus is :func:`placer.learn.pretrain_corpus.build_corpus`'s. Training (:func:`pretrain`):
per (graph, cluster) the label is the best of a set of fast heuristics
(:func:`imitation_label`, cached on disk by graph hash and cluster). A share of
the time budget (``imitation_share``) fits the labels (mean per-op cross-entropy
over a minibatch of pairs); the rest is REINFORCE on the simulator
(:class:`envs.SimEnv`) with the trainer's reward ``-sqrt(step_time / best
single-device time)`` and its advantages (:mod:`placer.learn.algos`: a
leave-one-out reward baseline over K samples), and the imitation loss kept as a
regulariser (weight ``imitation_weight``) so the policy does not forget the
labels of pairs it is not currently sampling. The learning algorithm's options
are :class:`placer.learn.config.AlgoOptions` (``PretrainConfig.algo``), as in
``placer train``.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

import envs
import placer.compare
from envs.sim import memory, simulator
from envs.sim.cost import op_times
from envs.sim.sim_graph import schedule_graph
from graphs import OpGraph, PlacerError, plan, zoo
from graphs.dag import top_level
from graphs.io import read_json, write_text_atomic
from placer.learn.algos import advantages, reward
from placer.learn.config import INIT_WARM_START_LR, AlgoOptions
from placer.learn.pretrain_corpus import build_corpus
from placer.methods import registry
from policies.gnn import GNNNet, GNNPolicy, feature_spec
from policies.views import group_views

#: Heuristics whose best placement is the imitation label (the fast ones; see `placer compare`).
LABEL_METHODS = ("single", "expert", "scotch", "heft", "m_topo", "m_etf", "m_sct")


def imitation_label(
    graph: OpGraph, cluster: Any, methods: tuple[str, ...] = LABEL_METHODS
) -> tuple[str, float, np.ndarray]:
    """(method, step time, op devices) of the best heuristic (:meth:`placer.compare.CompareReport.best`), the label.

    Cached on disk by graph hash, cluster, and the simulator's and the heuristics'
    versions (the step's and the memory rules'; read when called: a change to any makes new labels).
    """
    key = hashlib.sha256(
        json.dumps(
            [
                graph.content_hash,
                cluster.to_dict(),
                list(methods),
                simulator.MODEL_VERSION,
                memory.MEMORY_VERSION,
                registry.VERSION,
            ],
            sort_keys=True,
        ).encode()
    ).hexdigest()[:20]
    path = zoo.cache_dir() / "labels" / f"{key}.json"
    if path.exists():
        try:
            doc = read_json(path)
            op_devices = np.asarray(doc["devices"], dtype=np.int32)
            if len(op_devices) == graph.num_ops:
                return doc["method"], float(doc["step_time_s"]), op_devices
        except (PlacerError, KeyError, TypeError, ValueError):
            pass
    best = placer.compare.compare(graph, cluster, methods=list(methods)).best()
    if best is None:  # nothing fits: no label (memory ignored is not one)
        raise PlacerError(f"{graph.name} on {cluster.name}: no heuristic placement runs (all out of memory)")
    op_devices = best.placement.indices(graph, cluster.device_names)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(
        path, json.dumps({"method": best.method, "step_time_s": best.step_time_s, "devices": op_devices.tolist()})
    )
    return best.method, float(best.step_time_s), op_devices


def canonical_label(graph: OpGraph, cluster: Any, op_devices: np.ndarray, env: Any = None) -> np.ndarray:
    """``op_devices`` with interchangeable devices renumbered by where their ops start on the critical path.

    A heuristic that spreads a graph over 4 identical GPUs may use them in any
    order (m_sct's late ops on gpu:0, another graph's on gpu:3): as imitation
    targets, those labels contradict each other, and a policy that cannot tell
    identical GPUs apart except by their rank learns to put everything on one. So
    among devices of one class (same kind, compute rate, memory bandwidth, memory
    and launch overhead), the used ones are renumbered in the order of the
    compute-weighted mean critical-path start of their ops (the earliest ops go to
    the lowest-ranked device, the policy's ``rank`` feature), unused ones last.
    The renumbering is kept only if the simulator (``env``, default a new
    ``SimEnv``) times it exactly as the original: links between "identical"
    devices may differ (a K80's two GPUs share a board).
    """
    op_devices = np.asarray(op_devices, dtype=np.int32)
    fwd, bwd = op_times(graph, cluster)
    tmin = (fwd + bwd).min(axis=1)
    top = top_level(graph, tmin)
    weight = tmin + 1e-12
    classes: dict[tuple, list[int]] = {}
    for d, dev in enumerate(cluster.devices):
        key = (dev.kind, dev.flops_per_s, dev.mem_bw_bytes_per_s, dev.memory_bytes, dev.launch_overhead_s)
        classes.setdefault(key, []).append(d)
    mapping = np.arange(cluster.num_devices, dtype=np.int32)
    for members in classes.values():
        if len(members) < 2:
            continue
        used = [d for d in members if (op_devices == d).any()]
        start = {d: float(np.average(top[op_devices == d], weights=weight[op_devices == d])) for d in used}
        ranked = sorted(used, key=lambda d: (start[d], d)) + [d for d in members if d not in start]
        for new, old in zip(members, ranked):
            mapping[old] = new
    renumbered = mapping[op_devices]
    if np.array_equal(renumbered, op_devices):
        return op_devices
    env = env if env is not None else envs.SimEnv(graph, cluster)
    step_time_s, failed = env.step_times(np.stack([op_devices, renumbered]))
    same = failed[0] == failed[1] and (failed[0] or np.isclose(step_time_s[1], step_time_s[0], rtol=1e-9, atol=0.0))
    return renumbered if same else op_devices


def pretrain_algo_options(**options: Any) -> AlgoOptions:
    """``placer train``'s algorithm options with pretraining's imitation rate (:data:`INIT_WARM_START_LR`): its
    ``samples``, ``lr`` (the RL rate), ``entropy_coef``, reward baseline and advantages, and ``warm_start_lr`` (the
    imitation rate); ``options`` on top."""
    return AlgoOptions(**{"warm_start_lr": INIT_WARM_START_LR, **options})


@dataclass
class PretrainConfig:
    """Everything a pretraining run depends on; the learning algorithm's options are ``placer train``'s (``algo``)."""

    corpus: str = "zoo,synthetic,library"
    """a directory of graph files, or a comma list of zoo, synthetic, library and zoo names (:func:`build_corpus`)."""
    clusters: tuple[str, ...] = ("k80x4", "v100x4", "h100x8")
    """the clusters every graph is placed on (presets or files)."""
    exclude: tuple[str, ...] = ()
    """families (lstm, cnn, transformer, recurrent) or corpus items held out."""
    synthetic_sizes: tuple[int, ...] = (300, 1500, 5000)
    """op counts of the synthetic graphs."""
    groups: tuple[int | str, ...] = (0,)
    """item granularities: 0 places the ops; N places the graph coarsened to N groups; "modules" places the graph
    grouped by module, one pair per distinct depth (:func:`policies.views.group_views`). Groups are cut where the label
    changes device, so it stays exact (each (graph, cluster) becomes one pair per view)."""
    time_budget_s: float = 600.0
    """seconds of training once the corpus and its labels are set up."""
    seed: int = 0
    """seed of the network's initialisation, the sampling and the synthetic graphs."""
    hidden: int = 64
    """the network's (:class:`policies.gnn.GNNNet`) width."""
    rounds: int = 3
    """the network's message-passing rounds."""
    logit_cap: float = 10.0
    """the cap of the network's logits."""
    decoder: str = "schedule"
    """the network's decoder: "schedule" (ops decided along a list schedule) or "independent"."""
    dagger: float = 0.5
    """share of the imitation steps that follow the policy's own samples (DAgger)."""
    switch_share: float = 0.0
    """share of each imitation loss on the label's switches (``policies.gnn.switch_weights``); 0: a plain mean"""
    batch: int = 4
    """(graph, cluster) pairs per imitation step."""
    imitation_share: float = 0.6
    """share of the time budget spent imitating the labels, before RL."""
    imitation_weight: float = 0.2
    """weight of the imitation loss kept during RL."""
    algo: AlgoOptions = field(default_factory=pretrain_algo_options)
    """the learning algorithm: ``samples`` K per RL step, ``lr`` (RL), ``warm_start_lr`` (imitation), ``entropy_coef``,
    ``grad_clip``, ``fail_factor`` and the reward baseline and advantages of ``placer train``."""
    progress: Callable[[str], None] | None = None


@dataclass
class Pair:
    name: str
    cluster: str
    policy: Any
    env: Any
    t_ref: float
    label: np.ndarray
    label_method: str
    label_s: float


@dataclass
class PretrainResult:
    net: Any
    sidecar: dict[str, Any]
    pairs: list[dict[str, Any]] = field(default_factory=list)


def setup_pairs(config: PretrainConfig, net: Any, say: Callable[[str], None]) -> tuple[list[Pair], list[str]]:
    items = build_corpus(
        config.corpus, exclude=set(config.exclude), synthetic_sizes=config.synthetic_sizes, seed=config.seed
    )
    clusters = [envs.resolve_cluster(c) for c in config.clusters]
    pairs: list[Pair] = []
    skipped: list[str] = []
    for it in items:
        g = it.load()
        sg = schedule_graph(g)  # what every policy reads; built once for all clusters and views
        for c in clusters:
            try:
                method, t_best, label = imitation_label(g, c)
            except PlacerError as e:
                skipped.append(f"{it.name}@{c.name}: {e}")
                continue
            env = envs.SimEnv(g, c)
            label = canonical_label(g, c, label, env)
            single_t, _ = env.step_times(plan.single_device_rows(c.num_devices, g.num_ops))
            for view, kwargs in group_views(sg, config.groups):
                policy = GNNPolicy(sg, c.num_devices, cluster=c, net=net, refine=label, **kwargs)
                name = it.name if view == "ops" else f"{it.name}/{view.replace('modules depth ', 'm')}"
                pairs.append(Pair(name, c.name, policy, env, float(np.min(single_t)), label, method, t_best))
        say(f"corpus: {it.name} ({g.num_ops} ops) on {', '.join(c.name for c in clusters)}")
    if not pairs:
        raise PlacerError("pretrain: no (graph, cluster) pair has a heuristic placement that runs")
    return pairs, skipped


@dataclass
class PretrainRun:
    """What both phases of a pretraining run on: its config and pairs, one optimiser step on a loss (``step``), the
    generators of its choices (``rng``) and of the policy's samples (``gen``), and its progress lines (``say``)."""

    config: PretrainConfig
    pairs: list[Pair]
    step: Callable[[Any], None]
    rng: np.random.Generator
    gen: torch.Generator
    say: Callable[[str], None]


def _imitate(run: PretrainRun, end: float) -> int:
    """Fit the labels of minibatches of pairs until ``end`` (a ``perf_counter`` value); returns the steps taken."""
    config, pairs, step, rng, gen, say = run.config, run.pairs, run.step, run.rng, run.gen, run.say
    steps = 0
    while time.perf_counter() < end:
        batch = rng.choice(len(pairs), size=min(config.batch, len(pairs)), replace=False)
        loss = 0.0
        for i in batch:
            p = pairs[i]
            # DAgger: part of the steps imitate the label from the states the policy's own samples reach
            own = p.policy.sequential and rng.random() < config.dagger
            loss = loss + p.policy.imitation_loss(
                p.label,
                along=p.policy.sample(2, generator=gen).op_devices if own else None,
                switch_share=config.switch_share,
            )
        loss = loss / len(batch)
        step(loss)
        steps += 1
        if steps % 20 == 0:
            say(f"imitation step {steps}: loss {float(loss.detach()):.4f}")
    return steps


def _reinforce(run: PretrainRun, end: float) -> int:
    """REINFORCE on a random pair at a time until ``end``, the imitation loss kept as a regulariser; returns the
    steps."""
    config, pairs, step, rng, gen, say = run.config, run.pairs, run.step, run.rng, run.gen, run.say
    a = config.algo
    steps = 0
    while time.perf_counter() < end:
        p = pairs[int(rng.integers(len(pairs)))]
        s = p.policy.sample(a.samples, generator=gen)
        step_time_s, failed = p.env.step_times(s.op_devices)
        # the training reward and advantages of placer train (leave-one-out reward baseline, normalised)
        adv = advantages(reward(step_time_s, failed, p.t_ref, fail_factor=a.fail_factor), failed, None, a).advantages
        adv_t = torch.as_tensor(adv, dtype=torch.float32)
        loss = -(adv_t * s.log_prob).mean() / p.policy.num_items - a.entropy_coef * s.entropy.mean()
        if config.imitation_weight > 0:
            loss = loss + config.imitation_weight * p.policy.imitation_loss(p.label, switch_share=config.switch_share)
        step(loss)
        steps += 1
        if steps % 20 == 0:
            say(
                f"rl step {steps}: {p.name}@{p.cluster} best sample "
                f"{np.min(np.where(failed, np.inf, step_time_s)) / p.label_s:.3f}x the label"
            )
    return steps


def _sidecar(
    config: PretrainConfig, pairs: list[Pair], steps: dict[str, int], setup_s: float, skipped: list[str]
) -> dict[str, Any]:
    """The policy file's JSON sidecar: architecture, features, corpus, and how it was trained."""
    return {
        "architecture": {
            "hidden": config.hidden,
            "rounds": config.rounds,
            "logit_cap": float(config.logit_cap),
            "decoder": config.decoder,
        },
        "features": feature_spec(),
        "clusters": list(config.clusters),
        "corpus": sorted({p.name.split("/")[0] for p in pairs}),
        "corpus_spec": config.corpus,
        "excluded": list(config.exclude),
        "seed": config.seed,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "training": {
            "time_budget_s": config.time_budget_s,
            "setup_s": round(setup_s, 1),
            "steps": steps,
            "samples": config.algo.samples,
            "lr": config.algo.warm_start_lr,
            "rl_lr": config.algo.lr,
            "imitation_share": config.imitation_share,
            "dagger": config.dagger,
            "switch_share": config.switch_share,
            "label_methods": list(LABEL_METHODS),
            "synthetic_sizes": list(config.synthetic_sizes),
            "groups": list(config.groups),
            "skipped": skipped,
        },
    }


def pretrain(config: PretrainConfig) -> PretrainResult:
    """Imitation of the best heuristic per (graph, cluster), then REINFORCE on the simulator."""
    say = config.progress or (lambda s: None)
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    gen = torch.Generator().manual_seed(config.seed)
    net = GNNNet(hidden=config.hidden, rounds=config.rounds, logit_cap=config.logit_cap, decoder=config.decoder)
    t0 = time.perf_counter()
    pairs, skipped = setup_pairs(config, net, say)
    setup_s = time.perf_counter() - t0
    budget_end = time.perf_counter() + config.time_budget_s  # the budget is training time: labels are cached on disk
    imitation_end = time.perf_counter() + config.imitation_share * max(budget_end - time.perf_counter(), 0.0)
    opt = torch.optim.Adam(net.parameters(), lr=config.algo.warm_start_lr)

    def step(loss: Any) -> None:
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), config.algo.grad_clip)
        opt.step()

    run = PretrainRun(config, pairs, step, rng, gen, say)
    steps = {"imitation": _imitate(run, imitation_end)}
    for group in opt.param_groups:
        group["lr"] = config.algo.lr
    steps["rl"] = _reinforce(run, budget_end)
    rows = []
    for p in pairs:
        g_t, g_failed = p.env.step_times(p.policy.greedy()[None])
        rows.append(
            {
                "graph": p.name,
                "cluster": p.cluster,
                "label": p.label_method,
                "label_step_time_s": p.label_s,
                "greedy_step_time_s": None if g_failed[0] else float(g_t[0]),
            }
        )
    return PretrainResult(net, _sidecar(config, pairs, steps, setup_s, skipped), rows)

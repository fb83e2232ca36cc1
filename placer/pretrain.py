"""Pretrain one graph-network policy (:mod:`policies.gnn`) over a corpus of graphs and clusters.

The corpus (:func:`build_corpus`) mixes three sources, each item tagged with
its families so whole families can be held out (``exclude``):

* ``zoo``: the six zoo models (tags: ``lstm`` for rnnlm/nmt-*, ``cnn`` for
  inception-v3/resnet50, ``transformer`` for gpt2);
* ``synthetic``: the structured families of :mod:`graphs.synthetic`
  (chain, branches, unet, moe, attention, recurrent) at several sizes
  (``synthetic_sizes``); unet and branches are tagged ``cnn``, moe and attention
  ``transformer``, recurrent (stacked recurrent layers sharing their weights over
  time steps: the LSTM's grid, without its name) ``recurrent``, so that
  ``exclude={"lstm"}`` keeps it and ``{"lstm", "recurrent"}`` holds out both;
* ``library``: graphs of torch.nn layers every torch install has
  (TransformerEncoderLayer stack ``transformer``, LSTM ``lstm``, a Conv2d stack ``cnn``),
  captured once on the meta device and cached;
* or a directory of graph files (``.json``/``.json.gz``).

Training (:func:`pretrain`): per (graph, cluster) the label is the best of a set of
fast heuristics (cached on disk by graph hash and cluster). A share of the time
budget (``imitation_share``) fits the labels (mean per-op cross-entropy over a
minibatch of pairs); the rest is REINFORCE on the simulator (:class:`envs.SimEnv`)
with the trainer's reward ``-sqrt(step_time / best single-device time)``, a
leave-one-out baseline over K samples, and the imitation loss kept as a
regulariser (weight ``imitation_weight``) so the policy does not forget the
labels of pairs it is not currently sampling.
"""

from __future__ import annotations

import datetime
import hashlib
import itertools
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from graphs import OpGraph, PlacerError, plan

#: Heuristics whose best placement is the imitation label (the fast ones; see `placer compare`).
LABEL_METHODS = ("single", "expert", "scotch", "heft", "m_topo", "m_etf", "m_sct")
ZOO_TAGS = {"rnnlm": {"lstm"}, "nmt-2": {"lstm"}, "nmt-4": {"lstm"}, "inception-v3": {"cnn"}, "resnet50": {"cnn"},
            "gpt2": {"transformer"}}
FAMILY_TAGS = {"chain": set(), "branches": {"cnn"}, "unet": {"cnn"}, "moe": {"transformer"}, "attention": {"transformer"},
               "recurrent": {"recurrent"}}
LIBRARY = {"transformer-layers": {"transformer"}, "lstm-layers": {"lstm"}, "conv-stack": {"cnn"}}
SOURCES = ("zoo", "synthetic", "library")


@dataclass
class CorpusItem:
    name: str
    source: str  # zoo | synthetic | library | dir
    tags: set[str]
    load: Callable[[], OpGraph]


# ------------------------------------------------------------------ corpus
def _library_module(name: str) -> tuple[Any, tuple]:
    import torch
    from torch import nn

    class Loss(nn.Module):
        def __init__(self, body: nn.Module, out: int) -> None:
            super().__init__()
            self.body, self.head = body, nn.Linear(out, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.body(x)
            y = y[0] if isinstance(y, tuple) else y
            return self.head(y.flatten(1) if y.dim() > 3 else y).float().square().mean()

    if name == "transformer-layers":
        layer = nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True)
        return Loss(nn.TransformerEncoder(layer, 12, enable_nested_tensor=False), 1024), (torch.empty(16, 512, 1024, device="meta"),)
    if name == "lstm-layers":
        return Loss(nn.LSTM(1024, 1024, num_layers=4, batch_first=True), 1024), (torch.empty(64, 40, 1024, device="meta"),)
    if name == "conv-stack":
        layers: list[nn.Module] = []
        ch = 3
        for out in (64, 64, 128, 128, 256, 256, 512, 512):
            layers += [nn.Conv2d(ch, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU()]
            ch = out
        return Loss(nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1)), 512), (torch.empty(32, 3, 128, 128, device="meta"),)
    raise PlacerError(f"unknown library graph {name!r}")


def library_graph(name: str) -> OpGraph:
    """The captured graph of library layers ``name`` (cached under the zoo cache directory)."""
    import torch

    from graphs import io, zoo
    from graphs.torch_capture import capture

    path = zoo.cache_dir() / "library" / f"{name}-torch{torch.__version__.replace('+', '_')}.json.gz"
    if path.exists():
        try:
            return io.load(path)
        except PlacerError:
            pass
    model, inputs = _library_module(name)
    with torch.device("meta"):
        model = model.to("meta")
    g = capture(model, inputs, name=name)
    path.parent.mkdir(parents=True, exist_ok=True)
    io.save(g, path)
    return g


def build_corpus(corpus: str, *, exclude: set[str] = frozenset(), synthetic_sizes: tuple[int, ...] = (300, 1500, 5000),
                 seed: int = 0) -> list[CorpusItem]:
    """Corpus items for ``corpus`` (a directory, or a comma list of zoo/synthetic/library and zoo names).

    ``exclude``: tags (lstm, cnn, transformer, recurrent) or item names to leave out.
    """
    from graphs import io, zoo
    from graphs.synthetic import FAMILIES

    items: list[CorpusItem] = []
    if os.path.isdir(corpus):
        files = sorted(f for f in os.listdir(corpus) if f.endswith((".json", ".json.gz")))
        if not files:
            raise PlacerError(f"--corpus {corpus}: no graph files (.json, .json.gz) in the directory")
        for f in files:
            path = os.path.join(corpus, f)
            items.append(CorpusItem(f, "dir", set(), lambda p=path: io.load(p)))
    else:
        for part in [p.strip() for p in corpus.split(",") if p.strip()]:
            if part == "zoo":
                items += [CorpusItem(n, "zoo", ZOO_TAGS.get(n, set()), lambda n=n: zoo.graph(n)) for n in zoo.names()]
            elif part in zoo.names():
                items.append(CorpusItem(part, "zoo", ZOO_TAGS.get(part, set()), lambda n=part: zoo.graph(n)))
            elif part == "synthetic":
                for k, (fam, fn) in enumerate(FAMILIES.items()):
                    for j, size in enumerate(synthetic_sizes):
                        s = seed * 1000 + 10 * k + j
                        items.append(CorpusItem(f"{fam}-{size}-s{s}", "synthetic", FAMILY_TAGS[fam],
                                                lambda fn=fn, size=size, s=s: fn(size, seed=s)))
            elif part == "library":
                items += [CorpusItem(n, "library", tags, lambda n=n: library_graph(n)) for n, tags in LIBRARY.items()]
            else:
                raise PlacerError(f"--corpus {corpus!r}: {part!r} is not a directory, zoo, synthetic, library or a zoo name")
    families = set().union(*ZOO_TAGS.values(), *FAMILY_TAGS.values(), *LIBRARY.values())
    unknown = sorted(set(exclude) - families - {it.name for it in items})
    if unknown:
        raise PlacerError(f"--exclude {','.join(unknown)}: not a family ({', '.join(sorted(families))}) nor an item of --corpus {corpus}")
    kept = [it for it in items if not (it.tags & set(exclude)) and it.name not in exclude]
    if not kept:
        raise PlacerError(f"--corpus {corpus}: nothing left after --exclude {','.join(sorted(exclude))}")
    return kept


# ------------------------------------------------------------------ labels
def best_heuristic(graph: OpGraph, cluster: Any, methods: tuple[str, ...] = LABEL_METHODS) -> tuple[str, float, np.ndarray]:
    """(method, step time, op devices) of the best heuristic, cached on disk by graph hash, cluster, and simulator and baseline versions."""
    from graphs import zoo
    from graphs.io import read_json, write_text_atomic
    from envs.sim.simulator import MODEL_VERSION
    from placer.compare import compare

    from placer.methods.registry import VERSION as BASELINES_VERSION

    key = hashlib.sha256(json.dumps([graph.content_hash, cluster.to_dict(), list(methods), MODEL_VERSION, BASELINES_VERSION],
                                    sort_keys=True).encode()).hexdigest()[:20]
    path = zoo.cache_dir() / "labels" / f"{key}.json"
    if path.exists():
        try:
            doc = read_json(path)
            idx = np.asarray(doc["devices"], dtype=np.int32)
            if len(idx) == graph.num_ops:
                return doc["method"], float(doc["step_time_s"]), idx
        except (PlacerError, KeyError, TypeError, ValueError):
            pass
    best = compare(graph, cluster, methods=list(methods)).best()
    if best is None:  # nothing fits: no label (memory ignored is not one)
        raise PlacerError(f"{graph.name} on {cluster.name}: no heuristic placement runs (all out of memory)")
    idx = best.placement.indices(graph, cluster.device_names)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps({"method": best.method, "step_time_s": best.step_time_s, "devices": idx.tolist()}))
    return best.method, float(best.step_time_s), idx


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
    import envs
    from envs.cost import op_times
    from graphs.dag import top_level

    idx = np.asarray(op_devices, dtype=np.int32)
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
        used = [d for d in members if (idx == d).any()]
        start = {d: float(np.average(top[idx == d], weights=weight[idx == d])) for d in used}
        ranked = sorted(used, key=lambda d: (start[d], d)) + [d for d in members if d not in start]
        for new, old in zip(members, ranked):
            mapping[old] = new
    out = mapping[idx]
    if np.array_equal(out, idx):
        return idx
    env = env if env is not None else envs.SimEnv(graph, cluster)
    t, failed = env.step_times(np.stack([idx, out]))
    same = failed[0] == failed[1] and (failed[0] or np.isclose(t[1], t[0], rtol=1e-9, atol=0.0))
    return out if same else idx


# ------------------------------------------------------------------ training
@dataclass
class PretrainConfig:
    corpus: str = "zoo,synthetic,library"
    clusters: tuple[str, ...] = ("k80x4", "v100x4", "h100x8")
    exclude: tuple[str, ...] = ()
    time_budget_s: float = 600.0
    seed: int = 0
    hidden: int = 64
    rounds: int = 3
    logit_cap: float = 10.0
    decoder: str = "schedule"
    dagger: float = 0.5
    switch_share: float = 0.0
    """share of each imitation loss on the label's switches (``policies.gnn.switch_weights``); 0: a plain mean"""
    samples: int = 8
    batch: int = 4
    lr: float = 3e-3
    rl_lr: float = 5e-4
    imitation_share: float = 0.6
    imitation_weight: float = 0.2
    entropy_coef: float = 1e-3
    synthetic_sizes: tuple[int, ...] = (300, 1500, 5000)
    groups: tuple[int | str, ...] = (0,)
    """item granularities: 0 places the ops; N places the graph coarsened to N groups; "modules" places the graph
    grouped by module, one pair per distinct depth (:func:`group_views`). Groups are cut where the label changes
    device, so it stays exact (each (graph, cluster) becomes one pair per view)."""
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


def _setup_pairs(config: PretrainConfig, net: Any, say: Callable[[str], None]) -> tuple[list[Pair], list[str]]:
    import envs
    from envs.sim.simulator import schedule_graph
    from policies.gnn import GNNPolicy

    items = build_corpus(config.corpus, exclude=set(config.exclude), synthetic_sizes=config.synthetic_sizes, seed=config.seed)
    clusters = [envs.resolve_cluster(c) for c in config.clusters]
    pairs: list[Pair] = []
    skipped: list[str] = []
    for it in items:
        g = it.load()
        sg = schedule_graph(g)  # what every policy reads; built once for all clusters and views
        for c in clusters:
            try:
                method, t_best, label = best_heuristic(g, c)
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


def pretrain(config: PretrainConfig) -> PretrainResult:
    """Imitation of the best heuristic per (graph, cluster), then REINFORCE on the simulator."""
    import torch

    from policies.gnn import GNNNet, feature_spec

    say = config.progress or (lambda s: None)
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    gen = torch.Generator().manual_seed(config.seed)
    net = GNNNet(hidden=config.hidden, rounds=config.rounds, logit_cap=config.logit_cap, decoder=config.decoder)
    t0 = time.perf_counter()
    pairs, skipped = _setup_pairs(config, net, say)
    setup_s = time.perf_counter() - t0
    budget_end = time.perf_counter() + config.time_budget_s  # the budget is training time: labels are cached on disk
    imitation_end = time.perf_counter() + config.imitation_share * max(budget_end - time.perf_counter(), 0.0)

    from placer.rl_algos import advantages, reward
    from placer.train_config import AlgoOptions

    rl_options = AlgoOptions()  # placer train's defaults: leave-one-out baseline, normalised advantages
    opt = torch.optim.Adam(net.parameters(), lr=config.lr)
    steps = {"imitation": 0, "rl": 0}

    def step(loss: Any) -> None:
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()

    while time.perf_counter() < imitation_end:
        batch = rng.choice(len(pairs), size=min(config.batch, len(pairs)), replace=False)
        loss = 0.0
        for i in batch:
            p = pairs[i]
            # DAgger: part of the steps imitate the label from the states the policy's own samples reach
            own = p.policy.sequential and rng.random() < config.dagger
            loss = loss + p.policy.imitation_loss(p.label, along=p.policy.sample(2, generator=gen).op_devices if own else None,
                                                  switch_share=config.switch_share)
        loss = loss / len(batch)
        step(loss)
        steps["imitation"] += 1
        if steps["imitation"] % 20 == 0:
            say(f"imitation step {steps['imitation']}: loss {float(loss.detach()):.4f}")
    for group in opt.param_groups:
        group["lr"] = config.rl_lr
    while time.perf_counter() < budget_end:
        p = pairs[int(rng.integers(len(pairs)))]
        s = p.policy.sample(config.samples, generator=gen)
        t, failed = p.env.step_times(s.op_devices)
        # the training reward and advantages of placer train (leave-one-out, normalised)
        adv = advantages(reward(t, failed, p.t_ref, fail_factor=10.0), failed, None, rl_options).advantages
        adv_t = torch.as_tensor(adv, dtype=torch.float32)
        loss = -(adv_t * s.log_prob).mean() / p.policy.num_items - config.entropy_coef * s.entropy.mean()
        if config.imitation_weight > 0:
            loss = loss + config.imitation_weight * p.policy.imitation_loss(p.label, switch_share=config.switch_share)
        step(loss)
        steps["rl"] += 1
        if steps["rl"] % 20 == 0:
            say(f"rl step {steps['rl']}: {p.name}@{p.cluster} best sample {np.min(np.where(failed, np.inf, t)) / p.label_s:.3f}x the label")

    rows = []
    for p in pairs:
        g_t, g_failed = p.env.step_times(p.policy.greedy()[None])
        rows.append({"graph": p.name, "cluster": p.cluster, "label": p.label_method, "label_step_time_s": p.label_s,
                     "greedy_step_time_s": None if g_failed[0] else float(g_t[0])})
    sidecar = {
        "architecture": {"hidden": config.hidden, "rounds": config.rounds, "logit_cap": float(config.logit_cap),
                         "decoder": config.decoder},
        "features": feature_spec(), "clusters": list(config.clusters),
        "corpus": sorted({p.name.split("/")[0] for p in pairs}), "corpus_spec": config.corpus, "excluded": list(config.exclude),
        "seed": config.seed, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "training": {"time_budget_s": config.time_budget_s, "setup_s": round(setup_s, 1), "steps": steps,
                     "samples": config.samples, "lr": config.lr, "rl_lr": config.rl_lr,
                     "imitation_share": config.imitation_share, "dagger": config.dagger,
                     "switch_share": config.switch_share, "label_methods": list(LABEL_METHODS),
                     "synthetic_sizes": list(config.synthetic_sizes), "groups": list(config.groups), "skipped": skipped},
    }
    return PretrainResult(net, sidecar, rows)


# ------------------------------------------------------------------ zero-shot placement
#: ``placer place --method learned`` defaults: group counts decoded besides the ops, and samples per group count.
ZERO_SHOT_GROUPS: tuple[int | str, ...] = (128, 256, 512, "modules")
ZERO_SHOT_SAMPLES = 48
#: Temperatures of the samples of each module view (``samples`` at each): the policy's own distribution, and one
#: spread over more devices, which found the held-out LSTMs' layer-per-GPU placements (BENCHMARKS.md, "Placing modules").
ZERO_SHOT_MODULE_TEMPERATURES = (1.0, 4.0)
#: Placements simulated to refine the best decodes by steepest descent over their groups
#: (:func:`placer.methods.heuristics.module_search.descend`), and the largest view (in groups) refined.
ZERO_SHOT_REFINE = 1000
ZERO_SHOT_REFINE_MAX_ITEMS = 128
#: Seconds after which the refinement starts no new round (a 20,000-op graph simulates ~300 placements a second).
ZERO_SHOT_REFINE_TIME_S = 2.0


def group_views(graph: OpGraph, groups: Sequence[int | str]) -> list[tuple[str, dict[str, Any]]]:
    """What a policy places, per entry of ``groups``: (a name, ``GNNPolicy`` keyword arguments).

    0 is the ops; N the graph coarsened to N co-location groups (``max_groups``);
    ``"modules"`` one view per :func:`graphs.grouping.module_levels` partition of the
    graph the policy reads (``envs.sim.simulator.schedule_graph``), a group per module
    at each depth. Pass that graph itself (as the callers here do) and the policies
    built on it neither rebuild it nor hash it again.
    """
    from envs.sim.simulator import schedule_graph
    from graphs.grouping import module_levels

    views: list[tuple[str, dict[str, Any]]] = []
    for level in dict.fromkeys(groups):  # in order, each once
        if level == "modules":
            for grouping in module_levels(schedule_graph(graph)):
                views.append((f"modules depth {grouping.graph.meta['module_depth']}", {"grouping": grouping}))
        elif int(level) == 0:
            views.append(("ops", {"max_groups": 0}))
        else:
            views.append((f"{int(level)}g", {"max_groups": int(level)}))
    return views


def place_learned(graph: OpGraph, cluster: Any, *, policy_file: str | None = None, samples: int = ZERO_SHOT_SAMPLES,
                  groups: Sequence[int | str] = ZERO_SHOT_GROUPS, seed: int = 0,
                  module_temperatures: Sequence[float] = ZERO_SHOT_MODULE_TEMPERATURES,
                  refine: int = ZERO_SHOT_REFINE, refine_time_s: float = ZERO_SHOT_REFINE_TIME_S) -> Any:
    """Zero-shot placement with a pretrained policy: the best on the simulator of several decodes.

    The policy decodes the ops (greedy), the co-location groups of
    ``graphs.grouping.coarsen`` at each count in ``groups``, and, for the entry
    ``"modules"``, the graph grouped by module at each depth that gives a distinct
    partition (:func:`graphs.grouping.module_levels`): greedy plus ``samples``
    samples each (a count that gives as many groups as one already decoded is
    skipped); a module view gets ``samples`` at each of ``module_temperatures``
    (:meth:`policies.gnn.GNNPolicy.decode`). With no ``groups``, the ops get the ``samples`` samples.
    A group decode is 5-20x cheaper than an op decode on graphs of thousands of
    ops, and its samples were the better ones on every held-out graph measured
    (BENCHMARKS.md, "Pretrained gnn policy"); the module views place a layer
    per item, which held-out LSTMs need (BENCHMARKS.md, "Placing modules");
    the op-level greedy placement is the policy exactly as pretrained.

    Then ``refine`` more placements are simulated to improve the decodes by
    steepest descent over their view's groups (one group moved to another GPU
    at a time; :func:`placer.methods.heuristics.module_search.descend`): the best decode
    of each view of at most :data:`ZERO_SHOT_REFINE_MAX_ITEMS` groups in turn,
    best view first, then each view's second best, and so on until the budget
    is spent, or ``refine_time_s`` has passed (then the result depends on the
    machine's speed; ``meta["refine_stopped"]`` says which ended it). The
    ``module_search`` baseline is the same descent from uniform draws; given as
    many simulated placements it is this refinement's rival
    (``scripts/bench_pretrain.py``). ``refine=0`` keeps the best decode.

    Returns a :class:`placer.Placement` (method ``learned``) whose meta records the policy file and timings.
    """
    import torch

    import envs
    from envs.sim.simulator import schedule_graph
    from placer.methods.heuristics.search import scored_keys
    from graphs.plan import Placement
    from policies import policy_file as pf
    from policies.gnn import GNNPolicy

    t0 = time.perf_counter()
    loaded = pf.load(policy_file)
    levels = [g for g in groups if g == "modules" or int(g) > 0]
    cand, found_by, items_seen = [], [], set()
    view_of, groupings = [], []  # per decode: its view's index; per view: its op -> group map (None: the ops)
    torch.manual_seed(seed)
    with torch.no_grad():
        sg = schedule_graph(graph)  # what every view's policy reads: built and hashed once
        for view, kwargs in group_views(sg, [0, *levels]):
            policy = GNNPolicy(sg, cluster.num_devices, cluster=cluster, net=loaded.net, **kwargs)
            if view != "ops" and "max_groups" in kwargs and policy.num_items in items_seen:
                continue
            items_seen.add(policy.num_items)
            groupings.append(None if policy.grouping is None else np.asarray(policy.grouping.op_group, dtype=np.int64))
            first = len(found_by)
            what = "ops" if view == "ops" else f"{policy.num_items} groups" if "max_groups" in kwargs \
                else f"{view}: {policy.num_items} groups"
            cand.append(policy.greedy()[None])
            found_by.append(f"greedy ({what})")
            k = samples if (view != "ops" or not levels) else 0
            gen = torch.Generator().manual_seed(seed)
            temperatures = (module_temperatures if "grouping" in kwargs else (1.0,)) if k > 0 else ()
            for temperature in temperatures:
                cand.append(policy.decode(k, temperature=temperature, generator=gen))
                found_by += [f"sample ({what})" if temperature == 1.0 else f"sample at T={temperature:g} ({what})"] * k
            view_of += [len(groupings) - 1] * (len(found_by) - first)
    idx = np.concatenate(cand, axis=0)
    env = envs.SimEnv(graph, cluster)
    keys = scored_keys(env, idx)
    t = np.asarray([np.inf if failed else x for failed, x in keys])
    j = int(np.argmin(t))
    greedy_t, decode_t = t[0], t[j]
    best, best_key, best_how = idx[j], keys[j], found_by[j]
    refined, stopped = 0, "off"
    if refine > 0:
        deadline = time.perf_counter() + float(refine_time_s)
        best, best_key, best_how, refined = _refine(env, cluster, idx, keys, found_by, view_of, groupings, refine,
                                                    np.random.default_rng(seed), (best, best_key, best_how), deadline)
        stopped = "budget" if refined >= refine else "time" if time.perf_counter() >= deadline else "no start left"
    step = best_key[1] if not best_key[0] else float("inf")
    order, how, step_s = env.plan_order(best)
    meta = {"policy_file": loaded.path, "samples": samples, "groups": levels, "seed": seed, "found_by": best_how,
            "module_temperatures": [float(t) for t in module_temperatures],
            "decodes": len(idx), "refine": int(refine), "refine_simulated": int(refined),
            "refine_time_s": float(refine_time_s), "refine_stopped": stopped,
            "node_order_step_time_s": float(step) if np.isfinite(step) else None,
            "decode_step_time_s": float(decode_t) if np.isfinite(decode_t) else None,
            "greedy_step_time_s": float(greedy_t) if np.isfinite(greedy_t) else None,
            "place_time_s": time.perf_counter() - t0, "issue_order": how, "step_time_s": step_s, "executor": "eager"}
    return Placement.from_indices(graph, cluster.device_names, best, cluster=getattr(cluster, "name", ""),
                                  method="learned", meta=meta, order=order)


def _refine(env: Any, cluster: Any, idx: np.ndarray, keys: list, found_by: list[str], view_of: list[int],
            groupings: list, budget: int, rng: np.random.Generator, incumbent: tuple, deadline: float) -> tuple:
    """:func:`place_learned`'s descent from its decodes: ``(op devices, key, found by, placements simulated)``."""
    from placer.methods.heuristics.costs import candidate_devices
    from placer.methods.heuristics.module_search import descend

    gpus = np.asarray(candidate_devices(cluster, "gpus"), dtype=np.int64)
    ranked: dict[int, list[int]] = {}  # view -> its decodes, best first, one per distinct placement
    seen: set[tuple[int, bytes]] = set()
    for i in sorted(range(len(idx)), key=keys.__getitem__):
        g, placed = groupings[view_of[i]], (view_of[i], idx[i].tobytes())
        if g is not None and int(g.max()) + 1 <= ZERO_SHOT_REFINE_MAX_ITEMS and placed not in seen:
            seen.add(placed)
            ranked.setdefault(view_of[i], []).append(i)
    # each view's best, best view first (dicts keep the order of each view's best), then each view's second...
    starts = [i for rank in itertools.zip_longest(*ranked.values()) for i in rank if i is not None]
    best, best_key, best_how = incumbent
    used = 0
    for i in starts:
        if used >= budget or time.perf_counter() >= deadline:
            break
        g = groupings[view_of[i]]
        start = np.zeros(int(g.max()) + 1, dtype=np.int64)
        start[g] = idx[i]  # a decode of a view gives every op of a group the group's device
        x, key, spent = descend(env, g, start, gpus, budget - used, key=keys[i], rng=rng, deadline=deadline)
        used += spent
        if key < best_key:
            best, best_key, best_how = x[g].astype(np.int32), key, f"descent from {found_by[i]}"
    return best, best_key, best_how, used

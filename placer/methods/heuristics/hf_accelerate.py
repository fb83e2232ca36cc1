"""Hugging Face accelerate's ``device_map="auto"``, called for real, mapped onto ops.

:func:`accelerate.utils.get_balanced_memory` spreads the model's parameters
evenly over the GPUs (the cluster's capacities as ``max_memory``) and
:func:`accelerate.infer_auto_device_map` then assigns modules greedily, in
definition order, by parameter size. The model is built with its weights on the
meta device, so no GPU and no weights are needed.

The module-level map is applied to ops through ``OpGraph.module_paths`` (the
longest module prefix in the map wins) and ``OpGraph.params`` (an op reading a
mapped parameter); an op outside every mapped module runs where its largest
input comes from, as accelerate's hooks move inputs to the module that consumes
them. Like the original it ignores activations and compute, so it can run out
of memory on activation-heavy models. ``"cpu"``/``"disk"`` entries go to the host.

Three rows, one per ``from_pretrained(device_map=...)`` strategy: ``accelerate``
(``"auto"``, which is ``"balanced"``), ``accelerate_low_0`` (``"balanced_low_0"``)
and ``accelerate_sequential`` (``"sequential"``); see :func:`device_map`.

Needs the model: pass ``model=`` (an ``nn.Module``; ``placer compare`` and
``placer place`` do when SOURCE is a module:callable), or use a zoo graph, which
is rebuilt from :func:`graphs.zoo.build`; otherwise the method reports "needs a
model" and says which module:callable to pass when the graph file recorded it.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import numpy as np

from graphs import OpGraph, PlacerError, zoo
from placer.methods.heuristics.costs import gpu_devices
from placer.methods.heuristics.expert import _follow_producers
from placer.methods.registry import HeuristicUnavailable, register, require


@contextlib.contextmanager
def _quiet_accelerate():
    log = logging.getLogger("accelerate")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _meta_model(graph: OpGraph) -> Any:
    """The zoo model behind ``graph`` with its weights on the meta device, or None."""
    if graph.name not in zoo.names():
        return None
    model, _ = zoo.build(graph.name, device="meta")
    return model


def _lookup(device_map: dict[str, Any], path: str) -> Any:
    """Device of the longest key of ``device_map`` that is ``path`` or a dotted prefix of it."""
    while True:
        if path in device_map:
            return device_map[path]
        if not path:
            return None
        path = path.rsplit(".", 1)[0] if "." in path else ""


def map_onto_ops(graph: OpGraph, device_map: dict[str, Any], cluster) -> np.ndarray:
    """Op device indices from an accelerate module -> device map (int GPU index, "cpu", "disk")."""
    gpus = gpu_devices(cluster)
    cpu = next((d for d, k in enumerate(cluster.kinds) if k == "cpu"), int(gpus[0]))

    def to_index(v: Any) -> int:
        if isinstance(v, int) or (isinstance(v, str) and v.isdigit()):
            return int(gpus[int(v) % len(gpus)])
        if isinstance(v, str) and v.startswith("cuda"):
            return int(gpus[int(v.split(":")[1]) % len(gpus)]) if ":" in v else int(gpus[0])
        return cpu  # "cpu", "disk", "meta"

    root = device_map.get("")
    dev = np.full(graph.num_ops, -1, dtype=np.int64)
    for i, path in enumerate(graph.module_paths):
        v = _lookup(device_map, path) if path else None
        if v is None:
            for fqn in graph.params[i]:
                v = _lookup(device_map, fqn.rsplit(".", 1)[0] if "." in fqn else "")
                if v is not None:
                    break
        if v is None and root is not None:
            v = root
        if v is not None:
            dev[i] = to_index(v)

    return _follow_producers(graph, dev, int(gpus[0])).astype(np.int32)


def no_split_modules(model: Any) -> list[str]:
    """The class names no device map may split: every submodule's ``_no_split_modules``, as from_pretrained gathers them.

    A ``module:callable`` that wraps a Hugging Face model (for its loss) hides the
    model's own list from a look at the wrapper alone.
    """
    names: list[str] = []
    for module in model.modules():
        for name in getattr(module, "_no_split_modules", None) or []:
            if name not in names:
                names.append(name)
    return names


def device_map(model: Any, cluster, strategy: str = "balanced", no_split_module_classes: list[str] | None = None) -> dict[str, Any]:
    """accelerate's module -> device map of ``model`` for ``cluster``, as ``from_pretrained(device_map=strategy)`` makes it.

    ``strategy`` is one of :data:`STRATEGIES`: ``"balanced"`` (what ``"auto"``
    means) and ``"balanced_low_0"`` size ``max_memory`` with
    :func:`accelerate.utils.get_balanced_memory` (``low_zero`` keeps GPU 0 light
    for generation), ``"sequential"`` fills GPU 0, then GPU 1, ... up to each
    device's capacity. The cluster's GPUs are accelerate's devices ``0..n-1``, its
    host CPU is ``"cpu"``.
    """
    acc = require("accelerate", "accelerate", extra="accelerate")
    from accelerate.utils import get_balanced_memory  # an optional extra

    if strategy not in STRATEGIES:
        raise PlacerError(f"accelerate: unknown device_map strategy {strategy!r} (known: {', '.join(STRATEGIES)})")
    gpus = gpu_devices(cluster)
    mem = np.asarray(cluster.memory_bytes, dtype=np.float64)
    max_memory: dict[Any, int] = {k: int(mem[d]) for k, d in enumerate(gpus)}
    cpus = [d for d, kind in enumerate(cluster.kinds) if kind == "cpu"]
    if cpus:
        max_memory["cpu"] = int(mem[cpus[0]])
    no_split = list(no_split_module_classes or no_split_modules(model))
    with _quiet_accelerate():  # it warns that the cluster's GPUs are not on this machine
        if strategy != "sequential":
            max_memory = get_balanced_memory(
                model, max_memory=max_memory, no_split_module_classes=no_split, low_zero=strategy == "balanced_low_0"
            )
        return dict(acc.infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split))


#: ``from_pretrained(device_map=...)``'s strategies, as heuristics: ``"auto"`` is ``"balanced"``.
STRATEGIES = {"balanced": "accelerate", "balanced_low_0": "accelerate_low_0", "sequential": "accelerate_sequential"}


def _placed(graph: OpGraph, cluster, model: Any, strategy: str, no_split_module_classes: list[str] | None) -> np.ndarray:
    method = STRATEGIES[strategy]
    require("accelerate", method, extra="accelerate")
    if model is None:
        model = _meta_model(graph)
    if model is None:
        source = graph.meta.get("source") or "the module:callable the graph was captured from"
        raise HeuristicUnavailable(f"{method}: pass {source} instead of the graph file to get this row", "needs a model")
    return map_onto_ops(graph, device_map(model, cluster, strategy, no_split_module_classes), cluster)


@register("accelerate")
def accelerate(graph: OpGraph, cluster, *, seed: int = 0, model: Any = None, no_split_module_classes: list[str] | None = None) -> np.ndarray:
    """``device_map="auto"`` (= ``"balanced"``): ``infer_auto_device_map(model, max_memory=get_balanced_memory(...))``, mapped onto ops."""
    del seed
    return _placed(graph, cluster, model, "balanced", no_split_module_classes)


@register("accelerate_low_0")
def accelerate_low_0(graph: OpGraph, cluster, *, seed: int = 0, model: Any = None, no_split_module_classes: list[str] | None = None) -> np.ndarray:
    """``device_map="balanced_low_0"``: balanced over the GPUs but GPU 0, which gets as little as possible."""
    del seed
    return _placed(graph, cluster, model, "balanced_low_0", no_split_module_classes)


@register("accelerate_sequential")
def accelerate_sequential(graph: OpGraph, cluster, *, seed: int = 0, model: Any = None, no_split_module_classes: list[str] | None = None) -> np.ndarray:
    """``device_map="sequential"``: fill GPU 0 to its capacity, then GPU 1, and so on."""
    del seed
    return _placed(graph, cluster, model, "sequential", no_split_module_classes)

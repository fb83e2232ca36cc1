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

``max_memory`` (an option of all three, ``--option accelerate.max_memory=...``) is
what a user passes to ``from_pretrained(max_memory=...)``, and takes precedence over
the cluster's capacities: a fraction of every GPU's capacity (``0.25``: a common way
to leave room for gradients, Adam's moments and activations, which accelerate does
not count), or sizes per device (``"gpu:0=6GiB,cpu:0=200GiB"``; accelerate's keys
``0``, ``"cpu"`` work too; see :func:`max_memory_of`).

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
from placer.methods.heuristics.expert import follow_producers
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


def lookup_device(device_map: dict[str, Any], path: str) -> Any:
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
    cpu = next(iter(cluster.host_indices()), int(gpus[0]))

    def to_index(v: Any) -> int:
        if isinstance(v, int) or (isinstance(v, str) and v.isdigit()):
            return int(gpus[int(v) % len(gpus)])
        if isinstance(v, str) and v.startswith("cuda"):
            return int(gpus[int(v.split(":")[1]) % len(gpus)]) if ":" in v else int(gpus[0])
        return cpu  # "cpu", "disk", "meta"

    root = device_map.get("")
    op_devices = np.full(graph.num_ops, -1, dtype=np.int64)
    for i, path in enumerate(graph.module_paths):
        v = lookup_device(device_map, path) if path else None
        if v is None:
            for fqn in graph.params[i]:
                v = lookup_device(device_map, fqn.rsplit(".", 1)[0] if "." in fqn else "")
                if v is not None:
                    break
        if v is None and root is not None:
            v = root
        if v is not None:
            op_devices[i] = to_index(v)

    return follow_producers(graph, op_devices, int(gpus[0])).astype(np.int32)


def no_split_modules(model: Any) -> list[str]:
    """The class names no device map may split: every submodule's ``_no_split_modules``, as from_pretrained gathers
    them.

    A ``module:callable`` that wraps a Hugging Face model (for its loss) hides the
    model's own list from a look at the wrapper alone.
    """
    names: list[str] = []
    for module in model.modules():
        for name in getattr(module, "_no_split_modules", None) or []:
            if name not in names:
                names.append(name)
    return names


def max_memory_of(cluster, max_memory: Any = None) -> dict[Any, int]:
    """accelerate's ``max_memory`` for ``cluster``: GPU index (among its GPUs) or ``"cpu"`` -> bytes.

    ``max_memory`` None: the cluster's capacities. A number in (0, 1]: that fraction
    of every GPU's capacity (the host keeps its own). A mapping or a string
    ``"DEVICE=SIZE,..."``: those devices' sizes (bytes, or accelerate's ``"6GiB"``,
    ``"500MB"``), on top of the capacities; a device is a logical name (``gpu:0``,
    ``cpu:0``) or accelerate's key (``0``, ``"cpu"``).

    >>> import envs
    >>> c = envs.resolve_cluster("k80x2")
    >>> max_memory_of(c, "gpu:1=2GiB,cpu=1000")[1], max_memory_of(c, "gpu:1=2GiB,cpu=1000")["cpu"]
    (2147483648, 1000)
    >>> max_memory_of(c, 0.5)[0] * 2 == max_memory_of(c)[0]
    True
    """
    gpus = [int(d) for d in gpu_devices(cluster)]
    mem = np.asarray(cluster.memory_bytes, dtype=np.float64)
    out: dict[Any, int] = {k: int(mem[d]) for k, d in enumerate(gpus)}
    cpus = cluster.host_indices()
    if cpus:
        out["cpu"] = int(mem[cpus[0]])
    if max_memory is None:
        return out
    if isinstance(max_memory, (int, float)) and not isinstance(max_memory, bool):
        if not 0 < max_memory <= 1:
            raise PlacerError(f"--option max_memory={max_memory}: a fraction of each GPU's memory must be in (0, 1]")
        return {k: int(v * max_memory) if k != "cpu" else v for k, v in out.items()}
    items = max_memory.items() if isinstance(max_memory, dict) else _pairs(max_memory)
    for device, size in items:
        out[_accelerate_key(cluster, gpus, device)] = _size_bytes(size, device)
    return out


def _pairs(text: Any) -> list[tuple[str, str]]:
    if not isinstance(text, str):
        raise PlacerError(f"--option max_memory={text!r}: expected a fraction, a mapping or DEVICE=SIZE,...")
    pairs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        device, sep, size = item.partition("=")
        if not sep or not device.strip() or not size.strip():
            raise PlacerError(f"--option max_memory: {item!r} is not DEVICE=SIZE (e.g. gpu:0=6GiB)")
        pairs.append((device.strip(), size.strip()))
    return pairs


def _accelerate_key(cluster, gpus: list[int], device: Any) -> Any:
    """accelerate's key of a logical device name or of accelerate's own key."""
    logical = isinstance(device, str) and device in cluster.device_names
    if device == "cpu" or (logical and cluster.host[cluster.index(device)]):
        return "cpu"
    if isinstance(device, int) or (isinstance(device, str) and device.isdigit()):
        k = int(device)
        if 0 <= k < len(gpus):
            return k
    elif logical and cluster.index(device) in gpus:
        return gpus.index(cluster.index(device))
    raise PlacerError(
        f"--option max_memory: {device!r} is not a device of cluster {cluster.name or '?'} "
        f"({', '.join(cluster.device_names)}, or accelerate's 0..{len(gpus) - 1}, cpu)"
    )


def _size_bytes(size: Any, device: Any) -> int:
    from accelerate.utils import convert_file_size_to_int  # an optional extra

    try:
        value = (
            int(size)
            if isinstance(size, int) or (isinstance(size, str) and size.isdigit())
            else convert_file_size_to_int(size)
        )
    except (ValueError, TypeError):
        value = None
    if not isinstance(value, int) or value <= 0:
        raise PlacerError(f"--option max_memory: {device}={size!r} is not a size (bytes, or e.g. 6GiB, 500MB)")
    return value


def device_map(
    model: Any,
    cluster,
    strategy: str = "balanced",
    no_split_module_classes: list[str] | None = None,
    max_memory: Any = None,
) -> dict[str, Any]:
    """accelerate's module -> device map of ``model`` for ``cluster``, as ``from_pretrained(device_map=strategy)`` makes
    it.

    ``strategy`` is one of :data:`STRATEGIES`: ``"balanced"`` (what ``"auto"``
    means) and ``"balanced_low_0"`` size ``max_memory`` with
    :func:`accelerate.utils.get_balanced_memory` (``low_zero`` keeps GPU 0 light
    for generation), ``"sequential"`` fills GPU 0, then GPU 1, ... up to each
    device's capacity. The cluster's GPUs are accelerate's devices ``0..n-1``, its
    host CPU is ``"cpu"``; ``max_memory`` overrides their capacities (:func:`max_memory_of`).
    """
    acc = require("accelerate", "accelerate", extra="accelerate")
    from accelerate.utils import get_balanced_memory  # an optional extra

    if strategy not in STRATEGIES:
        raise PlacerError(f"accelerate: unknown device_map strategy {strategy!r} (known: {', '.join(STRATEGIES)})")
    max_memory = max_memory_of(cluster, max_memory)
    no_split = list(no_split_module_classes or no_split_modules(model))
    with _quiet_accelerate():  # it warns that the cluster's GPUs are not on this machine
        if strategy != "sequential":
            max_memory = get_balanced_memory(
                model, max_memory=max_memory, no_split_module_classes=no_split, low_zero=strategy == "balanced_low_0"
            )
        return dict(acc.infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split))


#: ``from_pretrained(device_map=...)``'s strategies, as heuristics: ``"auto"`` is ``"balanced"``.
STRATEGIES = {"balanced": "accelerate", "balanced_low_0": "accelerate_low_0", "sequential": "accelerate_sequential"}


def _placed(
    graph: OpGraph, cluster, model: Any, strategy: str, no_split_module_classes: list[str] | None, max_memory: Any
) -> np.ndarray:
    method = STRATEGIES[strategy]
    require("accelerate", method, extra="accelerate")
    if model is None:
        model = _meta_model(graph)
    if model is None:
        source = graph.meta.get("source") or "the module:callable the graph was captured from"
        raise HeuristicUnavailable(
            f"{method}: pass {source} instead of the graph file to get this row", "needs a model"
        )
    return map_onto_ops(graph, device_map(model, cluster, strategy, no_split_module_classes, max_memory), cluster)


@register("accelerate")
def accelerate(
    graph: OpGraph,
    cluster,
    *,
    seed: int = 0,
    model: Any = None,
    no_split_module_classes: list[str] | None = None,
    max_memory: Any = None,
) -> np.ndarray:
    """``device_map="auto"`` (= ``"balanced"``): ``infer_auto_device_map(model, max_memory=get_balanced_memory(...))``,
    mapped onto ops."""
    del seed
    return _placed(graph, cluster, model, "balanced", no_split_module_classes, max_memory)


@register("accelerate_low_0")
def accelerate_low_0(
    graph: OpGraph,
    cluster,
    *,
    seed: int = 0,
    model: Any = None,
    no_split_module_classes: list[str] | None = None,
    max_memory: Any = None,
) -> np.ndarray:
    """``device_map="balanced_low_0"``: balanced over the GPUs but GPU 0, which gets as little as possible."""
    del seed
    return _placed(graph, cluster, model, "balanced_low_0", no_split_module_classes, max_memory)


@register("accelerate_sequential")
def accelerate_sequential(
    graph: OpGraph,
    cluster,
    *,
    seed: int = 0,
    model: Any = None,
    no_split_module_classes: list[str] | None = None,
    max_memory: Any = None,
) -> np.ndarray:
    """``device_map="sequential"``: fill GPU 0 to its capacity, then GPU 1, and so on."""
    del seed
    return _placed(graph, cluster, model, "sequential", no_split_module_classes, max_memory)

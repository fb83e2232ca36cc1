"""Project an op placement onto module names: a ``device_map`` users can take home.

``from_pretrained(device_map=...)`` and ``accelerate.dispatch_model`` place whole
modules (and parameters), not ops: each module runs where its weights are, and
its inputs move there. :func:`project` turns a placement into such a map:

* walking the module tree from the top, a module whose ops (and parameters) are
  all on one device becomes one key; a module split across devices is described
  by its submodules, and its own parameters by their names; a module with no
  submodules that is split goes where most of its op time is;
* values are accelerate's: the GPU's index among the cluster's GPUs (``0``,
  ``1``...) or ``"cpu"``;
* ``module`` picks the submodule the map is for (the model inside a
  ``module:callable``'s wrapper, e.g. ``"model"``), so its keys are relative to it.

Ops the map cannot express (code between modules, such as a residual add in a
block's ``forward``) run where their inputs are, as accelerate's hooks do; the
op placement that results is :func:`placer.methods.heuristics.hf_accelerate.map_onto_ops`
of the map, and :func:`projection_cost` simulates it against the placement.
``placer.apply`` remains the full-speed path: it places every op.

>>> from graphs import OpGraph
>>> from envs import Cluster
>>> g = OpGraph.from_edges(["a", "b", "c"], [("a", "b", 4), ("b", "c", 4)], flops=[1e9, 1e9, 1e9],
...                        module_paths=["m.enc.0", "m.enc.1", "m.head"])
>>> project(g, [1, 1, 2], Cluster.preset("k80x2"), module="m")
{'enc': 0, 'head': 1}
>>> project(g, [1, 1, 1], Cluster.preset("k80x2"), module="m")
{'': 0}
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

import envs
from graphs import OpGraph, PlacerError
from placer.methods.heuristics.costs import step_costs_s
from placer.methods.heuristics.hf_accelerate import lookup_device, map_onto_ops


def _parent(path: str) -> str:
    return path.rsplit(".", 1)[0] if "." in path else ""


def _within(path: str, module: str) -> bool:
    return not module or path == module or path.startswith(module + ".")


def _relative(path: str, module: str) -> str:
    return path[len(module) + 1 :] if module and path != module else ("" if path == module else path)


def wrapped_module(graph: OpGraph) -> str:
    """The one top-level submodule holding every parameter and every module of ``graph``, else ``""``.

    A ``module:callable`` often wraps the model (``forward`` returns its loss, the
    model is ``self.model``): ``from_pretrained(device_map=...)`` wants keys
    relative to the model, so a map defaults to them.

    >>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)], module_paths=["m.enc", ""])
    >>> g.params = [["m.enc.weight"], []]
    >>> wrapped_module(g)
    'm'
    """
    constants = set(graph.meta.get("constants", []))
    names = [p for ps in graph.params or () for p in ps if p not in constants]
    names += [path for path in graph.module_paths if path]
    tops = {name.split(".")[0] for name in names}
    if len(tops) != 1 or any("." not in p for ps in graph.params or () for p in ps if p not in constants):
        return ""
    return tops.pop()


def accelerate_device(cluster, device_index: int) -> int | str:
    """accelerate's name of cluster device ``device_index``: its index among the GPUs, or ``"cpu"``."""
    if cluster.kinds[device_index] != "gpu":
        return "cpu"
    return [int(g) for g in cluster.gpu_indices()].index(int(device_index))


def project(
    graph: OpGraph, op_devices: Sequence[int] | np.ndarray, cluster, *, module: str = ""
) -> dict[str, int | str]:
    """The module-level device map closest to op placement ``op_devices`` (see the module doc).

    Raises:
        PlacerError: ``module`` is not a module of the graph, or the graph has no
            module paths (it was not captured from an ``nn.Module``).
    """
    op_devices = np.asarray(op_devices, dtype=np.int64)
    D = cluster.num_devices
    if not any(graph.module_paths) and not any(graph.params):
        raise PlacerError(
            f"graph {graph.name or '?'} has no module names (capture it from an nn.Module to export a device map)"
        )
    op_time_s = step_costs_s(graph, cluster)[np.arange(graph.num_ops), op_devices] + 1e-9  # every op counts a little
    weight: dict[str, np.ndarray] = {}
    children: dict[str, set[str]] = {}
    own_params: dict[str, dict[str, int]] = {}  # module -> {param fqn: device}

    def add(path: str, device_index: int, w: float) -> None:
        while True:
            weight.setdefault(path, np.zeros(D))[device_index] += w
            if path == module or not path:
                return
            parent = _parent(path)
            children.setdefault(parent, set()).add(path)
            path = parent

    owner: dict[str, int] = {}
    constants = set(graph.meta.get("constants", []))  # made by the program, not the model's tensors
    for i, path in enumerate(graph.module_paths):
        if _within(path, module):
            add(path, int(op_devices[i]), float(op_time_s[i]))
        for fqn in graph.params[i]:
            if fqn not in constants:
                owner.setdefault(fqn, int(op_devices[i]))  # a parameter lives with its first reader
    for fqn, device_index in owner.items():
        mod = _parent(fqn)
        if _within(mod, module):
            add(mod, device_index, 0.0)
            own_params.setdefault(mod, {})[fqn] = device_index
    if module not in weight:
        known = sorted({p.split(".")[0] for p in graph.module_paths if p})
        raise PlacerError(
            f"--module {module!r}: no module of that name in graph {graph.name or '?'} (top-level modules: "
            f"{', '.join(known) or 'none'})"
        )
    unused = [f for f in graph.meta.get("unused_params", []) if _within(_parent(f), module)]

    out: dict[str, int | str] = {}

    def devices_below(path: str) -> set[int]:
        found = {int(d) for d in np.flatnonzero(weight[path] > 0)}
        stack = [path]
        while stack:
            p = stack.pop()
            found.update(own_params.get(p, {}).values())
            stack.extend(children.get(p, ()))
        return found

    def visit(path: str) -> None:
        below = devices_below(path)
        kids = sorted(children.get(path, ()))
        if len(below) <= 1 or not kids:
            device_index = next(iter(below)) if len(below) == 1 else int(np.argmax(weight[path]))
            out[_relative(path, module)] = accelerate_device(cluster, device_index)
            return
        for kid in kids:
            visit(kid)
        for fqn, device_index in sorted(own_params.get(path, {}).items()):
            out[_relative(fqn, module)] = accelerate_device(cluster, device_index)

    visit(module)
    for fqn in unused:  # never read: with the nearest mapped module, or the heaviest device
        if lookup_device(out, _relative(fqn, module)) is None:
            out[_relative(fqn, module)] = accelerate_device(cluster, int(np.argmax(weight[module])))
    return out


def projected_op_devices(graph: OpGraph, device_map: dict[str, Any], cluster, *, module: str = "") -> np.ndarray:
    """The op placement a module-level ``device_map`` (keys relative to ``module``) gives, as accelerate runs it."""
    prefix = f"{module}." if module else ""
    full = {(prefix + k if k else module): v for k, v in device_map.items()}
    return map_onto_ops(graph, full, cluster)


def projection_cost(
    graph: OpGraph, placement: Any, cluster, device_map: dict[str, Any], *, module: str = "", executor: str = "eager"
) -> dict[str, Any]:
    """Simulated step time of ``placement`` (its own issue order) and of ``device_map`` run as accelerate does (node
    order)."""
    env = envs.SimEnv(graph, cluster, executor=executor)
    op_devices = placement.indices(graph, cluster.device_names, source=getattr(placement, "source", "") or "placement")
    placed = env.simulate(placement)
    projected_devices = projected_op_devices(graph, device_map, cluster, module=module)
    projected = env.simulate(projected_devices)
    moved = int(np.sum(projected_devices != op_devices))
    return {
        "placement_status": placed.status,
        "placement_step_time_s": placed.step_time_s if placed.ok else None,
        "projected_status": projected.status,
        "projected_step_time_s": projected.step_time_s if projected.ok else None,
        "projected_message": projected.message,
        "ops_moved": moved,
        "ops": graph.num_ops,
    }

"""The plan, core data: a :class:`Placement` and the checks of its parts.

A placement maps op name -> logical device, tied to one graph (its content hash)
and one device list, and may carry an issue order and a pipelined step's
microbatches M and window W. The same plan is what the simulator scores, what
``placer.apply`` runs and what ``best_placement.json`` stores. Saved as versioned
JSON (``"format": "placer-placement/1"``), never pickled.

Its parts, checked here once for every user: a *placement vector* ``op_devices``
(a device index per op, in graph order: :func:`as_indices` turns any
placement-like value into one), an issue *order* (op indices, a topological
order: :func:`check_order`), and M and W (:func:`check_microbatches`,
:func:`check_inflight`).

>>> from graphs import OpGraph
>>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)])
>>> p = Placement.from_indices(g, ["cpu:0", "gpu:0"], [1, 1])
>>> p.assignment
{'a': 'gpu:0', 'b': 'gpu:0'}
>>> p.indices(g, ["cpu:0", "gpu:0"]).tolist()
[1, 1]

A placement may also carry an issue order (a topological order of the ops), the
order in which :func:`placer.apply` emits them; ``None`` means node order:

>>> Placement.from_indices(g, ["cpu:0", "gpu:0"], [1, 1], order=[0, 1]).order.tolist()
[0, 1]

and a number of microbatches (a pipelined plan, :mod:`envs.microbatch` simulates
it, :mod:`envs.real.pipeline` runs it); absent from the file when 1:

>>> p = Placement.from_indices(g, ["cpu:0", "gpu:0"], [1, 1], microbatches=4)
>>> p.to_dict()["microbatches"], Placement.from_dict(p.to_dict()) == p
(4, True)

and the most microbatches in flight (one-forward-one-backward when fewer than
M; absent: all M, fill-drain):

>>> Placement.from_indices(g, ["cpu:0", "gpu:0"], [1, 1], microbatches=4, inflight=2).to_dict()["inflight"]
2

and a *home* for parameters apart from the device their op runs on (with the gradient and the optimizer
state; absent: the owner op's device), decided per owner op and saved per parameter name:

>>> g.params = [["w"], []]
>>> p = Placement.from_indices(g, ["cpu:0", "gpu:0"], [1, 1], homes=[0, -1])
>>> p.param_homes, p.home_indices(g).tolist(), p.homed_bytes(g) == float(g.param_bytes[0])
({'w': 'cpu:0'}, [0, -1], True)

and, for a plan that runs across processes (one per device), the schedule torch's
pipeline runtime runs it with (:mod:`envs.real.distributed.schedules`; absent: the
one that fits the plan):

>>> p = Placement.from_indices(g, ["cpu:0", "gpu:0"], [0, 1], microbatches=4, schedule="1f1b")
>>> p.to_dict()["schedule"], Placement.from_dict(p.to_dict()) == p
('1f1b', True)
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from graphs import schema
from graphs.errors import PlacerError
from graphs.hash_seed import hash_seed_hint
from graphs.io import read_document, write_text_atomic
from graphs.ir import OpGraph
from graphs.ops import home_bytes, param_owners
from graphs.schema import check_int

FORMAT = "placer-placement/1"
#: The largest number of microbatches a plan may ask for (a sanity bound on the expanded graph).
MAX_MICROBATCHES = 1024
#: When the optimizer steps parameters homed apart from their ops (:attr:`Placement.host_step`).
HOST_STEPS = ("after", "backward")
#: How the runtime copies homed parameters for the backward (:attr:`Placement.home_copies`).
HOME_COPIES = ("keep-last", "again")
#: The schedules a plan across processes may name (:mod:`envs.real.distributed.schedules` says what each runs).
SCHEDULES = ("gpipe", "1f1b", "looped_bfs", "interleaved_1f1b", "interleaved_zb", "zbv", "dualpipev", "planned")


@dataclass(eq=False)
class Placement:
    """A device for every op of a graph.

    Attributes:
        assignment: op name -> logical device name (``"gpu:0"``).
        graph_hash: content hash of the graph it was made for.
        devices: the cluster's device list it was made for.
        cluster: the cluster's name, for the record.
        method: what produced it (``"single"``, ``"rl:seq2seq"``...).
        meta: anything else (step time found, seed...).
        order: the issue order, op indices (into the graph's ops) in the order the
            runtime issues them, a topological order of the graph; ``None``: node order.
            Checked against the graph by :func:`check_order`.
        microbatches: M, the number of microbatches one step runs through the placement
            (split along the batch, gradients accumulated, one optimizer step, issued
            fill-drain); 1 (default): the whole batch at once. See :mod:`envs.microbatch`.
        inflight: W, the most microbatches whose backward has not run yet: fewer than
            M issues one-forward-one-backward (:func:`envs.microbatch.issue_segments`),
            which bounds activation memory to W microbatches; ``None`` (default, and
            what W = M is stored as): fill-drain.
        param_homes: parameter name -> the logical device it lives on with its gradient and optimizer state,
            where that is not its owner op's device (the owner: its first reader, :func:`graphs.ops.param_owners`):
            the runtime copies it to its op's device ahead of use and sends the gradient home
            (:mod:`envs.real.homes`), the simulator charges both (:mod:`envs.sim.homes`). Empty (default): every
            parameter on its owner's device. Per op: :meth:`home_indices`.
        schedule: across processes, the pipeline schedule that runs the plan (one of
            :data:`SCHEDULES`); ``None`` (default): the one that fits its stages and window.
        checkpoint: module paths (``OpGraph.module_paths``, e.g. ``"layers.3"``) whose activations are not kept
            for the backward but computed again right before it (activation checkpointing, per block): the
            runtime wraps each block's ops in :func:`torch.utils.checkpoint.checkpoint`
            (:mod:`envs.real.checkpointing`), the simulator charges the second forward and the memory it saves
            (:mod:`envs.sim.checkpointing`). Empty (default): every activation kept. Per op:
            :meth:`checkpoint_blocks`.
        stage_cuts: across processes, the ops (names) at which a new pipeline stage begins although the device does
            not change: two consecutive stages on one rank, as torch's V schedule (``zbv``) runs them
            (:func:`envs.real.distributed.cut.cut_stages`). Empty (default): a stage is each maximal run of ops on
            one device. Ignored in one process, where ops on one device are not split.
        host_step: when the optimizer steps the parameters homed apart from their ops (:data:`HOST_STEPS`):
            ``"after"`` (default), in the optimizer's ``step()`` after ``backward()`` returns, as for every other
            parameter (FSDP2's and ZeRO-Offload's offload do this); ``"backward"``, each as soon as its gradient is
            home, during the backward, on a host thread while the GPU goes on with the backward
            (:func:`placer.apply.step_in_backward` registers the optimizer; the simulator charges it,
            :mod:`envs.sim.homes`). Ignored without homes.
        home_copies: how the copies of homed parameters are made for the backward (:data:`HOME_COPIES`):
            ``"keep-last"`` (default), the forward's last two readers per device keep their copies for it and the
            others' are made again; ``"again"``, every copy is made again, as placer did before 2026-12-06 (a plan
            file with homes and without this field was planned so, and runs so). Ignored without homes.
        source: the file it was loaded from, for error messages (not saved).
    """

    assignment: dict[str, str]
    graph_hash: str
    devices: list[str]
    cluster: str = ""
    method: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    order: np.ndarray | None = None
    source: str = field(default="", repr=False)
    microbatches: int = 1
    inflight: int | None = None
    param_homes: dict[str, str] = field(default_factory=dict)
    schedule: str | None = None
    checkpoint: list[str] = field(default_factory=list)
    stage_cuts: list[str] = field(default_factory=list)
    host_step: str = "after"
    home_copies: str = "keep-last"

    def __post_init__(self) -> None:
        self.host_step = check_host_step(self.host_step, self.source or "placement")
        self.home_copies = check_home_copies(self.home_copies, self.source or "placement")
        self.microbatches = check_microbatches(self.microbatches, f"{self.source or 'placement'}: microbatches")
        self.schedule = check_schedule_name(self.schedule, f"{self.source or 'placement'}: schedule")
        W = check_inflight(self.inflight, self.microbatches, f"{self.source or 'placement'}: inflight")
        self.inflight = None if W == self.microbatches else W
        if self.order is not None:
            # a permutation here; its length and edges are checked against the graph where it is used,
            # after the assignment (so a placement missing an op is reported as that)
            self.order = check_order(
                self.order,
                len(self.order) if hasattr(self.order, "__len__") else len(self.assignment),
                source=f"{self.source or 'placement'}: order",
            )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Placement):
            return NotImplemented
        same_order = (self.order is None) == (other.order is None) and (
            self.order is None or np.array_equal(self.order, other.order)
        )
        return same_order and (
            self.assignment,
            self.graph_hash,
            self.devices,
            self.cluster,
            self.method,
            self.meta,
            self.microbatches,
            self.inflight,
            self.param_homes,
            self.schedule,
            self.checkpoint,
            self.stage_cuts,
            self.host_step,
            self.home_copies,
        ) == (
            other.assignment,
            other.graph_hash,
            other.devices,
            other.cluster,
            other.method,
            other.meta,
            other.microbatches,
            other.inflight,
            other.param_homes,
            other.schedule,
            other.checkpoint,
            other.stage_cuts,
            other.host_step,
            other.home_copies,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, like a dataclass with eq

    @classmethod
    def from_indices(
        cls,
        graph: OpGraph,
        devices: Sequence[str],
        op_devices: Sequence[int] | np.ndarray,
        *,
        cluster: str = "",
        method: str = "",
        meta: dict | None = None,
        order: Sequence[int] | np.ndarray | None = None,
        microbatches: int = 1,
        inflight: int | None = None,
        homes: Sequence[int] | np.ndarray | None = None,
        schedule: str | None = None,
        stage_starts: Sequence[int] | np.ndarray = (),
        host_step: str = "after",
    ) -> "Placement":
        """Device ``devices[indices[i]]`` for op ``i``; ``order``: issue order (op indices), checked against
        ``graph``; ``homes``: per op, the device index its parameters live on, -1 for its own device (see
        :meth:`home_indices`); ``stage_starts``: op indices at which a stage begins on the same device
        (``stage_cuts``); ``host_step``: when homed parameters are stepped (:attr:`host_step`)."""
        idx = np.asarray(op_devices).tolist()
        if len(idx) != graph.num_ops:
            raise PlacerError(f"placement: {len(idx)} devices for {graph.num_ops} ops")
        devs = list(devices)
        return cls(
            assignment={name: devs[d] for name, d in zip(graph.names, idx)},
            graph_hash=graph.content_hash,
            devices=devs,
            cluster=cluster,
            method=method,
            meta=dict(meta or {}),
            order=None if order is None else check_order(order, graph, source="placement: order"),
            microbatches=microbatches,
            inflight=inflight,
            param_homes={} if homes is None else homes_by_name(graph, devs, homes),
            schedule=schedule,
            stage_cuts=[graph.names[int(i)] for i in np.asarray(stage_starts, dtype=np.int64).tolist()],
            host_step=host_step,
        )

    def indices(self, graph: OpGraph, devices: Sequence[str] | None = None, *, source: str = "placement") -> np.ndarray:
        """Device index of each op of ``graph`` (checks the hash, missing ops, unknown devices)."""
        return as_indices(self, graph, list(devices) if devices is not None else self.devices, source=source)

    def issue_order(self, graph: OpGraph) -> np.ndarray | None:
        """The issue order checked against ``graph`` (topological), or ``None`` for node order."""
        if self.order is None:
            return None
        source = self.source or "placement"
        if self.graph_hash and self.graph_hash != graph.content_hash:
            raise PlacerError(
                f"{source}: made for graph {self.graph_hash}, not for this graph ({graph.name or 'graph'} "
                f"{graph.content_hash}){hash_seed_hint()}"
            )
        return check_order(self.order, graph, source=f"{source}: order")

    def home_indices(self, graph: OpGraph, devices: Sequence[str] | None = None) -> np.ndarray:
        """Per op of ``graph``, the index (into ``devices``, default the plan's) of the device its parameters live
        on, -1 where that is its own device (no home named, or the one named is the op's).

        Raises :class:`PlacerError` for a name no op of ``graph`` reads, an unknown device, or an op whose
        parameters were given different homes (homes are decided per owner op).
        """
        source = self.source or "placement"
        devs = list(devices) if devices is not None else self.devices
        out = np.full(graph.num_ops, -1, dtype=np.int32)
        if not self.param_homes:
            return out
        index = {d: i for i, d in enumerate(devs)}
        owners = param_owners(graph)
        op_devices = self.indices(graph, devs, source=source)
        homes_of: dict[int, set[int]] = {}
        for name, device in self.param_homes.items():
            if name not in owners:
                raise PlacerError(f"{source}: param_homes names {name!r}, which no op of the graph reads")
            if device not in index:
                raise PlacerError(f"{source}: param_homes puts {name!r} on unknown device {device!r}")
            i, home = owners[name], index[device]
            homes_of.setdefault(i, set()).add(-1 if home == op_devices[i] else home)
        for name, i in owners.items():  # a name left out lives on its op's device
            if i in homes_of and name not in self.param_homes:
                homes_of[i].add(-1)
        for i, homes in homes_of.items():
            if len(homes) > 1:
                raise PlacerError(
                    f"{source}: param_homes gives the tensors op {graph.names[i]!r} reads first different homes "
                    f"({', '.join(n for n, j in owners.items() if j == i)}): give them one"
                )
            out[i] = homes.pop()
        return out

    def stage_starts(self, graph: OpGraph) -> np.ndarray:
        """The op indices of ``graph`` named by ``stage_cuts`` (raises :class:`PlacerError` for a name not in it)."""
        if not self.stage_cuts:
            return np.zeros(0, dtype=np.int64)
        index = {name: i for i, name in enumerate(graph.names)}
        missing = [name for name in self.stage_cuts if name not in index]
        if missing:
            which = f"graph {graph.name}" if graph.name else "the graph"
            raise PlacerError(
                f"{self.source or 'placement'}: stage_cuts names op {missing[0]!r}, which {which} does not have"
            )
        return np.array([index[name] for name in self.stage_cuts], dtype=np.int64)

    def homed_bytes(self, graph: OpGraph) -> float:
        """Bytes of ``graph``'s parameters that live apart from their ops (``param_homes``, :meth:`home_indices`):
        trainable, and frozen ones an op owns alone (:func:`graphs.ops.home_bytes`)."""
        return float(home_bytes(graph)[self.home_indices(graph) >= 0].sum()) if self.param_homes else 0.0

    def checkpoint_blocks(self, graph: OpGraph) -> np.ndarray:
        """Per op of ``graph``, the block it is checkpointed in (``checkpoint``): the index of the block's first op,
        -1 for an op in none. An op is in a block when its module path is the block's or below it.

        Raises :class:`PlacerError` for a path no op of ``graph`` runs in, and for two blocks one inside the other.
        """
        return checkpoint_blocks(graph, self.checkpoint, self.source or "placement")

    def devices_used(self) -> set[str]:
        """The devices its ops run on and its parameters live on (``param_homes``)."""
        return set(self.assignment.values()) | set(self.param_homes.values())

    def device_counts(self) -> dict[str, int]:
        return dict(Counter(self.assignment.values()))

    # ------------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        doc = {
            "format": FORMAT,
            "graph_hash": self.graph_hash,
            "cluster": self.cluster,
            "devices": self.devices,
            "method": self.method,
            "meta": self.meta,
            "assignment": self.assignment,
        }
        # The order is saved as op indices, not names: the file is tied to one graph by
        # graph_hash, which fixes its op numbering, so an index names an op exactly; the
        # indices are what schedulers and the simulator use (no graph needed to read them
        # back), a file can be checked for a permutation before its graph is at hand, and
        # every name is already written once, in "assignment". Absent: node order.
        if self.order is not None:
            doc["order"] = [int(i) for i in self.order]
        # Absent: 1 (the whole batch at once), so files of unpipelined plans read as before.
        if self.microbatches != 1:
            doc["microbatches"] = int(self.microbatches)
        # Absent: M (fill-drain).
        if self.inflight is not None:
            doc["inflight"] = int(self.inflight)
        # Absent: every parameter on its owner op's device.
        if self.param_homes:
            doc["param_homes"] = dict(self.param_homes)
        # Absent: the schedule that fits the plan, so files written before schedules read as before.
        if self.schedule is not None:
            doc["schedule"] = self.schedule
        # Absent: no activation checkpointing.
        if self.checkpoint:
            doc["checkpoint"] = list(self.checkpoint)
        # Absent: a stage is each maximal run of ops on one device.
        if self.stage_cuts:
            doc["stage_cuts"] = list(self.stage_cuts)
        # Absent: "after" (the optimizer's step after the backward), so files written before it read as before.
        if self.host_step != "after":
            doc["host_step"] = self.host_step
        # With homes, always: a file with homes and without it was planned for copies all made again ("again").
        if self.param_homes:
            doc["home_copies"] = self.home_copies
        return doc

    def save(self, path: str | os.PathLike) -> None:
        write_text_atomic(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Placement":
        placement = read_document(path, cls.from_dict)
        placement.source = os.fspath(path)
        return placement

    @classmethod
    def from_dict(cls, doc: Any, *, source: str = "placement") -> "Placement":
        """Build from a parsed placer-placement/1 document; field types are checked by :mod:`graphs.schema`."""
        schema.document(doc, source, FORMAT)
        a = doc.get("assignment")
        if not isinstance(a, dict) or not set(map(type, a.values())) <= {str}:
            raise PlacerError(f"{source}: 'assignment' must map op names to device names")
        devices = schema.strings(doc.get("devices"), source, "devices")
        unknown = sorted(set(a.values()) - set(devices))
        if unknown:
            raise PlacerError(f"{source}: assignment uses device {unknown[0]!r}, not in its device list {devices}")
        M = schema.integer(doc.get("microbatches", 1), source, "microbatches", minimum=1, maximum=MAX_MICROBATCHES)
        return cls(
            assignment=a,
            graph_hash=schema.string(doc.get("graph_hash", ""), source, "graph_hash"),
            devices=devices,
            cluster=schema.string(doc.get("cluster", ""), source, "cluster"),
            method=schema.string(doc.get("method", ""), source, "method"),
            meta=_check_meta(doc.get("meta", {}), source),
            order=None
            if doc.get("order") is None
            else check_order(
                doc["order"],
                len(doc["order"]) if isinstance(doc["order"], list) else len(a),
                source=f"{source}: 'order'",
            ),
            microbatches=M,
            inflight=None
            if doc.get("inflight") is None
            else schema.integer(doc["inflight"], source, "inflight", minimum=1, maximum=M),
            param_homes=_check_homes(doc.get("param_homes", {}), devices, source),
            schedule=None
            if doc.get("schedule") is None
            else check_schedule_name(schema.string(doc["schedule"], source, "schedule"), f"{source}: 'schedule'"),
            checkpoint=schema.strings(doc.get("checkpoint", []), source, "checkpoint"),
            stage_cuts=schema.strings(doc.get("stage_cuts", []), source, "stage_cuts"),
            host_step=check_host_step(schema.string(doc.get("host_step", "after"), source, "host_step"), source),
            home_copies=check_home_copies(
                schema.string(
                    doc.get("home_copies", "again" if doc.get("param_homes") else "keep-last"), source, "home_copies"
                ),
                source,
            ),
        )


def keeps_last_copies(placement: Any) -> bool:
    """Whether ``placement`` (a :class:`Placement`, or a vector or mapping: a new plan) keeps the forward's last home
    copies for the backward (:attr:`Placement.home_copies` "keep-last")."""
    return getattr(placement, "home_copies", "keep-last") == "keep-last"


def check_home_copies(value: Any, source: str) -> str:
    """``value`` where it is one of :data:`HOME_COPIES` (a plan's ``home_copies``), else a :class:`PlacerError` naming
    ``source``."""
    if value not in HOME_COPIES:
        raise PlacerError(f"{source}: home_copies {value!r}: one of {', '.join(HOME_COPIES)}")
    return value


def check_host_step(value: Any, source: str) -> str:
    """``value`` where it is one of :data:`HOST_STEPS` (a plan's ``host_step``), else a :class:`PlacerError` naming
    ``source``."""
    if value not in HOST_STEPS:
        raise PlacerError(f"{source}: host_step {value!r}: one of {', '.join(HOST_STEPS)}")
    return value


def faster_host_step(step_s: Callable[[str], float]) -> tuple[str, dict[str, float]]:
    """The one of :data:`HOST_STEPS` whose ``step_s(way)`` is the least (ties: "after", no worker to run), and each
    way's seconds: how a plan of ``host_step`` "auto" is settled.

    >>> faster_host_step({"after": 2.0, "backward": 1.5}.get)
    ('backward', {'after': 2.0, 'backward': 1.5})
    """
    times = {way: float(step_s(way)) for way in HOST_STEPS}
    return min(HOST_STEPS, key=lambda way: (times[way], way != "after")), times


def _check_homes(homes: Any, devices: list[str], source: str) -> dict[str, str]:
    """``param_homes``: an object of parameter name -> a device of the plan's device list."""
    homes = schema.obj(homes, source, "param_homes")
    for name, device in homes.items():
        schema.string(device, source, f"param_homes.{name}")
        if device not in devices:
            raise PlacerError(f"{source}: param_homes puts {name!r} on {device!r}, not in its device list {devices}")
    return dict(homes)


def in_module(path: str, block: str) -> bool:
    """Whether an op at module ``path`` runs inside module ``block`` (the same path, or one below it).

    >>> in_module("layers.3.attn", "layers.3"), in_module("layers.30", "layers.3"), in_module("x", "")
    (True, False, False)
    """
    return bool(block) and (path == block or path.startswith(block + "."))


def checkpoint_blocks(graph: OpGraph, blocks: Sequence[str], source: str = "placement") -> np.ndarray:
    """Per op of ``graph``, the index of the first op of its checkpointed block among ``blocks`` (module paths), -1
    for an op in none (see :attr:`Placement.checkpoint`)."""
    out = np.full(graph.num_ops, -1, dtype=np.int64)
    paths = graph.module_paths
    twice = sorted({b for b in blocks if list(blocks).count(b) > 1})
    if twice:
        raise PlacerError(f"{source}: checkpoint names module {twice[0]!r} twice")
    for block in blocks:
        ops = [i for i, path in enumerate(paths) if in_module(path, block)]
        if not ops:
            raise PlacerError(f"{source}: checkpoint names module {block!r}, which runs no op of the graph")
        inside = out[ops]
        if (inside >= 0).any():
            other = next(b for b in blocks if b != block and in_module(paths[int(ops[np.argmax(inside >= 0)])], b))
            raise PlacerError(f"{source}: checkpoint names {block!r} and {other!r}, one inside the other: give one")
        out[ops] = ops[0]
    return out


def homes_by_name(graph: OpGraph, devices: Sequence[str], homes: Sequence[int] | np.ndarray) -> dict[str, str]:
    """``param_homes`` of per-op homes (a device index per op, -1: its own device): every name an op owns.

    >>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)], param_bytes=[8, 8])
    >>> g.params = [["w", "b"], ["w", "v"]]
    >>> homes_by_name(g, ["cpu:0", "gpu:0"], [0, 0])
    {'w': 'cpu:0', 'b': 'cpu:0', 'v': 'cpu:0'}
    """
    homes = np.asarray(homes, dtype=np.int64)
    if homes.shape != (graph.num_ops,):
        raise PlacerError(f"homes: {homes.shape[0] if homes.ndim else 0} entries for {graph.num_ops} ops")
    if homes.size and (homes.min() < -1 or homes.max() >= len(devices)):
        raise PlacerError(f"homes: device index out of range [-1, {len(devices)})")
    return {name: devices[homes[i]] for name, i in param_owners(graph).items() if homes[i] >= 0}


def _check_meta(meta: Any, source: str) -> dict[str, Any]:
    """``meta``: an object; the keys placer reads back (train's resume) have their types."""
    meta = dict(schema.obj(meta, source, "meta"))
    if "step_time_s" in meta:  # inf for a placement that failed: written as Infinity
        schema.number(meta["step_time_s"], source, "meta.step_time_s", minimum=0.0, finite=False)
    if "found_by" in meta:
        schema.string(meta["found_by"], source, "meta.found_by")
    if "iteration" in meta:
        schema.integer(meta["iteration"], source, "meta.iteration", minimum=-1)
    return meta


# ------------------------------------------------------------------ the parts
def as_indices(placement: Any, graph: OpGraph, device_names: Sequence[str], *, source: str = "placement") -> np.ndarray:
    """The placement vector of anything placement-like: the device index (into ``device_names``) of every op, int32.

    Accepts a numpy array or sequence of ints (a device index per op, in graph
    order); a mapping op name -> logical device name; or a :class:`Placement` (any
    object with an ``assignment`` mapping, and optionally ``graph_hash``, which must
    match the graph). Every scorer takes placements through here.

    >>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)])
    >>> as_indices({"a": "gpu:0", "b": "cpu:0"}, g, ["cpu:0", "gpu:0"]).tolist()
    [1, 0]
    """
    n = graph.num_ops
    if isinstance(placement, np.ndarray) or (isinstance(placement, Sequence) and not isinstance(placement, str)):
        arr = np.asarray(placement)
        if arr.shape != (n,):
            raise PlacerError(f"{source}: has {arr.shape} entries, graph {graph.name or ''} has {n} ops")
        if n and (arr.min() < 0 or arr.max() >= len(device_names)):
            raise PlacerError(f"{source}: device index out of range [0, {len(device_names)})")
        return arr.astype(np.int32, copy=False)
    graph_hash = getattr(placement, "graph_hash", None)
    if graph_hash and graph_hash != graph.content_hash:
        raise PlacerError(
            f"{source}: made for graph {graph_hash}, not for this graph ({graph.name or 'graph'} {graph.content_hash})"
            f"{hash_seed_hint()}"
        )
    mapping = getattr(placement, "assignment", placement)
    if not isinstance(mapping, Mapping):
        raise PlacerError(f"{source}: expected an array of device indices, a name->device mapping or a Placement")
    dev_index = {d: i for i, d in enumerate(device_names)}
    out = np.empty(n, dtype=np.int32)
    missing = []
    for i, name in enumerate(graph.names):
        dev = mapping.get(name)
        if dev is None:
            missing.append(name)
            continue
        j = dev_index.get(dev)
        if j is None:
            raise PlacerError(
                f"{source}: op {name!r} is placed on unknown device {dev!r} (cluster has {', '.join(device_names)})"
            )
        out[i] = j
    if missing:
        raise PlacerError(f"{source}: {len(missing)} ops have no device, e.g. {missing[0]!r}")
    if len(mapping) > n:
        extra = next(k for k in mapping if k not in graph.index)
        raise PlacerError(f"{source}: names op {extra!r}, which is not in the graph")
    return out


def check_order(order: Any, graph: OpGraph | int, *, source: str = "order") -> np.ndarray:
    """An issue order checked against ``graph``: the op indices, as int32, in issue order.

    The one validation of issue orders (placements, ``placer.apply``, the simulator).
    ``order`` must be a 1-D sequence of integers (not bools or floats) naming every op
    of ``graph`` exactly once, with each op after all of its inputs (a topological
    order of ``graph``'s edges). ``graph`` may also be a number of ops: then every
    check but the edges is made (a placement read from a file, before its graph is
    known). Raises :class:`PlacerError` with one line starting with ``source``.

    >>> g = OpGraph.from_edges(["a", "b", "c"], [("a", "c", 4)])
    >>> check_order([1, 0, 2], g).tolist()
    [1, 0, 2]
    >>> check_order([2, 0, 1], g)
    Traceback (most recent call last):
    ...
    graphs.errors.PlacerError: order: op 'c' (2) is issued before its input 'a' (0)
    """
    n = graph if isinstance(graph, int) else graph.num_ops
    if isinstance(order, np.ndarray):
        arr = order
    elif isinstance(order, Sequence) and not isinstance(order, (str, bytes)):
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in order):
            bad = next(v for v in order if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)))
            raise PlacerError(f"{source}: must be a list of op indices, found {bad!r}")
        arr = np.asarray(order, dtype=np.int64) if len(order) else np.zeros(0, dtype=np.int64)
    else:
        raise PlacerError(f"{source}: must be a list of op indices, not {type(order).__name__}")
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise PlacerError(f"{source}: must be a 1-D array of op indices, got shape {arr.shape} of {arr.dtype}")
    if arr.shape[0] != n:
        raise PlacerError(f"{source}: has {arr.shape[0]} entries for {n} ops")
    if n and (arr.min() < 0 or arr.max() >= n):
        bad = int(arr[(arr < 0) | (arr >= n)][0])
        raise PlacerError(f"{source}: op index {bad} out of range [0, {n})")
    pos = np.full(n, -1, dtype=np.int64)
    pos[arr] = np.arange(n)
    if (pos < 0).any():
        missing = int(np.flatnonzero(pos < 0)[0])
        dup = int(arr[np.flatnonzero(np.bincount(arr, minlength=n)[arr] > 1)[0]])
        raise PlacerError(f"{source}: not a permutation of the ops: op {dup} appears twice, op {missing} never")
    if not isinstance(graph, int) and graph.num_edges:
        late = np.flatnonzero(pos[graph.edge_src] > pos[graph.edge_dst])
        if late.size:
            s, d = int(graph.edge_src[late[0]]), int(graph.edge_dst[late[0]])
            raise PlacerError(
                f"{source}: op {graph.names[d]!r} ({d}) is issued before its input {graph.names[s]!r} ({s})"
            )
    return arr.astype(np.int32, copy=False)


def single_device_rows(num_devices: int, num_ops: int) -> np.ndarray:
    """``[num_devices, num_ops]`` int32: row ``d`` places every op on device ``d``.

    >>> single_device_rows(2, 3).tolist()
    [[0, 0, 0], [1, 1, 1]]
    """
    return np.repeat(np.arange(num_devices, dtype=np.int32)[:, None], num_ops, axis=1)


def check_microbatches(value: Any, option: str = "microbatches") -> int:
    """``value`` as a number of microbatches (an int in ``[1, MAX_MICROBATCHES]``), else one-line PlacerError."""
    return check_int(value, option, least=1, most=MAX_MICROBATCHES)


def check_schedule_name(value: Any, option: str = "schedule") -> str | None:
    """``value`` as a schedule name of :data:`SCHEDULES` (or None: the one that fits), else one-line PlacerError.

    >>> check_schedule_name("dualpipe")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    graphs.errors.PlacerError: schedule: 'dualpipe' is not a schedule (gpipe, 1f1b, ..., dualpipev, planned)
    """
    if value is None or value in SCHEDULES:
        return value
    raise PlacerError(f"{option}: {value!r} is not a schedule ({', '.join(SCHEDULES)})")


def check_inflight(value: Any, microbatches: int, option: str = "inflight") -> int:
    """``value`` as an in-flight window for ``microbatches`` (an int in ``[1, M]``; None: M), else one-line
    PlacerError."""
    if value is None:
        return int(microbatches)
    return check_int(value, option, least=1, most=int(microbatches))

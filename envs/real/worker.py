"""One machine's side of the Ray measurement harness: build the model once, measure placements on it.

A :class:`Worker` runs in a Ray actor of :class:`envs.real.measured.MeasuredEnv`
(or in this process, ``bench/calibrate_sim.py --real local``): it exports the
model once, then for each placement builds the placed module
(:func:`envs.real.placing.place_module`), runs warm-up and timed training steps
(:func:`envs.real.timing.measure_steps`) and returns a :class:`envs.Result` as a
dict; a failure of the model on a placement is a result, never an exception.

Peak memory per logical device: ``torch.cuda.max_memory_allocated`` for CUDA
devices; for the CPU, how far the process's peak resident set (``VmHWM``, reset
through ``/proc/self/clear_refs`` on Linux) rose above its resident set at the
start of the measurement (0 where ``/proc`` is unavailable). Logical devices
mapped to the same torch device report that device's peak.

A ``module:callable`` SOURCE that the driver shipped (:mod:`envs.real.shipping`)
is imported from the shipped copy; otherwise with the driver's working
directory first on ``sys.path``.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from envs.real.allocator import thread_cache_off
from envs.real.placing import place_module, resolve_devices
from envs.real.shipping import shipped_root
from envs.real.timing import Protocol, adam, failure_status, measure_steps
from envs.result import Result
from graphs import PlacerError, zoo
from graphs.hash_seed import hash_seed_hint
from graphs.sources import load_callable, model_and_inputs
from graphs.torch_capture import export_program, graph_from_program

Builder = Callable[[], tuple[Any, tuple]]


def build_model(source: str | Builder, seed: int = 0, *, search_dir: str | None = None) -> tuple[Any, tuple]:
    """``(model, example_inputs)`` from a zoo name, ``module:callable`` or a callable, seeded.

    A ``module:callable`` is loaded by :func:`graphs.sources.load_callable` with
    ``search_dir`` (the driver's working directory, in a worker) first on ``sys.path``.
    """
    torch.manual_seed(seed)
    if callable(source):
        return model_and_inputs(source(), getattr(source, "__name__", "builder"))

    if source in zoo.names():
        return zoo.build(source)
    if ":" not in source:
        raise PlacerError(f"{source}: not a zoo name ({', '.join(zoo.names())}) or module:callable")
    return load_callable(source, search_dir=search_dir)


def placement_hash(assignment_list: Sequence[str], order: Sequence[str] | None = None) -> str:
    """Hash of the logical device of every op, in graph order, and of the issue order if any (16 hex chars).

    A placement without an order hashes as before, so existing logs stay valid.
    """
    doc: Any = list(assignment_list) if order is None else {"devices": list(assignment_list), "order": list(order)}
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:16]


class Worker:
    """One Ray actor: builds the exported program once, measures placements on it."""

    def __init__(
        self,
        source: str | Builder,
        device_map: Mapping[str, str] | str | None,
        threads: int,
        lr: float = 1e-3,
        source_dir: str | None = None,
        shipped: str | None = None,
        where: Callable[[], str] | None = None,
    ) -> None:
        """``source_dir``: the driver's working directory; ``shipped``: the top-level module the driver shipped
        (imported from that copy instead); ``where``: returns the id of the node this actor runs on."""
        torch.set_num_threads(max(1, threads))
        self.source, self.device_map, self.lr = source, device_map, lr
        self.source_dir, self.shipped = source_dir, shipped
        self.ep = None
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.node = where() if where is not None else socket.gethostname()

    def ready(self) -> str:
        """Answers once the actor process runs (the end of the "start" stage): the id of its node."""
        return self.node

    def prepare(self, freeze_gc: bool = False) -> str:
        """Build and export the model (once); returns its graph hash.

        ``freeze_gc`` (a process of its own, as a Ray actor is): then set aside from the garbage collector what is
        alive now (``gc.freeze``: the model, its program, every module imported), all of which lives as long as the
        process. The collection before each measurement's timed steps (:func:`envs.real.timing.no_gc`) then walks
        what the measurements made, not the whole heap: about 0.3 s a measurement with torch loaded, more than a
        small model's steps take. Not in a caller's process (:class:`envs.real.local.LocalEnv`): its objects are
        the caller's to free."""
        if self.ep is None:
            search_dir = (shipped_root(self.shipped) or self.source_dir) if self.shipped else self.source_dir
            model, inputs = build_model(self.source, search_dir=search_dir)
            self.ep = export_program(model, inputs)
            self.inputs = inputs
            self.graph_hash = graph_from_program(self.ep).content_hash
            self.snapshot = {k: v.detach().clone() for k, v in self.ep.state_dict.items()}
            self.constants = {
                k: v.detach().clone() for k, v in self.ep.constants.items() if isinstance(v, torch.Tensor)
            }
            if freeze_gc:
                del model
                gc.collect()
                gc.freeze()
        return self.graph_hash

    def _restore(self) -> None:
        with torch.no_grad():
            for k, v in self.ep.state_dict.items():
                v.copy_(self.snapshot[k])
            for k, v in self.constants.items():
                self.ep.constants[k].copy_(v)

    def _steps(
        self, module: Any, optimizer: Any, devices: Mapping[str, Any], warmup_steps: int, timed_steps: int
    ) -> dict[str, Any]:
        """The training steps of one placement (:func:`envs.real.timing.measure_steps`)."""
        return measure_steps(
            module,
            self.inputs,
            optimizer,
            devices,
            warmup_steps=warmup_steps,
            timed_steps=timed_steps,
            protocol=Protocol(),
        )  # the garbage collector kept out of the timed steps

    def measure(
        self,
        assignment: dict[str, str],
        graph_hash: str,
        warmup_steps: int,
        timed_steps: int,
        order: list[str] | None = None,
    ) -> dict[str, Any]:
        """Measure one placement; returns ``Result.to_dict()`` (never raises for a bad placement)."""
        extra: dict[str, Any] = {"worker": self.name, "node": self.node}
        try:
            if self.prepare() != graph_hash:
                return Result(
                    float("inf"),
                    "error",
                    f"worker built graph {self.graph_hash}, expected {graph_hash}{hash_seed_hint()}",
                    source="measured",
                    extra=extra,
                ).to_dict()
            self._restore()
            devices = resolve_devices(sorted(set(assignment.values())), self.device_map)
            module = place_module(self.ep, assignment, self.device_map, order=order)
            opt = adam(module.parameters(), lr=self.lr)
            m = self._steps(module, opt, devices, warmup_steps, timed_steps)
            # and whether this process runs with glibc's thread cache off (envs.real.allocator; Ray starts it so)
            extra.update(step_times_s=m["step_times_s"], losses=m["losses"], thread_cache_off=thread_cache_off())
            return Result(m["step_time_s"], "ok", peak_bytes=m["peak_bytes"], source="measured", extra=extra).to_dict()
        except Exception as e:  # any failure of the user's model on this placement is a result
            status = failure_status(e)
            message = (
                f"out of memory: {type(e).__name__}: {one_line(e)}"
                if status == "oom"
                else f"{type(e).__name__}: {one_line(e)}"
            )
            return Result(float("inf"), status, message, source="measured", extra=extra).to_dict()
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def one_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:300]

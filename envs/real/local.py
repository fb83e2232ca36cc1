"""Score placements by real training steps in this process: the Ray worker's code, without Ray.

:class:`LocalEnv` has the scorer protocol of :class:`envs.SimEnv` and
:class:`envs.real.measured.MeasuredEnv` (``evaluate(placements) -> list[Result]``,
``step_times(op_devices)``), for a machine without Ray (the lent GPU machines
have none) or a run that wants its measurements in the process that learns.
It builds one :class:`envs.real.worker.Worker` here and asks it to measure each
placement, exactly as a Ray actor would: the worker exports the model once,
builds the module :func:`placer.apply` builds, restores the initial weights,
runs ``warmup_steps`` then ``timed_steps`` Adam steps (CUDA synchronised) and
reports the median step time and the peak memory per logical device.

Every measurement is used once: results are cached by placement hash (the
devices and the issue order, :func:`envs.real.measure_log.placement_key`) and
appended to ``run_dir/measurements.jsonl`` as each arrives (flushed and
fsynced, the Ray path's log format), so a run killed mid-way loses no
measurement already taken and a rerun on the same ``run_dir`` measures only
what is not there yet. Either env reads the other's log.

Memory caps: with ``cap_memory`` (the default) each CUDA device that the
cluster's logical GPUs map to is limited for real to the memory the cluster
file gives them (``torch.cuda.set_per_process_memory_fraction``), so a
placement the cluster says does not fit runs out of memory here too, as it
would on a device of that size. The cap holds for the whole process.

A measurement is limited to ``measure_timeout_s`` by ``SIGALRM``
(:func:`envs.real.timing.time_limit`: the main thread only, and a kernel that
never returns is not interrupted); past it the placement's result is
``"timeout"``.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from envs.real.measure_log import LOG_NAME, RecordedMeasurements, placement_key, read_log
from envs.real.placing import check_available, resolve_devices
from envs.real.timing import StepTimeout, check_timeout, time_limit
from envs.real.worker import Builder, Worker
from envs.result import Result
from graphs import OpGraph, PlacerError
from graphs.torch_capture import graph_from_program


def cuda_caps(cluster: Any, device_map: Mapping[str, str] | str | None) -> dict[torch.device, int]:
    """Memory cap in bytes of each CUDA device the cluster's logical GPUs map to: the sum of their capacities.

    >>> import envs
    >>> cuda_caps(envs.resolve_cluster("k80x2"), "*=cpu")
    {}
    """
    caps: dict[torch.device, int] = {}
    devices = resolve_devices(cluster.device_names, device_map)
    for d, name in enumerate(cluster.device_names):
        torch_device = devices[name]
        if torch_device.type == "cuda":
            torch_device = torch.device("cuda", torch_device.index or 0)
            caps[torch_device] = caps.get(torch_device, 0) + int(cluster.memory_bytes[d])
    return caps


def cap_cuda_memory(caps: Mapping[torch.device, int]) -> dict[str, float]:
    """Limit each CUDA device to its cap for this process; returns the fraction set per device.

    Raises :class:`PlacerError` if a device is missing.
    """
    fractions: dict[str, float] = {}
    for torch_device, cap_bytes in caps.items():
        check_available({str(torch_device): torch_device})
        total = torch.cuda.get_device_properties(torch_device).total_memory
        fractions[str(torch_device)] = min(1.0, cap_bytes / total)
        torch.cuda.set_per_process_memory_fraction(fractions[str(torch_device)], torch_device)
    return fractions


class LocalEnv(RecordedMeasurements):
    """Scores placements by real training steps in this process (see the module doc).

    Args:
        source: a zoo name, ``module:callable`` or callable returning ``(model,
            example_inputs)``; built once, seeded (:func:`envs.real.worker.build_model`).
        cluster: the :class:`envs.Cluster` whose logical devices placements use.
        graph: the graph placements refer to (default: the one the worker exports;
            a graph of another program makes every result an ``"error"``).
        device_map: logical -> torch device (:func:`envs.real.placing.resolve_devices`).
        warmup_steps, timed_steps: training steps per placement, discarded / timed.
        measure_timeout_s: wall seconds one placement's measurement may take.
        run_dir: directory of ``measurements.jsonl``; None: no log.
        lr: Adam's learning rate.
        threads: torch threads of this process (default: as they are).
        cap_memory: limit each mapped CUDA device to the cluster's memory (see the module doc).
    """

    def __init__(
        self,
        source: str | Builder,
        cluster: Any,
        *,
        graph: OpGraph | None = None,
        device_map: Mapping[str, str] | str | None = None,
        warmup_steps: int = 2,
        timed_steps: int = 5,
        measure_timeout_s: float = 600.0,
        run_dir: str | os.PathLike | None = None,
        lr: float = 1e-3,
        threads: int | None = None,
        cap_memory: bool = True,
    ) -> None:
        if timed_steps < 1 or warmup_steps < 0:
            raise PlacerError(
                f"local env: need timed_steps >= 1 and warmup_steps >= 0, got {timed_steps}, {warmup_steps}"
            )
        self.cluster, self.device_map = cluster, device_map
        self.warmup_steps, self.timed_steps = warmup_steps, timed_steps
        self.measure_timeout_s = check_timeout(measure_timeout_s)
        self.memory_fractions = cap_cuda_memory(cuda_caps(cluster, device_map)) if cap_memory else {}
        self.worker = Worker(source, device_map, threads or torch.get_num_threads(), lr, source_dir=os.getcwd())
        graph_hash = self.worker.prepare()  # builds and exports the model once, here
        self.graph = (
            graph
            if graph is not None
            else graph_from_program(
                self.worker.ep, name=source if isinstance(source, str) else getattr(source, "__name__", "")
            )
        )
        if graph is None and self.graph.content_hash != graph_hash:
            raise PlacerError("local env: the graph of the exported program does not hash as the worker's")
        self.run_dir = os.fspath(run_dir) if run_dir is not None else None
        self.log_path = os.path.join(self.run_dir, LOG_NAME) if self.run_dir is not None else None
        self._cache: dict[str, Result] = {}
        self.measured = 0  # placements measured by this env (not read back from the log)
        if self.log_path:
            os.makedirs(self.run_dir, exist_ok=True)
            self._cache = read_log(self.log_path, self.graph.content_hash)

    def keys(self, placements: Sequence[Any]) -> list[tuple[str, dict[str, str], list[str] | None]]:
        """(placement hash, op name -> device, op names in issue order or None) of each placement, checked."""
        names = list(self.cluster.device_names)
        return [placement_key(p, self.graph, names, f"placement {k}") for k, p in enumerate(placements)]

    def evaluate(self, placements: Sequence[Any], *, again: bool = False) -> list[Result]:
        """Measure each placement (those measured or logged before are not measured again; ``again``: every one
        is measured anew, and these results are returned and logged as re-measurements, the cache keeping the first)."""
        keyed = self.keys(placements)
        self._begin(again)
        for key, assignment, order in keyed:
            if key not in self._cache or (again and key not in self._again):
                self._record(key, self._measure(assignment, order))
        return self._results([key for key, _, _ in keyed])

    def logged(self, placements: Sequence[Any]) -> list[Result | None]:
        """What each placement measured (here or in the log read at start), None where it is not measured yet."""
        return [self._cache.get(key) for key, _, _ in self.keys(placements)]

    def _measure(self, assignment: dict[str, str], order: list[str] | None) -> Result:
        try:
            with time_limit(self.measure_timeout_s):
                doc = self.worker.measure(
                    assignment, self.graph.content_hash, self.warmup_steps, self.timed_steps, order
                )
            result = Result.from_dict(doc)
        except StepTimeout:  # the alarm rang after measure() had caught everything it could
            result = Result(
                float("inf"), "timeout", f"measurement ran past {self.measure_timeout_s:g}s", source="measured"
            )
        finally:
            gc.collect()  # the placed module and its optimizer state, before the next placement
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        self.measured += 1
        return result

    def close(self) -> None:
        """Drop the worker's model (the memory caps stay: they are the process's)."""
        self.worker = None
        gc.collect()

    def __enter__(self) -> "LocalEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["LocalEnv", "cap_cuda_memory", "cuda_caps"]

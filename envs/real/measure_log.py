"""The measured env's log: every measurement, one JSON line each, appended as it arrives.

``run_dir/measurements.jsonl`` holds one record per line: ``graph_hash``,
``placement_hash`` (:func:`envs.real.worker.placement_hash`), ``time_unix`` and
the :class:`envs.Result` as a dict. Each record is flushed and fsynced before the
next measurement is handed out, so a run killed at any point (or a worker's node
that leaves the cluster) loses no measurement already taken, and a resumed run
reads them back instead of measuring again.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from envs.real.homes import homes_apart
from envs.real.worker import placement_hash
from envs.result import Result
from graphs import OpGraph, PlacerError
from graphs.plan import as_indices, check_order

LOG_NAME = "measurements.jsonl"


def placement_key(
    placement: Any, graph: OpGraph, device_names: list[str], source: str
) -> tuple[str, dict[str, str], list[str] | None]:
    """(placement hash, op name -> device, op names in issue order or None) of a placement, checked against the
    graph. A plan whose parameters live apart from their ops (``param_homes``) or that checkpoints blocks
    (``checkpoint``) is refused: the measured envs place ops only, and would run it as its op placement alone
    (``placer run`` and :func:`placer.apply` run both)."""
    if homes_apart(placement, graph):
        raise PlacerError(
            f"{source}: parameter homes apart from their ops are run by placer run (one process) and placer.apply, "
            "not by the measured envs"
        )
    if getattr(placement, "checkpoint", None):
        raise PlacerError(
            f"{source}: checkpointed blocks are run by placer run (one process) and placer.apply, not by the "
            "measured envs"
        )
    op_devices = as_indices(placement, graph, device_names, source=source)
    devices = [device_names[i] for i in op_devices.tolist()]
    order = getattr(placement, "order", None)
    if order is not None:
        order = [graph.names[i] for i in check_order(order, graph, source=f"{source}: order").tolist()]
    return placement_hash(devices, order), dict(zip(graph.names, devices)), order


def append_record(path: str, graph_hash: str, key: str, result: Result, *, again: bool = False) -> None:
    """Append the measurement of placement ``key`` (flushed and fsynced); ``again``: a re-measurement of a
    placement already measured, kept in the log but not read back as its result (:func:`read_log`)."""
    record = {"graph_hash": graph_hash, "placement_hash": key, "time_unix": time.time(), "result": result.to_dict()}
    append_log_line(path, json.dumps({**record, "again": True} if again else record))


def append_log_line(path: str, line: str) -> None:
    """Append one record to the log (flushed and fsynced), first ending a torn last line of a killed run,
    so that the new record never joins it."""
    with open(path, "ab+") as f:  # writes go to the end whatever the read position
        if f.seek(0, os.SEEK_END) > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")
        f.write(line.encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())


def read_log(path: str, graph_hash: str) -> dict[str, Result]:
    """Placement hash -> Result of every logged measurement of ``graph_hash``.

    Unreadable lines (a torn line of a killed run) are skipped and counted in one warning on stderr.
    """
    out: dict[str, Result] = {}
    if not os.path.exists(path):
        return out
    skipped = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if rec.get("graph_hash") == graph_hash and not rec.get("again"):
                    out[rec["placement_hash"]] = Result.from_dict(rec["result"])
            except (ValueError, KeyError, TypeError, AttributeError):
                skipped += 1  # the run was killed mid-write, or the line is not a record
    if skipped:
        print(f"placer: warning: {path}: skipped {skipped} unreadable line(s)", file=sys.stderr)
    return out


__all__ = ["LOG_NAME", "append_log_line", "append_record", "placement_key", "read_log"]


class RecordedMeasurements:
    """What both measured envs share: each result cached by placement key and appended to the log.

    A subclass sets ``graph``, ``log_path`` (or None: no log) and ``_cache`` (key ->
    :class:`envs.Result`), and implements ``evaluate(placements, again=False)``. With ``again`` every
    placement is measured anew, cached or not: the results of that call are its own (``_again``), logged
    as re-measurements, and the cache keeps each placement's first result.
    """

    graph: OpGraph
    log_path: str | None
    _cache: dict[str, Result]
    _again: dict[str, Result] | None = None  # during evaluate(again=True): that call's results

    def _record(self, key: str, result: Result) -> None:
        again = self._again is not None and key in self._cache  # a placement's first result is its result
        if self._again is not None:
            self._again[key] = result
        if not again:
            self._cache[key] = result
        if self.log_path:
            append_record(self.log_path, self.graph.content_hash, key, result, again=again)

    def _begin(self, again: bool) -> None:
        self._again = {} if again else None

    def _results(self, keys: list[str]) -> list[Result]:
        """The results of this call, in order (its re-measurements where it made them); ends the call."""
        got, self._again = self._again or {}, None
        return [got[k] if k in got else self._cache[k] for k in keys]

    def step_times(self, op_devices: Any, order: Any = None) -> tuple[Any, Any]:
        """Batched ``[K, num_ops]`` placement vectors -> (step_time_s[K], failed[K]): a failed placement did not
        run (the scorer protocol, :mod:`envs.scorer`). Each is measured in node order: to measure an issue
        order, evaluate a :class:`graphs.Placement` that carries it."""
        return self._measured(op_devices, order, again=False)

    def measure_again(self, op_devices: Any) -> tuple[Any, Any]:
        """:meth:`step_times`, every row measured anew (a re-measurement; see the class doc)."""
        return self._measured(op_devices, None, again=True)

    def _measured(self, op_devices: Any, order: Any, *, again: bool) -> tuple[Any, Any]:
        import numpy as np

        if order is not None:
            raise PlacerError("a measured env measures placement vectors in node order; give order=None")
        results = self.evaluate(list(np.asarray(op_devices)), again=again)  # type: ignore[attr-defined]
        return np.array([r.step_time_s for r in results]), np.array([not r.ok for r in results])

"""The ``placer-profile/1`` document: write, read and check it.

A profile is tied to the graph hash; it holds per-op forward and backward seconds per
torch device (and, for a device profiled in context, its host issue seconds) and the
measured links (see :mod:`envs.real.profiler`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from envs.cluster import KINDS, MAX_DELAY_S, MIN_RATE
from envs.sim.order_trust import margin_of
from graphs import PlacerError, schema
from graphs.io import read_json, write_text_atomic
from graphs.ir import OPTIONAL_PROFILE_COLUMNS, PROFILE_COLUMNS

FORMAT = "placer-profile/1"


def device_kind(device: str) -> str:
    """``"cuda:0"`` -> ``"gpu"``, ``"cpu"`` -> ``"cpu"`` (the cluster's device kinds)."""
    return "gpu" if device.startswith("cuda") else "cpu"


def save_profile(profile: Mapping[str, Any], path: str | os.PathLike) -> None:
    write_text_atomic(path, json.dumps(profile, indent=1))


def load_profile(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check a ``placer-profile/1`` file; problems raise :class:`PlacerError` naming it."""
    path = os.fspath(path)
    doc = read_json(path)
    check_profile(doc, source=path)
    return doc


def check_profile(doc: Any, *, source: str = "profile") -> None:
    """Raise :class:`PlacerError` unless ``doc`` is a well-formed ``placer-profile/1`` document.

    Types are checked by :mod:`graphs.schema`: times are finite numbers >= 0 (or
    ``null``), link speeds finite with the cluster's floors (a bool or a string is
    never a number).
    """
    schema.document(doc, source, FORMAT)
    ops = doc.get("ops")
    if (
        not isinstance(ops, list)
        or not isinstance(doc.get("devices"), dict)
        or not isinstance(doc.get("links", []), list)
    ):
        raise PlacerError(f"{source}: needs 'ops' (list), 'devices' (object) and 'links' (list)")
    schema.strings(ops, source, "ops")
    for key in ("graph_hash", "host"):
        if key in doc:
            schema.string(doc[key], source, key)
    for torch_device, entry in doc["devices"].items():
        where = f"devices[{torch_device!r}]"
        schema.obj(entry, source, where)
        if entry.get("kind") is not None and schema.string(entry["kind"], source, f"{where}.kind") not in KINDS:
            raise PlacerError(f"{source}: {where}.kind is {entry['kind']!r}, expected one of {', '.join(KINDS)}")
        for col in PROFILE_COLUMNS:
            arr = entry.get(col)
            if col in OPTIONAL_PROFILE_COLUMNS and arr is None:  # devices profiled in context; --microbatches
                continue
            if not isinstance(arr, list) or len(arr) != len(ops):
                raise PlacerError(f"{source}: {where}.{col} must list one time per op ({len(ops)})")
            times = schema.column(
                [np.nan if x is None else x for x in arr], source, f"{where}.{col}", whole=False, nan_ok=True
            )
            bad = ~np.isnan(times) & ((times < 0) | (times > MAX_DELAY_S))
            if bad.any():
                k = int(np.argmax(bad))
                raise PlacerError(
                    f"{source}: {where}.{col} has a negative or non-numeric time ({where}.{col}[{k}] is "
                    f"{times[k]!r}; expected 0 to {MAX_DELAY_S:g} s)"
                )
        _check_host_entry(entry, source, where)
    if doc.get("order_trust") is not None:
        margin_of(doc["order_trust"], 1, source=f"{source}: order_trust")
    for k, link in enumerate(doc.get("links", [])):
        where = f"links[{k}]"
        schema.obj(link, source, where)
        for end in ("src", "dst"):
            schema.string(link.get(end), source, f"{where}.{end}")
        if not all(
            isinstance(link.get(key), (int, float)) and not isinstance(link.get(key), bool)
            for key in ("latency_s", "bandwidth_bytes_per_s")
        ):
            raise PlacerError(f"{source}: {where} needs non-negative latency_s and bandwidth_bytes_per_s")
        schema.number(link["latency_s"], source, f"{where}.latency_s", minimum=0.0, maximum=MAX_DELAY_S)
        schema.number(link["bandwidth_bytes_per_s"], source, f"{where}.bandwidth_bytes_per_s", minimum=MIN_RATE)


def _check_host_entry(entry: Mapping[str, Any], source: str, where: str) -> None:
    """A host device's optional ``staging`` (``latency_s``, ``bandwidth_bytes_per_s``), ``contention`` (``op``,
    ``issue``) and ``step_call`` (``call_s``), :mod:`envs.real.profiler.host`: objects of finite numbers in range,
    or absent."""
    for key, fields in (
        ("staging", {"latency_s": (0.0, MAX_DELAY_S), "bandwidth_bytes_per_s": (MIN_RATE, None)}),
        ("contention", {"op": (0.0, None), "issue": (0.0, None)}),
        ("step_call", {"call_s": (-MAX_DELAY_S, MAX_DELAY_S)}),
    ):
        if key not in entry:
            continue
        schema.obj(entry[key], source, f"{where}.{key}")
        for name, (low, high) in fields.items():
            schema.number(entry[key].get(name), source, f"{where}.{key}.{name}", minimum=low, maximum=high)

"""Toy clusters and graphs whose schedules are easy to compute by hand."""

from __future__ import annotations

import pytest

from envs.cluster import Cluster, Device, Link
from graphs import OpGraph

CPU, G0, G1 = 0, 1, 2


def toy_cluster(
    memory_bytes: float = 1e15,
    latency_s: float = 0.0,
    mem_bw_bytes_per_s: float = 1e30,
    gpu_launch_s: float = 0.0,
    step_call_s: float = 0.0,
) -> Cluster:
    """cpu:0, gpu:0, gpu:1: 1 FLOP/s, no launch cost (GPUs: ``gpu_launch_s``), links of 1 byte/s; the host worker
    stepping parameters in the backward pays ``step_call_s`` per call (``Device.step_call_s``).

    An op's forward time is its FLOPs in seconds (+ the launch cost on a GPU),
    its backward twice that, and a transfer of b bytes takes ``latency_s + b`` seconds.
    """
    devices = [
        Device(
            name,
            kind,
            memory_bytes,
            1.0,
            mem_bw_bytes_per_s,
            gpu_launch_s if kind == "gpu" else 0.0,
            step_call_s=step_call_s,
        )
        for name, kind in (("cpu:0", "cpu"), ("gpu:0", "gpu"), ("gpu:1", "gpu"))
    ]
    links = {(a.name, b.name): Link(1.0, latency_s) for a in devices for b in devices if a.name != b.name}
    return Cluster(name="toy", devices=devices, links=links)


def toy_graph(names: list[str], edges: list[tuple[str, str, int]], flops: list[float], **kw) -> OpGraph:
    return OpGraph.from_edges(names, edges, flops=flops, op_types=["aten.mm.default"] * len(names), name="toy", **kw)


@pytest.fixture
def toy():
    """The helpers above, as one fixture: ``toy.cluster(...)``, ``toy.graph(...)``."""
    import types

    return types.SimpleNamespace(cluster=toy_cluster, graph=toy_graph, CPU=CPU, G0=G0, G1=G1)

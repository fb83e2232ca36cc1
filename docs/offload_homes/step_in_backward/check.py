"""Homed parameters stepped during the backward train as stepped after it: FSDP2's offload as a plan (every op on
gpu:0, every parameter that can live apart homed on cpu:0) applied twice to a model, one stepping its homed
parameters during the backward (``placer.apply.step_in_backward``), one with torch's fused Adam after it; three
steps each, the losses and the weights compared. On CUDA this runs the worker's wait for each gradient's copy home
(an event on the copy's stream), which no CPU run does.

    PYTHONPATH=.:docs/heuristics python docs/offload_homes/step_in_backward/check.py \
        --device-map 'cpu:0=cpu,gpu:0=cuda:0'
    PYTHONPATH=.:docs/heuristics python docs/offload_homes/step_in_backward/check.py --device-map '*=cpu'
    PYTHONPATH=.:docs/heuristics python docs/offload_homes/step_in_backward/check.py --device-map '*=cpu' \
        --sources user_models:falcon,user_models:llama_tied,user_models:mamba   # outside models
"""

import argparse
import copy
import importlib
import sys
import time

import envs
import graphs
import placer
from bench.offload_homes import fsdp2_offload_plan
from envs.real.timing import adam


def run(source: str, cluster_file: str, device_map: str, host_step: str, steps: int) -> tuple[list[float], list]:
    module, name = source.split(":")
    model, inputs = getattr(importlib.import_module(module), name)()
    model = copy.deepcopy(model)
    cluster = envs.resolve_cluster(cluster_file)
    graph = graphs.capture(model, inputs)
    plan = fsdp2_offload_plan(graph, cluster)
    plan.host_step = host_step
    placed = placer.apply(model, plan, inputs, device_map=device_map)
    optimizer = adam(placed.parameters(), lr=1e-3)
    stepped = placer.apply.step_in_backward(placed, optimizer) if host_step == "backward" else 0
    losses, times = [], []
    for _ in range(steps):
        t = time.perf_counter()
        loss = placed(*inputs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
        times.append(time.perf_counter() - t)
    weights = [p.detach().cpu().clone() for p in placed.parameters()]
    print(
        f"{source} {host_step}: {len(plan.param_homes)} homed, {stepped} stepped in the backward, losses "
        f"{', '.join(f'{x:.6f}' for x in losses)}, last step {times[-1] * 1e3:.1f} ms",
        flush=True,
    )
    return losses, weights


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device-map", default="cpu:0=cpu,gpu:0=cuda:0")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--sources", default="", help="module:callable,... (default: the wide MLP and nn.Transformer)")
    args = p.parse_args()
    cases = [
        ("user_models:wide_mlp", "docs/offload_homes/step_in_backward/h200-cap128m.json"),
        ("user_models:nn_transformer", "docs/offload_homes/branching/h200-cap48m.json"),
    ]
    if args.sources:  # FSDP2's plan homes every parameter that can live apart, whatever the cap
        cases = [
            (source, "docs/offload_homes/step_in_backward/h200-cap128m.json") for source in args.sources.split(",")
        ]
    ok = True
    for source, cluster in cases:
        during = run(source, cluster, args.device_map, "backward", args.steps)
        after = run(source, cluster, args.device_map, "after", args.steps)
        loss_diff = max(abs(a - b) for a, b in zip(during[0], after[0]))
        weight_diff = max(float((a - b).abs().max()) for a, b in zip(during[1], after[1]))
        same = loss_diff <= 1e-5 and weight_diff <= 1e-5
        ok &= same
        print(f"{source}: losses differ by {loss_diff:.2e}, weights by {weight_diff:.2e}: {'ok' if same else 'DIFFER'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

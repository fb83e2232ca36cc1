"""What counting frozen parameters as frozen changes in the simulator, on the models of docs/lora/lora.py.

For each model: the bytes a real training step leaves held (weights, buffers, the gradients that exist, Adam's state,
after one ``torch.optim.Adam(model.parameters())`` step on this CPU), against the simulator's resident bytes
(``envs.sim.cost.static_bytes``) as placer captures the model now and as it did before (every parameter counted
trainable: the graph with ``meta["frozen_params"]`` moved back into ``param_bytes``); and the simulated step and peak
on one GPU of ``k80x4`` both ways. From the repository root::

    PYTHONPATH=.:docs/lora python docs/lora/before_after.py > docs/lora/before_after.log
"""

import copy

import lora
import numpy as np
import torch

import envs
from envs import Cluster
from envs.sim import cost
from graphs.plan import Placement
from graphs.torch_capture import capture


def held_bytes(model: torch.nn.Module, inputs: tuple) -> int:
    """The bytes one Adam step leaves held: every weight and buffer, every gradient made, every state tensor but the
    count."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters())
    model(*inputs).backward()
    optimizer.step()
    out = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    out += sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    states = optimizer.state.values()
    return out + sum(v.numel() * v.element_size() for s in states for k, v in s.items() if k != "step")


def as_before(graph):
    """``graph`` as captured before frozen parameters were told apart: their bytes trainable."""
    old = copy.deepcopy(graph)
    frozen = set(old.meta.pop("frozen_params", []))
    owned = np.array([bool(frozen.intersection(r)) for r in old.params])
    old.param_bytes = old.param_bytes + np.where(owned, old.buffer_bytes, 0)
    old.buffer_bytes = np.where(owned, 0, old.buffer_bytes)
    old.invalidate()
    return old


def simulated(graph) -> tuple[float, int]:
    r = envs.SimEnv(graph, Cluster.preset("k80x4")).simulate(
        Placement.from_indices(graph, ["gpu:0"], np.zeros(graph.num_ops, dtype=int))
    )
    return r.step_time_s, int(r.peak_bytes["gpu:0"])


print(
    "| model | parameters (frozen) | held after an Adam step | simulated resident: now | before | "
    "simulated step on one K80: now | before | simulated peak: now | before |"
)
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for name in ("llama", "gpt2", "mistral", "frozen_backbone", "wide_lora"):
    model, inputs = getattr(lora, name)()
    graph = capture(model, inputs)
    old = as_before(graph)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    frozen = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    (step, peak), (old_step, old_peak) = simulated(graph), simulated(old)
    print(
        f"| {name} | {total:,} B ({frozen / total:.0%}) | {held_bytes(model, inputs):,} B | "
        f"{int(cost.static_bytes(graph).sum()):,} B | {int(cost.static_bytes(old).sum()):,} B | "
        f"{step * 1e3:.3f} ms | {old_step * 1e3:.3f} ms | {peak:,} B | {old_peak:,} B |",
        flush=True,
    )

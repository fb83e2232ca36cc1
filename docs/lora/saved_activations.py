"""The activations the simulator keeps for the backward against those autograd saves, with frozen layers.

For each model: the bytes of the op outputs autograd saves in one training step (a ``saved_tensors_hooks`` pack
hook; each storage once; the model's own weights and buffers and its inputs left out) against the bytes the
simulator keeps for the backward (:func:`graphs.ops.saved_mask`, the outputs some op consumes), as it counts them now
(an op without a backward saves nothing; a product keeps an operand only for another that takes a gradient) and as
it did before (every op taken to run a backward, every product keeping its inputs). Then, for a frozen MLP
with large activations, the real resident set's rise over one step on this CPU (``VmHWM``, as ``placer run``
measures a CPU's peak) against the simulated peak less what stays resident. From the repository root::

    PYTHONPATH=.:docs/ranks/zb:docs/lora python docs/lora/saved_activations.py > docs/lora/saved_activations.log
"""

from __future__ import annotations

import copy
import gc
import time

import lora
import numpy as np
import torch
from torch import nn

import envs
import envs.sim.simulator as simulator
import graphs.ops
from envs import Cluster
from envs.real.timing import _proc_status_bytes, _reset_cpu_peak  # noqa: PLC2701 (placer run's measure of a CPU)
from envs.sim import cost
from graphs.plan import Placement
from graphs.torch_capture import capture


def autograd_saved(model: nn.Module, inputs: tuple) -> int:
    """Bytes of the tensors autograd saves for the backward in one step, each storage once, less the model's own
    tensors and its inputs."""
    model = copy.deepcopy(model)
    own = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    own |= {x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor)}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in own:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*inputs).backward()
    return sum(saved.values())


def simulated_saved(graph) -> tuple[int, int]:
    """``(now, before)``: the bytes the simulator keeps for the backward, of the outputs an op consumes."""
    act = cost.activation_bytes(graph)
    consumed = np.diff(graph.out_csr[0]) > 0
    now = int(act[graphs.ops.saved_mask(graph) & consumed].sum())
    before = int(act[graphs.ops.kept_mask(graphs.ops.backward_readers(graph)) & consumed].sum())  # as at 981bfbf
    return now, before


class FrozenMlp(nn.Module):
    """Six frozen layers of width 2048, then a trainable one; a batch of 4096 rows: 32 MiB per activation."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        frozen = [m for _ in range(6) for m in (nn.Linear(2048, 2048), nn.ReLU())]
        self.backbone = nn.Sequential(*frozen).requires_grad_(False)
        self.head = nn.Linear(2048, 2048)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x)).pow(2).mean()


def peak_rise(model: nn.Module, x: torch.Tensor, steps: int = 5) -> int:
    """The median over ``steps`` of the resident set's peak rise over one Adam step (after a warm-up step)."""
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad])
    rises = []
    for k in range(steps + 1):
        optimizer.zero_grad(set_to_none=True)
        gc.collect()
        start = _proc_status_bytes("VmRSS")
        _reset_cpu_peak()
        model(x).backward()
        optimizer.step()
        if k:
            rises.append(_proc_status_bytes("VmHWM") - start)
    return int(np.median(rises))


def simulated_peak_rise(graph, before: bool) -> int:
    """The simulated peak on one device less what stays resident between steps (the weights, buffers and Adam's
    state: static bytes less the gradients, which the step makes), now or as counted before."""
    real_readers = simulator.backward_readers
    if before:
        simulator.backward_readers = lambda g, *rules: real_readers(g)
    try:
        env = envs.SimEnv(graph, Cluster.preset("h200x1"))
        r = env.simulate(Placement.from_indices(graph, env.cluster.device_names, np.ones(graph.num_ops, dtype=int)))
    finally:
        simulator.backward_readers = real_readers
    resident = int(cost.static_bytes(graph).sum() - graph.param_bytes.sum())
    return int(r.peak_bytes["gpu:0"]) - resident


def main() -> None:
    print("model            autograd saves  simulated now  (now / real)  simulated before  (before / real)")
    for name in lora.MODELS:
        model, inputs = getattr(lora, name)()
        graph = capture(model, inputs)
        real = autograd_saved(model, inputs)
        now, before = simulated_saved(graph)
        print(f"{name:16s} {real:>14,d}  {now:>13,d}  ({now / real:.3f})  {before:>16,d}  ({before / real:.3f})")
    model, x = FrozenMlp(), torch.randn(4096, 2048)
    graph = capture(model, (x,))
    real = autograd_saved(model, (x,))
    now, before = simulated_saved(graph)
    print(f"{'frozen_mlp':16s} {real:>14,d}  {now:>13,d}  ({now / real:.3f})  {before:>16,d}  ({before / real:.3f})")
    t = time.perf_counter()
    rise = peak_rise(model, x)
    sim_now, sim_before = simulated_peak_rise(graph, False), simulated_peak_rise(graph, True)
    print(
        f"frozen_mlp, one Adam step on this CPU: the resident set rose {rise / 2**20:.1f} MiB at its peak (median of "
        f"5); simulated {sim_now / 2**20:.1f} MiB now ({sim_now / rise:.2f}x), {sim_before / 2**20:.1f} MiB before "
        f"({sim_before / rise:.2f}x) ({time.perf_counter() - t:.0f} s)"
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()

"""FSDP2 with ``CPUOffloadPolicy`` on one process: the rival that keeps every parameter on the host.

What practitioners reach for when a model's training state does not fit one GPU:
``torch.distributed.fsdp.fully_shard`` on each block and on the root, with
``offload_policy=CPUOffloadPolicy()``. Parameters, gradients and Adam's moments
live on the host (pinned); each block's parameters are copied to the GPU before
its forward and again before its backward (``reshard_after_forward``), its
gradients copied back, and the optimizer step runs on the CPU. It offloads all
or nothing: there is no way to keep some parameters on the GPU. With
``checkpoint``, each block also runs under torch's activation checkpointing
(:class:`Checkpointed`: each block called through non-reentrant
``torch.utils.checkpoint``, wrapped before ``fully_shard`` as torchtitan wraps them,
so both forwards run FSDP2's hooks): how FSDP2 is used where the activations do not
fit either.

One process is a world of one: a process group over an in-process
``HashStore`` (``nccl`` for a CUDA device, ``gloo`` for the CPU), so nothing
listens on a port. It runs on the CPU too (a ``cpu`` device mesh with gloo;
the "offload" is then a copy from host to host): that is how CI tests it, and
checks that it trains exactly as the unwrapped model does.

The steps are timed as every placement is (:func:`envs.real.timing.measure_steps`:
warm-up, then timed steps, the device synchronised, the median), with the same
seed, weights, inputs, loss and Adam; a failure is a :class:`envs.Result`
(``oom``, ``timeout``, ``error``), never an exception.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from envs.real.timing import Protocol, adam, failure_status, measure_steps, step_extra, time_limit
from envs.real.worker import build_model, one_line
from envs.result import Result
from placer.methods.heuristics.hf_accelerate import no_split_modules

Builder = Callable[[], tuple[nn.Module, tuple]]


@contextlib.contextmanager
def world_of_one(device: torch.device) -> Iterator[None]:
    """A process group of this process alone (none listening on a port), destroyed on exit if it made one (and no one
    inside destroyed it first: DeepSpeed does, :func:`bench.deepspeed_offload.deepspeed_session`)."""
    if dist.is_initialized():
        yield
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class Checkpointed(nn.Module):
    """A block called through non-reentrant activation checkpointing (what torch's ``checkpoint_wrapper`` does): its
    second forward calls the block as a module, so the hooks ``fully_shard`` puts on it run again."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return torch_checkpoint(self.block, *args, use_reentrant=False, **kwargs)


def shard_with_offload(model: nn.Module, device: torch.device, *, checkpoint: bool = False) -> list[str]:
    """``fully_shard`` each block (the classes no device map may split) and the root, parameters on the host;
    ``checkpoint``: each block wrapped in torch's activation checkpointing first.

    Returns the names of the sharded blocks (the root last, as ``""``).
    """
    mesh = init_device_mesh(device.type, (1,))
    policy = CPUOffloadPolicy(pin_memory=device.type == "cuda")
    classes = set(no_split_modules(model))
    blocks = [name for name, m in model.named_modules() if name and type(m).__name__ in classes]
    if checkpoint:
        for name in blocks:
            parent, _, leaf = name.rpartition(".")
            owner = model.get_submodule(parent) if parent else model
            setattr(owner, leaf, Checkpointed(owner.get_submodule(leaf)))
        blocks = [f"{name}.block" for name in blocks]
    for name in blocks:
        fully_shard(model.get_submodule(name), mesh=mesh, offload_policy=policy)
    fully_shard(model, mesh=mesh, offload_policy=policy)
    return blocks + [""]


def measure_offload(
    source: str | Builder,
    device: str | torch.device,
    *,
    warmup_steps: int = 2,
    timed_steps: int = 5,
    lr: float = 1e-3,
    timeout_s: float | None = None,
    checkpoint: bool = False,
) -> Result:
    """Time Adam steps of ``source``'s model under FSDP2 with CPU offload on ``device`` (``checkpoint``: every block
    under activation checkpointing too); a Result, never raising.

    ``peak_bytes`` has ``gpu:0`` (``max_memory_allocated`` of a CUDA device) and
    ``cpu:0`` (the host's resident-set rise); ``extra`` the step times, losses and
    the number of sharded blocks.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    extra: dict[str, Any] = {"method": "fsdp2_cpu_offload", "checkpoint": checkpoint}

    def steps() -> dict[str, Any]:
        with world_of_one(device), time_limit(timeout_s):
            model, inputs = build_model(source)
            extra["sharded_blocks"] = len(shard_with_offload(model, device, checkpoint=checkpoint)) - 1
            inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
            optimizer = adam(model.parameters(), lr=lr)  # the fused kernels, as placer's plans get
            return measure_steps(
                model,
                inputs,
                optimizer,
                {"cpu:0": torch.device("cpu"), "gpu:0": device},
                warmup_steps=warmup_steps,
                timed_steps=timed_steps,
                protocol=Protocol(),  # the protocol placer's plans are measured under (malloc steady, no collector)
            )

    return timed_rival(steps, extra)


def timed_rival(steps: Callable[[], dict[str, Any]], extra: dict[str, Any]) -> Result:
    """A rival's row: what ``steps()`` timed (:func:`envs.real.timing.measure_steps`) as an ``ok`` Result with
    ``extra`` and the steps' own, or its failure as one (``oom``, ``timeout``, ``error``), never raising; the garbage
    collected and the GPU's cache emptied after, either way (the next row's peak is its own)."""
    try:
        m = steps()
        extra.update(step_extra(m), protocol=m["protocol"])
        return Result(m["step_time_s"], "ok", peak_bytes=m["peak_bytes"], source="measured", extra=extra)
    except Exception as e:  # noqa: BLE001  (the rival's failure is its row)
        status = failure_status(e)
        return Result(float("inf"), status, f"{type(e).__name__}: {one_line(e)}", source="measured", extra=extra)
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


__all__ = ["Checkpointed", "measure_offload", "shard_with_offload", "timed_rival", "world_of_one"]

"""One rank's part of a plan: its ``PipelineStage`` objects, the schedule that runs them, and one training step.

:class:`RankSchedule` is what a process of the job holds. Every rank cuts the whole
program into stages (:func:`~envs.real.distributed.stage_modules.stage_programs`,
cheap: the stages share the model's tensors), finds their shapes on fake tensors,
then keeps its own stages, moved to its torch device, as torch ``PipelineStage``
objects, and builds the plan's schedule over them
(:data:`~envs.real.distributed.schedules.BUILDERS`).

:meth:`RankSchedule.step` runs one step's forwards and backwards over the M
microbatches and leaves in every parameter the gradient the one-process step
computes:

* torch's schedules sum the microbatches' gradients; with a mean loss the step's
  gradient is that sum over M, divided here once per parameter (not per stage: the
  stages of one rank share their tied parameters);
* a parameter read by stages of several ranks (tied embeddings) has a copy on each;
  each copy's gradient is its ranks' part, summed among those ranks with one
  all-reduce per parameter (in a process group of just those ranks), so every copy
  takes the same optimizer step and the copies stay equal.

The schedule hands the last stage a *target* per microbatch for its loss function;
placer's last stage computes the loss itself (the captured program ends in it), so
the target is a placeholder of M zeros and the loss function returns the stage's output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from envs.real.distributed.rank_plan import RankPlan
from envs.real.distributed.schedules import BUILDERS
from envs.real.distributed.stage_modules import place_stage, stage_programs, stage_shapes
from envs.real.pipeline import split_batch
from envs.real.placing import to_device
from graphs import PlacerError

#: torch 2.11 and older make every tensor a stage receives require grad, integer ones too, which fails
#: (pytorch/pytorch#183024); later releases skip the non-floating ones.
RECEIVES_ONLY_FLOATS = torch.__version__ < "2.12"  # (torch's TorchVersion compares as a version)


def check_received(shapes: Sequence[Any], *, only_floats: bool = RECEIVES_ONLY_FLOATS) -> None:
    """One line when a stage after the first receives a non-floating tensor and this torch cannot (see above)."""
    if not only_floats:
        return
    for s, shape in enumerate(shapes[1:], start=1):
        bad = [str(t.dtype).removeprefix("torch.") for t in shape.inputs if not t.is_floating_point()]
        if bad:
            raise PlacerError(
                f"stage {s} receives a {bad[0]} tensor from stage {s - 1}, which torch {torch.__version__}'s "
                "pipelining cannot send (pytorch/pytorch#183024): use torch >= 2.12, or a plan whose stages pass "
                "only floating-point tensors (integer inputs such as labels used by the first stage only)"
            )


def loss_is_output(output: torch.Tensor, target: Any) -> torch.Tensor:
    """The loss function torch's schedule calls on the last stage: its output already is the loss."""
    return output


def shared_parameters(
    modules: Sequence[nn.Module], stage_ranks: Sequence[int]
) -> dict[str, tuple[tuple[int, ...], nn.Parameter]]:
    """Parameters read by stages of more than one rank: ``{name: (the ranks that hold a copy, the tensor here)}``.

    ``modules``: every stage, cut in this process (so a tied parameter is one tensor
    here); ``stage_ranks``: each stage's rank. A parameter is named by the first of
    its names (sorted), so every rank, which cuts the same program, names it alike.
    """
    names: dict[int, list[str]] = {}
    holders: dict[int, set[int]] = {}
    tensors: dict[int, nn.Parameter] = {}
    for module, rank in zip(modules, stage_ranks):
        for name, p in module.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), []).append(name)
            holders.setdefault(id(p), set()).add(rank)
            tensors[id(p)] = p
    return {min(names[k]): (tuple(sorted(r)), tensors[k]) for k, r in holders.items() if len(r) > 1}


class RankSchedule:
    """This rank's stages of ``plan`` and the schedule that runs them (see the module doc).

    Args:
        plan: the compiled plan (:func:`~envs.real.distributed.rank_plan.compile_plan`).
        program: the ``ExportedProgram`` of one microbatch (the whole batch when M = 1),
            whose op names the plan's stages use.
        example_inputs: the whole batch's inputs (their first microbatch gives the shapes).
        rank: this process's global rank.
        group: the process group of the pipeline (default: the world).
    """

    def __init__(
        self,
        plan: RankPlan,
        program: Any,
        example_inputs: Sequence[Any],
        rank: int,
        group: Any = None,
    ) -> None:
        from torch.distributed.pipelining import PipelineStage

        self.plan, self.rank = plan, rank
        self.num_stages = len(plan.stages)
        self.stage_indices = plan.rank_stages(rank)
        if not self.stage_indices:
            raise PlacerError(f"rank {rank}: no stage of the plan runs here (ranks {sorted(set(plan.stage_ranks))})")
        devices = {d.rank: d.torch_device for d in plan.devices.values()}
        self.torch_device = torch.device(devices[rank])
        modules = stage_programs(program.module(), [s.ops for s in plan.stages])
        microbatch = split_batch(tuple(example_inputs), plan.microbatches)[0]
        shapes = stage_shapes(modules, microbatch)
        check_received(shapes)
        shared = shared_parameters(modules, plan.stage_ranks)
        # every rank creates every group, in one order (dist.new_group is collective over the world)
        groups = {r: dist.new_group(list(r)) for r in sorted({ranks for ranks, _ in shared.values()})}
        self.modules = [place_stage(modules[s], self.torch_device) for s in self.stage_indices]
        self.stages = [
            PipelineStage(
                modules[s],
                s,
                self.num_stages,
                self.torch_device,
                input_args=shapes[s].inputs,
                output_args=shapes[s].outputs,
                group=group,
            )
            for s in self.stage_indices
        ]
        self.shared = [(p, groups[ranks]) for _, (ranks, p) in sorted(shared.items()) if rank in ranks]
        self.schedule = BUILDERS[plan.schedule](self.stages, plan.microbatches, loss_is_output, plan.actions())

    @property
    def has_first(self) -> bool:
        return self.stage_indices[0] == 0

    @property
    def has_last(self) -> bool:
        return self.stage_indices[-1] == self.num_stages - 1

    def parameters(self) -> list[nn.Parameter]:
        """This rank's parameters, each once (for its optimizer)."""
        seen: dict[int, nn.Parameter] = {}
        for m in self.modules:
            for p in m.parameters():
                seen.setdefault(id(p), p)
        return list(seen.values())

    def named_parameters(self) -> dict[str, nn.Parameter]:
        """This rank's parameters under their names in the model (a tied one under each of its names here)."""
        return {name: p for m in self.modules for name, p in m.named_parameters(remove_duplicate=False)}

    def step(self, *inputs: Any) -> torch.Tensor | None:
        """One step's forwards and backwards over the microbatches; the loss on the rank of the last stage, else None.

        Every rank may pass the whole batch's inputs; only the first stage's rank uses them.
        """
        M = self.plan.microbatches
        args = tuple(to_device(tuple(inputs), self.torch_device)) if self.has_first else ()
        target = torch.zeros(M) if self.has_last else None
        losses: list[torch.Tensor] | None = [] if self.has_last else None
        self.schedule.step(*args, target=target, losses=losses, return_outputs=False)
        self.finish_gradients()
        if not losses:
            return None
        total = torch.stack([loss.detach().float() for loss in losses]).sum()
        return total / M if self.plan.loss_reduction == "mean" else total

    def finish_gradients(self) -> None:
        """The microbatches' gradients as the whole batch's, and each shared parameter's parts summed (module doc)."""
        if self.plan.loss_reduction == "mean" and self.plan.microbatches > 1:
            for p in self.parameters():
                if p.grad is not None:
                    p.grad.div_(self.plan.microbatches)
        for p, group in self.shared:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, group=group)


__all__ = ["RankSchedule", "loss_is_output", "shared_parameters"]

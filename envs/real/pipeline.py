"""A pipelined plan on a placed module: M microbatches per step, fill-drain or one-forward-one-backward.

:class:`MicrobatchedModule` runs the module :func:`envs.real.placing.place_module`
built once per microbatch, in the host program the simulator scores
(:func:`envs.microbatch.issue_segments`); :func:`split_batch` cuts the inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from envs.microbatch import BACKWARD, issue_segments
from envs.real.placing import MOVE_META, global_state_kept
from graphs import PlacerError
from graphs.plan import check_inflight

MICROBATCH_META = "placer_microbatches"  # meta key of a MicrobatchedModule: its number of microbatches


def split_batch(inputs: tuple, microbatches: int, batch_dim: int = 0, *, source: str = "inputs") -> list[tuple]:
    """``inputs`` cut into ``microbatches`` equal parts along ``batch_dim``: one tuple per microbatch.

    The batch size ``B`` is the size along ``batch_dim`` of the first tensor input
    that has that dimension; every tensor input with ``B`` there is split, every
    other input (a scalar, a table shared by the batch) goes whole to every
    microbatch. ``B`` must be a multiple of ``microbatches`` (the placed program has
    one static shape); otherwise :class:`PlacerError`.
    """
    tensors = [t for t in inputs if isinstance(t, torch.Tensor) and t.dim() > batch_dim]
    if not tensors:
        raise PlacerError(
            f"{source}: no tensor input has a dimension {batch_dim} to split into microbatches (batch_dim)"
        )
    B = tensors[0].shape[batch_dim]
    if B % microbatches:
        raise PlacerError(
            f"{source}: batch size {B} (dimension {batch_dim}) is not a multiple of {microbatches} microbatches"
        )
    parts = [
        t.chunk(microbatches, dim=batch_dim)
        if isinstance(t, torch.Tensor) and t.dim() > batch_dim and t.shape[batch_dim] == B
        else None
        for t in inputs
    ]
    return [tuple(x if p is None else p[m] for x, p in zip(inputs, parts)) for m in range(microbatches)]


def _join_outputs(outs: list[Any], batch_dim: int, reduction: str) -> Any:
    """One output from the microbatches' outputs: scalars reduced, batched tensors concatenated."""
    first = outs[0]
    if isinstance(first, torch.Tensor):
        if first.dim() == 0:  # a loss: the mean over equal microbatches is the whole batch's mean
            total = outs[0]
            for o in outs[1:]:
                total = total + o.to(total.device)
            return total / len(outs) if reduction == "mean" else total
        if first.dim() > batch_dim:
            return torch.cat([o.to(first.device) for o in outs], dim=batch_dim)
        return first
    if isinstance(first, (tuple, list)):
        joined = [_join_outputs([o[k] for o in outs], batch_dim, reduction) for k in range(len(first))]
        if isinstance(first, tuple):
            return type(first)(*joined) if hasattr(first, "_fields") else tuple(joined)
        return joined
    if isinstance(first, dict):
        return {k: _join_outputs([o[k] for o in outs], batch_dim, reduction) for k in first}
    return first


class MicrobatchedModule(nn.Module):
    """One training step as ``microbatches`` passes of a placed module: a pipelined plan.

    ``forward(*inputs)`` splits the batch (:func:`split_batch`), runs ``placed``
    on microbatch 0, then 1, ... (the fill-drain issue order the simulator scores,
    :mod:`envs.microbatch`: the host issues microbatch ``m+1``'s first ops while
    ``m``'s later ones run on other streams), and joins the outputs: 0-dim outputs
    (losses) are averaged (``reduction="mean"``, for a loss that is a mean over the
    batch) or summed (``"sum"``), so one ``backward()`` accumulates every
    microbatch's gradients into the shared parameters equal to the unsplit step's;
    tensors with a batch dimension are concatenated along it, on the first
    microbatch's device. Its parameters, buffers and state dict are ``placed``'s,
    under the same names. The gradients are equal exactly when the loss is a mean
    (or sum) of per-example terms: batch-norm statistics, or a mean over a number of
    unmasked tokens that differs between microbatches, make them differ.

    ``inflight`` W < M (one-forward-one-backward, :func:`envs.microbatch.issue_segments`)
    bounds the activations each stage holds to W microbatches: the placed program
    is run stage by stage (``stages``: the op names where a stage after the first
    begins, :func:`envs.microbatch.stage_starts`; each stage's nodes through an
    ``fx.Interpreter``, one environment per microbatch), in the simulator's host
    program: a stage of microbatch ``m`` after the ``backward()`` of microbatch
    ``m - w``, run here, inside the call, with the loss's share of the batch
    (``1/M`` for a mean). The result is then the loss (the program's output must
    be one 0-dim tensor), and its ``backward()`` runs the microbatches still in
    flight; it must be called with gradient 1 (plain ``loss.backward()``: the
    earlier microbatches' gradients are already in the parameters, taken with 1),
    else it raises. Under ``torch.no_grad()`` every microbatch runs forward only,
    as with W = M.
    """

    def __init__(
        self,
        placed: nn.Module,
        microbatches: int,
        batch_dim: int = 0,
        reduction: str = "mean",
        inflight: int | None = None,
        stages: Sequence[str] = (),
    ) -> None:
        super().__init__()
        if reduction not in ("mean", "sum"):
            raise PlacerError(f"loss reduction {reduction!r}: must be 'mean' or 'sum'")
        self.inflight = check_inflight(inflight, microbatches)
        self.stages = list(stages)
        # one-forward-one-backward: the placed program's nodes and the host program over them, built once
        self._nodes = list(placed.graph.nodes) if self.inflight < microbatches else []
        self._program = (
            issue_segments(
                len(self._nodes), microbatches, self.inflight, _stage_nodes(self._nodes, self.stages)
            ).tolist()
            if self._nodes
            else []
        )
        # the placed module's parameters, buffers and submodules under their own names (the
        # state dict of the unpipelined placed module), the module itself outside the tree
        object.__setattr__(self, "placed", placed)
        self._parameters, self._buffers, self._modules = placed._parameters, placed._buffers, placed._modules
        self.microbatches = int(microbatches)
        self.batch_dim = int(batch_dim)
        self.reduction = reduction
        self.meta = {**getattr(placed, "meta", {}), MICROBATCH_META: self.microbatches}

    def forward(self, *inputs: Any) -> Any:
        with global_state_kept():  # a stage run by the interpreter below is not the placed module's guarded call
            return self._forward(inputs)

    def _forward(self, inputs: tuple) -> Any:
        parts = split_batch(inputs, self.microbatches, self.batch_dim)
        M, W = self.microbatches, self.inflight
        if W >= M or not torch.is_grad_enabled():
            return _join_outputs([self.placed(*part) for part in parts], self.batch_dim, self.reduction)
        share = 1.0 / M if self.reduction == "mean" else 1.0
        nodes, program = self._nodes, self._program
        N = len(nodes)
        runs = [_StageRunner(self.placed, part) for part in parts]
        losses: list[Any] = [None] * M
        for q, (kind, lo, hi) in enumerate(program):
            if kind != BACKWARD:
                m = lo // N
                out = runs[m].run(nodes[lo - m * N : hi - m * N])
                if out is not _StageRunner.PENDING:
                    if not (isinstance(out, torch.Tensor) and out.dim() == 0 and out.is_floating_point()):
                        raise PlacerError(
                            f"a plan with at most {W} of {M} microbatches in flight runs backward inside the step, so "
                            f"the model's output must be its loss (one 0-dim floating tensor), not {_describe(out)}"
                        )
                    losses[m] = out
                continue
            if q == len(program) - 1:
                break  # the microbatches still in flight: the caller's loss.backward()
            for m in range(lo // N, hi // N):
                runs[m] = None  # its forward values are no longer needed here
                if losses[m].requires_grad:
                    (losses[m] * share).backward()
                    losses[m] = losses[m].detach()
        total = _join_outputs(losses, self.batch_dim, self.reduction)
        return _GradientOne.apply(total) if total.requires_grad else total


def _stage_nodes(nodes: list[fx.Node], stages: Sequence[str]) -> list[int]:
    """Node positions where each stage begins: 0, then each stage's first op, less the copies issued right before it."""
    index = {n.name: i for i, n in enumerate(nodes)}
    starts = [0]
    for name in stages:
        i = index[name]
        while i > starts[-1] + 1 and MOVE_META in nodes[i - 1].meta:
            i -= 1
        starts.append(i)
    return starts


class _StageRunner:
    """One microbatch of a placed program, run a slice of its nodes at a time (an ``fx.Interpreter`` with its own
    values)."""

    PENDING = object()  # what run() returns before the output node has run

    def __init__(self, gm: fx.GraphModule, inputs: tuple) -> None:
        self.interp = fx.Interpreter(gm, garbage_collect_values=False)
        self.interp.env = {}
        self.interp.args_iter = iter(torch.utils._pytree.tree_leaves((tuple(inputs), {})))
        self.out_spec = getattr(getattr(gm.graph._codegen, "pytree_info", None), "out_spec", None)

    def run(self, nodes: list[fx.Node]) -> Any:
        out = self.PENDING
        for node in nodes:
            value = self.interp.run_node(node)
            if node.op == "output":
                out = (
                    torch.utils._pytree.tree_unflatten(list(value), self.out_spec)
                    if self.out_spec is not None
                    else value
                )
            else:
                self.interp.env[node] = value
        return out


def _describe(out: Any) -> str:
    if isinstance(out, torch.Tensor):
        return f"a tensor of shape {list(out.shape)} and dtype {out.dtype}"
    return f"a {type(out).__name__}"


class _GradientOne(torch.autograd.Function):
    """Identity whose backward insists on gradient 1 (the microbatches already run backward took 1)."""

    @staticmethod
    def forward(ctx: Any, loss: torch.Tensor) -> torch.Tensor:
        return loss.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        if not bool(torch.all(grad == 1)):
            raise PlacerError(
                "a plan with fewer microbatches in flight than microbatches ran the first ones' backward with "
                "gradient 1 "
                "inside the step; call backward() on its loss unscaled (scale the learning rate instead)"
            )
        return grad

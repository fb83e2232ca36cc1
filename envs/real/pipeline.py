"""A pipelined plan on a placed module: M microbatches per step, fill-drain or one-forward-one-backward.

:class:`MicrobatchedModule` runs the module :func:`envs.real.placing.place_module`
built once per microbatch, in the host program the simulator scores
(:func:`envs.microbatch.issue_segments`); :func:`split_batch` cuts the inputs;
:func:`stage_names` says where the plan's stages begin.

The batch is the one given at call time: M microbatches of whatever batch
arrives. A batch that M does not divide is cut into microbatches whose sizes
differ by one (the first ones larger, as ``torch.tensor_split`` cuts), and a
mean loss is weighted by each microbatch's share of the batch, so the step's
loss and gradients stay the unsplit step's; a batch smaller than M is a
:class:`graphs.PlacerError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch import nn

from envs.microbatch import BACKWARD, issue_segments, stage_starts
from envs.real.fixed_draws import fixed_draws
from envs.real.global_state import global_state_kept
from envs.real.placing import MOVE_META
from envs.real.programs import PROGRAMS_ATTR
from envs.real.shapes import ShapeError, guard_failure, tensors_of
from graphs import OpGraph, PlacerError
from graphs.ops import free_mask
from graphs.plan import check_inflight

MICROBATCH_META = "placer_microbatches"  # meta key of a MicrobatchedModule: its number of microbatches


def batched(inputs: Sequence[Any], batch_dim: int = 0) -> tuple[int | None, list[bool]]:
    """The batch size (the size along ``batch_dim`` of the first tensor input that has that dimension; None where
    none has it) and, per input, whether it is cut into the microbatches: a tensor with that size there. Any other
    input (a scalar, a table shared by the batch) goes whole to every microbatch. The one rule of
    :func:`split_batch` in one process and of torch's schedule across processes
    (:func:`envs.real.distributed.runtime.chunk_specs`).

    >>> batched((torch.zeros(4, 6), torch.zeros(6, 3), 2.0))
    (4, [True, False, False])
    """
    sizes = [t.shape[batch_dim] if isinstance(t, torch.Tensor) and t.dim() > batch_dim else None for t in inputs]
    B = next((s for s in sizes if s is not None), None)
    return B, [B is not None and s == B for s in sizes]


def split_batch(inputs: tuple, microbatches: int, batch_dim: int = 0, *, source: str = "inputs") -> list[tuple]:
    """``inputs`` cut into ``microbatches`` parts along ``batch_dim``: one tuple per microbatch.

    The batch size ``B`` is the size along ``batch_dim`` of the first tensor input
    that has that dimension; every tensor input with ``B`` there is split, every
    other input (a scalar, a table shared by the batch) goes whole to every
    microbatch. Parts differ in size by one at most where ``microbatches`` does not
    divide ``B`` (:func:`microbatch_sizes`); a ``B`` smaller than ``microbatches``
    is a :class:`PlacerError`.

    >>> [tuple(p[0].tolist()) for p in split_batch((torch.arange(5),), 2)]
    [(0, 1, 2), (3, 4)]
    """
    B, cut = batched(inputs, batch_dim)
    if B is None:
        raise PlacerError(
            f"{source}: no tensor input has a dimension {batch_dim} to split into microbatches (batch_dim)"
        )
    if B < microbatches:
        raise PlacerError(
            f"{source}: batch size {B} (dimension {batch_dim}) is smaller than the plan's {microbatches} microbatches"
        )
    parts = [t.tensor_split(microbatches, dim=batch_dim) if c else None for t, c in zip(inputs, cut)]
    return [tuple(x if p is None else p[m] for x, p in zip(inputs, parts)) for m in range(microbatches)]


def part_failure(error: BaseException, inputs: tuple, microbatches: int, batch_dim: int = 0) -> str:
    """The line of a model that failed on the parts of a batch a plan of ``microbatches`` cut ``inputs`` into: what
    failed, which inputs were cut and which went whole, and the likely cause (inputs that are not a batch of
    independent samples, such as a graph's nodes and its edge index, which index each other across the parts).

    >>> x, edges = torch.zeros(6, 3), torch.zeros(2, 9, dtype=torch.long)
    >>> print(part_failure(IndexError("index out of range in self"), (x, edges), 2, 0))
    ... # doctest: +NORMALIZE_WHITESPACE
    the model failed on a microbatch (IndexError: index out of range in self): a plan of 2 microbatches runs it on
    parts of dimension 0 of input 1 (of size 6 there, the batch's), and gives input 2 whole to every part; if the
    model runs on the whole batch, its inputs are not a batch of independent samples (a graph's nodes and its edge
    index, say): place it with microbatches=1
    """
    B, cut = batched(inputs, batch_dim)
    tensors = [k for k, t in enumerate(inputs) if isinstance(t, torch.Tensor)]
    split = [str(k + 1) for k in tensors if cut[k]]
    whole = [str(k + 1) for k in tensors if not cut[k]]
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    plural = "s" if len(split) > 1 else ""
    line = (
        f"the model failed on a microbatch ({type(error).__name__}{': ' + message if message else ''}): a plan of "
        f"{microbatches} microbatches runs it on parts of dimension {batch_dim} of input{plural} "
        f"{', '.join(split)} (of size {B} there, the batch's)"
    )
    if whole:
        line += f", and gives input{'s' if len(whole) > 1 else ''} {', '.join(whole)} whole to every part"
    return (
        line + "; if the model runs on the whole batch, its inputs are not a batch of independent samples (a graph's "
        "nodes and its edge index, say): place it with microbatches=1"
    )


#: The attribute of an exception raised on the parts of a batch: :func:`part_failure`'s line for it.
PART_FAILURE_ATTR = "placer_part_failure"


def note_part_failure(error: BaseException, inputs: tuple, microbatches: int, batch_dim: int = 0) -> None:
    """Tell ``error``, raised while a plan of ``microbatches`` ran the parts of ``inputs``, what :func:`part_failure`
    says: a note on its traceback, and :data:`PART_FAILURE_ATTR` for a command to say it in one line
    (:func:`part_failure_of`). Its type stays what the model raised. A failure of memory is left alone."""
    if microbatches > 1 and not isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        line = part_failure(error, inputs, microbatches, batch_dim)
        error.add_note(f"placer: {line}")
        setattr(error, PART_FAILURE_ATTR, line)


def part_failure_of(error: BaseException) -> str | None:
    """The line :func:`note_part_failure` gave ``error`` or an exception it was raised from; None where none has one."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        line = getattr(error, PART_FAILURE_ATTR, None)
        if line is not None:
            return line
        error = error.__cause__ or error.__context__
    return None


def batch_mixing(
    model: nn.Module,
    inputs: tuple,
    microbatches: int,
    batch_dim: int = 0,
    loss_reduction: str = "mean",
    *,
    rtol: float = 1e-4,
) -> str | None:
    """Whether a plan of ``microbatches`` computes another step than the whole batch's, because ``model``'s step
    mixes the samples of its batch or its forward updates state the next microbatch reads: the line that says so,
    or None.

    The model's loss and its gradients on the whole of ``inputs`` against its microbatches' run one after another as
    the plan runs them, combined as the plan combines them (weighted by their shares for a ``"mean"`` loss, added
    for a ``"sum"``), each from the same random state (``torch.autograd.grad``: the parameters' ``.grad`` are left
    alone). A loss that is a mean (or sum) of per-sample terms gives the same to rounding. A term over the batch
    (batch norm's statistics in training, a contrastive loss over the batch's pairs, an entropy over the batch's
    codes) does not, in the gradients even where the loss barely moves (a forecaster's batch norm before a squared
    error); nor does a forward that updates a buffer the next forward reads (spectral norm's power iteration: a plan
    of M microbatches runs it M times a step), which the line tells apart by running the microbatches again, each
    from the buffers as they were. Every run holds its random draws at their likeliest values
    (:func:`envs.real.fixed_draws.fixed_draws`: dropout keeps every unit), the same for the whole batch and its
    parts. None also where it cannot tell: the model draws random numbers that cannot be held so (a Poisson draw),
    returns no scalar loss, or fails on its parts (the run's own error says why). Its buffers (batch norm's
    running statistics), what its forward keeps on its modules (a cache,
    a step counter: :func:`graphs.export.model_kept`) and the random state are restored.

    >>> class Mean(nn.Module):
    ...     def forward(self, x):
    ...         return (x**2).mean()
    >>> class Centred(nn.Module):  # each sample less the batch's mean: mixes the samples
    ...     def forward(self, x):
    ...         return ((x - x.mean(0)) ** 2).mean()
    >>> x = torch.arange(8.0).reshape(4, 2)
    >>> batch_mixing(Mean(), (x,), 2) is None
    True
    >>> print(batch_mixing(Centred(), (x,), 2))  # doctest: +NORMALIZE_WHITESPACE
    the step mixes the samples of its batch: its loss on the whole batch is 5, its 2 microbatches' combined 1; a
    plan of 2 microbatches computes what mixes them (batch norm's statistics in training, a loss over the batch's
    pairs) within each microbatch, as gradient accumulation does, so its loss and gradients are not the whole
    batch's
    """
    from envs.real.compared import float64_cpu
    from graphs.export import model_kept

    if microbatches <= 1:
        return None
    try:
        parts = split_batch(tuple(inputs), microbatches, batch_dim)
    except PlacerError:
        return None
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    params = [p for p in model.parameters() if p.requires_grad]
    devices = sorted({t.device for t in (*model.parameters(), *model.buffers()) if t.device.type == "cuda"}, key=str)

    def rng() -> list[torch.Tensor]:
        return [torch.random.get_rng_state(), *(torch.cuda.get_rng_state(d) for d in devices)]

    def restore() -> None:
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)

    def step(part: tuple) -> tuple[float, list] | None:
        """One forward and backward: the loss and the gradients; None where that cannot tell (see above)."""
        before = rng()
        with fixed_draws():  # the backward too: a checkpointed block runs its forward again there
            out = model(*part)
            if not isinstance(out, torch.Tensor) or out.numel() != 1 or not out.is_floating_point():
                return None
            got = torch.autograd.grad(out, params, allow_unused=True) if out.requires_grad and params else ()
        if not all(torch.equal(a, b) for a, b in zip(rng(), before)):
            return None  # it draws random numbers not held fixed: the whole and the parts draw different ones
        return float(out.detach().double().cpu()), [None if g is None else float64_cpu(g) for g in got]

    weights = {reduction: part_weights(parts, batch_dim, reduction) for reduction in ("mean", "sum")}

    def off(whole: tuple, each: list, reduction: str) -> tuple[float, bool]:
        """The parts' loss combined as ``reduction`` combines them, and whether it or its gradients are off the
        whole's."""
        w = weights[reduction]
        combined = sum(wk * loss for wk, (loss, _) in zip(w, each))
        apart, norm = 0.0, 0.0
        for k, g in enumerate(whole[1]):
            summed = [wk * grads[k] for wk, (_, grads) in zip(w, each) if grads[k] is not None]
            if g is None and not summed:
                continue
            g = torch.zeros_like(summed[0]) if g is None else g
            apart += float((g - sum(summed, torch.zeros_like(g))).square().sum().cpu())
            norm += float(g.square().sum().cpu())
        far = abs(combined - whole[0]) > rtol * max(abs(whole[0]), abs(combined), 1e-12)
        return combined, far or apart**0.5 > rtol * max(norm**0.5, 1e-12)

    try:
        with torch.random.fork_rng(devices=devices), model_kept(model):  # a counter or cache it keeps on itself too
            whole = step(tuple(inputs))
            updates = any(not torch.equal(b, saved) for b, saved in buffers)  # the forward wrote a buffer
            restore()
            carried = [step(part) for part in parts]  # one after another, as the plan runs them
            if whole is None or any(c is None for c in carried):
                return None
            combined, differs = off(whole, carried, loss_reduction)
            if not differs:
                return None
            other = "mean" if loss_reduction == "sum" else "sum"
            if not off(whole, carried, other)[1]:
                return (
                    f"the model's loss is a {other} over its batch, not a {loss_reduction}: its loss on the whole "
                    f"batch is {whole[0]:.6g}, its {microbatches} microbatches' "
                    f"{'summed' if other == 'sum' else 'mean'} the same; give loss_reduction={other!r}, or a plan of "
                    f"{microbatches} microbatches combines them as a {loss_reduction}"
                )
            fresh = []
            if updates:  # each microbatch again from the buffers as they were: is it the state, or the samples?
                for part in parts:
                    restore()
                    fresh.append(step(part))
    except Exception:  # noqa: BLE001 (the plan's run names what fails on a microbatch, part_failure)
        return None
    finally:
        restore()
    if fresh and all(f is not None for f in fresh) and not off(whole, fresh, loss_reduction)[1]:
        return (
            f"the model's forward updates state its next forward reads (spectral norm's power iteration, a "
            f"running count): its loss on the whole batch is {whole[0]:.6g}, its {microbatches} microbatches' "
            f"combined {combined:.6g}; a plan of {microbatches} microbatches updates it once a microbatch, as "
            "gradient accumulation does, so its loss and gradients are not the whole batch's"
        )
    return (
        f"the step mixes the samples of its batch: its loss on the whole batch is {whole[0]:.6g}, its "
        f"{microbatches} microbatches' combined {combined:.6g}; a plan of {microbatches} microbatches computes what "
        "mixes them (batch norm's statistics in training, a loss over the batch's pairs) within each microbatch, as "
        "gradient accumulation does, so its loss and gradients are not the whole batch's"
    )


def microbatch_sizes(batch: int, microbatches: int) -> list[int]:
    """The size of each microbatch :func:`split_batch` cuts a batch of ``batch`` into.

    >>> microbatch_sizes(8, 4), microbatch_sizes(7, 3)
    ([2, 2, 2, 2], [3, 2, 2])
    """
    small, extra = divmod(batch, microbatches)
    return [small + (m < extra) for m in range(microbatches)]


def export_microbatch(
    model: nn.Module, inputs: tuple, microbatches: int, batch_dim: int = 0, *, source: str = "inputs", **options: Any
) -> Any:
    """The program of ``model`` exported on the first of ``microbatches`` parts of ``inputs`` (:func:`split_batch`).

    Where that export fails, its error says which inputs were cut: an input shared by the batch whose dimension
    ``batch_dim`` happens to equal the batch size is cut as if batched (FLUX's position ids with as many text
    tokens as the batch has samples), and the model then fails at the microbatch's size only."""
    from graphs.errors import CaptureError
    from graphs.export import export_program

    part = split_batch(inputs, microbatches, batch_dim, source=source)[0]
    try:
        return export_program(model, part, **options)
    except CaptureError as e:
        cut = [f"{k} {list(x.shape)}" for k, (x, c) in enumerate(zip(inputs, batched(inputs, batch_dim)[1])) if c]
        raise CaptureError(
            f"{e} (exported at one of {microbatches} microbatches: {source} {', '.join(cut)} cut along dimension "
            f"{batch_dim}; an input shared by the batch with the batch's size there is cut too: give the batch "
            "another size)"
        ) from None


def part_weights(parts: list[tuple], batch_dim: int = 0, reduction: str = "mean") -> list[float]:
    """What each microbatch's loss is multiplied by before they are added: its share of the batch for a ``"mean"``
    loss (equal parts, equal shares), 1 for a ``"sum"``; what a plan of microbatches computes, and gradient
    accumulation's reference (:func:`envs.real.conformance.reference`).

    >>> part_weights([(torch.zeros(3),), (torch.zeros(2),)]), part_weights([(torch.zeros(2),)] * 2, reduction="sum")
    ([0.6, 0.4], [1.0, 1.0])
    """
    if reduction == "sum":
        return [1.0] * len(parts)
    return _shares(parts, batch_dim) or [1.0 / len(parts)] * len(parts)


def _shares(parts: list[tuple], batch_dim: int) -> list[float] | None:
    """Each microbatch's share of the batch, or None when the shares are equal."""
    sizes = [
        next(t.shape[batch_dim] for t in part if isinstance(t, torch.Tensor) and t.dim() > batch_dim) for part in parts
    ]
    if len(set(sizes)) == 1:
        return None
    total = sum(sizes)
    return [size / total for size in sizes]


def _join_outputs(outs: list[Any], batch_dim: int, reduction: str, shares: list[float] | None = None) -> Any:
    """One output from the microbatches' outputs: scalars reduced, batched tensors concatenated.

    A mean over microbatches of unequal sizes (``shares``) weights each by its share of the batch.
    """
    first = outs[0]
    if isinstance(first, torch.Tensor):
        if first.dim() == 0:  # a loss: the mean over equal microbatches is the whole batch's mean
            if reduction == "mean" and shares is not None:
                total = outs[0] * shares[0]
                for o, share in zip(outs[1:], shares[1:]):
                    total = total + o.to(total.device) * share
                return total
            total = outs[0]
            for o in outs[1:]:
                total = total + o.to(total.device)
            return total / len(outs) if reduction == "mean" else total
        if first.dim() > batch_dim:
            return torch.cat([o.to(first.device) for o in outs], dim=batch_dim)
        return first
    if isinstance(first, (tuple, list)):
        joined = [_join_outputs([o[k] for o in outs], batch_dim, reduction, shares) for k in range(len(first))]
        if isinstance(first, tuple):
            return type(first)(*joined) if hasattr(first, "_fields") else tuple(joined)
        return joined
    if isinstance(first, dict):
        return {k: _join_outputs([o[k] for o in outs], batch_dim, reduction, shares) for k in first}
    return first


def stage_names(graph: OpGraph, assignment: dict[str, str], order: Sequence[str] | None) -> list[str]:
    """The first op of each stage after the first, where the simulator cuts the plan
    (:func:`envs.microbatch.stage_starts`; logical devices named ``cpu...`` are the host)."""
    devices = sorted(set(assignment.values()))
    position = {device: i for i, device in enumerate(devices)}
    op_devices = np.array([position[assignment[name]] for name in graph.names])
    host = np.array([device.startswith("cpu") for device in devices])
    op_order = np.arange(graph.num_ops) if order is None else np.array([graph.index[x] for x in order])
    return [graph.names[op_order[s]] for s in stage_starts(op_devices, op_order, host, free_mask(graph))[1:]]


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
    begins, :func:`stage_names`; each stage's nodes through an ``fx.Interpreter``,
    one environment per microbatch), in the simulator's host program: a stage of
    microbatch ``m`` after the ``backward()`` of microbatch ``m - w``, run here,
    inside the call, with the loss's share of the batch (``1/M`` for a mean of M
    equal microbatches). The result is then the loss (the program's output must
    be one 0-dim tensor), and its ``backward()`` runs the microbatches still in
    flight; it must be called with gradient 1 (plain ``loss.backward()``: the
    earlier microbatches' gradients are already in the parameters, taken with 1),
    else it raises. Under ``torch.no_grad()`` every microbatch runs forward only,
    as with W = M.

    Microbatches at other sizes than ``placed`` was built for run another program
    of the model (:class:`envs.real.programs.Programs`), with that program's stages;
    ``train()``/``eval()`` switch ``placed``'s mode, which picks its program too.
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
        self._schedules: dict[int, tuple[list[fx.Node], list[list[int]]]] = {}  # id(program) -> nodes, host program
        # the placed module's parameters, buffers and submodules under their own names (the
        # state dict of the unpipelined placed module), the module itself outside the tree
        object.__setattr__(self, "placed", placed)
        self._parameters, self._buffers, self._modules = placed._parameters, placed._buffers, placed._modules
        self._non_persistent_buffers_set = placed._non_persistent_buffers_set  # the same state dict, key for key
        self.microbatches = int(microbatches)
        self.batch_dim = int(batch_dim)
        self.reduction = reduction
        self.meta = {**getattr(placed, "meta", {}), MICROBATCH_META: self.microbatches}
        self.training = placed.training

    def train(self, mode: bool = True) -> MicrobatchedModule:
        """Set the mode of this module and of ``placed`` (whose program follows it)."""
        super().train(mode)
        self.placed.train(mode)
        return self

    def forward(self, *inputs: Any) -> Any:
        with global_state_kept():  # a stage run by the interpreter below is not the placed module's guarded call
            return self._forward(inputs)

    def _forward(self, inputs: tuple) -> Any:
        parts = split_batch(inputs, self.microbatches, self.batch_dim)
        try:
            return self._run_parts(parts)
        except (IndexError, RuntimeError) as e:
            note_part_failure(e, inputs, self.microbatches, self.batch_dim)
            raise

    def _run_parts(self, parts: list[tuple]) -> Any:
        shares = _shares(parts, self.batch_dim)
        if self.inflight >= self.microbatches or not torch.is_grad_enabled():
            return _join_outputs([self.placed(*part) for part in parts], self.batch_dim, self.reduction, shares)
        program, stages = self._program_for(parts)
        try:
            return self._one_forward_one_backward(program, stages, parts, shares)
        except AssertionError as e:  # a shape guard the program's _guards_fn did not check first (another torch)
            programs = getattr(self.placed, PROGRAMS_ATTR, None)
            error = guard_failure(e, programs.captured) if programs is not None else None
            if error is None:
                raise
            raise error from None

    def _program_for(self, parts: list[tuple]) -> tuple[fx.GraphModule, list[str]]:
        """The one program every microbatch runs (:class:`envs.real.programs.Programs`), and its stages."""
        programs = getattr(self.placed, PROGRAMS_ATTR, None)
        if programs is None:
            return self.placed, self.stages
        training = self.placed.training
        chosen = {id(p): p for p in (programs.program_for(part, {}, training) for part in parts)}
        dynamic = programs.mode(training).dynamic
        if (
            len(chosen) > 1
            and dynamic is not None
            and all(programs.refusal(training, part, {}) is None for part in parts)
        ):
            chosen = {id(dynamic): dynamic}  # microbatches of two sizes: the program that takes both
        if len(chosen) > 1:
            sizes = sorted({tuple(t.shape) for part in parts for t in tensors_of(part, {})})
            raise ShapeError(
                f"microbatches of shapes {sizes} run different programs of the model, and one-forward-one-backward "
                f"interleaves one program: use a batch that {self.microbatches} microbatches divide"
            )
        program = next(iter(chosen.values()))
        return program, programs.stages[id(program)]

    def _schedule(self, program: fx.GraphModule, stages: list[str]) -> tuple[list[fx.Node], list[list[int]]]:
        """The program's nodes and the host program over them (:func:`envs.microbatch.issue_segments`), built once."""
        if id(program) not in self._schedules:
            nodes = list(program.graph.nodes)
            segments = issue_segments(len(nodes), self.microbatches, self.inflight, _stage_nodes(nodes, stages))
            self._schedules[id(program)] = (nodes, segments.tolist())
        return self._schedules[id(program)]

    def _one_forward_one_backward(
        self, gm: fx.GraphModule, stages: list[str], parts: list[tuple], shares: list[float] | None
    ) -> Any:
        """Run the microbatches stage by stage in the host program, the early ones' backward inside the call."""
        M, W = self.microbatches, self.inflight
        if self.reduction == "sum":
            weights = [1.0] * M
        else:
            weights = shares if shares is not None else [1.0 / M] * M
        nodes, program = self._schedule(gm, stages)
        N = len(nodes)
        runs = [_StageRunner(gm, part) for part in parts]
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
                    (losses[m] * weights[m]).backward()
                    losses[m] = losses[m].detach()
        total = _join_outputs(losses, self.batch_dim, self.reduction, shares)
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

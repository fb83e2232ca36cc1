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

On CPU ranks (gloo) under GPipe, 1F1B and the interleaved and zero-bubble schedules
(:data:`EARLY_RECEIVES`), every receive of a step is posted as the step begins
(:func:`post_receives_early`; each stream of messages tagged, :func:`tag_streams`), not
just before the action that needs it as torch's schedules post them. Gloo moves a
message only once both sides have posted it, and a late receive waits for the sender's
event-loop thread, which shares its core with the sender's compute: a receive posted
late took 3-6 ms longer on this machine's two ranks (BENCHMARKS.md, "Receives posted early").

The schedule hands the last stage a *target* per microbatch for its loss function;
placer's last stage computes the loss itself (the captured program ends in it), so
the target is a placeholder of M zeros and the loss function returns the stage's output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import fx, nn

from envs.real.distributed.rank_plan import RankPlan
from envs.real.distributed.schedules import BUILDERS, SPLIT_BACKWARD
from envs.real.distributed.stage_modules import cached_program_values, place_stage, stage_programs, stage_shapes
from envs.real.pipeline import batched, note_part_failure, part_failure_of, split_batch
from envs.real.placing import to_device
from graphs import PlacerError
from graphs.export import first_line

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
    A frozen parameter (``requires_grad=False``) is left out: its copies stay equal with no gradient to sum (summing
    a zero one would also hand it to the optimizer, which steps whatever has a gradient).
    """
    names: dict[int, list[str]] = {}
    holders: dict[int, set[int]] = {}
    tensors: dict[int, nn.Parameter] = {}
    for module, rank in zip(modules, stage_ranks):
        for name, p in module.named_parameters(remove_duplicate=False):
            if not p.requires_grad:
                continue
            names.setdefault(id(p), []).append(name)
            holders.setdefault(id(p), set()).add(rank)
            tensors[id(p)] = p
    return {min(names[k]): (tuple(sorted(r)), tensors[k]) for k, r in holders.items() if len(r) > 1}


def stream_tag(receiving_stage: int, kind: str) -> int:
    """The tag of one stream of messages: the activations (``kind`` ``"f"``) or the gradients (``"b"``) that stage
    ``receiving_stage`` receives. Its peer tags its sends alike (:func:`tag_streams`).

    >>> stream_tag(1, "f"), stream_tag(1, "b"), stream_tag(3, "f")
    (2, 3, 6)
    """
    return 2 * int(receiving_stage) + (1 if kind == "b" else 0)


def tag_streams(stage: Any) -> None:
    """Give every message of ``stage`` (a torch ``PipelineStage``) the tag of its stream (:func:`stream_tag`).

    Gloo matches the receives from one peer to its messages by tag, in the order both sides posted them. torch
    tags nothing, so where a peer sends a rank two streams (a looped plan on 2 ranks: one stage's activations
    and another's gradients), a receive posted ahead of torch's order (:func:`post_receives_early`) would take
    the other stream's message. With a tag per stream, only the order within a stream counts, and each side
    posts a stream in microbatch order. The stages form a chain (:mod:`~envs.real.distributed.cut`): stage
    ``s`` sends activations to ``s + 1`` and gradients to ``s - 1``. Every rank tags every stage, so sends and
    receives agree whatever each rank posts early; NCCL ignores the tags.
    """
    s = int(stage.stage_index)
    asks = {
        "get_fwd_recv_ops": stream_tag(s, "f"),
        "get_bwd_recv_ops": stream_tag(s, "b"),
        "get_fwd_send_ops": stream_tag(s + 1, "f"),
        "get_bwd_send_ops": stream_tag(s - 1, "b"),
    }

    def tagged(ask: Any, tag: int) -> Any:
        def get_ops(*args: Any, **kwargs: Any) -> list[Any]:
            ops = ask(*args, **kwargs)
            for op in ops:
                op.tag = tag
            return ops

        return get_ops

    for name, tag in asks.items():
        setattr(stage, name, tagged(getattr(stage, name), tag))


def post_receives_early(stage: Any, microbatches: int) -> None:
    """Make ``stage`` (a torch ``PipelineStage``) post all of a step's receives at once, each kind at its first ask.

    torch's schedules ask a stage for one microbatch's receive operations just before its forward
    (``get_fwd_recv_ops``) or backward (``get_bwd_recv_ops``), post them and wait. Here the first ask of a step
    posts every microbatch's receives of that kind (each into its own buffer, which torch keeps per microbatch)
    and every ask returns none to post; the forward or backward of microbatch ``i`` first waits for its own.
    The step's bookkeeping starts anew where torch's schedule clears the stage (``clear_runtime_states``, at each
    step's start). Only this stage object's methods are wrapped; nothing of torch is patched globally.

    The compute itself stays reachable as ``stage.placer_compute`` (method name -> callable, called at each
    action), so that :class:`~envs.real.distributed.trace.ActionRecorder` times the compute and not the wait for
    its receive, as it does where torch's schedule waits.
    """
    pending: dict[tuple[str, int], list[Any]] = {}
    posted: set[str] = set()
    asks = {"f": stage.get_fwd_recv_ops, "b": stage.get_bwd_recv_ops}
    names = {"f": "forward_one_chunk", "b": "backward_one_chunk"}
    stage.placer_compute = {name: getattr(stage, name) for name in names.values()}
    clear = stage.clear_runtime_states

    def asked(kind: str) -> Any:
        def get_recv_ops(chunk: int, *args: Any, **kwargs: Any) -> list[Any]:
            if kind not in posted:
                posted.add(kind)
                for m in range(microbatches):
                    ops = asks[kind](m, *args, **kwargs)
                    pending[(kind, m)] = list(dist.batch_isend_irecv(ops)) if ops else []
            return []

        return get_recv_ops

    def run(kind: str) -> Any:
        def one_chunk(chunk: int, *args: Any, **kwargs: Any) -> Any:
            for work in pending.pop((kind, int(chunk)), []):
                work.wait()
            return stage.placer_compute[names[kind]](chunk, *args, **kwargs)

        return one_chunk

    def clear_runtime_states(*args: Any, **kwargs: Any) -> Any:
        posted.clear()
        for works in pending.values():  # a step cut short: nothing of it is left waiting into the next
            for work in works:
                work.wait()
        pending.clear()
        return clear(*args, **kwargs)

    stage.get_fwd_recv_ops, stage.get_bwd_recv_ops = asked("f"), asked("b")
    stage.forward_one_chunk, stage.backward_one_chunk = run("f"), run("b")
    stage.clear_runtime_states = clear_runtime_states


def orphan_parameters(outputs: Sequence[Any], inputs: Sequence[Any], params: Sequence[nn.Parameter]) -> list:
    """The parameters part of whose gradient torch's zero-bubble weight part leaves out: those with a path to the
    stage's ``outputs`` that meets no path from its ``inputs``.

    Torch's weight part starts from the *intermediates* where a parameter's paths meet the inputs' (its
    ``get_param_groups``, whose own check that every parameter is in a group is switched off), so a path that
    meets none carries a gradient it never computes: a weight's transpose made in one stage and sent to the next
    (Falcon), a relative position bias computed from parameters only and added to every layer's attention (T5).
    Found on the real autograd graph of one microbatch (its nodes walked as torch walks them).
    """
    from torch.distributed.pipelining._backward import (  # noqa: PLC2701 (the walk torch's weight part makes)
        _get_grad_fn_or_grad_acc,
        construct_reverse_graph,
    )

    roots = [_get_grad_fn_or_grad_acc(t) for t in outputs if isinstance(t, torch.Tensor) and t.requires_grad]
    roots = [n for n in roots if n is not None]
    parents = construct_reverse_graph(roots)
    # the inputs' closure: every node from which an input's gradient is reached
    meets = {_get_grad_fn_or_grad_acc(t) for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad}
    meets.discard(None)
    todo = list(meets)
    while todo:
        for parent in parents.get(todo.pop(), ()):
            if parent not in meets:
                meets.add(parent)
                todo.append(parent)
    # what the outputs reach without passing through that closure
    apart = {n for n in roots if n not in meets}
    todo = list(apart)
    while todo:
        for child, _ in todo.pop().next_functions:
            if child is not None and child not in meets and child not in apart:
                apart.add(child)
                todo.append(child)
    return [p for p in params if p.requires_grad and _get_grad_fn_or_grad_acc(p) in apart]


def merged_param_groups(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Torch's zero-bubble parameter groups (``stage_backward_input``'s), merged where they share a parameter or an
    intermediate: each parameter in one group, so its weight part counts each path once.

    Torch's ``get_param_groups`` joins a parameter's group to the group of each intermediate it meets one at a
    time, so a parameter that meets the intermediates of two groups already apart leaves both groups holding it and
    their intermediates: its weight part (``stage_backward_weight``) then adds its gradient twice, and the other
    parameters of both groups' too. Seen on SigLIP's pooling head (``nn.MultiheadAttention``'s packed projection,
    read by a learned query's branch and by the tokens' branch): its gradients came out 1.0 and 0.67 relative
    error apart from one process's, by the order a set was walked in. Each merged group keeps each intermediate
    once, with the gradients a hook of any of its groups took there (one node's hooks all see the same).
    """
    parent = list(range(len(groups)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[Any, int] = {}
    for i, group in enumerate(groups):
        for node in (*group["params"], *group["intermediates"]):
            j = owner.setdefault(node, i)
            if root(j) != root(i):
                parent[root(j)] = root(i)
    params: dict[int, set] = {}
    taken: dict[int, dict[Any, Any]] = {}  # each merged group's intermediates, in order, and the gradients taken there
    for i, group in enumerate(groups):
        params.setdefault(root(i), set()).update(group["params"])
        at = taken.setdefault(root(i), {})
        for node, grad in zip(group["intermediates"], group.get("grads") or [None] * len(group["intermediates"])):
            if at.get(node) is None:
                at[node] = grad
    return [
        {"params": params[r], "intermediates": list(at), "grads": [() if g is None else g for g in at.values()]}
        for r, at in taken.items()
    ]


def mend_split_backward(stage: Any) -> None:
    """Make ``stage`` (a torch ``PipelineStage`` under a zero-bubble schedule) compute every gradient.

    Its :func:`orphan_parameters` get their whole gradient in its input part, computed from the stage's outputs
    before torch's input part detaches those; torch's weight part then leaves those parameters out (else it would
    add their other paths' part twice). Which parameters they are is found at the stage's first input part (the
    program does not change between microbatches or steps). Only this stage object's method is wrapped.

    Its parameter groups are merged where torch's share a parameter (:func:`merged_param_groups`; torch's count such
    a parameter's gradient twice). Its weight part also keeps the microbatch's graph until the step drops it: torch
    runs each parameter group's with ``retain_graph=False``, which frees what the next group still needs where two
    groups' paths meet below their intermediates (Whisper's stages).
    """
    from torch.distributed.pipelining._backward import (  # noqa: PLC2701
        _get_grad_fn_or_grad_acc,
        stage_backward_weight,
    )

    inner = stage.backward_maybe_with_nosync
    found: list[list[nn.Parameter]] = []

    def backward_maybe_with_nosync(backward_type: str, bwd_kwargs: dict, *args: Any, **kwargs: Any) -> Any:
        if backward_type == "weight":
            groups = bwd_kwargs["param_groups"]
            return stage_backward_weight(stage.submod.parameters(), groups, retain_graph=True), None
        if backward_type != "input":
            return inner(backward_type, bwd_kwargs, *args, **kwargs)
        outputs = bwd_kwargs["stage_output"]
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
        if not found:
            found.append(orphan_parameters(outputs, bwd_kwargs["input_values"], list(stage.submod.parameters())))
        orphans = found[0]
        if orphans:
            grads = bwd_kwargs["output_grads"]
            pairs = [
                (t, torch.ones_like(t) if grads is None else grads[i])
                for i, t in enumerate(outputs)
                if isinstance(t, torch.Tensor) and t.requires_grad
            ]
            pairs = [(t, g) for t, g in pairs if g is not None]
            parts = torch.autograd.grad(
                [t for t, _ in pairs], orphans, [g for _, g in pairs], retain_graph=True, allow_unused=True
            )
            for p, g in zip(orphans, parts):
                if g is not None:
                    p.grad = g if p.grad is None else p.grad + g
        grads_input, groups = inner(backward_type, bwd_kwargs, *args, **kwargs)
        if groups:
            groups[:] = merged_param_groups(groups)
        if orphans and groups:
            done = {_get_grad_fn_or_grad_acc(p) for p in orphans}
            for group in groups:
                group["params"] = {n for n in group["params"] if n not in done}
            groups[:] = [g for g in groups if g["params"]]
        return grads_input, groups

    stage.backward_maybe_with_nosync = backward_maybe_with_nosync


#: The schedules whose receives a CPU rank posts early unless told (:func:`early_by_default`). Torch's schedules of one
#: stage per rank, and the interleaved and zero-bubble schedules of a looped or V plan: where torch posts a receive one
#: time step ahead, its data often moved only when the sender's gloo thread got the sender's busy core, and those
#: plans waited 5-20 ms a step more than simulated on two CPU ranks. Posted early, the step took 0.82-1.02x as long
#: (``interleaved_1f1b``, three models, 3 and 5 jobs each), 0.91x (``interleaved_zb``) and 0.97x (``zbv``), paired
#: job by job (BENCHMARKS.md, "Where a rank of two stages loses its time"). ``looped_bfs`` (115 ms against 94 ms
#: on the encoder-decoder, BENCHMARKS.md "Receives posted early") and ``dualpipev`` (0.97x in one run, 1.06x in
#: another) keep torch's posting, as does ``planned`` (not measured).
EARLY_RECEIVES = ("gpipe", "1f1b", "interleaved_1f1b", "interleaved_zb", "zbv")


def early_by_default(device_type: str, schedule: str) -> bool:
    """Whether a rank on ``device_type`` running ``schedule`` posts its receives early when not told.

    >>> early_by_default("cpu", "gpipe"), early_by_default("cpu", "interleaved_1f1b"), early_by_default("cpu", "zbv")
    (True, True, True)
    >>> early_by_default("cpu", "looped_bfs"), early_by_default("cpu", "dualpipev"), early_by_default("cuda", "1f1b")
    (False, False, False)
    """
    return device_type == "cpu" and schedule in EARLY_RECEIVES


def chunk_specs(inputs: Sequence[Any]) -> tuple[Any, ...]:
    """How torch's schedule cuts each input into microbatches, by the rule of one process
    (:func:`envs.real.pipeline.batched`): along dimension 0, or whole to every microbatch (torch's ``_Replicate``; its
    default would cut every tensor)."""
    from torch.distributed.pipelining.microbatch import TensorChunkSpec, _Replicate  # noqa: PLC2701

    return tuple(TensorChunkSpec(0) if c else _Replicate() for c in batched(inputs)[1])


def stage_failure(error: RuntimeError, inputs: tuple, microbatches: int) -> Exception | None:
    """What a rank raises for ``error``, raised by torch's schedule while it ran a step of ``microbatches`` parts of
    ``inputs`` (None: ``error`` itself). Torch's stage wraps what the program raised in an error that says only
    which stage failed (``[Stage 1] failed to run forward:``, then its arguments' shapes), so the job's line said
    nothing of the cause: a model that fails on a microbatch gets :func:`~envs.real.pipeline.note_part_failure`'s
    line (a :class:`PlacerError`); any other cause is named on the stage's line.

    >>> try:
    ...     try:
    ...         raise ValueError("bad shape")
    ...     except ValueError as cause:
    ...         raise RuntimeError("\\n    [Stage 1] failed to run forward:\\n    args: (...)") from cause
    ... except RuntimeError as e:
    ...     stage_failure(e, (), 1)
    RuntimeError('[Stage 1] failed to run forward: ValueError: bad shape')
    """
    cause = error.__cause__
    if isinstance(cause, (IndexError, RuntimeError)):
        note_part_failure(cause, inputs, microbatches)
    line = part_failure_of(error)
    if line is not None:
        return PlacerError(line)
    text = str(error).strip()
    head = text.splitlines()[0].strip() if text else ""
    if cause is None or not head.startswith("[Stage"):
        return None
    return RuntimeError(f"{head} {type(cause).__name__}: {first_line(cause, limit=300)}")


class RankSchedule:
    """This rank's stages of ``plan`` and the schedule that runs them (see the module doc).

    Args:
        plan: the compiled plan (:func:`~envs.real.distributed.rank_plan.compile_plan`).
        program: the ``ExportedProgram`` of one microbatch (the whole batch when M = 1),
            whose op names the plan's stages use; or its module (``program.module()``), made once for several
            schedules of one program (unlifting it again costs a tenth of a second on a small model).
        example_inputs: the whole batch's inputs (their first microbatch gives the shapes).
        rank: this process's global rank.
        group: the process group of the pipeline (default: the world).
        early_receives: post every receive of a step as it begins (:func:`post_receives_early`); None: on CPU
            ranks (gloo) under GPipe, 1F1B, Interleaved 1F1B, interleaved zero bubble and ZB-V
            (:func:`early_by_default`). Every stage's messages are tagged by stream either way
            (:func:`tag_streams`), so a looped plan may post early too, and ranks that post differently still agree.
        validate: every stage checks each microbatch's inputs and outputs against the shapes, strides and dtypes
            it was given (torch checks so under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, which also checks every
            collective); for the conformance checks (:mod:`bench.dist_conformance`).
    """

    def __init__(
        self,
        plan: RankPlan,
        program: Any,
        example_inputs: Sequence[Any],
        rank: int,
        group: Any = None,
        early_receives: bool | None = None,
        validate: bool = False,
    ) -> None:
        from torch.distributed.pipelining import PipelineStage

        self.plan, self.rank = plan, rank
        self.num_stages = len(plan.stages)
        self.stage_indices = plan.rank_stages(rank)
        if not self.stage_indices:
            raise PlacerError(f"rank {rank}: no stage of the plan runs here (ranks {sorted(set(plan.stage_ranks))})")
        devices = {d.rank: d.torch_device for d in plan.devices.values()}
        self.torch_device = torch.device(devices[rank])
        split = plan.schedule in SPLIT_BACKWARD
        module = program if isinstance(program, fx.GraphModule) else program.module()
        modules = stage_programs(module, [s.ops for s in plan.stages], split_backward=split)
        microbatch = split_batch(tuple(example_inputs), plan.microbatches)[0]
        # the stages' shapes, from one run of the whole program on fake tensors, kept with the program for the
        # next schedule of it (another plan's, the next job's)
        shapes = stage_shapes(modules, microbatch, cached_program_values(program, module, microbatch))
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
        default = early_by_default(self.torch_device.type, plan.schedule)
        self.early_receives = default if early_receives is None else bool(early_receives)
        for stage in self.stages:
            if validate:
                stage._runtime_validate = True  # noqa: SLF001  (torch's own switch, set by its debug level)
            if split:
                mend_split_backward(stage)
            tag_streams(stage)  # first: the early posting asks the tagged receives
            if self.early_receives:
                post_receives_early(stage, plan.microbatches)
        self.shared = [(p, groups[ranks]) for _, (ranks, p) in sorted(shared.items()) if rank in ranks]
        self.schedule = BUILDERS[plan.schedule](self.stages, plan.microbatches, loss_is_output, plan.actions())
        # every schedule splits the inputs through this (torch's LoopedBFS takes no args_chunk_spec)
        self.schedule._args_chunk_spec = chunk_specs(example_inputs)  # noqa: SLF001

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
        try:
            self.schedule.step(*args, target=target, losses=losses, return_outputs=False)
        except RuntimeError as e:  # torch's stage says "failed to run forward", its cause says why
            said = stage_failure(e, tuple(inputs), M)
            if said is None:
                raise
            raise said from e
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


__all__ = [
    "EARLY_RECEIVES",
    "RankSchedule",
    "chunk_specs",
    "early_by_default",
    "loss_is_output",
    "orphan_parameters",
    "post_receives_early",
    "mend_split_backward",
    "shared_parameters",
    "stream_tag",
    "tag_streams",
]

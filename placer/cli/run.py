"""``placer run``: real training steps of a placed model on torch devices; median step time, peak memory per device.

Typical use::

    placer run nmt-2 --placement best_placement.json --cluster h200x1 --steps 10
    placer run mypkg.models:build --placement p.json --cluster k80x2 --device-map '*=cpu' --check

``--check`` first runs one step of the placed model and compares its loss, every gradient and every buffer after
it with the unplaced model's step in float64 (:func:`check_here`), as across processes.

With ``--nproc-per-node`` the plan runs across processes, one per device, on torch's
pipeline runtime (:mod:`placer.distributed`), started by torch's launcher; several
machines (``--nnodes``) meet at ``--rdzv-endpoint``::

    placer run mypkg.models:build --placement p.json --cluster k80x2 --nproc-per-node 2 --check
"""

from __future__ import annotations

import argparse
from typing import Any

import envs
from envs.cluster import CLUSTER_ARG_HELP
from graphs import sources
from graphs.errors import PlacerError
from graphs.plan import Placement
from placer.cli.args import DEVICE_MAP_HELP, check_step_counts, measure_here, warn_if_mixing
from placer.cli.checked import check_line
from placer.cli.output import print_json


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="train a placed model on real devices and time its steps",
        description="Run real training steps (forward, loss, backward, Adam step) of SOURCE with every op on the "
        "device PLACEMENT gives it; print the median step time and the peak memory per device.",
    )
    p.add_argument("source", metavar="SOURCE", help="zoo name or module:callable returning (model, example_inputs)")
    p.add_argument(
        "--placement", required=True, metavar="FILE", help="placement file (from `placer place` or `placer train`)"
    )
    p.add_argument("--cluster", required=True, help=CLUSTER_ARG_HELP)
    p.add_argument("--device-map", default=None, metavar="MAP", help=DEVICE_MAP_HELP)
    p.add_argument("--steps", type=int, default=10, help="timed training steps (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed warm-up steps first (default 2)")
    p.add_argument(
        "--lr",
        type=float,
        default=1e-3,
        help="learning rate of torch's fused Adam, the optimizer the simulator charges (default 1e-3)",
    )
    p.add_argument(
        "--measure-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="seconds the steps may take (default 600)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="first compare one step's loss, every gradient and every buffer after it with the unplaced model's "
        "step (float64 reference; in this process, or across processes with --nproc-per-node); dropout and other "
        "draws are held at their likeliest values in both (dropout keeps every unit); exit 1 where it fails, or "
        "where the step draws what cannot be held so (a Poisson draw: no verdict)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON (step_time_s, peak_bytes, ...)")
    across = p.add_argument_group(
        "across processes",
        "one process per device of the plan, on torch's pipeline runtime (torch.distributed.pipelining)",
    )
    across.add_argument(
        "--nproc-per-node",
        type=nproc,
        default=None,
        metavar="N",
        help="processes on this machine (one per device); auto: one per device the plan uses (one machine)",
    )
    across.add_argument("--nnodes", type=int, default=1, metavar="K", help="machines of the job (default 1)")
    across.add_argument("--node-rank", type=int, default=0, metavar="R", help="this machine's index (default 0)")
    across.add_argument(
        "--rdzv-endpoint", default=None, metavar="HOST:PORT", help="where node 0 serves the rendezvous (with --nnodes)"
    )
    across.add_argument(
        "--rdzv-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="seconds to wait for every machine at the rendezvous (default 300)",
    )
    across.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="process group (default gloo)")
    across.add_argument(
        "--rank-map",
        default=None,
        metavar="MAP",
        help="logical device -> rank, e.g. gpu:0=1,gpu:1=0 (default: the plan's devices in order are ranks 0, 1...)",
    )
    across.add_argument(
        "--trace",
        default=None,
        metavar="FILE",
        help="write the median step's timeline to FILE (Chrome trace JSON: open it in ui.perfetto.dev or "
        "chrome://tracing): each rank's forwards, backwards and optimizer step, measured, and beside them the "
        "same plan simulated on --cluster; the report then puts each rank's simulated phases beside the measured",
    )
    across.add_argument(
        "--profile",
        default=None,
        metavar="PROFILE.json",
        help="with --trace: simulate the plan with this `placer profile` file's per-op times (as train, compare and "
        "place --ranks --profile do), so the trace shows where the simulator they used is off",
    )
    p.set_defaults(func=run)


#: The options of a run across processes, with the value that means "not given".
ACROSS = {
    "nnodes": 1,
    "node_rank": 0,
    "rdzv_endpoint": None,
    "rdzv_timeout": 300.0,
    "backend": "gloo",
    "rank_map": None,
    "trace": None,
    "profile": None,
}


def nproc(text: str) -> int | str:
    """``--nproc-per-node``: a number, or ``auto`` (the plan's device count, known once the plan is read).

    >>> nproc("2"), nproc("auto")
    (2, 'auto')
    """
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of processes, or auto") from None


def run(args: argparse.Namespace) -> int:
    if args.nproc_per_node is not None:
        from placer.cli.run_ranks import run_ranks  # torch's launcher: loaded only to run across processes

        return run_ranks(args)
    given = [k for k, unset in ACROSS.items() if getattr(args, k) != unset]
    if given:
        raise PlacerError(f"--{given[0].replace('_', '-')}: runs across processes; add --nproc-per-node N")
    return run_here(args)


def run_here(args: argparse.Namespace) -> int:
    """The plan in this process (:func:`placer.apply`)."""
    # the real runtime (torch): loaded only to run
    import torch

    from envs.real import timing
    from envs.real.devices import check_available, resolve_devices
    from envs.real.pipeline import part_failure_of
    from placer.apply import apply

    check_step_counts(args)
    cluster = envs.resolve_cluster(args.cluster)
    placement = Placement.load(args.placement)
    check_devices(placement, cluster, args.placement)
    torch_devices = resolve_devices(sorted(placement.devices_used()), args.device_map)  # a home's device: its peak too
    check_available(torch_devices)
    measure_here()
    model, inputs = sources.resolve_model(args.source)
    warn_if_mixing(args.source, args.placement, model, inputs, placement.microbatches)
    ref = check_reference(args, model, inputs, placement) if args.check else None  # from the model as it is
    module = apply(model, placement, inputs, device_map=args.device_map)
    check = check_here(args, module, inputs, ref) if ref is not None else None
    opt = timing.placed_adam(module, placement, lr=args.lr)  # its homed parameters step as the plan says
    try:
        with timing.time_limit(args.measure_timeout):
            m = timing.measure_steps(
                module,
                inputs,
                opt,
                torch_devices,
                warmup_steps=args.warmup,
                timed_steps=args.steps,
                loss_fn=_the_loss(args.source),
                protocol=timing.Protocol(),  # as the measured envs time steps: the collector held off, malloc steady
            )
        result = envs.Result(
            m["step_time_s"],
            "ok",
            peak_bytes=m["peak_bytes"],
            source="measured",
            extra={
                "step_times_s": m["step_times_s"],
                "losses": m["losses"],
                "device_map": {device: str(torch_device) for device, torch_device in torch_devices.items()},
                "thread_cache_off": m["protocol"]["thread_cache_off"],  # glibc's, as this process started
            },
        )
        steps = host_step_counts(module, args.steps)
        if steps is not None:
            result.extra["host_steps"] = steps
    except (torch.OutOfMemoryError, MemoryError, timing.StepTimeout) as e:
        status = timing.failure_status(e)
        result = envs.Result(
            float("inf"),
            status,
            f"{'out of memory' if status == 'oom' else 'timeout'}: "
            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}",
            source="measured",
        )
    except (IndexError, RuntimeError) as e:  # on a microbatch: one line that says how the batch was cut
        line = part_failure_of(e)
        if line is None:
            raise
        raise PlacerError(f"{args.source} with {args.placement}: {line}") from None
    if check is not None:
        result.extra["check"] = check
    checked = check is None or bool(check["ok"])
    if args.json:
        print_json(result.to_dict())
        return 0 if result.ok and checked else 1
    if not result.ok:
        print(f"{args.source}: {result.status}: {result.message}")
        if check is not None:
            print(check_line(check, "the unplaced step"))
        return 1
    times = result.extra["step_times_s"]
    print(
        f"{args.source} on {cluster.name} ({placement.method or 'placement'} {args.placement}): "
        f"step time {result.step_time_s * 1e3:.2f} ms (median of {len(times)}; min {min(times) * 1e3:.2f}, max "
        f"{max(times) * 1e3:.2f})"
    )
    print(f"{'device':<8} {'torch':<8} {'ops':>6} {'peak memory':>14}")
    counts = placement.device_counts()
    for device, torch_device in torch_devices.items():
        peak_gb = result.peak_bytes.get(device, 0) / 1e9
        print(f"{device:<8} {str(torch_device):<8} {counts.get(device, 0):>6} {peak_gb:>11.3f} GB")
    steps = result.extra.get("host_steps")
    if steps:
        print(
            f"homes    {steps['stepped']:.0f} homed parameters stepped during each backward in {steps['calls']:.0f} "
            f"optimizer calls (medians of the timed steps): the host worker's tasks took {steps['worker_s'] * 1e3:.2f} "
            f"ms, and backward() waited {steps['waited_s'] * 1e3:.2f} ms for them after autograd (the host's Adam "
            "not overlapped)"
        )
    print(f"loss {result.extra['losses'][0]:.4f} -> {result.extra['losses'][-1]:.4f}")
    if check is not None:
        print(check_line(check, "the unplaced step"))
    return 0 if checked else 1


def check_reference(args: argparse.Namespace, model: Any, inputs: tuple, placement: Placement) -> Any:
    """``--check`` in this process: the float64 step the placed step is compared with
    (:func:`envs.real.conformance.plan_reference`: gradient accumulation where the plan's microbatches compute it),
    from the model before the plan is applied to it."""
    from envs.real.conformance import plan_reference

    return plan_reference(model, inputs, placement.microbatches)


def check_here(args: argparse.Namespace, module: Any, inputs: tuple, ref: Any) -> dict[str, Any]:
    """One step of the placed ``module`` against ``ref`` (:func:`check_reference`), its draws held at their
    likeliest values as the reference's were; the report :func:`placer.cli.run_ranks.print_report` prints. The
    step's gradients are cleared after; the timed steps start from the buffers it left."""
    from envs.real.conformance import model_buffers, parameter_grads, verdict
    from envs.real.fixed_draws import fixed_draws
    from envs.real.homes import runtime_of

    if ref.unchecked:
        return verdict(ref, None, {})
    # a plan with parameter homes: the step's gradients come home to their parameters (the host's copies), where
    # they are compared; nothing steps them (the optimizer that steps homed parameters during the backward is
    # registered after the check), so the check's step is not one that warns of a missing optimizer
    runtime = runtime_of(module)
    host_step = runtime.host_step if runtime is not None else None
    if runtime is not None:
        runtime.host_step = "after"
    try:
        with fixed_draws():
            loss = _the_loss(args.source)(module(*inputs))
            loss.backward()
    finally:
        if runtime is not None:
            runtime.host_step = host_step
    report = verdict(ref, loss, parameter_grads(module), model_buffers(module))
    module.zero_grad(set_to_none=True)
    return report


def host_step_counts(module: Any, steps: int) -> dict[str, float] | None:
    """The median over the last ``steps`` backwards (the timed steps) of what the host worker stepping ``module``'s
    homed parameters during the backward did (:class:`envs.real.homes.HostStepCounts`); None where nothing stepped
    so."""
    from envs.real.homes import runtime_of

    runtime = runtime_of(module)
    return None if runtime is None else runtime.counts.median(steps)


def check_devices(placement: Placement, cluster: Any, path: str) -> None:
    """Every device the placement uses (its ops' and its parameters' homes) is one of the cluster's."""
    unknown = sorted(placement.devices_used() - set(cluster.device_names))
    if unknown:
        raise PlacerError(
            f"{path}: uses device {unknown[0]!r}, not in cluster {cluster.name} ({', '.join(cluster.device_names)})"
        )


def _the_loss(source: str) -> Any:
    """The training objective of ``placer run``: what the model returns, which must be a scalar loss.

    A stand-in (the mean of logits) would train the model toward nothing and
    report its "loss" as if it had; such a model is refused at its first step.
    """
    import torch  # the real runtime: loaded only to run

    def loss_fn(outputs: Any) -> Any:
        leaves = [t for t in torch.utils._pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor)]
        described = [{"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for t in leaves]
        if isinstance(outputs, torch.Tensor) and sources.is_scalar_loss(described):
            return outputs
        raise PlacerError(
            f"{source}: the model returns {sources.describe_outputs(described)}, not a scalar loss; "
            "`placer run` trains it as it is, so its forward must return the loss (wrap it: "
            "forward(inputs, labels) -> loss)"
        )

    return loss_fn

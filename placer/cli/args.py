"""Arguments several commands share: ``--profile``, ``--executor``, ``--option KEY=VALUE``, ``--device-map``.

>>> parse_options(["device=gpu:1", "k=3", "x=0.5", "flag=true"])
{'device': 'gpu:1', 'k': 3, 'x': 0.5, 'flag': True}
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

from envs.sim.schedule import EXECUTORS
from envs.sim.simulator import EXECUTOR_ARG_HELP
from graphs import OpGraph, sources, zoo
from graphs.errors import PlacerError
from placer.cli.parser import closest
from placer.methods import registry
from placer.option_checks import check_float, check_int

#: Whether this process is the ``placer`` command itself (:func:`placer.cli.console_main` sets it): only then may a
#: command that measures in its own process start it again (:func:`measure_here`). A caller of
#: :func:`placer.cli.main` (a test, a script) keeps its process.
CONSOLE = {"command": False}

DEVICE_MAP_HELP = "logical -> torch devices, e.g. gpu:0=cuda:1,*=cpu (default gpu:i=cuda:i, cpu:0=cpu)"


class MethodsHelp(argparse.HelpFormatter):
    """A help formatter that lists the heuristics where a help text says ``{methods}``.

    The list is made only when help is printed: loading every heuristic takes a second.
    """

    def _expand_help(self, action: argparse.Action) -> str:
        text = super()._expand_help(action)
        if "{methods}" in text:
            from placer.compare import default_methods  # every heuristic module: only to print help

            text = text.replace("{methods}", ", ".join(default_methods()))
        return text


def measure_here() -> None:
    """Before a command times steps or ops in its own process: the ``placer`` command starts itself again, the same
    command line, with glibc's thread cache off when it is on
    (:func:`envs.real.allocator.start_again_with_thread_cache_off`), as every process placer starts to measure in
    does (the ranks of a job, the measured envs' actors): with the cache on, the heap can grow by a large tensor at
    every step, and its pages fault anew."""
    if CONSOLE["command"]:
        from envs.real.allocator import start_again_with_thread_cache_off  # ctypes only

        start_again_with_thread_cache_off([sys.executable, *sys.orig_argv[1:]])


def add_profile_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--profile PROFILE.json`` to a command's parser (place, simulate, compare)."""
    parser.add_argument(
        "--profile",
        metavar="PROFILE.json",
        default=None,
        help="calibrate the simulator with a `placer profile` file (per-op times, link speeds); with --ranks, "
        "its per-op times only (the --ranks cluster keeps its own rates and links)",
    )


def add_executor_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--executor {eager,dataflow}`` (the simulator's executor model) to a command's parser."""
    parser.add_argument("--executor", metavar="{" + ",".join(EXECUTORS) + "}", default="eager", help=EXECUTOR_ARG_HELP)


def profiled(
    graph: OpGraph, cluster: Any, profile: str | None, device_map: str | None = None, *, ranks: bool = False
) -> tuple[OpGraph, Any]:
    """The graph with measured op times and the cluster with measured links, when ``--profile`` is given (with
    ``--ranks``, the op times only: :func:`envs.real.profiler.with_profile`).

    The graph's hash, so the placements made for it, is unchanged.
    """
    if not profile:
        return graph, cluster
    from envs.real.profiler import with_profile  # the real runtime's side (torch): loaded only with --profile

    return with_profile(graph, cluster, profile, device_map=device_map, ranks=ranks)


def captured(source: str, progress: Any, microbatches: int = 1) -> OpGraph:
    """SOURCE's graph, with a line on ``progress`` (a :class:`placer.learn.progress.Progress`) before and after a
    capture; for plans of ``microbatches`` over 1 of a ``module:callable``, :func:`warn_if_mixing`'s line too."""
    if not sources.will_capture(source):
        return sources.resolve_graph(source)
    once = f"once: cached in {zoo.cache_dir()}" if source in zoo.names() else "a minute for a large model"
    progress.phase(f"capturing {source} with torch.export ({once})")
    t0 = time.perf_counter()
    graph, model, inputs = sources.resolve_graph_model_inputs(source)
    progress.phase(f"captured {graph.num_ops:,} ops in {time.perf_counter() - t0:.0f} s")
    if model is not None:
        warn_if_mixing(source, f"--microbatches {microbatches}", model, inputs, microbatches)
    return graph


def note_stand_in_loss(graph: OpGraph, source: str) -> None:
    """One line on stderr when SOURCE's model does not return a scalar loss: what the simulator scores instead."""
    why = sources.stand_in_loss(graph)
    if why:
        print(
            f"placer: note: {source}: {why}; its step is scored with a stand-in loss, {sources.STAND_IN_LOSS} "
            "(`placer run` and `placer train --env measured` need the loss: wrap the model so forward returns it)",
            file=sys.stderr,
        )


def roofline_ranks_note(what: str) -> str:
    """The line for plans of more stages than ranks timed without per-op times (``what``: which plans): the
    roofline alone was 21 % off such plans measured on two CPU ranks, per-op times 7 % (BENCHMARKS.md, "Looped and
    V plans against the simulator")."""
    return (
        f"note: {what} timed by the roofline alone: measured on two CPU ranks, such plans were 21 % off it and 7 % "
        "off with per-op times (`placer profile SOURCE --ranks N -o ranks.json --ops ops.json`, then --profile "
        "ops.json)"
    )


def profiled_source(
    source: str, cluster: Any, profile: str | None, *, ranks: bool = False
) -> tuple[OpGraph, Any, tuple | None, Any]:
    """``(graph, model, inputs, cluster)`` of GRAPH argument ``source`` on ``cluster``: the model and its example
    inputs are None unless ``source`` is a ``module:callable``, a stand-in loss is noted on stderr, and
    ``--profile``'s measured op times and links are on the graph and the cluster (place, compare)."""
    graph, model, inputs = sources.resolve_graph_model_inputs(source)
    note_stand_in_loss(graph, source)
    graph, cluster = profiled(graph, cluster, profile, ranks=ranks)
    return graph, model, inputs, cluster


#: Models with more parameters than this are not run twice more on the host to check their batch (a minute or more).
MIXING_CHECK_PARAMETERS = 200_000_000


def warn_if_mixing(source: str, path: str, model: Any, inputs: tuple, microbatches: int) -> bool:
    """Before a plan of ``microbatches`` (over 1) runs: a ``warning:`` line on stderr where the model's step mixes
    the samples of its batch (:func:`envs.real.pipeline.batch_mixing`: a contrastive loss over the batch, batch
    norm in training), whose gradients such a plan computes per microbatch, as gradient accumulation does. The
    model runs a forward and a backward on the whole batch and on its parts first, on the host, where it has at most
    :data:`MIXING_CHECK_PARAMETERS` parameters. True where it warned."""
    if microbatches <= 1 or sum(p.numel() for p in model.parameters()) > MIXING_CHECK_PARAMETERS:
        return False
    from envs.real.pipeline import batch_mixing

    line = batch_mixing(model, inputs, microbatches)
    if line is not None:
        print(f"{source} with {path}: warning: {line}", file=sys.stderr, flush=True)
    return line is not None


def check_method(name: str, option: str) -> str:
    """``name`` if it is a registered heuristic, else a one-line :class:`PlacerError` naming ``option`` and the
    closest name (every heuristic when none is close)."""
    known = registry.names()
    if name not in known:
        suggestion = closest(name, known)
        raise PlacerError(
            f"{option}: unknown placement method {name!r} "
            + (f"(did you mean {suggestion!r}?)" if suggestion else f"(known: {', '.join(known)})")
        )
    return name


def parse_options(items: list[str]) -> dict[str, Any]:
    """``["k=v", ...]`` -> dict, with ints, floats and true/false converted.

    A number that is not finite (``nan``, ``inf``) is refused.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise PlacerError(f"--option {item!r}: expected KEY=VALUE")
        if key == "seed":
            raise PlacerError("--option seed=...: use --seed")
        low = value.lower()
        if low in ("true", "false"):
            out[key] = low == "true"
            continue
        for conv in (int, float):
            try:
                out[key] = conv(value)
                break
            except ValueError:
                continue
        else:
            out[key] = value
        if isinstance(out[key], float) and not math.isfinite(out[key]):
            raise PlacerError(f"--option {item!r}: {value} is not a finite number")
    return out


def check_step_counts(args: argparse.Namespace) -> None:
    """Range-check the numeric options of ``run`` and ``profile`` (those the command has)."""
    for name, least in (("steps", 1), ("repeats", 1), ("warmup", 0)):
        if hasattr(args, name):
            check_int(getattr(args, name), f"--{name}", least=least)
    if hasattr(args, "lr"):
        check_float(args.lr, "--lr", above=0, most=1)

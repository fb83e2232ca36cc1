"""Real steps of placements, three ways: in this process by the host's clock, in a Ray actor, or the actor's own
code in this process (no Ray). Each returns one :class:`envs.Result` per placement.

:func:`measure_local` is ``calibrate_sim --real local``'s (the thread's CPU time, for a machine other jobs keep
busy); :func:`measure_ray` is its default (:class:`envs.MeasuredEnv`, wall clock); :func:`measure_here` runs
the actor's measurement in this process, for the lent GPU machines, which have no Ray. The last two log every
result to a resumable ``measurements.jsonl``.
"""

from __future__ import annotations

import argparse
import functools

from bench.fidelity.models import build


def measure_local(name: str, args: argparse.Namespace, cluster, graph, placements) -> list:
    """Measure each placement in this process: the module ``placer.apply`` builds, trained by
    ``envs.real.timing.train_step`` (``--warmup`` then ``--steps`` steps, median), each step timed
    by ``envs.real.profiler.host_clock`` (this thread's CPU time when torch uses one thread: on a
    busy machine the time other processes held the core does not count)."""
    import statistics

    import torch

    from envs.real.placing import place_module
    from envs.real.profiler import host_clock
    from envs.real.timing import adam, train_step
    from envs.result import Result
    from graphs.torch_capture import export_program

    model, inputs = build(name, args.size)
    ep = export_program(model, inputs)
    snapshot = {k: v.detach().clone() for k, v in ep.state_dict.items()}
    _, clock = host_clock()
    results = []
    for op_devices in placements:
        with torch.no_grad():
            for k, v in ep.state_dict.items():
                v.copy_(snapshot[k])
        assignment = {op: cluster.device_names[d] for op, d in zip(graph.names, op_devices)}
        module = place_module(ep, assignment, args.device_map)
        opt = adam(module.parameters(), lr=1e-3)
        times = []
        for k in range(args.warmup + args.steps):
            t0 = clock()
            train_step(module, inputs, opt)
            if k >= args.warmup:
                times.append(clock() - t0)
        results.append(Result(float(statistics.median(times)), "ok", source="measured", extra={"step_times_s": times}))
    return results


def measured_env(name: str, size: str, cluster, graph, run_dir: str, *, device_map, warmup, steps, cpus, timeout):
    """The :class:`envs.MeasuredEnv` of model ``name`` at ``size``: one worker, its log under ``run_dir`` (it starts
    Ray only when it measures)."""
    from envs.real.measured import MeasuredEnv

    return MeasuredEnv(
        functools.partial(build, name, size),
        cluster,
        graph=graph,
        workers=1,
        device_map=device_map,
        warmup_steps=warmup,
        timed_steps=steps,
        run_dir=run_dir,
        cpus_per_worker=cpus,
        measure_timeout_s=timeout,
    )


def measure_ray(name: str, size: str, cluster, graph, placements, run_dir: str, **protocol) -> list:
    """Measure each placement in a Ray actor (:class:`envs.MeasuredEnv`, one worker, wall clock); results are
    logged to ``run_dir/measurements.jsonl``, so a rerun measures only what is not there yet. ``protocol``:
    :func:`measured_env`'s keywords."""
    env = measured_env(name, size, cluster, graph, run_dir, **protocol)
    try:
        return env.evaluate(placements)
    finally:
        env.close()


def measure_here(
    name: str,
    size: str,
    cluster,
    graph,
    placements,
    run_dir: str,
    *,
    device_map,
    warmup: int,
    steps: int,
    cpus: int,
    timeout: float,
) -> list:
    """As :func:`measure_ray`, without Ray: the actor's own code (``envs.real.measured.Worker.measure``: the module
    ``placer.apply`` builds, ``warmup`` then ``steps`` Adam steps, wall clock, CUDA synchronised) runs in this
    process, each placement under ``timeout`` (SIGALRM), logged to the same resumable ``measurements.jsonl``.
    For a machine without Ray (the lent GPU machines have none, and its wheel is too big to carry there)."""
    from envs.real.measured import Worker
    from envs.real.timing import StepTimeout, time_limit
    from envs.result import Result

    protocol = dict(device_map=device_map, warmup=warmup, steps=steps, cpus=cpus, timeout=timeout)
    # The env only keys placements and keeps the log here (it starts Ray only in evaluate()); it has no public
    # writer for its log, so its own _record is used, keeping one log format for both ways of measuring.
    env = measured_env(name, size, cluster, graph, run_dir, **protocol)
    keyed = env.keys(placements)
    worker = None
    for key, assignment in keyed:
        if key in env._cache:
            continue
        worker = worker or Worker(functools.partial(build, name, size), device_map, cpus)
        try:
            with time_limit(timeout):
                result = Result.from_dict(
                    worker.measure(assignment, graph.content_hash, warmup, steps, env._orders.get(key))
                )
        except StepTimeout:  # the alarm rang after measure() returned or before it started
            result = Result(float("inf"), "timeout", f"measurement ran past {timeout:g}s", source="measured")
        env._record(key, result)
    return [env._cache[key] for key, _ in keyed]

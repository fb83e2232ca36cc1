"""DeepSpeed's ZeRO-Offload on one process: the other rival that keeps the training state on the host.

What DeepSpeed's users reach for when a model's training state does not fit one GPU
(ZeRO-Offload, and with the parameters too, ZeRO-Infinity's CPU offload): ZeRO stage 3
with ``offload_param`` and ``offload_optimizer`` on the host (or stage 2 with the
optimizer alone there). Parameters live on the host in fp32 partitions (pinned on
a GPU machine), each module's are gathered onto the GPU before its forward and its
backward and released after, the gradients go back to the host as they are made,
and the optimizer step runs on the host: DeepSpeed's own vectorised CPU Adam
(``DeepSpeedCPUAdam``, compiled at first use) where it builds, else torch's Adam
(``optimizer="torch"`` asks for that directly). The same dtype as every other row
(no mixed precision: the plans it is compared with train in the model's dtype).

One process is a world of one, as for FSDP2 (:func:`bench.fsdp2.world_of_one`: a
process group over an in-process store); DeepSpeed reads its rank from the
environment, which is set for the call and put back after. It runs on the CPU
too (DeepSpeed's ``cpu`` accelerator, chosen when ``device`` is the host): that is
how CI tests it, and checks that it trains as the unwrapped model does.

The steps are timed as every placement is (:func:`envs.real.timing.measure_steps`,
the same protocol, seed, inputs and loss: DeepSpeed takes torch's own
``loss.backward()`` under ZeRO); a failure, DeepSpeed not installed included, is
a :class:`envs.Result` (``oom``, ``timeout``, ``error``), never an exception.
The row that cannot import it says how to install it (the ``deepspeed`` extra); a
GPU machine without the internet gets it from wheels carried to it (``scripts/gpu_wheels.sh``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.nn.functional
from torch import nn

from bench.common import OneLineParser
from bench.fsdp2 import timed_rival, world_of_one
from envs.real.timing import Protocol, adam, measure_steps, time_limit
from envs.real.worker import build_model, one_line
from envs.result import Result
from placer.methods.registry import install_hint

Builder = Callable[[], tuple[nn.Module, tuple]]
#: ``optimizer``: DeepSpeed's CPU Adam (torch's where it does not build), or torch's Adam.
OPTIMIZERS = ("deepspeed", "torch")
#: What the rank's environment must say for ``deepspeed.initialize`` (its launcher would set them).
RANK_ENV = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}


@contextlib.contextmanager
def rank_environment(device: torch.device) -> Iterator[None]:
    """The environment DeepSpeed reads for a world of one on ``device`` (its ``cpu`` accelerator for the host, unless
    the caller chose one), put back as it was on exit."""
    wanted = dict(RANK_ENV)
    if device.type == "cpu" and "DS_ACCELERATOR" not in os.environ:
        wanted["DS_ACCELERATOR"] = "cpu"
    before = {k: os.environ.get(k) for k in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def zero_config(stage: int, lr: float, *, pin: bool, cpu_adam: bool) -> dict[str, Any]:
    """DeepSpeed's configuration of ZeRO-Offload: ``stage`` 3 offloads the parameters and the optimizer to the host,
    2 the optimizer (and the gradients) only; ``cpu_adam``: DeepSpeed's CPU Adam (else the client's torch Adam).

    Adam as placer's rows run it: no clipping, no weight decay, torch's betas and eps (DeepSpeed's "Adam" is AdamW,
    the same update without decay).

    >>> c = zero_config(3, 1e-3, pin=False, cpu_adam=True)
    >>> c["zero_optimization"]["offload_param"], c["optimizer"]["params"]["weight_decay"]
    ({'device': 'cpu', 'pin_memory': False}, 0.0)
    >>> "offload_param" in zero_config(2, 1e-3, pin=True, cpu_adam=False)["zero_optimization"]
    False
    """
    if stage not in (2, 3):
        raise ValueError(f"ZeRO-Offload: stage {stage}: 2 or 3")
    zero: dict[str, Any] = {"stage": stage, "offload_optimizer": {"device": "cpu", "pin_memory": pin}}
    if stage == 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,  # DeepSpeed's data loader is not used: the model takes the whole batch
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,  # none, as every other row's Adam (ZeRO's optimizer otherwise clipped at norm 1.0)
        "zero_optimization": zero,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if cpu_adam:
        params = {"lr": lr, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
        config["optimizer"] = {"type": "Adam", "params": params}
    else:
        config["zero_force_ds_cpu_optimizer"] = False  # the client's torch Adam on the host partitions
    return config


def _loads(builder: Callable[[], Any]) -> str | None:
    """None when the DeepSpeed op builder that ``builder()`` gives loads here (compiled now, or before), or where it
    gives none; else why not, in one line."""
    try:
        made = builder()
        if made is not None:
            made.load(verbose=False)
        return None
    except Exception as e:  # noqa: BLE001  (not installed, a compiler, header or CUDA toolkit missing: any failure is the answer)
        return f"{type(e).__name__}: {one_line(e)}"


def cpu_adam_builds() -> str | None:
    """None when DeepSpeed's CPU Adam builds (or is built) here, else why not, in one line."""

    def builder() -> Any:
        from deepspeed.ops.op_builder import CPUAdamBuilder

        return CPUAdamBuilder()

    return _loads(builder)


def build_session_ops() -> str | None:
    """Compile the extension a DeepSpeed session on the host builds when it starts (the ``cpu`` accelerator's
    shared-memory collectives; about 30 s of a compiler on a small machine, kept in torch's extensions directory);
    None once it is built or where there is nothing to build, else why not, in one line. A session builds it anyway:
    this pays it ahead (CI does, before its two test workers would build it at once, one waiting on the other's lock).
    """

    def builder() -> Any:
        from deepspeed.accelerator import get_accelerator

        return get_accelerator().create_op_builder("ShareMemCommBuilder")

    with rank_environment(torch.device("cpu")):  # DeepSpeed's cpu accelerator
        return _loads(builder)


#: torch's functions that DeepSpeed replaces for good (ZeRO-3's memory-efficient ``linear``, "this will persist
#: unless manually reset"): put back after each measurement, or every model captured later in the process would
#: trace DeepSpeed's function instead (another graph: the plans of the rows after DeepSpeed's did not match it).
REPLACED = ((torch.nn.functional, "linear"), (torch.nn.functional, "embedding"))


@contextlib.contextmanager
def deepspeed_session(device: torch.device) -> Iterator[None]:
    """:func:`bench.fsdp2.world_of_one` for DeepSpeed: where it made the world, destroyed on exit through DeepSpeed,
    which lets go of the groups it kept (a second call in the process would otherwise find them stale); and torch's
    functions DeepSpeed replaced put back (:data:`REPLACED`)."""
    import deepspeed.comm

    kept = [(module, name, getattr(module, name)) for module, name in REPLACED]
    made = not dist.is_initialized()
    with world_of_one(device):
        try:
            yield
        finally:
            for module, name, function in kept:
                setattr(module, name, function)
            if made and deepspeed.comm.is_initialized():
                deepspeed.comm.destroy_process_group()


class EngineOptimizer:
    """The optimizer a timed step calls (``zero_grad``, ``step``) for a DeepSpeed engine: the engine's own."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.engine.zero_grad()

    def step(self) -> None:
        self.engine.step()


def measure_zero_offload(
    source: str | Builder,
    device: str | torch.device,
    *,
    stage: int = 3,
    optimizer: str = "deepspeed",
    warmup_steps: int = 2,
    timed_steps: int = 5,
    lr: float = 1e-3,
    timeout_s: float | None = None,
) -> Result:
    """Time Adam steps of ``source``'s model under DeepSpeed's ZeRO ``stage`` (3 or 2) with the host offload on
    ``device``; a Result, never raising.

    ``peak_bytes`` has ``gpu:0`` (``max_memory_allocated`` of a CUDA device) and ``cpu:0`` (the host's resident-set
    rise); ``extra`` the step times, losses, the stage, which Adam ran (and why torch's, where DeepSpeed's did not
    build) and DeepSpeed's version.
    """
    device = torch.device(device)
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"ZeRO-Offload: optimizer {optimizer!r}: one of {', '.join(OPTIMIZERS)}")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    extra: dict[str, Any] = {"method": "deepspeed_zero_offload", "stage": stage}

    def steps() -> dict[str, Any]:
        with rank_environment(device):
            try:
                import deepspeed
            except ImportError as e:
                hint = install_hint("deepspeed")
                raise RuntimeError(f"DeepSpeed is not installed here ({one_line(e)}): {hint}") from e
            extra["deepspeed"] = deepspeed.__version__
            with deepspeed_session(device), time_limit(timeout_s):
                why_not = cpu_adam_builds() if optimizer == "deepspeed" else "asked for torch's"
                extra["optimizer"] = "DeepSpeedCPUAdam" if why_not is None else f"torch.optim.Adam ({why_not})"
                model, inputs = build_model(source)
                config = zero_config(stage, lr, pin=device.type == "cuda", cpu_adam=why_not is None)
                client = None if why_not is None else adam(model.parameters(), lr=lr)
                engine, *_ = deepspeed.initialize(model=model, optimizer=client, config=config)
                inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
                m = measure_steps(
                    engine,
                    inputs,
                    EngineOptimizer(engine),  # type: ignore[arg-type]  (zero_grad and step are all a step calls)
                    {"cpu:0": torch.device("cpu"), "gpu:0": device},
                    warmup_steps=warmup_steps,
                    timed_steps=timed_steps,
                    protocol=Protocol(),  # placer's plans' protocol (malloc steady, no collector)
                )
                engine.destroy()
                return m

    return timed_rival(steps, extra)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m bench.deepspeed_offload",
        description="DeepSpeed's ZeRO-Offload rows are measured by bench.offload_homes_measure; this entry point "
        "compiles ahead what a DeepSpeed session on the host compiles at its start.",
    )
    parser.add_argument(
        "--build-ops",
        action="store_true",
        help="compile the host session's extension now (CI runs this before its test workers)",
    )
    args = parser.parse_args(argv)
    if not args.build_ops:
        parser.print_usage()
        return 0
    t0 = time.perf_counter()
    why_not = build_session_ops()
    if why_not is not None:
        print(f"bench.deepspeed_offload: nothing built: {why_not}", file=sys.stderr)
        return 1
    print(f"bench.deepspeed_offload: the host session's extension is built ({time.perf_counter() - t0:.0f} s)")
    return 0


__all__ = ["EngineOptimizer", "build_session_ops", "measure_zero_offload", "rank_environment", "zero_config"]

if __name__ == "__main__":
    raise SystemExit(main())

"""DeepSpeed's ZeRO-Offload as a measured rival (bench.deepspeed_offload), on the CPU: DeepSpeed's ``cpu`` accelerator.

The first test here builds DeepSpeed's shared-memory collective op (about 20 s, once per machine: torch's extension
cache). DeepSpeed's CPU Adam is not built here (about 45 s more); the rows ask for torch's Adam, or are told that
DeepSpeed's did not build.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

from bench import offload
from bench.deepspeed_offload import RANK_ENV, measure_zero_offload, rank_environment, zero_config
from bench.offload import SCENARIOS
from envs.real.timing import train_step


def plain_losses(steps: int) -> list[float]:
    """The tiny scenario's losses under torch's Adam, unwrapped, the same seed and inputs."""
    model, inputs = offload.build(SCENARIOS["tiny"])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return [float(train_step(model, inputs, opt)) for _ in range(steps)]


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_zero_offload_trains_as_the_unwrapped_model_and_leaves_no_world_behind(stage):
    """Stage 2 (Adam and gradients on the host) and 3 (the parameters too) on a world of one: the same losses as
    plain Adam steps on the same seeded model (ZeRO's optimizer clips at norm 1.0 unless told not to: 1.5e-4 off
    by the third step), timed as placer's plans are; a second call in one process works (the parametrization runs
    both here)."""
    before = {k: os.environ.get(k) for k in RANK_ENV}
    linear = torch.nn.functional.linear
    r = measure_zero_offload(offload.builder(SCENARIOS["tiny"]), "cpu", stage=stage, optimizer="torch", warmup_steps=1)
    assert r.status == "ok", r.message
    assert r.extra["stage"] == stage and r.extra["optimizer"].startswith("torch.optim.Adam")
    assert r.extra["deepspeed"] and len(r.extra["step_times_s"]) == 5 and r.step_time_s > 0
    assert r.extra["protocol"]["steady_malloc"] and r.extra["protocol"]["gc_off"]  # as every placer measurement
    assert r.extra["losses"] == pytest.approx(plain_losses(6)[1:], rel=1e-5)
    assert not torch.distributed.is_initialized()  # the world of one is gone
    assert {k: os.environ.get(k) for k in RANK_ENV} == before  # and the rank's environment put back
    # ZeRO-3's own linear, which DeepSpeed leaves in torch, is put back: a model captured after it is the same graph
    assert torch.nn.functional.linear is linear


@pytest.mark.slow
def test_deepspeed_s_cpu_adam_that_does_not_build_falls_back_to_torch_s_and_says_why(monkeypatch):
    from bench import deepspeed_offload

    monkeypatch.setattr(deepspeed_offload, "cpu_adam_builds", lambda: "RuntimeError: no compiler")
    r = measure_zero_offload(offload.builder(SCENARIOS["tiny"]), "cpu", stage=3, warmup_steps=0, timed_steps=2)
    assert r.status == "ok", r.message
    assert r.extra["optimizer"] == "torch.optim.Adam (RuntimeError: no compiler)"
    assert r.extra["losses"] == pytest.approx(plain_losses(2), rel=1e-5)


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_build_ops_builds_every_extension_a_host_session_loads(monkeypatch, capsys):
    """``python -m bench.deepspeed_offload --build-ops`` (CI runs it before its workers) asks DeepSpeed for each
    extension that a ZeRO-Offload session on the host then loads: none is left for the session to compile."""
    from deepspeed.ops.op_builder.builder import OpBuilder

    from bench import deepspeed_offload

    loaded: list[str] = []
    load = OpBuilder.load
    monkeypatch.setattr(OpBuilder, "load", lambda self, verbose=False: loaded.append(self.name) or load(self, verbose))
    assert deepspeed_offload.main(["--build-ops"]) == 0
    assert "extension is built" in capsys.readouterr().out
    built, loaded[:] = set(loaded), []
    r = measure_zero_offload(
        offload.builder(SCENARIOS["tiny"]), "cpu", optimizer="torch", warmup_steps=0, timed_steps=1
    )
    assert r.status == "ok", r.message
    assert built and set(loaded) <= built, (built, loaded)


def test_without_deepspeed_nothing_is_built_and_the_entry_point_says_why_in_one_line(monkeypatch, capsys):
    from bench import deepspeed_offload

    monkeypatch.setitem(sys.modules, "deepspeed.accelerator", None)
    assert deepspeed_offload.main(["--build-ops"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nothing built" in err and "deepspeed.accelerator" in err, err


def test_without_deepspeed_the_row_says_it_is_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # import deepspeed raises ImportError
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    r = measure_zero_offload(offload.builder(SCENARIOS["tiny"]), "cpu")
    assert r.status == "error" and np.isinf(r.step_time_s)
    assert "DeepSpeed is not installed here" in r.message and "pip install deepspeed" in r.message
    assert "LOCAL_RANK" not in os.environ  # the rank's environment is put back


def test_a_failure_is_a_result():
    def broken():
        raise MemoryError()

    r = measure_zero_offload(broken, "cpu", optimizer="torch")
    assert r.status == "oom" and np.isinf(r.step_time_s)
    assert not torch.distributed.is_initialized()


def test_the_configuration_offloads_what_each_stage_offloads_and_clips_nothing():
    three = zero_config(3, 1e-3, pin=True, cpu_adam=True)
    assert three["zero_optimization"]["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert three["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert three["gradient_clipping"] == 0.0 and three["optimizer"]["type"] == "Adam"
    two = zero_config(2, 1e-3, pin=False, cpu_adam=False)
    assert "offload_param" not in two["zero_optimization"] and two["zero_optimization"]["stage"] == 2
    assert "optimizer" not in two and two["zero_force_ds_cpu_optimizer"] is False  # the client's torch Adam
    with pytest.raises(ValueError, match="stage 1"):
        zero_config(1, 1e-3, pin=False, cpu_adam=False)
    with pytest.raises(ValueError, match="optimizer 'sgd'"):
        measure_zero_offload(offload.builder(SCENARIOS["tiny"]), "cpu", optimizer="sgd")


def test_the_rank_environment_is_set_inside_and_put_back(monkeypatch):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    with rank_environment(torch.device("cpu")):
        assert (os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["DS_ACCELERATOR"]) == ("0", "0", "cpu")
    assert os.environ["RANK"] == "5" and "LOCAL_RANK" not in os.environ and "DS_ACCELERATOR" not in os.environ
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")  # a caller's choice is kept
    with rank_environment(torch.device("cpu")):
        assert os.environ["DS_ACCELERATOR"] == "cuda"

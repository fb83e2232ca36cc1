"""A rank process that ran a job of a model reuses its export for the next job, which still starts from the model as
built (:class:`envs.real.distributed.worker.ProgramCache`); no process group needed: the cache sees a plan only
through its microbatch count and program hash."""

from __future__ import annotations

import textwrap
from types import SimpleNamespace

import pytest
import torch

from envs.real.distributed.worker import ProgramCache, adopt
from envs.real.worker import build_model
from graphs import PlacerError
from graphs.torch_capture import export_program, graph_from_program
from tests.conftest import importable_module

MODEL_SRC = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    from torch import nn


    class Net(nn.Module):
        def __init__(self, width=8):
            super().__init__()
            self.a, self.b = nn.Linear(width, 16), nn.Linear(16, 2)
            self.register_buffer("scale", torch.full((16,), 0.5), persistent=False)

        def forward(self, x, y):
            return F.cross_entropy(self.b(torch.relu(self.a(x)) * self.scale), y)


    def build(batch=4):
        return Net(), (torch.randn(batch, 8), torch.randint(0, 2, (batch,)))


    class Other(nn.Module):  # the same inputs, another model: no parameter named as Net's
        def __init__(self):
            super().__init__()
            self.c = nn.Linear(8, 2)

        def forward(self, x, y):
            return F.cross_entropy(self.c(x), y)


    def other():
        return Other(), (torch.randn(4, 8), torch.randint(0, 2, (4,)))
    """
)


@pytest.fixture
def source(tmp_path, monkeypatch):
    importable_module(tmp_path, monkeypatch, "cache_model", MODEL_SRC)
    return "cache_model:build"


def _plan(model, inputs, microbatches: int = 1):
    """What the cache reads of a compiled plan: its microbatch count and its program's hash."""
    graph = graph_from_program(export_program(model, inputs))
    return SimpleNamespace(microbatches=microbatches, program_hash=graph.content_hash)


def _loss(program, inputs) -> torch.Tensor:
    return program.module()(*inputs)


def test_the_next_job_reuses_the_export_and_starts_from_its_own_model_as_built(source):
    cache = ProgramCache()
    model, inputs = build_model(source)
    plan = _plan(model, inputs)
    program, graph, reused = cache.get(source, None, model, inputs, plan)
    assert not reused and graph.content_hash == plan.program_hash
    built = _loss(program, inputs).item()
    # the job trains: the program's weights (the model's own) move, gradients are left on them
    module = program.module()
    optimizer = torch.optim.SGD(module.parameters(), lr=1.0)
    for _ in range(3):
        optimizer.zero_grad()
        module(*inputs).backward()
        optimizer.step()
    assert _loss(program, inputs).item() != built
    fresh, fresh_inputs = build_model(source)  # the next job builds its model anew (seeded: the same weights)
    again, graph_again, reused = cache.get(source, None, fresh, fresh_inputs, plan)
    assert reused and again is program and graph_again is graph  # no second export
    assert _loss(again, fresh_inputs).item() == built  # the model as built, not as the last job left it
    params = dict(fresh.named_parameters())
    assert all(again.state_dict[k] is params[k] for k in params)  # the new model's own tensors, as an export's
    assert all(p.grad is None for p in params.values())
    assert again.constants["scale"] is fresh.scale  # a buffer outside the state dict: the new model's too


def test_other_shapes_another_model_or_another_source_export_anew(source):
    cache = ProgramCache(size=2)
    model, inputs = build_model(source)
    plan = _plan(model, inputs)
    first = cache.get(source, None, model, inputs, plan)[0]
    # another model under the same key (a module edited between jobs): its weights cannot be the program's, so
    # the job exports anew, and that export is refused as any other of a model that builds differently
    other, other_inputs = build_model("cache_model:other")
    assert not adopt(first, other) and first.state_dict["a.weight"] is model.a.weight  # unchanged
    with pytest.raises(PlacerError, match="this process exported graph .* the plan was compiled for"):
        cache.get(source, None, other, other_inputs, plan)
    # the inputs at another batch size: another program
    import cache_model

    torch.manual_seed(0)
    m8, in8 = cache_model.build(8)
    plan8 = _plan(m8, in8)
    assert not cache.get(source, None, m8, in8, plan8)[2]
    assert cache.get(source, None, m8, in8, plan8)[2]
    # a callable, not a name: never kept
    assert ProgramCache.key(cache_model.build, None, inputs) is None
    # a plan of another program, given the same model: one line, as a fresh export's
    with pytest.raises(PlacerError, match="this process exported graph .* the plan was compiled for 0000"):
        cache.get(source, None, *build_model(source), SimpleNamespace(microbatches=1, program_hash="0000"))


def test_at_most_size_programs_are_kept_the_latest_used(source):
    import cache_model

    cache = ProgramCache(size=2)
    jobs = {}
    for batch in (2, 4, 6):
        torch.manual_seed(0)
        model, inputs = cache_model.build(batch)
        jobs[batch] = (model, inputs, _plan(model, inputs))
    for batch in (2, 4, 2, 6):  # 2 is used again, so 4 is the one dropped when 6 comes
        cache.get(source, None, *jobs[batch])
    assert [cache.get(source, None, *jobs[b])[2] for b in (2, 6)] == [True, True]
    assert not cache.get(source, None, *jobs[4])[2]


def test_a_cache_of_size_zero_keeps_nothing(source):
    cache = ProgramCache(size=0)
    model, inputs = build_model(source)
    plan = _plan(model, inputs)
    assert [cache.get(source, None, *build_model(source), plan)[2] for _ in range(2)] == [False, False]


def test_between_jobs_a_kept_program_holds_none_of_the_last_job_s_tensors(source):
    """After a job (``release``), the program keeps shapes only, so the last job's weights (on a GPU, where the job
    moved them) are freed rather than held beside the next job's; the next job still reuses the export."""
    import gc
    import weakref

    cache = ProgramCache()
    model, inputs = build_model(source)
    plan = _plan(model, inputs)
    program = cache.get(source, None, model, inputs, plan)[0]
    built = _loss(program, inputs).item()
    last = weakref.ref(model.a.weight)
    cache.release()
    assert all(v.device.type == "meta" for v in program.state_dict.values())
    del model
    gc.collect()
    assert last() is None  # nothing holds the last job's weight
    again, _, reused = cache.get(source, None, *build_model(source), plan)
    assert reused and again is program and _loss(again, inputs).item() == built

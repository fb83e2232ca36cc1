"""The conformance corpus on the CPU: every architecture, every kind of plan, float64's loss and gradients.

:mod:`graphs.models.corpus` builds each model from a config (nothing downloaded);
:mod:`bench.conformance` applies eight plans to it (all on one device, a
host/device split and that split in 2 microbatches, round-robin over 4 logical
GPUs, a heuristic's plan with its issue order, a pipeline over 8 logical GPUs in 2
and 4 microbatches, and one-forward-one-backward) and checks that the placed
step's loss and every gradient are as close to a float64 reference as the
unplaced float32 step is. Every logical device is the CPU here, so every copy is
built; ``bench/gpu_conformance.py`` runs the same on a GPU.

One model (nn_encoder) runs in the fast tier; the rest are marked slow (CI runs both). The causal language models are
checked in ``test_conformance_causal.py`` (a file of their own, so the two xdist workers share the corpus).
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from bench import conformance
from graphs import CaptureError
from graphs.export import export_program
from graphs.models import corpus
from tests.placer.conformance_case import CAUSAL, check_every_plan, entries


def test_the_corpus_covers_the_architectures_people_train():
    assert len(corpus.FAMILIES) >= 20
    for family in (
        "llama",
        "mistral",
        "qwen2",
        "gpt2",
        "gpt_neox",
        "phi",
        "mixtral",
        "bert",
        "roberta",
        "vit",
        "t5",
        "bart",
        "nn_transformer",
        "nn_encoder",
        "nn_decoder",
        "cnn_bn",
        "recommender",
        "rnn",
    ):
        assert family in corpus.FAMILIES
    assert len(conformance.PLANS) >= 7


@pytest.mark.parametrize("name", entries(n for n in corpus.FAMILIES if n not in CAUSAL))
def test_every_plan_keeps_the_float64_loss_and_gradients(name):
    check_every_plan(name)


def test_a_wrong_gradient_is_caught():
    """The check itself: a placed step whose gradients are off by far less than a bug would make them fails."""
    model, inputs = corpus.build("rnn")
    ref = conformance.reference(model, inputs)
    loss = model(*inputs)
    loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    ok, *_ = conformance.compare(loss, grads, ref)
    assert ok
    name = next(iter(grads))
    grads[name] = grads[name] * (1 + 1e-3)
    ok, _, _, worst, ratio = conformance.compare(loss, grads, ref)
    assert not ok and worst == name and ratio > 1
    del grads[name]
    assert not conformance.compare(loss, grads, ref)[0]


def test_a_buffer_the_step_updates_is_checked_too_on_every_rank_that_holds_it():
    """Batch norm's running statistics after the step: a placed step whose statistics missed an update (a stale
    copy on one rank) fails naming the buffer, though its loss and gradients are right; a buffer the plan does not
    hold is not compared."""
    from envs.real.distributed.worker import check_report

    model, inputs = corpus.build("cnn_bn")
    model.train()  # the corpus builds it in eval
    ref = conformance.reference(model, inputs)
    assert any(k.endswith("running_mean") for k in ref.buffers)
    loss = model(*inputs)
    loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    buffers = conformance.model_buffers(model)
    assert conformance.compare(loss, grads, ref, buffers)[0]
    name = next(k for k in buffers if k.endswith("running_mean"))
    stale = {**buffers, name: corpus.build("cnn_bn")[0].get_buffer(name).double()}  # as before the step
    ok, _, grad_error, worst, ratio = conformance.compare(loss, grads, ref, stale)
    assert not ok and worst == name and ratio > 1 and grad_error < 1e-5
    assert conformance.compare(loss, grads, ref, {k: b for k, b in buffers.items() if k != name})[0]
    # across ranks: one rank holds the right copy, another the stale one; the check takes the worse
    float_loss = float(loss)
    parts = [
        {"loss": float_loss, "grads": grads, "buffers": buffers},
        {"loss": None, "grads": {}, "buffers": {name: stale[name]}},
    ]
    report = check_report(parts, ref, [])
    assert not report["ok"] and report["worst"] == name
    assert check_report(parts[:1], ref, [])["ok"]


def test_a_step_with_dropout_is_checked_with_every_unit_kept_and_a_draw_that_cannot_be_held_gets_no_verdict(
    monkeypatch,
):
    """The float64, float32 and placed steps each drew their own dropout masks, so a check had no verdict for any
    model with dropout in training. Now each holds its draws at their likeliest values (dropout keeps every unit,
    scaled: :func:`envs.real.fixed_draws.fixed_draws`), and the rows are checked, saying so; a placed step whose
    dropout drew (the mode off in it) fails. A draw that cannot be held so (Poisson noise) still gets no verdict."""
    from torch import nn

    from envs.real.conformance import reference

    def built(p: float, noise: bool = False):
        torch.manual_seed(0)
        layers = [nn.Linear(6, 16), nn.ReLU(), nn.Dropout(p), nn.Linear(16, 1)]
        if noise:
            layers.insert(2, _PoissonNoise())
        return _MSE(nn.Sequential(*layers)).train(), (torch.randn(8, 6), torch.randn(8, 1))

    ref = reference(*built(0.3))
    assert not ref.draws and ref.fixed and not reference(*built(0.0)).fixed
    rows = conformance.check_model("dropout", built=built(0.3), plan_names=["gpu", "split", "split_m2"])
    assert all(r.ok and not r.message for r in rows), [(r.plan, r.message, r.allowed_ratio) for r in rows]
    # the placed step draws for real (the reference still keeps every unit): the check sees it
    monkeypatch.setattr(conformance, "fixed_draws", lambda: contextlib.nullcontext(set()))
    assert not conformance.check_model("drew", built=built(0.3), plan_names=["gpu"])[0].ok
    assert reference(*built(0.3, noise=True)).draws
    rows = conformance.check_model("noisy", built=built(0.3, noise=True), plan_names=["gpu"])
    assert not rows[0].ok and rows[0].message.startswith("UNCHECKED: the step draws random numbers that the check")


class _PoissonNoise(torch.nn.Module):
    """Spiking noise: a Poisson draw of softplus rates, passed straight through (a draw fixed_draws does not hold)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rates = torch.nn.functional.softplus(x)
        return rates + (torch.poisson(rates) - rates).detach()


def test_a_tensor_a_model_holds_outside_its_parameters_and_buffers_is_float64_in_the_reference():
    """TabNet holds its group matrix as a plain attribute, which double() leaves in float32."""
    from torch import nn

    from envs.real.conformance import reference

    class Grouped(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.group = torch.eye(4) * 0.5

        def forward(self, x):
            return (self.a(x) @ self.group).square().mean()

    torch.manual_seed(0)
    model = Grouped()
    ref = reference(model, (torch.randn(3, 4),))
    assert ref.plain_errors["loss"] < 1e-6 and model.group.dtype == torch.float32  # the model itself untouched


def test_a_tensor_the_forward_makes_without_a_dtype_is_float64_in_the_reference():
    """An RNN written by hand starts from ``torch.zeros(batch, hidden)``: float32 by default, which the float64
    copy's first matmul refused (``float != double``)."""
    from torch import nn

    from envs.real.conformance import reference

    class Recurrent(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.rec = nn.Linear(3, 4), nn.Linear(4, 4)

        def forward(self, x):
            h = torch.zeros(x.shape[0], 4)
            for t in range(x.shape[1]):
                h = torch.tanh(self.inp(x[:, t]) + self.rec(h))
            return h.square().mean()

    torch.manual_seed(0)
    ref = reference(Recurrent(), (torch.randn(2, 5, 3),))
    assert ref.plain_errors["loss"] < 1e-6 and torch.get_default_dtype() == torch.float32


def test_a_forward_that_asks_for_float32_runs_in_float64_in_the_reference():
    """``x.float()``, ``torch.eye(n, dtype=torch.float32)`` and a softmax in float32 (a norm or a spectral layer
    "computed in float32", as models write for half precision): the float64 copy ran them in float32, which failed
    a matmul with float64 or put float32 rounding into the reference. Its loss is the float64 computation's."""
    from torch import nn

    from envs.real.conformance import reference

    class Casts(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x):
            h = self.a(x).float() @ torch.eye(4, dtype=torch.float32)
            return h.softmax(-1, dtype=torch.float32).square().sum() * 1000

    torch.manual_seed(0)
    model, x = Casts(), torch.randn(3, 4)
    ref = reference(model, (x,))
    with torch.no_grad():
        a = model.a.double()
        exact = (a(x.double()).softmax(-1).square().sum() * 1000).item()
        model.float()
    assert ref.loss == pytest.approx(exact, rel=1e-13, abs=0)  # float32 rounding would be about 1e-7
    assert ref.grads["a.weight"].dtype == torch.float64 and model.a.weight.dtype == torch.float32


def test_a_complex_parameter_is_complex128_in_the_reference_and_its_whole_gradient_compared():
    """A Fourier layer's complex64 weights (neuraloperator's FNO): the float64 copy holds them in complex128
    (``double()`` left them complex64, so its first product with a complex128 spectrum failed), and the check
    compares a complex gradient's real and imaginary parts (``double()`` of it kept the real part alone)."""
    from torch import nn

    from envs.real.conformance import compare, parameter_grads, reference

    class Spectral(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 8)
            self.w = nn.Parameter(torch.randn(5, dtype=torch.complex64))

        def forward(self, x):
            return torch.fft.irfft(torch.fft.rfft(self.a(x)) * self.w, n=8).square().mean()

    torch.manual_seed(0)
    model, x = Spectral(), torch.randn(3, 8)
    ref = reference(model, (x,))
    assert ref.grads["w"].shape == (5, 2) and ref.grads["w"][:, 1].abs().max() > 0  # real and imaginary parts
    loss = model(x)
    loss.backward()
    grads = parameter_grads(model)
    assert compare(loss, grads, ref)[0]
    model.w.grad = model.w.grad.conj()  # the imaginary part's sign wrong, the real part right
    assert not compare(loss, parameter_grads(model), ref)[0]


def test_a_reference_the_float64_copy_cannot_compute_gives_no_verdict_naming_the_line():
    import numpy
    from torch import nn

    from envs.real.conformance import checked_reference
    from envs.real.distributed.worker import check_report

    class Fixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x):  # a float32 tensor made outside torch's factories (no dtype to widen)
            return (self.a(x) @ torch.from_numpy(numpy.eye(4, dtype=numpy.float32))).square().mean()

    ref = checked_reference(Fixed(), (torch.randn(2, 4),))
    assert ref.unchecked.startswith("the model's float64 copy, the check's reference, fails (RuntimeError at ")
    assert "test_conformance.py:" in ref.unchecked and "\n" not in ref.unchecked
    assert check_report([], ref, []) == {"ok": False, "draws": False, "unchecked": ref.unchecked}
    assert not checked_reference(_MSE(nn.Linear(4, 1)), (torch.randn(2, 4), torch.randn(2, 1))).unchecked
    rows = conformance.check_model("fixed", built=(Fixed(), (torch.randn(2, 4),)), plan_names=["gpu"])
    assert not rows[0].ok and rows[0].message == f"UNCHECKED: {ref.unchecked}"  # the plan ran, with no verdict


class _MSE(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        return torch.nn.functional.mse_loss(self.model(x), y)


@pytest.mark.slow
def test_plans_of_microbatches_of_a_step_that_mixes_its_batch_are_checked_against_gradient_accumulation():
    """Batch norm in training: a plan of M microbatches normalises each by its own statistics, as gradient
    accumulation does. Against the whole batch's step those plans fail by far; against accumulation over the same
    parts they pass, and the rows say which; a plan of one microbatch is still checked against the whole batch."""
    from torch import nn

    from envs.real.conformance import reference

    torch.manual_seed(0)
    model = _MSE(nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))).train()
    inputs = (torch.randn(8, 6), torch.randn(8, 1))
    whole, parts = reference(model, inputs), reference(model, inputs, 2)
    assert parts.microbatches == 2 and abs(parts.loss - whole.loss) > 1e-3 * abs(whole.loss)
    rows = conformance.check_model("normed", built=(model, inputs), plan_names=["split", "split_m2", "pipe_m4"])
    assert all(r.ok for r in rows), [(r.plan, r.worst, r.allowed_ratio) for r in rows]
    assert [r.against for r in rows] == ["", "accumulation", "accumulation"]
    assert "split_m2 (vs accumulation)" in "\n".join(conformance.format_rows(rows))
    # what they are checked against is what they compute: the whole batch's reference fails them
    graph = conformance.capture_program(model, inputs)[1]
    plan = conformance.plans(graph, names=["split_m2"])["split_m2"]
    ok = conformance.run_plan(model, inputs, graph, plan, whole)[0]
    assert not ok


def test_a_failing_plan_is_a_row_not_an_exception(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(conformance, "apply", broken)  # the first plan's path
    monkeypatch.setattr(conformance, "apply_program", broken)  # the others' (one shared export)
    rows = conformance.check_model("rnn", ["gpu", "split"])
    assert [(r.ok, r.message) for r in rows] == [(False, "RuntimeError: boom")] * 2
    lines = conformance.format_rows(rows)
    assert len(lines) == 4 and "FAIL" in lines[2]


class _Nodes(torch.nn.Module):
    """A graph network: node features summed over the edges into each node (the edge index refers to every node)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, x, edges, y):
        h = torch.zeros_like(x).index_add_(0, edges[1], x.index_select(0, edges[0]))
        return torch.nn.functional.cross_entropy(self.lin(h), y)


def test_a_plan_whose_microbatches_the_model_cannot_run_says_how_the_batch_was_cut():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    built = _Nodes(), (torch.randn(8, 4), torch.randint(0, 8, (2, 16), generator=g), torch.randint(0, 2, (8,)))
    rows = conformance.check_model("nodes", ["split", "split_m2"], built=built)
    assert [r.ok for r in rows] == [True, False]
    assert rows[1].message.startswith("the model failed on a microbatch (IndexError")
    assert "gives input 2 whole to every part" in rows[1].message


class _Regenerated(torch.nn.Module):
    """A model whose deep copy is another program computing the same (e3nn's tensor products pickle the code they
    generate, and a copy traces it again): fresh tensors, and ``2 * h`` written ``h + h``."""

    def __init__(self, twice_as_sum: bool = False) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 8))
        self.twice_as_sum = twice_as_sum

    def forward(self, x, y):
        h = torch.relu(self.a(x)) * self.scale
        h = h + h if self.twice_as_sum else 2 * h
        return torch.nn.functional.cross_entropy(self.b(h), y)

    def __deepcopy__(self, memo):
        copied = _Regenerated(twice_as_sum=True)
        copied.load_state_dict(self.state_dict())
        return copied


def test_a_model_whose_copy_is_another_program_has_every_plan_checked_on_itself():
    torch.manual_seed(0)
    model = _Regenerated()
    built = model, (torch.randn(8, 4), torch.randint(0, 2, (8,)))
    weight = model.a.weight.detach().clone()
    rows = conformance.check_model("regenerated", ["gpu", "split", "round_robin", "pipe_m2", "1f1b"], built=built)
    assert [(r.plan, r.ok) for r in rows] == [(p, True) for p in ("gpu", "split", "round_robin", "pipe_m2", "1f1b")], [
        r.message or r.worst for r in rows
    ]
    # run on the model itself, the model is left as it was: its values, and no gradient
    assert torch.equal(model.a.weight, weight) and all(p.grad is None for p in model.parameters())


def test_a_microbatch_size_is_exported_once_for_every_plan_of_it(monkeypatch):
    exported = []

    def counted(model, inputs, **kw):
        exported.append((inputs[0].shape[0], kw.get("stack_traces", True)))
        return export_program(model, inputs, **kw)

    monkeypatch.setattr(conformance, "export_program", counted)  # the shared exports at a microbatch's size
    rows = conformance.check_model("cnn_bn", ["gpu", "split_m2", "pipe_m2", "pipe_m4", "1f1b"])
    assert all(r.ok for r in rows), [r.message or r.worst for r in rows]
    # the corpus batch of 4: M=2 once for two plans, M=4 once for two; without stack traces, as the capture's
    assert exported == [(2, False), (1, False)]


def test_a_shared_export_that_fails_leaves_each_plan_to_export_its_own(monkeypatch):
    def refused(*args, **kwargs):
        raise CaptureError("capture failed: refused by the test")

    monkeypatch.setattr(conformance, "export_program", refused)  # the shared exports at a microbatch's size only
    rows = conformance.check_model("rnn", ["gpu", "split_m2"])
    assert [(r.plan, r.ok) for r in rows] == [("gpu", True), ("split_m2", True)]


def test_timed_rows_show_each_plan_beside_all_on_one_device():
    rows = conformance.check_model("cnn_bn", ["gpu", "round_robin"], timed_steps=2)
    assert all(r.ok and r.step_time_s > 0 and not math.isnan(r.step_time_s) for r in rows)
    table = conformance.format_rows(rows)
    assert "step ms" in table[0] and table[2].endswith("| 1.00x |")
    assert set(rows[0].to_dict()) >= {"model", "plan", "ok", "loss_error", "grad_error", "step_time_s"}
    assert torch.is_grad_enabled()

"""Capture from PyTorch: shapes, bytes, FLOPs against hand counts, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import graphs
from graphs import CaptureError, GraphFormatError
from graphs.torch_capture import capture, capture_program, export_program, graph_from_program
from tests.conftest import importable_module

B, IN, OUT = 4, 8, 16


def op(graph, op_type: str) -> int:
    hits = [i for i, t in enumerate(graph.op_types) if t == op_type]
    assert len(hits) == 1, (op_type, graph.op_types)
    return hits[0]


@pytest.mark.parametrize("decompose", [False, True])
def test_linear_flops_bytes_shapes(decompose):
    g = capture(nn.Linear(IN, OUT), (torch.randn(B, IN),), decompose=decompose)
    assert g.total_flops == 2 * B * IN * OUT
    assert g.total_param_bytes == (IN * OUT + OUT) * 4
    assert g.out_shapes[-1] == [[B, OUT]] and g.out_dtypes[-1] == ["float32"]
    assert g.out_bytes[-1] == B * OUT * 4
    assert sorted(sum(g.params, [])) == ["bias", "weight"]


@pytest.mark.parametrize("decompose", [False, True])
def test_conv_flops(decompose):
    model = nn.Conv2d(3, 8, kernel_size=3, padding=1, bias=False)
    g = capture(model, (torch.randn(2, 3, 16, 16),), decompose=decompose)
    i = op(g, "aten.convolution.default" if decompose else "aten.conv2d.default")
    # 2 FLOPs per multiply-add; each output element sums Cin * 3 * 3 products.
    assert g.flops[i] == 2 * 2 * 8 * 16 * 16 * 3 * 3 * 3
    assert g.out_shapes[i] == [[2, 8, 16, 16]]
    assert g.param_bytes[i] == 8 * 3 * 3 * 3 * 4


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, IN)
        self.head = nn.Linear(IN, 10, bias=False)
        self.head.weight = self.emb.weight  # tied, as in language models

    def forward(self, tokens):
        return self.head(self.emb(tokens)).sum()


def test_tied_weight_counted_once():
    g = capture(Tied(), (torch.randint(0, 10, (B,)),))
    assert g.total_param_bytes == 10 * IN * 4
    emb, lin = op(g, "aten.embedding.default"), op(g, "aten.linear.default")
    assert g.param_bytes[emb] == 10 * IN * 4 and g.param_bytes[lin] == 0
    assert g.params[emb] == g.params[lin]  # one FQN for the shared tensor
    assert g.params[emb][0] in ("emb.weight", "head.weight")
    assert g.meta["tied_params"] == [["emb.weight", "head.weight"]] and not g.meta["unused_params"]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(IN, 2 * IN)
        self.bn = nn.BatchNorm1d(2 * IN)

    def forward(self, x):
        a, b = self.bn(self.fc(x)).chunk(2, dim=1)
        return (a * b).view(-1).sum()


def test_edges_views_buffers_and_module_paths():
    g = capture(Block(), (torch.randn(B, IN),))
    types = g.op_types
    chunk, mul, view = op(g, "aten.chunk.default"), op(g, "aten.mul.Tensor"), op(g, "aten.view.default")
    assert g.flops[chunk] == g.flops[view] == 0  # views are free ...
    assert g.out_bytes[view] == B * IN * 4  # ... but keep their logical size
    assert {"chunk", "view"} <= set(g.meta["alias_ops"])
    getitems = [i for i, t in enumerate(types) if t == "getitem"]
    assert len(getitems) == 2 and all(g.flops[i] == 0 for i in getitems)
    # chunk -> getitem edges carry one half each; getitem -> mul the same half.
    for i in getitems:
        assert g.predecessors(i).tolist() == [chunk]
    half = B * IN * 4
    edge_bytes = {(int(s), int(d)): int(b) for s, d, b in zip(g.edge_src, g.edge_dst, g.edge_bytes)}
    assert all(edge_bytes[(chunk, i)] == half and edge_bytes[(i, mul)] == half for i in getitems)
    assert g.flops[mul] == B * IN  # elementwise estimate: one FLOP per element
    bn = op(g, "aten.batch_norm.default")
    assert g.module_paths[bn] == "bn" and g.module_paths[op(g, "aten.linear.default")] == "fc"
    assert g.buffer_bytes.sum() == (2 * 2 * IN) * 4 + 8  # running mean/var + num_batches_tracked
    assert g.meta["inputs"][0]["shape"] == [B, IN] and g.meta["inputs"][0]["consumers"] == ["linear"]


def test_capture_is_deterministic_and_meta_device_matches():
    torch.manual_seed(0)
    x = (torch.randn(B, IN),)
    h1 = capture(Block(), x).content_hash
    h2 = capture(Block(), x).content_hash
    with torch.device("meta"):
        meta_model = Block()
    h3 = capture(meta_model, (torch.empty(B, IN, device="meta"),)).content_hash
    assert h1 == h2 == h3


def test_sdpa_and_matmul_flops():
    class Attn(nn.Module):
        def forward(self, q, k, v):
            return nn.functional.scaled_dot_product_attention(q, k, v) @ torch.ones(16, 3)

    q = torch.randn(2, 4, 32, 16)
    g = capture(Attn(), (q, q, q))
    sdpa = op(g, "aten.scaled_dot_product_attention.default")
    assert g.flops[sdpa] == 4 * 2 * 4 * 32 * 32 * 16  # QK^T and PV, 2 FLOPs per MAC
    mm = op(g, "aten.matmul.default")
    assert g.flops[mm] == 2 * 2 * 4 * 32 * 16 * 3


@pytest.mark.slow
def test_lstm_flops_formula_matches_decomposition():
    model = nn.LSTM(IN, OUT, num_layers=2)
    x = (torch.randn(5, B, IN),)
    whole = capture(model, x)
    i = op(whole, "aten.lstm.input")
    matmul = sum(5 * 2 * B * 4 * OUT * (n_in + OUT) for n_in in (IN, OUT))
    assert whole.flops[i] > matmul
    unrolled = capture(model, x, decompose=True)
    assert unrolled.num_ops > 5 * 2 * 5  # unrolled over time and layers
    mm_flops = sum(f for f, t in zip(unrolled.flops, unrolled.op_types) if "mm" in t)
    assert mm_flops == matmul
    assert unrolled.total_flops == pytest.approx(whole.flops[i], rel=0.35)


def test_json_round_trip(tmp_path):
    g = capture(Block(), (torch.randn(B, IN),), name="block")
    graphs.save(g, tmp_path / "g.json")
    back = graphs.load(tmp_path / "g.json")
    assert back.content_hash == g.content_hash and back.names == g.names


def test_pt2_load(tmp_path):
    ep = export_program(Block(), (torch.randn(B, IN),))
    torch.export.save(ep, tmp_path / "block.pt2")
    g = graphs.load(tmp_path / "block.pt2")
    ref = graph_from_program(ep, name="block")
    assert g.names == ref.names and np.array_equal(g.flops, ref.flops)
    assert g.name == "block" and g.total_param_bytes == ref.total_param_bytes


def test_bad_pt2_is_one_line(tmp_path):
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"not a zip")
    with pytest.raises(GraphFormatError, match="bad.pt2: not a loadable torch.export program") as e:
        graphs.load(bad)
    assert "\n" not in str(e.value)


class DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # the line the error must name
            return x * 2
        return x


def test_data_dependent_control_flow_is_named():
    with pytest.raises(CaptureError) as e:
        capture(DataDependent(), (torch.randn(3),))
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 400
    assert msg.startswith("capture failed: data-dependent control flow at test_capture.py:")
    line = DataDependent.forward.__code__.co_firstlineno + 1
    assert f"test_capture.py:{line} " in msg


#: A model from an installed library (as transformers' are): its routing asks the data, as DBRX's and JetMoE's do.
LIBRARY_MODEL = """
import torch
from torch import nn


class Routed(nn.Module):
    def forward(self, x):
        hit = (x > 0).any(dim=1).nonzero()
        for row in hit:  # the line the error must name
            x = x + row
        return x.sum()
"""


def test_a_data_dependent_line_in_an_installed_library_is_named_not_the_user_s_wrapper(tmp_path, monkeypatch):
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    (site / "fancylib").mkdir(parents=True)
    (site / "fancylib" / "__init__.py").write_text("")
    importable_module(site / "fancylib", monkeypatch, "modeling_fancy", LIBRARY_MODEL)
    monkeypatch.syspath_prepend(str(site))
    import fancylib.modeling_fancy as lib

    class Wrapper(nn.Module):  # the user's file: a loss around the library's model
        def __init__(self):
            super().__init__()
            self.model = lib.Routed()

        def forward(self, x):
            return self.model(x)

    with pytest.raises(CaptureError) as e:
        capture(Wrapper(), (torch.randn(4, 3),))
    line = LIBRARY_MODEL.splitlines().index("        for row in hit:  # the line the error must name") + 1
    assert f" at fancylib/modeling_fancy.py:{line} " in str(e.value), str(e.value)  # its path in the library


def test_model_errors_are_one_line(capsys):
    with pytest.raises(CaptureError, match="not a torch.nn.Module"):
        capture(lambda x: x, (torch.randn(2),))
    with pytest.raises(CaptureError, match=r"capture failed: RuntimeError .*same reduction dim") as e:
        capture(nn.Linear(3, 4), (torch.randn(2, 5),))
    assert "\n" not in str(e.value)
    assert capsys.readouterr().err == ""  # torch's logs and graph dumps are silenced


_NONZERO_MODULE = """
import torch


class Picky(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        idx = torch.nonzero(x > 0)
        return self.lin(x).sum() + idx.float().sum()


class Masked(torch.nn.Module):
    def forward(self, x):
        return x[x > 0].sum() * 2


def build():
    return Picky(), (torch.randn(3, 4),)


def build_masked():
    return Masked(), (torch.randn(3, 4),)
"""


class _Nonzero(nn.Module):
    def forward(self, x):
        return torch.nonzero(x > 0).float().sum()


def test_data_dependent_output_shape_is_one_capture_error():
    # torch.export accepts it; building the graph needed a concrete size and
    # escaped the wrapper as a long GuardOnDataDependentSymNode traceback.
    with pytest.raises(CaptureError) as info:
        capture(_Nonzero(), (torch.randn(3, 4),))
    msg = str(info.value)
    assert msg.startswith("capture failed: data-dependent output shape at node nonzero") and "\n" not in msg
    assert "test_capture.py:" in msg  # the user's line (the program exported again, with its stack traces)


class _Scaled(nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0)


def test_a_capture_records_no_stack_traces_and_a_program_to_run_keeps_them():
    """A capture only reads its program: its export walks no stack per node (13-27 % of a capture's time)."""
    import torch.fx.config as fx_tracing

    model, inputs = _Scaled(), (torch.randn(2, 4),)
    ep, graph = capture_program(model, inputs)
    calls = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert calls and graph.num_ops == len(calls)
    if hasattr(fx_tracing, "do_not_emit_stack_traces"):  # torch >= 2.12 has the switch
        assert not any(n.meta.get("stack_trace") for n in calls)
    assert fx_tracing.__dict__.get("do_not_emit_stack_traces", False) is False  # restored
    kept = [n for n in export_program(model, inputs).graph.nodes if n.op == "call_function"]
    assert all("test_capture.py" in n.meta.get("stack_trace", "") for n in kept)


def test_graph_building_failures_are_capture_errors(monkeypatch):
    import graphs.torch_capture as tc

    ep = export_program(nn.Linear(2, 2), (torch.randn(1, 2),))

    def broken(val):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(tc, "_nbytes", broken)
    with pytest.raises(
        CaptureError, match=r"capture failed: cannot convert node \w+ \(placeholder\) \(RuntimeError: boom\)$"
    ) as info:
        graph_from_program(ep)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("builder", ["build", "build_masked"])
def test_cli_export_of_a_data_dependent_model_is_one_line(tmp_path, monkeypatch, capsys, builder):
    from placer.cli import main

    importable_module(tmp_path, monkeypatch, "mymod", _NONZERO_MODULE)
    rc = main(["export", f"mymod:{builder}", "-o", "g.json"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "capture failed" in err and "mymod.py:" in err
    assert not (tmp_path / "g.json").exists()


@pytest.mark.parametrize(
    "recorded, path",
    [
        ("model.transformer.h.0.attn", "model.transformer.h.0.attn"),  # as torch.export gives it today
        ("L['self'].model.transformer.h[0].attn", "model.transformer.h.0.attn"),  # the tracer's form, left as it was
        ("getattr(L['self'].model.h, '1').mlp", "model.h.1.mlp"),
        ("L['self']", ""),
    ],
)
def test_module_paths_are_dotted_names_of_the_root_model(recorded, path):
    from types import SimpleNamespace

    from graphs.program_nodes import module_path

    node = SimpleNamespace(meta={"nn_module_stack": {"L__self__": ("", "Wrap"), "inner": (recorded, "GPT2Attention")}})
    assert module_path(node) == path


def test_an_installed_library_s_line_is_named_where_site_packages_sits_inside_the_stdlib_s_folder(monkeypatch):
    """A Python installed without a venv (/usr/local/lib/python3.11/site-packages): the model's library frame is
    named, the stdlib's and torch's are not."""
    import graphs.export as export

    monkeypatch.setattr(export, "_STDLIB_DIR", "/usr/local/lib/python3.11")
    site = "/usr/local/lib/python3.11/site-packages/"
    frames = [
        ("/home/me/train.py", 9),
        (site + "transformers/models/dbrx/modeling_dbrx.py", 296),
        (site + "torch/_tensor.py", 1100),
        ("/usr/local/lib/python3.11/contextlib.py", 81),
        (site + "sympy/core/relational.py", 512),
    ]
    assert export.user_line(frames) == "transformers/models/dbrx/modeling_dbrx.py:296"
    assert export.user_line(frames[:1] + frames[2:]) == "train.py:9"


def _frozen_mlp(freeze: tuple[int, ...]) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    for k in freeze:
        m[k].requires_grad_(False)
    return m


def test_a_frozen_parameter_is_resident_bytes_with_no_gradient_and_a_graph_without_one_is_as_it_was():
    from graphs.ops import frozen_weight_mask, grad_mask

    x = (torch.randn(8, 16),)
    trained = capture(_frozen_mlp(()), x)
    assert "frozen_params" not in trained.meta  # unchanged for every model that freezes nothing: its hash too
    linear = [i for i, t in enumerate(trained.op_types) if t == "aten.linear.default"]
    assert trained.param_bytes[linear].tolist() == [16 * 17 * 4, 16 * 17 * 4, 4 * 17 * 4]
    assert not trained.buffer_bytes.any()

    g = capture(_frozen_mlp((0, 2)), x)  # a frozen backbone, a trainable head
    assert g.meta["frozen_params"] == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert g.param_bytes[linear].tolist() == [0, 0, 4 * 17 * 4]
    assert g.buffer_bytes[linear].tolist() == [16 * 17 * 4, 16 * 17 * 4, 0]
    assert g.total_param_bytes == 4 * 17 * 4
    # the first frozen layer reads the input alone: no backward; the second is past it: none either
    assert grad_mask(g)[linear].tolist() == [False, False, True]
    assert frozen_weight_mask(g)[linear].tolist() == [True, True, False]
    assert g.content_hash != trained.content_hash

    g = capture(_frozen_mlp((2,)), x)  # a frozen layer between trainable ones: its input's gradient only
    assert grad_mask(g)[linear].tolist() == [True, True, True]
    assert frozen_weight_mask(g)[linear].tolist() == [False, True, False]


def test_a_frozen_backbone_is_simulated_without_its_gradients_optimizer_state_or_weight_gradients():
    import envs
    from envs import Cluster
    from graphs.plan import Placement

    def simulated(freeze):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
        for k in freeze:
            m[k].requires_grad_(False)
        g = capture(m, (torch.randn(16, 256),))
        r = envs.SimEnv(g, Cluster.preset("k80x2")).simulate(
            Placement.from_indices(g, ["gpu:0"], np.zeros(g.num_ops, dtype=int))
        )
        return r.step_time_s, r.peak_bytes["gpu:0"]

    (step, peak), (frozen_step, frozen_peak) = simulated(()), simulated((0, 2))
    frozen_bytes = 2 * 257 * 256 * 4
    # gradients and Adam's two moments of the frozen weights are not held: 3x their bytes, less activations the
    # first layer no longer keeps for a backward it does not run
    assert 2.9 * frozen_bytes < peak - frozen_peak <= 3 * frozen_bytes
    # no backward for the first layer, the input's gradient alone for the second, no update for either
    assert frozen_step < 0.6 * step


@pytest.mark.parametrize("freeze", [(), (0,), (0, 2), (2,)])
def test_the_simulated_resident_bytes_are_what_a_training_step_leaves_held(freeze):
    from envs.sim import cost

    model = _frozen_mlp(freeze)
    x = (torch.randn(8, 16),)
    g = capture(model, x)
    optimizer = torch.optim.Adam(model.parameters())  # as users write it: Adam skips what takes no gradient
    model(*x).sum().backward()
    optimizer.step()
    held = sum(p.numel() * p.element_size() for p in model.parameters())
    held += sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    held += sum(
        v.numel() * v.element_size() for state in optimizer.state.values() for k, v in state.items() if k != "step"
    )
    assert int(cost.static_bytes(g).sum()) == held


class Products(nn.Module):
    """Products whose operands take a gradient or not: a LoRA layer (a frozen base, adapters scaled by a number), a
    frozen norm weight, a table computed from a buffer (as a rotary embedding's), and one tensor times itself."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Linear(16, 16)
        self.base = nn.Linear(16, 16).requires_grad_(False)
        self.a, self.b = nn.Linear(16, 4, bias=False), nn.Linear(4, 16, bias=False)
        self.norm = nn.Parameter(torch.ones(16), requires_grad=False)
        self.register_buffer("table", torch.randn(8, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        y = self.base(h) + self.b(self.a(h)) * 2.0
        y = y * self.norm * self.table.cos()
        return y * y


@pytest.mark.parametrize("freeze", [(), (0,), (0, 2), (2,), "products"])
def test_the_activations_the_simulator_keeps_for_the_backward_are_those_autograd_saves(freeze):
    """A layer that runs no backward (a frozen first layer: nothing it reads takes a gradient) is not recorded by
    autograd, and saves nothing; a product keeps an operand only for another that takes a gradient (a frozen base
    layer keeps no input, ``x * 2.0`` and ``x * cos`` no ``x``, ``y * y`` its ``y``): the simulator keeps
    (graphs.ops.saved_mask) exactly the op outputs autograd saves."""
    from envs.sim import cost
    from graphs.ops import saved_mask

    model = Products() if freeze == "products" else _frozen_mlp(freeze)
    x = torch.randn(8, 16)
    g = capture(model, (x,))
    out_ptr = g.out_csr[0]
    consumed = np.diff(out_ptr) > 0  # the output (no consumer) is kept as the result, not saved
    simulated = int(cost.activation_bytes(g)[saved_mask(g) & consumed].sum())
    own = {p.untyped_storage().data_ptr() for p in model.parameters()} | {x.untyped_storage().data_ptr()}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in own:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).sum().backward()
    assert simulated == sum(saved.values()) > 0


class _CachesOnItself(nn.Module):
    """A forward that caches what it computes on the module, as x-transformers' ALiBi (a buffer registered on the
    first call, kept while big enough) and rotary embeddings (a table kept as an attribute) do."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 6)

    def forward(self, x):
        n = x.shape[1]
        if getattr(self, "bias", None) is None or self.bias.shape[0] < n:
            self.register_buffer("bias", torch.arange(n, dtype=x.dtype).neg().exp(), persistent=False)
        if getattr(self, "table", None) is None or self.table.shape[0] < n:
            self.table = torch.linspace(0, 1, n, dtype=x.dtype)
        return (self.proj(x) * self.bias[:n, None] + self.table[:n, None]).square().mean()


def test_a_capture_leaves_no_fake_tensor_of_its_trace_in_a_model_that_caches_on_itself():
    torch.manual_seed(0)
    model = _CachesOnItself()
    x = torch.randn(2, 5, 6)
    first = capture(model, (x,))
    # the trace's cache is not left on the user's model: it has what it had, a second capture sees what the first
    # did, and the model runs eagerly as before
    assert [n for n, _ in model.named_buffers()] == [] and "table" not in vars(model)
    assert all(type(t) in (torch.Tensor, nn.Parameter) for t in [*model.parameters(), *model.buffers()])
    assert capture(model, (x,)).content_hash == first.content_hash
    fresh = _CachesOnItself()
    fresh.load_state_dict(model.state_dict())
    for shape in [(2, 5, 6), (1, 3, 6)]:
        y = torch.randn(*shape)
        torch.testing.assert_close(model(y), fresh(y), rtol=0, atol=0)


class _Forces(nn.Module):
    """An energy's forces, -dE/dpos, taken inside the forward (as interatomic potentials do)."""

    def __init__(self):
        super().__init__()
        self.energy = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, pos, target):
        pos = pos.requires_grad_(True)
        (forces,) = torch.autograd.grad(-self.energy(pos).sum(), pos, create_graph=True)  # the line named
        return (forces - target).pow(2).mean()


def test_a_forward_that_takes_a_gradient_itself_is_refused_in_one_line_naming_where():
    import inspect

    model = _Forces()
    with pytest.raises(CaptureError) as e:
        capture(model, (torch.randn(6, 3), torch.randn(6, 3)))
    lines, start = inspect.getsourcelines(_Forces.forward)
    line = start + next(k for k, text in enumerate(lines) if "the line named" in text)
    message = str(e.value)
    assert message.startswith("capture failed: the forward takes a gradient itself (torch.autograd.grad at "), message
    assert f"test_capture.py:{line})" in message and "\n" not in message, message
    assert torch.autograd.grad.__module__ == "torch.autograd"  # torch's own again
    loss = model(torch.randn(6, 3), torch.randn(6, 3))  # and the model runs eagerly as before
    loss.backward()
    assert model.energy[0].weight.grad is not None


def test_gradients_noted_while_tracing_are_the_tracing_thread_s_only():
    import threading

    from graphs.export import gradients_noted

    def step():
        w = torch.ones(2, requires_grad=True)
        (w * 3).sum().backward()

    taken: list[str] = []
    with gradients_noted(taken):
        worker = threading.Thread(target=step)  # another thread training meanwhile
        worker.start()
        worker.join()
        assert taken == []
        step()
    assert taken == ["backward() at test_capture.py:" + str(step.__code__.co_firstlineno + 2)]


class _AveragedOverRanks(nn.Module):
    """A library's layer that averages a statistic over the data-parallel ranks when it finds a process group
    (vector-quantize-pytorch's LFQ does)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        import torch.distributed as dist

        stat = torch.tanh(self.a(x)).mean(0)
        if dist.is_initialized() and dist.get_world_size() > 0:
            stat = stat * 2.0  # where the library would all_reduce
        return (self.a(x) * stat).sum()


def test_a_capture_inside_a_process_group_is_one_process_s_program():
    import torch.distributed as dist

    from graphs.export import one_process_world

    model, x = _AveragedOverRanks(), (torch.randn(3, 4),)
    alone = capture(model, x)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert capture(model, x).content_hash == alone.content_hash  # no doubling in the program
        assert dist.is_initialized()  # torch's own answer again after the capture
        with one_process_world():
            assert not dist.is_initialized()
            assert dist.get_world_size() == 1  # torch's own calls still see the group
    finally:
        dist.destroy_process_group()


class _Variational(nn.Module):
    """A VAE's step with torch.distributions as a user writes it: a posterior made in the forward and sampled with
    ``rsample``, a prior kept on the model (made before, checking its samples), a KL divergence and a categorical
    decoder's ``log_prob``."""

    def __init__(self) -> None:
        super().__init__()
        self.enc, self.dec = nn.Linear(6, 4), nn.Linear(2, 5 * 6)
        self.prior = torch.distributions.Normal(torch.zeros(2), torch.ones(2))

    def forward(self, x, tokens):
        mu, raw = self.enc(x).chunk(2, -1)
        posterior = torch.distributions.Normal(mu, nn.functional.softplus(raw) + 1e-3)
        z = posterior.rsample()
        words = torch.distributions.Categorical(logits=self.dec(z).view(-1, 6, 5))
        kl = torch.distributions.kl_divergence(posterior, self.prior).sum(-1)
        return (kl - words.log_prob(tokens).sum(-1) - self.prior.log_prob(z).sum(-1)).mean()


@pytest.fixture
def distributions_checked():
    """torch.distributions' value checks on (Python's default; a library imported by another test may turn them off
    for the process: ``Distribution.set_default_validate_args(False)``)."""
    was = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(True)
    yield
    torch.distributions.Distribution.set_default_validate_args(was)


def test_a_model_that_makes_distributions_in_its_forward_is_captured_and_its_program_computes_the_same(
    distributions_checked,
):
    torch.manual_seed(0)
    model, x = _Variational(), torch.randn(3, 6)
    tokens = torch.randint(0, 5, (3, 6))
    ep = export_program(model, (x, tokens))  # the checks of values (Python's debug checks) were a data-dependent branch
    targets = {str(n.target) for n in ep.graph.nodes}
    assert not targets & {"aten._assert_scalar.default", "aten.item.default", "aten._local_scalar_dense.default"}
    with torch.random.fork_rng():
        torch.manual_seed(1)
        eager = model(x, tokens)
    with torch.random.fork_rng():
        torch.manual_seed(1)
        program = ep.module()(x, tokens)
    torch.testing.assert_close(program, eager)  # rsample draws the same numbers
    assert graph_from_program(ep).num_ops > 0
    # the checks are back after the capture, and a distribution made with validate_args=True keeps its own
    with pytest.raises(ValueError, match="scale"):
        torch.distributions.Normal(torch.zeros(1), -torch.ones(1))
    model.prior = torch.distributions.Normal(torch.zeros(2), torch.ones(2), validate_args=True)
    model.forward = lambda x, tokens: torch.distributions.Normal(x, x.exp(), validate_args=True).log_prob(x).mean()
    with pytest.raises(CaptureError, match="data-dependent control flow at test_capture.py"):
        export_program(model, (x, tokens))


class DictHeld(nn.Module):
    """Weights read through a plain dict, as ncps' liquid time-constant cell reads its own (``self._params[...]``);
    ``view``: a view of a weight kept in a plain attribute and read instead."""

    def __init__(self, view: bool = False) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))
        self.b = nn.Parameter(torch.randn(4))
        self.register_buffer("scale", torch.full((4,), 0.5))
        self.held = {"w": self.w, "b": self.b, "scale": self.scale}
        self.lin = nn.Linear(4, 4)
        self.t = self.w.detach().t() if view else None

    def forward(self, x):
        w = self.t if self.t is not None else self.held["w"]
        h = torch.tanh(x @ w + self.held["b"]) * self.held["scale"]
        return (self.lin(h) + h @ self.held["w"]).square().mean()


def test_parameters_read_through_a_plain_dict_are_the_program_s_inputs_and_train():
    """torch.export lifted each read of such a weight into a constant: the placed program ran on the weights' values at
    capture, none had a gradient, and training never reached them. They are the program's parameters."""
    import placer
    from graphs.plan import Placement

    torch.manual_seed(0)
    model, x = DictHeld(), torch.randn(3, 4)
    ep = export_program(model, (x,))
    assert not ep.constants  # the three reads of w, b and the buffer: its inputs for them
    graph = capture(model, (x,))
    assert {"w", "b"} <= set(sum(graph.params, []))  # the ops that read them hold them
    plan = Placement.from_indices(graph, ["cpu:0", "gpu:0", "gpu:1"], [1 + k % 2 for k in range(graph.num_ops)])
    placed = placer.apply(model, plan, (x,), device_map="*=cpu", graph=graph)
    placed(x).backward()
    got = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    model(x).backward()
    for k, p in model.named_parameters():
        torch.testing.assert_close(got[k], p.grad)
    with torch.no_grad():
        model.w.add_(1.0)  # trained: the placed program reads the weight as it is now
    torch.testing.assert_close(placed(x), model(x))


def test_a_view_of_a_weight_read_as_a_constant_is_refused_in_one_line():
    with pytest.raises(CaptureError, match=r"reads part of parameter w other than through its module") as e:
        capture(DictHeld(view=True), (torch.randn(3, 4),))
    assert "\n" not in str(e.value)


class DataWrites(nn.Module):
    """A forward that uses its weight's ``.data``: ``cast``, writes it cast to the input's dtype and device, as
    pytorch-metric-learning's losses do on every call (no change); ``read``, computes with it (no gradient) beside
    the weight; ``clip``, writes it clipped into [-0.5, 0.5] (another tensor)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3))
        self.how = how

    def forward(self, x):
        if self.how == "clip":
            self.w.data = self.w.data.clamp(-0.5, 0.5)
        elif self.how == "cast":
            self.w.data = self.w.data.to(device=x.device, dtype=x.dtype)
        out = (x @ self.w).tanh().square().mean()
        return out + (x @ self.w.data).sin().mean() if self.how == "read" else out


@pytest.mark.parametrize("how", ["cast", "read"])
def test_a_forward_that_reads_a_weight_s_data_or_writes_what_is_there_captures_and_trains(how):
    """torch.export traced neither: an op on ``.data`` left a fake tensor in the program's constants, which it
    refused naming no line (ArcFaceLoss)."""
    import placer
    from graphs.plan import Placement

    torch.manual_seed(0)
    model, x = DataWrites(how), torch.randn(5, 4)
    graph = capture(model, (x,))
    plan = Placement.from_indices(graph, ["cpu:0", "gpu:0", "gpu:1"], [1 + k % 2 for k in range(graph.num_ops)])
    placed = placer.apply(model, plan, (x,), device_map="*=cpu", graph=graph)
    loss = placed(x)
    loss.backward()
    got = model.w.grad.clone()
    model.zero_grad()
    expected = model(x)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(got, model.w.grad)  # no gradient through .data
    assert torch.Tensor.data is torch._C.TensorBase.data  # torch's own again after the capture


def test_a_forward_that_replaces_a_weight_s_data_is_refused_naming_its_line():
    with pytest.raises(CaptureError, match=r"the forward sets a tensor's \.data \(at test_capture\.py:\d+\)") as e:
        capture(DataWrites("clip"), (torch.randn(5, 4),))
    assert "\n" not in str(e.value) and torch.Tensor.data is torch._C.TensorBase.data

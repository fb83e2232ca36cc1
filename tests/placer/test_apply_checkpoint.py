"""placer.apply runs a plan's checkpointed blocks (envs.real.checkpointing) under torch's checkpoint.

Every logical device is the CPU here (``device_map="*=cpu"``); the blocks are decided on the program, so the wrap,
the second forward and the random state it restores all run.
"""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest
import torch
from torch import nn

import envs.real.homes as homes
from envs.real.checkpointing import CHECKPOINT_META
from envs.real.transfers import to_device
from graphs import PlacerError
from graphs.ops import param_owners
from graphs.plan import Placement
from graphs.torch_capture import capture
from placer.apply import apply
from tests.placer.hf_tiny import build_llama
from tests.placer.test_apply_homes import train_side_by_side

DEVICES = ["cpu:0", "gpu:0"]


class Blocks(nn.Module):
    """An input layer, two residual blocks with dropout (``blocks.0``, ``blocks.1``), a head; the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 32)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.3), nn.Linear(64, 32)) for _ in range(2)
        )
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h).pow(2).mean()


def plan(graph, checkpoint, devices=None):
    p = Placement.from_indices(graph, DEVICES, np.ones(graph.num_ops, dtype=int) if devices is None else devices)
    p.checkpoint = list(checkpoint)
    return p


def saved_bytes(module, *inputs) -> int:
    """Bytes autograd saves for the backward during a forward of ``module`` (a checkpointed block saves its inputs
    only: its own hooks keep nothing of what its ops save)."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(*inputs).backward()
    return total[0]


def test_checkpointed_blocks_train_as_the_unplaced_model_does_dropout_included_and_save_less():
    torch.manual_seed(0)
    model, x = Blocks(), torch.randn(128, 8)  # activations outweigh the weights the linears save
    ref = copy.deepcopy(model)
    g = capture(model, (x,))
    # blocks.0 on gpu:0, the rest on cpu:0: the block's input is copied in, its output copied out
    on = np.array([1 if p.startswith("blocks.0") else 0 for p in g.module_paths])
    placed = apply(model, plan(g, ["blocks.0", "blocks.1"], on), (x,), device_map="*=cpu")
    assert placed.meta[CHECKPOINT_META] == {"blocks.0": "_placer_checkpoint_0", "blocks.1": "_placer_checkpoint_1"}
    torch.manual_seed(1)  # dropout: the same masks in the forward, the second forward and the unplaced model
    seeds = torch.get_rng_state()
    torch.set_rng_state(seeds)
    placed_loss = placed(x)
    torch.set_rng_state(seeds)
    ref_loss = ref(x)
    torch.testing.assert_close(placed_loss, ref_loss)
    torch.set_rng_state(seeds)
    train_side_by_side_seeded(placed, ref, x)
    plain = apply(copy.deepcopy(ref), plan(g, [], on), (x,), device_map="*=cpu")
    assert saved_bytes(placed, x) < 0.6 * saved_bytes(plain, x)


def train_side_by_side_seeded(placed, ref, x, steps=3):
    """:func:`train_side_by_side` with the same random state before each model's forward (dropout); ``x``: the input,
    or a tuple of them."""

    class Seeded(nn.Module):
        def __init__(self, inner, state):
            super().__init__()
            self.inner, self.state = inner, state

        def forward(self, *a):
            torch.set_rng_state(self.state[0])
            return self.inner(*a)

    state = [torch.get_rng_state()]
    train_side_by_side(Seeded(placed, state), Seeded(ref, state), x if isinstance(x, tuple) else (x,), steps)


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_a_llama_with_its_decoder_layers_checkpointed_keeps_loss_and_gradients():
    model, inputs = build_llama()
    ref = copy.deepcopy(model)
    g = capture(model, inputs)
    layers = sorted({m.group(1) for p in g.module_paths if (m := re.match(r"^(.*\.layers\.\d+)(\.|$)", p))})
    assert len(layers) >= 2, layers
    # the layers on gpu:0, the rest (embedding, rotary tables, norm, head) on cpu:0: the rotary tables a layer's
    # attention reads are copied in before the layer (passed in), not inside it (its second forward would copy them
    # again)
    on = np.array([1 if any(p == b or p.startswith(b + ".") for b in layers) else 0 for p in g.module_paths])
    placed = apply(model, plan(g, layers, on), inputs, device_map="*=cpu")
    assert len(placed.meta[CHECKPOINT_META]) == len(layers)
    for name in placed.meta[CHECKPOINT_META].values():
        body = getattr(placed, name)
        copies = [n for n in body.graph.nodes if n.target is to_device]
        assert all(a.op != "placeholder" for n in copies for a in n.all_input_nodes), body.code
    assert any(n.target is to_device for n in placed.graph.nodes)
    train_side_by_side(placed, ref, inputs, steps=2)


def test_inputs_at_other_sizes_run_the_blocks_checkpointed_too():
    torch.manual_seed(0)
    model, x = Blocks(), torch.randn(16, 8)
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    ref = copy.deepcopy(model)
    g = capture(model, (x,))
    placed = apply(model, plan(g, ["blocks.0", "blocks.1"]), (x,), device_map="*=cpu")
    plain = apply(copy.deepcopy(ref), plan(g, []), (x,), device_map="*=cpu")
    other = torch.randn(100, 8)  # another batch size: the program with dynamic dimensions
    train_side_by_side(placed, ref, (other,), steps=1)
    assert placed.meta["placer_dynamic_dims"]
    assert saved_bytes(placed, other) < 0.6 * saved_bytes(plain, other)


class Deep(nn.Module):
    """Two residual blocks of three linears each, dropout between them, a head: a block's second forward fetches
    more homed parameters than the window of two holds."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.3), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 16))
            for _ in range(2)
        )
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x).pow(2).mean()


def homed_and_checkpointed(model, x):
    """``model`` (a :class:`Deep`) applied with every op on gpu:0, its blocks' parameters homed on cpu:0 and both
    blocks checkpointed."""
    g = capture(model, (x,))
    owners = param_owners(g)
    h = np.full(g.num_ops, -1)
    for name in owners:
        if name.startswith("blocks."):
            h[owners[name]] = 0
    p = Placement.from_indices(g, DEVICES, np.ones(g.num_ops, dtype=int), homes=h)
    p.checkpoint = ["blocks.0", "blocks.1"]
    return apply(model, p, (x,), device_map="*=cpu")


def test_checkpointed_blocks_with_their_parameters_homed_on_the_host_train_as_the_unplaced_model_does():
    """Every op on gpu:0, the blocks' parameters homed on cpu:0, the blocks checkpointed: each block's second forward
    fetches its parameters again (outside the window, kept for their readers' backward), and nothing is fetched a
    third time before a backward."""
    torch.manual_seed(0)
    model, x = Deep(), torch.randn(64, 16)
    ref = copy.deepcopy(model)
    placed = homed_and_checkpointed(model, x)
    runtime = placed.get_submodule(homes.RUNTIME_ATTR)
    assert len(runtime.masters) == 12
    for name in placed.meta[CHECKPOINT_META].values():  # a block's fetches run inside it
        assert sum(n.target is homes.fetch_home for n in getattr(placed, name).graph.nodes) == 6
    calls = {"second forward": 0, "before a backward": 0}
    second, again = runtime._recompute_copy, runtime._refetch

    def count(key, fn):
        def counted(*a):
            calls[key] += 1
            return fn(*a)

        return counted

    runtime._recompute_copy = count("second forward", second)
    runtime._refetch = count("before a backward", again)
    torch.manual_seed(1)  # dropout: the same masks in both forwards and in the unplaced model
    train_side_by_side_seeded(placed, ref, x, steps=3)
    assert calls == {"second forward": 3 * 12, "before a backward": 0}


def test_a_second_forward_s_copy_is_freed_after_its_reader_s_backward_as_the_simulator_charges():
    """The copies a block's second forward makes live until their reader's backward has run, not to the block's last
    backward (envs.sim.checkpointing holds each until its op's backward ends). When blocks.1's middle linear's
    gradient is sent home, its copy and the last linear's are freed and the first linear's (its backward still to
    come) is live. A copy its reader does not save (a bias) is freed at once; the simulator holds it to the backward,
    a bias's few bytes more."""
    from torch.multiprocessing.reductions import StorageWeakRef

    torch.manual_seed(0)
    model, x = Deep(), torch.randn(64, 16)
    placed = homed_and_checkpointed(model, x)
    runtime = placed.get_submodule(homes.RUNTIME_ATTR)
    body = placed.get_submodule(placed.meta[CHECKPOINT_META]["blocks.1"])
    index = {str(n.args[2].target): n.args[1] for n in body.graph.nodes if n.target is homes.fetch_home}
    made, live_at = {}, {}
    second, send = runtime._recompute_copy, runtime._send_home

    def recorded(i):
        copy = second(i)
        made[i] = StorageWeakRef(copy.untyped_storage())
        return copy

    def sending(i, copy):
        live_at[i] = {j for j, ref in made.items() if not ref.expired()}
        return send(i, copy)

    runtime._recompute_copy, runtime._send_home = recorded, sending
    placed(x).backward()
    first, middle, last = (index[f"blocks_1_{k}_weight"] for k in (0, 2, 4))
    assert live_at[last] == {first, middle}
    assert live_at[middle] == {first}
    assert index["blocks_1_0_bias"] in made and not live_at[first]


class Branches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blk = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
        self.side = nn.Linear(8, 8)

    def forward(self, x):
        return (self.blk(x) + self.side(x)).sum()


def test_blocks_that_cannot_be_checkpointed_are_one_line_errors():
    torch.manual_seed(0)
    model, x = Blocks(), torch.randn(16, 8)
    g = capture(model, (x,))
    split = np.array([1 if p.startswith("blocks.0.3") else 0 for p in g.module_paths])
    with pytest.raises(PlacerError, match=r"placement: checkpoint block 'blocks.0' runs on cpu:0, gpu:0"):
        apply(model, plan(g, ["blocks.0"], split), (x,), device_map="*=cpu")
    with pytest.raises(PlacerError, match="checkpoint names module 'nosuch', which runs no op"):
        apply(model, plan(g, ["nosuch"]), (x,), device_map="*=cpu")
    # an order that issues another module's op between a block's ops cannot be wrapped
    br, gr = Branches(), None
    gr = capture(br, (x,))
    side = next(i for i, p in enumerate(gr.module_paths) if p == "side")
    first = next(i for i, p in enumerate(gr.module_paths) if p.startswith("blk"))
    order = [i for i in range(gr.num_ops) if i != side]
    order.insert(order.index(first) + 1, side)
    p = plan(gr, ["blk"])
    p.order = np.array(order)
    with pytest.raises(
        PlacerError, match="block 'blk''s ops are not issued one after the other .'linear_2' of another module"
    ):
        apply(br, p, (x,), device_map="*=cpu")
    p.order = None  # node order issues the block's ops together
    apply(br, p, (x,), device_map="*=cpu")
    with pytest.raises(PlacerError, match="one microbatch"):
        apply(copy.deepcopy(model), plan(g, ["blocks.0"]), (x,), device_map="*=cpu", microbatches=2)
    bn = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.BatchNorm1d(8), nn.ReLU()))
    gb = capture(bn, (x,))
    with pytest.raises(PlacerError, match="checkpoint: block '1' writes .* in place"):
        apply(bn, plan(gb, ["1"]), (x,), device_map="*=cpu")


def _gpt2(layers=3, width=64, batch=4, seq=256):
    from graphs.models.corpus import LossOf, load_transformers

    t = load_transformers()
    torch.manual_seed(0)
    config = t.GPT2Config(n_layer=layers, n_embd=width, n_head=4, vocab_size=500, n_positions=seq)
    model = LossOf(t.GPT2LMHeadModel(config))
    ids = torch.randint(0, 500, (batch, seq), generator=torch.Generator().manual_seed(1))
    return model, (ids, ids.clone())


def homes_search_plan(g, fraction):
    """The plan `placer place --method homes` makes (400 placements, no headroom) for ``g`` on the tiny scenario's
    cluster with a GPU of ``fraction`` of ``g``'s all-on-GPU peak; checked to fit."""
    import dataclasses

    import envs
    from bench import offload
    from placer.learn.offload_plan import plan_with_homes

    base = offload.SCENARIOS["tiny"]
    roomy = offload.scenario_cluster(dataclasses.replace(base, gpu_cap_bytes=10**12))
    peak = envs.SimEnv(g, roomy).simulate(Placement.from_indices(g, roomy.device_names, [1] * g.num_ops))
    cap = int(fraction * peak.peak_bytes["gpu:0"])
    cluster = offload.scenario_cluster(dataclasses.replace(base, gpu_cap_bytes=cap))
    p = plan_with_homes(g, cluster, evals=400, headroom=1.0)
    assert envs.SimEnv(g, cluster).simulate(p).ok
    return p


def _bert():
    from graphs.models.corpus import LossOf, load_transformers

    t = load_transformers()
    torch.manual_seed(0)
    config = t.BertConfig(
        num_hidden_layers=3, hidden_size=64, num_attention_heads=4, intermediate_size=256, vocab_size=500
    )
    model = LossOf(t.BertForMaskedLM(config))
    ids = torch.randint(0, 500, (8, 128), generator=torch.Generator().manual_seed(1))
    return model, (ids, ids.clone())


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
@pytest.mark.parametrize("build", [_gpt2, _bert], ids=["gpt2", "bert"])
def test_the_homes_search_s_plan_with_checkpointed_layers_trains_as_the_unplaced_model_does(build):
    """The plan `placer place --method homes` makes for a GPU too small for the model's activations (layers
    checkpointed), applied to two architectures the checkpointing was not written on, dropout on (0.1)."""
    model, inputs = build()
    ref = copy.deepcopy(model)
    g = capture(model, inputs)
    p = homes_search_plan(g, 0.6)
    assert p.checkpoint
    placed = apply(model, p, inputs, device_map="*=cpu")
    assert len(placed.meta[CHECKPOINT_META]) == len(p.checkpoint)
    train_side_by_side_seeded(placed, ref, inputs, steps=2)


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
@pytest.mark.parametrize("build", [_gpt2, _bert], ids=["gpt2", "bert"])
def test_every_layer_checkpointed_with_every_parameter_homed_on_the_host_trains_as_the_unplaced_model_does(build):
    """FSDP2's offload with activation checkpointing as a plan (bench.offload_homes.fsdp2_offload_plan): every op on
    gpu:0, every parameter that can live apart homed on cpu:0, every layer checkpointed; dropout on (0.1)."""
    from bench import offload
    from bench.offload_homes import fsdp2_offload_plan

    model, inputs = build()
    ref = copy.deepcopy(model)
    g = capture(model, inputs)
    p = fsdp2_offload_plan(g, offload.scenario_cluster(offload.SCENARIOS["tiny"]), checkpoint=True)
    assert len(p.checkpoint) == 3 and len(p.param_homes) > 20
    placed = apply(model, p, inputs, device_map="*=cpu")
    assert len(placed.meta[CHECKPOINT_META]) == 3
    inside = sum(
        n.target is homes.fetch_home
        for name in placed.meta[CHECKPOINT_META].values()
        for n in getattr(placed, name).graph.nodes
    )
    assert inside >= 3 * 8  # each layer's own linears' weights and biases are fetched inside it
    train_side_by_side_seeded(placed, ref, inputs, steps=2)


@pytest.mark.slow
def test_the_homes_search_s_plan_homing_parameters_inside_checkpointed_layers_trains_as_the_unplaced_model_does():
    """A GPT-2 whose layers' training state and activations both crowd the GPU (width 256, a GPU of 35 % of its
    all-on-GPU peak): `placer place --method homes` homes parameters of layers it checkpoints, and the plan trains as
    the unplaced model does, dropout on (0.1)."""
    from graphs.plan import in_module

    model, inputs = _gpt2(layers=4, width=256, batch=8, seq=128)
    ref = copy.deepcopy(model)
    g = capture(model, inputs)
    p = homes_search_plan(g, 0.35)
    owners = param_owners(g)
    inside = [n for n in p.param_homes if any(in_module(g.module_paths[owners[n]], b) for b in p.checkpoint)]
    assert len(inside) >= 8
    placed = apply(model, p, inputs, device_map="*=cpu")
    fetched = sum(
        n.target is homes.fetch_home
        for name in placed.meta[CHECKPOINT_META].values()
        for n in getattr(placed, name).graph.nodes
    )
    assert fetched == len(inside)
    train_side_by_side_seeded(placed, ref, inputs, steps=2)


class ViewBlock(nn.Module):
    """A residual block reading its weights through views taken before they are read (``w.t()``, ``u.T``)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 32) / 4)
        self.u = nn.Parameter(torch.randn(16, 32) / 4)
        self.b = nn.Parameter(torch.zeros(32))

    def forward(self, x):
        w, u = self.w, self.u.T
        return x + torch.tanh(x @ w + self.b) @ u


class ViewDeep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(ViewBlock() for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x.pow(2).mean()


def test_checkpointed_blocks_reading_their_homed_parameters_through_views_train_as_the_unplaced_model_does():
    torch.manual_seed(0)
    model, x = ViewDeep(), torch.randn(64, 16)
    ref = copy.deepcopy(model)
    placed = homed_and_checkpointed(model, x)
    assert len(placed.get_submodule(homes.RUNTIME_ATTR).masters) == 6
    train_side_by_side_seeded(placed, ref, x, steps=3)


class ViewOutside(nn.Module):
    """A weight's view taken outside the block that reads it (the view runs with its reader, in the block); with
    ``shared``, both blocks read the one view (it runs again in each)."""

    def __init__(self, shared: bool = False) -> None:
        super().__init__()
        self.shared = shared
        self.w = nn.Parameter(torch.randn(16, 16) / 4)
        self.blocks = nn.ModuleList(ViewInner() for _ in range(2))

    def forward(self, x):
        wt = self.w.T
        x = self.blocks[0](x, wt)
        return self.blocks[1](x, wt if self.shared else torch.ones(16, 16) / 16).pow(2).mean()


class ViewInner(nn.Module):
    def forward(self, x, wt):
        return x + torch.tanh(x @ wt)


@pytest.mark.parametrize("shared", [False, True])
def test_a_block_reading_a_homed_parameter_through_a_view_taken_outside_it_trains_as_the_unplaced_model_does(shared):
    torch.manual_seed(0)
    model, x = ViewOutside(shared), torch.randn(8, 16)
    ref = copy.deepcopy(model)
    g = capture(model, (x,))
    h = np.full(g.num_ops, -1)
    h[param_owners(g)["w"]] = 0
    p = Placement.from_indices(g, DEVICES, np.ones(g.num_ops, dtype=int), homes=h)
    p.checkpoint = ["blocks.0", "blocks.1"] if shared else ["blocks.0"]
    placed = apply(model, p, (x,), device_map="*=cpu")
    for block in p.checkpoint:  # each block fetches its copy and takes its view of it
        body = placed.get_submodule(placed.meta[CHECKPOINT_META][block])
        assert [n.target for n in body.graph.nodes if n.op == "call_function"][:2] == [
            homes.fetch_home,
            torch.ops.aten.numpy_T.default,
        ]
    train_side_by_side(placed, ref, (x,))


class CrossDeep(nn.Module):
    """Two blocks of ``nn.MultiheadAttention`` attending from ``q`` to ``kv``: each reads the query's part and the
    keys' and values' part of its packed projection (:func:`envs.real.homes.part_read`)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.MultiheadAttention(8, 2, batch_first=True) for _ in range(2))

    def forward(self, q, kv):
        for block in self.blocks:
            q = q + block(q, kv, kv, need_weights=False)[0]
        return q.pow(2).mean()


def test_checkpointed_blocks_reading_parts_of_their_homed_packed_projections_train_as_the_unplaced_model_does():
    # each block's second forward (in the backward) copies the parts again, and the parts' gradients go home
    torch.manual_seed(0)
    model, inputs = CrossDeep(), (torch.randn(2, 3, 8), torch.randn(2, 5, 8))
    ref = copy.deepcopy(model)
    g = capture(model, inputs)
    owners = param_owners(g)
    h = np.full(g.num_ops, -1)
    h[[owners[name] for name in owners if name.startswith("blocks.")]] = 0
    p = Placement.from_indices(g, DEVICES, np.ones(g.num_ops, dtype=int), homes=h)
    p.checkpoint = ["blocks.0", "blocks.1"]
    placed = apply(model, p, inputs, device_map="*=cpu")
    assert sum(part is not None for part in placed.get_submodule(homes.RUNTIME_ATTR).parts) == 8
    train_side_by_side(placed, ref, inputs)

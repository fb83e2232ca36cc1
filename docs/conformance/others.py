"""Hugging Face architectures outside placer's conformance corpus, tiny, built from their configs (no weights, no
network), not tuned on: every plan of bench.conformance on each, in one process, every logical device on the CPU;
with ``--homes``, every homeable parameter on the host instead (:func:`homed_check`). The 15 of
docs/ranks/zb/others.py (the probe of plans across processes) and 12 more. From the repository root:

    PYTHONPATH=. python docs/conformance/others.py [NAME ...] > docs/conformance/others.log
    PYTHONPATH=. python docs/conformance/others.py --homes [NAME ...] > docs/conformance/others_homes.log
    PYTHONPATH=. python docs/conformance/others.py --homes --corpus > docs/conformance/corpus_homes.log
    PYTHONPATH=. python docs/conformance/others.py --corpus --train > docs/conformance/corpus_train.log
    PYTHONPATH=. python docs/conformance/others.py --newer > docs/conformance/newer.log
    PYTHONPATH=. python docs/conformance/others.py --newer --homes > docs/conformance/newer_homes.log
    PYTHONPATH=. python docs/conformance/others.py --diffusers > docs/conformance/diffusers.log
    PYTHONPATH=. python docs/conformance/others.py --diffusers --homes > docs/conformance/diffusers_homes.log
    PYTHONPATH=. python docs/conformance/others.py --lucid > docs/conformance/lucid.log
    PYTHONPATH=. python docs/conformance/others.py --lucid --homes > docs/conformance/lucid_homes.log
    PYTHONPATH=. python docs/conformance/others.py --pyg > docs/conformance/pyg.log
    PYTHONPATH=. python docs/conformance/others.py --pyg --homes > docs/conformance/pyg_homes.log
    PYTHONPATH=. python docs/conformance/others.py --tune > docs/conformance/tune.log
    PYTHONPATH=. python docs/conformance/others.py --tune --homes > docs/conformance/tune_homes.log
    PYTHONPATH=. python docs/conformance/others.py --med > docs/conformance/med.log
    PYTHONPATH=. python docs/conformance/others.py --med --homes > docs/conformance/med_homes.log
    PYTHONPATH=. python docs/conformance/others.py --equi > docs/conformance/equi.log
    PYTHONPATH=. python docs/conformance/others.py --equi --homes > docs/conformance/equi_homes.log
    PYTHONPATH=. python docs/conformance/others.py --vq > docs/conformance/vq.log
    PYTHONPATH=. python docs/conformance/others.py --vq --homes > docs/conformance/vq_homes.log
    PYTHONPATH=. python docs/conformance/others.py --ode > docs/conformance/ode.log
    PYTHONPATH=. python docs/conformance/others.py --ode --homes > docs/conformance/ode_homes.log
    PYTHONPATH=. python docs/conformance/others.py --rev > docs/conformance/rev.log
    PYTHONPATH=. python docs/conformance/others.py --rev --homes > docs/conformance/rev_homes.log
    PYTHONPATH=. python docs/conformance/others.py --modal > docs/conformance/modal.log
    PYTHONPATH=. python docs/conformance/others.py --modal --homes > docs/conformance/modal_homes.log
    PYTHONPATH=. python docs/conformance/others.py --param > docs/conformance/param.log
    PYTHONPATH=. python docs/conformance/others.py --param --homes > docs/conformance/param_homes.log
    PYTHONPATH=. python docs/conformance/others.py --state > docs/conformance/state.log
    PYTHONPATH=. python docs/conformance/others.py --state --homes > docs/conformance/state_homes.log
    PYTHONPATH=. python docs/conformance/others.py --sci > docs/conformance/sci.log
    PYTHONPATH=. python docs/conformance/others.py --sci --homes > docs/conformance/sci_homes.log
    PYTHONPATH=. python docs/conformance/others.py --metric > docs/conformance/metric.log
    PYTHONPATH=. python docs/conformance/others.py --metric --homes > docs/conformance/metric_homes.log
    PYTHONPATH=. python docs/conformance/others.py --lora > docs/conformance/lora.log
    PYTHONPATH=. python docs/conformance/others.py --lora --homes > docs/conformance/lora_homes.log

(``--diffusers``: diffusers' denoisers and autoencoder, docs/ranks/zb/diffusion.py; needs ``pip install
diffusers``. ``--lucid``: x-transformers' models, docs/ranks/zb/lucid.py; needs ``pip install x-transformers``.
``--pyg``: PyTorch Geometric's graph networks, docs/ranks/zb/pyg.py; needs ``pip install torch_geometric``.
``--tune``: torchtune's decoders and its LoRA model, docs/ranks/zb/tune.py; needs torchtune.
``--med``: MONAI's networks for medical volumes, docs/ranks/zb/med.py; needs ``pip install --no-deps monai``.
``--equi``: e3nn's equivariant networks, docs/ranks/zb/equi.py; needs ``pip install --no-deps e3nn opt_einsum
opt_einsum_fx``.
``--vq``: vector-quantize-pytorch's quantizers in an autoencoder, docs/ranks/zb/vq.py; needs ``pip install --no-deps
vector-quantize-pytorch``.
``--ode``: torchdiffeq's neural ODEs, docs/ranks/zb/ode.py; needs ``pip install --no-deps torchdiffeq``.
``--rev``: layers that are their libraries' own autograd Functions (mambapy, reformer-pytorch, revtorch, entmax,
pytorch-tabnet) and zuko's flows, docs/ranks/zb/rev.py; needs the ``pip install --no-deps`` its doc names.
``--modal``: speech, image-text, Fourier, forecasting and long-attention models of transformers,
docs/ranks/zb/modal.py. ``--param``: models whose weights are torch.nn parametrizations, docs/ranks/zb/param.py.
``--state``: models whose forward updates buffers (batch norm on two views, a running normaliser, an EMA codebook, the
hook-based spectral norm), docs/ranks/zb/state.py.
``--sci``: neural operators (neuraloperator, torch-harmonics), liquid networks (ncps), the FT-Transformer (rtdl),
ESM-2 (fair-esm) and gpytorch's deep kernel learning, docs/ranks/zb/sci.py; needs the ``pip install --no-deps`` its
doc names.
``--metric``: pytorch-metric-learning's losses with weights of their own (ArcFace, ProxyAnchor) and a mined triplet
loss, SIREN, lucidrains' Perceiver, pykan's KAN and a denoiser on kornia's SSIM loss, docs/ranks/zb/metric.py; needs
the ``pip install --no-deps`` its doc names.
``--lora``: fine-tuning with frozen weights, peft's LoRA and a frozen backbone, docs/lora/lora.py;
needs ``pip install peft``.)

(``--corpus``: the conformance corpus's models, :mod:`graphs.models.corpus`, instead of these. ``--train``: each model
in training mode, dropout as its config sets it, where the corpus builds them in eval.)

On a GPU machine, ``--homes --device-map gpu:0=cuda:0`` runs the same check with ``gpu:0`` on CUDA: the copies
from pinned host memory on side streams, the window of two and the gradients sent home (``envs.real.homes``'s CUDA
path). There the host's Adam steps the homed parameters and the GPU's the others, so the comparisons are to 1e-4
relative (1e-5 absolute) instead of to the bit (``docs/gpu_calls/h200-next-homes-views.sh``).
"""

import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ranks", "zb"))
import others as zb  # noqa: E402  (docs/ranks/zb/others.py)

from bench import conformance  # noqa: E402


def _funnel():
    """Funnel's masked LM, as zb._lm builds the others (its config takes block sizes, not a number of layers)."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.FunnelConfig(
        vocab_size=128, d_model=32, n_head=4, d_head=8, d_inner=64, block_sizes=[1, 1], max_position_embeddings=64
    )
    for k in ("hidden_dropout", "attention_dropout", "activation_dropout"):
        setattr(cfg, k, 0.0)
    model = transformers.FunnelForMaskedLM(cfg).eval()
    ids = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(1))
    return zb.Loss(model), (ids, ids.clone())


def _rwkv():
    """RWKV's causal LM in training mode (it has no dropout): in eval mode it caches its state, updated in place, and
    rescales its output weights in place at the first call (``rescale_every``, for inference), so a backward of
    the unplaced model fails there, or of a plan's second microbatch."""
    loss, inputs = zb._lm("RwkvConfig", "RwkvForCausalLM", attention_hidden_size=32, context_length=64)
    return loss.train(), inputs


#: The 15 models of docs/ranks/zb/others.py, then 12 that no probe had placed, built the same way (zb._lm: vocabulary
#: 128, 4 layers of 32, dropout off, eval mode, batch 4 x 16; masked LMs take the tokens as their labels too).
MODELS = {
    name: getattr(zb, name)
    for name in (
        "falcon", "gptj", "bloom", "starcoder2", "olmo2", "phi3", "stablelm", "cohere", "granite", "bigcode",
        "gemma2", "electra", "convnext", "swin", "whisper",
    )
}  # fmt: skip
MODELS.update(
    {
        "nemotron": lambda: zb._lm("NemotronConfig", "NemotronForCausalLM", num_key_value_heads=2),
        "mamba": lambda: zb._lm("MambaConfig", "MambaForCausalLM", state_size=4, use_mambapy=True),
        "rwkv": lambda: _rwkv(),
        "recurrent_gemma": lambda: zb._lm(
            "RecurrentGemmaConfig",
            "RecurrentGemmaForCausalLM",
            num_key_value_heads=2,
            lru_width=32,
            attention_window_size=8,
            head_dim=8,
        ),
        "albert": lambda: zb._lm("AlbertConfig", "AlbertForMaskedLM", embedding_size=16),
        "deberta": lambda: zb._lm("DebertaConfig", "DebertaForMaskedLM"),
        "deberta_v2": lambda: zb._lm("DebertaV2Config", "DebertaV2ForMaskedLM"),
        "xlm_roberta": lambda: zb._lm("XLMRobertaConfig", "XLMRobertaForMaskedLM", pad_token_id=1),
        "mpnet": lambda: zb._lm("MPNetConfig", "MPNetForMaskedLM"),
        "convbert": lambda: zb._lm("ConvBertConfig", "ConvBertForMaskedLM"),
        "funnel": lambda: _funnel(),
        "mobilebert": lambda: zb._lm(
            "MobileBertConfig",
            "MobileBertForMaskedLM",
            embedding_size=16,
            intra_bottleneck_size=16,
            true_hidden_size=16,
        ),
    }
)


def homed_check(model: torch.nn.Module, inputs: tuple, steps: int = 3, device_map: str = "*=cpu") -> str:
    """Every op on gpu:0 and every parameter that can live apart homed on cpu:0 (issue 50's plan with homes at its
    extreme), against the same plan without homes: Adam steps on both; losses, gradients and the weights after must
    be equal to the bit. Both are also checked against the unplaced model under SGD (to 1e-6): under Adam a placed
    program and eager PyTorch drift apart with or without homes alike (Adam's ``g / (sqrt(v) + eps)`` turns
    gradients that differ in their last bits and are near zero into different steps, which later steps amplify;
    2e-4 to 9e-4 after two steps on OLMo2, StableLM and Granite here, the same with homes and without).
    """
    import copy

    import numpy as np

    from envs.real.devices import resolve_devices
    from envs.real.homes import RUNTIME_ATTR
    from envs.sim.homes import copy_pairs, homeable
    from graphs.plan import Placement
    from graphs.torch_capture import capture
    from placer.apply import apply

    # every module here is a copy of the model: where a copy is another program (e3nn's generated code, traced
    # again when copied; bench.conformance.copies_keep_program), the graph is the copies' (a copy's copy keeps it)
    model = copy.deepcopy(model)
    graph = capture(model, inputs)
    can = homeable(graph)
    on_gpu = np.ones(graph.num_ops, dtype=int)

    def placed(homes: np.ndarray) -> torch.nn.Module:
        plan = Placement.from_indices(graph, ["cpu:0", "gpu:0"], on_gpu, homes=homes)
        return apply(copy.deepcopy(model), plan, inputs, device_map=device_map)

    gpu = resolve_devices(["gpu:0"], device_map)["gpu:0"]

    def unplaced() -> torch.nn.Module:
        return copy.deepcopy(model).to(gpu)

    def batch() -> tuple:
        return tuple(x.to(gpu) if isinstance(x, torch.Tensor) else x for x in inputs)

    def train(modules: list, optimizer, compare, unplaced_first: bool = False) -> None:
        opts = [optimizer(m.parameters(), lr=0.05) for m in modules]
        for step in range(steps):
            for o in opts:
                o.zero_grad()
            losses = []
            for k, m in enumerate(modules):  # each from one random state (LSH attention draws its rotations)
                torch.manual_seed(1000 + step)
                losses.append(m(*(batch() if k == 0 and unplaced_first else inputs)))
            for loss in losses:
                loss.backward()
            for loss in losses[1:]:
                compare(loss, losses[0], "loss")
            named = [dict(m.named_parameters()) for m in modules]
            for name, p in named[0].items():
                for other in named[1:]:
                    if p.grad is not None or other[name].grad is not None:
                        compare(other[name].grad, p.grad, name)
            for o in opts:
                o.step()
        for name, p in named[0].items():
            for other in named[1:]:
                compare(other[name], p, name)

    def equal(a, b, what):
        if gpu.type != "cpu":  # the host's Adam against the GPU's: equal to rounding
            torch.testing.assert_close(a.to(b.device), b, rtol=1e-4, atol=1e-5, msg=what)
            return
        if not torch.equal(a, b):
            diff = float((a - b).abs().max())
            raise AssertionError(
                f"{what}: not equal to the bit (at most {diff:.2g} apart, {diff / float(b.abs().max()):.2g} of its "
                "largest value)"
            )

    def close(a, b, what):
        tol = {"rtol": 1e-5, "atol": 1e-6} if gpu.type == "cpu" else {"rtol": 1e-4, "atol": 1e-5}
        torch.testing.assert_close(a.to(b.device), b, msg=what, **tol)

    homed = np.where(can > 0, 0, -1)
    with_homes = placed(homed)
    train([placed(np.full(graph.num_ops, -1)), with_homes], torch.optim.Adam, equal)
    train([unplaced(), placed(np.full(graph.num_ops, -1)), placed(homed)], torch.optim.SGD, close, True)
    how = "to the bit" if gpu.type == "cpu" else f"to 1e-4 ({gpu.type})"
    runtime = with_homes.get_submodule(RUNTIME_ATTR)
    part = sum(p is not None for p in runtime.parts)
    copied, simulated = sum(runtime.copy_bytes()), int(copy_pairs(graph)[2].sum())
    return (
        f"{int((can > 0).sum())} of {int((can != 0).sum())} parameter owners homed on cpu:0"
        + (f" ({part} of their {len(runtime.parts)} copies a part of one)" if part else "")
        + f": 3 Adam steps equal {how} to the plan's without homes, 3 SGD steps equal the unplaced model's; "
        + (
            f"{copied:,} bytes copied in a forward, as simulated"
            if copied == simulated
            else f"{copied:,} bytes copied in a forward, {simulated:,} simulated"
        )
    )


args = sys.argv[1:]
with_homes = "--homes" in args
device_map = "*=cpu"
if "--device-map" in args:
    k = args.index("--device-map")
    device_map = args[k + 1]
    del args[k : k + 2]
corpus = "--corpus" in args  # the conformance corpus's models instead (with --homes: homed_check on each)
if corpus:
    from graphs.models.corpus import FAMILIES, build
if "--newer" in args:  # the 22 of docs/ranks/zb/others.py's NEWER instead
    MODELS = zb.NEWER
if "--diffusers" in args:  # diffusers' models instead (docs/ranks/zb/diffusion.py; pip install diffusers)
    import diffusion

    MODELS = diffusion.MODELS
if "--lucid" in args:  # x-transformers' models instead (docs/ranks/zb/lucid.py; pip install x-transformers)
    import lucid

    MODELS = lucid.MODELS
if "--pyg" in args:  # PyTorch Geometric's graph networks instead (docs/ranks/zb/pyg.py; pip install torch_geometric)
    import pyg

    MODELS = pyg.MODELS
if "--tune" in args:  # torchtune's decoders instead (docs/ranks/zb/tune.py; needs torchtune)
    import tune

    MODELS = tune.MODELS
if "--med" in args:  # MONAI's networks for medical volumes instead (docs/ranks/zb/med.py; needs monai)
    import med

    MODELS = med.MODELS
if "--equi" in args:  # e3nn's equivariant networks instead (docs/ranks/zb/equi.py; needs e3nn)
    import equi

    MODELS = equi.MODELS
if "--vq" in args:  # vector-quantize-pytorch's quantizers instead (docs/ranks/zb/vq.py)
    import vq

    MODELS = vq.MODELS
if "--ode" in args:  # torchdiffeq's neural ODEs instead (docs/ranks/zb/ode.py)
    import ode

    MODELS = ode.MODELS
if "--rev" in args:  # libraries' own autograd Functions, and zuko's flows, instead (docs/ranks/zb/rev.py)
    import rev

    MODELS = rev.MODELS
if "--modal" in args:  # speech, image-text, Fourier, forecasting, long-attention models (docs/ranks/zb/modal.py)
    import modal

    MODELS = modal.MODELS
if "--param" in args:  # torch.nn parametrizations: spectral norm, weight norm, orthogonal (docs/ranks/zb/param.py)
    import param

    MODELS = param.MODELS
if "--state" in args:  # forwards that update buffers: batch norm on two views, normalisers, EMA codebooks, old SN
    import state

    MODELS = state.MODELS
if "--sci" in args:  # scientific and other non-transformer libraries' models (docs/ranks/zb/sci.py)
    import sci

    MODELS = sci.MODELS
if "--metric" in args:  # metric-learning losses, SIREN, Perceiver, KAN, kornia's losses (docs/ranks/zb/metric.py)
    import metric

    MODELS = metric.MODELS
if "--lora" in args:  # fine-tuning with frozen weights instead (docs/lora/lora.py; pip install peft)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lora"))
    import lora

    MODELS = {name: getattr(lora, name) for name in lora.MODELS}
flags = (
    "--homes",
    "--corpus",
    "--newer",
    "--diffusers",
    "--lucid",
    "--pyg",
    "--tune",
    "--med",
    "--equi",
    "--vq",
    "--ode",
    "--rev",
    "--modal",
    "--param",
    "--state",
    "--sci",
    "--metric",
    "--lora",
    "--train",
    "-v",
)
names = [a for a in args if a not in flags] or list(FAMILIES if corpus else MODELS)
for name in names:
    t = time.perf_counter()
    try:
        built = build(name) if corpus else MODELS[name]()
        if "--train" in args:  # in training, dropout as each config sets it (the checks hold its draws fixed)
            built[0].train()
        if with_homes:  # python docs/conformance/others.py --homes > docs/conformance/others_homes.log
            what = homed_check(*built, device_map=device_map)
            print(f"{name}: ok, {what} ({time.perf_counter() - t:.0f} s)", flush=True)
            continue
        rows = conformance.check_model(name, built=built)
        bad = [f"{r.plan}: {r.message or r.worst}" for r in rows if not r.ok]
        worst = max((r.allowed_ratio for r in rows if r.allowed_ratio == r.allowed_ratio), default=float("nan"))
        verdict = "ok" if not bad else "FAIL " + "; ".join(bad)
        acc = sum(r.against == "accumulation" for r in rows)
        against = f" ({acc} of them against gradient accumulation, the step they compute)" if acc else ""
        print(
            f"{name}: {verdict}: {len(rows)} plans{against}, worst {worst:.2f}x the allowed error "
            f"({time.perf_counter() - t:.0f} s)",
            flush=True,
        )
    except Exception as e:
        print(f"{name}: ERROR {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
        if "-v" in sys.argv:
            raise

"""Hugging Face architectures outside placer's conformance corpus, tiny, built from their configs (no weights, no
network) and written for this probe, not tuned on: every plan of bench.conformance on each, in one process, every
logical device on the CPU. Run from the repository root:

    PYTHONPATH=. python docs/conformance/others.py [NAME ...] > docs/conformance/others.log
"""

import sys
import time

import torch

from bench import conformance
from graphs.models import corpus

tf = corpus.load_transformers()
D = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    vocab_size=corpus.VOCAB,
    max_position_embeddings=64,
)
MODELS = {
    "falcon": (
        "FalconConfig",
        "FalconForCausalLM",
        dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=corpus.VOCAB,
            hidden_dropout=0.0,
            attention_dropout=0.0,
        ),
    ),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", dict(D, num_key_value_heads=2)),
    "starcoder2": (
        "Starcoder2Config",
        "Starcoder2ForCausalLM",
        dict(D, num_key_value_heads=2, residual_dropout=0.0, embedding_dropout=0.0, attention_dropout=0.0),
    ),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(D, num_key_value_heads=2, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, pad_token_id=0),
    ),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(D, num_key_value_heads=2)),
    "gpt_bigcode": (
        "GPTBigCodeConfig",
        "GPTBigCodeForCausalLM",
        dict(
            n_embd=32,
            n_layer=2,
            n_head=4,
            vocab_size=corpus.VOCAB,
            n_positions=64,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        ),
    ),
    "bloom": (
        "BloomConfig",
        "BloomForCausalLM",
        dict(hidden_size=32, n_layer=2, n_head=4, vocab_size=corpus.VOCAB, hidden_dropout=0.0, attention_dropout=0.0),
    ),
    "gptj": (
        "GPTJConfig",
        "GPTJForCausalLM",
        dict(
            n_embd=32,
            n_layer=2,
            n_head=4,
            rotary_dim=4,
            vocab_size=corpus.VOCAB,
            n_positions=64,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        ),
    ),
    "granite": ("GraniteConfig", "GraniteForCausalLM", dict(D, num_key_value_heads=2)),
    "cohere": ("CohereConfig", "CohereForCausalLM", dict(D, num_key_value_heads=2)),
}

E = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    vocab_size=corpus.VOCAB,
    max_position_embeddings=64,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
MODELS.update(
    {
        "albert": ("AlbertConfig", "AlbertForMaskedLM", dict(E, embedding_size=16)),
        "deberta_v2": ("DebertaV2Config", "DebertaV2ForMaskedLM", dict(E)),
        "deberta": ("DebertaConfig", "DebertaForMaskedLM", dict(E)),
        "xlm_roberta": ("XLMRobertaConfig", "XLMRobertaForMaskedLM", dict(E, pad_token_id=1)),
        "mpnet": ("MPNetConfig", "MPNetForMaskedLM", dict(E)),
        "convbert": ("ConvBertConfig", "ConvBertForMaskedLM", dict(E)),
        "funnel": (
            "FunnelConfig",
            "FunnelForMaskedLM",
            dict(
                d_model=32,
                n_head=4,
                d_head=8,
                d_inner=64,
                block_sizes=[1, 1],
                vocab_size=corpus.VOCAB,
                hidden_dropout=0.0,
                attention_dropout=0.0,
                activation_dropout=0.0,
            ),
        ),
        "mamba": (
            "MambaConfig",
            "MambaForCausalLM",
            dict(hidden_size=32, state_size=4, num_hidden_layers=2, vocab_size=corpus.VOCAB, use_mambapy=True),
        ),
        "rwkv": (
            "RwkvConfig",
            "RwkvForCausalLM",
            dict(
                hidden_size=32,
                num_hidden_layers=2,
                attention_hidden_size=32,
                intermediate_size=64,
                vocab_size=corpus.VOCAB,
                context_length=64,
            ),
        ),
        "mobilebert": (
            "MobileBertConfig",
            "MobileBertForMaskedLM",
            dict(E, embedding_size=16, intra_bottleneck_size=16, true_hidden_size=16),
        ),
        "nemotron": ("NemotronConfig", "NemotronForCausalLM", dict(D, num_key_value_heads=2)),
        "recurrent_gemma": (
            "RecurrentGemmaConfig",
            "RecurrentGemmaForCausalLM",
            dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=2,
                vocab_size=corpus.VOCAB,
                lru_width=32,
                attention_window_size=8,
                head_dim=8,
            ),
        ),
    }
)


def homed_check(model: torch.nn.Module, inputs: tuple, steps: int = 2) -> str:
    """Every op on gpu:0 and every parameter that can live apart homed on cpu:0 (issue 50's plan with homes at its
    extreme): Adam steps on the placed model and on an unplaced copy; losses and gradients equal at each step
    (torch.testing's float32 tolerances), and the weights after, to lr / 500 as in tests/placer/test_apply_homes.py.

    The weights are compared where the unplaced gradient was at least 1e-10, or 0 on both, at every step: a
    gradient that is zero in exact arithmetic (a key projection's bias, which softmax cancels) is rounding noise of
    1e-12-1e-15, and Adam's step ``lr * g / (|g| + eps)`` turns noise that differs in its last bits into steps of
    up to ``lr``. The count of such entries is printed; with SGD they agree too (to 1e-8 on BLOOM and GPTBigCode).
    """
    import copy

    import numpy as np

    from envs.sim.homes import homeable
    from graphs.plan import Placement
    from graphs.torch_capture import capture
    from placer.apply import apply

    ref = copy.deepcopy(model)
    graph = capture(model, inputs)
    can = homeable(graph)
    homes = np.where(can > 0, 0, -1)
    plan = Placement.from_indices(graph, ["cpu:0", "gpu:0"], np.ones(graph.num_ops, dtype=int), homes=homes)
    placed = apply(model, plan, inputs, device_map="*=cpu")
    lr = 0.05
    opt, ref_opt = (torch.optim.Adam(m.parameters(), lr=lr) for m in (placed, ref))
    pairs = list(zip(placed.named_parameters(), ref.named_parameters()))
    sure = {n: torch.ones_like(q, dtype=torch.bool) for (n, _), (_, q) in pairs}
    for _ in range(steps):
        for o in (opt, ref_opt):
            o.zero_grad()
        loss, ref_loss = placed(*inputs), ref(*inputs)
        loss.backward()
        ref_loss.backward()
        torch.testing.assert_close(loss, ref_loss)
        for (n, p), (_, q) in pairs:
            if p.grad is not None or q.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, msg=n)
                sure[n] &= (q.grad.abs() >= 1e-10) | ((q.grad == 0) & (p.grad == 0))  # exact zeros stay in
        opt.step()
        ref_opt.step()
    for (n, p), (_, q) in pairs:
        torch.testing.assert_close(p[sure[n]], q[sure[n]], atol=lr / 500, rtol=1e-5, msg=n)
    noise = sum(int((~m).sum()) for m in sure.values())
    return (
        f"{int((can > 0).sum())} of {int((can != 0).sum())} parameter owners homed on cpu:0; "
        f"{noise} weight entries with a gradient of 0 < |g| < 1e-10 left out of the weights' comparison"
    )


args = sys.argv[1:]
with_homes = "--homes" in args
names = [a for a in args if a not in ("--homes", "-v")] or list(MODELS)
for name in names:
    cfg, cls, kw = MODELS[name]
    t = time.perf_counter()
    try:
        torch.manual_seed(0)
        model = getattr(tf, cls)(getattr(tf, cfg)(**kw))
        ids = corpus.token_ids(1, 4, 12)
        built = (corpus.LossOf(model), (ids, ids.clone()))
        if with_homes:  # python docs/conformance/others.py --homes > docs/conformance/others_homes.log
            what = homed_check(*built)
            print(f"{name}: ok, 2 Adam steps equal the unplaced model's, {what} ({time.perf_counter() - t:.0f} s)")
            continue
        rows = conformance.check_model(name, built=built)
        bad = [f"{r.plan}: {r.message or r.worst}" for r in rows if not r.ok]
        worst = max((r.allowed_ratio for r in rows if r.allowed_ratio == r.allowed_ratio), default=float("nan"))
        verdict = "ok" if not bad else "FAIL " + "; ".join(bad)
        print(
            f"{name}: {verdict}: {len(rows)} plans, worst {worst:.2f}x the allowed error "
            f"({time.perf_counter() - t:.0f} s)",
            flush=True,
        )
    except Exception as e:
        print(f"{name}: ERROR {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
        if "-v" in sys.argv:
            raise

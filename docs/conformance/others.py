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
names = sys.argv[1:] or list(MODELS)
for name in names:
    cfg, cls, kw = MODELS[name]
    t = time.perf_counter()
    try:
        torch.manual_seed(0)
        model = getattr(tf, cls)(getattr(tf, cfg)(**kw))
        ids = corpus.token_ids(1, 4, 12)
        rows = conformance.check_model(name, built=(corpus.LossOf(model), (ids, ids.clone())))
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

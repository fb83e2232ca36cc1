"""Hugging Face models of kinds no probe had placed: speech (CTC over a convolutional feature encoder), two-tower
image-text contrastive models, a Fourier-mixing encoder, forecasters whose loss is a distribution's negative log
likelihood, long-sequence attentions, a latent-array encoder and a routed mixture of experts; each tiny, built from
its config (nothing downloaded), dropouts zero, each ``(loss module, inputs)``. Not tuned on.

``modal:<name>`` with this folder on ``PYTHONPATH``; the conformance probe: ``PYTHONPATH=. python
docs/conformance/others.py --modal``.
"""

import torch
import transformers

from graphs.models.corpus import LossOf as Loss

transformers.logging.set_verbosity_error()
DROPOUTS = (
    "hidden_dropout",
    "attention_dropout",
    "activation_dropout",
    "feat_proj_dropout",
    "final_dropout",
    "layerdrop",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "dropout",
    "attention_dropout_prob",
    "encoder_layerdrop",
    "decoder_layerdrop",
    "positional_dropout",
    "ff_dropout",
    "path_dropout",
    "head_dropout",
    "dropout_rate",
    "mask_time_prob",
    "mask_feature_prob",
)


def _config(cfg_name: str, **kw):
    cfg = getattr(transformers, cfg_name)(**kw)
    for c in (cfg, getattr(cfg, "text_config", None), getattr(cfg, "vision_config", None)):
        for k in DROPOUTS:
            if c is not None and isinstance(getattr(c, k, None), float):
                setattr(c, k, 0.0)
    return cfg


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(1)


_SPEECH = dict(
    vocab_size=16,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    conv_dim=(16, 16),
    conv_kernel=(10, 3),
    conv_stride=(5, 2),
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=4,
    pad_token_id=0,
    ctc_loss_reduction="mean",
)


def _speech(cfg_name: str, model_name: str, **kw):
    """A CTC head over a feature encoder of 1-D convolutions: 4 clips of 800 samples, 8 labels each."""
    torch.manual_seed(0)
    m = getattr(transformers, model_name)(_config(cfg_name, **dict(_SPEECH, **kw))).train()
    g = _gen()
    audio, labels = torch.randn(4, 800, generator=g), torch.randint(1, 16, (4, 8), generator=g)
    return Loss(m, ("input_values", "labels")), (audio, labels)


def wav2vec2():
    """wav2vec 2.0 for CTC: group-norm feature encoder, a weight-normed positional convolution, CTC loss."""
    return _speech("Wav2Vec2Config", "Wav2Vec2ForCTC")


def hubert():
    return _speech("HubertConfig", "HubertForCTC")


def data2vec_audio():
    return _speech("Data2VecAudioConfig", "Data2VecAudioForCTC")


_TOWER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)


def _two_towers(cfg_name: str, model_name: str, text: dict, vision: dict):
    torch.manual_seed(0)
    cfg = _config(cfg_name, text_config=dict(_TOWER, **text), vision_config=dict(_TOWER, **vision))
    m = getattr(transformers, model_name)(cfg).train()
    g = _gen()
    ids, pixels = torch.randint(1, 64, (4, 12), generator=g), torch.randn(4, 3, 32, 32, generator=g)
    return Loss(m, ("input_ids", "pixel_values", "return_loss")), (ids, pixels, True)


def clip():
    """CLIP: a text and an image tower, the contrastive loss over the batch with a learned temperature."""
    return _two_towers(
        "CLIPConfig", "CLIPModel", dict(vocab_size=64, max_position_embeddings=16), dict(image_size=32, patch_size=8)
    )


def siglip():
    """SigLIP: the same towers, a pairwise sigmoid loss with a learned bias."""
    return _two_towers(
        "SiglipConfig",
        "SiglipModel",
        dict(vocab_size=64, max_position_embeddings=16),
        dict(image_size=32, patch_size=8),
    )


def _mlm(cfg_name: str, model_name: str, seq: int = 16, **kw):
    torch.manual_seed(0)
    base = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=max(64, seq),
    )
    m = getattr(transformers, model_name)(_config(cfg_name, **dict(base, **kw))).train()
    ids = torch.randint(1, 64, (4, seq), generator=_gen())
    return Loss(m), (ids, ids.clone())


def fnet():
    """FNet: token mixing by a 2-D Fourier transform (complex numbers inside, its real part out)."""
    return _mlm("FNetConfig", "FNetForMaskedLM", use_tpu_fourier_optimizations=False)


def longformer():
    """Longformer: sliding-window attention of width 4 over 16 tokens (chunked, padded to the window)."""
    return _mlm("LongformerConfig", "LongformerForMaskedLM", attention_window=4, pad_token_id=0)


def big_bird():
    """BigBird in block-sparse attention (blocks of 2, 2 random blocks drawn by numpy at each step)."""
    return _mlm(
        "BigBirdConfig", "BigBirdForMaskedLM", seq=64, attention_type="block_sparse", block_size=2, num_random_blocks=2
    )


def nystromformer():
    """Nyströmformer: attention through 8 landmarks, a pseudo-inverse by iteration."""
    return _mlm("NystromformerConfig", "NystromformerForMaskedLM", num_landmarks=8, segment_means_seq_len=16)


def xlnet():
    """XLNet: two-stream relative attention."""
    torch.manual_seed(0)
    cfg = _config("XLNetConfig", vocab_size=64, d_model=32, n_layer=2, n_head=4, d_inner=64)
    m = transformers.XLNetLMHeadModel(cfg).train()
    ids = torch.randint(1, 64, (4, 16), generator=_gen())
    return Loss(m), (ids, ids.clone())


def perceiver():
    """Perceiver IO for masked language modelling: cross-attention into 8 latents, self-attention among them, and a
    decoder's queries back to 16 positions."""
    torch.manual_seed(0)
    cfg = _config(
        "PerceiverConfig",
        vocab_size=64,
        max_position_embeddings=16,
        num_latents=8,
        d_latents=32,
        d_model=32,
        num_blocks=1,
        num_self_attends_per_block=2,
        num_self_attention_heads=4,
        num_cross_attention_heads=4,
    )
    m = transformers.PerceiverForMaskedLM(cfg).train()
    ids = torch.randint(1, 64, (4, 16), generator=_gen())
    return Loss(m, ("inputs", "labels")), (ids, ids.clone())


def switch():
    """Switch Transformer: a T5 whose feed-forwards are 4 experts routed top-1 with capacity, and a router loss."""
    torch.manual_seed(0)
    cfg = _config(
        "SwitchTransformersConfig",
        vocab_size=64,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        num_experts=4,
        expert_capacity=8,
        encoder_sparse_step=1,
        decoder_sparse_step=1,
        router_jitter_noise=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    m = transformers.SwitchTransformersForConditionalGeneration(cfg).train()
    g = _gen()
    src, tgt = torch.randint(1, 64, (4, 12), generator=g), torch.randint(1, 64, (4, 8), generator=g)
    return Loss(m, ("input_ids", "labels")), (src, tgt)


_SERIES = dict(
    prediction_length=8,
    context_length=16,
    d_model=16,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
)


def _forecaster(cfg_name: str, model_name: str, **kw):
    """A probabilistic forecaster of one series: its loss is the Student-t's negative log likelihood of the future."""
    torch.manual_seed(0)
    cfg = _config(cfg_name, **dict(_SERIES, **kw))
    m = getattr(transformers, model_name)(cfg).train()
    past_len = cfg.context_length + max(cfg.lags_sequence)
    g = _gen()
    past = torch.randn(4, past_len, generator=g).cumsum(1)
    future = torch.randn(4, cfg.prediction_length, generator=g).cumsum(1)
    inputs = (
        past,
        torch.arange(past_len, dtype=torch.float32).repeat(4, 1).unsqueeze(-1) / past_len,
        torch.ones(4, past_len),
        future,
        torch.arange(past_len, past_len + cfg.prediction_length, dtype=torch.float32).repeat(4, 1).unsqueeze(-1)
        / past_len,
    )
    keys = ("past_values", "past_time_features", "past_observed_mask", "future_values", "future_time_features")
    return Loss(m, keys), inputs


def time_series():
    return _forecaster(
        "TimeSeriesTransformerConfig",
        "TimeSeriesTransformerForPrediction",
        num_time_features=1,
        lags_sequence=[1, 2, 3],
    )


def informer():
    """Informer: ProbSparse attention (queries sampled at random each step)."""
    return _forecaster("InformerConfig", "InformerForPrediction", num_time_features=1, lags_sequence=[1, 2, 3])


def autoformer():
    """Autoformer: series decomposition and an auto-correlation found by FFT, its top delays by topk."""
    return _forecaster("AutoformerConfig", "AutoformerForPrediction", num_time_features=1, lags_sequence=[1, 2, 3])


def _patches(cfg_name: str, model_name: str, **kw):
    """A forecaster of 3 series from patches of 8 of their last 32 steps, 8 steps ahead, its loss a squared error."""
    torch.manual_seed(0)
    cfg = _config(
        cfg_name,
        num_input_channels=3,
        context_length=32,
        patch_length=8,
        patch_stride=8,
        prediction_length=8,
        d_model=16,
        **kw,
    )
    m = getattr(transformers, model_name)(cfg).train()
    g = _gen()
    inputs = (torch.randn(4, 32, 3, generator=g), torch.randn(4, 8, 3, generator=g))
    return Loss(m, ("past_values", "future_values")), inputs


def patchtst():
    """PatchTST: each channel its own sequence of patches, batch norm in its layers (its default)."""
    return _patches("PatchTSTConfig", "PatchTSTForPrediction", num_hidden_layers=2, num_attention_heads=2, ffn_dim=32)


def patchtsmixer():
    """PatchTSMixer: MLP-mixing of patches and channels."""
    return _patches("PatchTSMixerConfig", "PatchTSMixerForPrediction", num_layers=2)


def speecht5():
    """SpeechT5 speech-to-text: a convolutional speech prenet, an encoder-decoder, relative positions."""
    torch.manual_seed(0)
    cfg = _config(
        "SpeechT5Config",
        vocab_size=32,
        hidden_size=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        conv_dim=(16, 16),
        conv_kernel=(10, 3),
        conv_stride=(5, 2),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        max_text_positions=64,
        max_speech_positions=256,
        pad_token_id=0,
        decoder_start_token_id=2,
    )
    m = transformers.SpeechT5ForSpeechToText(cfg).train()
    g = _gen()
    return Loss(m, ("input_values", "labels")), (
        torch.randn(4, 800, generator=g),
        torch.randint(3, 32, (4, 8), generator=g),
    )


MODELS = {
    name: globals()[name]
    for name in (
        "wav2vec2",
        "hubert",
        "data2vec_audio",
        "clip",
        "siglip",
        "fnet",
        "longformer",
        "big_bird",
        "nystromformer",
        "xlnet",
        "perceiver",
        "switch",
        "time_series",
        "informer",
        "autoformer",
        "patchtst",
        "patchtsmixer",
        "speecht5",
    )
}
globals().update(MODELS)

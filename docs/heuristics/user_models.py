"""Language models as a user would hand them to placer (``module:callable``), larger than the tests': transformers'
RWKV, Mamba, Falcon and a tied Llama built from configs (no weights, no network), and torch's ``nn.Transformer``, 4
layers of 256 (the Transformer's 4 encoder and 4 decoder layers), vocabulary 1,000 (the Llama's 16,000), batch
8 x 64, in training mode. From the repository root:
``PYTHONPATH=docs/heuristics placer train user_models:rwkv --cluster k80x2 --time-budget 30``."""

import torch
import transformers


class Loss(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, labels):
        return self.model(input_ids=ids, labels=labels).loss


def _causal_lm(name, vocab_size=1000, **config):
    """transformers' ``{name}ForCausalLM`` from ``{name}Config(**config)`` and 8 x 64 tokens as inputs and labels."""
    torch.manual_seed(0)
    cfg = getattr(transformers, f"{name}Config")(hidden_size=256, num_hidden_layers=4, vocab_size=vocab_size, **config)
    ids = torch.randint(0, 1000, (8, 64), generator=torch.Generator().manual_seed(0))
    return Loss(getattr(transformers, f"{name}ForCausalLM")(cfg)), (ids, ids.clone())


def mamba():
    return _causal_lm("Mamba", state_size=16, use_mambapy=True)


def rwkv():
    return _causal_lm("Rwkv", attention_hidden_size=256, intermediate_size=512, context_length=64)


def falcon():
    return _causal_lm("Falcon", num_attention_heads=8, hidden_dropout=0.0, attention_dropout=0.0)


def llama_tied():
    """Llama with its head tied to its embedding, as Llama-3.2-1B and 3B are: a 16k vocabulary, so that the tied
    tensor holds half the parameters (a fifth in Llama-3.2-1B)."""
    return _causal_lm(
        "Llama", vocab_size=16000, num_attention_heads=8, intermediate_size=1024, tie_word_embeddings=True
    )


class Seq2Seq(torch.nn.Module):
    """Source and target tokens -> ``torch.nn.Transformer`` -> a vocabulary head, next-token loss: each decoder
    layer's cross attention splits its packed input projection into the query's part and the keys' and values'."""

    def __init__(self, vocab=1000, width=256, layers=4):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.transformer = torch.nn.Transformer(width, 4, layers, layers, 4 * width, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, src, tgt):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(tgt.shape[1] - 1, device=tgt.device)
        h = self.transformer(self.embed(src), self.embed(tgt[:, :-1]), tgt_mask=mask, tgt_is_causal=True)
        return torch.nn.functional.cross_entropy(self.head(h).flatten(0, 1), tgt[:, 1:].flatten())


def nn_transformer():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    return Seq2Seq(), (torch.randint(0, 1000, (8, 64), generator=gen), torch.randint(0, 1000, (8, 65), generator=gen))


class WideMLP(torch.nn.Module):
    """8 layers of 2,048 x 2,048 with GELU and a squared-error loss: 33.6 M parameters (134 MB) and little compute per
    parameter at batch 16, the shape where an optimizer step over offloaded weights is a large share of the step."""

    def __init__(self, width=2048, layers=8):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))

    def forward(self, x, y):
        for layer in self.layers:
            x = torch.nn.functional.gelu(layer(x))
        return torch.nn.functional.mse_loss(x, y)


def wide_mlp():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    return WideMLP(), (torch.randn(16, 2048, generator=gen), torch.randn(16, 2048, generator=gen))

"""Three language models as a user would hand them to placer (``module:callable``), larger than the tests':
transformers' RWKV, Mamba and Falcon built from configs (no weights, no network), batch 8 x 64. From the repository
root: ``PYTHONPATH=docs/heuristics placer train user_models:rwkv --cluster k80x2 --time-budget 30``."""

import torch
import transformers


class Loss(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, labels):
        return self.model(input_ids=ids, labels=labels).loss


def _ids(batch=8, seq=64, vocab=1000):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))


def mamba():
    torch.manual_seed(0)
    cfg = transformers.MambaConfig(
        hidden_size=256, state_size=16, num_hidden_layers=4, vocab_size=1000, use_mambapy=True
    )
    ids = _ids()
    return Loss(transformers.MambaForCausalLM(cfg)), (ids, ids.clone())


def rwkv():
    torch.manual_seed(0)
    cfg = transformers.RwkvConfig(
        hidden_size=256,
        num_hidden_layers=4,
        attention_hidden_size=256,
        intermediate_size=512,
        vocab_size=1000,
        context_length=64,
    )
    ids = _ids()
    return Loss(transformers.RwkvForCausalLM(cfg)), (ids, ids.clone())


def falcon():
    torch.manual_seed(0)
    cfg = transformers.FalconConfig(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=8,
        vocab_size=1000,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    ids = _ids()
    return Loss(transformers.FalconForCausalLM(cfg)), (ids, ids.clone())

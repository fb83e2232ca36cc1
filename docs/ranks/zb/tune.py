"""Models from another library none of us wrote: torchtune's decoders (PyTorch's fine-tuning library), tiny, built
from its model builders (nothing downloaded), each ``(loss module, inputs)``: the next token's cross entropy of a
batch of 4 sequences of 16 tokens. ``lora_llama3_2`` is torchtune's LoRA recipe's model: the base frozen
(``torchtune.modules.peft.set_trainable_params``), adapters on the queries, values and MLP trainable. Not tuned on.

``tune:<name>`` with this folder on ``PYTHONPATH`` (``placer train tune:llama3_2 ...``); the conformance probe:
``PYTHONPATH=. python docs/conformance/others.py --tune``. Needs torchtune (not a dependency of placer): ``pip
install --no-deps torchtune "torchao==0.11.0" datasets multiprocess dill pyarrow omegaconf sentencepiece
tiktoken`` keeps the CPU torch (torchtune 0.6.1 needs a torchao older than 0.18).
"""

import torch
import torch.nn.functional as F
from torch import nn

#: Vocabulary, sequence length and batch of every model.
VOCAB, LENGTH, BATCH = 128, 16, 4
#: The size every builder is given.
SIZE = {"vocab_size": VOCAB, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 32, "max_seq_len": 64}


class NextToken(nn.Module):
    """The decoder's logits for ``tokens[:, :-1]`` against ``tokens[:, 1:]``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens):
        logits = self.model(tokens[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())


def _tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, LENGTH + 1), generator=torch.Generator().manual_seed(1))


def _built(builder, **size) -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return NextToken(builder(**{**SIZE, **size})).eval(), (_tokens(),)


def llama3_2():
    from torchtune.models.llama3_2 import llama3_2

    return _built(llama3_2, intermediate_dim=64)


def qwen2():
    from torchtune.models.qwen2 import qwen2

    return _built(qwen2, intermediate_dim=64)


def gemma():
    from torchtune.models.gemma import gemma

    return _built(gemma, intermediate_dim=64, head_dim=8)


def mistral():
    from torchtune.models.mistral import mistral

    return _built(mistral, intermediate_dim=64)


def phi3():
    from torchtune.models.phi3 import phi3

    return _built(phi3, intermediate_dim=64)


def lora_llama3_2():
    from torchtune.models.llama3_2 import lora_llama3_2
    from torchtune.modules.peft import get_adapter_params, set_trainable_params

    model, inputs = _built(
        lora_llama3_2,
        lora_attn_modules=["q_proj", "v_proj"],
        apply_lora_to_mlp=True,
        intermediate_dim=64,
        lora_rank=4,
        lora_alpha=8,
    )
    set_trainable_params(model.model, get_adapter_params(model.model))
    return model, inputs


MODELS = {f.__name__: f for f in (llama3_2, qwen2, gemma, mistral, phi3, lora_llama3_2)}

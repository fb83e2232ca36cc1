"""torchao's quantization-aware training (``Int8DynActInt4WeightQATQuantizer``, the fake quantization torchtune's QAT
recipes use) on a two-layer MLP: the gradients of one placed step now, its fake quantization's autograd.Function
kept whole (graphs/custom_functions.py), and before, as torch.export alone traces it (switched off here). From the
repository root (torchao is installed with torchtune's probe, docs/ranks/zb/tune.py):

    PYTHONPATH=. python docs/conformance/qat.py > docs/conformance/qat.log
"""

import warnings

import torch
import torch.nn.functional as F
from torch import nn

warnings.filterwarnings("ignore")


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 8)

    def forward(self, x, y):
        return F.cross_entropy(self.b(torch.relu(self.a(x))), y)


def built():
    from torchao.quantization.qat import Int8DynActInt4WeightQATQuantizer

    torch.manual_seed(0)
    model = Int8DynActInt4WeightQATQuantizer(groupsize=32).prepare(MLP())
    g = torch.Generator().manual_seed(1)
    return model, (torch.randn(16, 64, generator=g), torch.randint(0, 8, (16,), generator=g))


if __name__ == "__main__":
    import contextlib

    import graphs.export as export
    import placer
    from graphs.plan import Placement
    from graphs.torch_capture import capture

    def one_step(model, inputs) -> dict:
        graph = capture(model, inputs)
        plan = Placement.from_indices(graph, ["cpu:0", "gpu:0"], [1] * graph.num_ops)
        model.zero_grad()
        placer.apply(model, plan, inputs, device_map="*=cpu", graph=graph)(*inputs).backward()
        return {k: float(p.grad.norm()) if p.grad is not None else 0.0 for k, p in model.named_parameters()}

    model, inputs = built()
    now = one_step(model, inputs)  # the functions kept whole (graphs/custom_functions.py)
    export.functions_kept = contextlib.nullcontext  # as torch.export alone traces them: placer before
    before = one_step(model, inputs)
    model.zero_grad()
    model(*inputs).backward()
    print("the gradients of one step (every op on gpu:0, mapped to the CPU), by their norm:")
    for name, p in model.named_parameters():
        eager = float(p.grad.norm())
        print(f"  {name}: eager {eager:.4f}, placed now {now[name]:.4f}, placed before {before[name]:.4f}")

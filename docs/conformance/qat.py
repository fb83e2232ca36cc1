"""torchao's quantization-aware training (``Int8DynActInt4WeightQATQuantizer``, the fake quantization torchtune's QAT
recipes use) on a two-layer MLP: what capture says now, and what ``placer.apply`` trained on before the check of a
model's own autograd.Functions (graphs/custom_functions.py), the check switched off here to show it. From the
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
    import graphs.export as export
    import placer
    from graphs import CaptureError
    from graphs.plan import Placement
    from graphs.torch_capture import capture

    model, inputs = built()
    try:
        capture(model, inputs)
    except CaptureError as e:
        print(f"now: {e}")
    export.custom_functions_refusal = lambda *args: ""  # the check off: placer before it
    graph = capture(model, inputs)
    model(*inputs).backward()
    eager = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    plan = Placement.from_indices(graph, ["cpu:0", "gpu:0"], [1] * graph.num_ops)
    placer.apply(model, plan, inputs, device_map="*=cpu", graph=graph)(*inputs).backward()
    print("before: the gradients of one step, eager and placed (every op on gpu:0, mapped to the CPU):")
    for name, p in model.named_parameters():
        placed = 0.0 if p.grad is None else float(p.grad.norm())
        print(f"  {name}: eager |g| {float(eager[name].norm()):.4f}, placed |g| {placed:.4f}")

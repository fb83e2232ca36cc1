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


def llama_qat(keep: bool) -> str:
    """torchtune's Llama 3.2 (docs/ranks/zb/tune.py) prepared for QAT, split in half over two devices in 2
    microbatches: each parameter's gradient against the eager step's."""
    import contextlib
    import os
    import sys

    from torchao.quantization.qat import Int8DynActInt4WeightQATQuantizer

    import graphs.export as export
    import placer
    from graphs.plan import Placement
    from graphs.torch_capture import capture

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ranks", "zb"))
    import tune

    model, inputs = tune.llama3_2()
    model.model = Int8DynActInt4WeightQATQuantizer(groupsize=32).prepare(model.model)
    saved = export.functions_kept
    if not keep:  # captured, and exported again by placer.apply, as torch.export alone traces the functions
        export.functions_kept = contextlib.nullcontext
    try:
        graph = capture(model, inputs)
        half = [1 if k < graph.num_ops // 2 else 2 for k in range(graph.num_ops)]
        plan = Placement.from_indices(graph, ["cpu:0", "gpu:0", "gpu:1"], half, microbatches=2)
        placer.apply(model, plan, inputs, device_map="*=cpu", graph=graph)(*inputs).backward()
    finally:
        export.functions_kept = saved
    got = {k: p.grad.clone() if p.grad is not None else torch.zeros_like(p) for k, p in model.named_parameters()}
    model.zero_grad()
    model(*inputs).backward()
    errors = {
        k: float((got[k] - p.grad).norm() / p.grad.norm())
        for k, p in model.named_parameters()
        if p.grad is not None and p.grad.norm() > 0
    }
    worst = max(errors, key=errors.get)
    wrong = sum(e > 0.5 for e in errors.values())
    kept = graph.op_types.count("placer.autograd_function.default")
    return (
        f"torchtune llama3_2 with QAT, {'functions kept whole' if keep else 'traced (before)'}: {kept} kept calls; "
        f"worst gradient {worst} at {errors[worst]:.1e} relative; {wrong} of {len(errors)} gradients over 50% off"
    )


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

    kept = export.functions_kept
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
    export.functions_kept = kept
    for keep in (True, False):
        print(llama_qat(keep))

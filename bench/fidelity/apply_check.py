"""The device check of a fidelity run: ``placer.apply``'s loss and gradients against a float64 reference.

The placed model (float32, TF32 off) and the float32 model on the CPU are both compared
with a float64 copy on the CPU, tensor by tensor: a gradient that is mostly
cancellation (batch norm over a 4x4 feature map) is percents off in float32 on any
device, so the placed model passes where its error is within a tolerance or twice the
float32 CPU model's own.
"""

from __future__ import annotations

import copy
from typing import Any

from bench.fidelity.models import build


def grad_errors(name: str, size: str, placement, graph, device_map: str) -> dict:
    """The placed model's loss and gradients (float32) and the CPU model's (float32) against a float64 CPU reference.

    Per tensor, ``max |got - want| / max |want|`` (``*_max_rel``) and ``|got - want| / |want|``
    in the 2-norm (``*_norm_rel``). TF32 is off. The float32 CPU model's own error says
    how well float32 can compute each gradient at all: a gradient that is mostly
    cancellation (a batch-norm layer on a 4x4 feature map) is off by percents in
    float32 on any device.
    """
    import torch

    from envs.real.timing import default_loss
    from placer.apply import apply

    model, inputs = build(name, size)
    ref64 = copy.deepcopy(model).double()
    cpu32 = copy.deepcopy(model)
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        placed = apply(model, placement, inputs, device_map=device_map, graph=graph)
        runs, losses = {}, {}
        for label, module, args in (
            ("placed", placed, inputs),
            ("cpu32", cpu32, inputs),
            ("ref64", ref64, tuple(t.double() if t.is_floating_point() else t for t in inputs)),
        ):
            torch.manual_seed(5)  # dropout draws alike where they run on the CPU
            out = module(*args)
            loss = default_loss(out)
            loss.backward()
            losses[label] = loss.detach().double().cpu().reshape(1)
            runs[label] = {
                k: p.grad.detach().double().cpu() for k, p in module.named_parameters() if p.grad is not None
            }
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved

    def rel(got, want, norm: bool) -> float:
        if norm:
            return float((got - want).norm()) / (float(want.norm()) or 1.0)
        return float((got - want).abs().max()) / (float(want.abs().max()) or 1.0)

    rows = []
    for k, want in runs["ref64"].items():
        row = {"param": k, "max_abs": float(want.abs().max())}
        for label in ("placed", "cpu32"):
            got = runs[label].get(k)
            row[f"{label}_max_rel"] = None if got is None else rel(got, want, False)
            row[f"{label}_norm_rel"] = None if got is None else rel(got, want, True)
        rows.append(row)
    rows.sort(key=lambda r: -(r["placed_norm_rel"] if r["placed_norm_rel"] is not None else float("inf")))
    return {
        "grads": len(rows),
        "missing": sorted(set(runs["ref64"]) - set(runs["placed"])),
        "extra": sorted(set(runs["placed"]) - set(runs["ref64"])),
        "rows": rows,
        "loss_placed_rel": rel(losses["placed"], losses["ref64"], True),
        "loss_cpu32_rel": rel(losses["cpu32"], losses["ref64"], True),
    }


def check_apply(name: str, args: Any, placement, graph) -> dict:
    """``placer.apply(model, placement)``'s loss and gradients against a float64 reference, beside float32 on the CPU.

    Passes when the placed model has every gradient the unplaced one has and
    each of its errors (loss and every gradient, relative in the 2-norm) is at
    most ``--tolerance`` or twice the float32 CPU model's own error, whichever is
    larger: the placed module runs the same ATen ops, on the GPU through
    cuBLAS/cuDNN (TF32 off), whose float32 sums run in another order, so it is
    as far from the exact gradient as float32 on the CPU is, while a wrong
    placement (a lost gradient, a stale copy) is off by O(1). (A float32 CPU
    reference alone is not enough: in a batch-norm network some gradients are
    mostly cancellation, and float32 on either device is percents off them.)
    """
    e = grad_errors(name, args.size, placement, graph, args.device_map)
    allowed = lambda cpu32: max(args.tolerance, 2.0 * cpu32)  # noqa: E731
    bad = [
        r["param"]
        for r in e["rows"]
        if r["placed_norm_rel"] is None or r["placed_norm_rel"] > allowed(r["cpu32_norm_rel"] or 0.0)
    ]
    worst = e["rows"][0] if e["rows"] else None
    loss_ok = e["loss_placed_rel"] <= allowed(e["loss_cpu32_rel"])
    return {
        "placement": placement.method,
        "reference": "float64 on the CPU",
        "output_rel_err": e["loss_placed_rel"],
        "output_cpu32_rel_err": e["loss_cpu32_rel"],
        "grad_max_rel_err": worst["placed_norm_rel"] if worst else float("nan"),
        "grad_worst_cpu32_rel_err": worst["cpu32_norm_rel"] if worst else float("nan"),
        "grad_worst": worst["param"] if worst else None,
        "grads": e["grads"],
        "over_allowed": bad[:10],
        "same_grad_keys": not e["missing"] and not e["extra"] and bool(e["rows"]),
        "tolerance": args.tolerance,
        "worst": e["rows"][:5],
        "ok": bool(not e["missing"] and not e["extra"] and e["rows"] and not bad and loss_ok),
    }

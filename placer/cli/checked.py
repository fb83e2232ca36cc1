"""The line a ``--check`` prints (``placer run``, in one process and across processes)."""

from __future__ import annotations

from typing import Any


def check_line(check: dict[str, Any], against: str) -> str:
    """``check against <against>...: ok|FAIL (...)``, or ``UNCHECKED: why`` where there is no verdict.

    >>> check = {"ok": True, "loss_error": 1e-8, "grad_error": 2e-7, "worst": "w", "worst_ratio": 0.1}
    >>> print(check_line(check, "one process"))  # doctest: +NORMALIZE_WHITESPACE
    check against one process: ok (loss rel. err 1.0e-08, worst gradient rel. err 2.0e-07; worst tensor w at 0.10x
    the allowed error)
    """
    from envs.real.conformance import DRAWS, FIXED

    if check.get("draws"):
        return f"check against {against}: UNCHECKED: {DRAWS}"
    if check.get("unchecked"):
        return f"check against {against}: UNCHECKED: {check['unchecked']}"
    verdict = "ok" if check["ok"] else "FAIL"
    M = check.get("accumulated", 1)
    how = f" (its gradient accumulation over {M} microbatches, the step the plan computes)" if M > 1 else ""
    if check.get("fixed"):
        how += f" ({FIXED})"
    return (
        f"check against {against}{how}: {verdict} (loss rel. err {check['loss_error']:.1e}, worst gradient rel. err "
        f"{check['grad_error']:.1e}; worst tensor {check['worst']} at {check['worst_ratio']:.2f}x the allowed error)"
    )

"""Deprecated alias of bench.fidelity.apply_check (kept until the parallel branches merge)."""

from bench.fidelity.apply_check import check_apply, grad_errors

__all__ = ["check_apply", "grad_errors"]

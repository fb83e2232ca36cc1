"""A comparison as a bar chart (``placer compare --plot``): matplotlib, an optional extra.

>>> from placer.compare import CompareReport, Row
>>> report = CompareReport("g", "h", "k80x2", ["gpu:0"], [Row("m_etf", step_time_s=0.002)], 0.001, 0.002, "gpu:0")
>>> bars(report)
[('m_etf', 2.0, 'heuristic')]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphs import PlacerError
from placer.methods import registry


def bars(report: Any) -> list[tuple[str, float, str]]:
    """``(method, step time in ms, kind)`` of each bar: every ``ok`` row but the bound, in table order."""
    return [
        (r.method, r.step_time_s * 1e3, r.kind)
        for r in report.rows
        if r.kind != "bound" and r.status == "ok" and r.step_time_s is not None
    ]


def plot(report: Any, path: str) -> None:
    """A horizontal bar chart of step times (ok rows), the lower bound as a line, written to ``path``."""
    try:
        import matplotlib  # an optional extra, only for --plot

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlacerError(f"{path}: --plot needs matplotlib ({registry.install_hint('plot')})") from None
    drawn = bars(report)
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(drawn) + 1.5))
    y = np.arange(len(drawn))
    ax.barh(
        y,
        [step_time_ms for _, step_time_ms, _ in drawn],
        color=["tab:orange" if kind == "placement" else "tab:blue" for _, _, kind in drawn],
    )
    ax.set_yticks(y, [method for method, _, _ in drawn])
    ax.invert_yaxis()
    if report.lower_bound_s is not None and math.isfinite(report.lower_bound_s):
        ax.axvline(report.lower_bound_s * 1e3, color="k", linestyle="--", label="lower bound")
        ax.legend(loc="lower right")
    ax.set_xlabel("simulated step time (ms)")
    ax.set_title(f"{report.graph} on {report.cluster}")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as e:
        raise PlacerError(f"{path}: cannot write the plot ({e.strerror})") from None
    finally:
        plt.close(fig)

"""Pictures for the README and the benchmarks: a placement's schedule, search curves.

:func:`schedule_bars` turns a Chrome trace of a simulated step (``envs.simulate(...,
trace=True).extra["trace"]``, or ``placer simulate --trace`` output) into bars, one
track per device and per used link; :func:`plot_schedule` draws them as a Gantt
chart coloured by op kind (forward, backward, transfer, optimizer step) or by
model layer. :func:`plot_search_curves` draws best-step-time-so-far curves, :func:`plot_budget_curves`
the quality every method reaches at each budget (``python -m bench.budget``).
matplotlib is optional (the ``plot`` extra); only the drawing functions need it.

>>> doc = {"traceEvents": [
...     {"ph": "M", "name": "thread_name", "pid": 1, "tid": 0, "args": {"name": "gpu:0"}},
...     {"ph": "X", "name": "fwd a", "cat": "forward", "pid": 1, "tid": 0, "ts": 0, "dur": 5, "args": {"op_index": 0}},
...     {"ph": "X", "name": "bwd a", "cat": "backward", "pid": 1, "tid": 0, "ts": 5, "dur": 10,
...      "args": {"op_index": 0}}]}
>>> bars = schedule_bars(doc)
>>> bars.tracks, [(b.track, b.start_s, b.kind) for b in bars.bars]
(['gpu:0'], [(0, 0.0, 'forward'), (0, 5e-06, 'backward')])
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

from graphs import OpGraph, PlacerError
from placer.methods.registry import install_hint

#: By kind: the trace's categories (envs.sim.trace), a checkpointed op's second forward and the parameter homes'
#: copies among them.
KIND_COLOURS = {
    "forward": "#4878d0",
    "backward": "#ee854a",
    "recompute": "#a6bddb",
    "transfer": "#8c8c8c",
    "home copy": "#956cb4",
    "update": "#6acc64",
}
MAX_LAYER_COLOURS = 12
#: Non-op bars when colouring by layer: dark, so they do not read as a layer (a recompute is an op's, but drawn
#: apart from its layer's forward).
LAYER_MODE_KIND_COLOURS = {"recompute": "#9e9e9e", "transfer": "#7f7f7f", "home copy": "#4b2d73", "update": "#303030"}


@dataclass
class Bar:
    """One task of the schedule: its track (row), start and length in seconds, kind and op."""

    track: int
    start_s: float
    dur_s: float
    kind: str
    op_index: int | None = None


@dataclass
class ScheduleBars:
    """Track names (devices first, then links, as in the trace) and the bars on them."""

    tracks: list[str]
    bars: list[Bar] = field(default_factory=list)
    title: str = ""
    step_time_s: float | None = None


def layer_of(module_path: str) -> str:
    """A model layer for colouring: the path up to its first numbered part, else its first part.

    >>> layer_of("encoder.layers.1.cell"), layer_of("attention.combine"), layer_of("")
    ('encoder.layers.1', 'attention', '(no module)')
    """
    parts = module_path.split(".") if module_path else []
    for k, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: k + 1])
    return parts[0] if parts else "(no module)"


def schedule_bars(trace: dict[str, Any], graph: OpGraph | None = None) -> ScheduleBars:
    """The bars of a Chrome trace document of a simulated step.

    Transfers carry the producing op's name in ``args["op"]``; with ``graph``
    given, it is turned into an op index so transfers can be coloured by layer too.
    """
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise PlacerError("trace: not a Chrome trace document (no traceEvents list)")
    names: dict[int, str] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[int(e["tid"])] = str(e.get("args", {}).get("name", e["tid"]))
    spans = [e for e in events if e.get("ph") == "X"]
    for e in spans:
        names.setdefault(int(e["tid"]), str(e["tid"]))
    order = sorted(names)
    row = {tid: k for k, tid in enumerate(order)}
    index = {n: i for i, n in enumerate(graph.names)} if graph is not None else {}
    out = ScheduleBars(tracks=[names[t] for t in order])
    other = trace.get("otherData", {}) if isinstance(trace, dict) else {}
    out.title = f"{other.get('graph') or 'graph'} on {other.get('cluster') or 'cluster'}"
    out.step_time_s = other.get("step_time_s")
    for e in spans:
        args = e.get("args", {}) or {}
        op = args.get("op_index")
        if op is None and "op" in args:
            op = index.get(args["op"])
        out.bars.append(
            Bar(
                row[int(e["tid"])],
                float(e["ts"]) / 1e6,
                float(e["dur"]) / 1e6,
                str(e.get("cat", "")),
                int(op) if op is not None else None,
            )
        )
    return out


def bar_colours(bars: ScheduleBars, graph: OpGraph | None, color_by: str) -> tuple[list[str], dict[str, str]]:
    """(colour per bar, legend label -> colour) for ``color_by`` ``"kind"`` or ``"layer"``.

    By layer, the ``MAX_LAYER_COLOURS - 1`` layers with the most busy time get a
    colour each and the rest share one grey ("other layers"); transfers and the
    optimizer step keep their kind colour.
    """
    if color_by == "kind":
        cols = [KIND_COLOURS.get(b.kind, "#000000") for b in bars.bars]
        used = {b.kind for b in bars.bars}
        return cols, {k: c for k, c in KIND_COLOURS.items() if k in used}
    if color_by != "layer":
        raise PlacerError(f"--color-by {color_by!r}: must be 'kind' or 'layer'")
    if graph is None:
        raise PlacerError("--color-by layer: needs the graph (module paths)")
    layers = [layer_of(p) for p in graph.module_paths]
    busy: dict[str, float] = {}
    for b in bars.bars:
        if b.kind in ("forward", "backward") and b.op_index is not None:
            busy[layers[b.op_index]] = busy.get(layers[b.op_index], 0.0) + b.dur_s
    top = sorted(busy, key=lambda k: -busy[k])[: MAX_LAYER_COLOURS - 1]
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    legend = {name: _hex(cmap(k % 20)) for k, name in enumerate(sorted(top))}
    rest = "#c8c8c8"
    cols = []
    for b in bars.bars:
        if b.kind in ("forward", "backward") and b.op_index is not None:
            cols.append(legend.get(layers[b.op_index], rest))
        else:
            cols.append(LAYER_MODE_KIND_COLOURS.get(b.kind, "#000000"))
    if len(busy) > len(top):
        legend["other layers"] = rest
    used = {b.kind for b in bars.bars}
    legend.update({k: c for k, c in LAYER_MODE_KIND_COLOURS.items() if k in used})
    return cols, legend


def _hex(rgba: Sequence[float]) -> str:
    return "#" + "".join(f"{int(round(255 * c)):02x}" for c in rgba[:3])


def pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlacerError(f"plotting needs matplotlib ({install_hint('plot')})") from None
    return plt


def save_figure(fig: Any, path: str, dpi: int) -> None:
    plt = pyplot()
    try:
        fig.savefig(path, dpi=dpi)
    except OSError as e:
        raise PlacerError(f"{path}: cannot write the plot ({e.strerror})") from None
    finally:
        plt.close(fig)


def plot_schedule(
    trace: dict[str, Any],
    path: str,
    *,
    graph: OpGraph | None = None,
    color_by: str = "kind",
    title: str | None = None,
    dpi: int = 100,
) -> ScheduleBars:
    """Draw the schedule of a simulated step as a Gantt chart (one row per device/link) into ``path``."""
    plt = pyplot()
    bars = schedule_bars(trace, graph)
    cols, legend = bar_colours(bars, graph, color_by)
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(bars.tracks) + 1.8))
    by_track: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for b, c in zip(bars.bars, cols):
        by_track.setdefault((b.track, c), []).append((b.start_s * 1e3, max(b.dur_s * 1e3, 0.0)))
    for (track, colour), spans in by_track.items():
        ax.broken_barh(spans, (track - 0.4, 0.8), facecolors=colour, linewidth=0)
    ax.set_yticks(range(len(bars.tracks)), bars.tracks)
    ax.set_ylim(len(bars.tracks) - 0.5, -0.5)
    ax.set_xlabel("time in the simulated training step (ms)")
    step = f", step {bars.step_time_s * 1e3:.1f} ms" if bars.step_time_s and math.isfinite(bars.step_time_s) else ""
    ax.set_title(title or f"{bars.title}{step}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in legend.values()]
    ax.legend(handles, list(legend), loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi)
    return bars


def plot_search_curves(curves: Sequence[dict[str, Any]], path: str, *, dpi: int = 100) -> None:
    """Best step time so far vs wall time and vs evaluated placements, one row of panels per graph.

    Each curve: ``{"graph", "method", "wall_s": [...], "evals": [...], "best_s": [...]}``
    plus optional ``"lower_bound_s"`` and ``"reference_s"`` (name -> seconds, drawn
    dotted); points are where the best improved.
    """
    plt = pyplot()
    graphs = list(dict.fromkeys(c["graph"] for c in curves))
    if not graphs:
        raise PlacerError(f"{path}: no search curves to plot")
    fig, axes = plt.subplots(len(graphs), 2, figsize=(11, 3.4 * len(graphs)), squeeze=False)
    colours = {}
    for row, gname in enumerate(graphs):
        mine = [c for c in curves if c["graph"] == gname]
        for col, key, label in ((0, "wall_s", "wall time (s)"), (1, "evals", "evaluated placements")):
            ax = axes[row][col]
            for c in mine:
                if not c["best_s"]:
                    continue
                colour = colours.setdefault(c["method"], f"C{len(colours)}")
                xs = list(c[key]) + [c["end_" + key]] if ("end_" + key) in c else list(c[key])
                ys = [t * 1e3 for t in c["best_s"]] + ([c["best_s"][-1] * 1e3] if len(xs) > len(c["best_s"]) else [])
                ax.step(xs, ys, where="post", color=colour, label=c["method"])
            bound = next((c.get("lower_bound_s") for c in mine if c.get("lower_bound_s")), None)
            if bound:
                ax.axhline(bound * 1e3, color="k", linestyle="--", linewidth=1, label="lower bound")
            refs = next((c.get("reference_s") for c in mine if c.get("reference_s")), None) or {}
            for name, t in refs.items():
                if t:
                    ax.axhline(t * 1e3, color="0.45", linestyle=":", linewidth=1)
                    ax.text(
                        0.995,
                        t * 1e3,
                        name,
                        transform=ax.get_yaxis_transform(),
                        ha="right",
                        va="bottom",
                        fontsize=7,
                        color="0.3",
                    )
            if key == "evals":
                ax.set_xscale("log")
                ax.set_xlim(left=1)
            ax.set_xlabel(label)
            ax.set_ylabel("best step time (ms)")
            ax.set_title(gname)
            ax.grid(alpha=0.3)
        axes[row][1].legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    save_figure(fig, path, dpi)


def plot_budget_curves(cells: Sequence[dict[str, Any]], path: str, *, dpi: int = 100) -> None:
    """Median best step time against the budget, per method: one row per (graph, cluster), placements then seconds.

    ``cells``: :func:`bench.budget.budget_cell` results. The lower bound is drawn dashed.
    """
    # bench.budget imports the learner (torch): only when drawing its plot
    from bench.budget import medians
    from bench.budget_runs import METHODS

    plt = pyplot()
    if not cells:
        raise PlacerError(f"{path}: no budget results to plot")
    # a column per kind of budget the cells were run at (placements, seconds): no empty panels
    kinds = [
        (kind, label)
        for kind, label in (("evals", "simulated placements"), ("seconds", "seconds"))
        if any(k == kind for cell in cells for k, _ in medians(cell))
    ] or [("evals", "simulated placements")]
    fig, axes = plt.subplots(len(cells), len(kinds), figsize=(5.5 * len(kinds), 3.2 * len(cells)), squeeze=False)
    for row, cell in enumerate(cells):
        by_budget = medians(cell)
        for col, (kind, label) in enumerate(kinds):
            ax = axes[row][col]
            budgets = sorted(v for k, v in by_budget if k == kind)
            for k, method in enumerate(METHODS):
                pts = [(v, by_budget[(kind, v)].get(method)) for v in budgets]
                pts = [(v, t * 1e3) for v, t in pts if t is not None]
                if pts:
                    ax.plot(*zip(*pts), marker="o", color=f"C{k}", label=method)
            ax.axhline(
                cell["lower_bound_s"] * 1e3,
                color="k",
                linestyle="--",
                linewidth=1,
                label=f"lower bound ({cell['lower_bound_name']})",
            )
            if budgets:
                ax.set_xscale("log")
            ax.set_xlabel(f"budget ({label})")
            ax.set_ylabel("best step time (ms)")
            ax.set_title(f"{cell['graph']} on {cell['cluster']}")
            ax.grid(alpha=0.3)
        axes[row][0].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    save_figure(fig, path, dpi)


#: What :func:`measured_series` reads of each measurement of a measured loop's curve (``bench.correction --json``).
MEASURED_SERIES = {"real": "real_s", "simulated": "simulated_s", "predicted": "predicted_s", "best": "best_s"}


def measured_series(cells: Sequence[dict[str, Any]]) -> dict[tuple[str, Any, str], dict[str, list[float]]]:
    """Per run and measured loop, ``(graph, seed, method)``, its curve as series in ms, one value per measurement in
    the order taken (nan where the run has none: a failed measurement's real step): the real step, the simulator's
    prediction, the correction's prediction (made before the measurement), and the fastest measured so far. Loops
    whose curve has no predictions (the measured move search, the simulator's one measurement) are left out.

    >>> m = {"real_s": 0.5, "simulated_s": 0.01, "predicted_s": 0.4, "best_s": 0.5}
    >>> cell = {"graph": "lm", "seed": 2, "methods": {"corrected": {"curve": [m, {**m, "real_s": None}]}}}
    >>> measured_series([cell])[("lm", 2, "corrected")]["real"]
    [500.0, nan]
    """
    out = {}
    for cell in cells:
        for method, run in (cell.get("methods") or {}).items():
            curve = run.get("curve") or []
            if len(curve) < 2 or not all(isinstance(m, dict) and "predicted_s" in m for m in curve):
                continue
            out[(cell.get("graph", "?"), cell.get("seed"), method)] = {
                name: [_ms(m.get(key)) for m in curve] for name, key in MEASURED_SERIES.items()
            }
    return out


def _ms(value: Any) -> float:
    return value * 1e3 if isinstance(value, (int, float)) and math.isfinite(value) else math.nan


def plot_measured_curves(cells: Sequence[dict[str, Any]], path: str, *, dpi: int = 100) -> dict:
    """The measured loops' curves (``bench.correction --json`` cells): one row per run, one panel per loop, against
    the measurements taken, on a log scale: each real step (dots), the fastest measured so far (a step line), the
    simulator's prediction and the correction's prediction before each measurement; and the side-by-side's medians
    at the end (dotted, in the legend). Returns what it drew (:func:`measured_series`)."""
    plt = pyplot()
    series = measured_series(cells)
    if not series:
        raise PlacerError(f"{path}: no measured curves to plot (no run has a loop with predictions)")
    runs = list(dict.fromkeys((g, s) for g, s, _ in series))
    methods = list(dict.fromkeys(m for _, _, m in series))
    fig, axes = plt.subplots(len(runs), len(methods), figsize=(5.5 * len(methods), 3.4 * len(runs)), squeeze=False)
    sides = {(c.get("graph", "?"), c.get("seed")): c.get("side_by_side") or {} for c in cells}
    for row, run in enumerate(runs):
        for col, method in enumerate(methods):
            ax = axes[row][col]
            one = series.get((*run, method))
            if one is None:
                ax.set_visible(False)
                continue
            xs = list(range(1, len(one["real"]) + 1))
            ax.plot(xs, one["real"], "o", color="C0", markersize=4, label="real step")
            ax.step(xs, one["best"], where="post", color="C0", linewidth=1, label="fastest measured")
            ax.plot(xs, one["simulated"], "x", color="C3", markersize=4, label="simulator's prediction")
            ax.plot(xs, one["predicted"], "+", color="C2", markersize=6, label="correction's prediction")
            for k, (name, times) in enumerate(sides[run].items()):
                finite = [t for t in times if isinstance(t, (int, float)) and math.isfinite(t)]
                if finite:
                    median = statistics.median(finite)
                    ax.axhline(
                        median * 1e3,
                        color=f"C{4 + k}",
                        linestyle=":",
                        linewidth=1.2,
                        label=f"{name}: side-by-side median",
                    )
            ax.set_yscale("log")
            ax.set_xlabel("real measurements")
            ax.set_ylabel("step time (ms)")
            seed = "" if run[1] in (None, "-") else f", seed {run[1]}"  # (a placer train run has no seed)
            ax.set_title(f"{run[0]}{seed}: {method}")
            ax.grid(alpha=0.3)
        axes[row][0].legend(fontsize=7, loc="center left", bbox_to_anchor=(0.0, 0.35))
    fig.tight_layout()
    save_figure(fig, path, dpi)
    return series

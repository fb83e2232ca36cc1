"""What a graph-network policy places, per view of a graph: its ops, N co-location groups, or its modules at a depth."""

from __future__ import annotations

from typing import Any, Sequence

from envs.sim.sim_graph import schedule_graph
from graphs import OpGraph
from graphs.module_tree import module_levels


def group_views(graph: OpGraph, groups: Sequence[int | str]) -> list[tuple[str, dict[str, Any]]]:
    """What a policy places, per entry of ``groups``: (a name, ``GNNPolicy`` keyword arguments).

    0 is the ops; N the graph coarsened to N co-location groups (``max_groups``);
    ``"modules"`` one view per :func:`graphs.module_tree.module_levels` partition of the
    graph the policy reads (``envs.sim.sim_graph.schedule_graph``), a group per module
    at each depth. Pass that graph itself (as the callers here do) and the policies
    built on it neither rebuild it nor hash it again.
    """
    views: list[tuple[str, dict[str, Any]]] = []
    for level in dict.fromkeys(groups):  # in order, each once
        if level == "modules":
            for grouping in module_levels(schedule_graph(graph)):
                views.append((f"modules depth {grouping.graph.meta['module_depth']}", {"grouping": grouping}))
        elif int(level) == 0:
            views.append(("ops", {"max_groups": 0}))
        else:
            views.append((f"{int(level)}g", {"max_groups": int(level)}))
    return views

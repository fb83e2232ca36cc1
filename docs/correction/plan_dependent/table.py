"""The true step of each method's plan over the stand-in's best, by graph, from ``bench.correction stand-in --json``
files: ``python docs/correction/plan_dependent/table.py A.json [B.json ...]``."""

import json
import sys

import numpy as np

METHODS = ["simulator", "simulator rank", "linear correction", "measured moves", "corrected"]


def ratios(cells: list[dict], method: str) -> list[float]:
    return [c["true_s"][method] / c["stand_in_best_s"] for c in cells if method in c["true_s"]]


def main(paths: list[str]) -> None:
    cells = [c for p in paths for c in json.load(open(p))["cells"] if "true_s" in c]
    by_graph: dict[str, list[dict]] = {}
    for c in cells:
        by_graph.setdefault(c["graph"], []).append(c)
    print("| graph | " + " | ".join(METHODS) + " |")
    for graph, group in by_graph.items():
        print(f"| {graph} | " + " | ".join(f"{np.median(ratios(group, m)):.3f}" for m in METHODS) + " |")
    print(f"| all {len(cells)}, median | " + " | ".join(f"{np.median(ratios(cells, m)):.3f}" for m in METHODS) + " |")
    print(f"| all {len(cells)}, worst | " + " | ".join(f"{max(ratios(cells, m)):.3f}" for m in METHODS) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])

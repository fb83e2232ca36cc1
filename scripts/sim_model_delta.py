"""How much a change of the simulator's model moves simulated steps: the same placements scored by two simulators.

Step 1 (``--place FILE``) writes the placements of a few heuristics on zoo graphs and
clusters, with their planned issue orders. Step 2 (``--score FILE``) scores them,
in node order and in the planned order, with whatever ``envs`` is importable: this
tree, or an older one put first on ``PYTHONPATH`` (``git archive <commit> envs graphs
| tar -x -C DIR``), so two runs give the two models' steps side by side::

    python scripts/sim_model_delta.py --place /tmp/p.json
    PYTHONPATH=/tmp/m3 python scripts/sim_model_delta.py --score /tmp/p.json --json > m3.json
    python scripts/sim_model_delta.py --score /tmp/p.json --json > m4.json
    python scripts/sim_model_delta.py --compare m3.json m4.json
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

GRAPHS = ("nmt-2", "rnnlm", "inception-v3", "gpt2")
CLUSTERS = ("k80x4", "v100x4")
METHODS = ("m_etf", "heft", "m_sct", "round_robin", "expert", "m_topo")


def place(path: str) -> None:
    import envs
    import graphs
    from placer.methods import place as place_with

    out = {}
    for gname in GRAPHS:
        g = graphs.zoo.graph(gname)
        for cname in CLUSTERS:
            c = envs.Cluster.preset(cname)
            for m in METHODS:
                p = place_with(m, g, c)
                out[f"{gname}|{cname}|{m}"] = {
                    "devices": p.indices(g, c.device_names).tolist(),
                    "order": None if p.order is None else np.asarray(p.order).tolist(),
                }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f)


def score(path: str) -> dict:
    """``key -> [node-order step, planned-order step]`` (seconds) under the importable simulator, and its model
    version."""
    import envs
    import graphs
    from envs.sim.simulator import MODEL_VERSION

    with open(path, encoding="utf-8") as f:
        placements = json.load(f)
    envs_: dict = {}
    out = {}
    for key, v in placements.items():
        gname, cname, _ = key.split("|")
        if (gname, cname) not in envs_:
            envs_[(gname, cname)] = envs.SimEnv(graphs.zoo.graph(gname), envs.Cluster.preset(cname))
        env, idx = envs_[(gname, cname)], np.asarray(v["devices"])
        order = None if v["order"] is None else np.asarray(v["order"])
        out[key] = [env.simulate(idx).extra["sim_step_time_s"], env.simulate(idx, order=order).extra["sim_step_time_s"]]
    return {"model_version": MODEL_VERSION, "steps_s": out}


def compare(a_path: str, b_path: str) -> str:
    with open(a_path, encoding="utf-8") as f:
        a = json.load(f)
    with open(b_path, encoding="utf-8") as f:
        b = json.load(f)
    lines = [f"| placement | node: model {a['model_version']} -> {b['model_version']} | planned |", "|---|---|---|"]
    for key, (n_a, p_a) in a["steps_s"].items():
        n_b, p_b = b["steps_s"][key]
        lines.append(
            f"| {key.replace('|', ', ')} | {n_a * 1e3:.2f} -> {n_b * 1e3:.2f} ms ({n_b / n_a:.3f}) | "
            f"{p_a * 1e3:.2f} -> {p_b * 1e3:.2f} ms ({p_b / p_a:.3f}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--place", metavar="FILE", help="write the heuristics' placements to FILE")
    g.add_argument("--score", metavar="FILE", help="score FILE's placements with the importable simulator")
    g.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two --score --json outputs side by side (markdown)")
    p.add_argument("--json", action="store_true", help="with --score: print JSON")
    args = p.parse_args(argv)
    if args.place:
        place(args.place)
    elif args.score:
        doc = score(args.score)
        print(
            json.dumps(doc)
            if args.json
            else "\n".join(f"{k}: {v[0] * 1e3:.2f} / {v[1] * 1e3:.2f} ms" for k, v in doc["steps_s"].items())
        )
    else:
        print(compare(*args.compare))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How much a change of the simulator's model moves simulated steps: the same placements scored by two simulators.

Step 1 (``--place FILE``) writes the placements of a few heuristics on zoo graphs and
clusters, with their planned issue orders. Step 2 (``--score FILE``) scores them,
in node order and in the planned order, with whatever ``envs`` is importable: this
tree, or an older one (``git archive <commit> envs graphs | tar -x -C DIR``) run from
DIR with this checkout on ``PYTHONPATH`` (``python -m`` puts the working directory
first on the path, so DIR's ``envs`` and ``graphs`` are the ones imported), so two
runs give the two models' steps side by side::

    python -m bench.sim_model_delta --place /tmp/p.json
    (cd /tmp/m3 && PYTHONPATH=$OLDPWD python -m bench.sim_model_delta --score /tmp/p.json --json) > m3.json
    python -m bench.sim_model_delta --score /tmp/p.json --json > m4.json
    python -m bench.sim_model_delta --compare m3.json m4.json
"""

from __future__ import annotations

import json
import sys

import numpy as np

from bench.common import OneLineParser
from graphs import PlacerError

GRAPHS = ("nmt-2", "rnnlm", "inception-v3", "gpt2")
CLUSTERS = ("k80x4", "v100x4")
METHODS = ("m_etf", "heft", "m_sct", "round_robin", "expert", "m_topo")


def read(path: str, what: str, fits) -> dict:
    """The JSON object in ``path`` (data, never run); PlacerError (one line) unless ``fits(doc)``: it is ``what``."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise PlacerError(f"{path}: cannot read it ({e.strerror or e})") from None
    except ValueError as e:
        raise PlacerError(f"{path}: not {what} ({e})") from None
    if not isinstance(doc, dict) or not fits(doc):
        raise PlacerError(f"{path}: not {what}")
    return doc


def _placements(doc: dict) -> bool:
    return all(isinstance(v, dict) and {"devices", "order"} <= set(v) for v in doc.values())


def _steps(doc: dict) -> bool:
    return {"model_version", "steps_s"} <= set(doc) and isinstance(doc["steps_s"], dict)


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

    placements = read(path, "--place's placements", _placements)
    sim_envs: dict = {}
    out = {}
    for key, v in placements.items():
        gname, cname, _ = key.split("|")
        if (gname, cname) not in sim_envs:
            sim_envs[(gname, cname)] = envs.SimEnv(graphs.zoo.graph(gname), envs.Cluster.preset(cname))
        env, op_devices = sim_envs[(gname, cname)], np.asarray(v["devices"])
        order = None if v["order"] is None else np.asarray(v["order"])
        out[key] = [
            env.simulate(op_devices).extra["sim_step_time_s"],
            env.simulate(op_devices, order=order).extra["sim_step_time_s"],
        ]
    return {"model_version": MODEL_VERSION, "steps_s": out}


def compare(a_path: str, b_path: str) -> str:
    a, b = (read(path, "a --score --json output", _steps) for path in (a_path, b_path))
    missing = sorted(set(a["steps_s"]) - set(b["steps_s"]))
    if missing:
        raise PlacerError(f"{b_path}: no step of {missing[0].replace('|', ', ')}, which {a_path} has")
    lines = [f"| placement | node: model {a['model_version']} -> {b['model_version']} | planned |", "|---|---|---|"]
    for key, (n_a, p_a) in a["steps_s"].items():
        n_b, p_b = b["steps_s"][key]
        lines.append(
            f"| {key.replace('|', ', ')} | {n_a * 1e3:.2f} -> {n_b * 1e3:.2f} ms ({n_b / n_a:.3f}) | "
            f"{p_a * 1e3:.2f} -> {p_b * 1e3:.2f} ms ({p_b / p_a:.3f}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m bench.sim_model_delta", description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--place", metavar="FILE", help="write the heuristics' placements to FILE")
    g.add_argument("--score", metavar="FILE", help="score FILE's placements with the importable simulator")
    g.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two --score --json outputs side by side (markdown)")
    p.add_argument("--json", action="store_true", help="with --score: print JSON")
    args = p.parse_args(argv)
    try:
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
    except PlacerError as e:
        print(f"sim_model_delta: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

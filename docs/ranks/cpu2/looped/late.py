"""What-if: a receive posted after its send waits LATE seconds more (the sender's event-loop thread waits for a core).

    PYTHONPATH=. python docs/ranks/cpu2/looped/late.py 0.003

The simulator of ranks' run_actions, copied, with one change: a message whose receive is posted (when the receiver
is free for the action that needs it) after the sender sent it is there no earlier than the post plus LATE. Prints
the encoder-decoder's looped plan (looped BFS, torch posts late) and its one-stage-per-rank plan, each against its
step measured with torch's posting (bench.repeatability --receives jit).
"""

import sys

import numpy as np

import envs.sim.ranks as R
from bench.rank_splits import MODELS, model_graph
from envs.cluster import resolve_cluster
from graphs.plan import Placement

LATE = float(sys.argv[1]) if len(sys.argv) > 1 else 3e-3
orig_send = R._Links.send


def run_actions_late(costs, actions, cluster, record=None):
    Rn = len(actions)
    links = R._Links(cluster)
    dev = costs.device_indices
    overhead = [d.action_overhead_s for d in cluster.devices]
    arrived, send_s, sent_at = {}, {}, {}
    own_copies = [d.kind == "cpu" for d in cluster.devices]
    free_s = np.zeros(Rn)
    busy_s = np.zeros(Rn)
    nxt = [0] * Rn
    lists = [list(actions.get(r, ())) for r in range(Rn)]
    S = len(costs.fwd_s)
    while any(nxt[r] < len(lists[r]) for r in range(Rn)):
        progress = False
        for r in range(Rn):
            while nxt[r] < len(lists[r]):
                s, kind, m = lists[r][nxt[r]]
                need = [("F", s, m)] if kind == "F" and s > 0 else []
                if kind == "B":
                    need = [("B", s, m)] if s < S - 1 else []
                if any(key not in arrived for key in need):
                    break
                receive_s = sum(send_s[key] for key in need) if own_copies[dev[s]] else 0.0
                late = [max(arrived[k], free_s[r] + LATE) if sent_at[k] < free_s[r] else arrived[k] for k in need]
                ready = max([free_s[r] + receive_s, *late])
                compute_s = costs.fwd_s[s] if kind == "F" else costs.bwd_s[s]
                end = ready + compute_s
                free_s[r], busy_s[r] = end + overhead[dev[s]], busy_s[r] + compute_s + overhead[dev[s]]
                sent = None
                if kind == "F" and s < S - 1:
                    sent = ("F", s + 1, m)
                    arrived[sent], send_s[sent] = links.send(
                        dev[s], dev[s + 1], end, costs.send_bytes[s], costs.send_tensors[s]
                    )
                if kind == "B" and s > 0:
                    sent = ("B", s - 1, m)
                    arrived[sent], send_s[sent] = links.send(
                        dev[s], dev[s - 1], end, costs.grad_bytes[s - 1], costs.grad_tensors[s - 1]
                    )
                if sent is not None:
                    sent_at[sent] = end
                if sent is not None and own_copies[dev[s]]:
                    free_s[r] += send_s[sent]
                    busy_s[r] += send_s[sent]
                nxt[r] += 1
                progress = True
        if not progress:
            raise RuntimeError("stuck")
    return {"end_s": free_s, "busy_s": busy_s, "links": links.busy_s}


E = "docs/ranks/cpu2/early"
cases = [
    ("encoder_decoder", "docs/ranks/cpu2/looped/looped_encoder_decoder.json", 93.6),
    ("encoder_decoder", "docs/ranks/cpu2/looped/one_encoder_decoder.json", 102.6),
]
for name, path, measured in cases:
    g = model_graph(MODELS[name], f"{E}/ops_{name}.json")
    c = resolve_cluster(f"{E}/ranks_{name}.json")
    p = Placement.load(path)
    before = R.RankSim(g, c).simulate(p)
    orig = R.run_actions
    R.run_actions = run_actions_late
    after = R.RankSim(g, c).simulate(p)
    R.run_actions = orig
    head = f"{path.split('/')[-1]:32s} {before.extra['schedule']:10s} measured {measured:.1f}"
    print(f"{head}  sim {before.step_time_s * 1e3:.1f}  with late {LATE * 1e3:.0f} ms: {after.step_time_s * 1e3:.1f}")

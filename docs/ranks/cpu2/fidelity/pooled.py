# The simulator of ranks against every measured plan of the runs named (DIR=MODEL, a run.sh output dir and its
# model): each run's recorded fidelity and the fidelity now, per model and pooled. From the repository root:
#   PYTHONPATH=. python docs/ranks/cpu2/fidelity/pooled.py [--profiles DIR] docs/ranks/cpu2/early=lm_b32 ...
# --profiles DIR: each model's per-op times from DIR/ops_MODEL.json instead of the run's own.
import sys

from bench import rank_splits as rs
from envs.cluster import Cluster

args = sys.argv[1:]
profiles = None
if args[:1] == ["--profiles"]:
    profiles, args = args[1], args[2:]
runs = [a.split("=") for a in args]  # dir=model
all_models = []
for D, M in runs:
    doc = rs.read_run(f"{D}/splits_{M}.json")
    for m in doc["models"]:
        rs.rescore([m], Cluster.load(f"{D}/ranks_{M}.json"), {}, {M: f"{profiles or D}/ops_{M}.json"})
        all_models.append(m)
        f_old, f_new = rs.fidelity([m]), rs.fidelity([m], "rescored_s")
        was, now = f"MAPE {f_old['mape'] * 100:4.1f}% rho {f_old['spearman']:.2f}", f"MAPE {f_new['mape'] * 100:4.1f}%"
        print(f"{M:22s} plans {f_new['plans']}  recorded {was}   now {now} rho {f_new['spearman']:.2f}")
f_old, f_new = rs.fidelity(all_models), rs.fidelity(all_models, "rescored_s")
was, now = f"MAPE {f_old['mape'] * 100:.1f}% rho {f_old['spearman']:.2f}", f"MAPE {f_new['mape'] * 100:.1f}%"
print(f"pooled {f_new['plans']} plans: recorded {was}  now {now} rho {f_new['spearman']:.2f}")

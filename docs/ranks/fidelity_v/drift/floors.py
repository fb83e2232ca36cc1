"""Three floors of the host's speed timed around each of N runs of the U-Net's `gpipe_equal` plan (one thread each:
twenty 512x512 matmuls, a 64 MB copy, 200 small linear layers), and how each correlates with the run's step and each
rank's compute (``c0``, ``c1``). Writes floors.json beside this script.

    PYTHONPATH=. python docs/ranks/fidelity_v/drift/floors.py 12
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from envs.real.distributed.profile_ranks import median_s  # the profile's own timer

OUT = Path(__file__).resolve().parent / "floors.json"
RUN = (
    "placer run bench.rank_models:unet --placement docs/ranks/fidelity_v/plan_unet_gpipe_equal.json "
    "--cluster docs/ranks/fidelity_v/ranks_unet.json --nproc-per-node 2 --steps 10 --warmup 2 --json"
)
torch.set_num_threads(1)
square = torch.randn(512, 512)
big, big2 = torch.empty(64 * 2**20 // 4), torch.empty(64 * 2**20 // 4)
small, lin = torch.randn(64, 256), torch.nn.Linear(256, 256)


def floors() -> dict[str, float]:
    return {
        "matmul": median_s(lambda: [square @ square for _ in range(20)], 20, warmup=0),
        "copy": median_s(lambda: big2.copy_(big), 10, warmup=0),
        "small": median_s(lambda: [torch.relu(lin(small)) for _ in range(200)], 20, warmup=0),
    }


rows = []
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 12):
    before = floors()
    run = json.loads(subprocess.run(RUN, shell=True, check=True, capture_output=True, text=True).stdout)
    after = floors()
    compute = [r["phases"]["forward_s"] + r["phases"]["backward_s"] for r in run["ranks"]]
    row = {"step": run["step_time_s"], "c0": compute[0], "c1": compute[1]}
    row.update({k: (before[k] + after[k]) / 2 for k in before})
    rows.append(row)
    print({k: round(v * 1e3, 2) for k, v in row.items()}, flush=True)
OUT.write_text(json.dumps(rows))
for floor in ("matmul", "copy", "small"):
    for y in ("step", "c0", "c1"):
        r = np.corrcoef([x[floor] for x in rows], [x[y] for x in rows])[0, 1]
        print(f"{floor} floor against {y}: correlation {r:.2f}")

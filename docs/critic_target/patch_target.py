"""An experiment, not placer's code: the move critic trained on a soft target instead of "was it faster".

``TARGET=faster`` is placer's own target (1 where the move made the step faster, else 0); ``TARGET=softS`` trains
on ``sigmoid(-delta / S)``, ``delta`` the move's relative change of the step time, so a move that saved more counts
for more (the critic's logit then ranks by how much faster, not how likely). Runs ``bench.budget`` with the move
search's ``_learn`` replaced (uniform proposals do not train the critic, so their runs are placer's own):

    PYTHONPATH=.:docs/critic_target TARGET=soft0.01 python docs/critic_target/patch_target.py --graphs nmt-2 \
        --clusters k80x4 --evals 1000 --seconds "" --methods learned --seeds 0,1,2,3,4,5,6,7 --json
"""

import os

import numpy as np
import torch

from placer.learn import move_search as ms

MODE = os.environ.get("TARGET", "faster")


def _learn(self, feats, delta):
    o = self.options
    d = np.asarray(delta, dtype=np.float64)
    if MODE == "faster":
        y = (d < 0).astype(np.float32)
    elif MODE.startswith("soft"):
        s = float(MODE[4:])
        y = (1.0 / (1.0 + np.exp(np.clip(d / s, -50, 50)))).astype(np.float32)
    else:
        raise SystemExit(f"TARGET={MODE}: faster or softS")
    self.replay.add(feats, y)
    if o.proposals == "uniform" or not o.fine_tune:
        return
    for _ in range(o.train_steps):
        x, yy = self.replay.draw(self.rng, o.train_batch)
        self.fit.step(torch.from_numpy(x), torch.from_numpy(yy))


ms.MoveSearch._learn = _learn

if __name__ == "__main__":
    import sys

    from bench.budget import main

    sys.exit(main(sys.argv[1:]))

"""The homes table of ``llama-3b-ft`` with frozen weights kept with their ops (the ablation of their homes).

``bench.offload_homes`` as it is, but :func:`graphs.ops.frozen_home_bytes` says no op owns frozen bytes it can
home: only trainable parameters may live apart, as before frozen homes were built. Everything else (the
activations a frozen layer does not keep, the searches, the budget, the seed) is the same::

    PYTHONPATH=. python docs/offload_homes/frozen/without_frozen_homes.py --scenarios llama-3b-ft --caps 24,16,8 \\
        --evals 2000 --out-dir docs/offload_homes/frozen/without_frozen_homes
"""

from __future__ import annotations

import sys

import numpy as np

import graphs.ops
from bench import offload_homes

if __name__ == "__main__":
    graphs.ops.frozen_home_bytes = lambda graph: np.zeros(graph.num_ops, dtype=np.int64)
    sys.exit(offload_homes.main(sys.argv[1:]))

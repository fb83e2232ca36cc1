#!/usr/bin/env bash
# The three models where placer's plan measured 1.25x or more over equal_layers' best row (../summary.txt), again:
# the same plans on the same cluster files, REPEATS more times each (default 5), interleaved, 10 timed steps a run.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
D=docs/ranks/auto
O=${OUT:-$D/again}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
for m in ${MODELS:-text_classifier mobilenet_v2 lm}; do
  for rep in $(seq 1 "${REPEATS:-5}"); do
    for p in gpipe_placer gpipe_equal best_equal; do
      placer run bench.rank_models:$m --placement "$D/plan_${m}_$p.json" --cluster "$D/ranks_$m.json" \
          --nproc-per-node 2 --steps 10 --warmup 2 --json > "$O/run_${m}_${p}_$rep.json"
    done
  done
done

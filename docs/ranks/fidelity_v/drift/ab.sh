#!/usr/bin/env bash
# The host's speed between a profile and a run: profile the U-Net's two ranks, run the fidelity set's `gpipe_equal`
# plan twice, and again; then compare the profile's pipeline compute with each run's (ab.py).
#   bash docs/ranks/fidelity_v/drift/ab.sh && PYTHONPATH=. python docs/ranks/fidelity_v/drift/ab.py
set -euo pipefail
cd "$(dirname "$0")/../../../.."
D=docs/ranks/fidelity_v/drift
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
for i in 1 2; do
  placer profile bench.rank_models:unet --ranks 2 -o $D/ranks_$i.json --json > $D/profile_$i.json
  for j in 1 2; do
    placer run bench.rank_models:unet --placement docs/ranks/fidelity_v/plan_unet_gpipe_equal.json \
        --cluster $D/ranks_$i.json --nproc-per-node 2 --steps 10 --warmup 2 --json > $D/run_${i}_$j.json
  done
done

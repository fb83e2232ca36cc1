#!/usr/bin/env bash
# Per-op times alone against beside a neighbour (placer profile --beside 2), interleaved around one measurement of
# the splits: profiles alone (A1), beside (B1), the splits measured (plans chosen on B1), alone (A2), beside (B2);
# then the measured plans simulated with each. From the repository root:
#   bash docs/ranks/cpu2/beside/ab.sh MODEL...
set -euo pipefail
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
D=docs/ranks/cpu2/beside/ab
mkdir -p $D
for M in "$@"; do
  C=docs/ranks/cpu2/early/ranks_$M.json
  placer profile bench.rank_models:$M -o $D/A1_$M.json --repeats 7 --microbatches 4 > $D/A1_$M.log 2>&1
  placer profile bench.rank_models:$M -o $D/B1_$M.json --repeats 7 --microbatches 4 --beside 2 > $D/B1_$M.log 2>&1
  python -m bench.rank_splits --models $M --cluster $C --profile-of $M=$D/B1_$M.json --repeats 5 --steps 10 \
    --warmup 2 --json > $D/splits_$M.json 2> $D/splits_$M.log
  placer profile bench.rank_models:$M -o $D/A2_$M.json --repeats 7 --microbatches 4 > $D/A2_$M.log 2>&1
  placer profile bench.rank_models:$M -o $D/B2_$M.json --repeats 7 --microbatches 4 --beside 2 > $D/B2_$M.log 2>&1
  for P in A1 A2 B1 B2; do
    echo "== $M, per-op times $P"
    python -m bench.rank_splits --resimulate $D/splits_$M.json --cluster $C --profile-of $M=$D/${P}_$M.json 2>/dev/null \
      | tail -2
  done > $D/fidelity_$M.txt
done

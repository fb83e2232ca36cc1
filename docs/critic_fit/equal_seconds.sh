#!/usr/bin/env bash
# Issue 49's equal-seconds table ("At equal seconds, longer" in BENCHMARKS.md) for two checkouts side by side, one
# process a core, each running the same four cells: learned, uniform and annealing, 8 seeds, 15 s on the 1,500-op
# held-out graphs and 4 s on the 300-op ones (k80x4, simulated). uniform and annealing are the same code in both
# checkouts: their placement counts say whether the two cores ran alike.
#
#   bash docs/critic_fit/equal_seconds.sh BEFORE AFTER OUTDIR      (BEFORE, AFTER: checkouts, numba kernels warmed)
set -euo pipefail
before=$1 after=$2 out=$3
mkdir -p "$out"
run() {  # tree label
    cd "$1"
    for cell in "branches-1500-0 15" "branches-1500-1 15" "branches-300-0 4" "branches-300-1 4"; do
        set -- $cell
        python -m bench.budget --graphs "$1" --clusters k80x4 --evals "" --seconds "$2" \
            --methods learned,uniform,annealing --seeds 0,1,2,3,4,5,6,7 --json > "$out/$label-$1.json"
    done
}
(label=before; run "$before") &
(label=after; run "$after") &
wait

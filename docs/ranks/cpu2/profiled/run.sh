#!/usr/bin/env bash
# Issue 48, 2026-11-29 afternoon: the simulator of ranks with per-op times (--profile) and the accumulation of weight
# gradients, and train --ranks --choose-shape, measured on 2 CPU ranks. Run from the repository root:
#   bash docs/ranks/cpu2/profiled/run.sh MODEL [BUDGET_S]
set -euo pipefail
M=${1:?model: a bench.rank_splits model: lm, encoder_decoder, unet, convnet, text_classifier, mobilenet_v2, vgg16, deepseek_moe, or one of them at batch 32 (lm_b32...), or mobilenet_v2_b128}
BUDGET=${2:-60}
D=${OUT:-docs/ranks/cpu2/profiled}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
LOG=$(mktemp -d /tmp/train_$M.XXXX)  # a fresh logdir: train refuses one holding an earlier run
placer profile bench.rank_models:$M --ranks 2 -o $D/ranks_$M.json > $D/profile_ranks_$M.log 2>&1
placer profile bench.rank_models:$M -o $D/ops_$M.json --repeats 7 --microbatches 4 > $D/profile_ops_$M.log 2>&1
placer train bench.rank_models:$M --ranks --cluster $D/ranks_$M.json --profile $D/ops_$M.json --choose-shape \
  --time-budget $BUDGET --logdir $LOG --json > $D/train_$M.json 2> $D/train_$M.log
cp $LOG/best_placement.json $D/learned_$M.json
cp $LOG/shapes.json $D/shapes_$M.json
python -m bench.rank_splits --models $M --cluster $D/ranks_$M.json --profile-of $M=$D/ops_$M.json \
  --placement $M=$D/learned_$M.json --repeats 5 --steps 10 --warmup 2 --json > $D/splits_$M.json 2> $D/splits_$M.log
python -m bench.rank_splits --resimulate $D/splits_$M.json --cluster $D/ranks_$M.json --profile-of $M=$D/ops_$M.json \
  > $D/fidelity_$M.txt 2>&1 || true

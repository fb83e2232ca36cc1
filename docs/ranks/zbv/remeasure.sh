#!/usr/bin/env bash
# After stage_search's two-cut move (issue 48): the plans it changes, searched again on the same profiles
# (plan_<model>_<name>_pairs.json), measured side by side with the one-cut-at-a-time plans measure.sh ran,
# 5 interleaved repeats of 10 timed steps each (run_<model>_<name>[_pairs]_r<k>.json).
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=docs/ranks/zbv
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
for pair in lm:i1f1b_placer lm:zb_placer encoder_decoder:i1f1b_placer unet:i1f1b_placer unet:zb_placer; do
  m=${pair%%:*}; p=${pair#*:}
  case $p in
    i1f1b_placer) s=interleaved_1f1b ;;
    zb_placer) s=interleaved_zb ;;
  esac
  placer place bench.rank_models:$m --cluster docs/ranks/zb/ranks_$m.json --method stage_search --option microbatches=4 \
      --option stages_per_rank=2 --option schedule=$s --ranks -o $D/plan_${m}_${p}_pairs.json > $D/place_${m}_${p}_pairs.log
done
for rep in 1 2 3 4 5; do
  for pair in lm:i1f1b_placer lm:zb_placer encoder_decoder:i1f1b_placer unet:i1f1b_placer unet:zb_placer; do
    m=${pair%%:*}; p=${pair#*:}
    for v in $p ${p}_pairs; do
      placer run bench.rank_models:$m --placement $D/plan_${m}_$v.json --cluster docs/ranks/zb/ranks_$m.json \
          --nproc-per-node 2 --steps 10 --warmup 2 --json > $D/run_${m}_${v}_r$rep.json
    done
  done
done

#!/usr/bin/env bash
# Torch's DualPipeV on two CPU ranks (issue 48): per model, stage_search under dualpipev at M = 4 on the model's own
# profile (docs/ranks/zb/ranks_<model>.json), first run once with --check, then measured side by side with the ZB-V
# plan of measure.sh (plan_<model>_zbv_placer.json), 3 interleaved repeats of 10 timed steps.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=docs/ranks/zbv
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
for m in ${MODELS:-lm encoder_decoder unet}; do
  C=docs/ranks/zb/ranks_$m.json
  placer place bench.rank_models:$m --cluster $C --method stage_search --option microbatches=4 \
      --option schedule=dualpipev --ranks -o $D/plan_${m}_dpv_placer.json > $D/place_${m}_dpv_placer.log
  placer run bench.rank_models:$m --placement $D/plan_${m}_dpv_placer.json --cluster $C --nproc-per-node 2 \
      --check --steps 2 --warmup 1 > $D/check_${m}_dpv_placer.log
  for rep in 1 2 3; do
    for p in zbv_placer dpv_placer; do
      placer run bench.rank_models:$m --placement $D/plan_${m}_$p.json --cluster $C --nproc-per-node 2 \
          --steps 10 --warmup 2 --json > $D/run_${m}_${p}_d$rep.json
    done
  done
done

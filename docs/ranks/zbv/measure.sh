#!/usr/bin/env bash
# Torch's ZB-V schedule on two CPU ranks (issue 48): per model, at M = 4 on the model's own `placer profile --ranks 2`
# file (docs/ranks/zb/ranks_<model>.json, with its split-backward factor), five plans:
#   zbv_placer     stage_search under zbv (a V: ranks 0 1 1 0, the turn a stage cut)
#   zbv_equal      equal_layers under zbv
#   zb_placer      stage_search under interleaved_zb (looped: ranks 0 1 0 1)
#   i1f1b_placer   stage_search under interleaved_1f1b
#   gpipe_equal    equal_layers, one stage per rank (GPipe)
# each run 5 times, interleaved, 10 timed steps a run; raw JSON per run beside this script.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=docs/ranks/zbv
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
PLANS="zbv_placer zbv_equal zb_placer i1f1b_placer gpipe_equal"
for m in ${MODELS:-lm encoder_decoder unet}; do
  C=docs/ranks/zb/ranks_$m.json
  place() {  # name method options...
    local name=$1 method=$2; shift 2
    placer place bench.rank_models:$m --cluster $C --method $method --option microbatches=4 "$@" --ranks \
        -o $D/plan_${m}_$name.json > $D/place_${m}_$name.log
  }
  place zbv_placer stage_search --option schedule=zbv
  place zbv_equal equal_layers --option schedule=zbv
  place zb_placer stage_search --option stages_per_rank=2 --option schedule=interleaved_zb
  place i1f1b_placer stage_search --option stages_per_rank=2 --option schedule=interleaved_1f1b
  place gpipe_equal equal_layers
  for rep in ${REPEATS:-1 2 3 4 5}; do
    for p in $PLANS; do
      placer run bench.rank_models:$m --placement $D/plan_${m}_$p.json --cluster $C --nproc-per-node 2 \
          --steps 10 --warmup 2 --json > $D/run_${m}_${p}_$rep.json
    done
  done
done

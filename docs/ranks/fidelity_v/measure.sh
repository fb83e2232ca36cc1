#!/usr/bin/env bash
# The simulator of ranks against looped and V plans on two CPU ranks (issue 48's fidelity), each model profiled
# afresh right before its plans run, so that the host's drift between a profile and a run is not in the error.
# Per model (M = 4, batch 8): `placer profile --ranks 2`, then six plans placed on that profile and run REPEATS
# times, interleaved, 10 timed steps a run, each run's timeline kept:
#   zbv_placer     stage_search under zbv           zbv_equal     equal_layers under zbv
#   dpv_placer     stage_search under dualpipev     zb_placer     stage_search under interleaved_zb (looped)
#   i1f1b_placer   stage_search under interleaved_1f1b              gpipe_equal   equal_layers, one stage per rank
# Raw files (cluster, plans, runs) in $OUT (default: beside this script).
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=${OUT:-docs/ranks/fidelity_v}
mkdir -p "$D"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
PLANS="zbv_placer zbv_equal dpv_placer zb_placer i1f1b_placer gpipe_equal"
for m in ${MODELS:-lm encoder_decoder unet}; do
  C=$D/ranks_$m.json
  placer profile bench.rank_models:$m --ranks 2 -o "$C" --json > "$D/profile_$m.json"
  place() {  # name method options...
    local name=$1 method=$2; shift 2
    placer place bench.rank_models:$m --cluster "$C" --method $method --option microbatches=4 "$@" --ranks \
        -o "$D/plan_${m}_$name.json" > "$D/place_${m}_$name.log"
  }
  place zbv_placer stage_search --option schedule=zbv
  place zbv_equal equal_layers --option schedule=zbv
  place dpv_placer stage_search --option schedule=dualpipev
  place zb_placer stage_search --option stages_per_rank=2 --option schedule=interleaved_zb
  place i1f1b_placer stage_search --option stages_per_rank=2 --option schedule=interleaved_1f1b
  place gpipe_equal equal_layers
  for rep in $(seq 1 "${REPEATS:-3}"); do
    for p in $PLANS; do
      placer run bench.rank_models:$m --placement "$D/plan_${m}_$p.json" --cluster "$C" --nproc-per-node 2 \
          --steps 10 --warmup 2 --json > "$D/run_${m}_${p}_$rep.json"
    done
  done
done

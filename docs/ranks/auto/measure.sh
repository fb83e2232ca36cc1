#!/usr/bin/env bash
# stage_search --option schedule=auto (the search under every schedule that fits, on per-op times) against the
# splits people use, measured on two CPU ranks. Per model (M = 4): `placer profile --ranks 2 --ops` (ranks and
# per-op times in one command), then five plans run REPEATS times, interleaved, 10 timed steps a run:
#   auto         stage_search --option schedule=auto --option margin=0 --profile ops.json: the simulator's fastest
#                schedule, as first written (summarize.py --pick finds the plan of today's default margin)
#   gpipe_placer stage_search with one stage per rank (what auto chose among; the same plan where it kept gpipe)
#   gpipe_equal  equal_layers under GPipe (torchtitan's default split, one stage per rank)
#   best_equal   equal_layers under the schedule the per-op simulator finds fastest for it (rivals.py)
#   best_flops   flops_balanced likewise
# Raw files (cluster, per-op profile, plans, runs) in $OUT (default: beside this script).
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=${OUT:-docs/ranks/auto}
mkdir -p "$D"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=.
PLANS="auto gpipe_placer gpipe_equal best_equal best_flops"
for m in ${MODELS:-text_classifier vgg16 mobilenet_v2 convnet lm encoder_decoder unet}; do
  S=bench.rank_models:$m
  placer profile $S --ranks 2 -o "$D/ranks_$m.json" --ops "$D/ops_$m.json" --json > "$D/profile_$m.json"
  placer place $S --cluster "$D/ranks_$m.json" --profile "$D/ops_$m.json" --method stage_search \
      --option microbatches=4 --option schedule=auto --option margin=0 --ranks -o "$D/plan_${m}_auto.json" > "$D/place_${m}_auto.log"
  placer place $S --cluster "$D/ranks_$m.json" --profile "$D/ops_$m.json" --method stage_search \
      --option microbatches=4 --ranks -o "$D/plan_${m}_gpipe_placer.json" > "$D/place_${m}_gpipe_placer.log"
  placer place $S --cluster "$D/ranks_$m.json" --profile "$D/ops_$m.json" --method equal_layers \
      --option microbatches=4 --ranks -o "$D/plan_${m}_gpipe_equal.json" > "$D/place_${m}_gpipe_equal.log"
  python docs/ranks/auto/rivals.py "$D" "$m" > "$D/rivals_$m.log"
  for rep in $(seq 1 "${REPEATS:-3}"); do
    for p in $PLANS; do
      placer run $S --placement "$D/plan_${m}_$p.json" --cluster "$D/ranks_$m.json" --nproc-per-node 2 \
          --steps 10 --warmup 2 --json > "$D/run_${m}_${p}_$rep.json"
    done
  done
done

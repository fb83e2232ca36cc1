#!/usr/bin/env bash
# Plans searched with per-op times against the same searches on the roofline, measured side by side (issue 48):
# per model, a fresh `placer profile --ranks 2` and per-op profile, `stage_search` under zbv, dualpipev,
# interleaved_zb and interleaved_1f1b placed with --profile (the *_ops plans), then those four, the six plans of
# held_out/ (searched on the roofline an hour before) run REPEATS times, interleaved, 10 timed steps each.
set -euo pipefail
cd "$(dirname "$0")/../../.."
H=docs/ranks/fidelity_v/held_out
D=${OUT:-docs/ranks/fidelity_v/searched_ops}
mkdir -p "$D"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
for m in ${MODELS:-vgg16 text_classifier}; do
  C=$D/ranks_$m.json
  placer profile bench.rank_models:$m --ranks 2 -o "$C" --json > "$D/profile_$m.json"
  placer profile bench.rank_models:$m -o "$D/ops_$m.json" --repeats 7 --microbatches 4 > "$D/profile_ops_$m.log" 2>&1
  place() {  # name options...
    local name=$1; shift
    placer place bench.rank_models:$m --cluster "$C" --profile "$D/ops_$m.json" --method stage_search \
        --option microbatches=4 "$@" --ranks -o "$D/plan_${m}_$name.json" > "$D/place_${m}_$name.log"
  }
  place zbv_placer_ops --option schedule=zbv
  place dpv_placer_ops --option schedule=dualpipev
  place zb_placer_ops --option stages_per_rank=2 --option schedule=interleaved_zb
  place i1f1b_placer_ops --option stages_per_rank=2 --option schedule=interleaved_1f1b
  for p in zbv_placer zbv_equal dpv_placer zb_placer i1f1b_placer gpipe_equal; do cp "$H/plan_${m}_$p.json" "$D/"; done
  for rep in $(seq 1 "${REPEATS:-3}"); do
    for p in zbv_placer_ops dpv_placer_ops zb_placer_ops i1f1b_placer_ops zbv_placer zbv_equal dpv_placer zb_placer \
        i1f1b_placer gpipe_equal; do
      placer run bench.rank_models:$m --placement "$D/plan_${m}_$p.json" --cluster "$C" --nproc-per-node 2 \
          --steps 10 --warmup 2 --json > "$D/run_${m}_${p}_$rep.json"
    done
  done
done

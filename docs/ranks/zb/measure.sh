#!/usr/bin/env bash
# Torch's interleaved zero-bubble schedule against the other looped schedules on two CPU ranks (issue 48):
# per model, placer's plan (stage_search, 2 stages per rank, M = 4, searched under interleaved_zb on the model's
# own `placer profile --ranks 2` file), run under looped_bfs, interleaved_1f1b and interleaved_zb, 5 interleaved
# repeats of 10 timed steps each; raw JSON per run beside this script.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=docs/ranks/zb
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
for m in ${MODELS:-lm encoder_decoder unet}; do
  placer place bench.rank_models:$m --cluster $D/ranks_$m.json --method stage_search --option stages_per_rank=2 \
      --option microbatches=4 --option schedule=interleaved_zb --ranks -o $D/plan_$m.json > $D/place_$m.log
  for s in looped_bfs interleaved_1f1b interleaved_zb; do
    python -c "import json,sys; d=json.load(open(sys.argv[1])); d['schedule']=sys.argv[2]; json.dump(d, open(sys.argv[3], 'w'), indent=1)" \
        $D/plan_$m.json $s $D/plan_${m}_$s.json
  done
  for rep in 1 2 3 4 5; do
    for s in looped_bfs interleaved_1f1b interleaved_zb; do
      placer run bench.rank_models:$m --placement $D/plan_${m}_$s.json --cluster $D/ranks_$m.json --nproc-per-node 2 \
          --steps 10 --warmup 2 --json > $D/run_${m}_${s}_$rep.json
    done
  done
done

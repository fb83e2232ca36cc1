#!/usr/bin/env bash
# One looped plan (4 stages, 2 per rank) run under two schedules: interleaved_1f1b, where a rank alternates between
# its two stages' forwards and backwards, and looped_bfs, where it runs each stage's actions back to back (all of
# a stage's forwards, then the next stage's; the backwards likewise). The same ops on the same ranks, so the
# difference in each action's time is the cost of interleaving. Plans: the `auto` plans of ../ (measure.sh).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
D=docs/ranks/auto
O=${OUT:-$D/interleave}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
for m in ${MODELS:-text_classifier mobilenet_v2}; do
  python - "$D/plan_${m}_auto.json" "$O/plan_${m}_bfs.json" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
assert plan["schedule"] == "interleaved_1f1b", plan["schedule"]
plan["schedule"] = "looped_bfs"
json.dump(plan, open(sys.argv[2], "w"), indent=1)
PY
  cp "$D/plan_${m}_auto.json" "$O/plan_${m}_i1f1b.json"
  for rep in $(seq 1 "${REPEATS:-3}"); do
    for p in i1f1b bfs; do
      placer run bench.rank_models:$m --placement "$O/plan_${m}_$p.json" --cluster "$D/ranks_$m.json" \
          --nproc-per-node 2 --steps 10 --warmup 2 --json > "$O/run_${m}_${p}_$rep.json"
    done
  done
done

#!/usr/bin/env bash
# The runtime of host_step "backward" measured on this CPU: one plan with parameter homes, run by `placer run` with
# every logical device on the CPU (the GPU's ops on the main thread, the host worker's Adam on another core), its
# homed parameters stepped during the backward and, the same plan with host_step "after", by the optimizer's step
# after it; ROUNDS rounds, the two alternated, each `--steps 10 --warmup 2`. From the repository root, in its venv:
#   bash docs/offload_homes/step_in_backward/cpu.sh > docs/offload_homes/step_in_backward/cpu.log
set -euo pipefail
ROUNDS=${ROUNDS:-5}
SOURCE=${SOURCE:-user_models:nn_transformer}
CLUSTER=${CLUSTER:-docs/offload_homes/branching/h200-cap48m.json}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=docs/heuristics
placer place "$SOURCE" --cluster "$CLUSTER" --method homes --seed 0 -o "$TMP/backward.json" | head -3
python - "$TMP" <<'PY'
import sys
from graphs.plan import Placement
p = Placement.load(f"{sys.argv[1]}/backward.json")
assert p.host_step == "backward" and p.param_homes
p.host_step = "after"
p.save(f"{sys.argv[1]}/after.json")
print(f"plan: {len(p.param_homes)} parameters homed, {len(p.checkpoint)} layers checkpointed")
PY
for r in $(seq 1 "$ROUNDS"); do
  for mode in backward after; do
    s=$(placer run "$SOURCE" --placement "$TMP/$mode.json" --cluster "$CLUSTER" --device-map '*=cpu' --steps 10 \
      --warmup 2 --json | python -c "import json, sys; print(json.load(sys.stdin)['step_time_s'])")
    echo "round $r $mode $s"
  done
done

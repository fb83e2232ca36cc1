#!/usr/bin/env bash
# The lent H200's one call of the session of 2026-11-29 (issues 50 and 49), from the repository root:
#   1. parameter homes at a 16 GiB cap, every row side by side (bench.offload_homes_measure), ~280 s;
#   2. does a measurement repeat on the GPU now that every measurement keeps glibc's malloc steady
#      (bench.repeatability, the op-only plan of the 24 GiB call), ~130 s;
#   3. parameter homes at 8 GiB with what time is left, ~150 s.
# Stand-in on the CPU: SCENARIO=tiny CAPS="0.01 0.005" DEVICE_MAP='*=cpu' EVALS=50 OUT=/tmp/g bash <this file>
set -o pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-runs/gpu_out}
SCENARIO=${SCENARIO:-llama-256k}
read -r CAP1 CAP2 <<<"${CAPS:-16 8}"
DEVICE_MAP=${DEVICE_MAP:-cpu:0=cpu,gpu:0=cuda:0}
EVALS=${EVALS:-2000}
mkdir -p "$OUT/rep"
OUT=$OUT/c$CAP1 DEADLINE=${T1:-280} bash scripts/gpu_offload.sh homes --scenario "$SCENARIO" --cap "$CAP1" \
  --device-map "$DEVICE_MAP" --evals "$EVALS" --deadline "${D1:-215}"
echo "stage 1: rc $?"
PLAN=${PLAN:-docs/offload_homes/h200/measured-llama-256k-24-expandable.json}
python3 - "$PLAN" "$OUT/rep/plan.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
plan = next(p for p in doc["plans"] if p["label"] == "placer, move search, op placement only")
json.dump(plan["placement"], open(sys.argv[2], "w"))
PY
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF-expandable_segments:True}
PYTHONUNBUFFERED=1 timeout --signal=INT "${T2:-130}" python3 -m bench.repeatability --scenario "$SCENARIO" \
  --placement "$OUT/rep/plan.json" --device-map "$DEVICE_MAP" --builds "${BUILDS:-5}" --warmup 2 --steps 4 --json \
  >"$OUT/rep/repeatability.json" 2> >(grep -v "FutureWarning\|warnings.warn" | tee "$OUT/rep/repeatability.log" >&2)
echo "stage 2: rc $?"
OUT=$OUT/c$CAP2 DEADLINE=${T3:-150} bash scripts/gpu_offload.sh homes --scenario "$SCENARIO" --cap "$CAP2" \
  --device-map "$DEVICE_MAP" --evals "$EVALS" --deadline "${D3:-95}"
echo "stage 3: rc $?"

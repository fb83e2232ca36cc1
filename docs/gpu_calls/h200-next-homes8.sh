#!/usr/bin/env bash
# Prepared for the next lent H200 (issues 50 and 49), one call of about 9 minutes, from the repository root:
#   1. the profile stage: every op of llama-256k timed on the host and the GPU (runs/offload/profile.json), ~2 min;
#   2. parameter homes at 8 GiB planned on that profile, rows under placer's protocol (malloc unbounded): does
#      placer's plan with homes still lose to FSDP2's offload as a plan (0.879 s against 0.793 s on 2026-11-29)?
#      (the homed plan, FSDP2, FSDP2's plan first; the deadline leaves the rest), ~4 min;
#   3. the op-only 24 GiB plan built 5 times with malloc unbounded (its 1.95 GiB embedding gradient on the host:
#      4.4 % between builds on 2026-11-29, the target 3 %), ~2 min.
# Stand-in on the CPU (no profile there: a GPU run on the host is a CPU): see docs/gpu_calls/h200-2026-11-29.sh.
# DeepSpeed's ZeRO-Offload rows (stages 2 and 3, after FSDP2's) run where the call carries .gpu_wheels (`bash
# scripts/gpu_wheels.sh` here first; carry [".gpu_wheels"]); without them they end at once, saying it is not installed.
set -o pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-runs/gpu_out}
mkdir -p "$OUT/rep"
OUT=$OUT/profile DEADLINE=${T1:-150} bash scripts/gpu_offload.sh profile
echo "stage 1: rc $?"
OUT=$OUT/c8 DEADLINE=${T2:-250} bash scripts/gpu_offload.sh homes --scenario llama-256k --cap 8 --deadline 160 \
  --profile runs/offload/profile.json
echo "stage 2: rc $?"
python3 - docs/offload_homes/h200/measured-llama-256k-24-expandable.json "$OUT/rep/plan.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
plan = next(p for p in doc["plans"] if p["label"] == "placer, move search, op placement only")
json.dump(plan["placement"], open(sys.argv[2], "w"))
PY
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF-expandable_segments:True}
PYTHONUNBUFFERED=1 timeout --signal=INT "${T3:-130}" python3 -m bench.repeatability --scenario llama-256k \
  --placement "$OUT/rep/plan.json" --device-map cpu:0=cpu,gpu:0=cuda:0 --builds 5 --warmup 2 --steps 4 --json \
  >"$OUT/rep/repeatability.json" 2> >(grep -v "FutureWarning\|warnings.warn" | tee "$OUT/rep/repeatability.log" >&2)
echo "stage 3: rc $?"
